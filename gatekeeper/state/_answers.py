"""What each rendered request of a table job was answered, kept across runs: a request answered once is never sent
again, whatever run or machine asks; a changed row is another request.

Kept in SQLite beside the table job's runs, or, when the job's journal is PostgreSQL, in that database under the
table job's name (so every worker and triggerer sees the same answers). A result is the final result object a
request last got; a *final* one answers it for good (the column is named `succeeded`, as it first was): one that
succeeded, or one the run will not send again because it may have been billed already (an answer kept apart as
unproven, results the API no longer has); anything else is sent again by the next run. Reads go a
record batch of keys at a time, never a row at a time; they may consult the names a job had before (`also`: an
earlier version named a job otherwise), writes go under its name.

Beside the answers, the runs whose answers were kept (`settled`): a run not settled did not finish, or finished
without its answers kept, and is finished first by the next run of the table job, whatever changed in the table
meanwhile (a kill -9 followed by a grown table must not buy its rows again).
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
RUNS = "CREATE TABLE IF NOT EXISTS {table} (job TEXT NOT NULL, run TEXT NOT NULL, PRIMARY KEY (job, run))"
CHUNK = 900  # keys a query asks about at once (SQLite's limit on parameters is 999 in old builds)


class Answers:
    """The answers of one table job (`job`; "" in a local file, which holds one job's), read under its earlier names
    too (`also`)."""

    def __init__(self, db: SqliteDb | PgDb, table: str, job: str = "", also: Sequence[str] = (), runs: str = "runs") -> None:
        self._db, self._table, self._job, self._runs = db, table, job, runs
        self._jobs = (job, *(a for a in dict.fromkeys(also) if a != job))

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
        db.execute(RUNS.format(table="runs"))
        return cls(db, "answers")

    @classmethod
    def shared(cls, url: str, job: str, also: Sequence[str] = ()) -> Answers:
        db = PgDb(url, f"the table job's answers in {safe_url(url)} (job {job})", JournalError)
        db.execute("CREATE SCHEMA IF NOT EXISTS gatekeeper")
        db.execute(pg_ddl(SCHEMA.format(table="gatekeeper.table_answers")))
        db.execute(pg_ddl(RUNS.format(table="gatekeeper.table_runs")))
        return cls(db, "gatekeeper.table_answers", job, also, runs="gatekeeper.table_runs")

    def _rows(self, what: str, keys: Sequence[str], extra: str = "") -> Iterator[tuple[Any, ...]]:
        jobs = ",".join("?" * len(self._jobs))
        for i in range(0, len(keys), CHUNK):
            chunk = keys[i:i + CHUNK]
            marks = ",".join("?" * len(chunk))
            yield from self._db.execute(f"SELECT {what} FROM {self._table} WHERE job IN ({jobs}) AND key IN ({marks})"
                                        f"{extra}", (*self._jobs, *chunk)).fetchall()

    def answered_among(self, keys: Sequence[str]) -> set[str]:
        """Those of `keys` answered for good (final)."""
        return {key for (key,) in self._rows("key", keys, " AND succeeded = 1")}

    def results_of(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The result each of `keys` last got, where it got one (a final one before any other a name has)."""
        out: dict[str, dict[str, Any]] = {}
        for key, result, succeeded in self._rows("key, result, succeeded", keys):
            if succeeded or key not in out:
                out[key] = dict(orjson.loads(bytes(result)))
        return out

    def settled(self, runs: Sequence[str]) -> set[str]:
        """Those of `runs` whose answers were kept."""
        if not runs:
            return set()
        marks = ",".join("?" * len(runs))
        return {run for (run,) in self._db.execute(f"SELECT run FROM {self._runs} WHERE job = ? AND run IN ({marks})",
                                                   (self._job, *runs)).fetchall()}

    def settle(self, run: str) -> None:
        """The run's answers are kept: a later run of the job need not finish it first."""
        self._db.execute(f"INSERT INTO {self._runs} (job, run) VALUES (?, ?) ON CONFLICT (job, run) DO NOTHING",
                         (self._job, run))

    def keep(self, results: Iterable[tuple[str, dict[str, Any], bool]]) -> None:
        """Keep each (key, result, final) in one transaction; a final answer is never replaced."""
        rows = [(self._job, key, orjson.dumps(result), int(final)) for key, result, final in results]
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
