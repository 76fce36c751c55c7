"""A killed job's create that holds the turn for a size, settled by this job's listing (`decide._orphans`), so
that the job waiting for that size goes on at once rather than when the killed job's rerun comes, or a TTL later."""

from __future__ import annotations

from ...decide._orphans import NO_BATCH, orphan_batch
from ...state._journal import BatchState
from ...state.ledger._base import Reservation, creating_of_size, holder_of_size
from ..shared._part import RunContext, Snapshot


async def reserve_settling(ctx: RunContext, snap: Snapshot, batch: int, n: int, bound: int | None, seen: int,
                           ids: str | None) -> tuple[bool, bool]:
    """The ledger's grant for a batch of `n` requests, asked again once when a killed job's create that held the
    turn for that size is settled by our listing meanwhile (it would hold it until its rerun, or its TTL); and, when
    refused, whether another's create of that size that will not be answered in a moment holds it
    (`creating_of_size`: a refusal that room building up does not end), the refusal said. The reservations are read
    once a refusal."""
    ledger = ctx.ledger
    if await ledger.reserve(batch, n, bound, seen, ids):
        return True, False
    held = await ledger.reservations()
    if await settle(ctx, snap, n, held):
        if await ledger.reserve(batch, n, bound, seen, ids):
            return True, False
        held = await ledger.reservations()  # (one was settled: the ledger has changed since)
    holder = holder_of_size(held, ledger.owner, n)
    ctx.emit("waiting", {"next": n, "reason": "ledger", "depth": snap.depth, **({"held_by": holder} if holder else {})})
    return False, creating_of_size(held, ledger.owner, n)


async def settle(ctx: RunContext, snap: Snapshot, n: int, held: list[Reservation]) -> bool:
    """Whether an orphan of `n` requests among `held` (the ledger's reservations) was settled (named or dropped):
    the turn for that size may be free."""
    ledger, settings = ctx.ledger, ctx.settings
    if not ledger.owner or any(r.requests == n for r in ctx.journal.batches(BatchState.INTENT)):
        return False  # (a lost create of ours of that size: its batch could be taken for the orphan's)
    known = ctx.journal.adoptions.known_batch_ids()
    settled = False
    for o in [r for r in held if r.owner != ledger.owner and r.requests == n and r.holding]:
        found = orphan_batch(o, held, snap.listed.values(), known, now=ctx.clock(), listed_at=snap.at,
                             grace=snap.grace(settings.reconcile_grace), clock_skew=settings.clock_skew,
                             workspace=ctx.conn.workspace)
        if found is not None and await ledger.settle_orphan(o.owner, o.batch, found or None):
            settled = True
            ctx.emit("orphan_settled", {"owner": o.owner, "job": o.job, "pid": o.pid, "batch": o.batch, "requests": n,
                                        "id": found or None, "outcome": "made no batch" if found == NO_BATCH else "named"})
    return settled
