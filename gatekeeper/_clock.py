"""The one clock a run reads and waits on, handed down from the caller: the API layer's retries, retry-after and
token expiry, the lanes, the journal's stamps, the ledgers' time-to-live and the heartbeats all take their time and
their waits from it, so a simulation moves them all at once (`gatekeeper.testing.swarm`). The default is the real
one (`WALL`).

Blocking steps (SQL, hashing a file, planning) go to a worker thread through `run_sync`; a simulation runs them
inline instead (`inline_threads`): a task waiting on a thread looks idle to a simulated clock, which would jump
ahead by however long the thread happened to take.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

import anyio
import anyio.lowlevel

T = TypeVar("T")


class Clock(Protocol):
    """Wall seconds (`now`, Unix time: what the API's times are compared with), a monotonic reading for spans
    (`monotonic`), and a wait (`sleep`)."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The real clock: the system's time, and the event loop's sleep."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


WALL = WallClock()

_INLINE: ContextVar[bool] = ContextVar("gatekeeper_inline_threads", default=False)


async def run_sync(fn: Callable[[], T], *, abandon_on_cancel: bool = False) -> T:
    """`fn()` in a worker thread; inline (after a checkpoint) inside `inline_threads`."""
    if _INLINE.get():
        await anyio.lowlevel.checkpoint()
        return fn()
    return await anyio.to_thread.run_sync(fn, abandon_on_cancel=abandon_on_cancel)


@contextmanager
def inline_threads() -> Iterator[None]:
    """Blocking steps run inline in this context (and the tasks started from it): a simulation's, deterministic."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)
