"""The durable journal of a submit run: SQLite (WAL) in the state directory, or a schema in PostgreSQL.

Every state change is one transaction, so a crash at any instant leaves the
journal at a consistent point; the output file's committed length is recorded
in the same transaction as the results rows, so a resume truncates the output
back to it and nothing is written twice.

In PostgreSQL (`Journal.open_shared`) a job is found by its name, not by a folder:
`gatekeeper.jobs` maps each name to the schema that holds its tables (the same
tables and migrations as SQLite), and holds its lease: the host running it and when
that host was last seen. Every write transaction first checks, under a key-share lock on
the job's row, that this run still holds the lease, so a run that lost it (stalled past
its TTL while another host took over) cannot record another intent.

Batch states (`BatchState`) move:

    planned ──intent recorded──► intent ──create answered──► created ──seen ended──► ended ──results committed──► collected
       ▲                            │
       └── definite refusal ────────┘   (an intent with an unknown outcome is reconciled first)
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from .._errors import JournalError, UsageError, os_error
from ._adoptions import Adoptions
from ._db import Db, PgDb, SqliteDb, pg_ddl, require_postgres, safe_url
from ._groups import Groups
from ._journal_base import JournalBase
from ._lease import Lease
from ._outcomes import Outcomes
from ._realtime import CUT_MIGRATION, LaneRecords
from ._realtime import MIGRATION as REALTIME_MIGRATION
from ._records import RESULTS_SQL_COLUMNS, BatchRow, BatchState, JobPlan, PendingRow, Totals

__all__ = ["BatchRow", "BatchState", "JobPlan", "Journal", "PendingRow", "Settlement", "Totals", "open_job"]


MIGRATIONS: list[tuple[str, str]] = [
    ("0001_initial", """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE batches (
            idx INTEGER PRIMARY KEY,
            kind TEXT NOT NULL,              -- 'plan' (a range of input lines) or 'retry' (listed in members)
            requests INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            first_line INTEGER NOT NULL,
            last_line INTEGER NOT NULL,
            start_offset INTEGER NOT NULL,
            end_offset INTEGER NOT NULL,
            first_custom_id TEXT NOT NULL,
            last_custom_id TEXT NOT NULL,
            state TEXT NOT NULL,
            batch_id TEXT UNIQUE,
            intent_at REAL,                  -- wall clock when the create was about to be sent
            created_at TEXT,
            ended_at TEXT,
            counts TEXT
        );
        CREATE TABLE rejections (line INTEGER PRIMARY KEY, custom_id TEXT, reason TEXT NOT NULL);
        CREATE TABLE members (              -- the requests of retry batches
            batch INTEGER NOT NULL, line INTEGER NOT NULL, "offset" INTEGER NOT NULL, length INTEGER NOT NULL,
            custom_id TEXT NOT NULL, attempt INTEGER NOT NULL, PRIMARY KEY (batch, line)
        );
        CREATE TABLE pending (              -- requests waiting for another attempt
            line INTEGER PRIMARY KEY, "offset" INTEGER NOT NULL, length INTEGER NOT NULL,
            custom_id TEXT NOT NULL, attempt INTEGER NOT NULL
        );
        CREATE TABLE results (              -- the final result of each valid request
            line INTEGER PRIMARY KEY, custom_id TEXT NOT NULL, type TEXT NOT NULL, error_type TEXT,
            attempts INTEGER NOT NULL, out_offset INTEGER NOT NULL, out_len INTEGER NOT NULL, model TEXT,
            input_tokens INTEGER, output_tokens INTEGER, cache_creation_tokens INTEGER, cache_read_tokens INTEGER
        );
        CREATE TABLE attempts (             -- earlier, non-final attempts, kept for the record
            line INTEGER NOT NULL, attempt INTEGER NOT NULL, batch INTEGER NOT NULL, type TEXT NOT NULL,
            error_type TEXT, raw BLOB NOT NULL, PRIMARY KEY (line, attempt)
        );
        CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, batch INTEGER,
            event TEXT NOT NULL, detail TEXT);
        CREATE INDEX batches_state ON batches (state);
    """),
    ("0002_body_complete", """
        -- set just before a create's last bytes go out: without it, the server cannot hold the batch
        ALTER TABLE batches ADD COLUMN body_complete INTEGER NOT NULL DEFAULT 0
    """),
    ("0003_worst_usd", """
        -- the most a batch can cost (the budget's worst case), set with its intent
        ALTER TABLE batches ADD COLUMN worst_usd REAL
    """),
    ("0004_timeline", """
        -- queue readings over the run, thinned to at most TIMELINE_ROWS (every other old one dropped when full)
        CREATE TABLE timeline (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, depth INTEGER NOT NULL,
            ceiling INTEGER, ours INTEGER NOT NULL)
    """),
    ("0005_result_batch", """
        -- the batch whose download gave each final result: the output is rebuilt batch by batch from the API
        ALTER TABLE results ADD COLUMN batch INTEGER;
        CREATE INDEX results_batch ON results (batch, out_offset)
    """),
    ("0006_cache_write_1h", """
        -- the part of cache_creation_tokens written with a 1-hour life (priced at 2x input, the 5-minute at 1.25x)
        ALTER TABLE results ADD COLUMN cache_write_1h_tokens INTEGER
    """),
    ("0007_priming", """
        -- priming: 'primer' and 'rest' batches list their members and belong to a round, and the lines they hold are
        -- claimed, and left out of the input-range ('plan') batches they fall in
        ALTER TABLE batches ADD COLUMN cache_round INTEGER;
        CREATE TABLE claimed (line INTEGER PRIMARY KEY)
    """),
    ("0008_stop_reason", """
        -- why a succeeded answer stopped (end_turn, max_tokens, refusal, ...): answers that stopped early are billed
        -- successes a user must be able to find
        ALTER TABLE results ADD COLUMN stop_reason TEXT
    """),
    REALTIME_MIGRATION,
    ("0010_unproven", """
        -- answers from a batch adopted after a lost create that could not be proven ours (another job may use the
        -- same custom_ids): kept apart, never joined to our requests (results --only unproven lists them)
        CREATE TABLE unproven (line INTEGER PRIMARY KEY, custom_id TEXT NOT NULL, batch_id TEXT NOT NULL,
            raw BLOB NOT NULL)
    """),
    ("0011_unproven_each_candidate", """
        -- every candidate the evidence cannot tell apart is collected and kept apart, not only the one adopted:
        -- one answer a request and candidate batch
        CREATE TABLE unproven_each (line INTEGER NOT NULL, custom_id TEXT NOT NULL, batch_id TEXT NOT NULL,
            raw BLOB NOT NULL, PRIMARY KEY (line, batch_id));
        INSERT INTO unproven_each SELECT line, custom_id, batch_id, raw FROM unproven;
        DROP TABLE unproven;
        ALTER TABLE unproven_each RENAME TO unproven
    """),
    CUT_MIGRATION,
]
# The registry of named jobs in PostgreSQL: one row a job, its schema and its lease (on the server's clock).
REGISTRY = """
    CREATE SCHEMA IF NOT EXISTS gatekeeper;
    CREATE TABLE IF NOT EXISTS gatekeeper.jobs (name TEXT PRIMARY KEY, schema_name TEXT NOT NULL UNIQUE,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(), holder TEXT, info TEXT, heartbeat_at TIMESTAMPTZ,
        ttl DOUBLE PRECISION)
"""
LOCK_MIGRATE = 7_046_913_201  # the advisory lock that serializes schema changes between submitters


def private_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise JournalError(os_error(exc, f"cannot use state directory {path}") + "; choose a folder you can write",
                           setting="state_dir") from exc


def open_job(state_dir: str | os.PathLike[str], *, journal: str | None = None, job: str | None = None,
             readonly: bool = True) -> Journal:
    """A job's journal for the commands that read it (or, `readonly=False`, cancel it; never taking its lease):
    the SQLite journal in `state_dir`, or the job named `job` in the shared `journal`."""
    if journal:
        if not job:
            raise UsageError("a job in a shared journal is found by its name", setting="job")
        # (a named job is read, or canceled, from any folder: the folder is not its state, and is left as it is; a
        # `cancel --job` made the working folder 0700)
        return Journal.open_shared(journal, job, state_dir, readonly=readonly, local=False)
    if job:
        raise UsageError("a job name needs a postgresql:// journal; a local job is named by its state directory", setting="job")
    if readonly:
        return Journal.open_readonly(state_dir)
    if not (Path(state_dir) / Journal.FILE).exists():
        raise UsageError(f"no gatekeeper journal in {state_dir}", setting="state_dir")
    return Journal.open(state_dir)


def job_schema(job: str) -> str:
    """The PostgreSQL schema of a named job: a fixed-width digest, so any name is safe as an identifier."""
    return "gk_" + hashlib.sha256(job.encode()).hexdigest()[:24]


def _pg_locked(db: Db, step: Callable[[], None]) -> None:
    """Schema changes one submitter at a time (two first runs of a job may start together)."""
    db.execute("SELECT pg_advisory_lock(?)", (LOCK_MIGRATE,))
    try:
        step()
    finally:
        db.execute("SELECT pg_advisory_unlock(?)", (LOCK_MIGRATE,))


def _pg_register(db: Db, job: str, schema: str) -> None:
    for statement in REGISTRY.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT INTO gatekeeper.jobs (name, schema_name) VALUES (?, ?) ON CONFLICT (name) DO NOTHING", (job, schema))
    db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


class Journal(JournalBase):
    """One job's journal: the only place that speaks SQL. Open with `Journal.open(state_dir)` (SQLite) or
    `Journal.open_shared(url, job, state_dir)` (PostgreSQL).

    It moves batches through their states itself, and hands the rest to collaborators that each own one concern:
    `lease` (a shared job's lease), `adoptions` (batches found by listing, and whose they proved to be), `groups`
    (batches that list their requests as groups: retries, priming), `lane` (the real-time lane's requests and calls) and `outcomes`
    (readings, totals, spans of the output).

    The database's errors (a full disk, a damaged file, a lock held too long, a server gone)
    become `JournalError` in `_db`, naming the file or the URL; the transaction that failed is rolled back.
    """

    FILE = "journal.sqlite3"

    def __init__(self, db: Db, state_dir: Path, *, clock: Callable[[], float] = time.time, job: str | None = None) -> None:
        super().__init__(db, state_dir, clock=clock, job=job)
        self.lease = Lease(self)
        self.adoptions = Adoptions(self)
        self.groups = Groups(self)
        self.lane = LaneRecords(self)
        self.outcomes = Outcomes(self)

    @classmethod
    def open(cls, state_dir: str | os.PathLike[str], *, clock: Callable[[], float] = time.time) -> Journal:
        """The SQLite journal in `state_dir`, created (and migrated) on first use."""
        return _open_local(cls, Path(state_dir), clock)

    @classmethod
    def open_shared(cls, url: str, job: str, state_dir: str | os.PathLike[str], *, clock: Callable[[], float] = time.time,
                    readonly: bool = False, ride_out: float = 60.0, local: bool = True) -> Journal:
        """Job `job`'s journal in PostgreSQL, created with its schema on first use (unless `readonly`); `local`:
        `state_dir` is the run's own folder, made private (not for a command that names the job from any folder:
        that is the user's working folder, never to be touched)."""
        return _open_shared(cls, url, job, Path(state_dir), clock, readonly=readonly, ride_out=ride_out,
                            private=local and not readonly)

    @classmethod
    def recorded(cls, url: str, job: str) -> bool:
        """Whether the shared journal at `url` has a job `job` recorded (looked at read-only; nothing created)."""
        try:
            journal = cls.open_shared(url, job, ".", readonly=True)
        except UsageError:
            return False
        try:
            return journal.initialized
        finally:
            journal.close()

    @classmethod
    def open_readonly(cls, state_dir: str | os.PathLike[str]) -> Journal:
        """A read-only view, for reading a job that may be running: it never blocks or disturbs the writer."""
        path = Path(state_dir) / cls.FILE
        if not path.exists():
            raise UsageError(f"no gatekeeper journal in {state_dir}", setting="state_dir")
        return cls(SqliteDb.open(f"file:{path}?mode=ro", f"journal {path}", JournalError, uri=True, path=str(path)),
                   Path(state_dir))

    def migrate(self) -> None:
        with self.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
            done = {r[0] for r in db.execute("SELECT name FROM schema_migrations")}
            known = {name for name, _ in MIGRATIONS}
            if done - known:
                raise JournalError(f"the {self.where} was written by a newer gatekeeper ({sorted(done - known)[-1]})")
            for name, sql in MIGRATIONS:
                if name not in done:
                    for statement in sql.split(";"):
                        if statement.strip():
                            db.execute(pg_ddl(statement) if db.dialect == "postgres" else statement)
                    db.execute("INSERT INTO schema_migrations VALUES (?, ?)", (name, self._clock()))

    # -- state changes, one transaction each ----------------------------------

    def start_job(self, plan: JobPlan, size: Callable[[list[PendingRow]], int] | None = None) -> None:
        """Record a new job: the input's identity, settings, the plan and its rejections, all or nothing (`size`:
        the body size of a member-listed batch's requests)."""
        with self.transaction() as db:
            for key, value in (("input", plan.input), ("settings", plan.settings), ("report", plan.report),
                               ("output_committed", 0), ("output", plan.output)):
                self.put_meta(db, key, value)
            db.executemany(
                "INSERT INTO batches (idx, kind, requests, bytes, first_line, last_line, start_offset, end_offset, "
                "first_custom_id, last_custom_id, state) VALUES (?, 'plan', ?, ?, ?, ?, ?, ?, ?, ?, 'planned')",
                plan.batches)
            db.executemany("INSERT INTO rejections VALUES (?, ?, ?)", plan.rejections)
            db.executemany("INSERT INTO claimed VALUES (?)", [(r.line,) for _, _, rows in plan.groups for r in rows])
            if plan.groups:
                assert size is not None, "member-listed batches need their body size"
                self.groups.insert(db, len(plan.batches), plan.groups, size)
            self.note(db, "planned", requests=plan.report.get("requests"), batches=len(plan.batches) + len(plan.groups))

    def mark_intent(self, idx: int, at: float, worst_usd: float | None = None) -> None:
        """Recorded before a create's first byte is sent: from here on its outcome is unknown until settled."""
        with self.transaction() as db:
            self.set_state(db, idx, BatchState.INTENT, intent_at=at, body_complete=0, worst_usd=worst_usd)

    def in_flight_worst(self) -> float:
        """The worst case of every batch admitted and not yet collected (USD)."""
        return float(self.scalar("SELECT COALESCE(SUM(worst_usd), 0) FROM batches WHERE state IN ('intent', 'created', 'ended')")) \
            + self.lane.worst()

    def held_back(self) -> int:
        """Requests not sent: in batches not yet created, and waiting for another attempt."""
        return int(self.scalar("SELECT COALESCE(SUM(requests), 0) FROM batches WHERE state = 'planned'")) + self.groups.pending_count()

    def mark_body_complete(self, idx: int, at: float | None = None) -> None:
        """Recorded before a create's last bytes go out; an intent without it cannot have created a batch. `at`
        (now) becomes the intent's time: the batch cannot exist before its body was whole, so reconciliation's grace
        counts from here, not from before a long upload (or a slow start) that could outlast it."""
        with self.transaction() as db:
            if at is None:
                db.execute("UPDATE batches SET body_complete = 1 WHERE idx = ?", (idx,))
            else:
                db.execute("UPDATE batches SET body_complete = 1, intent_at = ? WHERE idx = ?", (at, idx))

    def back_to_planned(self, idx: int, event: str | None = None, **detail: Any) -> None:
        """A create that definitely did not happen (refused, deferred, reconciled absent)."""
        with self.transaction() as db:
            self.set_state(db, idx, BatchState.PLANNED, intent_at=None, body_complete=0)
            if event:
                self.note(db, event, idx, **detail)

    def record_refusal(self, idx: int, depth: int, requests: int) -> None:
        self.back_to_planned(idx, "queue_full", depth=depth, requests=requests)

    def mark_created(self, idx: int, batch_id: str, created_at: str | None, adopted: str | None = None,
                     apart: tuple[str, ...] = ()) -> None:
        """The batch exists; `adopted` (its proof, see `adoption`) when it was found by listing, recorded in the same
        transaction (a kill between the two would leave a listing adoption unchecked), with the other candidates
        the evidence could not tell from it (`apart`: collected with it, their answers kept apart)."""
        with self.transaction() as db:
            self.set_state(db, idx, BatchState.CREATED, batch_id=batch_id, created_at=created_at)
            if adopted:
                self.adoptions.record(db, idx, batch_id, adopted)
            if apart:
                self.adoptions.keep_apart(db, idx, apart)

    def mark_ended(self, idx: int, ended_at: str | None, counts: Any) -> None:
        with self.transaction() as db:
            self.set_state(db, idx, BatchState.ENDED, ended_at=ended_at, counts=orjson.dumps(counts).decode())

    @contextmanager
    def settling(self, idx: int) -> Iterator[Settlement]:
        """One batch's results, committed together with the output's new length and the batch's COLLECTED state.

        Rows are written as they come inside the one open transaction, so memory does not grow with the batch.
        """
        with self.transaction() as db:
            s = Settlement(db, idx)
            yield s
            s.flush()
            if s.adopted is not None:  # (a listing adoption's proof, committed with its results)
                self.adoptions.record(db, idx, *s.adopted)
            self.put_meta(db, "output_committed", s.committed)
            self.set_state(db, idx, BatchState.COLLECTED)
            s.before_commit()



WAL_PAGES = 100  # pages (4 KB) the journal's write-ahead log takes before it is checkpointed into the journal
WAL_KEEP = 1 << 20  # bytes the log keeps on disk once checkpointed (a batch's settlement may grow it past that)


def _open_local(cls: type[Journal], path: Path, clock: Callable[[], float]) -> Journal:
    private_dir(path)
    db_path = path / cls.FILE
    try:
        if not db_path.exists():
            os.close(os.open(db_path, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as exc:
        raise JournalError(os_error(exc, f"cannot create the journal {db_path}")) from exc
    db = SqliteDb.open(str(db_path), f"journal {db_path}", JournalError)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a committed state change survives power loss too
        # (the log checkpointed every WAL_PAGES, and cut back to WAL_KEEP after a large transaction: at SQLite's
        # 1,000 pages, 100 real-time answers grew it to 3.3 MB for a journal of 184 KB, and on a small disk the
        # job could not finish)
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
        db.execute(f"PRAGMA journal_size_limit={WAL_KEEP}")
    except JournalError as exc:
        raise JournalError(f"{db_path} is not a gatekeeper journal: {exc}") from exc
    journal = cls(db, path, clock=clock)
    journal.migrate()
    return journal


def _open_shared(cls: type[Journal], url: str, job: str, state_dir: Path, clock: Callable[[], float], *, readonly: bool,
                 ride_out: float, private: bool) -> Journal:
    require_postgres(url)
    where = f"journal {safe_url(url)} (job {job})"
    if private:
        private_dir(state_dir)
    db = PgDb(url, where, JournalError, readonly=readonly, ride_out=ride_out)
    schema = job_schema(job)
    if readonly:
        row = db.execute("SELECT schema_name FROM gatekeeper.jobs WHERE name = ?", (job,)).fetchone() \
            if db.execute("SELECT to_regclass('gatekeeper.jobs')").fetchone()[0] else None
        if row is None:
            db.close()
            raise UsageError(f"no job named {job!r} in {safe_url(url)}", setting="job")
    else:
        _pg_locked(db, lambda: _pg_register(db, job, schema))
    db.use_schema(schema)
    journal = cls(db, state_dir, clock=clock, job=job)
    if not readonly:
        _pg_locked(db, journal.migrate)
    return journal


class Settlement:
    """The rows of one batch's settlement, buffered and flushed inside the journal's open transaction."""

    FLUSH_ROWS = 5000

    def __init__(self, db: Db, batch: int) -> None:
        self._db = db
        self._batch = batch
        self._finals: list[tuple[Any, ...]] = []
        self._retries: list[tuple[Any, ...]] = []
        self._history: list[tuple[Any, ...]] = []
        self.committed = 0  # the output's length once this settlement is committed (set by the caller)
        self.finals = self.retries = 0
        self.before_commit: Callable[[], None] = lambda: None  # a crash-test checkpoint
        self.adopted: tuple[str, str] | None = None  # (batch id, proof) of a listing adoption its results weighed
        self._kept: list[tuple[Any, ...]] = []
        self._lane: list[tuple[int]] = []  # lines a cut create's batch answered first: the lane sends them no more
        self._uncounted: list[tuple[int]] = []  # lines its batch did not process: not charged there after all

    def final(self, line: int, cid: str, kind: str, error_type: str | None, attempt: int, offset: int, length: int,
              usage: tuple[str | None, int, int, int, int, int], stop_reason: str | None = None) -> None:
        model, given, output, created, read, hour = usage
        finals = self._finals
        finals.append((line, cid, kind, error_type, attempt, offset, length, model, given, output, created, read,
                       self._batch, hour, stop_reason))
        if len(finals) + len(self._retries) + len(self._kept) >= self.FLUSH_ROWS:  # (`_maybe_flush`, inline: a call a line)
            self.flush()

    def retry(self, line: int, offset: int, length: int, cid: str, attempt: int, batch: int, kind: str,
              error_type: str | None, raw: bytes) -> None:
        """The request goes again as attempt `attempt + 1`; this attempt's line is kept for the record."""
        self._retries.append((line, offset, length, cid, attempt + 1))
        self._history.append((line, attempt, batch, kind, error_type, raw))
        self._maybe_flush()

    def aside(self, line: int, attempt: int, kind: str, error_type: str | None, raw: bytes, *, charged: bool) -> None:
        """A cut create's batch's answer not joined (the real-time lane answered first, or will: it did not process
        the request): kept for the record; `charged` False, the charge its row counted for the batch is taken off."""
        self._history.append((line, attempt, self._batch, kind, error_type, raw))
        if not charged:
            self._uncounted.append((line,))
        self._maybe_flush()

    def joined_first(self, line: int) -> None:
        """A cut create's batch answered this request before the real-time lane: the lane's row is answered."""
        self._lane.append((line,))

    def keep_apart(self, line: int, cid: str, batch_id: str, raw: bytes) -> None:
        """An answer from a batch that could not be proven ours: kept for the record, never joined."""
        self._kept.append((line, cid, batch_id, raw))
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if len(self._finals) + len(self._retries) + len(self._kept) >= self.FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        self._db.load(f"INSERT INTO results ({RESULTS_SQL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      f"COPY results ({RESULTS_SQL_COLUMNS}) FROM STDIN", self._finals)
        self._db.executemany("INSERT INTO pending VALUES (?, ?, ?, ?, ?) ON CONFLICT (line) DO UPDATE SET \"offset\" = excluded.\"offset\", "
                             "length = excluded.length, custom_id = excluded.custom_id, attempt = excluded.attempt", self._retries)
        self._db.executemany("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (line, attempt) DO UPDATE SET "
                             "batch = excluded.batch, type = excluded.type, error_type = excluded.error_type, raw = excluded.raw",
                             self._history)
        self._db.executemany("INSERT INTO unproven VALUES (?, ?, ?, ?) ON CONFLICT (line, batch_id) DO UPDATE SET "
                             "custom_id = excluded.custom_id, raw = excluded.raw", self._kept)
        self._db.executemany("UPDATE realtime SET state = 'answered' WHERE line = ? AND state IN ('queued', 'sent')",
                             self._lane)
        self._db.executemany("UPDATE realtime SET lost = lost - 1 WHERE line = ? AND lost > 0", self._uncounted)
        self._kept.clear()
        self._lane.clear()
        self._uncounted.clear()
        self.finals += len(self._finals)
        self.retries += len(self._retries)
        self._finals.clear()
        self._retries.clear()
        self._history.clear()
