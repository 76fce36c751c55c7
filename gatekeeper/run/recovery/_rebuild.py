"""Rebuilding the output from the API, when a job resumes where its results file is missing or short.

A job kept in a shared journal can resume on another host, whose disk never had the
output. The journal still knows every final result and the batch it came from, and the
API keeps results for 29 days: each collected batch is downloaded again, verified as a
first download is (`_downloads`), and its final lines are written in the order they had.
Nothing is resent because of it. A batch whose results can no longer be had (archived,
past retention) gets `gatekeeper_results_unavailable` lines for its results instead.

The batches already whole in the file are kept (`kept_spans`); a rebuild cut short
resumes from the last whole batch. Offsets that changed (a line of gatekeeper's own is
written again with today's wording) and the output's length are committed together at
the end, after the file is on disk.
"""

from __future__ import annotations

import bisect
import os
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

import orjson

from ..._errors import IncompleteDownload, NotFoundError, OutputError, RateLimited, ServerError, TransportError, os_error
from ...decide._downloads import MISSING_RESULT, RESULTS_UNAVAILABLE, Missing, download_wait
from ...decide._settle import errored_line
from ...state._journal import BatchRow, Journal
from ..batch._collect import custom_id, missing_verdict
from ..batch._download import Download
from ..shared._part import Part, RunContext

OWN_LINES = (MISSING_RESULT, RESULTS_UNAVAILABLE)  # written by gatekeeper, not downloaded: rebuilt from the journal
PlacedRow = tuple[int, str, int, int]  # line, custom_id, out_offset, out_len


def kept_spans(ends: list[int], have: int) -> int:
    """How many leading batches (their output spans ending at `ends`, ascending) lie whole in a file of `have` bytes."""
    return bisect.bisect_right(ends, have)


