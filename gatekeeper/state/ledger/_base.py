"""The admission ledger: reservations against the organization's ceiling, shared by submitters.

Submitters in different workspaces cannot see each other's batches, so reading
live depth is not enough: two of them can read the same headroom and both
create. Each submitter reserves a batch's requests in the ledger before its
create, and the ledger grants a reservation only if

    reserved (all submitters, unexpired)  +  max(0, seen - mine)  +  n  <=  ceiling - margin

where `seen` is the depth this submitter observes (its listing plus its own
unlisted creates) and `mine` its own reservations: the part of what it sees
that no reservation covers is counted once, the reserved part once. Grants are
atomic (one SQLite write transaction, one PostgreSQL transaction under an
advisory lock, or one Redis Lua script), so no two
submitters can both take the last room: the queue cannot overshoot through
gatekeeper's own creates. A reservation is confirmed with its batch id,
released when the batch ends or the create was definitely refused, and
expires `ttl` seconds after its owner's last heartbeat, so a killed submitter
blocks the organization for at most `ttl`; a resumed one takes its live
batches' reservations back (`hold`).

Creates go one at a time across the ledger: a reservation is not granted while another submitter holds one
that is not confirmed (its create is out, or its answer was lost and it is not yet reconciled). So when a
create's answer is lost, every other submitter's batch created since is named in the ledger, and a lone
unnamed batch of our size and custom_ids, created after our send, is ours whatever its usage says
(`decide._reconcile`). A released reservation whose batch was created stays as a *name* (no requests) for
`NAMED_FOR` seconds, so batches that ended are still told apart.

`LocalLedger` (the default) serves one submitter: its journal already counts its
own creates, so it grants everything.
"""

from __future__ import annotations

import os
import socket
import uuid
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

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "batch": self.batch, "requests": self.requests, "batch_id": self.batch_id,
                "expires_in": round(self.expires_in, 1)}

    @property
    def live(self) -> bool:
        """A reservation of requests (not a released batch's name)."""
        return self.requests > 0


class Ledger(Protocol):
    """Admission shared by several submitters: each reserves a batch's requests before creating it, and a
    reservation is granted only while all of theirs and the queue fit under the ceiling (`open_ledger` makes one)."""

    ttl: float
    owner: str  # this submitter's name in the ledger ("" for the in-process one)

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool: ...
    async def hold(self, batch: int, n: int, batch_id: str | None) -> None: ...
    async def confirm(self, batch: int, batch_id: str) -> None: ...
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
    """What `status` and the exporter read of a shared ledger: live reservations, and the jobs' claims."""

    reservations: list[Reservation]
    claims: list[Claim]

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


def new_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
