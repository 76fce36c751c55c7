"""Prompt caching decisions: which prefix each marked request shares, what caching would cost, how a job is primed
and which waiting batch may go. Pure: plain values in, plain values out.

A batch's requests run concurrently and never see each other's cache writes (api.md section 15), so a cold batch
of requests sharing a prefix writes it once per request and reads it never. Priming sends one request per shared
prefix first, in a primer batch; once that batch has ended, the prefix is in the cache and the group's other
requests, sent then, read it at a tenth of the input rate.

- **The shared prefix** of a request is the longest of its marked prefixes that reaches the model's minimum and that
  another request of the job marks too; a request with no such prefix is a group of one (it writes, nobody reads).
- **Rounds**: groups, in input order, are put in rounds of at most `round_size` requests (half the queue the ceiling
  leaves us), so that a round's rest fits the queue while the next round's primer is processed. A round's primer
  goes only when the previous round's rest has all been created and the queue has room for its own rest; while it
  is in flight that room is held (`reserve`), so the rest goes the moment the primer is seen to end, well inside
  a 5-minute life unless other submitters fill the queue meanwhile; then the round has `lapsed` and is primed again
  (run/_reprime.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

BATCH_DISCOUNT = 0.5
LIFE_SECONDS = {"5m": 300.0, "1h": 3600.0}


@dataclass(frozen=True, slots=True)
class Prefix:
    """A marked prefix: its size in tokens, its digest and its life."""

    tokens: float
    digest: int
    life: str


@dataclass(frozen=True, slots=True)
class Use:
    """One marked request, as caching sees it."""

    model: str
    tokens: float  # the whole request's input tokens (estimated)
    prefixes: tuple[Prefix, ...]  # shortest first


def shared_prefixes(uses: list[Use], minimum: dict[str, int]) -> list[Prefix | None]:
    """Each request's shared prefix (see the module docstring), or its longest eligible one when no other request
    marks it, or None when every marked prefix is below the model's minimum (it is not cached at all)."""
    eligible = [[p for p in u.prefixes if p.tokens >= minimum.get(u.model, 1024)] for u in uses]
    seen = Counter(p.digest for ps in eligible for p in ps)
    out: list[Prefix | None] = []
    for ps in eligible:
        shared = [p for p in ps if seen[p.digest] > 1]
        out.append(shared[-1] if shared else (ps[-1] if ps else None))
    return out


def groups(chosen: list[Prefix | None]) -> list[list[int]]:
    """The requests (indexes, in order) of each prefix shared by two or more, in order of their first request."""
    by: dict[int, list[int]] = {}
    for k, p in enumerate(chosen):
        if p is not None:
            by.setdefault(p.digest, []).append(k)
    return [g for g in by.values() if len(g) > 1]


