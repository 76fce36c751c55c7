"""`gatekeeper submit`: the whole job (JSONL or a table) with progress on stderr, or its dry run."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from .._errors import ExitCode, Interrupted, UsageError
from .._prices import load_prices
from ..api._config import ApiConfig
from ..run._submit import dry_run, submit
from ..run.shared._beside import beside
from ..run.shared._settings import SubmitSettings
from ._common import api_config, limits, masked, print_error, print_json, retry_notice, state_dir
from ._progress import Progress
from ._render import render_plan_brief, render_summary
from ._tables import is_table_job, report_table, submit_table_run


def _submit_settings(args: argparse.Namespace) -> SubmitSettings:
    return SubmitSettings(
        state_dir=state_dir(args), out=Path(args.out) if args.out else None, ceiling=args.ceiling, margin=args.margin,
        interval=args.interval, max_in_flight=args.max_in_flight, max_attempts=args.max_attempts, limits=limits(args),
        reconcile_grace=args.reconcile_grace, min_backoff=min(5.0, args.interval * 2),
        ledger=args.ledger, ledger_ttl=args.ledger_ttl, priority=args.priority, share=args.share,
        results_grace=args.results_grace, max_rpm=args.max_rpm,
        allow_duplicate=args.allow_duplicate, resume_canceled=args.resume_canceled, preflight=not args.no_preflight,
        budget=args.budget, prime=not args.no_prime,
        token_sample=args.token_sample, journal=args.journal, job=args.job, lease_ttl=args.lease_ttl,
        deadline=args.deadline, turnaround=args.turnaround, deadline_slack=args.deadline_slack,
    )


def cmd_submit(args: argparse.Namespace) -> int:
    if args.input == "-":
        raise UsageError("submit needs a file it can read again on resume, not standard input: save it first")
    table = is_table_job(args)
    config = api_config(args)
    settings = _submit_settings(args)
    if table and args.dry_run:
        raise UsageError("--dry-run takes a JSONL input: for a table, `gatekeeper plan TABLE --template ...`",
                         setting="dry_run")
    if not args.dry_run:
        return _submit_run(args, config, settings, table)
    prices = load_prices(args.prices)
    notice = retry_notice(args)
    result = anyio.run(lambda: dry_run(args.input, config=config, settings=settings, prices=prices,
                                       on_event=lambda e, f: notice(f)))
    if args.json:
        print_json(result.to_json())
    else:
        print(render_plan_brief(result.to_json()))
    return ExitCode.OK if result.plan.invalid == 0 else ExitCode.FINDINGS


def _submit_run(args: argparse.Namespace, config: ApiConfig, settings: SubmitSettings, table: bool = False) -> int:
    """The whole job, with progress on stderr; Ctrl-C stops at the next safe point, twice at once."""
    progress = Progress(sys.stderr, "json" if args.json or not sys.stderr.isatty() else "tty")
    prices = load_prices(args.prices)

    async def run(stop: anyio.Event) -> Any:
        if table:
            return await submit_table_run(args, config, settings, progress, stop, prices)
        return await submit(args.input, config=config, settings=settings, on_event=progress, stop=stop,
                            prices=prices)

    try:
        summary = anyio.run(_with_signals, run, progress.close)
    except Interrupted as exc:
        progress.close()
        resume = "gatekeeper " + " ".join(shlex.quote(masked(a)) for a in args.argv)
        return print_error(exc, as_json=args.json,
                           message=f"interrupted; batches already created keep processing. Resume with: {resume}")
    finally:
        progress.close()
    if table:
        return report_table(args, summary)
    if args.json:
        print_json(summary.to_json())
    else:
        print(render_summary(summary))
    return ExitCode.OK if summary.ok else ExitCode.FINDINGS


async def _with_signals(body: Callable[[Any], Any], on_stop: Callable[[], None]) -> Any:
    """Run `body(stop)` with SIGINT/SIGTERM setting `stop`; a second signal exits at once (the journal is
    consistent at every instant). Errors are re-raised as they are, not wrapped by the task group."""
    stop = anyio.Event()

    async def watch() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if stop.is_set():
                    os._exit(ExitCode.INTERRUPTED)
                stop.set()
                on_stop()
                print("gatekeeper: stopping at the next safe point (Ctrl-C again to exit at once)", file=sys.stderr)

    return await beside(lambda: body(stop), watch)
