"""Submitters on many hosts: the ledger in a Redis hash, every step an atomic Lua script on the server."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from typing import Any, NamedTuple

from ..._errors import LedgerError
from .._claims import Board, Claim, ClaimPost, ClaimRow
from .._db import safe_url
from ._base import DEFAULT_TTL, NAMED_FOR, Liveness, Reservation

# One Lua script a step: Redis runs each atomically, on the server's clock (no skew between hosts).
#
# A reservation's turn (`turns`: granted:sent:ids, the same field as its reservation's) in a hash of its own, so
# that a submitter of an earlier version, which reads and writes the other hashes' values as they were, works on
# beside it (its reservations have none: unknown, like a SQL row's NULLs). When the turn was granted and when its
# create's body went out are the server's time; sent is empty until `sending`, ids empty where the create did not
# say. It lasts while the reservation, or the orphan it became, does (`_TIDY`), and goes when a create is taken
# back (`hold`: the journal's, not the ledger's, to say when it was sent).
_TIDY = """
local function tidy(res, orphans, turns, field)
  if redis.call('HEXISTS', res, field) == 0 and redis.call('HEXISTS', orphans, field) == 0 then
    redis.call('HDEL', turns, field)
  end
end
"""

_LUA_RESERVE = _TIDY + """
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
    tidy(key, KEYS[2], KEYS[3], field)
  elseif field ~= me then
    reserved = reserved + count
    if string.sub(field, 1, #owner + 1) == owner .. '|' then mine = mine + count
    elseif bid == '' and count == n then creating = creating + 1 end
  end
end
-- (another's unknown create keeps the turn for its size alone; a dead submitter's, a TTL at most)
local orphans = redis.call('HGETALL', KEYS[2])
for i = 1, #orphans, 2 do
  local count, holds = string.match(orphans[i + 1], '^(%d+):[^:]+:[^:]+:(.*)$')
  if count and string.sub(orphans[i], 1, #owner + 1) ~= owner .. '|' and tonumber(count) == n
      and tonumber(holds) >= now then
    creating = creating + 1
  end
end
if creating > 0 then return 0 end
if ceiling >= 0 and reserved + math.max(0, seen - mine) + n > ceiling then return 0 end
redis.call('HSET', key, me, n .. ':' .. (now + ttl) .. ':')
redis.call('HSET', KEYS[3], me, now .. '::' .. ARGV[7])
redis.call('HDEL', KEYS[2], me)
return 1
"""

# A reservation taken back (`hold`): no turn recorded, no orphan left.
_LUA_SET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + tonumber(ARGV[3])) .. ':' .. ARGV[4])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""

# Its create's body goes out now (a turn granted here only: one taken back says nothing of it).
_LUA_SENDING = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local turn = redis.call('HGET', KEYS[2], ARGV[1])
if not turn then return 0 end
local granted, _, ids = string.match(turn, '^([^:]*):([^:]*):(.*)$')
local t = redis.call('TIME')
redis.call('HSET', KEYS[2], ARGV[1], granted .. ':' .. (tonumber(t[1]) + tonumber(t[2]) / 1000000) .. ':' .. ids)
return 1
"""

# Another submitter's orphan settled by this one's listing: its batch named for it (ARGV[2]; its turn kept), or
# (ARGV[2] empty: it made none) dropped with its turn; 0 when it is gone already.
_LUA_SETTLE = _TIDY + """
local res, orphans, turns, field, bid = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
if redis.call('HEXISTS', orphans, field) == 0 then return 0 end
redis.call('HDEL', orphans, field)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if bid ~= '' and redis.call('HEXISTS', res, field) == 0 then
  redis.call('HSET', res, field, '0:' .. (now + tonumber(ARGV[3])) .. ':' .. bid)
end
tidy(res, orphans, turns, field)
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

_LUA_RELEASE = _TIDY + """
local key, prefix, only, named = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if (only ~= '' and field == only) or (only == '' and string.sub(field, 1, #prefix) == prefix) then
    local count, expires, bid = string.match(value, '^(%d+):([^:]+):(.*)$')
    if bid == '' then
      redis.call('HDEL', key, field)
      tidy(key, KEYS[2], KEYS[3], field)
    elseif tonumber(count) > 0 then redis.call('HSET', key, field, '0:' .. (now + named) .. ':' .. bid) end
  end
end
if only ~= '' then
  redis.call('HDEL', KEYS[2], only)
  tidy(key, KEYS[2], KEYS[3], only)
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


# A claim: one hash field per submitter, its value JSON; waits and expiry on the server's clock. The post follows
# `state._claims` (`posted`, `behind`, `tier_after`) line for line; a test holds the two to the same answers.
_LUA_PUT_CLAIM = """
local ckey, tkey, rkey = KEYS[1], KEYS[2], KEYS[3]
local owner, post, ttl = ARGV[1], cjson.decode(ARGV[2]), tonumber(ARGV[3])
local function val(x) if x == cjson.null then return nil end return x end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local reserved, held = 0, 0
local res = redis.call('HGETALL', rkey)
for i = 1, #res, 2 do
  local count, expires = string.match(res[i + 1], '^(%d+):([^:]+):')
  if tonumber(expires) >= now then
    reserved = reserved + tonumber(count)
    if string.sub(res[i], 1, #owner + 1) == owner .. '|' then held = held + tonumber(count) end
  end
end
local tier = tonumber(redis.call('HGET', tkey, tostring(post.priority)) or '0')
local old = redis.call('HGET', ckey, owner)
local prev = old and cjson.decode(old) or nil
local joining = post.want > 0 and (prev == nil or prev.want == 0)
local fresh = joining or post.took > 0 or post.want == 0 or prev == nil
local rec = {job = post.job, priority = post.priority, share = post.share, want = post.want, admitted = post.admitted,
             vtime = post.vtime, limit = cjson.null, aged = 0, behind_at = cjson.null, overtaken = 0, unread = 0,
             waiting_since = cjson.null, claimed_at = now, expires_at = now + ttl}
if joining then rec.vtime = math.max(post.vtime, tier) end
if val(post.ceiling) then rec.limit = post.ceiling - math.max(0, post.seen - held) end
if fresh then
  if post.want > 0 then rec.waiting_since = now end
else
  rec.aged = val(prev.aged) or 0
  rec.behind_at = prev.behind_at or cjson.null
  rec.waiting_since = prev.waiting_since or cjson.null
end
if prev then rec.claimed_at = prev.claimed_at end
if prev and not joining and post.want > 0 then rec.overtaken = math.max(0, (val(prev.overtaken) or 0) - post.took) end
redis.call('HSET', ckey, owner, cjson.encode(rec))
local overtook = {}
for _, o in ipairs(post.overtook) do overtook[o] = true end
local all = redis.call('HGETALL', ckey)
local live = {}
for i = 1, #all, 2 do
  local r = cjson.decode(all[i + 1])
  if r.expires_at < now then redis.call('HDEL', ckey, all[i])
  else
    local out_of_reach = val(r.limit) and r.want > r.limit
    if post.took > 0 and all[i] ~= owner and r.want > 0 and (overtook[all[i]] or r.priority > post.priority or out_of_reach) then
      if overtook[all[i]] then r.overtaken = (val(r.overtaken) or 0) + post.took end
      if out_of_reach then r.unread = (val(r.unread) or 0) + post.took end
      if r.priority > post.priority then
        local behind = val(r.behind_at)
        r.aged = (val(r.aged) or 0) + (behind and now - behind or 0)
        r.behind_at = now
      end
      all[i + 1] = cjson.encode(r)
      redis.call('HSET', ckey, all[i], all[i + 1])
    end
    table.insert(live, all[i]); table.insert(live, all[i + 1])
  end
end
if post.took > 0 and post.started > tier then redis.call('HSET', tkey, tostring(post.priority), tostring(post.started)) end
return {tostring(now), tostring(reserved), live}
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

# A submitter whose process ended on this machine (judged by the caller), dropped in one step, unless it was
# registered again since (`expected`: the record judged): its confirmed batches stay named, its unconfirmed creates
# not yet expired become orphans (count:since:expires:holds, holding the turn for their size until the reservation
# would have expired), its job registrations, claim and record go.
_LUA_DROP = """
local res, jobs, claims, procs, orphans, turns = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, expected, named = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('HGET', procs, owner) ~= expected then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local prefix = owner .. '|'
local all = redis.call('HGETALL', res)
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if string.sub(field, 1, #prefix) == prefix then
    local count, expires, bid = string.match(value, '^(%d+):([^:]+):(.*)$')
    if bid == '' then
      redis.call('HDEL', res, field)
      -- (a turn granted whose create's body never went out made no batch: it leaves no orphan)
      local turn = redis.call('HGET', turns, field)
      local unsent = turn and string.match(turn, '^[^:]*:([^:]*):') == ''
      if tonumber(count) > 0 and tonumber(expires) >= now and not unsent then
        redis.call('HSET', orphans, field, count .. ':' .. now .. ':' .. (now + named) .. ':' .. expires)
      else
        redis.call('HDEL', turns, field)
      end
    elseif tonumber(count) > 0 then redis.call('HSET', res, field, '0:' .. (now + named) .. ':' .. bid) end
  end
end
local held = redis.call('HGETALL', jobs)
for i = 1, #held, 2 do
  if string.match(held[i + 1], '^([^|]*)|') == owner then redis.call('HDEL', jobs, held[i]) end
end
redis.call('HDEL', claims, owner)
redis.call('HDEL', procs, owner)
return 1
"""

# The server's time, the reservations, the live orphans (count:since:expires:holds; the expired ones deleted) and
# the turns, in one step.
_LUA_READ = _TIDY + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', KEYS[2])
local live = {}
for i = 1, #all, 2 do
  local expires = tonumber(string.match(all[i + 1], '^%d+:[^:]+:([^:]+):') or 0)
  if expires < now then
    redis.call('HDEL', KEYS[2], all[i])
    tidy(KEYS[1], KEYS[2], KEYS[3], all[i])
  else table.insert(live, all[i]); table.insert(live, all[i + 1]) end
end
return {tostring(now), redis.call('HGETALL', KEYS[1]), live, redis.call('HGETALL', KEYS[3])}
"""

# This submitter done: its orphans, the turns of its creates no longer named, and its process record go.
_LUA_FORGET = _TIDY + """
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, #ARGV[1]) == ARGV[1] then redis.call('HDEL', KEYS[1], all[i]) end
end
local turns = redis.call('HKEYS', KEYS[4])
for _, field in ipairs(turns) do
  if string.sub(field, 1, #ARGV[1]) == ARGV[1] then tidy(KEYS[3], KEYS[1], KEYS[4], field) end
end
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
"""


class RedisLedger:
    """Submitters on many hosts: a Redis hash, every step an atomic Lua script on the server."""

    def __init__(self, url: str, owner: str, *, ttl: float = DEFAULT_TTL, margin: int = 0, namespace: str = "default",
                 liveness: Liveness | None = None) -> None:
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
        self._settle = self.client.register_script(_LUA_SETTLE)
        self._heartbeat = self.client.register_script(_LUA_HEARTBEAT)
        self._release = self.client.register_script(_LUA_RELEASE)
        self._list = self.client.register_script(_LUA_LIST)
        self._claim = self.client.register_script(_LUA_CLAIM)
        self._jobs_beat = self.client.register_script(_LUA_JOBS_BEAT)
        self._put_claim = self.client.register_script(_LUA_PUT_CLAIM)
        self._claim_beat = self.client.register_script(_LUA_CLAIM_BEAT)
        self.jobs_key = f"gatekeeper:{namespace}:jobs"
        self.claims_key = f"gatekeeper:{namespace}:claims"
        self.liveness = liveness
        self.procs_key = f"gatekeeper:{namespace}:processes"
        self.orphans_key = f"gatekeeper:{namespace}:orphans"
        self._drop = self.client.register_script(_LUA_DROP)
        self._read = self.client.register_script(_LUA_READ)
        self._sending = self.client.register_script(_LUA_SENDING)
        self._forget = self.client.register_script(_LUA_FORGET)
        self.tiers_key = f"gatekeeper:{namespace}:tiers"
        self.turns_key = f"gatekeeper:{namespace}:turns"

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

    async def _sweep(self) -> None:
        """Drop every other submitter of this machine whose process has ended (`Liveness`), each in one script."""
        live = self.liveness
        if live is None or live.machine is None:
            return
        records = await self._guard(self.client.hgetall(self.procs_key))
        for field, value in records.items():
            owner, rec = field.decode(), json.loads(value)
            # (a record not renewed for NAMED_FOR, on any machine, is long dead: its heartbeat renews it every ttl/3)
            stale = float(rec.get("seen") or 0.0) < time.time() - NAMED_FOR
            if owner != self.owner and (stale or rec.get("machine") == live.machine and live.ended(rec)):
                await self._guard(self._drop(keys=[self.key, self.jobs_key, self.claims_key, self.procs_key,
                                                   self.orphans_key, self.turns_key], args=[owner, value, NAMED_FOR]))

    async def _register(self) -> None:
        me = self.liveness.me if self.liveness is not None else None
        if me is not None and me.get("machine"):
            record = json.dumps({**me, "seen": round(time.time(), 1)}, sort_keys=True)
            await self._guard(self.client.hset(self.procs_key, self.owner, record))

    async def ping(self) -> None:
        """Reach the ledger, and record this submitter's process there (before any step of its own)."""
        await self._guard(self.client.ping())
        await self._sweep()
        await self._register()

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int, ids: str | None = None) -> bool:
        await self._sweep()
        limit = -1 if ceiling is None else ceiling - self.margin
        return bool(await self._guard(self._reserve(keys=[self.key, self.orphans_key, self.turns_key],
                                                    args=[self.owner, batch, n, limit, seen, self.ttl, ids or ""])))

    async def sending(self, batch: int) -> None:
        """Its create's body goes out now: until this, the ledger knows no batch came of the reservation."""
        await self._guard(self._sending(keys=[self.key, self.turns_key], args=[self._field(batch)]))

    async def hold(self, batch: int, n: int, batch_id: str | None) -> None:
        await self._guard(self._set(keys=[self.key, self.orphans_key, self.turns_key],
                                    args=[self._field(batch), n, self.ttl, batch_id or ""]))

    async def settle_orphan(self, owner: str, batch: int, batch_id: str | None) -> bool:
        """Another submitter's orphan settled by this one's listing (see `SqlLedger.settle_orphan`)."""
        if owner == self.owner:
            return False
        return bool(await self._guard(self._settle(keys=[self.key, self.orphans_key, self.turns_key],
                                                   args=[f"{owner}|{batch}", batch_id or "", NAMED_FOR])))

    async def confirm(self, batch: int, batch_id: str) -> None:
        await self._guard(self._confirm(keys=[self.key], args=[self._field(batch), self.ttl, batch_id]))

    async def release(self, batch: int) -> None:
        await self._guard(self._release(keys=[self.key, self.orphans_key, self.turns_key],
                                        args=[self.owner + "|", self._field(batch), NAMED_FOR]))

    async def release_all(self) -> None:
        await self._guard(self._release(keys=[self.key, self.orphans_key, self.turns_key],
                                        args=[self.owner + "|", "", NAMED_FOR]))
        await self._guard(self._jobs_beat(keys=[self.jobs_key], args=[self.owner, self.ttl, "1"]))
        await self._guard(self._claim_beat(keys=[self.claims_key], args=[self.owner, self.ttl, "1"]))
        await self._guard(self._forget(keys=[self.orphans_key, self.procs_key, self.key, self.turns_key],
                                       args=[self.owner + "|", self.owner]))

    async def heartbeat(self) -> None:
        await self._sweep()
        await self._register()
        await self._guard(self._heartbeat(keys=[self.key], args=[self.owner, self.ttl]))
        await self._guard(self._jobs_beat(keys=[self.jobs_key], args=[self.owner, self.ttl, "0"]))
        await self._guard(self._claim_beat(keys=[self.claims_key], args=[self.owner, self.ttl, "0"]))

    async def put_claim(self, mine: ClaimPost) -> Board:
        await self._sweep()
        post = {"job": mine.job, "priority": mine.priority, "share": mine.share, "want": mine.want, "vtime": mine.vtime,
                "admitted": mine.admitted, "ceiling": mine.ceiling, "seen": mine.seen, "took": mine.took,
                "started": mine.started, "overtook": list(mine.overtook)}
        now_text, reserved, flat = await self._guard(self._put_claim(
            keys=[self.claims_key, self.tiers_key, self.key], args=[self.owner, json.dumps(post), self.ttl]))
        return Board(_redis_claims(float(now_text), flat), int(float(reserved)))

    async def drop_claim(self) -> None:
        await self._guard(self._claim_beat(keys=[self.claims_key], args=[self.owner, self.ttl, "1"]))

    async def claims(self) -> list[Claim]:
        await self._sweep()
        now_text, flat = await self._guard(self._list(keys=[self.claims_key]))
        now = float(now_text)
        return [c for c, exp in _redis_claims_expiring(now, flat) if exp >= now]

    async def claim_job(self, job: str, info: dict[str, Any]) -> dict[str, Any] | None:
        await self._sweep()
        held = await self._guard(self._claim(keys=[self.jobs_key], args=[job, self.owner, json.dumps(info), self.ttl]))
        return None if not held else dict(json.loads(held))

    async def reservations(self) -> list[Reservation]:
        await self._sweep()
        now_text, held, orphans, turns = await self._guard(self._read(keys=[self.key, self.orphans_key, self.turns_key]))
        now = float(now_text)
        turn = {f.decode(): _Turn.parse(now, v.decode()) for f, v in zip(turns[::2], turns[1::2])}
        out = []
        for field, value in zip(held[::2], held[1::2]):
            owner, _, batch = field.decode().rpartition("|")
            count, expires, bid = value.decode().split(":", 2)
            t = turn.get(field.decode(), _UNKNOWN)
            if float(expires) >= now:
                out.append(Reservation(owner, int(batch), int(count), bid or None, float(expires) - now, None,
                                       t.granted_for, t.ids, t.sent))
        for field, value in zip(orphans[::2], orphans[1::2]):
            owner, _, batch = field.decode().rpartition("|")
            count, since, expires, holds = value.decode().split(":", 3)
            t = turn.get(field.decode(), _UNKNOWN)
            out.append(Reservation(owner, int(batch), int(count), None, float(expires) - now, max(0.0, now - float(since)),
                                   t.granted_for, t.ids, holds_for=max(0.0, float(holds) - now)))
        return sorted(out, key=lambda r: (r.owner, r.batch))

    async def close(self) -> None:
        await self.client.aclose()


class _Turn(NamedTuple):
    """A reservation's turn as `Reservation` reads it: seconds since it was granted, its ids' print, whether its
    create's body may have gone out (the unknown turn, of a create taken back or an earlier version's: None, None,
    True, as a SQL row's NULLs read)."""

    granted_for: float | None
    ids: str | None
    sent: bool

    @staticmethod
    def parse(now: float, value: str) -> _Turn:
        granted, sent, ids = value.split(":", 2)
        return _Turn(max(0.0, now - float(granted)), ids or None, bool(sent))


_UNKNOWN = _Turn(None, None, True)


def _redis_claims_expiring(now: float, flat: list[Any]) -> list[tuple[Claim, float]]:
    out = []
    for field, value in zip(flat[::2], flat[1::2]):
        r = json.loads(value)
        limit = r.get("limit")
        row = ClaimRow(field.decode(), r["job"], int(r["priority"]), float(r["share"]), int(r["want"]), float(r["vtime"]),
                       int(r["admitted"]), None if limit is None else int(limit), float(r.get("aged") or 0.0), None,
                       int(r.get("overtaken") or 0), None, float(r["claimed_at"]), float(r["expires_at"]),
                       int(r.get("unread") or 0))
        out.append((row.claim(now), row.expires_at))
    return sorted(out, key=lambda p: p[0].owner)


def _redis_claims(now: float, flat: list[Any]) -> list[Claim]:
    return [c for c, _ in _redis_claims_expiring(now, flat)]
