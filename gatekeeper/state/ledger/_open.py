"""A ledger opened from its URL, and which one a run uses when it names none (this host's)."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from ..._errors import LedgerError
from .._db import is_postgres, safe_url
from .._home import check_home, ensure_home
from ._base import DEFAULT_TTL, Ledger, Liveness, new_owner
from ._local import LocalLedger
from ._postgres import PgLedger
from ._redis import RedisLedger
from ._sqlite import SqliteLedger

LEDGER_VARIABLE = "GATEKEEPER_LEDGER"
HOST = "host"  # this user's ledger on this machine, in the state folder (`state._home`)
NONE = ("none", "local")  # no ledger: the run's own journal only ("local": its earlier name)


class LedgerChoice(NamedTuple):
    """The ledger a run uses: `kind` "host" (this user's on this machine), "shared" (a URL given) or "none";
    `url` to open (None for "none")."""

    kind: str
    url: str | None

    def to_json(self, namespace: str = "") -> dict[str, str | None]:
        """`file`: the SQLite file a job on the queue `namespace` (`ApiConfig.scope`) keeps its reservations in,
        the URL's file with the platform's suffix (`sqlite_file`); None for another kind of ledger."""
        file = sqlite_file(self.url, namespace) if self.url is not None and self.url.startswith("sqlite://") else None
        return {"kind": self.kind, "url": None if self.url is None else safe_url(self.url), "file": file}


def host_ledger_file(home: Path, hostname: str | None = None) -> Path:
    """This user's ledger on this machine: one SQLite file a host in the state folder's `ledger/` (a home folder
    shared between machines keeps one apart for each; SQLite's WAL needs a host of its own)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", hostname or socket.gethostname()) or "host"
    return home / "ledger" / f"{name}.db"


def choose_ledger(setting: str | None, environ: Mapping[str, str], *, create: bool = True) -> LedgerChoice:
    """The ledger a run uses. `setting` None: `GATEKEEPER_LEDGER` when the environment sets it, else this host's;
    "host": this host's; "none" (or "local"): none; anything else a URL to share. This host's folder is created
    when `create` (one line naming it, exit 2, when it cannot be: `state._home.ensure_home`)."""
    named = setting if setting is not None else (environ.get(LEDGER_VARIABLE) or "").strip() or HOST
    if named in NONE:
        return LedgerChoice("none", None)
    if named != HOST:
        return LedgerChoice("shared", named)
    home = (ensure_home if create else check_home)(environ, "ledger").parent
    return LedgerChoice(HOST, f"sqlite://{os.path.abspath(host_ledger_file(home))}")


def open_ledger(url: str | None, *, owner: str | None = None, ttl: float = DEFAULT_TTL, margin: int = 0,
                namespace: str = "", liveness: Liveness | None = None, clock: Callable[[], float] = time.time) -> Ledger:
    """`None`, "none" or "local": in-process; "sqlite:///path/to/ledger.db"; "redis://host:port/db";
    "postgresql://...". `namespace` keeps the state of another queue apart (`ApiConfig.scope`: an AWS workspace in
    its region): a PostgreSQL schema, Redis keys, or a SQLite file beside the given one (`ledger.db.NAMESPACE`); ""
    is the first-party organization's, as before. `liveness`: this process, and how to tell one of this machine
    that has ended (its submitters are then dropped at once, not after the TTL). A SQLite ledger's expiry is on
    `clock` (the run's: its host's); a server's own clock times the others."""
    if not url or url in NONE:
        return LocalLedger()
    owner = owner or new_owner()
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return SqliteLedger(sqlite_file(url, namespace), owner, ttl=ttl, margin=margin, liveness=liveness, clock=clock)
    if parts.scheme in ("redis", "rediss", "unix"):
        return RedisLedger(url, owner, ttl=ttl, margin=margin, namespace=namespace or "default", liveness=liveness)
    if is_postgres(url):
        return PgLedger(url, owner, ttl=ttl, margin=margin, namespace=namespace, liveness=liveness)
    raise LedgerError(f"ledger {safe_url(url)}: expected host, none, sqlite:///PATH, redis://HOST:PORT/DB or "
                      "postgresql://USER@HOST:PORT/DB", setting="ledger")


def sqlite_file(url: str, namespace: str = "") -> str:
    """The file a sqlite:/// ledger URL names for a queue (`namespace`: beside the given one)."""
    path = "/" + url[len("sqlite://"):].lstrip("/") if url.startswith("sqlite:///") else url[len("sqlite://"):]
    if not path or path == "/":  # (sqlite:////abs and sqlite:///abs name one file: SQLAlchemy's form, and ours)
        raise LedgerError(f"ledger {url}: give a file, as sqlite:///path/to/ledger.db", setting="ledger")
    return f"{path}.{namespace}" if namespace else path
