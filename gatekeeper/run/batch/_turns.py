"""This job's claim on a shared ledger, and its turn to admit among the organization's pipelines
(`decide._shares`): posted every admission round, so the others see what it wants and how long it has waited.
Alone on a ledger, or without one, it is always this job's turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._errors import UsageError
from ...decide._admission import QueueState
from ...decide._shares import PRIORITIES, Claim, ahead_of, joined_vtime, may_admit
from ...state.ledger._base import ClaimPost, Ledger


class Turns:
    def __init__(self, ledger: Ledger, job: str, priority: str, share: float, clock: Callable[[], float],
                 waited_before: float = 0.0) -> None:
        if priority not in PRIORITIES or not share > 0:
            raise UsageError(f"priority {priority!r} must be high, normal or low, and share {share!r} a positive number",
                             setting="priority" if priority not in PRIORITIES else "share")
        self.ledger, self.job, self.clock = ledger, job, clock
        self.priority, self.share = PRIORITIES[priority], share
        self.vtime = 0.0
        self.admitted = 0
        self.wanting = False
        self.reset = False  # it has just admitted: its wait starts again
        self.waited = waited_before  # seconds it waited for other jobs' turns (this job's runs, together)
        self.blocked_since: float | None = None
        self.ahead: str | None = None  # the job whose turn it was, when it was not ours

    async def turn(self, want: int) -> bool:
        """Post the claim (`want`: the requests of the batch it would admit now, 0 for none); whether it may."""
        if not self.ledger.owner:
            return True
        claims = await self.ledger.put_claim(ClaimPost(self.job, self.priority, self.share, want, self.vtime,
                                                       self.admitted, self.reset))
        self.reset = False
        others = [c for c in claims if c.owner != self.ledger.owner]
        if want > 0 and not self.wanting:
            self.vtime = joined_vtime(self.vtime, self.priority, others)
        self.wanting = want > 0
        mine = Claim(self.ledger.owner, self.job, self.priority, self.share, want, 0.0, self.vtime, self.admitted)
        ok = want == 0 or may_admit(self.ledger.owner, [*others, mine])
        self._account(ok, [*others, mine])
        return ok

    def _account(self, free: bool, claims: list[Claim]) -> None:
        now = self.clock()
        if free:
            if self.blocked_since is not None:
                self.waited += now - self.blocked_since
            self.blocked_since, self.ahead = None, None
        else:
            self.blocked_since = self.blocked_since if self.blocked_since is not None else now
            self.ahead = ahead_of(self.ledger.owner, claims)

    def took(self, requests: int) -> None:
        """A batch of `requests` admitted."""
        self.admitted += requests
        self.vtime += requests / self.share
        self.reset = True

    def to_json(self) -> dict[str, Any]:
        waited = self.waited + (self.clock() - self.blocked_since if self.blocked_since is not None else 0.0)
        names = {v: k for k, v in PRIORITIES.items()}
        return {"priority": names[self.priority], "share": self.share, "waited_s": round(waited, 1)}


def wanted(next_batch: int, q: QueueState, budget_stopped: bool) -> int:
    """The requests of the batch a job would admit now, for its claim: 0 when it can use no room (nothing waits,
    or it is canceled, out of budget, or at its own limit of batches in flight)."""
    full = q.max_in_flight is not None and q.in_flight >= q.max_in_flight
    return 0 if q.canceled or budget_stopped or full else next_batch
