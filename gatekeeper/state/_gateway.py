"""The gateway's book of batches (its SQL lives here, as the journal's does in `_journal`): one row a batch a client
created through the gateway, its tenant, its job's state as the API shows it, how it was asked for (the request
set's digest, an Idempotency-Key), and which replica runs its job (a claim kept alive by heartbeats).

SQLite in the gateway's state folder (one replica), or a schema of its own in PostgreSQL (`gatekeeper_gateway`)
for several replicas behind a load balancer. Every change is one transaction; a create's lookup of an earlier
batch with the same key or request set and its insert are one, serialized (SQLite's `BEGIN IMMEDIATE`, an advisory
lock in PostgreSQL), so two retries of one create never make two batches. Times are wall seconds from the clock
passed in: claims compare them across replicas, whose clocks NTP keeps within a second or so (a claim is only who
tries a job; the job's own lease in its journal is what keeps two runs of it apart).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .._errors import GatewayRefusal, JournalError, os_error
from ._db import Db, PgDb, SqliteDb, is_postgres, pg_ddl, safe_url

MIGRATIONS: list[tuple[str, str]] = [
    ("0001_batches", """
        CREATE TABLE gateway_batches (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order: the listing's, newest first
            id TEXT NOT NULL UNIQUE,                -- msgbatch_..., the gateway's own
            tenant TEXT NOT NULL,
            status TEXT NOT NULL,                   -- in_progress, canceling, ended (the API's processing_status)
            requests INTEGER NOT NULL,
            bytes INTEGER NOT NULL,                 -- the requests' JSONL, as spooled
            digest TEXT NOT NULL,                   -- sha256 of the requests in order (one compact line each)
            idem_key TEXT,                          -- the create's Idempotency-Key header, when it had one
            api_version TEXT NOT NULL,              -- the create's anthropic-version: the job keeps it
            created_at REAL NOT NULL,
            cancel_at REAL,                         -- cancel_initiated_at
            ended_at REAL,
            counts TEXT,                            -- request_counts once ended (JSON)
            deleted_at REAL,                        -- deleted by its tenant: gone from every answer
            owner TEXT,                             -- the replica running the job, kept by heartbeats
            owner_info TEXT,                        -- its host, pid and machine (JSON)
            beat_at REAL,
            failures INTEGER NOT NULL DEFAULT 0,    -- runs of the job that stopped on an error, in a row
            last_error TEXT,
            retry_at REAL                           -- not tried again before this
        );
        CREATE INDEX gateway_batches_tenant ON gateway_batches (tenant, seq);
        CREATE INDEX gateway_batches_digest ON gateway_batches (tenant, digest);
        CREATE INDEX gateway_batches_key ON gateway_batches (tenant, idem_key);
        CREATE INDEX gateway_batches_live ON gateway_batches (status)
    """),
]
SCHEMA = "gatekeeper_gateway"  # in PostgreSQL
FILE = "gateway.sqlite3"  # in the state folder
LOCK_CREATE = 7_046_913_301  # the advisory lock that serializes creates' lookups and inserts (PostgreSQL)
LIVE = ("in_progress", "canceling")
_COLUMNS = ("id, tenant, status, requests, bytes, digest, idem_key, api_version, created_at, cancel_at, ended_at, "
            "counts, owner, owner_info, beat_at, failures, last_error, retry_at")


@dataclass(frozen=True)
class BatchRecord:
    """One batch of the book, as the gateway answers for it."""

    id: str
    tenant: str
    status: str
    requests: int
    bytes: int
    digest: str
    idem_key: str | None
    api_version: str
    created_at: float
    cancel_at: float | None = None
    ended_at: float | None = None
    counts: dict[str, int] | None = None
    owner: str | None = None
    owner_info: dict[str, Any] | None = None
    beat_at: float | None = None
    failures: int = 0
    last_error: str | None = None
    retry_at: float | None = None


def _record(row: Sequence[Any]) -> BatchRecord:
    values = list(row)
    values[11] = orjson.loads(values[11]) if values[11] else None
    values[13] = orjson.loads(values[13]) if values[13] else None
    return BatchRecord(*values)


class GatewayBook:
    """The batches table, over SQLite or PostgreSQL (`open_book`). Not thread-safe: one caller at a time."""

    def __init__(self, db: Db, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        self.where = db.where

    def close(self) -> None:
        self.db.close()

    def _tx(self) -> _Tx:
        return _Tx(self.db)

    def migrate(self) -> None:
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
            done = {r[0] for r in db.execute("SELECT name FROM schema_migrations")}
            if done - {name for name, _ in MIGRATIONS}:
                raise JournalError(f"the {self.where} was written by a newer gatekeeper ({sorted(done)[-1]})")
            for name, sql in MIGRATIONS:
                if name in done:
                    continue
                for statement in sql.split(";"):
                    if statement.strip():
                        db.execute(pg_ddl(statement) if db.dialect == "postgres" else statement)
                db.execute("INSERT INTO schema_migrations VALUES (?, ?)", (name, self.clock()))

    # -- creating ------------------------------------------------------------

    def create(self, record: BatchRecord, window: float) -> tuple[BatchRecord, bool]:
        """Insert `record`, unless its tenant already has the batch it asks for: the one its Idempotency-Key names
        (a 400 when that one holds other requests), else, within `window` seconds, one of the same
        request set. (batch, whether it is new)."""
        with self._tx() as db:
            if db.dialect == "postgres":
                db.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_CREATE,))
            earlier = self._same(db, record, window)
            if earlier is not None:
                if record.idem_key is not None and earlier.idem_key == record.idem_key and earlier.digest != record.digest:
                    raise GatewayRefusal(400, f"Idempotency-Key {record.idem_key!r} was used for batch {earlier.id}, "
                                         "created with other requests; use a new key for a new request set")
                return earlier, False
            db.execute(f"INSERT INTO gateway_batches ({_COLUMNS}) VALUES ({', '.join('?' * 18)})",
                       (record.id, record.tenant, record.status, record.requests, record.bytes, record.digest,
                        record.idem_key, record.api_version, record.created_at, None, None, None, None, None, None, 0,
                        None, None))
        return record, True

    def _same(self, db: Db, record: BatchRecord, window: float) -> BatchRecord | None:
        """The batch a keyed create names (a new key is a new batch, whatever its requests: the client said so), else
        one of the same request set within the window (the SDK sends no key: its retries are told by their content),
        never one canceled since (a retry comes before any cancel; the same set sent after one is sent again: the API
        never answers a create with an ended batch)."""
        if record.idem_key is not None:
            row = db.execute(f"SELECT {_COLUMNS} FROM gateway_batches WHERE tenant = ? AND idem_key = ? AND "
                             "deleted_at IS NULL ORDER BY seq DESC LIMIT 1", (record.tenant, record.idem_key)).fetchone()
            return None if row is None else _record(row)
        if window <= 0:
            return None
        row = db.execute(f"SELECT {_COLUMNS} FROM gateway_batches WHERE tenant = ? AND digest = ? AND created_at >= ? "
                         "AND deleted_at IS NULL AND cancel_at IS NULL ORDER BY seq DESC LIMIT 1",
                         (record.tenant, record.digest, record.created_at - window)).fetchone()
        return None if row is None else _record(row)

    # -- reading ---------------------------------------------------------------

    def get(self, tenant: str | None, batch_id: str) -> BatchRecord | None:
        """The batch, when it is `tenant`'s (any tenant's with None) and not deleted."""
        row = self.db.execute(f"SELECT {_COLUMNS} FROM gateway_batches WHERE id = ? AND deleted_at IS NULL",
                              (batch_id,)).fetchone()
        record = None if row is None else _record(row)
        return record if record is not None and tenant in (None, record.tenant) else None

    def page(self, tenant: str, limit: int, after_id: str | None = None,
             before_id: str | None = None) -> tuple[list[BatchRecord], bool]:
        """A page of the tenant's batches, newest first, as the API pages them: after `after_id` (older ones), or
        just before `before_id` (newer ones); and whether more lie that way."""
        base = f"SELECT {_COLUMNS} FROM gateway_batches WHERE tenant = ? AND deleted_at IS NULL"
        cursor = after_id or before_id
        if cursor is None:
            rows = self.db.execute(base + " ORDER BY seq DESC LIMIT ?", (tenant, limit + 1)).fetchall()
        else:
            found = self.db.execute("SELECT seq FROM gateway_batches WHERE tenant = ? AND id = ?", (tenant, cursor)).fetchone()
            if found is None:
                raise GatewayRefusal(400, f"{'after_id' if after_id else 'before_id'}: unknown batch {cursor}")
            if after_id:
                rows = self.db.execute(base + " AND seq < ? ORDER BY seq DESC LIMIT ?", (tenant, found[0], limit + 1)).fetchall()
            else:  # (the `limit` batches just newer than the cursor, shown newest first)
                rows = self.db.execute(base + " AND seq > ? ORDER BY seq ASC LIMIT ?", (tenant, found[0], limit + 1)).fetchall()
                return [_record(r) for r in reversed(rows[:limit])], len(rows) > limit
        return [_record(r) for r in rows[:limit]], len(rows) > limit

    def live(self) -> list[BatchRecord]:
        """Every batch whose job has not ended, oldest first."""
        return [_record(r) for r in self.db.execute(f"SELECT {_COLUMNS} FROM gateway_batches WHERE status IN (?, ?) AND "
                                                    "deleted_at IS NULL ORDER BY seq", LIVE)]

    def known_ids(self) -> set[str]:
        """Every batch id the book holds, deleted ones included (a spool folder without one is a create cut off)."""
        return {r[0] for r in self.db.execute("SELECT id FROM gateway_batches")}

    def statuses(self) -> dict[str, int]:
        """Batches by processing status (deleted ones left out)."""
        return {str(s): int(n) for s, n in self.db.execute(
            "SELECT status, COUNT(*) FROM gateway_batches WHERE deleted_at IS NULL GROUP BY status")}

    # -- the batch's life --------------------------------------------------------

    def cancel(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """Cancel asked: an in_progress batch becomes canceling (an ended or canceling one is left as it is)."""
        with self._tx() as db:
            db.execute("UPDATE gateway_batches SET status = 'canceling', cancel_at = ? WHERE id = ? AND tenant = ? AND "
                       "status = 'in_progress' AND deleted_at IS NULL", (self.clock(), batch_id, tenant))
        return self.get(tenant, batch_id)

    def finish(self, batch_id: str, counts: dict[str, int]) -> None:
        """The job has ended: its counts, and the claim let go."""
        with self._tx() as db:
            db.execute("UPDATE gateway_batches SET status = 'ended', ended_at = ?, counts = ?, owner = NULL, "
                       "owner_info = NULL, beat_at = NULL, last_error = NULL, retry_at = NULL WHERE id = ?",
                       (self.clock(), orjson.dumps(counts).decode(), batch_id))

    def delete(self, tenant: str, batch_id: str) -> bool:
        """Deleted, when it has ended; False when it has not."""
        with self._tx() as db:
            cur = db.execute("UPDATE gateway_batches SET deleted_at = ? WHERE id = ? AND tenant = ? AND status = 'ended' "
                             "AND deleted_at IS NULL", (self.clock(), batch_id, tenant))
            return cur.rowcount == 1

    # -- who runs each job -------------------------------------------------------------

    def claim(self, owner: str, info: dict[str, Any], ttl: float, ended: Callable[[dict[str, Any]], bool],
              limit: int, *, fresh: bool = False) -> list[BatchRecord]:
        """Take up to `limit` live batches whose job nobody runs: no claim, a claim not renewed for `ttl` seconds,
        or one whose run `ended` (given the info it recorded) says has certainly ended. Each taken by one
        compare-and-set, so two replicas never take the same one. `fresh` (a replica's first look, after a
        restart): a failed job's backoff is not waited out (an operator restarts once the upstream is back)."""
        now = self.clock()
        taken: list[BatchRecord | None] = []
        for record in self.live():
            if len(taken) >= limit:
                break
            if record.owner == owner or not fresh and record.retry_at is not None and record.retry_at > now:
                continue
            free = record.owner is None or (record.beat_at or 0.0) < now - ttl or ended(record.owner_info or {})
            if free and self._take(record, owner, info, now):
                taken.append(self.get(None, record.id))
        return [r for r in taken if r is not None]

    def _take(self, record: BatchRecord, owner: str, info: dict[str, Any], now: float) -> bool:
        with self._tx() as db:
            cur = db.execute("UPDATE gateway_batches SET owner = ?, owner_info = ?, beat_at = ? WHERE id = ? AND "
                             "COALESCE(owner, '') = ? AND COALESCE(beat_at, 0) = ?",
                             (owner, orjson.dumps(info).decode(), now, record.id, record.owner or "", record.beat_at or 0.0))
            return cur.rowcount == 1

    def beat(self, owner: str) -> list[BatchRecord]:
        """The heartbeat of every claim `owner` holds; the batches it still holds (a batch another replica took over
        meanwhile is not among them)."""
        with self._tx() as db:
            db.execute("UPDATE gateway_batches SET beat_at = ? WHERE owner = ?", (self.clock(), owner))
        return [_record(r) for r in self.db.execute(f"SELECT {_COLUMNS} FROM gateway_batches WHERE owner = ?", (owner,))]

    def release(self, owner: str, batch_id: str, *, error: str | None = None, retry_at: float | None = None) -> None:
        """Let go of a claim (a replica that stops); with `error`, the run failed and is not tried before `retry_at`."""
        with self._tx() as db:
            if error is None:
                db.execute("UPDATE gateway_batches SET owner = NULL, owner_info = NULL, beat_at = NULL WHERE id = ? "
                           "AND owner = ?", (batch_id, owner))
            else:
                db.execute("UPDATE gateway_batches SET owner = NULL, owner_info = NULL, beat_at = NULL, "
                           "failures = failures + 1, last_error = ?, retry_at = ? WHERE id = ? AND owner = ?",
                           (error[:500], retry_at, batch_id, owner))


