"""The ledger in a SQL database (SQLite or PostgreSQL): its schema and every step, each one atomic transaction."""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from typing import Any

from ..._clock import run_sync
from .._claims import Claim
from .._db import Db
from ._base import NAMED_FOR, ClaimPost, Reservation, claim_of, grant

SQL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reservations (owner TEXT NOT NULL, batch INTEGER NOT NULL, requests INTEGER NOT NULL, "
    "batch_id TEXT, expires_at REAL NOT NULL, PRIMARY KEY (owner, batch))",
    "CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, owner TEXT NOT NULL, info TEXT NOT NULL, expires_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS claims (owner TEXT PRIMARY KEY, job TEXT NOT NULL, priority INTEGER NOT NULL, "
    "share REAL NOT NULL, want INTEGER NOT NULL, vtime REAL NOT NULL, admitted INTEGER NOT NULL, waiting_since REAL, "
    "claimed_at REAL NOT NULL, expires_at REAL NOT NULL)",
)
_CLAIM_UPSERT = (
    "INSERT INTO claims (owner, job, priority, share, want, vtime, admitted, waiting_since, claimed_at, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET job = excluded.job, priority = "
    "excluded.priority, share = excluded.share, want = excluded.want, vtime = excluded.vtime, admitted = "
    "excluded.admitted, waiting_since = CASE WHEN excluded.want > 0 AND ? = 0 THEN COALESCE(claims.waiting_since, "
    "excluded.waiting_since) ELSE excluded.waiting_since END, expires_at = excluded.expires_at")
_CLAIM_COLUMNS = "owner, job, priority, share, want, waiting_since, vtime, admitted, claimed_at"

_UPSERT = ("INSERT INTO reservations VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, batch) DO UPDATE SET "
           "requests = excluded.requests, batch_id = excluded.batch_id, expires_at = excluded.expires_at")


class SqlLedger(abc.ABC):
    """The ledger in a SQL database; each step one atomic transaction (`_tx`), evaluated on the database's clock."""

    ttl: float
    owner: str
    margin: int

    @abc.abstractmethod
    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        """Run `fn(db, now)` as one atomic step; its result."""

    async def _run(self, fn: Callable[[Db, float], Any]) -> Any:
        return await run_sync(lambda: self._tx(fn))

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool:
        def step(db: Db, now: float) -> bool:
            db.execute("DELETE FROM reservations WHERE expires_at < ?", (now,))
            reserved, mine, creating = db.execute(
                "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(CASE WHEN owner = ? THEN requests END), 0), "
                "COUNT(CASE WHEN owner <> ? AND batch_id IS NULL AND requests > 0 THEN 1 END) "
                "FROM reservations WHERE NOT (owner = ? AND batch = ?)", (self.owner, self.owner, self.owner, batch)).fetchone()
            limit = ceiling - self.margin if ceiling is not None else reserved + max(0, seen - mine) + n
            if not grant(int(reserved), seen, int(mine), n, limit, int(creating)):
                return False
            db.execute(_UPSERT, (self.owner, batch, n, None, now + self.ttl))
            return True

        return bool(await self._run(step))

    async def hold(self, batch: int, n: int, batch_id: str | None) -> None:
        await self._run(lambda db, now: db.execute(_UPSERT, (self.owner, batch, n, batch_id, now + self.ttl)))

    async def confirm(self, batch: int, batch_id: str) -> None:
        await self._run(lambda db, now: db.execute(
            "UPDATE reservations SET batch_id = ?, expires_at = ? WHERE owner = ? AND batch = ?",
            (batch_id, now + self.ttl, self.owner, batch)))

    async def release(self, batch: int) -> None:
        await self._run(lambda db, now: self._release(db, now, "AND batch = ?", (batch,)))

    def _release(self, db: Db, now: float, which: str, args: tuple[Any, ...]) -> None:
        """Free the requests; a created batch stays named (`NAMED_FOR`)."""
        db.execute(f"UPDATE reservations SET requests = 0, expires_at = ? WHERE owner = ? {which} AND batch_id IS NOT NULL "
                   "AND requests > 0", (now + NAMED_FOR, self.owner, *args))
        db.execute(f"DELETE FROM reservations WHERE owner = ? {which} AND batch_id IS NULL", (self.owner, *args))

    async def release_all(self) -> None:
        def step(db: Db, now: float) -> None:
            self._release(db, now, "", ())
            db.execute("DELETE FROM jobs WHERE owner = ?", (self.owner,))
            db.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))

        await self._run(step)

    async def heartbeat(self) -> None:
        def step(db: Db, now: float) -> None:
            db.execute("UPDATE reservations SET expires_at = ? WHERE owner = ? AND requests > 0", (now + self.ttl, self.owner))
            db.execute("UPDATE jobs SET expires_at = ? WHERE owner = ?", (now + self.ttl, self.owner))
            db.execute("UPDATE claims SET expires_at = ? WHERE owner = ?", (now + self.ttl, self.owner))

        await self._run(step)

    async def claim_job(self, job: str, info: dict[str, Any]) -> dict[str, Any] | None:
        """Register this submitter as the job's live runner; the other live runner's info when there is one."""
        def step(db: Db, now: float) -> dict[str, Any] | None:
            db.execute("DELETE FROM jobs WHERE expires_at < ?", (now,))
            row = db.execute("SELECT owner, info FROM jobs WHERE job = ?", (job,)).fetchone()
            if row is not None and row[0] != self.owner:
                return dict(json.loads(row[1]))
            db.execute("INSERT INTO jobs VALUES (?, ?, ?, ?) ON CONFLICT (job) DO UPDATE SET owner = excluded.owner, "
                       "info = excluded.info, expires_at = excluded.expires_at", (job, self.owner, json.dumps(info), now + self.ttl))
            return None

        result = await self._run(step)
        return None if result is None else dict(result)

    async def reservations(self) -> list[Reservation]:
        def step(db: Db, now: float) -> list[Reservation]:
            rows = db.execute("SELECT owner, batch, requests, batch_id, expires_at FROM reservations "
                              "WHERE expires_at >= ? ORDER BY owner, batch", (now,)).fetchall()
            return [Reservation(o, b, n, bid, exp - now) for o, b, n, bid, exp in rows]

        return list(await self._run(step))

    async def put_claim(self, mine: ClaimPost) -> list[Claim]:
        """Post this submitter's claim; everyone's live claims (its own included), waits on the ledger's clock."""
        def step(db: Db, now: float) -> list[Claim]:
            db.execute("DELETE FROM claims WHERE expires_at < ?", (now,))
            db.execute(_CLAIM_UPSERT, (self.owner, mine.job, mine.priority, mine.share, mine.want, mine.vtime,
                                       mine.admitted, now if mine.want > 0 else None, now, now + self.ttl,
                                       int(mine.reset_wait)))
            return [claim_of(r, now) for r in db.execute(f"SELECT {_CLAIM_COLUMNS} FROM claims ORDER BY owner").fetchall()]

        return list(await self._run(step))

    async def claims(self) -> list[Claim]:
        def step(db: Db, now: float) -> list[Claim]:
            rows = db.execute(f"SELECT {_CLAIM_COLUMNS} FROM claims WHERE expires_at >= ? ORDER BY owner", (now,))
            return [claim_of(r, now) for r in rows.fetchall()]

        return list(await self._run(step))

    async def ping(self) -> None:
        await self._run(lambda db, now: None)

    async def close(self) -> None:
        return None
