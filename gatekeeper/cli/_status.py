"""`gatekeeper status`: the queue's depth against its ceiling, and the ledger in use (this host's by default), once or
watched."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import anyio

from .._errors import ExitCode
from ..api._config import ApiConfig
from ..api._queue import connect, read_headroom
from ..decide._headroom import FINDINGS, Headroom
from ..run.job._beats import liveness
from ..state.ledger._base import LedgerReading
from ..state.ledger._open import HOST, choose_ledger, open_ledger, sqlite_file
from ..watch._watch import min_interval, watch
from ._common import api_config, print_json, retry_notice
from ._render import render_status, status_report


def cmd_status(args: argparse.Namespace) -> int:
    config = api_config(args)
    read = status_reader(args, config)
    if args.watch:
        return _watch_status(args, config, read)
    h, ledger = anyio.run(read)
    report = status_report(h, ledger, args.threshold, config.platform)
    if args.json:
        print_json(report)
    else:
        print(render_status(report))
    return ExitCode.FINDINGS if report["verdict"] in FINDINGS else ExitCode.OK


def status_reader(args: argparse.Namespace, config: ApiConfig) -> Callable[[], Any]:
    """One reading of the queue and of the ledger in use (its reservations and jobs; None with `--ledger none`),
    as an async function. This host's ledger is read where it is, never created by a reading."""
    chosen = choose_ledger(args.ledger, os.environ, create=False)

    async def read() -> tuple[Headroom, LedgerReading | None]:
        async with connect(config, max_rpm=args.max_rpm, on_retry=retry_notice(args)) as conn:
            h = await read_headroom(conn, ceiling=args.ceiling)
        if chosen.url is None:
            return h, None
        if chosen.kind == HOST and not os.path.exists(sqlite_file(chosen.url, config.scope)):
            return h, LedgerReading([], [], chosen.to_json())  # (no job has run on this host yet)
        ledger = open_ledger(chosen.url, owner="status", namespace=config.scope, liveness=liveness(registered=False))
        try:
            await ledger.ping()
            live = [r for r in await ledger.reservations() if r.live]  # (not the names of released batches, nor orphans)
            return h, LedgerReading(live, await ledger.claims(), chosen.to_json())
        finally:
            await ledger.close()

    return read


def _watch_status(args: argparse.Namespace, config: ApiConfig, read: Callable[[], Any]) -> int:
    """status --watch: until Ctrl-C (exit 0); never faster than the call budget allows."""
    every = args.interval if args.watch is True else float(args.watch)  # (`--watch 5` is `--watch --interval 5`)
    interval = max(every, min_interval(config.reads, args.max_rpm or config.default_rpm))
    tty = sys.stdout.isatty() and not args.json

    async def reading() -> dict[str, Any]:
        h, ledger = await read()
        return status_report(h, ledger, args.threshold, config.platform)

    try:
        anyio.run(lambda: watch(reading, render_status, interval=interval, tty=tty, out=sys.stdout))
    except KeyboardInterrupt:
        pass
    return ExitCode.OK
