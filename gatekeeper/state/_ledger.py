"""The admission ledger: reservations against the organization's ceiling, shared by submitters.

Submitters in different workspaces cannot see each other's batches, so reading
live depth is not enough: two of them can read the same headroom and both
create. Each submitter reserves a batch's requests in the ledger before its
create, and the ledger grants a reservation only if

    reserved (all submitters, unexpired)  +  max(0, seen - mine)  +  n  <=  ceiling - margin

where `seen` is the depth this submitter observes (its listing plus its own
unlisted creates) and `mine` its own reservations: the part of what it sees
that no reservation covers is counted once, the reserved part once. Grants are
atomic (one SQLite write transaction, one PostgreSQL transaction under an
advisory lock, or one Redis Lua script), so no two
submitters can both take the last room: the queue cannot overshoot through
gatekeeper's own creates. A reservation is confirmed with its batch id,
released when the batch ends or the create was definitely refused, and
expires `ttl` seconds after its owner's last heartbeat, so a killed submitter
blocks the organization for at most `ttl`; a resumed one takes its live
batches' reservations back (`hold`).

Creates go one at a time across the ledger: a reservation is not granted while another submitter holds one
that is not confirmed (its create is out, or its answer was lost and it is not yet reconciled). So when a
create's answer is lost, every other submitter's batch created since is named in the ledger, and a lone
unnamed batch of our size and custom_ids, created after our send, is ours whatever its usage says
(`decide._reconcile`). A released reservation whose batch was created stays as a *name* (no requests) for
`NAMED_FOR` seconds, so batches that ended are still told apart.

`LocalLedger` (the default) serves one submitter: its journal already counts its
own creates, so it grants everything.
"""

from __future__ import annotations

import abc
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

import anyio

from .._errors import LedgerError
from ._claims import Claim
from ._db import Db, PgDb, SqliteDb, is_postgres, pg_ddl, safe_url

DEFAULT_TTL = 900.0
NAMED_FOR = 7 * 86_400.0  # seconds a released batch stays named in the ledger (reconciliations within it can tell)


@dataclass(frozen=True)
class Reservation:
    owner: str
    batch: int
    requests: int
    batch_id: str | None
    expires_in: float

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "batch": self.batch, "requests": self.requests, "batch_id": self.batch_id,
                "expires_in": round(self.expires_in, 1)}

    @property
    def live(self) -> bool:
        """A reservation of requests (not a released batch's name)."""
        return self.requests > 0


class Ledger(Protocol):
    """Admission shared by several submitters: each reserves a batch's requests before creating it, and a
    reservation is granted only while all of theirs and the queue fit under the ceiling (`open_ledger` makes one)."""

    ttl: float
    owner: str  # this submitter's name in the ledger ("" for the in-process one)

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool: ...
    async def hold(self, batch: int, n: int, batch_id: str | None) -> None: ...
    async def confirm(self, batch: int, batch_id: str) -> None: ...
    async def release(self, batch: int) -> None: ...
    async def release_all(self) -> None: ...
    async def heartbeat(self) -> None: ...
    async def claim_job(self, job: str, info: dict[str, Any]) -> dict[str, Any] | None: ...
    async def reservations(self) -> list[Reservation]: ...
    async def put_claim(self, mine: ClaimPost) -> list[Claim]: ...
    async def claims(self) -> list[Claim]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class LedgerReading(NamedTuple):
    """What `status` and the exporter read of a shared ledger: live reservations, and the jobs' claims."""

    reservations: list[Reservation]
    claims: list[Claim]

    def jobs(self) -> list[dict[str, Any]]:
        """Each job on the ledger: name, priority, share, queued (its live reservations), waiting, admitted."""
        queued: dict[str, int] = {}
        for r in self.reservations:
            queued[r.owner] = queued.get(r.owner, 0) + r.requests
        return [{**c.to_json(), "queued": queued.get(c.owner, 0)} for c in self.claims]


@dataclass(frozen=True)
class ClaimPost:
    """This submitter's claim as it posts it (`decide._shares` reads everyone's back). `reset_wait`: it has just
    admitted, so its wait starts again."""

    job: str
    priority: int
    share: float
    want: int
    vtime: float
    admitted: int
    reset_wait: bool = False


