"""What keeps a live run's claims alive while it runs: the shared ledger's reservations and the shared
journal's lease, each renewed beside the run (`_beside`), the reservations a resumed run takes back, and the run's
stable identity in the ledger.

The beats wait on the run's clock (`sleep`: the real one unless the caller hands down another, as a simulation
does with its SQLite ledger, whose expiry is on that clock too); what a server's clock expires (a PostgreSQL or
Redis ledger, a shared journal's lease) lapses in real time, so only the real clock is fit to renew those."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from ..._clock import run_sync
from ..._errors import JournalError, LedgerError
from ...decide._host import run_ended
from ...state._host import process_started, this_process
from ...state._journal import BatchState, Journal
from ...state.ledger._base import Ledger, Liveness, new_owner
from ._settings import EventSink

Sleep = Callable[[float], Awaitable[None]]


async def heartbeat(ledger: Ledger, emit: EventSink, sleep: Sleep = anyio.sleep) -> None:
    """Keep this submitter's reservations alive while it runs; they expire `ttl` after it dies.

    A beat that fails is ridden out (the next one may pass, and a third of the TTL is left
    before anything expires); the loop's own ledger calls stop the run if the outage lasts.
    """
    while True:
        await sleep(max(0.05, ledger.ttl / 3))
        try:
            await ledger.heartbeat()
        except LedgerError as exc:
            emit("ledger_unavailable", {"reason": str(exc)})


async def lease_heartbeat(journal: Journal, ttl: float, emit: EventSink, sleep: Sleep = anyio.sleep) -> None:
    """Keep the shared journal's lease on this run, on a connection of its own (a thread: psycopg is blocking).

    A lost lease is only reported here: the journal's next write checks it and stops the run."""
    db = await run_sync(journal.lease.second_connection)
    try:
        while True:
            await sleep(max(0.05, ttl / 3))
            try:
                if not await run_sync(lambda: journal.lease.renew(db)):
                    emit("lease_lost", {"job": journal.job})
            except JournalError as exc:
                emit("journal_unavailable", {"reason": str(exc)})
    finally:
        db.close()


async def take_reservations_back(journal: Journal, ledger: Ledger) -> None:
    """A resumed run takes back the reservations of its batches in the queue or whose create is unknown, and
    frees any other an earlier run left unconfirmed (reserved, then killed before its intent was journaled, or
    refused outright; or an orphan of it the journal has no create out for): on a shared ledger such a reservation
    counts as a create out, which holds every other job's creates of its size, and this run's heartbeats would
    keep it alive for as long as it runs."""
    held = journal.batches(BatchState.INTENT, BatchState.CREATED)
    named = await named_for(ledger, journal)
    for row in held:
        await ledger.hold(row.idx, row.requests, row.batch_id or named.get(row.idx))
    if ledger.owner:
        ours = {row.idx for row in held}
        for r in await ledger.reservations():
            if r.owner == ledger.owner and (r.live or r.dead_for is not None) and r.batch_id is None and r.batch not in ours:
                await ledger.release(r.batch)


async def named_for(ledger: Ledger, journal: Journal) -> dict[int, str]:
    """The batches another job named for a killed run's lost creates (`run.batch._orphans`), by its batch: a rerun
    takes them back with the create, still named, so that no other job's lost create takes them for its own while
    this one's is reconciled (a batch the journal knows already is never one)."""
    if not ledger.owner:
        return {}
    known = journal.adoptions.known_batch_ids()
    return {r.batch: r.batch_id for r in await ledger.reservations()
            if r.owner == ledger.owner and r.batch_id and not r.requests and r.dead_for is None and r.batch_id not in known}


CLAIM_DROP_WAIT = 5.0  # seconds a run that stops gives the ledger to drop its claim (an unreachable one: its lease)


async def give_up_claim(ledger: Ledger) -> None:
    """A run that ends, however it ends (finished, stopped, Ctrl-C or SIGTERM, an error), gives up its claim on the
    ledger at once: it wants no room any more, so no job holds back for it until its lease runs out. Its reservations
    stay (its batches are still in the queue; a resumed run takes them back)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLAIM_DROP_WAIT):
        try:
            await ledger.drop_claim()
        except LedgerError:
            pass  # (its claim lapses with its lease)


def ledger_owner(journal: Journal) -> str:
    """The job's ledger identity, stable across resumes (so a rerun's reservations replace, not add to, its own)."""
    owner = journal.get_meta("ledger_owner")
    if owner is None:
        owner = new_owner()
        journal.set_meta("ledger_owner", owner)
    return str(owner)


def liveness(*, registered: bool, workspace: str | None = None) -> Liveness:
    """What a ledger opened here knows of this machine's processes: a submitter of this machine whose process has
    ended (its pid gone, or reused by a later process) is dropped at once (`decide._host.run_ended`).
    `registered`: this process is recorded there too (a submitter; not a reader such as `status`), with the print
    of the workspace its listing shows (`ApiConfig.workspace_print`), for another to settle its orphans by."""
    me = {**this_process(), "workspace": workspace}
    here = me["machine"]
    return Liveness(me if registered else None, here, lambda record: run_ended(record, here, process_started))
