"""`plan`'s caching report, and the priming groups `submit` sends first, from what the reader noted (`_caching`).

Token sizes are the prefixes' bytes times the model's tokens per byte: measured with count_tokens where preflight
ran (`PlanReport.calibration`), else bytes / 4, and the report says which.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from .._prices import BYTES_PER_TOKEN, PriceTable
from ..decide._priming import (
    LIFE_SECONDS,
    Prefix,
    Rates,
    Use,
    groups,
    ideal_write_share,
    input_costs,
    rounds,
    shared_prefixes,
)
from ._sizing import BODY_SEP

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._planner import BatchPlan, PlanReport

UNMARKED_SHOWN = 5


@dataclass(frozen=True, slots=True)
class Marked:
    """The valid marked requests of a plan, with the prefix each shares (None: below the minimum)."""

    rows: list[tuple[int, int, int, str, str, Any]]  # (line, offset, bytes, custom_id, model, prefixes)
    uses: list[Use]
    chosen: list[Prefix | None]


def marked(report: PlanReport, prices: PriceTable) -> Marked:
    scan = report.cache_scan
    rejected = {e.line for e in report.errors} if report.errors else set()
    rows = [m for m in (scan.marked if scan else []) if m[0] not in rejected]
    per_byte = _tokens_per_byte(report)
    uses = [Use(model, size * per_byte(model), tuple(Prefix(b * per_byte(model), d, life) for b, d, life in points))
            for _, _, size, _, model, points in rows]
    minimum = {model: prices.cache_minimum(model)[0] for model in {u.model for u in uses}}
    return Marked(rows, uses, shared_prefixes(uses, minimum))


def _tokens_per_byte(report: PlanReport) -> Any:
    measured = (report.calibration or {}).get("models") or {}
    return lambda model: measured[model]["tokens_per_byte"] if model in measured else 1 / BYTES_PER_TOKEN


def caching_report(report: PlanReport, prices: PriceTable) -> dict[str, Any] | None:
    """Per model: marked requests, distinct and shared prefixes and their sizes, those below the model's minimum,
    the lives used, and the input cost with no caching, sent cold and primed; what marking shared unmarked system
    prompts and tool lists would save. None when the input has neither."""
    m = marked(report, prices)
    unmarked = _unmarked(report, prices)
    if not m.rows and not unmarked:
        return None
    models: dict[str, Any] = {}
    for model in sorted({u.model for u in m.uses}):
        idx = [k for k, u in enumerate(m.uses) if u.model == model]
        models[model] = _model_figures(report, prices, model, [m.uses[k] for k in idx], [m.chosen[k] for k in idx])
    measured = bool((report.calibration or {}).get("models"))
    return {
        "models": models,
        "ideal_write_share": ideal_write_share(m.chosen),
        "unmarked": unmarked,
        "method": ("prefix bytes x tokens per byte measured with count_tokens" if measured else
                   f"prefix bytes / {BYTES_PER_TOKEN:g} (not measured: no key)")
        + f"; minimums as of {prices.minimums_as_of}; batch prices as of {prices.as_of}",
    }


def _model_figures(report: PlanReport, prices: PriceTable, model: str, uses: list[Use],
                   chosen: list[Prefix | None]) -> dict[str, Any]:
    minimum, known = prices.cache_minimum(model)
    distinct = {p.digest: p for p in chosen if p is not None}
    shared = groups(chosen)
    sizes = sorted(p.tokens for p in distinct.values())
    lives: dict[str, int] = {}
    for u in uses:
        for p in u.prefixes:
            lives[p.life] = lives.get(p.life, 0) + 1
    costs = input_costs(uses, chosen, {model: rates_of(prices, model)})
    whole = report.estimate(prices)["models"].get(model, {}).get("cost_usd")
    plain = costs["none"]
    return {
        "requests_marked": len(uses),
        "prefixes": len(distinct),
        "shared_prefixes": len(shared),
        "requests_sharing": sum(len(g) for g in shared),
        "prefix_tokens": {"median": round(sizes[len(sizes) // 2]) if sizes else 0,
                          "max": round(sizes[-1]) if sizes else 0},
        "below_minimum": sum(1 for p in chosen if p is None),
        "minimum_tokens": minimum,
        "minimum_known": known,
        "lives": lives,
        # the model's whole input (marked or not), each way
        "input_cost_usd": {k: None if v is None or whole is None or plain is None else round(whole - plain + v, 6)
                           for k, v in costs.items()},
    }


def rates_of(prices: PriceTable, model: str) -> Rates | None:
    r = prices.rates(model)
    return None if r is None else Rates(r.input, r.cache_write, r.cache_write_1h, r.cache_read)


def _unmarked(report: PlanReport, prices: PriceTable) -> list[dict[str, Any]]:
    """Shared unmarked system prompts and tool lists worth marking (1h, primed), the largest saving first."""
    scan = report.cache_scan
    per_byte = _tokens_per_byte(report)
    out = []
    for (model, what, size, _), n in (scan.unmarked.items() if scan else ()):
        tokens = size * per_byte(model)
        r = rates_of(prices, model)
        if n < 2 or tokens < prices.cache_minimum(model)[0]:
            continue
        saving = None if r is None else round(0.5 * tokens * (n * r.input - r.write_1h - (n - 1) * r.read) / 1e6, 6)
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


@dataclass(frozen=True, slots=True)
class Round:
    """One round of priming: the first request of each group, then the groups' other requests."""

    primers: list[tuple[int, int, int, str]]  # (line, offset, bytes, custom_id), in line order
    rest: list[tuple[int, int, int, str]]
    life: float  # seconds the shortest-lived of its prefixes lives after its last use


def priming_rounds(report: PlanReport, prices: PriceTable, round_size: int) -> list[Round]:
    """The job's priming rounds (none when no prefix is shared)."""
    m = marked(report, prices)
    shared = groups(m.chosen)
    out = []
    for members in rounds([len(g) for g in shared], round_size):
        primers = [m.rows[shared[g][0]][:4] for g in members]
        rest = sorted(m.rows[k][:4] for g in members for k in shared[g][1:])
        life = min(LIFE_SECONDS[p.life] for g in members if (p := m.chosen[shared[g][0]]) is not None)
        out.append(Round(sorted(primers), rest, life))
    return out
