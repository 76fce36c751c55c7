"""Member-listed batches: those that list their requests (retries; priming's primers and rests), the lines priming
claims from the input ranges, rounds of priming, and re-cutting what is not yet sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._db import Db
from ._journal_base import JournalBase
from ._records import Group, PendingRow

Size = Callable[[list[PendingRow]], int]  # the create body's size of these requests


class Groups:
    """Reading and replacing member-listed batches."""

    def __init__(self, core: JournalBase) -> None:
        self.core = core  # the connection, transactions, meta and events every part shares
        self.db = core.db

    def skipped_lines(self, first: int, last: int) -> set[int]:
        """The lines an input-range batch over [first, last] does not send: rejected, or claimed by priming."""
        return {r[0] for r in self.db.execute("SELECT line FROM rejections WHERE line BETWEEN ? AND ? UNION "
                                              "SELECT line FROM claimed WHERE line BETWEEN ? AND ?", (first, last) * 2)}

    def primer_endings(self) -> list[tuple[int, bool, str | None, float | None]]:
        """Each primer batch: (its round, whether it has ended, its `ended_at` as the API reported it, when this
        journal saw it end). `decide._gate.rounds_ended` weighs them."""
        return [(int(r), state in ("ended", "collected"), api_at, None if seen is None else float(seen))
                for r, state, api_at, seen in self.db.execute(
                    "SELECT b.cache_round, b.state, b.ended_at, MAX(e.at) FROM batches b LEFT JOIN events e "
                    "ON e.batch = b.idx AND e.event = 'ended' WHERE b.kind = 'primer' GROUP BY b.idx, b.cache_round, "
                    "b.state, b.ended_at")]

    def next_round(self) -> int:
        """The number a new round of priming takes."""
        return int(self.core.scalar("SELECT COALESCE(MAX(cache_round), -1) + 1 FROM batches"))

    def priming(self) -> dict[str, int] | None:
        """How the job is primed, from its batches: rounds, requests sent as primers, and the rest (None: not primed)."""
        rows = {kind: (rounds, requests) for kind, rounds, requests in self.db.execute(
            "SELECT kind, COUNT(DISTINCT cache_round), SUM(requests) FROM batches WHERE kind IN ('primer', 'rest') "
            "GROUP BY kind")}
        if "primer" not in rows:
            return None
        return {"rounds": int(rows["primer"][0]), "primers": int(rows["primer"][1]),
                "rest": int(rows.get("rest", (0, 0))[1])}

    def members(self, idx: int) -> list[tuple[int, int, int, str, int]]:
        """(line, offset, length, custom_id, attempt) of a member-listed batch (retry, primer, rest), in line order."""
        return list(self.db.execute(
            'SELECT line, "offset", length, custom_id, attempt FROM members WHERE batch = ? ORDER BY line', (idx,)))

    def pending_rows(self) -> list[tuple[int, int, int, str, int]]:
        """(line, offset, length, custom_id, attempt) of every request waiting for another attempt, in line order."""
        return list(self.db.execute('SELECT line, "offset", length, custom_id, attempt FROM pending ORDER BY line'))

    def pending_count(self) -> int:
        return int(self.core.scalar("SELECT COUNT(*) FROM pending"))

    # -- changes, one transaction each ---------------------------------------

    def plan_retries(self, pack: Callable[[list[PendingRow]], list[list[PendingRow]]], size: Size) -> tuple[int, int]:
        """Turn every request waiting for another attempt into retry batches cut by `pack`; (requests, batches)."""
        rows = [PendingRow(*r) for r in self.db.execute(
            'SELECT line, "offset", length, custom_id, attempt FROM pending ORDER BY line')]
        groups = pack(rows)
        with self.core.transaction() as db:
            self.insert(db, _next_idx(db), [("retry", None, g) for g in groups], size)
            db.execute("DELETE FROM pending")
            self.core.note(db, "resubmission_planned", requests=len(rows), batches=len(groups))
        return len(rows), len(groups)

    def recut(self, batch_size: int, ranges: list[tuple[Any, ...]], groups: list[Group], size: Size) -> None:
        """Replace every planned batch by smaller ones, atomically, and record the new size (a resume sees this cut).

        `ranges`: (requests, bytes, first_line, last_line, start, end, first_cid, last_cid) of new input-range
        batches; `groups`: (kind, round, requests) of new member-listed batches.
        """
        with self.core.transaction() as db:
            old = [r[0] for r in db.execute("SELECT idx FROM batches WHERE state = 'planned'")]
            idx = _drop_planned(db, old)
            for k, r in enumerate(ranges):
                db.execute(
                    "INSERT INTO batches (idx, kind, requests, bytes, first_line, last_line, start_offset, end_offset, "
                    "first_custom_id, last_custom_id, state) VALUES (?, 'plan', ?, ?, ?, ?, ?, ?, ?, ?, 'planned')",
                    (idx + k, *r))
            self.insert(db, idx + len(ranges), groups, size)
            settings = {**(self.core.get_meta("settings") or {}), "batch_size": batch_size}
            self.core.put_meta(db, "settings", settings)
            self.core.note(db, "recut", batch_size=batch_size, replaced=len(old), batches=len(ranges) + len(groups))

    def reprime(self, old: list[int], groups: list[Group], size: Size, life: float | None) -> int:
        """Replace the planned batches `old` (a lapsed round's rest) by `groups` (a new round's primer and rest), and
        record the new round's life; in one transaction. The new round's number."""
        with self.core.transaction() as db:
            self.insert(db, _drop_planned(db, old), groups, size)
            new = int(groups[0][1]) if groups and groups[0][1] is not None else -1
            report = self.core.get_meta("report") or {}
            lives = {**((report.get("priming") or {}).get("lives") or {}), str(new): life}
            self.core.put_meta(db, "report", {**report, "priming": {"lives": lives}})
            self.core.note(db, "reprimed", round=new, replaced=len(old), batches=len(groups))
        return new

    def insert(self, db: Db, idx: int, groups: list[Group], size: Size) -> None:
        for kind, cache_round, g in groups:
            first, last = g[0], g[-1]
            db.execute(
                "INSERT INTO batches (idx, kind, requests, bytes, first_line, last_line, start_offset, end_offset, "
                "first_custom_id, last_custom_id, state, cache_round) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned', ?)",
                (idx, kind, len(g), size(g), first.line, last.line, first.offset, last.offset + last.length,
                 first.custom_id, last.custom_id, cache_round))
            db.executemany("INSERT INTO members VALUES (?, ?, ?, ?, ?, ?)", [(idx, *r) for r in g])
            idx += 1


def _drop_planned(db: Db, old: list[int]) -> int:
    """Delete the planned batches `old` and their members (never one already sent); the next free index."""
    if not old:
        return _next_idx(db)
    marks = ",".join("?" * len(old))
    db.execute(f"DELETE FROM members WHERE batch IN ({marks}) AND batch IN "
               f"(SELECT idx FROM batches WHERE state = 'planned')", old)
    db.execute(f"DELETE FROM batches WHERE idx IN ({marks}) AND state = 'planned'", old)
    return _next_idx(db)


def _next_idx(db: Db) -> int:
    return int(db.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM batches").fetchone()[0])