class _Tx:
    """One transaction: committed when the block ends, rolled back on any error."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def __enter__(self) -> Db:
        self.db.begin()
        return self.db

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.db.end(commit=kind is None)


def open_book(state_dir: Path, journal: str | None, clock: Callable[[], float] = time.time) -> GatewayBook:
    """The book: SQLite in `state_dir` (WAL, synchronous), or in the PostgreSQL database `journal` names."""
    if journal and is_postgres(journal):
        pg = PgDb(journal, f"gateway book {safe_url(journal)}", JournalError)
        pg.execute(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"')
        pg.use_schema(SCHEMA)
        db: Db = pg
        book = GatewayBook(db, clock)
        db.execute("SELECT pg_advisory_lock(?)", (LOCK_CREATE + 1,))
        try:
            book.migrate()
        finally:
            db.execute("SELECT pg_advisory_unlock(?)", (LOCK_CREATE + 1,))
        return book
    path = state_dir / FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as exc:
        raise JournalError(os_error(exc, f"cannot create the gateway's book {path}"), setting="state_dir") from exc
    sqlite = SqliteDb.open(str(path), f"gateway book {path}", JournalError)
    sqlite.execute("PRAGMA journal_mode=WAL")
    sqlite.execute("PRAGMA synchronous=FULL")
    book = GatewayBook(sqlite, clock)
    book.migrate()
    return book
