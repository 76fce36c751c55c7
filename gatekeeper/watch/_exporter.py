"""`gatekeeper exporter`: Prometheus metrics of the queue and of runs, read on their own schedule.

The API is read every `interval` seconds by the exporter's loop, never once per
scrape: a scrape renders the last reading (a custom collector over a snapshot).
A failed reading keeps the last values and counts an error; the age of the last
successful reading says how stale they are. Names follow Prometheus conventions
(a `gatekeeper_` prefix, base units in the name, `_total` on counters only);
labels are small fixed sets (a workspace's position, a verdict, a result type, a
run's state-directory name), never an id or a key. `prometheus_client` is the
optional extra `gatekeeper-batches[exporter]`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import UsageError
from .._prices import PriceTable
from ..decide._headroom import Headroom, verdict
from ..run.shared._summary import summarize
from ..state._journal import BatchState, open_job
from ..state.ledger._base import LedgerReading

VERDICTS = ("queue-clear", "queue-near-limit", "queue-exhausted", "queue-limit-unknown")


@dataclass
class RunFigures:
    """The last successful reading, and the counters; guarded by `lock` (the scrape runs in another thread)."""

    headroom: Headroom | None = None
    verdict: str | None = None  # the library's `status()` verdict of that reading (None: judged here, at `threshold`)
    ledger: LedgerReading | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    read_at: float | None = None
    readings: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_figures(state_dir: Path, prices: PriceTable, *, journal: str | None = None, job: str | None = None) -> dict[str, Any]:
    """What the exporter shows of one run, from its journal (read-only): a state directory's, or job `job`'s in the
    shared `journal`."""
    j = open_job(state_dir, journal=journal, job=job)
    try:
        with j.snapshot():
            s = summarize(j, "", prices=prices)
            live = sum(b.requests for b in j.batches(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED))
            c = s.caching or {}
            return {"requests": s.requests, "admitted": j.outcomes.admitted_requests(), "in_flight": live, "cost_usd": s.cost_usd,
                    "results": {"succeeded": s.succeeded, "errored": s.errored, "expired": s.expired, "canceled": s.canceled},
                    "stop_reasons": s.stop_reasons,
                    "lanes": {k: {"requests": v["requests"], "cost_usd": v["cost_usd"]} for k, v in s.lanes.items()},
                    "possible_double_charges": (s.lanes.get("realtime") or {}).get("possible_double_charges", 0),
                    "cache_tokens": {"read": c.get("read_tokens", 0), "write_5m": c.get("write_5m_tokens", 0),
                                     "write_1h": c.get("write_1h_tokens", 0)},
                    "cache_read_share": c.get("read_share_of_ideal"), "cache_saving_usd": c.get("saving_usd")}
    finally:
        j.close()


class MetricsCollector:
    """Renders the snapshot as metric families at scrape time."""

    def __init__(self, snap: RunFigures, threshold: int, clock: Callable[[], float] = time.time) -> None:
        self.snap = snap
        self.threshold = threshold
        self.clock = clock

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self.snap.lock:
            h, ledger, runs = self.snap.headroom, self.snap.ledger, dict(self.snap.runs)
            state = self.snap.verdict
            read_at, readings, errors = self.snap.read_at, self.snap.readings, self.snap.errors
        yield CounterMetricFamily("gatekeeper_readings", "Successful readings of the queue.", value=readings)
        yield CounterMetricFamily("gatekeeper_reading_errors", "Readings of the queue that failed (the last values are kept).",
                                  value=errors)
        if read_at is not None:
            yield GaugeMetricFamily("gatekeeper_last_reading_age_seconds", "Seconds since the last successful reading.",
                                    value=max(0.0, self.clock() - read_at))
        if h is not None:
            yield from _queue_families(h, state or verdict(h, self.threshold)[0], GaugeMetricFamily)
        if ledger is not None:
            yield GaugeMetricFamily("gatekeeper_ledger_reserved_requests", "Requests reserved in the shared admission ledger.",
                                    value=sum(r.requests for r in ledger.reservations))
            yield from _job_families(ledger.jobs(), GaugeMetricFamily)
        yield from _run_families(runs, GaugeMetricFamily)


def _job_families(jobs: list[dict[str, Any]], gauge: Any) -> Iterator[Any]:
    """Each job on the shared ledger, as `status` lists them: labels job and priority."""
    spec = [("gatekeeper_ledger_job_queued_requests", "Requests the job has reserved in the queue.", "queued"),
            ("gatekeeper_ledger_job_share", "The job's share among the jobs of its priority.", "share"),
            ("gatekeeper_ledger_job_waiting_seconds", "Seconds the job has waited behind higher priorities' turns.", "waiting_s"),
            ("gatekeeper_ledger_job_admitted_requests", "Requests the job has admitted since it claimed.", "admitted")]
    for name, text, key in spec:
        fam = gauge(name, text, labels=["job", "priority"])
        for x in jobs:
            fam.add_metric([x["job"], x["priority"]], float(x[key]))
        yield fam


def _queue_families(h: Headroom, state: str, gauge: Any) -> Iterator[Any]:
    if h.ceiling is not None:
        yield gauge("gatekeeper_queue_ceiling_requests", "The organization's enqueued_batch_requests ceiling.", value=h.ceiling)
    yield gauge("gatekeeper_queue_depth_requests", "Requests in the batch queue over every workspace key given.", value=h.depth)
    per = gauge("gatekeeper_queue_workspace_depth_requests", "Requests in the batch queue, per workspace key (by position).",
                labels=["workspace"])
    for ws in sorted({b.workspace for b in h.batches} | {f"ws{i + 1}" for i in range(h.workspaces)}):
        per.add_metric([ws], sum(b.processing for b in h.batches if b.workspace == ws))
    yield per
    if h.occupancy is not None:
        yield gauge("gatekeeper_queue_occupancy_ratio", "Depth over ceiling (0 to 1, above 1 when over).", value=h.occupancy)
    yield gauge("gatekeeper_queue_live_batches", "Batches in progress or canceling.", value=len(h.batches))
    v = gauge("gatekeeper_queue_verdict", "The queue's verdict: 1 for the current one, 0 for the others.", labels=["verdict"])
    for name in VERDICTS:
        v.add_metric([name], 1.0 if name == state else 0.0)
    yield v


def _run_families(runs: dict[str, dict[str, Any]], gauge: Any) -> Iterator[Any]:
    if not runs:
        return
    spec = [("gatekeeper_run_requests", "Valid requests of the run.", "requests"),
            ("gatekeeper_run_admitted_requests", "Requests of the run whose first batch was created.", "admitted"),
            ("gatekeeper_run_in_flight_requests", "Requests of the run in batches not yet collected.", "in_flight")]
    for name, text, key in spec:
        fam = gauge(name, text, labels=["run"])
        for run, fig in runs.items():
            fam.add_metric([run], fig[key])
        yield fam
    final = gauge("gatekeeper_run_final_requests", "Requests of the run with a final result, by result type.", labels=["run", "type"])
    cost = gauge("gatekeeper_run_cost_usd", "The run's cost so far at batch prices (absent when a model has no price).",
                 labels=["run"])
    stops = gauge("gatekeeper_run_succeeded_requests", "Requests of the run that succeeded, by the answer's stop reason "
                  "(max_tokens: truncated; refusal: refused, billed).", labels=["run", "stop_reason"])
    for run, fig in runs.items():
        for kind, n in fig["results"].items():
            final.add_metric([run, kind], n)
        for reason, n in fig.get("stop_reasons", {}).items():
            stops.add_metric([run, reason], n)
        if fig["cost_usd"] is not None:
            cost.add_metric([run], fig["cost_usd"])
    yield final
    yield stops
    yield cost
    yield from _lane_families(runs, gauge)
    yield from _cache_families(runs, gauge)


def _lane_families(runs: dict[str, dict[str, Any]], gauge: Any) -> Iterator[Any]:
    """What each lane answered and cost (the real-time lane only with a deadline), and the real-time answers lost
    and sent again (possibly charged twice)."""
    answered = gauge("gatekeeper_run_lane_requests", "Final results of the run by the lane that gave them (batch, realtime).",
                     labels=["run", "lane"])
    cost = gauge("gatekeeper_run_lane_cost_usd", "The run's cost so far by lane: batch at batch prices, realtime at "
                 "standard prices.", labels=["run", "lane"])
    doubles = gauge("gatekeeper_run_possible_double_charges", "Real-time calls whose answer was lost and that were sent "
                    "again: each may have been charged twice.", labels=["run"])
    for run, fig in runs.items():
        for lane, v in fig.get("lanes", {}).items():
            answered.add_metric([run, lane], v["requests"])
            if v["cost_usd"] is not None:
                cost.add_metric([run, lane], v["cost_usd"])
        doubles.add_metric([run], fig.get("possible_double_charges", 0))
    yield answered
    yield cost
    yield doubles


def _cache_families(runs: dict[str, dict[str, Any]], gauge: Any) -> Iterator[Any]:
    tokens = gauge("gatekeeper_run_cache_tokens", "Prompt-cache tokens billed to the run, by kind (read, write_5m, "
                   "write_1h).", labels=["run", "kind"])
    share = gauge("gatekeeper_run_cache_read_share", "Cache reads as a share of those an ideal run gets (one write "
                  "a shared prefix); absent when nothing could be read.", labels=["run"])
    saving = gauge("gatekeeper_run_cache_saving_usd", "What caching saved the run against no caching, at batch "
                   "prices (negative: it cost more).", labels=["run"])
    for run, fig in runs.items():
        for kind, n in fig["cache_tokens"].items():
            tokens.add_metric([run, kind], n)
        if fig["cache_read_share"] is not None:
            share.add_metric([run], fig["cache_read_share"])
        if fig["cache_saving_usd"] is not None:
            saving.add_metric([run], fig["cache_saving_usd"])
    yield from (tokens, share, saving)


def serve(snap: RunFigures, threshold: int, host: str, port: int) -> tuple[str, Any]:
    """Start serving /metrics in a daemon thread; (its URL, the server)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise UsageError("the exporter needs prometheus_client: pip install 'gatekeeper-batches[exporter]'") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(snap, threshold))
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except (OSError, OverflowError) as exc:
        raise UsageError(f"the exporter cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}",
                         setting="port") from exc
    return f"http://{host}:{server.server_port}/metrics", server
