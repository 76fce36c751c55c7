"""The real-time lane's pace against the fake's real-time lane, in simulated time: its buckets and its acceleration
rule (whole requests) on an injected clock, calls reaching it unevenly late, answers taking their latency, 429s
obeyed as the lane obeys them. For the pace's tests and `bench_pace.py`: figures no machine's load can move."""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

from gatekeeper.decide._pacing import Cost, Pace
from gatekeeper.testing._model import FakeRealtime
from gatekeeper.testing._realtime import Lane


def against_the_fake(rpm: int, n: int, *, jitter: float, latency: float = 0.02, seed: int = 1) -> tuple[list[float], Any]:
    """The pace sending `n` requests as fast as it allows against the fake's real-time lane (its buckets and its
    acceleration rule, on an injected clock), each call reaching the fake up to `jitter` seconds after the pace
    counts it and answering `latency` later; 429s obeyed as the lane obeys them. When each call was let through,
    and the fake's records."""
    clock = [0.0]
    fake = Lane(FakeRealtime(rpm=rpm, itpm=10**9, otpm=10**9), clock=lambda: clock[0])
    p, cost, rng = Pace(0.0), Cost(1, 1), random.Random(seed)
    p.seed(rpm, 10**9, 10**9)
    events: list[tuple[float, int, str, Any]] = []  # (when, order, what, detail)
    admitted: list[float] = []
    t, queued, answered, order = 0.0, n, 0, 0
    while answered < n:
        wait = p.wait(cost, t) if queued else math.inf
        if wait <= 0:
            at = p.sent(cost, t)
            queued, order = queued - 1, order + 1
            heapq.heappush(events, (t + rng.random() * jitter, order, "arrives", at))
            continue
        until = t + max(1e-6, min(wait, 5.0))  # (the lane looks again when an answer comes, or 5 s on)
        if not events or events[0][0] > until:
            t = until
            continue
        when, _, what, detail = heapq.heappop(events)
        t = clock[0] = max(t, when)
        order += 1
        if what == "arrives":
            why, retry_after, h = fake.admit("m", 1, 1)
            if why is None:
                admitted.append(when)
                heapq.heappush(events, (when + latency, order, "answered", fake.settle("m", 1, 1, 1, 1)))
            else:
                heapq.heappush(events, (when + 0.001, order, "refused", (h, max(1, math.ceil(retry_after)), detail)))
        elif what == "refused":
            p.refused(detail[0], detail[1], when, detail[2])
            queued += 1
        else:
            p.answered(detail, cost, (1, 1), when)
            answered += 1
    return admitted, fake.records