def grant(reserved: int, seen: int, mine: int, n: int, ceiling: int, others_creating: int = 0) -> bool:
    """The admission formula (pure; the shared ledgers evaluate the same inside their atomic step): room under the
    ceiling, and no other submitter's create out or unreconciled (`others_creating`)."""
    return not others_creating and reserved + max(0, seen - mine) + n <= ceiling


class LocalLedger:
    """One submitter in one process: nothing to share."""

    ttl = DEFAULT_TTL
    owner = ""

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool:
        return True

    async def hold(self, batch: int, n: int, batch_id: str | None) -> None:
        return None

    async def confirm(self, batch: int, batch_id: str) -> None:
        return None

    async def release(self, batch: int) -> None:
        return None

    async def release_all(self) -> None:
        return None

    async def heartbeat(self) -> None:
        return None

    async def claim_job(self, job: str, info: dict[str, Any]) -> dict[str, Any] | None:
        return None  # one process: the state directory's lock is the only guard

    async def reservations(self) -> list[Reservation]:
        return []

    async def put_claim(self, mine: ClaimPost) -> list[Claim]:
        return []  # (alone: its turn always)

    async def claims(self) -> list[Claim]:
        return []

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


_SQL_SCHEMA = (
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


def _claim(row: Any, now: float) -> Claim:
    owner, job, priority, share, want, since, vtime, admitted, claimed = row
    return Claim(owner, job, int(priority), float(share), int(want), 0.0 if since is None else max(0.0, now - since),
                 float(vtime), int(admitted), max(0.0, now - claimed))
_UPSERT = ("INSERT INTO reservations VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, batch) DO UPDATE SET "
           "requests = excluded.requests, batch_id = excluded.batch_id, expires_at = excluded.expires_at")
LOCK_LEDGER = 7_046_913_202  # PostgreSQL: the advisory lock every grant takes (one grant at a time, all hosts)


class SqlLedger(abc.ABC):
    """The ledger in a SQL database; each step one atomic transaction (`_tx`), evaluated on the database's clock."""

    ttl: float
    owner: str
    margin: int

    @abc.abstractmethod
    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        """Run `fn(db, now)` as one atomic step; its result."""

    async def _run(self, fn: Callable[[Db, float], Any]) -> Any:
        return await anyio.to_thread.run_sync(self._tx, fn)

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
            return [_claim(r, now) for r in db.execute(f"SELECT {_CLAIM_COLUMNS} FROM claims ORDER BY owner").fetchall()]

        return list(await self._run(step))

    async def claims(self) -> list[Claim]:
        def step(db: Db, now: float) -> list[Claim]:
            rows = db.execute(f"SELECT {_CLAIM_COLUMNS} FROM claims WHERE expires_at >= ? ORDER BY owner", (now,))
            return [_claim(r, now) for r in rows.fetchall()]

        return list(await self._run(step))

    async def ping(self) -> None:
        await self._run(lambda db, now: None)

    async def close(self) -> None:
        return None


class SqliteLedger(SqlLedger):
    """Several submitters on one host: a SQLite file; BEGIN IMMEDIATE makes each grant atomic across processes."""

    def __init__(self, path: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock  # this host's clock: every expiry is on it (the submitters share the host)
        self.owner = owner
        self.ttl = ttl
        self.margin = margin
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            # Not created: submitters that mean to share a ledger would each get their own, silently.
            raise LedgerError(f"ledger sqlite:///{path}: folder {parent} does not exist", setting="ledger")
        self._tx(lambda db, now: [db.execute(sql) for sql in _SQL_SCHEMA])

    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        """One atomic step on a connection of its own (steps run in worker threads)."""
        db = SqliteDb.open(self.path, f"ledger sqlite:///{self.path}", LedgerError)
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


class PgLedger(SqlLedger):
    """Submitters on many hosts: PostgreSQL. Each grant holds one advisory lock for its transaction, and every
    expiry is on the server's clock (no skew between hosts)."""

    def __init__(self, url: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0, namespace: str = "") -> None:
        self.owner = owner
        self.ttl = ttl
        self.margin = margin
        self.url = safe_url(url)
        schema = "gatekeeper_ledger" + (f"_{namespace}" if namespace else "")
        self._lock = threading.Lock()  # one step at a time on the connection (steps run in worker threads)
        self.db = PgDb(url, f"ledger {self.url}", LedgerError)
        self._tx(lambda db, now: [db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'),
                                  db.execute(f'SET LOCAL search_path TO "{schema}"'),
                                  *[db.execute(pg_ddl(sql)) for sql in _SQL_SCHEMA]])
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


# One Lua script a step: Redis runs each atomically, on the server's clock (no skew between hosts).
_LUA_RESERVE = """
local key, owner, batch = KEYS[1], ARGV[1], ARGV[2]
local n, ceiling, seen, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', key)
local reserved, mine, creating = 0, 0, 0
local me = owner .. '|' .. batch
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local count, expires, bid = string.match(value, '^(%d+):([^:]+):(.*)$')
  count, expires = tonumber(count), tonumber(expires)
  if expires < now then
    redis.call('HDEL', key, field)
  elseif field ~= me then
    reserved = reserved + count
    if string.sub(field, 1, #owner + 1) == owner .. '|' then mine = mine + count
    elseif bid == '' and count > 0 then creating = creating + 1 end
  end
end
if creating > 0 then return 0 end
if ceiling >= 0 and reserved + math.max(0, seen - mine) + n > ceiling then return 0 end
redis.call('HSET', key, me, n .. ':' .. (now + ttl) .. ':')
return 1
"""

_LUA_SET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + tonumber(ARGV[3])) .. ':' .. ARGV[4])
return 1
"""

_LUA_CONFIRM = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if not value then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local count = string.match(value, '^(%d+):')
redis.call('HSET', KEYS[1], ARGV[1], count .. ':' .. (now + tonumber(ARGV[2])) .. ':' .. ARGV[3])
return 1
"""