def round_size(ceiling: int | None, margin: int, batch_size: int) -> int:
    """Requests a round of priming holds: half the usable queue (so that the next round's primer goes while this
    round's rest is processed), at least one batch; one batch when the ceiling is unknown."""
    return batch_size if ceiling is None else max(batch_size, (ceiling - margin) // 2)


def rounds(group_sizes: list[int], round_size: int) -> list[list[int]]:
    """Group indexes cut into rounds of at most `round_size` requests (a larger group is a round of its own)."""
    out: list[list[int]] = []
    total = 0
    for k, n in enumerate(group_sizes):
        if not out or total + n > round_size:
            out.append([])
            total = 0
        out[-1].append(k)
        total += n
    return out


@dataclass(frozen=True, slots=True)
class Rates:
    """Standard USD per million input tokens: plain, a 5-minute write, a 1-hour write, a read."""

    input: float
    write_5m: float
    write_1h: float
    read: float


def input_costs(uses: list[Use], chosen: list[Prefix | None], rates: dict[str, Rates | None]) -> dict[str, float | None]:
    """The input's cost at batch prices with no caching, with its markers sent cold (every request writes its
    prefix, none reads: one batch), and primed (one write a shared prefix, every other use a read)."""
    costs: dict[str, float | None] = {"none": 0.0, "cold": 0.0, "primed": 0.0}
    first: set[int] = set()
    for u, p in zip(uses, chosen, strict=True):
        r = rates.get(u.model)
        if r is None:
            return {k: None for k in costs}
        plain = u.tokens * r.input
        costs["none"] += plain  # type: ignore[operator]
        if p is None:
            costs["cold"] += plain  # type: ignore[operator]
            costs["primed"] += plain  # type: ignore[operator]
            continue
        rest = (u.tokens - p.tokens) * r.input
        write = rest + p.tokens * (r.write_1h if p.life == "1h" else r.write_5m)
        costs["cold"] += write  # type: ignore[operator]
        costs["primed"] += write if p.digest not in first else rest + p.tokens * r.read  # type: ignore[operator]
        first.add(p.digest)
    return {k: round(BATCH_DISCOUNT * v / 1e6, 6) if v is not None else None for k, v in costs.items()}


def ideal_write_share(chosen: list[Prefix | None]) -> float | None:
    """Of the prefix tokens the job's requests cache, the share an ideal run writes (one write a distinct prefix,
    every other use a read): the realized read share is read / ((read + write) x (1 - this))."""
    used = sum(p.tokens for p in chosen if p is not None)
    if not used:
        return None
    distinct = {p.digest: p.tokens for p in chosen if p is not None}
    return sum(distinct.values()) / used


def read_share(read: int, written: int, ideal_writes: float | None) -> float | None:
    """Cache reads as a share of the reads an ideal run gets (None when nothing could be read)."""
    if ideal_writes is None:
        return None
    ideal = (read + written) * (1 - ideal_writes)
    return None if ideal <= 0 else min(1.0, read / ideal)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A batch not yet created, as the gate sees it: `kind` "primer", "rest" or another (sent as today)."""

    idx: int
    kind: str
    requests: int
    round: int | None


@dataclass(frozen=True, slots=True)
class Gate:
    order: list[int]  # the batches that may go, in the order they should (idx)
    sizes: list[int]  # the room each needs (a primer: its round's, so that its rest will fit)
    reserve: int  # room held for rests whose primer is in flight
    held: int  # batches held back for a primer (for the "waiting" event)


def lapsed(ended_at: float | None, life: float | None, now: float) -> bool:
    """Whether a round's prefixes should have left the cache: its primers ended longer ago than its shortest life."""
    return ended_at is not None and life is not None and now - ended_at > life


def gate(waiting: list[Waiting], primers_ended: dict[int, float | None], cap: int | None) -> Gate:
    """Which waiting batches may go now. `primers_ended[r]`: when every primer of round r had ended (None while one
    is planned or in flight); `cap`: the most room a batch can ever need (ceiling less margin), if known."""
    rests: dict[int, int] = {}
    for w in waiting:
        if w.kind == "rest" and w.round is not None:
            rests[w.round] = rests.get(w.round, 0) + w.requests
    primer_waiting = {w.round for w in waiting if w.kind == "primer"}
    ready, primers, others = [], [], []
    reserve = held = 0
    for w in waiting:
        if w.kind == "rest":
            if primers_ended.get(w.round or 0, 0.0) is not None:
                ready.append((w.idx, w.requests))
            else:
                held += 1
                if w.round not in primer_waiting:
                    reserve += w.requests  # its primer is in flight: keep its room
        elif w.kind == "primer":
            if any(r < (w.round or 0) for r in rests):
                held += 1
                continue
            need = w.requests + rests.get(w.round or 0, 0)
            primers.append((w.idx, min(need, cap) if cap is not None else need))
        else:
            others.append((w.idx, w.requests))
    chosen = ready + primers + others
    return Gate([i for i, _ in chosen], [n for _, n in chosen], reserve, held)
