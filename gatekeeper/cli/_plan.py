"""`gatekeeper plan`: the report of a JSONL file (or a table), its estimate, caching and deadline forecast."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .._errors import ExitCode
from .._prices import load_prices
from ..checks._plan import plan_with_preflight
from ..input._parallel import auto_workers
from ._common import limits, optional_api_config, print_json, retry_notice, warn
from ._render import render_caching, render_deadline, render_plan
from ._tables import is_table_job, plan_table_command

if TYPE_CHECKING:
    from ..api._config import ApiConfig
    from ..input._planner import PlanReport


def cmd_plan(args: argparse.Namespace) -> int:
    if is_table_job(args):
        return plan_table_command(args, limits(args))
    prices = load_prices(args.prices)
    config = optional_api_config(args)
    report = plan_with_preflight(
        args.input, config, limits=limits(args), preflight=not args.no_preflight, token_sample=args.token_sample,
        workers=args.workers if args.workers is not None else auto_workers(args.input), peaks=args.deadline is not None,
        max_rpm=args.max_rpm, on_retry=retry_notice(args), on_warning=warn)
    estimate = report.estimate(prices)
    caching = report.caching(prices)
    deadline = None if args.deadline is None else _forecast(args, config, report, estimate)
    if args.json:
        print_json({**report.to_json(), "estimate": estimate, "caching": caching,
                     **({"deadline": deadline} if deadline is not None else {})})
    else:
        print(render_plan(report, args.input))
        cost = "unknown (a model has no price)" if estimate["input_cost_usd"] is None else f"~${estimate['input_cost_usd']:,.2f}"
        print(f"estimate        ~{estimate['input_tokens']:,} input tokens, {cost} at batch prices ({estimate['method']})")
        if caching is not None:
            print(render_caching(caching))
        if deadline is not None:
            print(render_deadline(deadline))
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _forecast(args: argparse.Namespace, config: ApiConfig | None, report: PlanReport, estimate: dict[str, Any]
              ) -> dict[str, Any]:
    from ..checks._forecast import forecast_deadline  # (with --deadline only: plan starts without `typing`)

    return forecast_deadline(report, estimate, deadline=args.deadline, now=time.time(), config=config,
                             turnaround=args.turnaround, slack=args.deadline_slack, max_rpm=args.max_rpm,
                             on_retry=retry_notice(args))
