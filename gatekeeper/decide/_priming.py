"""Prompt caching decisions: which prefix each marked request shares, what caching would cost, how a job is primed
(which waiting batch may go is `_gate`'s). Pure: plain values in, plain values out.

A batch's requests run concurrently and never see each other's cache writes (the Message Batches documentation on prompt caching), so a cold batch
of requests sharing a prefix writes it once per request and reads it never. Priming sends one request per shared
prefix first, in a primer batch; once that batch has ended, the prefix is in the cache and the group's other
requests, sent then, read it at a tenth of the input rate.

- **The shared prefix** of a request is the longest of its marked prefixes that reaches the model's minimum and that
  another request of the job marks too; a request with no such prefix is a group of one (it writes, nobody reads).
- **Rounds**: groups, in input order, are put in rounds of at most `round_size` requests (half the queue the ceiling
  leaves us), so that a round's rest fits the queue while the next round's primer is processed (`_gate`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, compress, islice, repeat
from operator import le, mul, sub
from typing import Any

import msgspec

from .._arrays import extend
from .._prices import BATCH_DISCOUNT

LIFE_SECONDS = {"5m": 300.0, "1h": 3600.0}


class Marks:
    """The marked requests of a job as flat arrays (a million of them in tens of megabytes, not a gigabyte of
    objects): request k is of model `model[k]` (an index into `models`), `size[k]` in all, and its marked prefixes,
    shortest first, are the points `first[k]` to `first[k + 1] - 1`, each with its size `psize[p]`, digest and life
    (`hour[p]`: 1 for the 1-hour life). While every request has one point (the common shape), `first` is
    `range(len + 1)`, made, sent and joined at no cost (packed, it was 3 ms of 100,000 requests in each process);
    `counted` writes it. Sizes are in `unit`: "bytes" as the reader notes them (whole numbers, held
    as such: filling a float array from ints parses each one as an argument), "tokens" once sized
    with each model's tokens per byte. The decisions here count tokens: a size times `scale`, the tokens a unit (1
    for tokens; for bytes, the one rate every model of the job shares, so that a report need not convert them)."""

    __slots__ = ("models", "model", "size", "first", "psize", "digest", "hour", "unit", "scale")

    def __init__(self, unit: str = "tokens") -> None:
        self.models: list[str] = []
        sized = "q" if unit == "bytes" else "d"
        self.model = array("H")
        self.size: array[float] = array(sized)
        self.first: Sequence[int] = range(1)
        self.psize: array[float] = array(sized)
        self.digest = array("q")
        self.hour = bytearray()
        self.unit = unit
        self.scale: float | None = 1.0 if unit == "tokens" else None  # (bytes: the caller sets its rate)

    def add(self, model: int, size: float, points: Iterable[tuple[float, int, int]]) -> None:
        """One request: its model's index, its size, and its marked prefixes (size, digest, 1-hour?) in order."""
        self.model.append(model)
        self.size.append(size)
        n = 0
        for psize, digest, hour in points:
            self.psize.append(psize)
            self.digest.append(digest)
            self.hour.append(1 if hour else 0)
            n += 1
        self.counted(1, None if n == 1 else (n,))

    def counted(self, n: int, points: Iterable[int] | None = None) -> None:
        """Note where `n` requests just added end in `first`: `points`, each one's number of points (None: one each)."""
        first = self.first
        if points is None and first.__class__ is range:
            self.first = range(len(first) + n)
            return
        if first.__class__ is not array:
            self.first = first = array("q", first)  # (the first request with other than one point: once)
        done = first[-1]
        if points is None:
            extend(first, range(done + 1, done + n + 1))
        else:
            extend(first, tuple(islice(accumulate(points, initial=done), 1, None)))

    def __len__(self) -> int:
        return len(self.model)

    def life(self, point: int) -> str:
        return "1h" if self.hour[point] else "5m"


NONE = -1  # no shared prefix: every marked prefix below the minimum


