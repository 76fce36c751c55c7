"""How a job ended, read from its journal alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ..._prices import BATCH_DISCOUNT, PriceTable, load_prices
from ...decide._headroom import format_time
from ...decide._priming import read_share
from ...input._planner import PlanReport
from ...state._journal import Journal


@dataclass
class Summary:
    """How the job ended. `to_json` is what `submit --json` prints."""

    requests: int = 0
    succeeded: int = 0
    errored: int = 0
    expired: int = 0
    canceled: int = 0
    invalid: int = 0
    batches: int = 0
    pending: int = 0  # valid requests without a final result yet (an interrupted run)
    resubmitted: int = 0
    succeeded_after_retry: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float | None = None
    refusals: int = 0
    output: str = ""
    state_dir: str = ""
    complete: bool = False
    preflight: dict[str, Any] | None = None  # what the Models API said of the input's models (None: not recorded)
    budget: dict[str, Any] | None = None  # limit, spent, in-flight worst case, requests held back (None: no budget)
    estimate: dict[str, Any] | None = None  # the input-token estimate made before anything was sent, and how
    rebuilt: dict[str, int] | None = None  # the output rebuilt from the API: batches, results, unavailable (None: never)
    job: str | None = None  # the job's name in a shared journal (None: the state directory is the job)
    # batches found by listing after a lost create answer: how many their results proved ours, the ids of those
    # they could not tell from another submitter's, and the ids proven another's (None: no create answer was lost)
    adoptions: dict[str, Any] | None = None
    # stopped by `cancel`: when, and the requests never sent (None: not canceled, or the cancel was lifted)
    canceled_job: dict[str, Any] | None = None
    # prompt caching as realized: tokens written (5m, 1h) and read, the read share of the ideal, the saving against
    # no caching, and how the job was primed (None: no cache token was billed and the plan found no marker)
    caching: dict[str, Any] | None = None
    # succeeded answers by why they stopped: end_turn, max_tokens (truncated), refusal (billed, no answer), ...
    stop_reasons: dict[str, int] = field(default_factory=dict)
    # what each lane answered and cost: batch (half price) and, with a deadline, realtime (standard price), with the
    # real-time lane's calls and possible double charges (answers lost on the wire or to a crash)
    lanes: dict[str, Any] = field(default_factory=dict)
    # the deadline (None: none given): when, when the job finished, whether it was met, and whether the budget
    # stopped work moving to the real-time lane
    deadline: dict[str, Any] | None = None
    # on a shared ledger: the job's priority and share, and the seconds it waited for other jobs' turns (None: no
    # shared ledger)
    shares: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        met = self.deadline is None or bool(self.deadline.get("met"))
        # (a cancel the credentials refused is a finding even when the batches it left running all succeeded)
        left_live = bool(self.canceled_job and self.canceled_job.get("left_live"))
        return self.complete and self.invalid == 0 and self.succeeded == self.requests and met and not left_live

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "succeeded": self.succeeded, "errored": self.errored, "expired": self.expired,
            "canceled": self.canceled, "invalid": self.invalid, "batches": self.batches, "pending": self.pending,
            "resubmitted": self.resubmitted, "succeeded_after_retry": self.succeeded_after_retry,
            "errors": self.errors, "usage": self.usage, "cost_usd": self.cost_usd, "refusals": self.refusals,
            "complete": self.complete, "output": self.output, "state_dir": self.state_dir, "preflight": self.preflight,
            "budget": self.budget, "estimate": self.estimate, "rebuilt": self.rebuilt, "job": self.job,
            "adoptions": self.adoptions, "canceled_job": self.canceled_job, "caching": self.caching,
            "stop_reasons": self.stop_reasons, "lanes": self.lanes, "deadline": self.deadline, "shares": self.shares,
        }


def summarize(j: Journal, out_path: str, *, refusals: int = 0, prices: PriceTable | None = None,
              budget: float | None = None) -> Summary:
    report = j.get_meta("report") or {}
    t = j.outcomes.totals()
    requests = int(report.get("requests", 0))
    table = prices or load_prices()
    by_lane = lanes(j, table)
    cost = spent_usd(j, table)
    held = j.held_back() if budget is not None else 0
    return Summary(
        requests=requests,
        succeeded=t.types.get("succeeded", 0), errored=t.types.get("errored", 0), expired=t.types.get("expired", 0),
        canceled=t.types.get("canceled", 0), invalid=int(report.get("invalid", 0)), batches=t.batches,
        errors=t.errors, stop_reasons=t.stop_reasons, resubmitted=t.resubmitted, succeeded_after_retry=t.succeeded_after_retry,
        refusals=refusals, output=out_path, state_dir=str(j.state_dir), preflight=report.get("preflight"),
        estimate=report.get("estimate"), rebuilt=j.get_meta("rebuilt"), job=j.job, adoptions=adoptions(j),
        canceled_job=canceled_job(j), lanes=by_lane, shares=j.get_meta("shares"),
        deadline=deadline_json(j, complete=requests == t.final),
        pending=requests - t.final, complete=requests == t.final,
        usage=usage_json(t.usage),
        cost_usd=cost, caching=realized_caching(t.usage, t.usage_by_model, report.get("caching"), priming(j), table),
        budget=None if budget is None else {"limit": budget, "spent": budget_spent(j, table),
                                            "in_flight_worst": round(j.in_flight_worst(), 6),
                                            "held_back": held},
    )


def usage_json(usage: tuple[int, ...]) -> dict[str, Any]:
    """The run's tokens in the API's own usage shape, the cache writes split by life as `cache_creation` does."""
    tin, tout, written, read, hour = usage
    return {"input_tokens": tin, "output_tokens": tout, "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": written - hour, "ephemeral_1h_input_tokens": hour}}


def priming(j: Journal) -> dict[str, int] | None:
    """How the job was primed (`Groups.priming`), and the rounds that lapsed and were primed again."""
    counts = j.groups.priming()
    return None if counts is None else {**counts, "lapsed_rounds": len(j.outcomes.events_of("primer_lapsed"))}


def realized_caching(usage: tuple[int, ...], by_model: list[tuple[Any, ...]], planned: dict[str, Any] | None,
                     primed: dict[str, int] | None, prices: PriceTable) -> dict[str, Any] | None:
    """What caching did for the run (see `Summary.caching`), given the plan's caching report and how the job was
    primed. The saving prices every cache token as plain input instead, at batch prices; None when a model that
    succeeded has no price."""
    _, _, written, read, hour = usage
    if not written and not read and not planned:
        return None
    saving: float | None = 0.0
    for model, _, _, tcc, tcr, t1h in by_model:
        r = prices.rates(model)
        if r is None:
            saving = None
            break
        cached = (tcc or 0) * r.input + (tcr or 0) * r.input
        paid = ((tcc or 0) - (t1h or 0)) * r.cache_write + (t1h or 0) * r.cache_write_1h + (tcr or 0) * r.cache_read
        saving += BATCH_DISCOUNT * (cached - paid) / 1e6  # type: ignore[operator]
    share = read_share(read, written, (planned or {}).get("ideal_write_share"))
    return {"write_5m_tokens": written - hour, "write_1h_tokens": hour, "read_tokens": read,
            "read_share_of_ideal": None if share is None else round(share, 4),
            "saving_usd": None if saving is None else round(saving, 6),
            "priming": primed}


def canceled_job(j: Journal) -> dict[str, Any] | None:
    if not j.get_meta("user_canceled"):
        return None
    at = [e[0] for e in j.outcomes.events_of("user_canceled")]
    when = format_time(at[-1]) if at else None
    return {"at": when, "not_sent": j.held_back() + j.lane.queued(), "left_live": len(j.get_meta("cancel_refused") or [])}


def adoptions(j: Journal) -> dict[str, Any] | None:
    adopted = (j.get_meta("adopted") or {}).values()
    not_ours = j.get_meta("not_ours") or []
    if not adopted and not not_ours:
        return None
    return {"proven": sum(1 for a in adopted if a["proof"] in ("results", "ledger")),
            "unproven": sorted([*(a["id"] for a in adopted if a["proof"] == "unproven"), *j.adoptions.all_apart()]),
            "unchecked": sum(1 for a in adopted if a["proof"] == "listing"), "not_ours": list(not_ours)}


def spent_usd(j: Journal, prices: PriceTable) -> float | None:
    """What the results committed so far cost: the batch lane's at batch prices, the real-time lane's at standard
    prices (twice as much); None when an answered model has no price (never a wrong number)."""
    return _spent(j, lambda rows: _cost(rows, prices))


def budget_spent(j: Journal, prices: PriceTable) -> float:
    """What the budget counts as spent: `spent_usd`, with an answer whose model has no price counted at the table's
    dearest (never as free), and every real-time call whose answer was lost counted at its worst case (it may have
    been processed and billed)."""
    spent = _spent(j, lambda rows: sum(prices.cost_at_most(m, tin or 0, tout or 0, tcc or 0, tcr or 0, t1h or 0)
                                       for m, tin, tout, tcc, tcr, t1h in rows))
    assert spent is not None
    return round(spent + j.lane.lost_worst(), 6)


def _spent(j: Journal, cost: Callable[[list[tuple[Any, ...]]], float | None]) -> float | None:
    """Both lanes' committed usage and the limit probes, each priced by `cost` (the real-time lane's at double)."""
    batch, realtime = cost(j.outcomes.usage_by_model(False)), cost(j.outcomes.usage_by_model(True))
    probes = cost([(m, tin, tout, 0, 0, 0) for m, (_, tin, tout) in j.lane.probes().items()])
    if batch is None or realtime is None or probes is None:
        return None
    return round(batch + (realtime + probes) / BATCH_DISCOUNT, 6)


def lanes(j: Journal, prices: PriceTable) -> dict[str, Any]:
    """Requests each lane answered and what they cost; the real-time lane's calls and possible double charges."""
    counts = j.outcomes.lane_counts()
    batch, realtime = _cost(j.outcomes.usage_by_model(False), prices), _cost(j.outcomes.usage_by_model(True), prices)
    out: dict[str, Any] = {"batch": {"requests": counts["batch"], "cost_usd": batch}}
    stats = j.lane.stats()
    if stats["moved"]:
        out["realtime"] = {"requests": counts["realtime"],
                           "cost_usd": None if realtime is None else round(realtime / BATCH_DISCOUNT, 6), **stats}
    return out


