"""The admission ledger: reservations against the organization's ceiling, shared by submitters.

Submitters in different workspaces cannot see each other's batches, so reading
live depth is not enough: two of them can read the same headroom and both
create. Each submitter reserves a batch's requests in the ledger before its
create, and the ledger grants a reservation only if

    reserved (all submitters, unexpired)  +  max(0, seen - mine)  +  n  <=  ceiling - margin

where `seen` is the depth this submitter observes (its listing plus its own
unlisted creates, less the listed batches another submitter's reservation
covers: `run.batch._turns.others_reserved`) and `mine` its own reservations: the part of what it sees
that no reservation covers is counted once, the reserved part once. Grants are
atomic (one SQLite write transaction, one PostgreSQL transaction under an
advisory lock, or one Redis Lua script), so no two
submitters can both take the last room: the queue cannot overshoot through
gatekeeper's own creates. A reservation is confirmed with its batch id,
released when the batch ends or the create was definitely refused, and
expires `ttl` seconds after its owner's last heartbeat, so a killed submitter
blocks the organization for at most `ttl`; a resumed one takes its live
batches' reservations back (`hold`).

Creates of one size go one at a time across the ledger: a reservation is not granted while another submitter holds
one of the same size that is not confirmed (its create is out, or its answer was lost and it is not yet reconciled);
creates of other sizes go at once (a lost create's candidates are of its size). So when a create's answer is lost,
every other submitter's batch created since is named in the ledger, and a lone unnamed batch of our size and
custom_ids, created after our send, is ours whatever its usage says (`decide._reconcile`). Each shared ledger also records
when each turn was granted, a print of the custom_ids its create sends, and when its body goes out (`sending`), so
that another's unknown create of our size is no rival of a candidate it cannot have made (`Reservation.granted_for`,
`ids`, `sent`). A released reservation whose batch was created stays as a *name* (no requests) for
`NAMED_FOR` seconds, so batches that ended are still told apart.

A submitter that dies on this very machine never holds the others back for a TTL: each one records its
process (machine, pid, start time) in the ledger, and every step first drops the submitters of this machine whose
process has ended (`Liveness`; a reused pid is told apart by its start time): their confirmed batches stay named,
their claims and job registrations go, and an unconfirmed reservation (a create that may have reached the server)
frees its requests at once but stays an *orphan* of its size for `NAMED_FOR` (unless the ledger knows its body
never went out: then it made no batch, and goes). The orphan keeps the turn for creates
of its size alone (the only ones its batch could be taken for), until its owner's rerun takes it back and settles
it, or another submitter settles it from its listing (`settle_orphan`, `decide._orphans`: its one batch named for it,
or none made), no longer than the reservation would have lasted (its TTL after the last heartbeat): so no two unknown creates
of one size ever overlap, and the lone-candidate proof still holds; creates of every other size go at once. It stays
a rival of our lost creates of its size sent within the listing's grace after it was found dead
(`decide._reconcile.dead_rivals`: a create shows in the listing within `--reconcile-grace` of its send or was never
made, the rule our own lost creates are settled by). Submitters of other machines lapse after the TTL, as before.

`LocalLedger` (`--ledger none`) serves one submitter: its journal already counts its
own creates, so it grants everything.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from .._claims import Board, Claim, ClaimPost

DEFAULT_TTL = 900.0
NAMED_FOR = 7 * 86_400.0  # seconds a released batch stays named in the ledger (reconciliations within it can tell)


@dataclass(frozen=True)
class Reservation:
    owner: str
    batch: int
    requests: int
    batch_id: str | None
    expires_in: float
    # an orphan: seconds since its owner was found dead on its machine with this create unconfirmed (its requests
    # are free; `requests` is the size of the batch it may have created); None for a reservation of a live owner
    dead_for: float | None = None
    # seconds since its turn was granted: the create it stood for made no batch earlier (`decide._reconcile.
    # rival_creates`); None where the ledger does not say (a create taken back by a resumed run, a reservation
    # an earlier version wrote)
    granted_for: float | None = None
    # a print of the custom_ids its create sent (`run.batch._evidence.IdPrint.text`): a batch that carries other ids
    # is not its create's; None where the ledger does not say
    ids: str | None = None
    # False where the ledger knows its create was never sent (its turn granted, then the run ended or was killed
    # before its body went out: no batch came of it); True where it was, or may have been
    sent: bool = True
    # an orphan's (`status` shows them): the seconds it still holds the turn for creates of its size (0: no longer,
    # it stays a rival's name only); its dead owner's job (its claim's name), machine and pid, None where the ledger
    # does not say (an earlier version's orphan, Redis's, a job that posted no claim)
    holds_for: float | None = None
    job: str | None = None
    machine: str | None = None
    pid: int | None = None
    # an orphan's: the print of the workspace its dead owner's listing showed (`ApiConfig.workspace_print`), None
    # where unknown; a listing of that workspace can settle it before anything of it is named (`decide._orphans`)
    workspace: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "batch": self.batch, "requests": self.requests, "batch_id": self.batch_id,
                "expires_in": round(self.expires_in, 1)}

    def orphan_json(self, machine: str | None) -> dict[str, Any]:
        """An orphan holding the turn as `status --json` shows it (`machine`: the reader's, to say "this host")."""
        return {"owner": self.owner, "job": self.job, "pid": self.pid,
                "this_host": self.machine is not None and self.machine == machine, "batch": self.batch,
                "requests": self.requests, "sent": self.sent,
                "dead_for": None if self.dead_for is None else round(self.dead_for, 1),
                "lapses_in": round(self.holds_for or 0.0, 1)}

    @property
    def holding(self) -> bool:
        """An orphan that still holds the turn for creates of its size."""
        return self.dead_for is not None and (self.holds_for or 0.0) > 0

    @property
    def live(self) -> bool:
        """A reservation of requests (not a released batch's name, nor a dead owner's orphan)."""
        return self.requests > 0 and self.dead_for is None


@dataclass(frozen=True)
class Liveness:
    """What a ledger knows of processes on this machine: this submitter's own (`me`: machine, pid and start time,
    recorded for its owner; None for a reader such as `status`), this machine (None where the system does not say:
    then nothing is judged, TTLs only), and `ended(record)`, whether a recorded process has certainly ended
    (`decide._host.run_ended`, passed in from above)."""

    me: dict[str, Any] | None
    machine: str | None
    ended: Callable[[dict[str, Any]], bool]


class Ledger(Protocol):
    """Admission shared by several submitters: each reserves a batch's requests before creating it, and a
    reservation is granted only while all of theirs and the queue fit under the ceiling (`open_ledger` makes one)."""

    ttl: float
    owner: str  # this submitter's name in the ledger ("" for the in-process one)

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int, ids: str | None = None) -> bool: ...
    async def hold(self, batch: int, n: int, batch_id: str | None) -> None: ...
    async def sending(self, batch: int) -> None: ...
    async def confirm(self, batch: int, batch_id: str) -> None: ...
    async def settle_orphan(self, owner: str, batch: int, batch_id: str | None) -> bool: ...
    async def release(self, batch: int) -> None: ...
    async def release_all(self) -> None: ...
    async def heartbeat(self) -> None: ...
    async def claim_job(self, job: str, info: dict[str, Any]) -> dict[str, Any] | None: ...
    async def reservations(self) -> list[Reservation]: ...
    async def put_claim(self, mine: ClaimPost) -> Board: ...
    async def drop_claim(self) -> None: ...
    async def claims(self) -> list[Claim]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class LedgerReading(NamedTuple):
    """What `status` and the exporter read of a ledger: live reservations, the jobs' claims, which ledger it is
    (`in_use`: `LedgerChoice.to_json()`), and the orphans that still hold a turn (`Reservation.holding`)."""

    reservations: list[Reservation]
    claims: list[Claim]
    in_use: dict[str, Any] | None = None
    orphans: tuple[Reservation, ...] = ()  # dead submitters' creates that still hold the turn for their size

    def jobs(self) -> list[dict[str, Any]]:
        """Each job on the ledger: name, priority, share, queued (its live reservations), waiting, admitted."""
        queued: dict[str, int] = {}
        for r in self.reservations:
            queued[r.owner] = queued.get(r.owner, 0) + r.requests
        return [{**c.to_json(), "queued": queued.get(c.owner, 0)} for c in self.claims]