def shared_prefixes(marks: Marks, minimum: list[float]) -> Sequence[int]:
    """Each request's shared prefix, as a point (see the module docstring): the longest eligible one another request
    marks too, else its longest eligible one (a group of one), else NONE (below the minimum: not cached at all).
    `minimum[m]`: model m's minimum in tokens. Where request k's one point is k for every k (one eligible marker a
    request, the common shape), a `range`: 100,000 of them cost nothing to make, count or read."""
    per = _per(marks)
    minimum = [x / per for x in minimum]  # (in the sizes' unit)
    first, ptokens, digest, model = marks.first, marks.psize, marks.digest, marks.model
    if len(digest) == len(marks):  # one marker a request (the common shape): its point if eligible, in C loops
        if minimum and len(ptokens):  # none eligible, or all, told at once
            if max(ptokens) < min(minimum):
                return array("q", [NONE]) * len(marks)
            if min(ptokens) >= max(minimum):
                return range(len(marks))
        floor = map(minimum.__getitem__, model) if len(minimum) > 1 else repeat(minimum[0] if minimum else 0.0)
        # request k gets point k where eligible, else NONE (-1): (k + 1) * eligible - 1, computed in C loops
        picked = map(NONE.__add__, map(mul, range(1, len(marks) + 1), map(le, floor, ptokens)))
        return array("q", struct.pack(f"{len(marks)}q", *picked))
    eligible = [p for k in range(len(marks)) for p in range(first[k], first[k + 1]) if ptokens[p] >= minimum[model[k]]]
    seen = Counter(digest[p] for p in eligible)
    chosen = array("q", [NONE]) * len(marks)
    for k in range(len(marks)):
        best = shared = NONE
        for p in range(first[k], first[k + 1]):
            if ptokens[p] >= minimum[model[k]]:
                best = p
                if seen[digest[p]] > 1:
                    shared = p
        chosen[k] = shared if shared != NONE else best
    return chosen


def _per(marks: Marks) -> float:
    """Tokens a unit of `marks`' sizes."""
    assert marks.scale is not None, "sized in bytes with no rate: size them in tokens first (_cachereport)"
    return marks.scale


def model_mask(marks: Marks, model: int) -> bytes | None:
    """A byte a request, 1 where it is of model `model` (None: every request is of one model), made in C loops from
    the model numbers' low bytes: `compress` then picks a model's values without a Python step a request."""
    if len(marks.models) <= 1:
        return None
    low = _low_bytes(marks)
    if low is not None:
        pick = bytearray(256)
        pick[model] = 1
        return low.translate(pick)
    return bytes(map(model.__eq__, marks.model))


def _low_bytes(marks: Marks) -> bytes | None:
    """Each request's model number as one byte (the 16-bit numbers' low bytes, in C), when every number fits one;
    None otherwise."""
    if len(marks.models) <= 256 and sys.byteorder == "little":
        return marks.model.tobytes()[0::2]
    return None


def under_mask(values: Sequence[Any], mask: bytes | None) -> Sequence[Any]:
    """A per-request array's values where `mask` (`model_mask`) says (all of them for None)."""
    return values if mask is None else list(compress(values, mask))


def lives(marks: Marks) -> tuple[list[int], list[int]]:
    """Per model (by index): its requests' marked prefixes, and how many of them live an hour. Counted over whole
    arrays (a model's points in a Python step each were a tenth of `plan`'s time on a file of three models)."""
    n = len(marks.models)
    if marks.first.__class__ is range:  # one point a request: a point's model is its request's
        point_model: Iterable[int] = marks.model
        low = _low_bytes(marks) if marks.hour.count(0) == len(marks.hour) else None
        if low is not None:  # (counted in C)
            return [low.count(m) for m in range(n)], [0] * n
    else:
        counts = map(sub, marks.first[1:], marks.first[:-1])
        point_model = array("H", chain.from_iterable(map(repeat, marks.model, counts)))
    points = Counter(point_model)
    hours = Counter() if marks.hour.count(0) == len(marks.hour) else Counter(compress(point_model, marks.hour))
    return [points[m] for m in range(n)], [hours[m] for m in range(n)]


def used_points(chosen: Sequence[int]) -> Sequence[int]:
    """The shared prefixes (points) the requests use, in order (`chosen`, or a model's share of it: `under_mask`); NONE
    left out. A `range` of points holds no NONE: it is returned as it is; an array of NONE alone (no prefix reaches
    the minimum) is told by a C count, a seventh of the filter's time."""
    if chosen.__class__ is range:
        return chosen
    if chosen.__class__ is array and chosen.count(NONE) == len(chosen):
        return []
    return list(filter(NONE.__ne__, chosen))


