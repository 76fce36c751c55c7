"""What every part of a run works with, and the reading of the queue they share. Wiring only, no behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..._prices import PriceTable
from ...api._client import ApiClient
from ...api._http import Sleep
from ...api._queue import Connection
from ...decide._reconcile import listing_grace
from ...state._journal import BatchRow, Journal
from ...state._output import OutputFile
from ...state.ledger._base import Ledger
from ._inputs import batch_requests
from ._settings import EventSink, SubmitSettings


@dataclass
class Snapshot:
    """One reading of the queue, with what it says about our own batches."""

    depth: int
    listed: dict[str, dict[str, Any]]  # id -> batch, primary workspace
    unseen: int  # our live requests the listing does not show
    at: float  # the clock when the listing began to be read
    lag: float = 0.0  # the longest this run saw a batch of ours missing from a listing (`listing_grace`)
    bound: float = 0.0  # the least a listing was seen to lag at most (`current_bound`; infinite: never seen current)

    def grace(self, setting: float) -> float:
        """How long after a send this listing proves a batch absent: `setting`, or longer while the listing lags
        or was never seen current."""
        return listing_grace(setting, self.lag, self.bound)


@dataclass(frozen=True)
class RunContext:
    """The input, its settings, the API, the journal and the output of one run, and where it tells what happens."""

    path: str
    settings: SubmitSettings
    conn: Connection
    journal: Journal
    out: OutputFile
    emit: EventSink
    ledger: Ledger
    clock: Callable[[], float]  # the run's one clock (wall seconds): decisions read it
    sleep: Sleep  # and its waits go through this: a test's simulated time drives both
    prices: PriceTable
    check_stop: Callable[[], None]  # raises Interrupted at a safe point once a stop was asked for
    # held while the output and the journal take results: a batch's settlement, or the real-time lane's answers
    write_lock: anyio.Lock = field(default_factory=anyio.Lock)


class Part:
    """A part of a run (preparation, admission, reconciliation, collection, rebuilding, the real-time lane): the run's
    context under short names."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.path, self.settings, self.conn, self.journal, self.out = ctx.path, ctx.settings, ctx.conn, ctx.journal, ctx.out
        self.emit, self.ledger, self.clock, self.prices, self.check_stop = ctx.emit, ctx.ledger, ctx.clock, ctx.prices, ctx.check_stop
        self.api: ApiClient = ctx.conn.primary

    async def wait_for(self, event: anyio.Event, seconds: float) -> bool:
        """Wait for `event`, at most `seconds` of the run's own time (its `sleep`, not the event loop's timer);
        whether it was set."""
        if event.is_set():
            await anyio.lowlevel.checkpoint()  # (a loop that waits on a set event still lets others run)
            return True
        async with anyio.create_task_group() as tg:
            async def timer() -> None:
                await self.ctx.sleep(seconds)
                tg.cancel_scope.cancel()

            tg.start_soon(timer)
            await event.wait()
            tg.cancel_scope.cancel()
        return event.is_set()

    @property
    def user_canceled(self) -> bool:
        return bool(self.journal.get_meta("user_canceled"))

    def _requests_of(self, row: BatchRow) -> Iterator[tuple[int, int, bytes, int]]:
        return batch_requests(self.path, self.journal, row)