def grant(reserved: int, seen: int, mine: int, n: int, ceiling: int, others_creating: int = 0) -> bool:
    """The admission formula (pure; the shared ledgers evaluate the same inside their atomic step): room under the
    ceiling, and no other submitter's create out or unreconciled (`others_creating`)."""
    return not others_creating and reserved + max(0, seen - mine) + n <= ceiling


STUCK_AFTER = 30.0  # seconds a create's turn may be out unanswered before it is taken for lost (answers take seconds)


def creating_of_size(reservations: Iterable[Reservation], owner: str, n: int, stuck_after: float = STUCK_AFTER) -> bool:
    """Whether another submitter's create of `n` requests that is lost or being reconciled (out unanswered past
    `stuck_after`, taken back by a rerun, or a dead one's while it holds the turn) keeps the ledger from granting a
    create of that size (`grant`'s `others_creating`): a refusal that room building up does not end, and that lasts.
    A create just out (answered in a moment) is not: the job keeps its turn (a cold tester: a normal job refused for
    a low job's create of its size gave the turn up, and the low job took the whole freed queue)."""
    return any(r.holding if r.dead_for is not None else r.granted_for is None or r.granted_for > stuck_after
               for r in _others_creating(reservations, owner, n))


def holder_of_size(reservations: Iterable[Reservation], owner: str, n: int) -> dict[str, Any] | None:
    """Who holds the turn for creates of `n` requests, for a waiting job's event (an operator sees why nothing
    moves while the queue is empty): a dead job's create (its job, pid and the seconds it still holds), else another
    job's create out unanswered (its owner, and since when); None when none does."""
    creating = _others_creating(reservations, owner, n)
    for r in sorted(creating, key=lambda r: not r.holding):  # (a dead job's first)
        if r.holding:
            return {"dead_job": r.job, "pid": r.pid, "owner": r.owner, "lapses_in": round(r.holds_for or 0.0, 1)}
        if r.dead_for is None:
            return {"owner": r.owner, "out_for": None if r.granted_for is None else round(r.granted_for, 1)}
    return None


def _others_creating(reservations: Iterable[Reservation], owner: str, n: int) -> list[Reservation]:
    """Other submitters' creates of `n` requests not named yet (out, lost, or a dead one's)."""
    return [r for r in reservations if r.owner != owner and r.requests == n and r.batch_id is None]


def new_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
