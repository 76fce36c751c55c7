"""A job's claim on the shared ledger, as the ledger holds it and `decide._shares` weighs it. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRIORITIES = {"high": 0, "normal": 1, "low": 2}


@dataclass(frozen=True)
class Claim:
    """One job's claim, as the ledger holds it."""

    owner: str  # the submitter (one run of the job)
    job: str
    priority: int  # 0 high, 1 normal, 2 low
    share: float
    want: int = 0  # requests of the batch it would admit now; 0: not waiting for room
    waited: float = 0.0  # seconds it has been wanting, on the ledger's clock
    vtime: float = 0.0  # requests admitted / share, from where its tier stood when it joined
    admitted: int = 0  # requests it has admitted since it claimed
    age: float = 0.0  # seconds since it claimed

    @property
    def priority_name(self) -> str:
        return {v: k for k, v in PRIORITIES.items()}.get(self.priority, str(self.priority))

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "owner": self.owner, "priority": self.priority_name, "share": self.share,
                "want": self.want, "waiting_s": round(self.waited, 1), "admitted": self.admitted,
                "claimed_s": round(self.age, 1)}
