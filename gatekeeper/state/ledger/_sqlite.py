"""Several submitters on one host: the ledger in a SQLite file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ..._errors import LedgerError
from .._db import Db, SqliteDb
from ._base import DEFAULT_TTL, Liveness
from ._sql import SQL_SCHEMA, SqlLedger, migrate


class SqliteLedger(SqlLedger):
    """Several submitters on one host: a SQLite file; BEGIN IMMEDIATE makes each grant atomic across processes."""

    def __init__(self, path: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0,
                 clock: Callable[[], float] = time.time, liveness: Liveness | None = None) -> None:
        self.path = path
        self.liveness = liveness
        self.clock = clock  # this host's clock: every expiry is on it (the submitters share the host)
        self.owner = owner
        self.ttl = ttl
        self.margin = margin
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            # Not created: submitters that mean to share a ledger would each get their own, silently.
            raise LedgerError(f"ledger {_url(path)}: folder {parent} does not exist", setting="ledger")
        self._tx(lambda db, now: [*[db.execute(sql) for sql in SQL_SCHEMA], migrate(db, str)])

    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        """One atomic step on a connection of its own (steps run in worker threads)."""
        db = SqliteDb.open(self.path, f"ledger {_url(self.path)}", LedgerError)
        try:
            _wal(db)
            db.begin()
            try:
                result = fn(db, self.clock())
            except BaseException:
                db.end(commit=False)
                raise
            db.end(commit=True)
            return result
        finally:
            db.close()


def _url(path: str) -> str:
    """The ledger's URL as a user writes it (sqlite:///abs/path), whatever slashes it was given with."""
    return "sqlite:///" + path.lstrip("/") if os.path.isabs(path) else f"sqlite:///{path}"


WAL_WAITS = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # seconds between tries of the switch to WAL


def _wal(db: SqliteDb) -> None:
    """The ledger in WAL mode. Submitters that open a new ledger at once race for the switch, which SQLite refuses
    at once ("database is locked") instead of waiting its busy timeout: tried again, briefly (this runs in a worker
    thread). Measured: 6 processes opening one new ledger together failed in 8 rounds of 40 without this."""
    for wait in WAL_WAITS:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except LedgerError:
            time.sleep(wait)
    db.execute("PRAGMA journal_mode=WAL")
