"""The real-time lane of a run with a deadline: the requests moved to it, sent through the Messages API at the
pace its rate limits allow (`decide._pacing`), each call journaled before it is sent and each answer committed
(output and journal together) before it counts.

It runs beside the batch loop and only ever takes requests the journal has moved to it (`state._realtime`), so a
request is answered in one lane only. A call whose answer is lost (on the wire, or to a crash) may have been
processed, as the Messages API has no idempotency key: it is sent once more, counted, and reported as a possible
double charge; lost a second time (on the wire or to crashes), the request ends errored `gatekeeper_answer_lost`,
never sent a third time. An answer is journaled as received before it is committed, so a stop, a crash or a full
disk between the two never buys it again; a full disk frees a ballast kept for their records, and a write of the
lane's own that fails stops it as any stop does (`_halt`). Every journal write of the lane takes the run's write lock:
a batch's settlement holds one transaction across its download, and nothing of the lane may land inside it (so, too, no call
goes out and no answer waits in memory beyond the calls allowed out while a settlement runs).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import anyio
import orjson

from ..._errors import ApiError, first_of_group
from ..._prices import BYTES_PER_TOKEN_PACING
from ...api._messages import Call, Kind, send_message
from ...decide._downloads import ANSWER_LOST
from ...decide._headroom import ModelLimits
from ...decide._pacing import Cost, Pace, must_stream
from ...decide._settle import errored_line, stop_of, usage_of
from ...state._realtime import Answer, LaneRow
from ..shared._checkpoints import reached
from ..shared._inputs import read_at
from ..shared._part import Part, RunContext
from ._halt import Halt
from ._paces import Paces

MAX_CALLS = 12  # calls for one request before a server that keeps failing it ends it errored
IN_FLIGHT = 64  # calls out at once at most (the pace decides the rate; this bounds memory and sockets)
TELL_EVERY = 5.0  # seconds between the lane's progress events
# seconds an idle lane waits before looking at its queue again: what it waits for (work moved to it, an answer) wakes
# it at once; the look is only a safety net (at 0.5 s, four journal queries a second for a deadline job's whole life)
IDLE_LOOK = 5.0
# seconds a stop waits at most for the real-time calls out to answer and be journaled (a call takes seconds; each one
# cut off may be billed twice); a second Ctrl-C abandons them at once
CALLS_OUT_WAIT = 60.0


class RealtimeLane(Part):
    """Sends the requests the journal moved to the real-time lane, until canceled."""

    def __init__(self, ctx: RunContext, *, write_lock: anyio.Lock, stop: anyio.Event,
                 on_result: Callable[[str, dict[str, Any]], None] | None = None, rand: Callable[[], float] = random.random,
                 limits: dict[str, ModelLimits] | None = None) -> None:
        super().__init__(ctx)
        self.write_lock, self.on_result, self.rand = write_lock, on_result, rand
        self.drained = anyio.Event()  # set when nothing is left to send or commit (the run's wait ends on it)
        self.paces = Paces(self.clock, limits)  # each model's pace, and what they project
        self.out_now: set[int] = set()  # lines with a call out
        # answers received, to commit; each call's slot among the IN_FLIGHT is held until its answer is committed, so
        # what waits in memory (a settlement holding the write lock) never grows past the calls allowed out
        self.answers: list[tuple[Answer, dict[str, Any]]] = []
        self.limiter: anyio.Semaphore | None = None
        # (one event a waiter: each clears its own once woken, so a shared one cleared by the other was a wake lost,
        # and the dispatcher slept out IDLE_LOOK after work moved to it: 3.8 s of a 30 s lane at 90 a minute)
        self.wake = anyio.Event()  # the dispatcher's: work moved to the lane, a request back in its queue, a commit
        self.arrived = anyio.Event()  # the committer's: an answer to commit
        self.paced = anyio.Event()  # a call's outcome changed a pace: the dispatcher waiting on one looks again
        self.sent = 0
        self.stop = stop  # the run's stop: from the moment it is asked for, nothing new is sent
        self.answered = 0  # answers committed by this run
        self.refusal: ApiError | None = None  # the account was refused: nothing more is sent, the run stops on it
        self.halted = False  # the run is stopping on an error of its own: nothing new is sent, the calls out settle
        self.told_at = 0.0
        self.halt = Halt(self.emit, None if self.journal.job else self.journal.state_dir, self._look_again)  # (its own stop)

    def busy(self) -> bool:
        """Whether calls are out or answers wait to be committed (a stop waits for them; only for calls, recording only)."""
        return bool(self.calls_out() if self.halt.recording_only else self.out_now or self.answers)

    def calls_out(self) -> set[int]:
        """The lines with a call out whose answer has not come."""
        return self.out_now - {a.line for a, _ in self.answers}

    async def settle(self, grace: float, reason: str | None = None) -> None:
        """The run is stopping (a user's stop, or `reason`, an error of either lane): nothing new is sent; wait up
        to `grace` seconds for the calls out to answer and their answers to be committed (journaled as received only,
        when no more are committed). Said once, however many of the run's parts wait."""
        self.halted = True
        self.wake.set()
        self.halt.say_stopping(len(self.calls_out()), grace, reason)
        until = self.clock() + grace
        while self.busy() and self.clock() < until:
            await self.wait_for(self.paced, min(0.05, until - self.clock()))
            self.paced = anyio.Event()  # (nothing is sent while settling: only answers set it)

    # -- the lane -------------------------------------------------------------

    async def run(self) -> None:
        async with self.write_lock:
            lost = self.journal.lane.resume()
        if lost:
            self.emit("realtime_unknown", {"requests": lost, "policy": "sent again once, counted as possible double "
                                                                      "charges; never a third time"})
        received = self.journal.lane.received_rows()
        if received:  # (answers a stop or a full disk kept from being committed: paid for, never bought again)
            async with self.write_lock:
                self.answers = [_kept(row, raw) for row, raw in received]
                self.commit(held=0)
        self.limiter = anyio.Semaphore(IN_FLIGHT)
        try:
            with first_of_group():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._committer)
                    await self._dispatch(tg)
        finally:
            self.halt.ballast.drop()  # (the run's own: gone with it)

    def _look_again(self) -> None:
        self.wake.set()
        self.paced.set()

    async def _dispatch(self, tg: anyio.abc.TaskGroup) -> None:
        assert self.limiter is not None
        limiter = self.limiter
        while True:
            if self.refusal is not None and not self.busy():
                raise self.refusal  # (once the calls out have answered and been committed)
            if (failure := self.halt.failure) is not None:  # (a write of its own failed: the calls out settle first)
                await self.settle(CALLS_OUT_WAIT, reason=f"{type(failure).__name__}: {failure}")
                raise failure
            rows = [] if self._holding() else [r for r in self.journal.lane.rows(IN_FLIGHT) if r.line not in self.out_now]
            if not rows:
                self.paces.idle()
                if not self.busy() and not self.journal.lane.waiting():  # (rows waiting for a cut create's batch:
                    self.drained.set()  # the loop's readings collect it, and its wait is not cut short for them)
                await self._idle()
                continue
            self.paces.busy(self.clock())
            for row in rows:
                if self._holding():
                    break
                await self._go(tg, limiter, row)

    def _holding(self) -> bool:
        """Whether nothing new may be sent: a stop, a user's cancel, a refusal of the account, the run halting."""
        return self.stop.is_set() or self.halted or self.user_canceled or self.refusal is not None or self.halt.failure is not None

    async def _idle(self) -> None:
        await self.wait_for(self.wake, IDLE_LOOK)
        self.wake = anyio.Event()

    async def _go(self, tg: anyio.abc.TaskGroup, limiter: anyio.Semaphore, row: LaneRow) -> None:
        """Wait for the pace, journal the call, and send it in its own task."""
        if row.lost >= 2:  # (its calls were out at two crashes, or lost once each way: never sent a third time)
            await limiter.acquire()
            self.out_now.add(row.line)
            self._lost_twice(row)
            return
        params = orjson.loads(read_at(self.path, row.offset, row.length))["params"]
        model, max_tokens = str(params.get("model")), int(params.get("max_tokens") or 1)
        cost = Cost(int(row.length / BYTES_PER_TOKEN_PACING), max_tokens)
        self._costs(cost)
        self.halt.keep_room(IN_FLIGHT, max_tokens)
        pace = self.paces.pace(model)
        await self._paced(pace, cost)
        if self._holding():
            return
        await limiter.acquire()
        while True:
            if self._holding():  # (came while this one waited: not sent)
                limiter.release()
                return
            async with self.write_lock:  # (every journal write of the lane waits out a settlement's transaction)
                # (judged and counted at the moment it goes, under the lock: a wait for it never bunches calls)
                if pace.wait(cost, self.clock()) <= 0:
                    if not self.halt.wrote(lambda: self.journal.lane.sending(row.line)):
                        limiter.release()  # (not journaled, the run stops on it; or a cut create's batch answered it)
                        return
                    at = pace.sent(cost, self.clock())
                    break
            await self._paced(pace, cost)
        self.paces.went(at)
        self.out_now.add(row.line)
        stream = must_stream(max_tokens, str(params.get("model") or ""))
        body = orjson.dumps({**params, "stream": True} if stream else params)
        tg.start_soon(self._call, row, body, stream, pace, cost, limiter, at)

    async def _paced(self, pace: Pace, cost: Cost) -> None:
        """Wait until `pace` lets a request of `cost` go (an answer gives back what its start over-charged, or
        lowers a level: it is asked again then)."""
        while not self._holding() and (wait := pace.wait(cost, self.clock())) > 0:
            await self.wait_for(self.paced, min(wait, 5.0))
            self.paced = anyio.Event()

    def _costs(self, cost: Cost) -> None:
        """The mean cost of the requests sent, for the lane's projections (a running mean)."""
        self.sent += 1
        m = self.paces.mean_cost
        self.paces.mean_cost = Cost(m.input + (cost.input - m.input) // self.sent, m.output + (cost.output - m.output) // self.sent)

    async def _call(self, row: LaneRow, body: bytes, stream: bool, pace: Pace, cost: Cost,
                    limiter: anyio.Semaphore, at: float) -> None:
        final = False
        try:
            call = await send_message(self.api, body, stream=stream)
            reached("realtime-answered")
            async with self.write_lock:
                final = self._weigh(row, call, pace, cost, at)
        finally:
            if not final:  # (a final answer keeps its slot until committed)
                limiter.release()

    def _weigh(self, row: LaneRow, call: Call, pace: Pace, cost: Cost, at: float) -> bool:
        """What one call's outcome means: an answer to commit (True), or the request waits for another call. `at`:
        when the call went, by the pace's count."""
        now = self.clock()
        self.paced.set()
        if call.kind is Kind.ANSWERED:
            assert call.message is not None
            result = {"type": "succeeded", "message": call.message}
            usage = usage_of(result)
            billed = _counted(usage, pace.reads_count) if isinstance(call.message.get("usage"), dict) else None
            pace.answered(call.headers, cost, billed, now)  # (no usage: nothing given back; the headers say)
            if billed is not None:
                self.paces.answered(*billed)
            return self._final(row, result, "succeeded", None, usage, stop_of(result))
        if call.kind is Kind.LIMITED:
            pace.refused(call.headers, call.retry_after, now, at)
            self.emit("realtime_limited", {"custom_id": row.custom_id, "retry_after": call.retry_after, "why": call.detail})
        elif call.kind is Kind.ACCOUNT:  # (not the request's failure: it goes back to the queue, the run stops)
            pace.observe(call.headers, now)
            self.refusal = self.refusal or call.error
            self.emit("realtime_refused", {"custom_id": row.custom_id, "why": call.detail,
                                           "policy": "the account was refused: nothing more is sent; the request "
                                                     "stays queued for the next run"})
            return self._again(row, lost=False)
        elif call.kind is Kind.REFUSED:
            pace.observe(call.headers, now)
            et = call.error.error_type if call.error is not None and call.error.error_type else "invalid_request_error"
            return self._errored(row, et, call.detail)
        else:
            pace.failed(now, self.rand(), overloaded=call.kind is Kind.OVERLOADED)
        if call.kind is Kind.LOST and row.lost >= 1 and not self.journal.lane.waits(row.line):
            return self._lost_twice(row)  # (one of a cut create's waits for its batch: `_again`, counted)
        if call.kind not in (Kind.LIMITED, Kind.UNSENT) and row.calls + 1 >= MAX_CALLS:
            return self._errored(row, "api_error", f"{MAX_CALLS} calls failed: {call.detail}")
        if call.kind is Kind.LOST:
            self.emit("realtime_lost", {"custom_id": row.custom_id, "why": call.detail,
                                        "policy": "sent once more; counted as a possible double charge"})
        return self._again(row, lost=call.kind is Kind.LOST)

    def _again(self, row: LaneRow, *, lost: bool) -> bool:
        """The request goes back to the queue for another call (`lost`: counted as a possible double charge)."""
        self.halt.wrote(lambda: self.journal.lane.again(row.line, lost=lost), paid=True)  # (journaled sent: lost on the rerun)
        self.out_now.discard(row.line)
        self.wake.set()
        return False

    def _lost_twice(self, row: LaneRow) -> bool:
        return self._errored(row, ANSWER_LOST, "its answer was lost twice; it may have been processed (and billed) "
                             "twice: not sent again")

    def _errored(self, row: LaneRow, error_type: str, message: str) -> bool:
        raw = orjson.loads(errored_line(row.custom_id, error_type, message))["result"]
        return self._final(row, raw, "errored", error_type, (None, 0, 0, 0, 0, 0), None)

    def _final(self, row: LaneRow, result: dict[str, Any], kind: str, error_type: str | None,
               usage: tuple[str | None, int, int, int, int, int], stop: str | None) -> bool:
        raw = orjson.dumps({"custom_id": row.custom_id, "result": result})
        # (journaled as received: a stop or a full disk before its commit never re-buys it; one that cannot be, may)
        if kind == "succeeded" and not self.halt.wrote(lambda: self.journal.lane.received(row.line, raw), paid=True):
            self.emit("realtime_unrecorded", {"custom_id": row.custom_id, "why": str(self.halt.failure),
                                              "policy": "sent again by the rerun, counted as a possible double charge"})
        self.answers.append((Answer(row.line, row.custom_id, raw, kind, error_type, usage, stop), result))
        self.arrived.set()
        return True

    async def _committer(self) -> None:
        """Commit the answers that came in, together, under the run's write lock (a batch's settlement holds it)."""
        while True:
            if not self.answers or self.halt.recording_only:
                await self.wait_for(self.arrived, IDLE_LOOK)
                self.arrived = anyio.Event()
                continue
            async with self.write_lock:
                self.halt.wrote(self.commit)  # (one that fails leaves its answers journaled as received: the rerun's)
            self.wake.set()  # (the dispatcher looks again: room for calls, or nothing left: drained)

    def commit(self, held: int | None = None) -> None:
        """Commit the answers received (output and journal together); each frees the call slot it held (`held`:
        how many of them hold one, all by default)."""
        answers, self.answers = self.answers, []
        answers = _not_joined(self, answers)
        start = self.journal.outcomes.committed_output()
        try:
            with self.out.appending(start) as out:
                for a, _ in answers:
                    out.write(a.raw + b"\n")
            reached("realtime-before-commit")
            self.journal.lane.commit([a for a, _ in answers], start, self.journal.lane.next_group())
        except BaseException:
            self.out.truncate_to(start)
            self.answers = answers + self.answers  # (kept: journaled as received, committed by a rerun with room)
            raise
        for _ in range(len(answers) if held is None else held):
            assert self.limiter is not None
            self.limiter.release()
        for a, result in answers:
            self.out_now.discard(a.line)
            if self.on_result is not None:
                self.on_result(a.custom_id, result)
        self.answered += len(answers)
        if self.clock() - self.told_at >= TELL_EVERY or not self.out_now:  # (every few seconds, and when all came in)
            self.told_at = self.clock()
            self.emit("realtime_answered", {"requests": self.answered, "left": self.journal.lane.unanswered()})


def _not_joined(lane: RealtimeLane, answers: list[tuple[Answer, dict[str, Any]]]) -> list[tuple[Answer, dict[str, Any]]]:
    """The answers to commit: not those whose request a cut create's batch answered first (kept with their row, a
    double charge it counts already, never joined; each frees its call's slot)."""
    late = lane.journal.lane.joined(a.line for a, _ in answers)
    if not late:
        return answers
    lane.journal.lane.after_batch([(a.raw, a.line) for a, _ in answers if a.line in late])
    lane.emit("realtime_after_batch", {"requests": len(late), "policy": "answered first by the batch of the create the "
                                       "deadline cut: kept, not joined (a possible double charge)"})
    lane.out_now -= late
    if lane.limiter is not None:  # (none held at a run's start: its answers were kept before)
        for _ in late:
            lane.limiter.release()
    return [x for x in answers if x[0].line not in late]


def _counted(usage: tuple[Any, ...], reads_count: bool) -> tuple[int, int]:
    """(input tokens the input limit counted, output tokens) of an answer's usage: cache reads only under an
    input_tokens_per_minute limit (the cache-aware type does not count them)."""
    return usage[1] + usage[3] + (usage[4] if reads_count else 0), usage[2]


def _kept(row: LaneRow, raw: bytes) -> tuple[Answer, dict[str, Any]]:
    """An answer journaled as received by an earlier run, to commit."""
    result = orjson.loads(raw)["result"]
    return Answer(row.line, row.custom_id, raw, "succeeded", None, usage_of(result), stop_of(result)), result
