"""`plan --deadline`: whether the batch lane alone is expected to end the job in time and, if not, what the real-time
lane would take and cost. `forecast_from_limits` is pure (the limits and the ceiling passed in, the time passed in);
`forecast_deadline` reads them (with an Admin key) and calls it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..decide._deadline import PRIOR_TURNAROUND, forecast, kept_slack
from ..decide._headroom import ModelLimits, format_time
from ..decide._pacing import FIRST_ITPM, FIRST_OTPM, FIRST_RPM, Cost, Pace, lane_seconds

if TYPE_CHECKING:
    from ..api._config import ApiConfig
    from ..input._planner import PlanReport


def forecast_from_limits(report: PlanReport, estimate: Mapping[str, Any], *, deadline: float, now: float,
                      limits: Mapping[str, ModelLimits], ceiling: int | None, turnaround: float = PRIOR_TURNAROUND,
                      slack: float | None = None) -> dict[str, Any]:
    """The forecast for a planned job: its waves against the window, the rest at the real-time lane's pace (the
    slowest of the job's models, or the lowest tier's when no limits were read), its extra input cost."""
    job = {m: v for m, v in limits.items() if m in report.models} or dict(limits)  # (the job's models when named)
    rpm, itpm, otpm, reads = min(job.values(), default=(FIRST_RPM, FIRST_ITPM, FIRST_OTPM, True))
    n = max(1, report.requests)
    per_in, per_out = estimate["input_tokens"] / n, max(report.max_tokens_peak.values(), default=1)
    pace = Pace(0.0)
    pace.seed(rpm, itpm, otpm)
    per_second = pace.per_second(Cost(round(per_in), per_out))
    rounds = -(-report.requests // ceiling) if ceiling else 1
    window = deadline - now
    f = forecast(requests=report.requests, rounds=rounds, turn=turnaround, window=window,
                 lane_time=lambda k: lane_seconds(k, per_second), slack=kept_slack(slack, window))
    cost = estimate["input_cost_usd"]
    extra = None if cost is None else round(cost * f["realtime_requests"] / n, 6)  # real time: twice the batch price
    return {"at": format_time(deadline), "window_seconds": round(window), **f, "extra_input_cost_usd": extra,
            "assumes": {"turnaround_seconds": turnaround, "waves": rounds, "ceiling": ceiling,
                        "rate_limits": {"requests_per_minute": rpm, "input_tokens_per_minute": itpm,
                                        "output_tokens_per_minute": otpm, "input_limit_counts_cache_reads": reads},
                        "rate_limits_from": "admin-api" if limits else "the lowest tier's (no Admin key read them)",
                        "rate_limits_of": sorted(job),  # (the slowest of these models is assumed)
                        "output_per_request": f"max_tokens ({per_out:,}), charged up front"}}


def forecast_deadline(report: PlanReport, estimate: Mapping[str, Any], *, deadline: float, now: float,
                      config: ApiConfig | None = None, turnaround: float = PRIOR_TURNAROUND, slack: float | None = None,
                      max_rpm: float | None = None,
                      on_retry: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`forecast_from_limits` with the real-time lane's limits and the queue's ceiling read through `config`'s Admin key
    (without one: the lowest tier's limits and one wave). `report` must carry the models' max_tokens peaks (plan
    with `models={}`). Blocking: it runs its own event loop."""
    limits: dict[str, ModelLimits] = {}
    ceiling = None
    if config is not None and config.admin_key is not None:
        import anyio

        from ..api._queue import connect, read_ceiling, read_model_limits

        async def read() -> tuple[dict[str, ModelLimits], int | None]:
            async with connect(config, max_rpm=max_rpm, on_retry=on_retry) as conn:
                read_limit, _, _ = await read_ceiling(conn, None)
                return await read_model_limits(conn), read_limit

        limits, ceiling = anyio.run(read)
    return forecast_from_limits(report, estimate, deadline=deadline, now=now, limits=limits, ceiling=ceiling,
                             turnaround=turnaround, slack=slack)


__all__ = ["forecast_from_limits", "forecast_deadline"]