class Rebuilder(Part):
    """Rebuilds one job's output from the API; `run()` returns what it did, or None when the file was whole."""

    def __init__(self, ctx: RunContext, *, wait: Callable[[float], Awaitable[None]]) -> None:
        super().__init__(ctx)
        self.wait = wait  # (the loop's stoppable wait)
        self.moved: list[tuple[int, int, int]] = []  # (offset, length, line) of rows whose place changed
        self.unavailable: list[int] = []
        self.counts = {"batches": 0, "results": 0, "unavailable": 0}

    async def run(self) -> dict[str, int] | None:
        committed, have = self.journal.outcomes.committed_output(), self.out.size()
        if have >= committed:
            return None
        spans = self.journal.outcomes.collected_spans()
        keep = kept_spans([end for _, _, end in spans], have)
        if keep and not self._whole(spans[keep - 1][0]):
            keep = 0  # the file is not this job's output as recorded: rebuild all of it
        pos = spans[keep - 1][2] if keep else 0
        self.out.truncate_to(pos)
        self.emit("output_rebuilding", {"output": self.out.path, "have": have, "committed": committed,
                                        "batches": len(spans) - keep, "kept_batches": keep})
        for batch, _, _ in spans[keep:]:
            self.check_stop()  # stopped between batches: the whole ones stay, a rerun goes on from there
            pos = await self._batch(batch, pos)
        self.journal.outcomes.rebuilt(self.moved, self.unavailable, pos, self.counts)
        self.emit("output_rebuilt", dict(self.counts))
        return self.counts

    def _whole(self, batch: int | None) -> bool:
        """The last line the journal places for `batch` is in the file, as that request's result."""
        _, cid, offset, length = self.journal.outcomes.batch_results(batch)[-1]
        try:
            line = next(self.out.spans(iter([(offset, length)]), offset + length), b"")
            return bool(line.endswith(b"\n") and orjson.loads(line).get("custom_id") == cid)
        except (orjson.JSONDecodeError, AttributeError, OSError):
            return False

    async def _batch(self, batch: int | None, pos: int) -> int:
        rows = self.journal.outcomes.batch_results(batch)
        if batch is not None and batch < 0:  # (answers of the real-time lane: the journal keeps their lines)
            with self.out.appending(pos) as f:
                for r in rows:
                    pos = self._place(f, pos, r, (self.journal.lane.line_of(r[0]) + b"\n", False))
            return pos  # (not a batch: nothing was downloaded)
        own = self.journal.outcomes.batch_error_types(batch)
        row = self.journal.batch(batch) if batch is not None else None
        lines: Spooled | None = None  # None: the API no longer has them (or, before migration 0005, no batch is known)
        if row is not None and any(own[line] not in OWN_LINES for line, *_ in rows):
            lines = await self._download(row)
        try:
            with self.out.appending(pos) as f:
                for line, cid, offset, length in rows:
                    pos = self._place(f, pos, (line, cid, offset, length), self._line(cid, own[line], lines))
        finally:
            if lines is not None:
                lines.close()
        self.counts["batches"] += 1
        return pos

    def _line(self, cid: str, error_type: str | None, lines: Spooled | None) -> tuple[bytes, bool]:
        """The bytes of one result's line, and whether it is now a results-unavailable line."""
        if error_type in OWN_LINES:
            what = "no result line for this request" if error_type == MISSING_RESULT else "results unavailable"
            return errored_line(cid, str(error_type), f"{what}; written again when the output was rebuilt") + b"\n", False
        data = lines.get(cid) if lines is not None else None
        if data is None:
            return errored_line(cid, RESULTS_UNAVAILABLE, "results unavailable when the output was rebuilt: the API no "
                                "longer has them; not resent (processed, may have been billed)") + b"\n", True
        return data, False

    def _place(self, f: BinaryIO, pos: int, row: PlacedRow, made: tuple[bytes, bool]) -> int:
        line, _, offset, length = row
        data, unavailable = made
        f.write(data)
        if (offset, length) != (pos, len(data)):
            self.moved.append((pos, len(data), line))
        if unavailable:
            self.unavailable.append(line)
            self.counts["unavailable"] += 1
        else:
            self.counts["results"] += 1
        return pos + len(data)

    async def _download(self, row: BatchRow) -> Spooled | None:
        """The batch's verified download, or None when the API no longer has it."""
        failures = 0
        while True:
            try:
                return await self._fetch(row)
            except (IncompleteDownload, TransportError, ServerError, RateLimited, NotFoundError) as exc:
                failures += 1
                if isinstance(exc, NotFoundError) and self._gone(row, None):
                    return None
                delay = download_wait(failures, self.settings.min_backoff, self.settings.max_backoff)
                self.emit("download_failed", {"batch": row.idx, "id": row.batch_id, "reason": str(exc),
                                              "attempt": failures, "retry_in": delay, "rebuild": True})
                await self.wait(delay)

    def _gone(self, row: BatchRow, batch: dict[str, Any] | None) -> bool:
        return missing_verdict(row, batch, self.settings, self.clock()).action is Missing.UNAVAILABLE

    async def _fetch(self, row: BatchRow) -> Spooled | None:
        batch = await self.api.retrieve_batch(str(row.batch_id))
        if batch.get("archived_at") or not batch.get("results_url"):
            if self._gone(row, batch):
                return None
            raise IncompleteDownload(f"batch {row.idx}: results not available yet")  # waited out, as at collection
        ours = {custom_id(body) for _, _, body, _ in self._requests_of(row)}
        spool = Spooled(self.journal)
        try:
            # (a foreign line, of a wrong adoption settled at collection, is counted by the download, not kept)
            async for cid, raw, _ in Download(self.api, batch, ours, f"batch {row.idx}"):
                spool.add(cid, raw)
            spool.file.flush()
        except BaseException:
            spool.close()
            raise
        return spool


class Spooled:
    """One batch's verified download on disk, its lines found by custom_id (memory: the index, not the lines)."""

    def __init__(self, journal: Journal) -> None:
        try:
            # Closed by close() once the batch is written (it outlives this call, so no `with`).
            self.file: BinaryIO = tempfile.TemporaryFile(dir=journal.state_dir, prefix="rebuild-")  # noqa: SIM115
        except OSError as exc:
            raise OutputError(os_error(exc, f"cannot spool a download in {journal.state_dir}"), setting="state_dir") from exc
        self.index: dict[str, tuple[int, int]] = {}

    def add(self, cid: str, raw: bytes) -> None:
        self.index[cid] = (self.file.tell(), len(raw) + 1)
        self.file.write(raw + b"\n")

    def get(self, cid: str) -> bytes | None:
        """One line, read in one call (every `add` is done and flushed by then)."""
        at = self.index.get(cid)
        return None if at is None else os.pread(self.file.fileno(), at[1], at[0])

    def close(self) -> None:
        self.file.close()


