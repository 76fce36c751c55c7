"""The real-time lane's records: the requests moved to it, each call journaled before it is sent, and each answer
committed with the output's new length before it counts.

A row's state: `queued` (waiting for a call), `sent` (a call is out; a run that finds one on resume cannot know
whether it was processed, so it is counted as a possible double charge and sent again, once: a row lost twice is
never sent a third time), `received` (its answer is here, in `raw`, not yet committed: a stop, a crash or a full
disk before the commit never buys it again), `answered` (its result
is in the output and the results table, with its line kept here: the output can be rebuilt from the journal, as
a batch's is from the API). A request is moved here only from where no batch can still answer it: a batch never
created, or the requests waiting for another attempt (a canceled batch's come through there once it has ended);
or a create whose wait the deadline cut (`move_cut`): its batch, if made, is still reconciled and collected, each
of its answers joined only where the lane has not answered (then the row is `answered` by the batch), and a row of
it whose calls were lost twice waits for that batch rather than ending `gatekeeper_answer_lost`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ._journal_base import JournalBase

MIGRATION = ("0009_realtime", """
    -- the real-time lane: requests moved to it (never in a live batch), each call journaled before it is sent
    CREATE TABLE realtime (line INTEGER PRIMARY KEY, "offset" INTEGER NOT NULL, length INTEGER NOT NULL,
        custom_id TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL, calls INTEGER NOT NULL DEFAULT 0,
        lost INTEGER NOT NULL DEFAULT 0, worst_usd REAL, raw BLOB);
    CREATE INDEX realtime_state ON realtime (state);
    -- the lane that answered a final result: NULL the batch lane, 'realtime' the Messages API
    ALTER TABLE results ADD COLUMN lane TEXT
""")


CUT_MIGRATION = ("0012_cut", """
    -- a create whose wait the deadline cut: its batch row stays (state 'cut', still reconciled, and collected once
    -- adopted), and its requests in the real-time lane name it: each answer joined from whichever lane answered first
    ALTER TABLE batches ADD COLUMN cut INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE realtime ADD COLUMN cut_batch INTEGER
