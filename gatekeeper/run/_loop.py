"""The submit loop: observe the queue, collect what ended, reconcile, admit what fits, wait.

Every step that changes the world is journaled before it is taken (the intent
before a create) or in the same transaction as its effect (results rows with
the output file's committed length), so the loop can be killed anywhere and a
rerun of the same command continues: nothing lost, nothing submitted twice.

The run's parts each own one concern: `_prepare` (before the first reading), `_observe` (reading the queue),
`_admit` (what goes out, and each create), `_reconciler` (unknown creates),
`_collect` (results); this module is the loop that turns them. The decisions are
pure functions in `decide/`. Time comes in as `clock` (wall seconds: the journal's
own, unless a test gives one) and `sleep`, and every part reads and waits on them
(`Part.wait_for`), the real-time lane included, so grace periods, backoff and pacing
are tested without waiting. `submit` hands down one `Clock` for all of them, the API's and the heartbeats' too.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import orjson

from .._errors import Interrupted, ServerError, TransportError, UsageError
from .._prices import PriceTable, load_prices
from ..api._http import Sleep
from ..api._queue import Connection
from ..decide._admission import FIRST_READING_WAIT, reading_wait
from ..decide._deadline import SLACK
from ..decide._headroom import format_time
from ..input._sizing import Limits, body_size, pack_rows
from ..state._journal import BatchState, Journal
from ..state._output import OutputFile
from ..state.ledger._base import Ledger
from ..state.ledger._local import LocalLedger
from .batch._admit import Admitter
from .batch._collect import Collector
from .batch._observe import Observer
from .batch._turns import READ_FOR_OTHERS
from .realtime._deadline import DeadlineKeeper, deadline_of
from .realtime._realtime import CALLS_OUT_WAIT, RealtimeLane
from .recovery._rebuild import Rebuilder
from .recovery._reconciler import Reconciler
from .shared._beats import take_reservations_back
from .shared._beside import beside
from .shared._cancel import REFUSED, cancel_batch, refused_policy
from .shared._part import Part, RunContext, Snapshot
from .shared._prepare import Preparation
from .shared._settings import EventSink, SubmitSettings
from .shared._summary import Summary, summarize

ResultSink = Callable[[str, dict[str, Any]], None]
"""`on_result(custom_id, result)`: called once per final result, after it is committed (a resumed run first hands
it every result earlier runs committed); `result` is the result line's object."""
OUTAGE_WAITS = (5.0, 60.0)  # seconds between readings while the API does not answer: the first, the longest


async def read_through_outage(observe: Callable[[], Awaitable[Snapshot]], wait: Callable[[float], Awaitable[None]],
                              emit: EventSink, check_stop: Callable[[], None]) -> Snapshot:
    """A reading of the queue. The API answered before (or the run would have stopped at its start), so a reading
    that fails past its retries (the network down, 5xx) is waited out and said, never a reason to stop a run that
    must finish (a cold tester: the fake stopped mid-run, exit 1 after 17 s)."""
    pause = OUTAGE_WAITS[0]
    while True:
        try:
            return await observe()
        except (TransportError, ServerError) as exc:
            check_stop()
            emit("api_unreachable", {"error": str(exc), "retry_in": pause,
                                     "policy": "the reading is tried again until the API answers"})
            await wait(pause)
            check_stop()
            pause = min(pause * 2.0, OUTAGE_WAITS[1])


