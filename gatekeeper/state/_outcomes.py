"""What a run has produced, as the journal records it: the queue's timeline, the results' totals and spans for
export and reporting, and the output rebuilt from the API."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from ._journal_base import JournalBase
from ._records import TIMELINE_ROWS, Totals


class Outcomes:
    """Readings, events, results totals and spans, and the record of a rebuilt output."""

    def __init__(self, core: JournalBase) -> None:
        self.core = core  # the connection, transactions, meta and events every part shares
        self.db = core.db

    def record_reading(self, at: float, depth: int, ceiling: int | None, ours: int) -> None:
        """One queue reading for the run's timeline; past TIMELINE_ROWS, every other reading is dropped (the
        timeline keeps its whole span at half the resolution, so a 24-hour run stays a few hundred KB).

        Committed without waiting for the disk: a reading lost to a power cut costs the report a point, nothing
        more, and a commit that waits for the disk each poll would cost far more than the reading is worth."""
        if self.db.dialect == "sqlite":
            self.db.execute("PRAGMA synchronous=NORMAL")
        try:
            self._insert_reading(at, depth, ceiling, ours)
        finally:
            if self.db.dialect == "sqlite":
                self.db.execute("PRAGMA synchronous=FULL")

    def _insert_reading(self, at: float, depth: int, ceiling: int | None, ours: int) -> None:
        with self.core.transaction() as db:
            if db.dialect == "postgres":
                db.execute("SET LOCAL synchronous_commit TO OFF")
            db.execute("INSERT INTO timeline (at, depth, ceiling, ours) VALUES (?, ?, ?, ?)", (at, depth, ceiling, ours))
            if int(db.execute("SELECT COUNT(*) FROM timeline").fetchone()[0]) > TIMELINE_ROWS:
                db.execute("DELETE FROM timeline WHERE seq IN (SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) "
                           "AS n FROM timeline) AS numbered WHERE n % 2 = 0) AND seq < (SELECT MAX(seq) FROM timeline)")

    def readings(self) -> list[tuple[float, int, int | None, int]]:
        """(at, depth, ceiling, ours) of the run's queue readings, in time order."""
        return [(r[0], r[1], r[2], r[3]) for r in self.db.execute("SELECT at, depth, ceiling, ours FROM timeline ORDER BY at")]

    def events_of(self, *kinds: str) -> list[tuple[float, int | None, str, dict[str, Any]]]:
        """(at, batch, event, detail) of the journal's events of these kinds, in order."""
        marks = ",".join("?" * len(kinds))
        return [(at, batch, ev, orjson.loads(detail) if detail else {}) for at, batch, ev, detail in self.db.execute(
            f"SELECT at, batch, event, detail FROM events WHERE event IN ({marks}) ORDER BY seq", kinds)]

    def unproven(self) -> Iterator[tuple[str, str, bytes]]:
        """(custom_id, batch id, the answer's line) of each answer kept apart, its batch never proven ours, in input
        order."""
        for cid, batch_id, raw in self.db.execute("SELECT custom_id, batch_id, raw FROM unproven ORDER BY line"):
            yield str(cid), str(batch_id), bytes(raw)

    def committed_output(self) -> int:
        return int(self.core.get_meta("output_committed") or 0)

    def admitted_requests(self) -> int:
        return int(self.core.scalar("SELECT COALESCE(SUM(requests), 0) FROM batches "
                             "WHERE kind IN ('plan', 'primer', 'rest') AND state NOT IN ('planned', 'intent')"))

    def final_count(self) -> int:
        return int(self.core.scalar("SELECT COUNT(*) FROM results"))

    def totals(self) -> Totals:
        """Every figure a summary needs, read in one snapshot."""
        db = self.db
        types = dict(db.execute("SELECT type, COUNT(*) FROM results GROUP BY type").fetchall())
        errors = {k or "unknown": v for k, v in db.execute(
            "SELECT error_type, COUNT(*) FROM results WHERE type = 'errored' GROUP BY error_type")}
        usage = db.execute("SELECT COALESCE(SUM(input_tokens),0), COALESCE(SUM(output_tokens),0), "
                           "COALESCE(SUM(cache_creation_tokens),0), COALESCE(SUM(cache_read_tokens),0), "
                           "COALESCE(SUM(cache_write_1h_tokens),0) FROM results").fetchone()
        by_model = self.usage_by_model()
        return Totals(
            types=types, errors=errors, usage=tuple(usage), usage_by_model=by_model,
            batches=int(self.core.scalar("SELECT COUNT(*) FROM batches WHERE batch_id IS NOT NULL")),
            # (resent in a batch: a request answered by the real-time lane is that lane's, counted there)
            resubmitted=int(self.core.scalar("SELECT COUNT(DISTINCT a.line) FROM attempts a LEFT JOIN results r "
                                             "ON r.line = a.line WHERE r.lane IS NULL")),
            succeeded_after_retry=int(self.core.scalar("SELECT COUNT(*) FROM results WHERE type = 'succeeded' AND attempts > 1 "
                                                       "AND lane IS NULL")),
            final=self.final_count(),
            stop_reasons={k or "unknown": v for k, v in db.execute(
                "SELECT stop_reason, COUNT(*) FROM results WHERE type = 'succeeded' GROUP BY stop_reason")},
        )

    def usage_by_model(self, realtime: bool | None = None) -> list[tuple[Any, ...]]:
        """(model, input, output, cache write, cache read, 1h cache write tokens) summed over the results that were billed: those
        that succeeded, and those whose lines were lost and could not be downloaded again (still paid for). `realtime`:
        only the real-time lane's (True) or only the batch lane's (False)."""
        lane = "" if realtime is None else " AND lane = 'realtime'" if realtime else " AND lane IS NULL"
        return [tuple(r) for r in self.db.execute(
            "SELECT model, SUM(input_tokens), SUM(output_tokens), SUM(cache_creation_tokens), SUM(cache_read_tokens), "
            f"COALESCE(SUM(cache_write_1h_tokens), 0) FROM results WHERE model IS NOT NULL{lane} GROUP BY model")]

    def lane_counts(self) -> dict[str, int]:
        """Final results by the lane that gave them: "batch" and "realtime"."""
        counts = dict(self.db.execute("SELECT COALESCE(lane, 'batch'), COUNT(*) FROM results GROUP BY COALESCE(lane, 'batch')"))
        return {"batch": int(counts.get("batch", 0)), "realtime": int(counts.get("realtime", 0))}

    def taken_lines(self, final_errors: Sequence[str]) -> set[int]:
        """The lines a rerun does not send again: in a batch created or being created (its collection answers them),
        or answered for good (succeeded, or errored with one of `final_errors`); not those waiting for another
        attempt nor those whose result is not final. A set of the lines (8 bytes and a set's slot a line)."""
        out: set[int] = set()
        for first, last in self.db.execute("SELECT first_line, last_line FROM batches WHERE kind = 'plan' AND "
                                           "state != 'planned'"):
            out.update(range(first, last + 1))
        out.update(r[0] for r in self.db.execute(
            "SELECT m.line FROM members m JOIN batches b ON b.idx = m.batch WHERE b.state != 'planned'"))
        out.difference_update(r[0] for r in self.db.execute("SELECT line FROM pending"))
        marks = ",".join("?" * len(final_errors)) or "NULL"
        out.difference_update(r[0] for r in self.db.execute(
            "SELECT line FROM results WHERE NOT (type = 'succeeded' OR (type = 'errored' AND error_type IN "
            f"({marks})))", list(final_errors)))
        return out

    def result_types(self) -> set[str]:
        """Result types and error types present in the results (for checking a filter)."""
        return {r[0] for r in self.db.execute(
            "SELECT DISTINCT type FROM results UNION SELECT DISTINCT error_type FROM results WHERE error_type IS NOT NULL")}

    def result_spans(self, *, types: Sequence[str], error_types: Sequence[str], in_order: bool,
                     stop_reasons: Sequence[str] = ()) -> Iterator[tuple[int, int]]:
        """(offset, length) in the output of each final result matching the filter (a result type, an error type, or
        a succeeded answer's stop reason), in input or arrival order."""
        parts, args = [], []
        if stop_reasons:
            parts.append(f"(type = 'succeeded' AND stop_reason IN ({','.join('?' * len(stop_reasons))}))")
            args += list(stop_reasons)
        if types:
            parts.append(f"type IN ({','.join('?' * len(types))})")
            args += list(types)
        if error_types:
            parts.append(f"error_type IN ({','.join('?' * len(error_types))})")
            args += list(error_types)
        where = " WHERE " + " OR ".join(parts) if parts else ""
        order = "line" if in_order else "out_offset"
        yield from self.db.execute(f"SELECT out_offset, out_len FROM results{where} ORDER BY {order}", args)

    def collected_spans(self) -> list[tuple[int | None, int, int]]:
        """(batch, start, end) in the output of each collected batch's final lines, in output order.

        Each batch's lines are contiguous (one settlement appends them together); batch is None for
        results of journals older than migration 0005, which did not record it."""
        return [(b, start, end) for b, start, end in self.db.execute(
            "SELECT batch, MIN(out_offset), MAX(out_offset + out_len) FROM results GROUP BY batch ORDER BY MIN(out_offset)")]

    def batch_results(self, batch: int | None) -> list[tuple[int, str, int, int]]:
        """(line, custom_id, out_offset, out_len) of one batch's final results, in output order."""
        where = "batch IS NULL" if batch is None else "batch = ?"
        return [(r[0], r[1], r[2], r[3]) for r in self.db.execute(
            f"SELECT line, custom_id, out_offset, out_len FROM results WHERE {where} ORDER BY out_offset",
            () if batch is None else (batch,))]

    def billed_results(self, batch: int) -> dict[str, int]:
        """custom_id -> prompt tokens billed (input, cache writes and reads) of one batch's succeeded results."""
        return dict(self.db.execute(
            "SELECT custom_id, COALESCE(input_tokens, 0) + COALESCE(cache_creation_tokens, 0) + COALESCE(cache_read_tokens, 0) "
            "FROM results WHERE batch = ? AND type = 'succeeded'", (batch,)))

    def batch_error_types(self, batch: int | None) -> dict[int, str | None]:
        """line -> error_type of one batch's final results (gatekeeper's own lines are rebuilt without the API)."""
        where = "batch IS NULL" if batch is None else "batch = ?"
        return dict(self.db.execute(f"SELECT line, error_type FROM results WHERE {where}", () if batch is None else (batch,)))

    def rebuilt(self, moved: list[tuple[int, int, int]], unavailable: list[int], committed: int, counts: dict[str, int]) -> None:
        """The rebuilt output, in one transaction: rows whose place changed (offset, length, line), rows whose
        results could not be downloaded again (now final `gatekeeper_results_unavailable`), its length, and
        the running count of re-downloads."""
        with self.core.transaction() as db:
            db.executemany("UPDATE results SET out_offset = ?, out_len = ? WHERE line = ?", moved)
            db.executemany("UPDATE results SET type = 'errored', error_type = 'gatekeeper_results_unavailable' WHERE line = ?",
                           [(line,) for line in unavailable])
            self.core.put_meta(db, "output_committed", committed)
            total = self.core.get_meta("rebuilt") or {}
            self.core.put_meta(db, "rebuilt", {k: int(total.get(k, 0)) + v for k, v in counts.items()})
            self.core.note(db, "output_rebuilt", **counts)

    def rejections(self) -> Iterator[tuple[int, str | None, str]]:
        """(line, custom_id, reason) of every input line refused before sending, in line order."""
        yield from self.db.execute("SELECT line, custom_id, reason FROM rejections ORDER BY line")