def deadline_json(j: Journal, *, complete: bool) -> dict[str, Any] | None:
    """The job's deadline (the last one a run was given) and whether its last run finished the job by it."""
    deadline, finished_at = j.get_meta("deadline"), j.get_meta("finished_at")
    if deadline is None:
        return None
    met = complete and finished_at is not None and finished_at <= deadline
    return {"at": format_time(deadline), "finished_at": None if finished_at is None else format_time(finished_at), "met": met,
            "missed_for_budget": bool(j.get_meta("deadline_for_budget")) and not met}


def _cost(by_model: list[tuple[Any, ...]], prices: PriceTable) -> float | None:
    """Total at batch prices; None when any model that succeeded has no known price (never a wrong number)."""
    total = 0.0
    for model, tin, tout, tcc, tcr, t1h in by_model:
        cost = prices.cost(model, tin or 0, tout or 0, tcc or 0, tcr or 0, t1h or 0)
        if cost is None:
            return None
        total += cost
    return round(total, 6)


@dataclass(frozen=True)
class DryRun:
    """What `dry_run` found: the plan, the live headroom, and what would go now. `to_json` is `submit --dry-run --json`."""

    plan: PlanReport
    estimate: dict[str, Any]  # the input-token estimate and its cost (`PlanReport.estimate`)
    batch_size: int
    ceiling: int | None
    ceiling_source: str | None
    depth: int
    remaining: int | None
    would_create_now: int  # batches
    requests_now: int
    would_wait: int  # batches
    queue_after: int
    policy: str
    caching: dict[str, Any] | None = None  # `PlanReport.caching` (a primed job sends primers first: see caching.md)

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "plan"}, "plan": self.plan.to_json()}


@dataclass(frozen=True)
class CanceledBatch:
    """One batch `cancel` asked to stop."""

    batch: int  # its index in the job
    id: str
    status: str  # after the cancel: "canceling", "ended" when it was not running, "refused" (a 403: it runs on)


@dataclass(frozen=True)
class Canceled:
    """What `cancel` did: the live batches asked to stop, and the planned requests that will never be sent."""

    batches: tuple[CanceledBatch, ...]
    not_sent: int
    # creates whose answer is not in yet (no id to cancel): the submit that reconciles each cancels it
    unanswered: int = 0
    # batches the credentials may not cancel (a 403): they run on, and are collected when they end
    refused: tuple[CanceledBatch, ...] = ()
    permission: str | None = None  # what the credentials lack to cancel them, as the platform names it

    def to_json(self) -> dict[str, Any]:
        return {"canceled": [{"batch": b.batch, "id": b.id, "status": b.status} for b in self.batches],
                "not_sent": self.not_sent, "unanswered_creates": self.unanswered,
                "refused": [{"batch": b.batch, "id": b.id} for b in self.refused], "permission": self.permission}
