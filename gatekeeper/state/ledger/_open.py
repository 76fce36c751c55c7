"""A ledger opened from its URL."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

from ..._errors import LedgerError
from .._db import is_postgres, safe_url
from ._base import DEFAULT_TTL, Ledger, new_owner
from ._local import LocalLedger
from ._postgres import PgLedger
from ._redis import RedisLedger
from ._sqlite import SqliteLedger


def open_ledger(url: str | None, *, owner: str | None = None, ttl: float = DEFAULT_TTL, margin: int = 0,
                namespace: str = "", clock: Callable[[], float] = time.time) -> Ledger:
    """`None` or "local": in-process; "sqlite:///path/to/ledger.db"; "redis://host:port/db"; "postgresql://...".
    `namespace` keeps the state of another queue apart (`ApiConfig.scope`: an AWS workspace in its region): a
    PostgreSQL schema, Redis keys, or a SQLite file beside the given one (`ledger.db.NAMESPACE`); "" is the
    first-party organization's, as before. A SQLite ledger's expiry is on `clock` (the run's: its host's); a server's
    own clock times the others."""
    if not url or url == "local":
        return LocalLedger()
    owner = owner or new_owner()
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = url[len("sqlite://"):]
        if not path or path == "/":
            raise LedgerError(f"ledger {url}: give a file, as sqlite:///path/to/ledger.db", setting="ledger")
        return SqliteLedger(f"{path}.{namespace}" if namespace else path, owner, ttl=ttl, margin=margin, clock=clock)
    if parts.scheme in ("redis", "rediss", "unix"):
        return RedisLedger(url, owner, ttl=ttl, margin=margin, namespace=namespace or "default")
    if is_postgres(url):
        return PgLedger(url, owner, ttl=ttl, margin=margin, namespace=namespace)
    raise LedgerError(f"ledger {safe_url(url)}: expected local, sqlite:///PATH, redis://HOST:PORT/DB or "
                      "postgresql://USER@HOST:PORT/DB", setting="ledger")
