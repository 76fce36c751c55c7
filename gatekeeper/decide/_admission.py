"""Admission decisions. Pure: plain values in, plain values out.

The rule: a batch of n requests is created only when

    n <= ceiling - depth - margin - unseen

where `depth` is the live depth just read over every workspace key, and
`unseen` counts our own creates the listing does not show yet (answered but not
listed, or intents whose outcome is unknown). Depth is re-read before every
admission round, because other pipelines fill the queue too.

Sizing: with a known ceiling, a batch holds at most (ceiling - margin) / 4
requests (and never more than the per-batch limits), so four batches fit in the
queue at once and, as one ends, the next is already waiting: the queue stays
full while headroom comes back in steps of whole batches.

Without a ceiling (no Admin key, no --ceiling), batches go at the per-batch
limit and `CeilingEstimate` learns an upper bound from refusals: a refusal of n
at depth d proves ceiling < d + n, so nothing is sent that would exceed
d + n - 1 again. The bound is forgotten after `forget_after` seconds (the
refusal may have been another workspace's load), so a later probe can find
room that came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BATCHES_IN_QUEUE = 4


def batch_size_for(ceiling: int | None, margin: int, max_requests: int) -> int:
    """Requests per batch for a job whose queue ceiling is `ceiling` (None: unknown)."""
    if ceiling is None:
        return max_requests
    usable = max(1, ceiling - margin)
    return max(1, min(max_requests, usable // BATCHES_IN_QUEUE))


def room(ceiling: int | None, depth: int, margin: int, unseen: int) -> int | None:
    """Requests that can still be admitted now; None when the ceiling is unknown."""
    if ceiling is None:
        return None
    return ceiling - depth - margin - unseen


def admit(sizes: list[int], free: int | None, *, in_flight: int, max_in_flight: int | None) -> int:
    """How many of the waiting batches (sizes, in order) to create now.

    In order only: a large batch is not overtaken by smaller ones behind it,
    so the job's input order is kept and the large one is not starved.
    """
    count = 0
    for n in sizes:
        if max_in_flight is not None and in_flight + count >= max_in_flight:
            break
        if free is not None:
            if n > free:
                break
            free -= n
        count += 1
    return count


def waves(sizes: Sequence[int], ceiling: int, margin: int, max_in_flight: int | None = None) -> int:
    """How many rounds of creates a job of these batches (sizes, in order) takes on a queue it has to itself: each
    round admits what `admit` takes into the empty queue, and waits for it to drain (a batch larger than the room
    goes alone: the queue refuses it, and its refusals are the job's to weather)."""
    count, at = 0, 0
    while at < len(sizes):
        at += max(1, admit(list(sizes[at:]), max(0, ceiling - margin), in_flight=0, max_in_flight=max_in_flight))
        count += 1
    return count


@dataclass
class CeilingEstimate:
    """What refusals taught us about an unknown ceiling."""

    forget_after: float = 900.0
    upper: int | None = None  # the ceiling is at most this (from a refusal)
    learned_at: float = 0.0

    def bound(self, now: float) -> int | None:
        if self.upper is not None and now - self.learned_at > self.forget_after:
            self.upper = None
        return self.upper

    def refused(self, depth: int, unseen: int, n: int, now: float) -> None:
        bound = max(0, depth + unseen + n - 1)
        self.upper = bound if self.upper is None else min(self.upper, bound)
        self.learned_at = now

    def accepted(self, depth: int, unseen: int, n: int) -> None:
        # A success above the bound proves the bound wrong (the refusal was someone else's load).
        if self.upper is not None and depth + unseen + n > self.upper:
            self.upper = depth + unseen + n


@dataclass(frozen=True)
class QueueState:
    """What one admission round looks at. Plain values: the round is decided by `admit_round` alone."""

    waiting: Sequence[int]  # sizes of the batches not yet created, in order
    depth: int  # live depth just read over every workspace key
    unseen: int  # our creates the listing does not show yet (answered, or outcome unknown)
    bound: int | None  # the ceiling, or the bound learned from refusals; None: unknown
    margin: int = 0
    in_flight: int = 0  # our batches created or being created
    max_in_flight: int | None = None
    backoff_until: float = 0.0
    canceled: bool = False  # the user canceled the job: nothing new goes out


def admit_round(q: QueueState, now: float) -> int:
    """How many waiting batches to create now (0 while backing off or after a cancel)."""
    if q.canceled or now < q.backoff_until or not q.waiting:
        return 0
    return admit(list(q.waiting), room(q.bound, q.depth, q.margin, q.unseen),
                 in_flight=q.in_flight, max_in_flight=q.max_in_flight)


FIRST_READING_WAIT = 1.0  # seconds before the second reading of a run


def reading_wait(readings: int, interval: float) -> float:
    """Seconds before the next reading of the queue, after `readings` of them this run: 1, 2, 4, ... up to
    `interval`, so that a small job ends in seconds rather than at the first full interval, and a long one polls
    at `interval` after a handful of readings."""
    return min(interval, FIRST_READING_WAIT * 2.0 ** min(40, max(0, readings - 1)))  # (no overflow: 2 ** 40 s)


def refusal_wait(streak: int, retry_after: float | None, min_wait: float, max_wait: float) -> float:
    """Seconds to wait after the `streak`-th queue-full refusal in a row: doubling from `min_wait`, at least
    the server's retry-after, at most `max_wait`. A queue drains over minutes; hammering it only re-uploads."""
    return float(min(max(retry_after or 0.0, min_wait * 2 ** max(0, streak - 1)), max_wait))


def deferral_wait(retry_after: float | None, min_wait: float, max_wait: float) -> float:
    """Seconds to wait after a create that a per-minute limit or a failed connection put off."""
    return min(retry_after or min_wait, max_wait)


def recut_size(batch_size: int, largest_waiting: int, bound: int | None, margin: int,
               refused: int | None = None) -> int | None:
    """A smaller batch size when refusals proved the ceiling below the batches still waiting; None to keep it.

    A refusal of n at visible depth 0 bounds the ceiling below n: such a batch can never
    go whole. Halving (never below what the bound leaves) finds a size that fits in a few
    refusals, as peers do, without trusting a bound that other workspaces' hidden load
    may have lowered. A size no smaller than the batch just refused (`refused`) is no cure: that refusal says the
    queue is full now, not that batches are too large (issue 60, seed 7503: a primer of one request refused while a
    lost create was counted unseen cut every waiting batch to one request, each then waiting its turnaround).
    """
    if bound is None or largest_waiting <= bound - margin:
        return None
    size = max(1, min(batch_size // 2, largest_waiting // 2, max(1, bound - margin)))
    return size if size < largest_waiting and (refused is None or size < refused) else None
