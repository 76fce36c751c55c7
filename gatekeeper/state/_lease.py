"""The lease of a shared journal's job: one live run a job, across hosts, checked by every write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from .._errors import JobLive, JournalError
from ._db import Db, PgDb
from ._journal_base import JournalBase


class Lease:
    """Taking, renewing, checking and releasing the job's lease (PostgreSQL only)."""

    def __init__(self, core: JournalBase) -> None:
        self.core = core  # the connection, transactions, meta and events every part shares
        self.db = core.db
        self.holder_id: str | None = None  # the lease this run holds

    def take(self, holder: str, info: dict[str, Any], ttl: float,
                   ended: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Hold the job for this run; `JobLive` naming the other host when its lease has not expired, unless
        `ended` (given the info its holder recorded) says that run has certainly ended."""
        with self.core.transaction() as db:
            row = db.execute("SELECT holder, info, EXTRACT(EPOCH FROM now() - heartbeat_at), ttl, heartbeat_at "
                             "FROM gatekeeper.jobs WHERE name = ? FOR UPDATE", (self.core.job,)).fetchone()
            other, other_info, age, other_ttl, seen = row
            where = orjson.loads(other_info) if other_info else {}
            live = other is not None and other != holder and age is not None and age <= other_ttl
            if live and not (ended is not None and ended(where)):
                raise JobLive(f"job {self.core.job!r} is running on {where.get('host', 'another host')} (pid {where.get('pid')}), "
                              f"last seen {float(age):.0f} s ago at {seen:%Y-%m-%d %H:%M:%S %Z}; its lease expires in "
                              f"{float(other_ttl) - float(age):.0f} s ({float(other_ttl):.0f} s after its last heartbeat)",
                              setting="job")
            db.execute("UPDATE gatekeeper.jobs SET holder = ?, info = ?, heartbeat_at = now(), ttl = ? WHERE name = ?",
                       (holder, orjson.dumps(info).decode(), ttl, self.core.job))
            if other is not None and other != holder:
                self.core.note(db, "lease_taken_over", previous=where or None, why="ended" if live else "expired")
        self.holder_id = holder
        self.core.guard = self.check  # every later write first checks the lease is still ours

    def check(self) -> None:
        # KEY SHARE: a takeover (SELECT ... FOR UPDATE) waits for this transaction; the heartbeat's UPDATE does not.
        row = self.db.execute("SELECT holder, info FROM gatekeeper.jobs WHERE name = ? FOR KEY SHARE", (self.core.job,)).fetchone()
        if row is None or row[0] != self.holder_id:
            where = orjson.loads(row[1]) if row and row[1] else {}
            raise JobLive(f"job {self.core.job!r} was taken over by {where.get('host', 'another run')} after this run's lease "
                          "expired; this run stops without recording more", setting="lease_ttl")

    def renew(self, db: Db | None = None) -> bool:
        """The heartbeat (on its own connection, `db`): False when the lease is no longer ours."""
        cur = (db or self.db).execute("UPDATE gatekeeper.jobs SET heartbeat_at = now() WHERE name = ? AND holder = ?",
                                      (self.core.job, self.holder_id))
        return cur.rowcount == 1

    def holder(self) -> dict[str, Any] | None:
        """Who holds this shared journal's job now (host, pid, state_dir, last_seen seconds ago); None when nobody does."""
        row = self.db.execute("SELECT info, EXTRACT(EPOCH FROM now() - heartbeat_at), ttl FROM gatekeeper.jobs WHERE name = ? "
                              "AND holder IS NOT NULL", (self.core.job,)).fetchone()
        if row is None or row[1] is None or float(row[1]) > float(row[2]):
            return None
        return {**(orjson.loads(row[0]) if row[0] else {}), "last_seen": round(float(row[1]), 1)}

    def release(self) -> None:
        if self.holder_id is not None:
            self.db.execute("UPDATE gatekeeper.jobs SET holder = NULL, heartbeat_at = NULL WHERE name = ? AND holder = ?",
                            (self.core.job, self.holder_id))
            self.holder_id = None
            self.core.guard = None

    def second_connection(self) -> Db:
        """Another connection to the same journal (the lease's heartbeat runs on it, in a thread)."""
        assert isinstance(self.db, PgDb)
        return PgDb(self.db.url, self.core.where, JournalError, schema=self.db.schema, ride_out=self.db.ride_out)
