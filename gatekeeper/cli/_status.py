"""`gatekeeper status`: the queue's depth against its ceiling, and the ledger in use (this host's by default), once or
watched."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._errors import ExitCode
from ..api._config import ApiConfig
from ..checks._status import Status, status
from ..watch._watch import reading_interval, watch
from ._common import api_config, print_json, retry_notice, run_until_stopped
from ._render import render_status


def cmd_status(args: argparse.Namespace) -> int:
    config = api_config(args)
    read = status_reader(args, config)
    if args.watch:
        return _watch_status(args, config, read)
    report = anyio.run(read)
    if args.json:
        print_json(report.to_json())
    else:
        print(render_status(report.to_json()))
    return ExitCode.FINDINGS if report.finding else ExitCode.OK


def status_reader(args: argparse.Namespace, config: ApiConfig) -> Callable[[], Awaitable[Status]]:
    """One reading of the queue (and, with --ledger, the ledger's reservations and jobs): the library's `status`."""
    async def read() -> Status:
        return await status(config, ceiling=args.ceiling, threshold=args.threshold, ledger=args.ledger,
                            max_rpm=args.max_rpm, on_retry=retry_notice(args))

    return read


def _watch_status(args: argparse.Namespace, config: ApiConfig, read: Callable[[], Awaitable[Status]]) -> int:
    """status --watch: until Ctrl-C (exit 0); never faster than the call budget allows."""
    every = args.interval if args.watch is True else float(args.watch)  # (`--watch 5` is `--watch --interval 5`)
    interval = reading_interval(every, config, args.max_rpm)
    tty = sys.stdout.isatty() and not args.json

    async def reading() -> dict[str, Any]:
        return (await read()).to_json()

    run_until_stopped(lambda: watch(reading, render_status, interval=interval, tty=tty, out=sys.stdout))
    return ExitCode.OK
