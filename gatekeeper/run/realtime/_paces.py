"""The real-time lane's paces, one per model, and what they project: the requests a second the lane sustains for
this job's requests, and the seconds it needs for a number of them (`decide._pacing` for each model's buckets and
ramp). The projection is the pace the lane has been measured to keep, not only what the limits allow: calls that
take long (64 out at most), 429s from other traffic, or a write lock held by a batch's settlement all slow it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ...decide._headroom import ModelLimits
from ...decide._pacing import WINDOW, Cost, Pace, lane_seconds

MEASURED_OVER = 30.0  # seconds: the pace kept over the last this many of a stretch with work waiting is its measure
LEAST_EFFICIENCY = 0.05  # (a lane measured slower than this share of its limits is projected at it)


class Paces:
    """Each model's pace (seeded with its Admin API limits when read, else the lowest tier's, corrected by every
    answer's headers), the job's requests as billed so far, and the lane's measured pace, for projections."""

    def __init__(self, clock: Callable[[], float], limits: dict[str, ModelLimits] | None = None) -> None:
        self.clock = clock
        self.by_model: dict[str, Pace] = {}
        self.limits = limits or {}  # model -> its limits from the Admin API, when a key could read them
        # the job's models, each with its number of requests (the keeper names them): projections weigh only theirs,
        # each model's limits taking its share of the requests (its own buckets, side by side)
        self.models: dict[str, int] = {}
        self.mean_cost = Cost(1000, 1024)  # until requests are sent: a guess the keeper replaces from the input
        # answers with a usage, and the input tokens the input limit counted for them and the output tokens they held
        self.billed = (0, 0, 0)
        self.since_cold = 0  # calls since the lane last went two windows without one: where its ramp stands
        self.last_went = float("-inf")
        self.busy_from: float | None = None  # since when the lane has had work waiting throughout (None: it has none)
        self.busy_sends: deque[float] = deque()  # when the calls of that stretch went (its last MEASURED_OVER seconds)
        self.efficiency = 1.0  # the share of what the limits allow that the lane was last measured to keep

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

    def _job_paces(self) -> list[tuple[Pace, float]]:
        """Each of the job's models' paces with its share of the job's requests (the models seen, or the lowest
        tier's, alike, where the keeper has named none)."""
        total = sum(self.models.values())
        if total > 0:
            return [(self.pace(m), n / total) for m, n in sorted(self.models.items()) if n > 0]
        paces = list(self.by_model.values()) or [self._fresh(None)]
        return [(p, 1.0) for p in paces]  # (each as if it took them all: the slowest decides)

    def per_second(self) -> float:
        """Requests a second the lane's limits sustain for this job's requests (from the answers' headers, else the
        Admin API's, else the lowest tier's): each model's buckets take their share of them side by side, so the
        lane ends when its most loaded model does (three models of one limit, a third each: three times one's pace)."""
        cost = self._projected_cost()
        return 1.0 / max(share / max(p.per_second(cost), 1e-9) for p, share in self._job_paces())

    def _projected_cost(self) -> Cost:
        """A request's cost for projections: its input and output as the answers so far were billed (the up-front
        charge of `max_tokens` is a bound the API gives back on answer), else as estimated from its size and its
        `max_tokens`."""
        n, tokens, output = self.billed
        return Cost(tokens // n, max(1, output // n)) if n else self.mean_cost

    def answered(self, input_tokens: int, output_tokens: int) -> None:
        """An answer with a usage: the input its limit counted and the output it held, for the projections' cost."""
        self.billed = (self.billed[0] + 1, self.billed[1] + input_tokens, self.billed[2] + output_tokens)

    @property
    def measured(self) -> bool:
        """Whether the projection rests on known limits for each of the job's models (the Admin API's, or an
        answer's headers), not on the lowest tier's assumed ones."""
        return bool(self.models) and all(m in self.limits or self.pace(m).learned for m in self.models)

    # -- the pace kept --------------------------------------------------------

    def busy(self, now: float) -> None:
        """The lane has work waiting for a call."""
        if self.busy_from is None:
            self.busy_from, self.busy_sends = now, deque()

    def idle(self) -> None:
        """The lane has nothing waiting (or may send nothing): what it keeps is no measure of its pace."""
        self.busy_from = None

    def went(self, now: float) -> None:
        """A call went."""
        if now - self.last_went > 2 * WINDOW:
            self.since_cold = 0
        self.since_cold += 1
        self.last_went = now
        if self.busy_from is not None:
            self.busy_sends.append(now)
            while self.busy_sends and self.busy_sends[0] < now - MEASURED_OVER:
                self.busy_sends.popleft()

    def kept(self, now: float) -> float:
        """The share of what the limits allow that the lane keeps: measured over the last `MEASURED_OVER` seconds of
        a stretch with work waiting throughout, its ramp (the first two windows) left out; else as last measured."""
        if self.busy_from is not None:
            start = max(self.busy_from + 2 * WINDOW, now - MEASURED_OVER)
            if now - start >= WINDOW:
                sent = sum(1 for t in self.busy_sends if t > start)
                self.efficiency = max(LEAST_EFFICIENCY, min(1.0, sent / (now - start) / self.per_second()))
        return self.efficiency

    def seconds_for(self, n: float) -> float:
        """Seconds the lane needs for `n` of this job's requests, from where its ramp stands, at the pace it keeps."""
        now = self.clock()
        warm = self.since_cold if now - self.last_went <= 2 * WINDOW else 0
        return lane_seconds(n, self.per_second() * self.kept(now), warm)
