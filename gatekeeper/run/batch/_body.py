"""A create's body: streamed from the input's bytes in 1 MB pieces, and its digest (what a SigV4 signature covers)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable

import anyio

from ..._errors import InputError
from ...input._sizing import body_chunks
from ...state._journal import BatchRow, Journal
from ..shared._checkpoints import reached

PIECE = 1 << 20  # bytes a piece of the streamed body holds at least (the last one less)


async def body_digest(bodies: Iterable[bytes]) -> str:
    """The sha256 of the create body `stream_body` will send: one pass over its bytes before the intent, letting
    the event loop run between pieces (the journal is read on its thread)."""
    h = hashlib.sha256()
    for k, piece in enumerate(body_chunks(bodies)):
        h.update(piece)
        if k % 256 == 255:
            await anyio.sleep(0)
    return h.hexdigest()


async def stream_body(bodies: Iterable[bytes], row: BatchRow, journal: Journal, path: str,
                      clock: Callable[[], float]) -> AsyncIterator[bytes]:
    """The create body of `row`, from its requests' `bodies`; its length must be the journaled size."""
    sent = 0
    pending: list[bytes] = []
    size = 0
    for piece in body_chunks(bodies):
        pending.append(piece)
        size += len(piece)
        if size >= PIECE:
            sent += size
            yield b"".join(pending)
            pending, size = [], 0
            await anyio.sleep(0)
    sent += size
    if sent != row.bytes:
        raise InputError(f"{path} changed: batch {row.idx} is {sent} bytes now, {row.bytes} when planned")
    # Before the last bytes leave: an intent without this mark cannot have become a batch (the server needs the whole
    # body), so a rerun resends it at once instead of waiting out the reconcile grace.
    journal.mark_body_complete(row.idx, clock())
    reached("body-complete")
    if pending:
        yield b"".join(pending)
