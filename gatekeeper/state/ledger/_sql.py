"""The ledger in a SQL database (SQLite or PostgreSQL): its schema and every step, each one atomic transaction."""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from ..._clock import run_sync
from .._claims import Board, Claim, ClaimPost, ClaimRow, behind, posted, tier_after
from .._db import Db
from ._base import NAMED_FOR, Liveness, Reservation, grant

SQL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reservations (owner TEXT NOT NULL, batch INTEGER NOT NULL, requests INTEGER NOT NULL, "
    "batch_id TEXT, expires_at REAL NOT NULL, PRIMARY KEY (owner, batch))",
    "CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, owner TEXT NOT NULL, info TEXT NOT NULL, expires_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS claims (owner TEXT PRIMARY KEY, job TEXT NOT NULL, priority INTEGER NOT NULL, "
    "share REAL NOT NULL, want INTEGER NOT NULL, vtime REAL NOT NULL, admitted INTEGER NOT NULL, waiting_since REAL, "
    "claimed_at REAL NOT NULL, expires_at REAL NOT NULL)",
    # each submitter's process, so that one that died on its machine is known at once (`Liveness`)
    "CREATE TABLE IF NOT EXISTS processes (owner TEXT PRIMARY KEY, machine TEXT NOT NULL, pid INTEGER NOT NULL, "
    "started TEXT NOT NULL, seen_at REAL NOT NULL)",
    # a dead submitter's unconfirmed creates: requests freed, the size kept as a rival's (`Reservation.dead_for`),
    # the turn for that size held until its reservation would have expired (`holds_until`)
    "CREATE TABLE IF NOT EXISTS orphans (owner TEXT NOT NULL, batch INTEGER NOT NULL, requests INTEGER NOT NULL, "
    "since REAL NOT NULL, expires_at REAL NOT NULL, holds_until REAL NOT NULL, PRIMARY KEY (owner, batch))",
    "CREATE TABLE IF NOT EXISTS tiers (priority INTEGER PRIMARY KEY, vtime REAL NOT NULL)",
    # the print of the workspace each submitter's process lists (`ApiConfig.workspace_print`), carried into its
    # orphans; a table of its own, since an earlier version inserts into `processes` by position
    "CREATE TABLE IF NOT EXISTS workspaces (owner TEXT PRIMARY KEY, workspace TEXT NOT NULL)",
)
# Columns of `claims` added since it was first made (a ledger made by an earlier version gets them on opening).
CLAIM_COLUMNS_ADDED = ("fit_limit INTEGER", "aged REAL NOT NULL DEFAULT 0", "behind_at REAL",
                       "overtaken INTEGER NOT NULL DEFAULT 0", "unread INTEGER NOT NULL DEFAULT 0")
# ... and of the other tables: when a reservation's turn was granted and a print of the custom_ids its create sent
# (NULL: unknown, as in a row an earlier version wrote), carried into its orphan (`Reservation.granted_for`, `ids`),
# and when its create's body began to go out (NULL with a grant recorded: never sent, so it leaves no orphan); an
# orphan's dead process and job, as `status` names them (NULL: an earlier version's, or a claim never posted), and
# the print of the workspace its process listed (NULL: unknown)
COLUMNS_ADDED = {"claims": CLAIM_COLUMNS_ADDED, "reservations": ("granted_at REAL", "ids TEXT", "sent_at REAL"),
                 "orphans": ("granted_at REAL", "ids TEXT", "job TEXT", "machine TEXT", "pid INTEGER", "workspace TEXT")}
# (never a column added to `jobs`, `tiers` or `processes`: submitters of earlier versions, on the same ledger, insert
# into them by position)
_CLAIM_COLUMNS = ("owner, job, priority, share, want, vtime, admitted, fit_limit, aged, behind_at, overtaken, "
                  "waiting_since, claimed_at, expires_at, unread")
_CLAIM_UPSERT = (
    f"INSERT INTO claims ({_CLAIM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner) DO "
    "UPDATE SET job = excluded.job, priority = excluded.priority, share = excluded.share, want = excluded.want, vtime = "
    "excluded.vtime, admitted = excluded.admitted, fit_limit = excluded.fit_limit, aged = excluded.aged, behind_at = "
    "excluded.behind_at, overtaken = excluded.overtaken, waiting_since = excluded.waiting_since, claimed_at = "
    "excluded.claimed_at, expires_at = excluded.expires_at, unread = excluded.unread")


