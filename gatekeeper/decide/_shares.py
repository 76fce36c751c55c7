"""Whose turn it is to admit, when pipelines share one queue ceiling through the ledger. Pure.

Each running job keeps a *claim* on the ledger (`state._claims`): its priority, its share, the requests of the batch
it would admit now but for the room (`want`, 0 when it can use no room: nothing waits, or it is held by its own
limits, a refusal's backoff or its budget), the reservations under which that batch fits (`limit`), how long it
has waited behind higher priorities' turns (`waited`), and its *virtual time*: the requests it has admitted divided
by its share (fair queuing), from where its tier stood when it joined.

The rules, in order, over the claims that want room (`reserved`: the requests reserved on the ledger now, the same
for every submitter that reads them):
1. **No starvation**: a job that has waited `starve_after` seconds behind higher priorities' turns goes first (the
   longest wait first), whatever its priority; it keeps the turn while its batch does not fit yet, so that the room
   builds up for it rather than going, batch by batch, to the jobs it waited behind.
2. **Precedence**: the jobs of the highest priority that want room go before the others.
3. **Shares**: among jobs of one priority, the one whose virtual time after its next batch is least goes next; so
   room freed goes to jobs in proportion to their shares, batch by batch.
4. **Work conservation**: a job whose batch does not fit the room now (a batch larger than what is free, or its
   margin) does not keep the turn from the next one whose batch fits, up to a point, after which it keeps the turn
   while the room builds up for it (so that smaller batches taking every room that frees never starve it):
   - a job of its own priority goes before it while that job's virtual time after its batch stays within where its
     own would be after its next two batches (so the shares still hold, within a batch);
   - a job of a lower priority goes before it until such jobs have taken, while it waited for room, as much as its
     own next batch (`overtaken`, less what it admits itself).
   A job whose batch would not fit however the reservations drained (load outside the ledger in its way) keeps no
   turn, by its limit as it last read the queue; once another job has admitted since (`unread`), it keeps the turn as
   any other would until it reads the queue again, since that load may have drained meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..state._claims import PRIORITIES, Claim

__all__ = ["PRIORITIES", "STARVE_AFTER", "Claim", "ahead_of", "fits", "may_admit", "next_up", "overtaken_by", "starved",
           "turn_of"]
STARVE_AFTER = 1800.0  # seconds behind higher priorities' turns a job waits at most before it goes first


def fits(claim: Claim, reserved: int) -> bool:
    """Whether the claim's next batch fits under its limit with what the ledger holds reserved now."""
    return claim.want > 0 and (claim.limit is None or reserved + claim.want <= claim.limit)


def _room_can_build(claim: Claim) -> bool:
    """Whether its batch fits once the reservations drain (not when only load outside the ledger is in its way):
    only then may it keep the turn while the room builds up for it. A limit that says it cannot is taken at its word
    only until another job admits: the load outside the ledger it counted may have drained since, so the job keeps
    the turn as any other would until it has read the queue again (and the job that took the room waits that long;
    without this, it took every room that freed until the other's next poll)."""
    return claim.limit is None or claim.want <= claim.limit or claim.unread > 0


def _starving(claims: Sequence[Claim], starve_after: float) -> Claim | None:
    starving = [c for c in claims if c.want > 0 and c.waited >= starve_after and _room_can_build(c)]
    return max(starving, key=lambda c: (c.waited, c.owner)) if starving else None


def starved(owner: str, claims: Sequence[Claim], *, starve_after: float = STARVE_AFTER) -> bool:
    """Whether the turn is `owner`'s by the starvation rule (its batch then comes out of higher priorities' room,
    not its own priority's)."""
    up = _starving(claims, starve_after)
    return up is not None and up.owner == owner


def _ranked(claims: Sequence[Claim]) -> list[Claim]:
    """The claims that want room, in the order of precedence and then of shares (ties by owner: every submitter
    ranks alike)."""
    return sorted((c for c in claims if c.want > 0), key=lambda c: (c.priority, c.vtime + c.want / c.share, c.owner))


def _holds(ahead: Claim, c: Claim) -> bool:
    """Whether `ahead`, ranked before `c` and with a batch that does not fit, keeps the turn from `c` (rule 4)."""
    if not _room_can_build(ahead):
        return False
    if ahead.priority < c.priority:
        return ahead.overtaken >= ahead.want
    return c.vtime + c.want / c.share > ahead.vtime + 2 * ahead.want / ahead.share


def next_up(claims: Sequence[Claim], reserved: int = 0, *, starve_after: float = STARVE_AFTER) -> Claim | None:
    """The claim whose turn it is to admit (one whose batch does not fit yet, when the room builds up for it); None
    when no one can use the room there is."""
    starving = _starving(claims, starve_after)
    if starving is not None:
        return starving
    ranked = _ranked(claims)
    for i, c in enumerate(ranked):
        holder = next((a for a in ranked[:i] if _holds(a, c)), None)  # (all of them ranked before c do not fit)
        if holder is not None:
            return holder
        if fits(c, reserved):
            return c
    return None


def overtaken_by(owner: str, claims: Sequence[Claim], reserved: int = 0, *, starve_after: float = STARVE_AFTER) -> tuple[str, ...]:
    """The claims of higher priorities that `owner`'s batch goes before because theirs do not fit (when it is
    `owner`'s turn): what they count as `overtaken`."""
    if _starving(claims, starve_after) is not None:
        return ()
    ranked = _ranked(claims)
    me = next((c for c in ranked if c.owner == owner), None)
    return () if me is None else tuple(c.owner for c in ranked[:ranked.index(me)] if c.priority < me.priority)


def turn_of(claims: Sequence[Claim], reserved: int = 0, *, starve_after: float = STARVE_AFTER) -> Claim | None:
    """The claim whose turn it is: `next_up`, or, when no one's batch fits, the first in order (room another job
    frees between this reading and a reservation goes by precedence and shares, not to whoever reserves first)."""
    up = next_up(claims, reserved, starve_after=starve_after)
    ranked = _ranked(claims)
    return up if up is not None or not ranked else ranked[0]


def may_admit(owner: str, claims: Sequence[Claim], reserved: int = 0, *, starve_after: float = STARVE_AFTER) -> bool:
    """Whether `owner` may admit its next batch now (alone, or when no one wants room, always)."""
    up = turn_of(claims, reserved, starve_after=starve_after)
    return up is None or up.owner == owner


def ahead_of(owner: str, claims: Sequence[Claim], reserved: int = 0, *, starve_after: float = STARVE_AFTER) -> str | None:
    """The job whose turn it is, when it is not `owner`'s (for the report): its name, and its submitter where
    another job of that name holds a claim too (two inputs of one file name)."""
    up = turn_of(claims, reserved, starve_after=starve_after)
    if up is None or up.owner == owner:
        return None
    return up.job if sum(c.job == up.job for c in claims) == 1 else f"{up.job} ({up.owner})"
