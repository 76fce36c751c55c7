"""What every part of the journal stands on: the connection, one transaction a change, the job's meta and its
event log, and reading and moving the batches. `Journal` is this core with its collaborators (`_lease`,
`_adoptions`, `_groups`, `_realtime`, `_outcomes`), each owning one concern and holding the core, not inheriting it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from ._db import Db
from ._records import BATCH_COLUMNS, BATCH_SELECT, BatchRow, BatchState


class JournalBase:
    """The connection and the primitives every part of the journal uses."""

    def __init__(self, db: Db, state_dir: Path, *, clock: Callable[[], float] = time.time, job: str | None = None) -> None:
        self.db = db
        self.state_dir = state_dir  # local files: the lock, a spooled input, the default output
        self.job = job  # the job's name in a shared journal (None: the state directory is the job)
        self.where = db.where  # the journal, for messages
        self._clock = clock  # stamps events
        self.guard: Callable[[], None] | None = None  # checks a shared journal's lease before each write (`_lease`)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[Db]:
        """One atomic change; in a shared journal, only while this run still holds the job's lease."""
        self.db.begin()
        try:
            if self.guard is not None:
                self.guard()
            yield self.db
            self.db.end(commit=True)
        except BaseException:
            # (a COMMIT that fails, as one that finds the disk full does, leaves SQLite's transaction open: rolled
            # back here, or the next change of the run would fail on it rather than on the disk)
            self.db.end(commit=False)
            raise

    def get_meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def put_meta(self, db: Db, key: str, value: Any) -> None:
        db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   (key, orjson.dumps(value).decode()))

    @property
    def initialized(self) -> bool:
        return self.get_meta("input") is not None

    def now(self) -> float:
        """This journal's clock: the time its events are stamped with."""
        return float(self._clock())

    def event(self, event: str, batch: int | None = None, **detail: Any) -> None:
        """A mark on the run's timeline (a resume, say), in its own transaction."""
        with self.transaction() as db:
            self.note(db, event, batch, **detail)

    def note(self, db: Db, event: str, batch: int | None = None, **detail: Any) -> None:
        db.execute("INSERT INTO events (at, batch, event, detail) VALUES (?, ?, ?, ?)",
                   (self._clock(), batch, event, orjson.dumps(detail).decode() if detail else None))

    def set_meta(self, key: str, value: Any, event: str | None = None, **detail: Any) -> None:
        with self.transaction() as db:
            self.put_meta(db, key, value)
            if event:
                self.note(db, event, **detail)

    @staticmethod
    def _row(r: Sequence[Any]) -> BatchRow:
        """A batch read by column name (`BATCH_COLUMNS`, selected in `BatchRow`'s field order, whatever order the
        migrations gave the table's columns)."""
        row = dict(zip(BATCH_COLUMNS, r, strict=True))
        return BatchRow(**{**row, "state": BatchState(row["state"]), "body_complete": bool(row["body_complete"]),
                           "cut": bool(row["cut"])})

    def batches(self, *states: BatchState) -> list[BatchRow]:
        sql = f"SELECT {BATCH_SELECT} FROM batches"
        args: Sequence[str] = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args = [s.value for s in states]
        return [self._row(r) for r in self.db.execute(sql + " ORDER BY idx", args)]

    def batch(self, idx: int) -> BatchRow:
        return self._row(self.db.execute(f"SELECT {BATCH_SELECT} FROM batches WHERE idx = ?", (idx,)).fetchone())

    def count(self, *states: BatchState) -> int:
        marks = ",".join("?" * len(states))
        return int(self.scalar(f"SELECT COUNT(*) FROM batches WHERE state IN ({marks})", *(s.value for s in states)))

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that must agree (the committed length and the rows), in one read transaction.

        Errors are `JournalError` (a journal another process is still creating has no tables yet)."""
        self.db.begin(write=False)
        try:
            yield
        finally:
            self.db.end(commit=False)

    def scalar(self, sql: str, *args: Any) -> Any:
        return self.db.execute(sql, args).fetchone()[0]

    def set_state(self, db: Db, idx: int, state: BatchState, **fields: Any) -> None:
        sets = ", ".join(["state = ?"] + [f"{k} = ?" for k in fields])
        db.execute(f"UPDATE batches SET {sets} WHERE idx = ?", (state.value, *fields.values(), idx))
        self.note(db, state.value, idx, **{k: v for k, v in fields.items() if k in ("batch_id", "counts")})
