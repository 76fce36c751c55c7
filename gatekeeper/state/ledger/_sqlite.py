"""Several submitters on one host: the ledger in a SQLite file."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..._clock import run_sync
from ..._errors import LedgerError
from .._db import Db, SqliteDb
from ._base import DEFAULT_TTL, Liveness
from ._sql import SQL_SCHEMA, SqlLedger, migrate


class SqliteLedger(SqlLedger):
    """Several submitters on one host: a SQLite file; BEGIN IMMEDIATE makes each grant atomic across processes.

    One connection a ledger, kept between steps (opening one a step, and the checkpoint its close ran, cost a fifth
    of a step's time), one step at a time on it (steps run in worker threads). A new one is opened after a step that
    failed, once the file at `path` is not the one it has open (removed or replaced: what a new submitter would
    find), after `close`, and in a forked child (which never touches its parent's, as SQLite requires)."""

    def __init__(self, path: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0,
                 clock: Callable[[], float] = time.time, liveness: Liveness | None = None) -> None:
        self.path = path
        self.liveness = liveness
        self.clock = clock  # this host's clock: every expiry is on it (the submitters share the host)
        self.owner = owner
        self.ttl = ttl
        self.margin = margin
        self._lock = threading.Lock()
        self._db: SqliteDb | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file `_db` has open
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            # Not created: submitters that mean to share a ledger would each get their own, silently.
            raise LedgerError(f"ledger {_url(path)}: folder {parent} does not exist", setting="ledger")
        _LEDGERS.add(self)
        self._tx(lambda db, now: [*[db.execute(sql) for sql in SQL_SCHEMA], migrate(db, str)])

    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        """One atomic step on this ledger's connection."""
        with self._lock:
            db = self._connection()
            try:
                db.begin()
                try:
                    result = fn(db, self.clock())
                except BaseException:
                    db.end(commit=False)
                    raise
                db.end(commit=True)
                return result
            except BaseException:
                self._drop()
                raise

    def _connection(self) -> SqliteDb:
        if self._db is not None and _identity(self.path) != self._file:
            self._drop()
        if self._db is None:
            db = SqliteDb.open(self.path, f"ledger {_url(self.path)}", LedgerError, any_thread=True)
            try:
                _wal(db)
            except BaseException:
                db.close()
                raise
            self._db, self._file = db, _identity(self.path)
        return self._db

    def _drop(self) -> None:
        db, self._db, self._file = self._db, None, None
        if db is not None:
            db.close()

    def _close(self) -> None:
        with self._lock:
            self._drop()

    async def close(self) -> None:
        """The connection closed (a later step opens another)."""
        await run_sync(self._close)

    def _forked(self) -> None:
        """In a forked child: the parent's connection is left alone, never used nor closed (a close would release
        this process's locks on the file and could checkpoint it), and a lock a parent's thread held is not waited on."""
        self._lock = threading.Lock()
        if self._db is not None:
            _INHERITED.append(self._db)
        self._db = self._file = None


_LEDGERS: weakref.WeakSet[SqliteLedger] = weakref.WeakSet()
_INHERITED: list[SqliteDb] = []  # (kept from the collector, whose close of a connection is a close)


def _after_fork() -> None:
    for ledger in list(_LEDGERS):
        ledger._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


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
