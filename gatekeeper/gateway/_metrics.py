"""`/metrics` for Prometheus: the gateway's requests and creates, the bytes it took and streamed, its batches by
status and the jobs this replica runs. Names follow the conventions (the `gatekeeper_gateway_` prefix, base units,
`_total` on counters only); labels are small fixed sets (a route's template, a status code, an outcome), never an
id, a tenant or a key."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """One registry a gateway (several in one process, as in tests, never mix)."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # (no `_created` series: `..._creates_created{outcome="created"}` misleads a reader)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gatekeeper_gateway_http_requests", "HTTP requests served, by route and status.",
                                ["route", "status"], registry=r)
        self.seconds = Histogram("gatekeeper_gateway_http_request_duration_seconds",
                                 "Seconds from a request's arrival to its answer's headers (a results stream's body "
                                 "not included).", ["route"], registry=r,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.creates = Counter("gatekeeper_gateway_creates", "Creates answered: created (a new batch), repeated (the "
                               "same batch again: an Idempotency-Key or the same requests), refused.", ["outcome"],
                               registry=r)
        # (a repeated create's body arrived and was judged as a new one's was: it counts, apart, so that what came in
        # and what made batches are both read off the one series)
        self.received = Counter("gatekeeper_gateway_received_requests", "Batch requests in creates answered with a "
                                "batch, by outcome: created (a new batch) or repeated (the same batch again).",
                                ["outcome"], registry=r)
        self.received_bytes = Counter("gatekeeper_gateway_received_bytes", "Bytes of the requests of creates answered "
                                      "with a batch, as spooled (one JSON line each), by outcome: created or repeated.",
                                      ["outcome"], registry=r)
        self.results_bytes = Counter("gatekeeper_gateway_results_bytes", "Bytes of result lines streamed to clients.",
                                     registry=r)
        self.batches = Gauge("gatekeeper_gateway_batches", "Batches in the book by processing status (every replica's).",
                             ["status"], registry=r)
        self.jobs = Gauge("gatekeeper_gateway_jobs_running", "Jobs this replica runs now.", registry=r)
        self.failures = Gauge("gatekeeper_gateway_job_failures", "Job runs of this replica that stopped on an error "
                              "since it started (each tried again later).", registry=r)

    def page(self, statuses: dict[str, int], jobs: int, failures: int) -> bytes:
        """The page, with the book's and the runner's figures read now."""
        for status in ("in_progress", "canceling", "ended"):
            self.batches.labels(status).set(statuses.get(status, 0))
        self.jobs.set(jobs)
        self.failures.set(failures)
        return bytes(generate_latest(self.registry))
