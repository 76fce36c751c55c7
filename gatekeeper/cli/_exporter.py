"""`gatekeeper exporter`: the queue and the runs as Prometheus metrics, read every interval."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from .._errors import ExitCode, GatekeeperError, UsageError
from .._prices import PriceTable, load_prices
from ..watch._exporter import RunFigures, run_figures, serve
from ..watch._watch import reading_interval
from ._common import api_config, for_cli, json_line, run_until_stopped
from ._status import status_reader


def cmd_exporter(args: argparse.Namespace) -> int:
    config = api_config(args)
    if args.job and not args.journal:
        raise UsageError("exporter --job reads a job in a shared journal: give --journal URL too")
    prices = load_prices(args.prices)
    snap = RunFigures()
    url, server = serve(snap, args.threshold, args.listen, args.port)
    interval = reading_interval(args.interval, config, args.max_rpm)
    read = status_reader(args, config)

    async def readings() -> None:
        # (one event loop for every reading, as `status --watch`: a stop is a cancellation at the next await. The
        # first reading before the line that says it serves: its metrics are there once it is said.)
        await _export_reading(args, read, prices, snap)
        if args.json:  # one line: a long-running command's output is read line by line
            print(json_line({"url": url, "interval": interval}), flush=True)
        else:
            print(f"serving Prometheus metrics on {url}, reading the queue every {interval:g} s; Ctrl-C stops it",
                  flush=True)
        while True:
            await anyio.sleep(interval)
            await _export_reading(args, read, prices, snap)

    try:
        run_until_stopped(readings)
    finally:
        server.shutdown()
    return ExitCode.OK  # (only a stop ends the readings)


async def _export_reading(args: argparse.Namespace, read: Callable[[], Any], prices: PriceTable,
                          snap: RunFigures) -> None:
    """One reading of the queue and the runs into the exporter's figures; a failed one keeps the last, said on stderr."""
    try:
        reading = await read()
        runs = {Path(d).name: run_figures(Path(d), prices) for d in args.state}
        runs.update({job: run_figures(Path.cwd(), prices, journal=args.journal, job=job) for job in args.job})
    except GatekeeperError as exc:
        with snap.lock:
            snap.errors += 1
        print(f"gatekeeper: reading failed, the last values are kept: {for_cli(exc)}", file=sys.stderr, flush=True)
    else:
        with snap.lock:
            snap.headroom, snap.ledger, snap.runs = reading.headroom, reading.ledger, runs
            snap.verdict = reading.verdict
            snap.read_at, snap.readings = time.time(), snap.readings + 1