_LUA_HEARTBEAT = """
local key, owner, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if string.sub(field, 1, #owner + 1) == owner .. '|' then
    local count, expires, bid = string.match(value, '^(%d+):([^:]+):(.*)$')
    if tonumber(count) > 0 then redis.call('HSET', key, field, count .. ':' .. (now + ttl) .. ':' .. bid) end
  end
end
return 1
"""

_LUA_RELEASE = """
local key, prefix, only, named = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if (only ~= '' and field == only) or (only == '' and string.sub(field, 1, #prefix) == prefix) then
    local count, expires, bid = string.match(value, '^(%d+):([^:]+):(.*)$')
    if bid == '' then redis.call('HDEL', key, field)
    elseif tonumber(count) > 0 then redis.call('HSET', key, field, '0:' .. (now + named) .. ':' .. bid) end
  end
end
return 1
"""

_LUA_CLAIM = """
local key, job, owner, info, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local value = redis.call('HGET', key, job)
if value then
  local holder, expires, held = string.match(value, '^([^|]*)|([^|]*)|(.*)$')
  if holder ~= owner and tonumber(expires) >= now then return held end
end
redis.call('HSET', key, job, owner .. '|' .. (now + ttl) .. '|' .. info)
return false
"""

_LUA_JOBS_BEAT = """
local key, owner, ttl, drop = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local holder, expires, info = string.match(all[i + 1], '^([^|]*)|([^|]*)|(.*)$')
  if holder == owner then
    if drop == '1' then redis.call('HDEL', key, all[i])
    else redis.call('HSET', key, all[i], owner .. '|' .. (now + ttl) .. '|' .. info) end
  end
end
return 1
"""

