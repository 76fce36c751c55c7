"""Whose turn it is to admit, when pipelines share one queue ceiling through the ledger. Pure.

Each running job keeps a *claim* on the ledger: its priority, its share, the requests of the batch it would admit
now (`want`, 0 when it waits for nothing), how long it has waited for room (on the ledger's clock), and its
*virtual time*: the requests it has admitted divided by its share (start-time fair queuing).

The rules, in order:
1. **No starvation**: a job that has waited `starve_after` seconds or more goes first (the longest wait first),
   whatever its priority.
2. **Precedence**: only jobs of the highest priority that is waiting may admit.
3. **Shares**: among those, the one whose virtual time after its next batch is least goes next; so room freed goes
   to jobs in proportion to their shares, batch by batch.
4. **Work conservation**: a job that wants nothing never holds a turn; the turn goes to one that does.

A job that joins (or starts wanting again after a pause) takes the least virtual time of those already waiting in
its tier, when that is more than its own: it is not owed the room it did not ask for (`joined_vtime`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..state._claims import PRIORITIES, Claim

__all__ = ["PRIORITIES", "STARVE_AFTER", "Claim", "ahead_of", "joined_vtime", "may_admit", "next_up"]
STARVE_AFTER = 1800.0  # seconds a waiting job waits at most before it goes first, whatever its priority


def next_up(claims: Sequence[Claim], *, starve_after: float = STARVE_AFTER) -> Claim | None:
    """The claim whose turn it is to admit; None when no one wants room."""
    waiting = [c for c in claims if c.want > 0]
    if not waiting:
        return None
    starving = [c for c in waiting if c.waited >= starve_after]
    if starving:
        return max(starving, key=lambda c: (c.waited, c.owner))
    top = min(c.priority for c in waiting)
    return min((c for c in waiting if c.priority == top), key=lambda c: (c.vtime + c.want / c.share, c.owner))


def may_admit(owner: str, claims: Sequence[Claim], *, starve_after: float = STARVE_AFTER) -> bool:
    """Whether `owner` may admit its next batch now (alone, or with no claims at all, always)."""
    up = next_up(claims, starve_after=starve_after)
    return up is None or up.owner == owner


def joined_vtime(own: float, priority: int, others: Sequence[Claim]) -> float:
    """A job's virtual time as it starts wanting: at least the least of those already waiting in its tier."""
    tier = [c.vtime for c in others if c.want > 0 and c.priority == priority]
    return max(own, min(tier)) if tier else own


def ahead_of(owner: str, claims: Sequence[Claim], *, starve_after: float = STARVE_AFTER) -> str | None:
    """The job whose turn it is, when it is not `owner`'s (for the report)."""
    up = next_up(claims, starve_after=starve_after)
    return None if up is None or up.owner == owner else up.job
