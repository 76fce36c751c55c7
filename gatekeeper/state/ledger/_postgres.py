"""Submitters on many hosts: the ledger in PostgreSQL, one advisory lock a grant, the server's clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..._errors import LedgerError
from .._db import Db, PgDb, pg_ddl, safe_url
from ._base import DEFAULT_TTL, Liveness
from ._sql import SQL_SCHEMA, SqlLedger, migrate

LOCK_LEDGER = 7_046_913_202  # PostgreSQL: the advisory lock every grant takes (one grant at a time, all hosts)


class PgLedger(SqlLedger):
    """Submitters on many hosts: PostgreSQL. Each grant holds one advisory lock for its transaction, and every
    expiry is on the server's clock (no skew between hosts)."""

    def __init__(self, url: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0, namespace: str = "",
                 liveness: Liveness | None = None) -> None:
        self.owner = owner
        self.liveness = liveness
        self.ttl = ttl
        self.margin = margin
        self.url = safe_url(url)
        schema = "gatekeeper_ledger" + (f"_{namespace}" if namespace else "")
        self._lock = threading.Lock()  # one step at a time on the connection (steps run in worker threads)
        self.db = PgDb(url, f"ledger {self.url}", LedgerError)
        self._tx(lambda db, now: [db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'),
                                  db.execute(f'SET LOCAL search_path TO "{schema}"'),
                                  *[db.execute(pg_ddl(sql)) for sql in SQL_SCHEMA], migrate(db, pg_ddl)])
        self.db.use_schema(schema)

    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        with self._lock:
            db = self.db
            db.begin()
            try:
                db.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_LEDGER,))
                now = float(db.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()[0])
                result = fn(db, now)
            except BaseException:
                db.end(commit=False)
                raise
            db.end(commit=True)
            return result

    async def close(self) -> None:
        self.db.close()
