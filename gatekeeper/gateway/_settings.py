"""The gateway's settings, each with its documented default, and where it keeps what in its state folder.

    STATE/keys.json                      the keys' hashes, by tenant (`_keys`)
    STATE/gateway.sqlite3                the book of batches (or a schema in the --journal database)
    STATE/ledger.sqlite3                 the jobs' shared admission ledger (or the --journal database)
    STATE/incoming/                      creates being received (removed when refused or cut off)
    STATE/batches/ID/input.jsonl         a batch's requests, one line each: its job's input
    STATE/batches/ID/job/                its job's state folder (journal.sqlite3 unless --journal) and results.jsonl
    STATE/batches/ID/unsent.jsonl        result lines for requests its job never sent (a cancel): the rest of its results

With several replicas on PostgreSQL, STATE is a volume they all mount (ReadWriteMany): a create's requests are
written there before the create is answered, so whichever replica runs the job (or takes it over) reads them, and
any replica streams the results.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GatewaySettings:
    """How `gatekeeper serve` runs. Every field has a documented default."""

    state_dir: Path
    host: str = "127.0.0.1"  # loopback; 0.0.0.0 in a container
    port: int = 8080
    journal: str | None = None  # None: SQLite in state_dir (one replica); postgresql://...: several replicas
    ledger: str | None = None  # None: sqlite in state_dir, or the --journal database; any --ledger URL
    public_url: str | None = None  # the base of results_url; None: the URL the client called
    dedup_window: float = 3600.0  # seconds a tenant's same request set returns the same batch (0: only by key)
    interval: float = 30.0  # seconds between a job's readings of the queue, at most (--interval)
    # seconds an upstream create whose outcome is unknown (a timeout, a reset, a 5xx without a typed code) may take to
    # show in the listing: until then its job waits, its batch in_progress (docs/gateway.md)
    reconcile_grace: float = 180.0
    lease_ttl: float = 60.0  # seconds a replica's claim on a job (and its journal's lease) outlives its heartbeat
    ceiling: int | None = None  # the organization's enqueued_batch_requests; None: read with the admin key
    margin: int = 0  # requests of queue headroom left to others
    max_attempts: int = 3  # attempts per request, the first included
    max_rpm: float | None = None  # calls a minute to the batch endpoints by each job; None: the platform's default
    max_jobs: int = 16  # jobs this replica runs at once (more wait their turn; each holds a few database connections)
    scan: float = 5.0  # seconds between looks for jobs nobody runs
    ledger_ttl: float = 900.0  # seconds a dead replica's reservations outlive its heartbeat

    @property
    def incoming(self) -> Path:
        return self.state_dir / "incoming"

    def batch_dir(self, batch_id: str) -> Path:
        return self.state_dir / "batches" / batch_id

    def input_path(self, batch_id: str) -> Path:
        return self.batch_dir(batch_id) / "input.jsonl"

    def job_dir(self, batch_id: str) -> Path:
        return self.batch_dir(batch_id) / "job"

    def results_path(self, batch_id: str) -> Path:
        return self.job_dir(batch_id) / "results.jsonl"

    def unsent_path(self, batch_id: str) -> Path:
        return self.batch_dir(batch_id) / "unsent.jsonl"

    def ledger_url(self) -> str:
        """The jobs' shared ledger: as given, else the journal's database, else SQLite in the state folder (every job
        of this gateway admits against the one ceiling, with its tenant's priority and share)."""
        if self.ledger:
            return self.ledger
        if self.journal:
            return self.journal
        return f"sqlite://{(self.state_dir / 'ledger.sqlite3').resolve()}"
