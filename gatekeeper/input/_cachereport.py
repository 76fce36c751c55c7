"""`plan`'s caching report, and the priming groups `submit` sends first, from what the reader noted (`_caching`).

Token sizes are the prefixes' bytes times the model's tokens per byte: measured with count_tokens where preflight
ran (`PlanReport.calibration`), else bytes / 4, and the report says which.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import chain, repeat
from operator import mul, sub
from typing import TYPE_CHECKING, Any

import msgspec

from .._arrays import extend
from .._prices import BATCH_DISCOUNT, BYTES_PER_TOKEN_ESTIMATE, PriceTable, tokens_per_byte
from ..decide._priming import (
    LIFE_SECONDS,
    InputRates,
    Marks,
    groups,
    ideal_write_share,
    input_costs,
    lives,
    model_mask,
    rounds,
    shared_prefixes,
    sharing,
    under_mask,
    used_points,
)
from ._caching import CacheScan
from ._sizing import BODY_SEP

if TYPE_CHECKING:
    from ._planner import BatchPlan, PlanReport

UNMARKED_SHOWN = 5


class Marked(msgspec.Struct):
    """The valid marked requests of a plan in tokens (`marks`), where each is in the input (`rows[k]`: the marked
    line's index in the scan), and the prefix each shares (`chosen`: a point of `marks`, or `NONE`)."""

    scan: CacheScan
    rows: Sequence[int]
    marks: Marks
    chosen: Sequence[int]


def marked(report: PlanReport, prices: PriceTable) -> Marked:
    """The scan's marked lines less the rejected ones, sized in tokens, each with the prefix it shares."""
    scan = report.cache_scan or CacheScan()
    rejected = {e.line for e in report.errors} if report.errors else set()
    per_byte = [_rate(report, model) for model in scan.marks.models]
    src, out = scan.marks, Marks()
    out.models = list(src.models)
    if not scan.any_line_in(rejected):
        _sized(src, out, per_byte)
        minimum = [float(prices.cache_minimum(model)[0]) for model in out.models]
        return Marked(scan, range(len(scan)), out, shared_prefixes(out, minimum))
    keep = [k for k in range(len(scan)) if scan.lines[k] not in rejected]
    rows = array("q", keep)
    first = src.first
    for k in keep:  # (array slices and extends: a million requests in about a second)
        rate = per_byte[src.model[k]]
        out.model.append(src.model[k])
        out.size.append(src.size[k] * rate)
        out.psize.extend(array("d", [t * rate for t in src.psize[first[k]:first[k + 1]]]))
        out.digest.extend(src.digest[first[k]:first[k + 1]])
        out.hour.extend(src.hour[first[k]:first[k + 1]])
        points = first[k + 1] - first[k]
        out.counted(1, None if points == 1 else (points,))
    minimum = [float(prices.cache_minimum(model)[0]) for model in out.models]
    return Marked(scan, rows, out, shared_prefixes(out, minimum))


def _sized(src: Marks, out: Marks, per_byte: list[float]) -> None:
    """Every marked line, sized in tokens (each model's tokens per byte), whole arrays at a time: no Python step a
    line but the maps'. Where every model has the same rate (always, without a key), the byte sizes themselves
    with that rate as their `scale`: nothing converted (15 ms of 100,000 marked lines)."""
    out.model = array("H", src.model)
    out.first = src.first if isinstance(src.first, range) else array("q", src.first)
    out.digest = array("q", src.digest)
    out.hour = bytearray(src.hour)
    if len(set(per_byte)) <= 1:  # one rate: the byte sizes as they are, scaled where counted
        out.size, out.psize, out.unit, out.scale = src.size, src.psize, src.unit, per_byte[0] if per_byte else 1.0
        return
    rates = [per_byte[m] for m in src.model]
    out.size = extend(array("d"), map(mul, src.size, rates))
    counts = map(sub, src.first[1:], src.first[:-1])
    out.psize = extend(array("d"), map(mul, src.psize, chain.from_iterable(map(repeat, rates, counts))))


def _rate(report: PlanReport, model: str) -> float:
    return tokens_per_byte((report.calibration or {}).get("models") or {}, model)


def caching_report(report: PlanReport, prices: PriceTable, m: Marked | None = None,
                   estimate: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Per model: marked requests, distinct and shared prefixes and their sizes, those below the model's minimum,
    the lives used, and the input cost with no caching, sent cold and primed; what marking shared unmarked system
    prompts and tool lists would save. None when the input has neither. (`m` and `estimate`: `marked` and
    `report.estimate`, when the caller has them already.)"""
    m = m or marked(report, prices)
    unmarked = _unmarked(report, prices)
    if not len(m.marks) and not unmarked:
        return None
    whole = (estimate or report.estimate(prices))["models"]
    used = used_points(m.chosen)  # (once: a pass over every request)
    one = len(m.marks.models) == 1
    counted = lives(m.marks)
    present = {i for i, points in enumerate(counted[0]) if points}  # (a marked request has a point at least)
    models = {name: _model_figures(prices, m, i, whole.get(name, {}).get("cost_usd"), counted,
                                 used if one or not used else None)
              for i, name in enumerate(m.marks.models) if i in present}
    measured = bool((report.calibration or {}).get("models"))
    return {
        "models": dict(sorted(models.items())),
        "ideal_write_share": ideal_write_share(m.marks, used),
        "unmarked": unmarked,
        "method": ("prefix bytes x tokens per byte measured with count_tokens" if measured else
                   f"prefix bytes / {BYTES_PER_TOKEN_ESTIMATE:g} ({report.unmeasured()})")
        + f"; minimums as of {prices.minimums_as_of}; batch prices as of {prices.as_of}",
    }


def _model_figures(prices: PriceTable, m: Marked, model: int, whole: float | None,
                   counted: tuple[list[int], list[int]], used: Sequence[int] | None = None) -> dict[str, Any]:
    """One model's figures; `whole`: the estimated cost of all its input, marked or not; `counted`: every model's
    prefixes and 1-hour prefixes (`lives`); `used`: the shared prefixes its requests use, when the caller has
    them."""
    marks, name = m.marks, m.marks.models[model]
    mask = model_mask(marks, model)
    requests = len(marks) if mask is None else mask.count(1)
    used = used_points(under_mask(m.chosen, mask)) if used is None else used
    minimum, known = prices.cache_minimum(name)
    distinct = dict(zip(map(marks.digest.__getitem__, used), map(marks.psize.__getitem__, used)))
    shared = [n for n in sharing(marks, used).values() if n > 1]
    sizes, per = sorted(distinct.values()), marks.scale or 1.0
    points, hours = counted[0][model], counted[1][model]
    costs = input_costs(marks, m.chosen, [rates_of(prices, x) for x in marks.models], only=model, used=used)
    plain = costs["none"]
    return {
        "requests_marked": requests,
        "prefixes": len(distinct),
        "shared_prefixes": len(shared),
        "requests_sharing": sum(shared),
        "prefix_tokens": {"median": round(sizes[len(sizes) // 2] * per) if sizes else 0,
                          "max": round(sizes[-1] * per) if sizes else 0},
        "below_minimum": requests - len(used),
        "minimum_tokens": minimum,
        "minimum_known": known,
        "lives": {k: v for k, v in (("1h", hours), ("5m", points - hours)) if v},
        # the model's whole input (marked or not), each way
        "input_cost_usd": {k: None if v is None or whole is None or plain is None else round(whole - plain + v, 6)
                           for k, v in costs.items()},
    }


def rates_of(prices: PriceTable, model: str) -> InputRates | None:
    r = prices.rates(model)
    return None if r is None else InputRates(r.input, r.cache_write, r.cache_write_1h, r.cache_read)


def _unmarked(report: PlanReport, prices: PriceTable) -> list[dict[str, Any]]:
    """Shared unmarked system prompts and tool lists worth marking (1h, primed), the largest saving first."""
    scan = report.cache_scan
    out: list[dict[str, Any]] = []
    for (model, what, size, _), n in (scan.unmarked.items() if scan else ()):
        tokens = size * _rate(report, model)
        r = rates_of(prices, model)
        if n < 2 or tokens < prices.cache_minimum(model)[0]:
            continue
        saving = None if r is None else round(BATCH_DISCOUNT * tokens * (n * r.input - r.write_1h - (n - 1) * r.read) / 1e6, 6)
        out.append({"model": model, "part": what, "requests": n, "tokens": round(tokens), "saving_usd": saving})
    out.sort(key=lambda x: (-(x["saving_usd"] or 0), -x["requests"]))
    return out[:UNMARKED_SHOWN]


def without_lines(batches: list[BatchPlan], claimed: dict[int, int]) -> list[tuple[Any, ...]]:
    """The input-range batches as the journal records them, less the `claimed` lines (line -> bytes), which priming
    sends in batches of their own; a range left empty is dropped. (Its first and last custom_ids still bound it.)"""
    lines = sorted(claimed)
    out: list[tuple[Any, ...]] = []
    for b in batches:
        inside = lines[bisect_left(lines, b.first_line):bisect_right(lines, b.last_line)]
        requests = b.requests - len(inside)
        if requests > 0:
            size = b.bytes - sum(claimed[line] for line in inside) - len(inside) * len(BODY_SEP)
            out.append((len(out), requests, size, b.first_line, b.last_line, b.start_offset, b.end_offset,
                        b.first_custom_id, b.last_custom_id))
    return out


class Round(msgspec.Struct):
    """One round of priming: the first request of each group (`primers`: (line, offset, bytes, custom_id), in line
    order), then the groups' other requests (`rest`); `life`: seconds the shortest-lived of its prefixes lives after
    its last use."""

    primers: list[tuple[int, int, int, str]]
    rest: list[tuple[int, int, int, str]]
    life: float


def priming_rounds(m: Marked, round_size: int) -> list[Round]:
    """The job's priming rounds, from its marked requests (`marked`): none when no prefix is shared."""
    shared = groups(m.marks, m.chosen)
    scan = m.scan

    def row(k: int) -> tuple[int, int, int, str]:
        at = m.rows[k]
        return scan.lines[at], scan.offsets[at], int(scan.marks.size[at]), scan.cids[at]

    out = []
    for members in rounds([len(g) for g in shared], round_size):
        primers = sorted(row(shared[g][0]) for g in members)
        rest = sorted(row(k) for g in members for k in shared[g][1:])
        life = min(LIFE_SECONDS[m.marks.life(m.chosen[shared[g][0]])] for g in members)
        out.append(Round(primers, rest, life))
    return out