def migrate(db: Db, ddl: Callable[[str], str]) -> list[Any]:
    """Add the newer columns to a ledger made by an earlier version (whose submitters go on working)."""
    out = []
    for table, columns in COLUMNS_ADDED.items():
        empty: Any = db.execute(f"SELECT * FROM {table} WHERE 1 = 0")  # (its description names the columns, on both)
        have = {d[0] for d in empty.description}
        out += [db.execute(ddl(f"ALTER TABLE {table} ADD COLUMN {column}")) for column in columns
                if column.split()[0] not in have]
    return out


def _claim_row(r: Any) -> ClaimRow:
    owner, job, priority, share, want, vtime, admitted, limit, aged, behind_at, overtaken, since, claimed, expires, unread = r
    return ClaimRow(owner, job, int(priority), float(share), int(want), float(vtime), int(admitted),
                    None if limit is None else int(limit), float(aged), None if behind_at is None else float(behind_at),
                    int(overtaken), None if since is None else float(since), float(claimed), float(expires), int(unread))


_UPSERT = ("INSERT INTO reservations (owner, batch, requests, batch_id, expires_at, granted_at, ids, sent_at) VALUES "
           "(?, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT (owner, batch) DO UPDATE SET requests = excluded.requests, batch_id = "
           "excluded.batch_id, expires_at = excluded.expires_at, granted_at = excluded.granted_at, ids = excluded.ids, "
           "sent_at = NULL")
_REGISTER = ("INSERT INTO processes (owner, machine, pid, started, seen_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner) DO "
             "UPDATE SET machine = excluded.machine, pid = excluded.pid, started = excluded.started, seen_at = "
             "excluded.seen_at")
_WORKSPACE = "INSERT INTO workspaces VALUES (?, ?) ON CONFLICT (owner) DO UPDATE SET workspace = excluded.workspace"
_ORPHAN = ("INSERT INTO orphans (owner, batch, requests, since, expires_at, holds_until, granted_at, ids, job, machine, "
           "pid, workspace) SELECT r.owner, r.batch, r.requests, ?, ?, r.expires_at, r.granted_at, r.ids, c.job, p.machine, "
           "p.pid, w.workspace "
           "FROM reservations r LEFT JOIN claims c ON c.owner = r.owner LEFT JOIN processes p ON p.owner = r.owner LEFT "
           "JOIN workspaces w ON w.owner = r.owner "
           "WHERE r.owner = ? AND r.batch_id IS NULL AND r.requests > 0 AND r.expires_at >= ? AND (r.granted_at IS NULL "
           "OR r.sent_at IS NOT NULL) ON CONFLICT (owner, batch) DO UPDATE SET requests = excluded.requests, since = "
           "excluded.since, expires_at = excluded.expires_at, holds_until = excluded.holds_until, granted_at = "
           "excluded.granted_at, ids = excluded.ids, job = excluded.job, machine = excluded.machine, pid = excluded.pid, "
           "workspace = excluded.workspace")


def _settle(db: Db, now: float, owner: str, batch: int, batch_id: str | None) -> bool:
    """A dead submitter's orphan settled by another's listing (`decide._orphans`): its batch named for it (its rerun
    takes the name back with the create: `run.shared._beats.named_for`), or, None, dropped (it made none); False when it is gone."""
    row = db.execute("SELECT granted_at, ids FROM orphans WHERE owner = ? AND batch = ?", (owner, batch)).fetchone()
    if row is None:
        return False
    db.execute("DELETE FROM orphans WHERE owner = ? AND batch = ?", (owner, batch))
    if batch_id is not None:
        db.execute("INSERT INTO reservations (owner, batch, requests, batch_id, expires_at, granted_at, ids, sent_at) "
                   "VALUES (?, ?, 0, ?, ?, ?, ?, ?) ON CONFLICT (owner, batch) DO NOTHING",
                   (owner, batch, batch_id, now + NAMED_FOR, row[0], row[1], now))
    return True


def _age(now: float, at: float | None) -> float | None:
    return None if at is None else max(0.0, now - float(at))


