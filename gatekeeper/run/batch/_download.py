"""One verified download of a batch's results, shared by collection, rebuild and the reading of a candidate's
results in reconciliation.

A download is used only when it verifies: every line parses, a request of ours appears once, and the lines number
the batch's total by `request_counts` (or, when the counts are unknown, every request of ours came). A line of
another job's (a batch adopted by listing that was not ours) is counted, never handed on. Whatever fails is an
`IncompleteDownload`, raised before the caller commits anything: the caller rolls back and tries later.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import msgspec

from ..._errors import IncompleteDownload
from ...api._client import ApiClient
from ...decide._downloads import incomplete_reason
from ...decide._headroom import total_requests
from ...decide._settle import Result, read_line


class Download:
    """`async for cid, raw, result in Download(...)`: our lines, each once, read no further than a job reads
    (`read_line`: the answer's text is skipped); at the end, the whole was verified. `foreign` then counts the lines
    of other requests. `ours` None: every request is read (a candidate's). `chunks()`: the same, a list a received
    chunk (the collector's way: its loop steps no generator a line)."""

    def __init__(self, api: ApiClient, batch: dict[str, Any], ours: set[str] | None, label: str,
                 within: float | None = None) -> None:
        self.api, self.batch, self.ours, self.label = api, batch, ours, label
        self.within = within  # seconds its opening may be retried (None: the client's policy)
        self.lines = 0
        self.foreign = 0

    async def __aiter__(self) -> AsyncIterator[tuple[str, bytes, Result]]:
        async with aclosing(self.chunks()) as chunks:  # (a reader that stops closes the stream)
            async for lines in chunks:
                for line in lines:
                    yield line

    async def chunks(self) -> AsyncGenerator[list[tuple[str, bytes, Result]], None]:
        """As `async for`, the lines each received chunk ends at a time (a chunk's lines may be none of ours)."""
        seen: set[str] = set()
        ours, label = self.ours, self.label
        async with aclosing(self.api.iter_result_chunks(self.batch, self.within)) as stream:
            async for raws in stream:
                self.lines += len(raws)
                kept = []
                for raw in raws:
                    cid, result = _parsed(raw, label)
                    if not isinstance(cid, str) or (ours is not None and cid not in ours):
                        self.foreign += 1
                        continue
                    if cid in seen:
                        raise IncompleteDownload(f"{label}: the result line for {cid!r} came twice")
                    seen.add(cid)
                    kept.append((cid, raw, result))
                yield kept
        left = 0 if self.ours is None else len(self.ours) - len(seen)
        reason = incomplete_reason(self.lines, total_requests(self.batch), left)
        if reason:
            raise IncompleteDownload(f"{self.label} ({self.batch.get('id')}): {reason}")


def _parsed(raw: bytes, label: str) -> tuple[Any, Result]:
    try:
        return read_line(raw)
    except msgspec.DecodeError:
        raise IncompleteDownload(f"{label}: a damaged result line ({len(raw)} bytes)") from None
