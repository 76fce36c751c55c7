"""The in-process ledger: one submitter, nothing to share (its journal already counts its own creates)."""

from __future__ import annotations

from typing import Any

from .._claims import Board, Claim, ClaimPost
from ._base import DEFAULT_TTL, Reservation


class LocalLedger:
    """One submitter in one process: nothing to share."""

    ttl = DEFAULT_TTL
    owner = ""

    async def reserve(self, batch: int, n: int, ceiling: int | None, seen: int, ids: str | None = None) -> bool:
        return True

    async def hold(self, batch: int, n: int, batch_id: str | None) -> None:
        return None

    async def sending(self, batch: int) -> None:
        return None

    async def settle_orphan(self, owner: str, batch: int, batch_id: str | None) -> bool:
        return False

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

    async def put_claim(self, mine: ClaimPost) -> Board:
        return Board([], 0)  # (alone: its turn always)

    async def drop_claim(self) -> None:
        return None

    async def claims(self) -> list[Claim]:
        return []

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None