class SqlLedger(abc.ABC):
    """The ledger in a SQL database; each step one atomic transaction (`_tx`), evaluated on the database's clock."""

    ttl: float
    owner: str
    margin: int
    liveness: Liveness | None = None

    @abc.abstractmethod
    def _tx(self, fn: Callable[[Db, float], Any]) -> Any:
        """Run `fn(db, now)` as one atomic step; its result."""

    async def _run(self, fn: Callable[[Db, float], Any]) -> Any:
        """One step, after the submitters that died on this machine are dropped (in the same transaction)."""
        def step(db: Db, now: float) -> Any:
            self._sweep(db, now)
            return fn(db, now)

        return await run_sync(lambda: self._tx(step))

    def _sweep(self, db: Db, now: float) -> None:
        """Drop every other submitter of this machine whose process has ended (`Liveness`): its confirmed batches
        stay named, its unconfirmed creates become orphans, its claims and job registrations go."""
        live = self.liveness
        if live is None or live.machine is None:
            return
        rows = db.execute("SELECT owner, machine, pid, started, seen_at FROM processes WHERE owner <> ? AND "
                          "(machine = ? OR seen_at < ?)", (self.owner, live.machine, now - NAMED_FOR)).fetchall()
        for owner, machine, pid, started, seen in rows:
            # (a record not renewed for NAMED_FOR, on any machine, is long dead: its heartbeat renews it every ttl/3)
            if seen < now - NAMED_FOR or live.ended({"machine": machine, "pid": int(pid), "started": started}):
                db.execute(_ORPHAN, (now, now + NAMED_FOR, owner, now))
                self._release(db, now, "", (), owner=owner)
                for table in ("jobs", "claims", "processes", "workspaces"):
                    db.execute(f"DELETE FROM {table} WHERE owner = ?", (owner,))
        db.execute("DELETE FROM orphans WHERE expires_at < ?", (now,))

    def _register(self, db: Db, now: float) -> None:
        """Record this submitter's process (see `_sweep`)."""
        me = self.liveness.me if self.liveness is not None else None
        if me is not None and me.get("machine"):
            db.execute(_REGISTER, (self.owner, me["machine"], int(me["pid"]), str(me.get("started") or ""), now))
            if me.get("workspace"):
                db.execute(_WORKSPACE, (self.owner, me["workspace"]))

    def _unorphan(self, db: Db, batch: int | None = None) -> None:
        """This submitter's orphans (of one batch, or all): it holds, reserves or releases them itself now."""
        db.execute("DELETE FROM orphans WHERE owner = ?" + ("" if batch is None else " AND batch = ?"),
                   (self.owner,) if batch is None else (self.owner, batch))

    async def settle_orphan(self, owner: str, batch: int, batch_id: str | None) -> bool:
        """Another submitter's orphan settled by this one's listing (`_settle`); False when it is gone already."""
        return owner != self.owner and bool(await self._run(lambda db, now: _settle(db, now, owner, batch, batch_id)))

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int, ids: str | None = None) -> bool:
        def step(db: Db, now: float) -> bool:
            db.execute("DELETE FROM reservations WHERE expires_at < ?", (now,))
            reserved, mine, creating = db.execute(
                "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(CASE WHEN owner = ? THEN requests END), 0), "
                "COUNT(CASE WHEN owner <> ? AND batch_id IS NULL AND requests = ? THEN 1 END) "
                "FROM reservations WHERE NOT (owner = ? AND batch = ?)",
                (self.owner, self.owner, n, self.owner, batch)).fetchone()
            # (another's unknown create keeps the turn for its size alone, the only creates its batch could be taken
            # for; a dead submitter's, no longer than its reservation would have lasted: its TTL after its last heartbeat)
            creating += db.execute("SELECT COUNT(*) FROM orphans WHERE owner <> ? AND requests = ? AND holds_until >= ?",
                                   (self.owner, n, now)).fetchone()[0]
            limit = ceiling - self.margin if ceiling is not None else reserved + max(0, seen - mine) + n
            if not grant(int(reserved), seen, int(mine), n, limit, int(creating)):
                return False
            db.execute(_UPSERT, (self.owner, batch, n, None, now + self.ttl, now, ids))
            self._unorphan(db, batch)
            return True

        return bool(await self._run(step))

    async def hold(self, batch: int, n: int, batch_id: str | None) -> None:
        def step(db: Db, now: float) -> None:
            # (a create taken back: when it was sent is the journal's, not the ledger's to say)
            db.execute(_UPSERT, (self.owner, batch, n, batch_id, now + self.ttl, None, None))
            self._unorphan(db, batch)

        await self._run(step)

    async def sending(self, batch: int) -> None:
        """Its create's body goes out now: until this, the ledger knows no batch came of the reservation."""
        await self._run(lambda db, now: db.execute(
            "UPDATE reservations SET sent_at = ? WHERE owner = ? AND batch = ?", (now, self.owner, batch)))

    async def confirm(self, batch: int, batch_id: str) -> None:
        await self._run(lambda db, now: db.execute(
            "UPDATE reservations SET batch_id = ?, expires_at = ? WHERE owner = ? AND batch = ?",
            (batch_id, now + self.ttl, self.owner, batch)))

    async def release(self, batch: int) -> None:
        def step(db: Db, now: float) -> None:
            self._release(db, now, "AND batch = ?", (batch,))
            self._unorphan(db, batch)

        await self._run(step)

    def _release(self, db: Db, now: float, which: str, args: tuple[Any, ...], owner: str | None = None) -> None:
        """Free the requests (this submitter's, or `owner`'s); a created batch stays named (`NAMED_FOR`)."""
        owner = self.owner if owner is None else owner
        db.execute(f"UPDATE reservations SET requests = 0, expires_at = ? WHERE owner = ? {which} AND batch_id IS NOT NULL "
                   "AND requests > 0", (now + NAMED_FOR, owner, *args))
        db.execute(f"DELETE FROM reservations WHERE owner = ? {which} AND batch_id IS NULL", (owner, *args))

    async def release_all(self) -> None:
        def step(db: Db, now: float) -> None:
            self._release(db, now, "", ())
            self._unorphan(db)
            db.execute("DELETE FROM jobs WHERE owner = ?", (self.owner,))
            db.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))
            db.execute("DELETE FROM processes WHERE owner = ?", (self.owner,))
            db.execute("DELETE FROM workspaces WHERE owner = ?", (self.owner,))

        await self._run(step)

    async def heartbeat(self) -> None:
        def step(db: Db, now: float) -> None:
            self._register(db, now)
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
            rows = db.execute("SELECT owner, batch, requests, batch_id, expires_at, granted_at, ids, granted_at IS NULL "
                              "OR sent_at IS NOT NULL FROM reservations WHERE expires_at >= ? ORDER BY owner, batch",
                              (now,)).fetchall()
            orphans = db.execute("SELECT owner, batch, requests, since, expires_at, granted_at, ids, holds_until, job, "
                                 "machine, pid, workspace FROM orphans WHERE expires_at >= ? ORDER BY owner, batch",
                                 (now,)).fetchall()
            return [*(Reservation(o, b, n, bid, exp - now, None, _age(now, g), ids, bool(sent))
                      for o, b, n, bid, exp, g, ids, sent in rows),
                    *(Reservation(o, b, n, None, exp - now, max(0.0, now - since), _age(now, g), ids,
                                  holds_for=max(0.0, holds - now), job=job, machine=machine,
                                  pid=None if pid is None else int(pid), workspace=ws)
                      for o, b, n, since, exp, g, ids, holds, job, machine, pid, ws in orphans)]

        return list(await self._run(step))

    async def put_claim(self, mine: ClaimPost) -> Board:
        """Post this submitter's claim (`state._claims.posted`: joining its tier; `behind`: the claims a batch it
        admitted went before); everyone's live claims, its own included, and the requests reserved, on the ledger's clock."""
        def step(db: Db, now: float) -> Board:
            db.execute("DELETE FROM claims WHERE expires_at < ?", (now,))
            rows = {r.owner: r for r in map(_claim_row, db.execute(f"SELECT {_CLAIM_COLUMNS} FROM claims").fetchall())}
            reserved, held = db.execute(
                "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(CASE WHEN owner = ? THEN requests END), 0) "
                "FROM reservations WHERE expires_at >= ?", (self.owner, now)).fetchone()
            tier_row = db.execute("SELECT vtime FROM tiers WHERE priority = ?", (mine.priority,)).fetchone()
            tier = 0.0 if tier_row is None else float(tier_row[0])
            row = rows[self.owner] = posted(rows.get(self.owner), self.owner, mine, tier=tier, mine=int(held), now=now,
                                            ttl=self.ttl)
            db.execute(_CLAIM_UPSERT, dataclasses.astuple(row))
            for other in list(rows.values()):
                moved = behind(other, mine, self.owner, now)
                if moved is not None:
                    rows[moved.owner] = moved
                    db.execute("UPDATE claims SET aged = ?, behind_at = ?, overtaken = ?, unread = ? WHERE owner = ?",
                               (moved.aged, moved.behind_at, moved.overtaken, moved.unread, moved.owner))
            if tier_after(tier, mine) != tier:
                db.execute("INSERT INTO tiers VALUES (?, ?) ON CONFLICT (priority) DO UPDATE SET vtime = excluded.vtime",
                           (mine.priority, tier_after(tier, mine)))
            return Board([r.claim(now) for _, r in sorted(rows.items())], int(reserved))

        result: Board = await self._run(step)
        return result

    async def drop_claim(self) -> None:
        await self._run(lambda db, now: db.execute("DELETE FROM claims WHERE owner = ?", (self.owner,)))

    async def claims(self) -> list[Claim]:
        def step(db: Db, now: float) -> list[Claim]:
            rows = db.execute(f"SELECT {_CLAIM_COLUMNS} FROM claims WHERE expires_at >= ? ORDER BY owner", (now,))
            return [_claim_row(r).claim(now) for r in rows.fetchall()]

        return list(await self._run(step))

    async def ping(self) -> None:
        """Reach the ledger, and record this submitter's process there (before any step of its own)."""
        await self._run(self._register)

    async def close(self) -> None:
        return None