def sharing(marks: Marks, used: Sequence[int]) -> Counter[int]:
    """How many requests use each prefix (by digest): `groups`' sizes, counted without listing the members."""
    return Counter(map(marks.digest.__getitem__, used))


def groups(marks: Marks, chosen: Sequence[int]) -> list[list[int]]:
    """The requests (indexes, in order) of each prefix shared by two or more, in order of their first request."""
    by: dict[int, list[int]] = {}
    for k, p in enumerate(chosen):
        if p != NONE:
            by.setdefault(marks.digest[p], []).append(k)
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


class InputRates(msgspec.Struct, frozen=True):
    """Standard USD per million input tokens: plain, a 5-minute write, a 1-hour write, a read."""

    input: float
    write_5m: float
    write_1h: float
    read: float


def input_costs(marks: Marks, chosen: Sequence[int], rates: list[InputRates | None],
                only: int | None = None, used: Sequence[int] | None = None) -> dict[str, float | None]:
    """The input's cost at batch prices with no caching, with its markers sent cold (every request writes its
    prefix, none reads: one batch), and primed (one write a shared prefix, every other use a read). `rates[m]`:
    model m's rates (None: no price, and no cost); `only`: the requests of that model alone, and `used` their
    shared prefixes when the caller has them (`used_points`).

    Summed a model at a time over whole arrays: plain input for every token, then, for each prefix use, the
    difference a write (cold; primed: its first use) or a read (primed: every later use) makes."""
    none = cold = primed = 0.0
    for m in range(len(marks.models)) if only is None else (only,):
        r = rates[m]
        mask = model_mask(marks, m)
        if not (len(marks) if mask is None else mask.count(1)):
            continue
        if r is None:
            return {"none": None, "cold": None, "primed": None}
        uses = used if used is not None and only is not None else used_points(under_mask(chosen, mask))
        plain = sum(marks.size if mask is None else compress(marks.size, mask)) * _per(marks) * r.input
        none += plain
        cold += plain + _write_extra(marks, uses, r)
        firsts = list(dict(zip(map(marks.digest.__getitem__, uses), uses)).values())  # one use a prefix: its write
        tokens, first_tokens = _tokens(marks, uses), _tokens(marks, firsts)
        primed += plain + _write_extra(marks, firsts, r) + (tokens - first_tokens) * (r.read - r.input)
    return {k: round(BATCH_DISCOUNT * v / 1e6, 6) for k, v in (("none", none), ("cold", cold), ("primed", primed))}


def _tokens(marks: Marks, points: Sequence[int]) -> float:
    return sum(map(marks.psize.__getitem__, points)) * _per(marks)


def _write_extra(marks: Marks, points: Sequence[int], r: InputRates) -> float:
    """What writing these prefixes costs beyond their tokens' plain input."""
    hours = sum(compress(map(marks.psize.__getitem__, points), map(marks.hour.__getitem__, points))) * _per(marks)
    tokens = _tokens(marks, points)
    return (tokens - hours) * (r.write_5m - r.input) + hours * (r.write_1h - r.input)


def ideal_write_share(marks: Marks, used: Sequence[int]) -> float | None:
    """Of the prefix tokens the job's requests cache (`used`: the prefix each uses, `used_points`), the share an ideal
    run writes (one write a distinct prefix, every other use a read): the realized read share is
    read / ((read + write) x (1 - this))."""
    total = _tokens(marks, used)
    if not total:
        return None
    distinct = dict(zip(map(marks.digest.__getitem__, used), map(marks.psize.__getitem__, used)))
    return sum(distinct.values()) / total


def read_share(read: int, written: int, ideal_writes: float | None) -> float | None:
    """Cache reads as a share of the reads an ideal run gets (None when nothing could be read)."""
    if ideal_writes is None:
        return None
    ideal = (read + written) * (1 - ideal_writes)
    return None if ideal <= 0 else min(1.0, read / ideal)