class SubmitLoop(Part):
    """The loop of one submit run over one input and one state directory (the job: its journal) that turns the
    lanes."""

    def __init__(
        self,
        input_path: str,
        settings: SubmitSettings,
        conn: Connection,
        journal: Journal,
        *,
        out_path: str,
        emit: EventSink,
        stop: anyio.Event,
        on_result: ResultSink | None = None,
        ledger: Ledger | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Sleep = anyio.sleep,
        prices: PriceTable | None = None,
    ) -> None:
        clock = clock or journal.now  # (one clock: the one the journal stamps with)
        super().__init__(RunContext(
            path=input_path, settings=settings, conn=conn, journal=journal, out=OutputFile(out_path), emit=emit,
            ledger=ledger or LocalLedger(), clock=clock, sleep=sleep, prices=prices or load_prices(), check_stop=self._check_stop))
        self.stop = stop
        self.sleep = sleep
        self.started = clock()
        self.readings = 0  # readings of the queue this run (the first waits are short: `reading_wait`)
        self.preparation = Preparation(self.ctx)
        self.admitter = Admitter(self.ctx)
        self.collector = Collector(self.ctx, on_result=on_result)
        self.observer = Observer(self.ctx, lambda: self.admitter.ceiling)
        self.reconciler = Reconciler(self.ctx, self.observer.note_lag)
        self.cancel_sent: set[str] = set()  # batch ids this run has asked the API to cancel
        self.lane = RealtimeLane(self.ctx, write_lock=self.ctx.write_lock, stop=stop,
                                 on_result=on_result)
        self.keeper = None if settings.deadline is None else DeadlineKeeper(self.ctx, self._deadline(), self.lane)
        if self.keeper is not None:
            self.collector.retry_within, self.collector.slack = self._reading_due, self.keeper.slack
            self.reconciler.latest = self.keeper.deadline - self.keeper.slack() - SLACK
            self.reconciler.to_realtime, self.reconciler.takes = self.keeper.move_unknown, self.keeper.takes
        self._committed_before = -1  # the output's committed length when this run began

    def _deadline(self) -> float:
        """The job's deadline: resolved once, by its first run, and kept in the journal. A rerun or a retry that reads
        `6h` or `06:00Z` again would move it (and report a missed deadline met); a setting that now resolves
        differently is said, not taken."""
        kept = self.journal.get_meta("deadline")
        if kept is None:
            return deadline_of(self.settings, self.clock())
        try:
            again: float | None = deadline_of(self.settings, self.clock())
        except UsageError:
            again = None  # (an absolute time that has passed since: the kept one stands)
        if again is None or abs(again - float(kept)) > 1.0:
            self.emit("deadline_kept", {"at": format_time(float(kept)), "given": None if again is None else format_time(again),
                                        "why": "a job's deadline is resolved once, by its first run"})
        return float(kept)

    async def prepare(self) -> None:
        """Read the ceiling; plan the input into the journal, or check it is the same input on resume."""
        ceiling, batch_size = await self.preparation.prepare()
        self.admitter.ceiling, self.admitter.batch_size = ceiling, batch_size
        if self.keeper is not None:
            self.lane.paces.limits = self.preparation.realtime_limits

    # -- the loop -----------------------------------------------------------

    async def run(self) -> Summary:
        rebuilt = await Rebuilder(self.ctx, wait=self._wait).run()
        if rebuilt is None:
            self.out.truncate_to(self.journal.outcomes.committed_output())
        self._committed_before = self.journal.outcomes.committed_output()
        replay(self.out, self.collector.on_result, self._committed_before)
        await take_reservations_back(self.journal, self.ledger)
        if self.keeper is not None and self.journal.get_meta("deadline") is None:
            self.journal.set_meta("deadline", self.keeper.deadline, "deadline", at=self.keeper.deadline)
        if self.keeper is None and not self.journal.lane.unanswered():
            await self._loop()
        else:
            await beside(self._loop_then_settle, self.lane.run)  # (a rerun without the deadline finishes what moved)
        return await self._finish()

    async def _finish(self) -> Summary:
        await self.ledger.release_all()
        if self.ledger.owner:  # (on a shared ledger: its priority, share and how long it waited for others)
            self.journal.set_meta("shares", self.admitter.turns.to_json())
        # A run that commits nothing new (a rerun that only rebuilds a lost output) leaves the time the job finished
        # as it was: the deadline was met, or missed, by the run that finished it.
        if self.journal.get_meta("finished_at") is None or self.journal.outcomes.committed_output() != self._committed_before:
            self.journal.set_meta("finished_at", self.clock())
        summary = self.summary()
        self.emit("finished", summary.to_json())
        return summary

    async def _loop(self) -> None:
        while True:
            self._check_stop()
            snap = await read_through_outage(self.observer.observe, self._wait, self.emit, self._check_stop)
            await self.cancel_live()
            await self.reconciler.reconcile(snap)
            await self._steer(snap)
            # Admission before collection: downloading the batches that ended can take a while, and the room
            # they left is already in this reading; the queue stays full meanwhile.
            await self.admitter.admit_round(snap)
            await self.collector.collect_ended(snap)
            await self._steer(snap)  # (what collection sent back for another attempt, before it forms a batch)
            self.form_retry_batches()
            now = self.admitter.budget_now()  # (a stop decided here ends the run below, not a poll later)
            if self.done():
                break
            self.readings += 1
            wait = 0.0 if now else self._cut(reading_wait(self.readings, self.settings.interval))
            self.progress(snap, wait)
            await self._wait(wait)

    def _reading_due(self) -> float | None:
        """Seconds a download's failure may be ridden out before it is put off, under a deadline: until the deadline
        wants its next reading (its last chance for the work left), or, with only batches to collect, until the
        deadline less its slack (what they give back must still reach the real-time lane). None: no deadline."""
        keeper = self.keeper
        if keeper is None or self.user_canceled or keeper.closed is not None:
            return None
        due = keeper.wait(math.inf)
        return due if due != math.inf else max(0.0, keeper.deadline - keeper.slack() - self.clock())

    def _cut(self, wait: float) -> float:
        """The wait before the next reading, cut to a download put off (its retry is due sooner than the poll), to a
        quarter of a flying primer's life, and to the deadline's last chance: a poll of 15 minutes would otherwise
        retry a damaged download, see a primer end, or read the queue, only after it mattered; and to a few seconds while
        another job on the ledger wants room this job's batches will free (`READ_FOR_OTHERS`)."""
        due = self.collector.next_due()
        if due is not None:
            wait = min(wait, max(FIRST_READING_WAIT, due - self.clock()))
        watch = self.admitter.priming.watch_wait()  # (a primer's end seen while its prefixes live)
        if watch is not None:
            wait = min(wait, max(FIRST_READING_WAIT, watch))
        if self.admitter.turns.others_want and self.journal.count(BatchState.CREATED):
            wait = min(wait, READ_FOR_OTHERS)  # (the room its batches free is another job's: seen late, it idles)
        if self.keeper is not None and not self.user_canceled:
            wait = self.keeper.wait(wait)
        return wait

    async def _loop_then_settle(self) -> None:
        """The loop; on any stop (a user's, or an error of the batch lane: a refusal on a listing, a connection lost
        past its retries, a full disk, a write of the real-time lane's own), the real-time calls out are given a bounded
        moment to answer and be committed first (each one cut off is a possible double charge on the rerun), and
        nothing new is sent meanwhile (a full disk frees the lane's ballast to journal their answers)."""
        try:
            await self._loop()
        except Interrupted:
            await self.lane.settle(CALLS_OUT_WAIT)
            raise
        except Exception as exc:
            self.lane.halt.on(exc)
            await self.lane.settle(CALLS_OUT_WAIT, reason=f"{type(exc).__name__}: {exc}")
            raise

    async def _steer(self, snap: Snapshot) -> None:
        if self.keeper is not None and not self.user_canceled and not self.admitter.budget_stopped:
            await self.keeper.steer(snap)

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted("interrupted")
        if self.lane.halt.failure is not None:  # (a write of the real-time lane failed: the run stops on it, settled)
            raise self.lane.halt.failure

    async def _wait(self, seconds: float) -> None:
        """`sleep(seconds)`, cut short by a stop request, the real-time lane drained, or room freed on the ledger."""
        async with anyio.create_task_group() as tg:
            async def stopper() -> None:
                await self.stop.wait()
                tg.cancel_scope.cancel()

            async def drained() -> None:  # (the real-time lane has nothing left: the next reading comes now)
                await self.lane.drained.wait()
                tg.cancel_scope.cancel()

            async def room() -> None:  # (another job freed room on the shared ledger, or gave the turn up)
                await self.admitter.turns.watch(self.sleep)
                tg.cancel_scope.cancel()

            async def failing() -> None:  # (a write of the real-time lane failed: the run stops now)
                await self.lane.halt.failing.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stopper)
            tg.start_soon(failing)
            if self.admitter.turns.watching() and not self.done():
                tg.start_soon(room)
            if self.journal.lane.unanswered():
                self.lane.drained = anyio.Event()
                tg.start_soon(drained)
            await self.sleep(max(0.0, seconds))
            tg.cancel_scope.cancel()
        self._check_stop()

    def busy(self) -> bool:
        """Whether a create or real-time calls are out (a stop waits for their answers, bounded)."""
        return self.admitter.creating or self.lane.busy()

    def say_waiting(self) -> None:
        if self.admitter.creating:
            self.emit("create_stopping", {"wait_at_most": CALLS_OUT_WAIT, "why": "a create cut off leaves an outcome "
                                          "to reconcile on the rerun; Ctrl-C again abandons it"})

    def done(self) -> bool:
        j = self.journal
        if self.user_canceled:  # nothing new goes out, in either lane; finish what is live
            return not j.count(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED) and not j.lane.out()
        if j.lane.unanswered():
            return False  # (the real-time lane's answers count only once committed)
        if self.admitter.budget_stopped:  # nothing new goes out; finish what is live (and what moved, budgeted then)
            return not j.count(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED)
        return not j.count(BatchState.PLANNED, BatchState.INTENT, BatchState.CREATED, BatchState.ENDED) \
            and not j.groups.pending_count()

    # -- observing ----------------------------------------------------------

    async def cancel_live(self) -> None:
        """After a user's cancel, every batch of ours still live is canceled too (one adopted since, say)."""
        if not self.user_canceled:
            return
        for row in self.journal.batches(BatchState.CREATED):
            if row.batch_id and row.batch_id not in self.cancel_sent:
                # (a cancel the credentials may not make, here or by `cancel`: said once a run, never asked again;
                # the batch runs on and is collected when it ends, rather than stopping every rerun on the same 403)
                status = await cancel_batch(self.api, self.journal, row)
                self.cancel_sent.add(row.batch_id)
                if status == REFUSED:
                    self.emit("cancel_refused", {"batch": row.idx, "id": row.batch_id, **refused_policy(self.api)})
                else:
                    self.emit("canceled", {"batch": row.idx, "id": row.batch_id, "status": status})

    def form_retry_batches(self) -> None:
        """Pack requests waiting for another attempt into new batches, once every first attempt has been admitted."""
        j = self.journal
        if self.user_canceled or self.admitter.budget_stopped or j.count(BatchState.PLANNED) or not j.groups.pending_count():
            return
        limits = Limits(max_requests=self.admitter.batch_size, max_bytes=self.settings.limits.max_bytes)
        requests, batches = j.groups.plan_retries(lambda rows: pack_rows(rows, limits),
                                           lambda g: body_size(len(g), sum(r.length for r in g)))
        self.emit("resubmitting", {"requests": requests, "batches": batches})

    # -- reporting ----------------------------------------------------------

    def progress(self, snap: Snapshot, next_in: float) -> None:
        j = self.journal
        live = j.batches(BatchState.CREATED, BatchState.INTENT)
        self.emit("progress", {
            "batches": [r.batch_id or f"#{r.idx} (create unanswered)" for r in live[:3]], "next_reading_in": round(next_in, 1),
            "total": (j.get_meta("report") or {}).get("requests", 0), "admitted": j.outcomes.admitted_requests(),
            "final": j.outcomes.final_count(), "depth": snap.depth + snap.unseen,
            "ceiling": self.admitter.ceiling if self.admitter.ceiling is not None else self.admitter.estimate.upper,
            "in_flight": len(live),
            "elapsed": round(self.clock() - self.started, 1),
        })

    def summary(self) -> Summary:
        return summarize(self.journal, self.out.path, refusals=self.admitter.refusals, prices=self.prices, budget=self.settings.budget)


def replay(out: OutputFile, sink: ResultSink | None, committed: int) -> None:
    """A resumed run hands `on_result` every result an earlier run committed, first: each run of a job hands back
    every final result once (a rerun of a finished job hands back what the first run did)."""
    if sink is None or committed == 0:
        return
    for line in out.lines(0, committed):
        obj = orjson.loads(line)
        sink(obj["custom_id"], obj["result"])
