"""`gatekeeper plan`: the report of a JSONL file (or a table), its estimate, caching and deadline forecast."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .._errors import ExitCode
from .._prices import load_prices
from ..checks._plan import plan_with_preflight, rerun_of
from ..input._parallel import auto_workers
from ._common import limits, optional_api_config, print_json, retry_notice, warn
from ._render import render_caching, render_deadline, render_plan, render_rerun
from ._tables import is_table_job, plan_table_command

if TYPE_CHECKING:
    from ..api._config import ApiConfig
    from ..input._planner import PlanReport
    from ..input._sizing import Limits


def cmd_plan(args: argparse.Namespace) -> int:
    if is_table_job(args):
        return plan_table_command(args, limits(args))
    prices = load_prices(args.prices)
    config = optional_api_config(args, offline=True)
    report = plan_with_preflight(
        args.input, config, limits=_at_ceiling(args), preflight=not args.no_preflight, token_sample=args.token_sample,
        workers=args.workers if args.workers is not None else auto_workers(args.input), peaks=args.deadline is not None,
        max_rpm=args.max_rpm, on_retry=retry_notice(args), on_warning=warn)
    estimate = report.estimate(prices)
    caching = report.caching(prices)
    deadline = None if args.deadline is None else _forecast(args, config, report, estimate)
    rounds = None if args.ceiling is None else _waves(report, args)
    rerun = None if args.input == "-" else rerun_of(args.state or f"{args.input}.gatekeeper")
    if args.json:
        print_json({**report.to_json(), "estimate": estimate, "caching": caching,
                    "to_send": report.requests if rerun is None else rerun["to_send"], "rerun": rerun,
                    **({"waves": rounds} if rounds is not None else {}),
                    **({"deadline": deadline} if deadline is not None else {})})
    else:
        print(render_plan(report, args.input))
        if rerun is not None:
            print(render_rerun(rerun))
        if rounds is not None:
            print(f"waves           {rounds:,} round(s) of creates at the ceiling {args.ceiling:,} (--ceiling)")
        cost = "unknown (a model has no price)" if estimate["input_cost_usd"] is None else f"~${estimate['input_cost_usd']:,.2f}"
        print(f"estimate        ~{estimate['input_tokens']:,} input tokens, {cost} at batch prices ({estimate['method']})")
        if caching is not None:
            print(render_caching(caching))
        if deadline is not None:
            print(render_deadline(deadline))
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _at_ceiling(args: argparse.Namespace) -> Limits:
    """The limits, with batches cut as `submit` cuts them under --ceiling (less --margin): a quarter of it."""
    given = limits(args)
    if args.ceiling is None:
        return given
    from ..decide._admission import batch_size_for  # (with --ceiling only: it imports typing)
    from ..input._sizing import Limits

    size = batch_size_for(args.ceiling, args.margin, given.max_requests)
    return Limits(max_requests=size, max_bytes=given.max_bytes, api_version=given.api_version)


def _waves(report: PlanReport, args: argparse.Namespace) -> int:
    from ..decide._admission import waves

    return waves([b.requests for b in report.batches], args.ceiling, args.margin)


def _forecast(args: argparse.Namespace, config: ApiConfig | None, report: PlanReport, estimate: dict[str, Any]
              ) -> dict[str, Any]:
    from ..checks._forecast import forecast_deadline  # (with --deadline only: plan starts without `typing`)

    return forecast_deadline(report, estimate, deadline=args.deadline, now=time.time(), config=config,
                             turnaround=args.turnaround, slack=args.deadline_slack, max_rpm=args.max_rpm,
                             on_retry=retry_notice(args))
