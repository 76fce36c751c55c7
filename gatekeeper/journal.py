"""The durable journal of a submit run: SQLite (WAL) in the state directory.

Every state change is one transaction, so a crash at any instant leaves the
journal at a consistent point; the output file's committed length is recorded
in the same transaction as the results rows, so a resume truncates the output
back to it and nothing is written twice.

Batch states (`BatchState`) move:

    planned ──intent recorded──► intent ──create answered──► created ──seen ended──► ended ──results committed──► collected
       ▲                            │
       └── definite refusal ────────┘   (an intent with an unknown outcome is reconciled first)
"""

from __future__ import annotations

import enum
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import JournalError


class BatchState(str, enum.Enum):
    PLANNED = "planned"  # cut, not yet sent
    INTENT = "intent"  # about to be (or being) created; outcome unknown until answered or reconciled
    CREATED = "created"  # the API gave it an id; processing
    ENDED = "ended"  # the API says it ended; results not yet committed
    COLLECTED = "collected"  # its results are in the output and the journal


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
            batch INTEGER NOT NULL, line INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL,
            custom_id TEXT NOT NULL, attempt INTEGER NOT NULL, PRIMARY KEY (batch, line)
        );
        CREATE TABLE pending (              -- requests waiting for another attempt
            line INTEGER PRIMARY KEY, offset INTEGER NOT NULL, length INTEGER NOT NULL,
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
]


@dataclass
class BatchRow:
    idx: int
    kind: str
    requests: int
    bytes: int
    first_line: int
    last_line: int
    start_offset: int
    end_offset: int
    first_custom_id: str
    last_custom_id: str
    state: BatchState
    batch_id: str | None
    intent_at: float | None
    created_at: str | None
    ended_at: str | None
    counts: str | None


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


class Journal:
    """One run's journal. Open with `Journal.open(state_dir)`."""

    FILE = "journal.sqlite3"

    def __init__(self, db: sqlite3.Connection, state_dir: Path) -> None:
        self.db = db
        self.state_dir = state_dir

    @classmethod
    def open(cls, state_dir: str | os.PathLike[str]) -> Journal:
        path = Path(state_dir)
        try:
            _private_dir(path)
        except OSError as exc:
            raise JournalError(f"cannot use state directory {path}: {exc.strerror or exc}") from None
        db_path = path / cls.FILE
        fresh = not db_path.exists()
        if fresh:
            os.close(os.open(db_path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            db = sqlite3.connect(db_path, isolation_level=None, timeout=30.0)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a committed state change survives power loss too
            db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{db_path} is not a gatekeeper journal: {exc}") from None
        journal = cls(db, path)
        journal._migrate()
        return journal

    def close(self) -> None:
        self.db.close()

    def _migrate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        done = {r[0] for r in self.db.execute("SELECT name FROM schema_migrations")}
        known = {name for name, _ in MIGRATIONS}
        if done - known:
            raise JournalError(f"the journal in {self.state_dir} was written by a newer gatekeeper ({sorted(done - known)[-1]})")
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            with self.transaction():
                for statement in sql.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute("INSERT INTO schema_migrations VALUES (?, ?)", (name, time.time()))

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- meta ---------------------------------------------------------------

    def get_meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def set_meta(self, db: sqlite3.Connection, key: str, value: Any) -> None:
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, orjson.dumps(value).decode()))

    @property
    def initialized(self) -> bool:
        return self.get_meta("input") is not None

    def event(self, db: sqlite3.Connection, event: str, batch: int | None = None, **detail: Any) -> None:
        db.execute("INSERT INTO events (at, batch, event, detail) VALUES (?, ?, ?, ?)",
                   (time.time(), batch, event, orjson.dumps(detail).decode() if detail else None))

    # -- batches ------------------------------------------------------------

    @staticmethod
    def _row(r: Sequence[Any]) -> BatchRow:
        return BatchRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], BatchState(r[10]), r[11], r[12],
                        r[13], r[14], r[15])

    def batches(self, *states: BatchState) -> list[BatchRow]:
        sql = "SELECT * FROM batches"
        args: Sequence[str] = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args = [s.value for s in states]
        return [self._row(r) for r in self.db.execute(sql + " ORDER BY idx", args)]

    def batch(self, idx: int) -> BatchRow:
        return self._row(self.db.execute("SELECT * FROM batches WHERE idx = ?", (idx,)).fetchone())

    def next_batch_index(self) -> int:
        return int(self.db.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM batches").fetchone()[0])

    def insert_batches(self, db: sqlite3.Connection, rows: Iterable[tuple[Any, ...]]) -> None:
        db.executemany(
            "INSERT INTO batches (idx, kind, requests, bytes, first_line, last_line, start_offset, end_offset, "
            "first_custom_id, last_custom_id, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned')", rows)

    def set_state(self, db: sqlite3.Connection, idx: int, state: BatchState, **fields: Any) -> None:
        sets = ", ".join(["state = ?"] + [f"{k} = ?" for k in fields])
        db.execute(f"UPDATE batches SET {sets} WHERE idx = ?", (state.value, *fields.values(), idx))
        self.event(db, state.value, idx, **{k: v for k, v in fields.items() if k in ("batch_id", "counts")})

    def known_batch_ids(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT batch_id FROM batches WHERE batch_id IS NOT NULL")}

    def rejected_lines(self, first: int, last: int) -> set[int]:
        return {r[0] for r in self.db.execute("SELECT line FROM rejections WHERE line BETWEEN ? AND ?", (first, last))}

    def members(self, idx: int) -> list[tuple[int, int, int, str, int]]:
        """(line, offset, length, custom_id, attempt) of a retry batch, in line order."""
        return list(self.db.execute(
            "SELECT line, offset, length, custom_id, attempt FROM members WHERE batch = ? ORDER BY line", (idx,)))

    # -- output -------------------------------------------------------------

    def committed_output(self) -> int:
        value = self.get_meta("output_committed")
        return int(value or 0)

    # -- reporting ----------------------------------------------------------

    def counts_by_type(self) -> dict[str, int]:
        return {t: n for t, n in self.db.execute("SELECT type, COUNT(*) FROM results GROUP BY type")}

    def counts_by_error(self) -> dict[str, int]:
        return {t: n for t, n in self.db.execute(
            "SELECT error_type, COUNT(*) FROM results WHERE type = 'errored' GROUP BY error_type")}

    def scalar(self, sql: str, *args: Any) -> Any:
        return self.db.execute(sql, args).fetchone()[0]
