"""What each rendered request of a table job was answered, kept across runs: a request answered once is never sent
again, whatever run or machine asks; a changed row is another request.

Kept in SQLite beside the table job's runs, or, when the job's journal is PostgreSQL, in that database under the
table job's name (so every worker and triggerer sees the same answers). A result is the final result object a
request last got; only `succeeded` answers it for good (anything else is sent again by the next run). Reads go a
record batch of keys at a time, never a row at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from .._errors import JournalError
from ._db import PgDb, SqliteDb, pg_ddl, safe_url

SCHEMA = ("CREATE TABLE IF NOT EXISTS {table} (job TEXT NOT NULL, key TEXT NOT NULL, result BLOB NOT NULL, "
          "succeeded INTEGER NOT NULL, PRIMARY KEY (job, key))")
CHUNK = 900  # keys a query asks about at once (SQLite's limit on parameters is 999 in old builds)


class Answers:
    """The answers of one table job (`job`; "" in a local file, which holds one job's)."""

    def __init__(self, db: SqliteDb | PgDb, table: str, job: str = "") -> None:
        self._db, self._table, self._job = db, table, job

    @classmethod
    def local(cls, path: Path) -> Answers:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"the table job's answers cannot be kept at {path}: {exc.strerror or exc}",
                               setting="state_dir") from None
        db = SqliteDb.open(str(path), f"the table job's answers {path}", JournalError, path=str(path))
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(SCHEMA.format(table="answers"))
        return cls(db, "answers")

    @classmethod
    def shared(cls, url: str, job: str) -> Answers:
        db = PgDb(url, f"the table job's answers in {safe_url(url)} (job {job})", JournalError)
        db.execute("CREATE SCHEMA IF NOT EXISTS gatekeeper")
        db.execute(pg_ddl(SCHEMA.format(table="gatekeeper.table_answers")))
        return cls(db, "gatekeeper.table_answers", job)

    def _rows(self, what: str, keys: Sequence[str], extra: str = "") -> Iterator[tuple[Any, ...]]:
        for i in range(0, len(keys), CHUNK):
            chunk = keys[i:i + CHUNK]
            marks = ",".join("?" * len(chunk))
            yield from self._db.execute(f"SELECT {what} FROM {self._table} WHERE job = ? AND key IN ({marks}){extra}",
                                        (self._job, *chunk)).fetchall()

    def answered_among(self, keys: Sequence[str]) -> set[str]:
        """Those of `keys` answered for good."""
        return {key for (key,) in self._rows("key", keys, " AND succeeded = 1")}

    def results_of(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The result each of `keys` last got, where it got one."""
        return {key: dict(orjson.loads(bytes(result))) for key, result in self._rows("key, result", keys)}

    def keep(self, results: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Keep each (key, result) in one transaction; a succeeded answer is never replaced by a lesser one."""
        rows = [(self._job, key, orjson.dumps(result), int(result.get("type") == "succeeded")) for key, result in results]
        self._db.begin()
        ok = False
        try:
            self._db.executemany(f"INSERT INTO {self._table} (job, key, result, succeeded) VALUES (?, ?, ?, ?) "
                                 "ON CONFLICT (job, key) DO UPDATE SET result = excluded.result, succeeded = "
                                 f"excluded.succeeded WHERE {self._table}.succeeded = 0", rows)
            ok = True
        finally:
            self._db.end(ok)

    def close(self) -> None:
        self._db.close()