_LUA_LIST = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return {tostring(now), redis.call('HGETALL', KEYS[1])}
"""


# A claim: one hash field per submitter, its value JSON; waits and expiry on the server's clock.
_LUA_PUT_CLAIM = """
local key, owner, ttl, reset = KEYS[1], ARGV[1], tonumber(ARGV[3]), ARGV[4]
local rec = cjson.decode(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local old = redis.call('HGET', key, owner)
local prev = old and cjson.decode(old) or {}
rec.claimed_at = prev.claimed_at or now
if rec.want > 0 then
  if reset ~= '1' and prev.waiting_since and prev.waiting_since ~= cjson.null then rec.waiting_since = prev.waiting_since
  else rec.waiting_since = now end
end
rec.expires_at = now + ttl
redis.call('HSET', key, owner, cjson.encode(rec))
local all = redis.call('HGETALL', key)
local live = {}
for i = 1, #all, 2 do
  if cjson.decode(all[i + 1]).expires_at < now then redis.call('HDEL', key, all[i])
  else table.insert(live, all[i]); table.insert(live, all[i + 1]) end
end
return {tostring(now), live}
"""

_LUA_CLAIM_BEAT = """
local key, owner, ttl, drop = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local value = redis.call('HGET', key, owner)
if not value then return 0 end
if drop == '1' then redis.call('HDEL', key, owner) return 1 end
local t = redis.call('TIME')
local rec = cjson.decode(value)
rec.expires_at = tonumber(t[1]) + tonumber(t[2]) / 1000000 + ttl
redis.call('HSET', key, owner, cjson.encode(rec))
return 1
"""


class RedisLedger:
    """Submitters on many hosts: a Redis hash, every step an atomic Lua script on the server."""

    def __init__(self, url: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0, namespace: str = "default") -> None:
        try:
            import redis.asyncio as aioredis
        except ImportError:
            raise LedgerError("a redis:// ledger needs the redis package: pip install 'gatekeeper-batches[redis]'",
                              setting="ledger") from None
        self.url = safe_url(url)
        # Timeouts: an unreachable host is reported within seconds, not after the OS gives up.
        self.client = aioredis.from_url(url, socket_connect_timeout=5, socket_timeout=15)
        self.owner = owner
        self.ttl = ttl
        self.margin = margin
        self.key = f"gatekeeper:{namespace}:reservations"
        self._reserve = self.client.register_script(_LUA_RESERVE)
        self._set = self.client.register_script(_LUA_SET)
        self._confirm = self.client.register_script(_LUA_CONFIRM)
        self._heartbeat = self.client.register_script(_LUA_HEARTBEAT)
        self._release = self.client.register_script(_LUA_RELEASE)
        self._list = self.client.register_script(_LUA_LIST)
        self._claim = self.client.register_script(_LUA_CLAIM)
        self._jobs_beat = self.client.register_script(_LUA_JOBS_BEAT)
        self._put_claim = self.client.register_script(_LUA_PUT_CLAIM)
        self._claim_beat = self.client.register_script(_LUA_CLAIM_BEAT)
        self.jobs_key = f"gatekeeper:{namespace}:jobs"
        self.claims_key = f"gatekeeper:{namespace}:claims"

    def _field(self, batch: int) -> str:
        return f"{self.owner}|{batch}"

    async def _guard(self, call: Awaitable[Any]) -> Any:
        """The one place redis errors become ours: `LedgerError`, naming the URL without its password."""
        from redis.exceptions import RedisError

        try:
            return await call
        except RedisError as exc:
            raise LedgerError(f"ledger {self.url} cannot be reached: {type(exc).__name__}: {exc}",
                              setting="ledger") from exc

    async def ping(self) -> None:
        await self._guard(self.client.ping())

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool:
        limit = -1 if ceiling is None else ceiling - self.margin
        return bool(await self._guard(self._reserve(keys=[self.key], args=[self.owner, batch, n, limit, seen, self.ttl])))

    async def hold(self, batch: int, n: int, batch_id: str | None) -> None:
        await self._guard(self._set(keys=[self.key], args=[self._field(batch), n, self.ttl, batch_id or ""]))

    async def confirm(self, batch: int, batch_id: str) -> None:
        await self._guard(self._confirm(keys=[self.key], args=[self._field(batch), self.ttl, batch_id]))

    async def release(self, batch: int) -> None:
        await self._guard(self._release(keys=[self.key], args=[self.owner + "|", self._field(batch), NAMED_FOR]))

    async def release_all(self) -> None:
        await self._guard(self._release(keys=[self.key], args=[self.owner + "|", "", NAMED_FOR]))
        await self._guard(self._jobs_beat(keys=[self.jobs_key], args=[self.owner, self.ttl, "1"]))
        await self._guard(self._claim_beat(keys=[self.claims_key], args=[self.owner, self.ttl, "1"]))

    async def heartbeat(self) -> None:
        await self._guard(self._heartbeat(keys=[self.key], args=[self.owner, self.ttl]))
        await self._guard(self._jobs_beat(keys=[self.jobs_key], args=[self.owner, self.ttl, "0"]))
        await self._guard(self._claim_beat(keys=[self.claims_key], args=[self.owner, self.ttl, "0"]))

    async def put_claim(self, mine: ClaimPost) -> list[Claim]:
        rec = {"job": mine.job, "priority": mine.priority, "share": mine.share, "want": mine.want, "vtime": mine.vtime,
               "admitted": mine.admitted}
        now_text, flat = await self._guard(self._put_claim(
            keys=[self.claims_key], args=[self.owner, json.dumps(rec), self.ttl, "1" if mine.reset_wait else "0"]))
        return _redis_claims(float(now_text), flat)

    async def claims(self) -> list[Claim]:
        now_text, flat = await self._guard(self._list(keys=[self.claims_key]))
        now = float(now_text)
        return [c for c, exp in _redis_claims_expiring(now, flat) if exp >= now]

    async def claim_job(self, job: str, info: dict[str, Any]) -> dict[str, Any] | None:
        held = await self._guard(self._claim(keys=[self.jobs_key], args=[job, self.owner, json.dumps(info), self.ttl]))
        return None if not held else dict(json.loads(held))

    async def reservations(self) -> list[Reservation]:
        now_text, flat = await self._guard(self._list(keys=[self.key]))
        now = float(now_text)
        out = []
        for field, value in zip(flat[::2], flat[1::2]):
            owner, _, batch = field.decode().rpartition("|")
            count, expires, bid = value.decode().split(":", 2)
            if float(expires) >= now:
                out.append(Reservation(owner, int(batch), int(count), bid or None, float(expires) - now))
        return sorted(out, key=lambda r: (r.owner, r.batch))

    async def close(self) -> None:
        await self.client.aclose()


def new_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def open_ledger(url: str | None, *, owner: str | None = None, ttl: float = DEFAULT_TTL, margin: int = 0,
                namespace: str = "") -> Ledger:
    """`None` or "local": in-process; "sqlite:///path/to/ledger.db"; "redis://host:port/db"; "postgresql://...".
    `namespace` keeps the state of another queue apart (`ApiConfig.scope`: an AWS workspace in its region): a
    PostgreSQL schema, Redis keys, or a SQLite file beside the given one (`ledger.db.NAMESPACE`); "" is the
    first-party organization's, as before."""
    if not url or url == "local":
        return LocalLedger()
    owner = owner or new_owner()
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = url[len("sqlite://"):]
        if not path or path == "/":
            raise LedgerError(f"ledger {url}: give a file, as sqlite:///path/to/ledger.db", setting="ledger")
        return SqliteLedger(f"{path}.{namespace}" if namespace else path, owner, ttl=ttl, margin=margin)
    if parts.scheme in ("redis", "rediss", "unix"):
        return RedisLedger(url, owner, ttl=ttl, margin=margin, namespace=namespace or "default")
    if is_postgres(url):
        return PgLedger(url, owner, ttl=ttl, margin=margin, namespace=namespace)
    raise LedgerError(f"ledger {safe_url(url)}: expected local, sqlite:///PATH, redis://HOST:PORT/DB or "
                      "postgresql://USER@HOST:PORT/DB", setting="ledger")


def _redis_claims_expiring(now: float, flat: list[Any]) -> list[tuple[Claim, float]]:
    out = []
    for field, value in zip(flat[::2], flat[1::2]):
        r = json.loads(value)
        since = r.get("waiting_since")
        out.append((_claim((field.decode(), r["job"], r["priority"], r["share"], r["want"], since, r["vtime"],
                            r["admitted"], r["claimed_at"]), now), float(r["expires_at"])))
    return sorted(out, key=lambda p: p[0].owner)


def _redis_claims(now: float, flat: list[Any]) -> list[Claim]:
    return [c for c, _ in _redis_claims_expiring(now, flat)]