""")
# a lane row that may not be sent now: its calls lost twice, and the cut create's batch, which may answer it, not yet
# collected (nor proven never made, its row then gone)
_WAITS = ("(lost >= 2 AND cut_batch IS NOT NULL AND cut_batch IN (SELECT idx FROM batches WHERE state != 'collected'))")


class LaneRow(NamedTuple):
    line: int
    offset: int
    length: int
    custom_id: str
    attempt: int
    lost: int  # calls whose answer was lost (on the wire, or to a crash)
    calls: int


class Answer(NamedTuple):
    """A final result of the real-time lane, to commit: its output line and what it was billed."""

    line: int
    custom_id: str
    raw: bytes
    type: str
    error_type: str | None
    usage: tuple[str | None, int, int, int, int, int]
    stop_reason: str | None


class LaneRecords:
    """Moving work to the real-time lane, and journaling its calls and answers."""

    def __init__(self, core: JournalBase) -> None:
        self.core = core  # the connection, transactions, meta and events every part shares
        self.db = core.db

    def move_planned(self, idx: int, rows: Iterable[tuple[int, int, int, str, int]], worst: list[float],
                     lost: int = 0) -> int:
        """A batch never created goes to the real-time lane whole, in one transaction: its requests
        (line, offset, length, custom_id, attempt) are queued, the batch is gone. The requests moved. `lost`: the
        possible charges each carries already (1 for a create whose batch may have been made, cut by the deadline)."""
        rows = list(rows)
        with self.core.transaction() as db:
            if db.execute("SELECT state FROM batches WHERE idx = ?", (idx,)).fetchone()[0] != "planned":
                return 0  # (never one already sent)
            db.executemany('INSERT INTO realtime (line, "offset", length, custom_id, attempt, state, worst_usd, lost) '
                           "VALUES (?, ?, ?, ?, ?, 'queued', ?, ?)",
                           [(*r, w, lost) for r, w in zip(rows, worst, strict=True)])
            db.execute("DELETE FROM members WHERE batch = ?", (idx,))
            db.execute("DELETE FROM batches WHERE idx = ?", (idx,))
            self.core.note(db, "to_realtime", idx, requests=len(rows), source="planned")
        return len(rows)

    def move_cut(self, idx: int, rows: Iterable[tuple[int, int, int, str, int]], worst: list[float]) -> int:
        """A create whose wait the deadline cut (its outcome unknown): its requests are queued in the lane, each
        counted as possibly charged once already (the batch it may have made), and the batch stays `cut`, its intent
        kept, to be reconciled still: a batch it made is adopted and its answers collected. The requests moved."""
        rows = list(rows)
        with self.core.transaction() as db:
            if db.execute("SELECT state FROM batches WHERE idx = ?", (idx,)).fetchone()[0] != "intent":
                return 0
            db.executemany('INSERT INTO realtime (line, "offset", length, custom_id, attempt, state, worst_usd, lost, '
                           "cut_batch) VALUES (?, ?, ?, ?, ?, 'queued', ?, 1, ?)",
                           [(*r, w, idx) for r, w in zip(rows, worst, strict=True)])
            db.execute("UPDATE batches SET state = 'cut', cut = 1 WHERE idx = ?", (idx,))
            self.core.note(db, "to_realtime", idx, requests=len(rows), source="cut")
        return len(rows)

    def uncut(self, idx: int) -> None:
        """A cut create reconciled as never made: the batch is gone, and its requests no longer count the charge it
        might have made (a row whose calls were lost twice may then go once more: two charges at most)."""
        with self.core.transaction() as db:
            db.execute("UPDATE realtime SET lost = lost - 1 WHERE cut_batch = ? AND lost > 0", (idx,))
            db.execute("UPDATE realtime SET cut_batch = NULL WHERE cut_batch = ?", (idx,))
            db.execute("DELETE FROM members WHERE batch = ?", (idx,))
            db.execute("DELETE FROM batches WHERE idx = ? AND state = 'cut'", (idx,))
            self.core.note(db, "cut_not_created", idx)

    def cut_rows(self, idx: int) -> dict[int, tuple[str, int]]:
        """line -> (state, lost) of the lane's rows moved from cut create `idx`."""
        return {int(line): (str(state), int(lost)) for line, state, lost in self.db.execute(
            "SELECT line, state, lost FROM realtime WHERE cut_batch = ?", (idx,))}

    def waits(self, line: int) -> bool:
        """Whether a row whose call is lost again waits for its cut create's batch (not ended `answer_lost`)."""
        return bool(self.core.scalar("SELECT COUNT(*) FROM realtime WHERE line = ? AND cut_batch IS NOT NULL AND "
                                     "cut_batch IN (SELECT idx FROM batches WHERE state != 'collected')", line))

    def waiting(self) -> int:
        """Rows that may not be sent now, waiting for their cut create's batch (`_WAITS`)."""
        return int(self.core.scalar(f"SELECT COUNT(*) FROM realtime WHERE state = 'queued' AND {_WAITS}"))

    def joined(self, lines: Iterable[int]) -> set[int]:
        """Of `lines`, those with a final result already (a cut create's batch answered them first)."""
        lines = list(lines)
        if not lines:
            return set()
        marks = ",".join("?" * len(lines))
        return {int(r[0]) for r in self.db.execute(f"SELECT line FROM results WHERE line IN ({marks})", lines)}

    def after_batch(self, answers: list[tuple[bytes, int]]) -> None:
        """Real-time answers (raw, line) that came after a cut create's batch answered their requests: kept with
        their rows for the record, never joined."""
        with self.core.transaction() as db:
            db.executemany("UPDATE realtime SET raw = ? WHERE line = ?", answers)

    def move_pending(self, worst: dict[int, float]) -> int:
        """Every request waiting for another attempt goes to the real-time lane instead of a new batch."""
        with self.core.transaction() as db:
            rows = list(db.execute('SELECT line, "offset", length, custom_id, attempt FROM pending ORDER BY line'))
            db.executemany('INSERT INTO realtime (line, "offset", length, custom_id, attempt, state, worst_usd) '
                           "VALUES (?, ?, ?, ?, ?, 'queued', ?)", [(*r, worst.get(r[0])) for r in rows])
            db.execute("DELETE FROM pending")
            self.core.note(db, "to_realtime", requests=len(rows), source="retry")
        return len(rows)

    def rows(self, limit: int) -> list[LaneRow]:
        """Requests waiting for a call, in line order (one with a call out is `sent`, not among them)."""
        return [LaneRow(*r) for r in self.db.execute('SELECT line, "offset", length, custom_id, attempt, lost, calls '
                                                     f"FROM realtime WHERE state = 'queued' AND NOT {_WAITS} "
                                                     "ORDER BY line LIMIT ?", (limit,))]

    def resume(self) -> int:
        """On resume: calls a crash left out may have been processed; each is counted and sent again."""
        with self.core.transaction() as db:
            n = int(db.execute("SELECT COUNT(*) FROM realtime WHERE state = 'sent'").fetchone()[0])
            if n:
                db.execute("UPDATE realtime SET state = 'queued', lost = lost + 1 WHERE state = 'sent'")
                self.core.note(db, "realtime_unknown", requests=n, why="a call was out when the last run stopped")
        return n

    def received(self, line: int, raw: bytes) -> None:
        """An answer has come: kept before it is committed (what was paid for is never bought again; not over a
        cut create's answer joined while the call was out)."""
        with self.core.transaction() as db:
            db.execute("UPDATE realtime SET state = 'received', raw = ? WHERE line = ? AND state = 'sent'", (raw, line))

    def received_rows(self) -> list[tuple[LaneRow, bytes]]:
        """Answers received by an earlier run and not committed, in line order."""
        return [(LaneRow(*r[:7]), bytes(r[7])) for r in self.db.execute(
            'SELECT line, "offset", length, custom_id, attempt, lost, calls, raw FROM realtime '
            "WHERE state = 'received' ORDER BY line")]

    def sending(self, line: int) -> bool:
        """Before a call's first byte: from here its outcome is unknown until answered. False: the row is no longer
        queued (a cut create's batch answered it meanwhile), and no call may go."""
        with self.core.transaction() as db:
            return bool(db.execute("UPDATE realtime SET state = 'sent', calls = calls + 1 WHERE line = ? AND "
                                   "state = 'queued'", (line,)).rowcount)

    def again(self, line: int, *, lost: bool) -> None:
        """The call will be made again (`lost`: its answer was lost, so it may have been processed: counted)."""
        with self.core.transaction() as db:
            # (a row a cut create's batch answered while the call was out stays answered; a lost call still counts)
            db.execute("UPDATE realtime SET state = CASE WHEN state = 'sent' THEN 'queued' ELSE state END, "
                       "lost = lost + ? WHERE line = ?", (int(lost), line))

    def commit(self, answers: list[Answer], start: int, group: int) -> int:
        """Answers, with the output's new length, in one transaction (the output holds their lines from `start`);
        the new length. `group` (negative) stands for their batch: their lines are contiguous, as a batch's are."""
        pos = start
        rows = []
        for a in answers:
            rows.append((a.line, a.custom_id, a.type, a.error_type, 1, pos, len(a.raw) + 1, *a.usage[:5], group,
                         a.usage[5], a.stop_reason, "realtime"))
            pos += len(a.raw) + 1
        with self.core.transaction() as db:
            db.executemany("INSERT INTO results (line, custom_id, type, error_type, attempts, out_offset, out_len, model, "
                           "input_tokens, output_tokens, cache_creation_tokens, cache_read_tokens, batch, "
                           "cache_write_1h_tokens, stop_reason, lane) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           rows)
            db.executemany("UPDATE realtime SET state = 'answered', raw = ? WHERE line = ?", [(a.raw, a.line) for a in answers])
            self.core.put_meta(db, "output_committed", pos)
        return pos

    def next_group(self) -> int:
        """The next negative stand-in batch number for a commit of real-time answers."""
        return int(self.core.scalar("SELECT COALESCE(MIN(batch), 0) - 1 FROM results WHERE batch < 0"))

    def line_of(self, line: int) -> bytes:
        return bytes(self.core.scalar("SELECT raw FROM realtime WHERE line = ?", line))

    def out(self) -> int:
        """Requests with a call out, or an answer not yet committed."""
        return int(self.core.scalar("SELECT COUNT(*) FROM realtime WHERE state IN ('sent', 'received')"))

    def queued(self) -> int:
        """Requests in the real-time lane waiting for a call."""
        return int(self.core.scalar("SELECT COUNT(*) FROM realtime WHERE state = 'queued'"))

    def unanswered(self) -> int:
        """Requests in the real-time lane without a final result."""
        return int(self.core.scalar("SELECT COUNT(*) FROM realtime WHERE state != 'answered'"))

    def worst(self) -> float:
        return float(self.core.scalar("SELECT COALESCE(SUM(worst_usd), 0) FROM realtime WHERE state != 'answered'"))

    def lost_worst(self) -> float:
        """The worst case of every call whose answer was lost (USD at standard prices; 0 without a budget): each
        may have been processed and billed."""
        return float(self.core.scalar("SELECT COALESCE(SUM(lost * worst_usd), 0) FROM realtime"))

    def probed(self, model: str, usage: dict[str, Any] | None) -> None:
        """A call made only to read `model`'s limits, counted with what it was billed (without a usage, at a
        generous 16 input tokens and its one output token)."""
        probes = dict(self.core.get_meta("realtime_probes") or {})
        calls, tin, tout = probes.get(model, [0, 0, 0])
        u = usage or {}
        probes[model] = [calls + 1, tin + int(u.get("input_tokens") or 16), tout + int(u.get("output_tokens") or 1)]
        with self.core.transaction() as db:
            self.core.put_meta(db, "realtime_probes", probes)
            self.core.note(db, "realtime_probe", model=model)

    def probes(self) -> dict[str, list[int]]:
        """model -> [calls, input tokens, output tokens] of the calls made only to read limits."""
        return dict(self.core.get_meta("realtime_probes") or {})

    def stats(self) -> dict[str, Any]:
        moved, calls, lost = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(calls), 0), COALESCE(SUM(lost), 0) FROM realtime").fetchone()
        return {"moved": int(moved), "calls": int(calls), "possible_double_charges": int(lost)}
