"""What each rendered request of a table job was answered, kept across runs (SQLite, beside the table job's runs):
a request answered once is never sent again, whatever run asks; a changed row is another request.

`answers(key, result)`: the final result object a request last got (its `type` says whether it is answered for good:
only `succeeded` is; anything else is sent again by the next run)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from .._errors import JournalError
from ._db import sqlite_said

SCHEMA = "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, result BLOB NOT NULL, succeeded INTEGER NOT NULL)"


class Answers:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            said = sqlite_said("the table job's answers", exc, str(path)) if isinstance(exc, sqlite3.Error) else \
                f"the table job's answers cannot be kept at {path}: {exc.strerror or exc}"
            raise JournalError(said, setting="state_dir") from None

    def answered(self, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM answers WHERE key = ? AND succeeded = 1", (key,)).fetchone() is not None

    def result(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT result FROM answers WHERE key = ?", (key,)).fetchone()
        return None if row is None else dict(orjson.loads(row[0]))

    def keep(self, results: Iterable[tuple[str, dict[str, Any]]]) -> int:
        """Keep each (key, result) in one transaction; a succeeded answer is never replaced by a lesser one."""
        n = 0
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for key, result in results:
                ok = int(result.get("type") == "succeeded")
                self._db.execute("INSERT INTO answers (key, result, succeeded) VALUES (?, ?, ?) ON CONFLICT (key) DO "
                                 "UPDATE SET result = excluded.result, succeeded = excluded.succeeded "
                                 "WHERE answers.succeeded = 0", (key, orjson.dumps(result), ok))
                n += 1
        return n

    def keys(self) -> Iterator[str]:
        for (key,) in self._db.execute("SELECT key FROM answers"):
            yield key

    def close(self) -> None:
        self._db.close()
