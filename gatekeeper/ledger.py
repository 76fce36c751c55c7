"""The admission ledger: reservations against the organization's ceiling, shared by submitters.

`LocalLedger` (the default) serves one submitter: its own journal already
counts its creates, so it grants every reservation. The shared ledgers
(SQLite on one host, Redis across hosts; see `open_ledger`) make several
submitters that cannot see each other's batches admit against one ceiling.
"""

from __future__ import annotations

from typing import Protocol


class Ledger(Protocol):
    async def observe(self, depth: int) -> None:
        """The live depth this submitter just read."""

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool:
        """Reserve n requests for `batch`; False when the ceiling cannot take them now."""

    async def confirm(self, batch: int, batch_id: str) -> None:
        """The reservation's batch was created."""

    async def release(self, batch: int) -> None:
        """The batch ended, or its create was definitely refused."""

    async def release_all(self) -> None:
        """The submitter is done."""


class LocalLedger:
    """One submitter in one process: nothing to share."""

    async def observe(self, depth: int) -> None:
        return None

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int) -> bool:
        return True

    async def confirm(self, batch: int, batch_id: str) -> None:
        return None

    async def release(self, batch: int) -> None:
        return None

    async def release_all(self) -> None:
        return None
