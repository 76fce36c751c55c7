"""The real-time lane's paces, one per model, and what they project: the requests a second the lane sustains for
this job's requests, and the seconds it needs for a number of them (`decide._pacing` for each model's buckets)."""

from __future__ import annotations

from collections.abc import Callable

from ...decide._headroom import ModelLimits
from ...decide._pacing import RAMP_START, Cost, Pace, lane_seconds


class Paces:
    """Each model's pace (seeded with its Admin API limits when read, else the lowest tier's, corrected by every
    answer's headers), and the job's requests as billed so far, for projections."""

    def __init__(self, clock: Callable[[], float], limits: dict[str, ModelLimits] | None = None) -> None:
        self.clock = clock
        self.by_model: dict[str, Pace] = {}
        self.limits = limits or {}  # model -> its limits from the Admin API, when a key could read them
        self.models: set[str] = set()  # the job's models (the keeper names them): projections weigh only theirs
        self.mean_cost = Cost(1000, 1024)  # until requests are sent: a guess the keeper replaces from the input
        self.billed = (0, 0)  # answers with a usage, and the input tokens the input limit counted for them

    def pace(self, model: str) -> Pace:
        if model not in self.by_model:
            self.by_model[model] = self._fresh(model)
        return self.by_model[model]

    def _fresh(self, model: str | None) -> Pace:
        """A model's pace before any call: its limits from the Admin API, else the lowest tier's."""
        p = Pace(self.clock())
        if model in self.limits:
            p.seed(*self.limits[model])
        return p

    def _job_paces(self) -> list[Pace]:
        return [self.pace(m) for m in sorted(self.models)] or list(self.by_model.values()) or [self._fresh(None)]

    def per_second(self) -> float:
        """Requests a second the lane sustains for this job's requests (the slowest of its models' limits: from the
        answers' headers, else the Admin API's, else the lowest tier's)."""
        return min(p.per_second(self._projected_cost()) for p in self._job_paces())

    def _projected_cost(self) -> Cost:
        """A request's cost for projections: its input as the answers so far were billed (the up-front charge is a
        bound, given back on answer), else as estimated from its size."""
        n, tokens = self.billed
        return Cost(tokens // n, self.mean_cost.output) if n else self.mean_cost

    def answered(self, input_tokens: int) -> None:
        """An answer with a usage: the input its limit counted, for the projections' cost."""
        self.billed = (self.billed[0] + 1, self.billed[1] + input_tokens)

    @property
    def measured(self) -> bool:
        """Whether the projection rests on known limits for each of the job's models (the Admin API's, or an
        answer's headers), not on the lowest tier's assumed ones."""
        return bool(self.models) and all(m in self.limits or self.pace(m).learned for m in self.models)

    def seconds_for(self, n: float) -> float:
        """Seconds the lane needs for `n` of this job's requests, from where its ramp stands."""
        ramp = min((p.ramp for p in self.by_model.values()), default=RAMP_START)
        return lane_seconds(n, self.per_second(), ramp)
