"""A job's claim on the shared ledger, as the ledger holds it and `decide._shares` weighs it; and the bookkeeping
of a claim's post (pure: the SQL ledgers run these functions inside their atomic step, the Redis ledger's Lua
script the same rules).

What a post does, besides storing the claim:
- **Joining.** A claim that starts wanting (new, or after a post of `want` 0) takes at least its tier's virtual
  time: the start of the batch last admitted in its priority. A job that was idle, or new, is not owed the room it
  never asked for, whether or not anyone else in its tier waits at that moment.
- **Aging.** A claim ages only behind higher priorities' turns: each time a job admits a batch, every *other*
  wanting claim of a lower priority adds the time since the last such admission it waited through (the first one
  only marks the start). Time in which nobody ahead of it admits (the queue full, every job waiting for room) does
  not count; nor do turns within its own priority, where its share is its guarantee. Its age goes back to 0 when
  it admits or stops wanting.
- **Overtaking.** A claim whose turn it was but whose batch did not fit counts the requests lower priorities
  admitted ahead of it meanwhile (`overtaken`, named by the job that admitted them), less what it admits itself;
  back to 0 when it stops wanting.
- **Limit.** How full the ledger's reservations may be with its next batch still fitting: its ceiling (less its
  margin) less the depth it sees that no reservation covers, the grant formula's terms (`ledger._base.grant`).
  Every submitter judges every claim's fit against the same reservations with it.
- **Unread.** A limit is as old as the reading of the queue it came from. A claim whose limit says its batch cannot
  fit however the reservations drain (load outside the ledger in its way) counts the requests other jobs admit
  meanwhile (`unread`): that load may have drained since, and the room they took may have been its own. Back to 0
  at its next post, which reads the queue again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

PRIORITIES = {"high": 0, "normal": 1, "low": 2}


@dataclass(frozen=True)
class Claim:
    """One job's claim, as the ledger holds it."""

    owner: str  # the submitter (one run of the job)
    job: str
    priority: int  # 0 high, 1 normal, 2 low
    share: float
    want: int = 0  # requests of the batch it would admit now but for the room; 0: it can use no room now
    waited: float = 0.0  # seconds it has waited behind higher priorities' turns (its age: `STARVE_AFTER`)
    vtime: float = 0.0  # requests admitted / share, from where its tier stood when it joined
    admitted: int = 0  # requests it has admitted since it claimed
    age: float = 0.0  # seconds since it claimed
    limit: int | None = None  # reservations (all submitters') under which its next batch fits; None: no ceiling known
    overtaken: int = 0  # requests lower priorities admitted ahead of it while its batch did not fit
    # requests others admitted since its limit was read, while that limit said its batch could not fit however the
    # reservations drained: the load outside the ledger it counted may have drained since (`decide._shares`)
    unread: int = 0

    @property
    def priority_name(self) -> str:
        return {v: k for k, v in PRIORITIES.items()}.get(self.priority, str(self.priority))

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "owner": self.owner, "priority": self.priority_name, "share": self.share,
                "want": self.want, "waiting_s": round(self.waited, 1), "admitted": self.admitted,
                "claimed_s": round(self.age, 1)}


@dataclass(frozen=True)
class ClaimPost:
    """This submitter's claim as it posts it (`decide._shares` reads everyone's back).

    `ceiling`: its ceiling less its margin (None: unknown); `seen`: the depth it sees (its listing and its creates
    the listing misses), so the ledger can set its `limit`. `took`: the requests of a batch it has just admitted
    (0: none), whose virtual start was `started`, going before the claims `overtook` (next, but not fitting)."""

    job: str
    priority: int
    share: float
    want: int
    vtime: float
    admitted: int
    ceiling: int | None = None
    seen: int = 0
    took: int = 0
    started: float = 0.0
    overtook: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimRow:
    """A claim as stored. `behind_at`: the ledger time of the last admission ahead of it that it waited through;
    `waiting_since`: when it began wanting (kept for submitters of earlier versions sharing the ledger)."""

    owner: str
    job: str
    priority: int
    share: float
    want: int
    vtime: float
    admitted: int
    limit: int | None
    aged: float
    behind_at: float | None
    overtaken: int
    waiting_since: float | None
    claimed_at: float
    expires_at: float
    unread: int = 0

    def claim(self, now: float) -> Claim:
        return Claim(self.owner, self.job, self.priority, self.share, self.want, self.aged, self.vtime, self.admitted,
                     max(0.0, now - self.claimed_at), self.limit, self.overtaken, self.unread)

    @property
    def out_of_reach(self) -> bool:
        """Whether its limit says its batch cannot fit however the reservations drain (load outside the ledger)."""
        return self.want > 0 and self.limit is not None and self.want > self.limit


class Board(NamedTuple):
    """What a post reads back: every live claim (its own included), and the requests reserved on the ledger."""

    claims: list[Claim]
    reserved: int


def limit_of(ceiling: int | None, seen: int, mine: int) -> int | None:
    """The reservations under which a batch still fits for a submitter: `grant`'s terms, solved for `reserved`."""
    return None if ceiling is None else ceiling - max(0, seen - mine)


def posted(prev: ClaimRow | None, owner: str, post: ClaimPost, *, tier: float, mine: int, now: float,
           ttl: float) -> ClaimRow:
    """The submitter's claim after its post (`tier`: its priority's virtual time; `mine`: its reservations)."""
    joining = post.want > 0 and (prev is None or prev.want == 0)
    row = ClaimRow(owner, post.job, post.priority, post.share, post.want, max(post.vtime, tier) if joining else post.vtime,
                   post.admitted, limit_of(post.ceiling, post.seen, mine), 0.0, None, 0, now if post.want > 0 else None,
                   now if prev is None else prev.claimed_at, now + ttl)
    if prev is None or joining or post.want == 0:
        return row  # (it starts again: no age, nothing owed)
    if post.took:  # (it admitted: its age starts again, and it owes a batch less)
        return dataclasses.replace(row, overtaken=max(0, prev.overtaken - post.took))
    return dataclasses.replace(row, aged=prev.aged, behind_at=prev.behind_at, overtaken=prev.overtaken,
                               waiting_since=prev.waiting_since)


def tier_after(tier: float, post: ClaimPost) -> float:
    """A priority's virtual time after a post: the start of the batch last admitted in it (never set back)."""
    return max(tier, post.started) if post.took > 0 else tier


def behind(row: ClaimRow, post: ClaimPost, owner: str, now: float) -> ClaimRow | None:
    """Another claim after `owner` admitted a batch (`post.took`): aged when of a lower priority, `overtaken` by the
    batch when it went first only because the other's did not fit, `unread` by it when its limit said its batch
    could not fit however the reservations drained; None when the admission leaves it as it was."""
    if post.took <= 0 or row.owner == owner or row.want <= 0:
        return None
    overtaken = row.overtaken + (post.took if row.owner in post.overtook else 0)
    unread = row.unread + (post.took if row.out_of_reach else 0)
    if row.priority <= post.priority:
        moved = (overtaken, unread) != (row.overtaken, row.unread)
        return dataclasses.replace(row, overtaken=overtaken, unread=unread) if moved else None
    aged = row.aged + (now - row.behind_at if row.behind_at is not None else 0.0)
    return dataclasses.replace(row, aged=aged, behind_at=now, overtaken=overtaken, unread=unread)
