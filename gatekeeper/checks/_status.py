"""The queue's status, as the library reads it: its depth against its ceiling over every workspace the platform
reads, with, given a ledger, the reservations and jobs it holds; judged (a verdict and what to do about it, the
platform's repair hints). `gatekeeper status` and the exporter only print what this returns."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .._clock import WALL, Clock
from ..api._config import ApiConfig
from ..api._http import RetryNotice
from ..api._queue import connect, read_headroom
from ..decide._headroom import FINDINGS, SCOPE_CAVEAT, Headroom, repair_lines, verdict
from ..decide._host import run_ended
from ..state._host import machine_id, process_started, this_process
from ..state.ledger._base import LedgerReading, Liveness
from ..state.ledger._open import HOST, choose_ledger, open_ledger, sqlite_file

DEFAULT_THRESHOLD = 80  # occupancy (percent) at which the verdict is near-limit

CEILING_SOURCES = {"admin-api": "the Rate Limits API",
                   "google-organization-route": "the Rate Limits API on Google Cloud's organization route"}


@dataclass(frozen=True)
class Status:
    """One reading, judged: `headroom` (ceiling, depth, live batches), `ledger` (the ledger in use, None for
    `--ledger none`), the `verdict` and its `detail`, and the `repair` lines (printed, never performed)."""

    headroom: Headroom
    ledger: LedgerReading | None
    threshold: int
    verdict: str
    detail: str
    repair: list[str]
    machine: str | None = None  # this machine (`state._host.machine_id`): an orphan of a process here says so

    @property
    def finding(self) -> bool:
        """Whether the verdict is one the CLI exits 1 for (near the limit, full, or the ceiling unknown)."""
        return self.verdict in FINDINGS

    def to_json(self) -> dict[str, Any]:
        """The reading as `gatekeeper status --json` prints it."""
        h, ledger = self.headroom, self.ledger
        source = CEILING_SOURCES.get(h.ceiling_source or "", h.ceiling_source or "nowhere")
        return {
            "verdict": self.verdict, "detail": self.detail, "ceiling": h.ceiling, "ceiling_source": h.ceiling_source,
            "ceiling_error": h.ceiling_error, "depth": h.depth, "remaining": h.remaining,
            "occupancy": None if h.occupancy is None else round(h.occupancy, 4), "threshold": self.threshold,
            "workspaces": h.workspaces, "read": list(h.read), "batches": [b.to_json() for b in h.batches],
            "measured": f"enqueued_batch_requests from {source}; the sum of request_counts.processing over "
                        f"{len(h.batches)} live batch(es) in {h.workspaces} workspace(s)",
            "inferred": SCOPE_CAVEAT, "repair": self.repair,
            "ledger": {"kind": "none", "url": None, "file": None, "reserved": 0, "reservations": [], "jobs": [],
                       "orphans": []} if ledger is None else {
                **(ledger.in_use or {"kind": "shared", "url": None, "file": None}),
                "reserved": sum(r.requests for r in ledger.reservations),
                "reservations": [r.to_json() for r in ledger.reservations], "jobs": ledger.jobs(),
                "orphans": [r.orphan_json(self.machine) for r in ledger.orphans]},
        }


def judge_reading(h: Headroom, ledger: LedgerReading | None, threshold: int, config: ApiConfig | None = None) -> Status:
    """A reading judged against `threshold`, with the platform's repair hints. Pure."""
    state, detail = verdict(h, threshold)
    return Status(h, ledger, threshold, state, detail, repair_lines(state, h, None if config is None else config.platform))


async def status(config: ApiConfig, *, ceiling: int | None = None, threshold: int = DEFAULT_THRESHOLD,
                 ledger: str | None = None, max_rpm: float | None = None, on_retry: RetryNotice | None = None,
                 clock: Clock = WALL, environ: Mapping[str, str] | None = None) -> Status:
    """Read the queue once, and the ledger in use (its live reservations and jobs), and judge it. `ledger` as
    `submit` takes it: None for `GATEKEEPER_LEDGER` in `environ` (None: this process's) or else this host's, "host",
    "none", or a URL; this host's is read where it is, never created by a reading. `ceiling` overrides the one
    read from the platform (an Admin key, an organization route)."""
    chosen = choose_ledger(ledger, os.environ if environ is None else environ, create=False)
    async with connect(config, max_rpm=max_rpm, on_retry=on_retry, clock=clock) as conn:
        h = await read_headroom(conn, ceiling=ceiling)
    if chosen.url is None:
        return judge_reading(h, None, threshold, config)
    if chosen.kind == HOST and not os.path.exists(sqlite_file(chosen.url, config.scope)):
        return judge_reading(h, LedgerReading([], [], chosen.to_json(config.scope)), threshold, config)  # (no job has run here yet)
    book = open_ledger(chosen.url, owner="status", namespace=config.scope, clock=clock.now, liveness=_reader())
    try:
        await book.ping()
        held = await book.reservations()
        live = [r for r in held if r.live]  # (not the names of released batches, nor orphans)
        reading = LedgerReading(live, await book.claims(), chosen.to_json(config.scope), tuple(r for r in held if r.holding))
        return replace(judge_reading(h, reading, threshold, config), machine=machine_id())
    finally:
        await book.close()


def _reader() -> Liveness:
    """A reader's view of this machine's processes (`run.shared._beats.liveness`, unregistered): a submitter of this
    machine whose process has ended is dropped by the reading's step, as by any submitter's."""
    here = this_process()["machine"]
    return Liveness(None, here, lambda record: run_ended(record, here, process_started))
