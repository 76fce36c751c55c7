"""What keeps a live run's claims alive while it runs: the shared ledger's reservations and the shared
journal's lease, each renewed beside the run (`_beside`), and the run's stable identity in the ledger.

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
from ...state._journal import Journal
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


def liveness(*, registered: bool) -> Liveness:
    """What a ledger opened here knows of this machine's processes: a submitter of this machine whose process has
    ended (its pid gone, or reused by a later process) is dropped at once (`decide._host.run_ended`).
    `registered`: this process is recorded there too (a submitter; not a reader such as `status`)."""
    me = this_process()
    here = me["machine"]
    return Liveness(me if registered else None, here, lambda record: run_ended(record, here, process_started))
