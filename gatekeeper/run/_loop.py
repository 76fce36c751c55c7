"""The submit loop: observe the queue, collect what ended, reconcile, admit what fits, wait.

Every step that changes the world is journaled before it is taken (the intent
before a create) or in the same transaction as its effect (results rows with
the output file's committed length), so the loop can be killed anywhere and a
rerun of the same command continues: nothing lost, nothing submitted twice.

The decisions are pure functions elsewhere (`_admission`, `_reconcile`,
`_settle`); this module does the I/O around them. Time comes in as `clock`
(wall seconds) and `sleep`, so grace periods and backoff are tested without waiting.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from .._errors import (
    ApiError,
    CreateOutcomeUnknown,
    DuplicateJob,
    InputError,
    Interrupted,
    JournalError,
    NotFoundError,
    QueueFull,
    RateLimited,
    TransportError,
    UsageError,
)
from .._prices import PriceTable, load_prices
from ..api._client import CREATE_ANSWER_WAIT, ApiClient
from ..api._queue import Connection, read_ceiling, read_live, recent_batches
from ..checks._preflight import plan_checked
from ..decide._admission import CeilingEstimate, QueueState, admit_round, batch_size_for, deferral_wait, recut_size, refusal_wait
from ..decide._budget import Spend, may_spend, request_worst
from ..decide._downloads import BATCH_LIFETIME
from ..decide._headroom import LIVE_STATES, live_batches, parse_time
from ..decide._ownership import choose
from ..decide._reconcile import (
    Action,
    Decision,
    candidates_for,
    compared,
    decide,
    nearest_first,
    others_in_flight,
    with_our_ids,
)
from ..input._planner import PlanReport
from ..input._sizing import Limits, Packer, body_chunks, body_size
from ..state._journal import BatchRow, BatchState, JobPlan, Journal, PendingRow
from ..state._ledger import Ledger, LocalLedger
from ..state._output import OutputFile
from ._checkpoints import reached
from ._collect import Collector, custom_id
from ._evidence import Results, read_results, weigh
from ._inputs import batch_requests, hash_file, stat_identity
from ._rebuild import Rebuilder
from ._settings import EventSink, SubmitSettings
from ._summary import Summary, spent_usd, summarize

ResultSink = Callable[[str, dict[str, Any]], None]
Sleep = Callable[[float], Awaitable[None]]
READING_EVERY = 60.0  # seconds: the timeline's longest gap while the queue holds still


@dataclass
class Snapshot:
    """One reading of the queue, with what it says about our own batches."""

    depth: int
    listed: dict[str, dict[str, Any]]  # id -> batch, primary workspace
    unseen: int  # our live requests the listing does not show
    at: float  # the clock when the listing began to be read


class Job:
    """One submit run over one input and one state directory."""

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
        clock: Callable[[], float] = time.time,
        sleep: Sleep = anyio.sleep,
        prices: PriceTable | None = None,
    ) -> None:
        self.path = input_path
        self.s = settings
        self.conn = conn
        self.api: ApiClient = conn.primary
        self.journal = journal
        self.out = OutputFile(out_path)
        self.emit = emit
        self.stop = stop
        self.on_result = on_result
        self.ledger = ledger or LocalLedger()
        self.clock = clock
        self.sleep = sleep
        self.prices = prices or load_prices()
        self.budget_stopped = False  # the budget allows no more: finish what is in flight, send nothing new
        self.ceiling: int | None = None
        self.estimate = CeilingEstimate()
        self.backoff_until = 0.0
        self.refusal_streak = 0
        self.refusals = 0
        self.batch_size = settings.limits.max_requests
        self.started = clock()
        self.collector = Collector(journal, self.api, self.out, settings, path=input_path, emit=emit, clock=clock,
                                   check_stop=self._check_stop, on_result=on_result,
                                   ledger=self.ledger)
        self.cancel_sent: set[str] = set()  # batch ids this run has asked the API to cancel
        self._last_reading: tuple[tuple[int, int | None, int] | None, float] = (None, 0.0)

    # -- preparation --------------------------------------------------------

    async def prepare(self) -> None:
        """Read the ceiling; plan the input into the journal, or check it is the same input on resume."""
        await self.api.list_page(limit=1)  # an unreachable API or a refused key stops us before anything is journaled
        self.ceiling, _, error = await read_ceiling(self.conn, self.s.ceiling)
        if error and self.ceiling is None:
            self.emit("ceiling_unknown", {"reason": error, "policy": "learn a bound from queue-full refusals"})
        if self.journal.initialized:
            await self._resume()
        else:
            await self._start()
        self._check_prices()
        await self._claim_job()

    def _check_prices(self) -> None:
        """With a budget, every model must have a price: a cost that cannot be bounded cannot be kept under one."""
        if self.s.budget is None:
            return
        models = ((self.journal.get_meta("report") or {}).get("models") or {}).keys()
        unpriced = sorted(m for m in models if self.prices.lookup(m) is None)
        if unpriced:
            raise UsageError(f"a budget needs a price for every model; none is known for {', '.join(unpriced)} "
                             "(give a price table that has them)", setting="prices")

    async def _claim_job(self) -> None:
        """One input, one live job per workspace: refused when the shared ledger knows another live run of it."""
        digest = (self.journal.get_meta("input") or {}).get("sha256", "")
        job = f"{digest}:{self.api.key_fingerprint}"
        info = {"host": socket.gethostname(), "state_dir": os.path.abspath(self.journal.state_dir), "pid": os.getpid()}
        other = await self.ledger.claim_job(job, info)
        if other is None:
            return
        if not self.s.allow_duplicate:
            raise DuplicateJob(f"this input is already being submitted to this workspace from {other.get('host')} "
                               f"(state directory {other.get('state_dir')}); a second run would send it twice",
                               setting="allow_duplicate")
        self.emit("duplicate_allowed", {"other": other})

    async def _resume(self) -> None:
        j = self.journal
        await self._check_identity()
        recorded = j.get_meta("output")
        if recorded and os.path.abspath(self.out.path) != recorded:
            if not j.job:
                raise JournalError(f"this job writes its results to {recorded}; the output cannot change on resume")
            # A shared journal's job moves between hosts: the output goes where this host puts it (rebuilt there).
            j.set_meta("output", os.path.abspath(self.out.path), "output_moved", previous=recorded)
        self.batch_size = int((j.get_meta("settings") or {}).get("batch_size", self.batch_size))
        self.emit("resumed", {"state_dir": str(j.state_dir), "batches": len(j.batches()),
                              "collected": j.count(BatchState.COLLECTED)})
        j.event("resumed", collected=j.count(BatchState.COLLECTED))
        if self.user_canceled and self.s.resume_canceled:
            j.set_meta("user_canceled", False, "cancel_lifted", not_sent=j.held_back())
            self.emit("cancel_lifted", {"not_sent": j.held_back()})

    async def _start(self) -> None:
        self.batch_size = batch_size_for(self.ceiling, self.s.margin, self.s.limits.max_requests)
        size, mtime = stat_identity(self.path)
        report = await self._plan_checked(Limits(max_requests=self.batch_size, max_bytes=self.s.limits.max_bytes))
        if stat_identity(self.path) != (size, mtime):
            raise InputError(f"{self.path} changed while it was being read")
        self.journal.start_job(self._job_plan(report, size, mtime))
        self.emit("planned", {"requests": report.requests, "invalid": report.invalid, "batches": len(report.batches),
                              "batch_size": self.batch_size, "ceiling": self.ceiling})
        for err in report.errors[:20]:
            self.emit("rejected", err.to_json())

    async def _plan_checked(self, limits: Limits) -> PlanReport:
        report = await plan_checked(self.path, self.api if self.s.preflight else None, limits=limits, hash_content=True,
                                    token_sample=self.s.token_sample)
        if self.s.preflight and not (report.preflight or {}).get("checked"):
            self.emit("preflight_skipped", {"reason": (report.preflight or {}).get("reason")})
        return report

    def _job_plan(self, report: PlanReport, size: int, mtime: int) -> JobPlan:
        return JobPlan(
            input={"path": os.path.abspath(self.path), "size": size, "mtime_ns": mtime, "sha256": report.content_hash},
            settings={"batch_size": self.batch_size, "max_bytes": self.s.limits.max_bytes,
                      "max_attempts": self.s.max_attempts, "ceiling_at_plan": self.ceiling},
            report={"requests": report.requests, "invalid": report.invalid, "lines": report.lines,
                    "models": report.models, "preflight": report.preflight,
                    "estimate": report.estimate(self.prices)},
            output=os.path.abspath(self.out.path),
            batches=[(b.index, b.requests, b.bytes, b.first_line, b.last_line, b.start_offset, b.end_offset,
                      b.first_custom_id, b.last_custom_id) for b in report.batches],
            rejections=[(e.line, e.custom_id, e.reason) for e in report.errors],
        )

    async def _check_identity(self) -> None:
        j = self.journal
        known = j.get_meta("input")
        size, mtime = stat_identity(self.path)
        if (size, mtime) == (known["size"], known["mtime_ns"]):
            return
        # (in a thread: hashing gigabytes must not stop the heartbeats of the lease and the reservations)
        digest = await anyio.to_thread.run_sync(hash_file, self.path) if size == known["size"] else ""
        if digest != known["sha256"]:
            raise JournalError(
                f"state directory {j.state_dir} belongs to {known['path']} as it was when the job started "
                f"({known['size']:,} bytes, sha256 {known['sha256'][:12]}); {self.path} is different. "
                "Use another state directory, or restore the input"
            )
        j.set_meta("input", {**known, "mtime_ns": mtime, "path": os.path.abspath(self.path)})

    # -- the loop -----------------------------------------------------------

    async def run(self) -> Summary:
        rebuilt = await Rebuilder(self.journal, self.api, self.out, self.s, path=self.path, emit=self.emit,
                                  clock=self.clock, wait=self._wait, check_stop=self._check_stop).run()
        if rebuilt is None:
            self.out.truncate_to(self.journal.committed_output())
        for row in self.journal.batches(BatchState.INTENT, BatchState.CREATED):
            await self.ledger.hold(row.idx, row.requests, row.batch_id)  # a resumed run takes its reservations back
        while True:
            self._check_stop()
            snap = await self.observe()
            await self.cancel_live()
            await self.reconcile(snap)
            # Admission before collection: downloading the batches that ended can take a while, and the room
            # they left is already in this reading; the queue stays full meanwhile.
            await self.admit_round(snap)
            await self.collector.collect_ended()
            self.form_retry_batches()
            if self.done():
                break
            self.progress(snap)
            await self._wait(self.s.poll)
        await self.ledger.release_all()
        summary = self.summary()
        self.emit("finished", summary.to_json())
        return summary

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted("interrupted")

    async def _wait(self, seconds: float) -> None:
        """`sleep(seconds)`, cut short by a stop request."""
        async with anyio.create_task_group() as tg:
            async def stopper() -> None:
                await self.stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stopper)
            await self.sleep(max(0.0, seconds))
            tg.cancel_scope.cancel()
        self._check_stop()

    @property
    def user_canceled(self) -> bool:
        return bool(self.journal.get_meta("user_canceled"))

    def done(self) -> bool:
        j = self.journal
        if self.user_canceled or self.budget_stopped:  # nothing new goes out; finish what is live
            return not j.count(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED)
        return not j.count(BatchState.PLANNED, BatchState.INTENT, BatchState.CREATED, BatchState.ENDED) \
            and not j.pending_count()

    # -- observing ----------------------------------------------------------

    async def observe(self) -> Snapshot:
        """List the queue over every key; move our batches that ended; count what the listing misses."""
        at = self.clock()
        listed = {str(b.get("id")): b async for b in recent_batches(self.api, at)}
        depth = sum(r.processing for r in live_batches(listed.values(), "ws1"))
        for i, other in enumerate(self.conn.workspaces[1:], start=2):
            depth += sum(r.processing for r in await read_live(other, f"ws{i}", now=at))
        unseen = 0
        for row in self.journal.batches(BatchState.CREATED):
            batch = listed.get(row.batch_id or "") or await self._retrieve_unlisted(row)
            if batch is None or batch.get("processing_status") in LIVE_STATES and row.batch_id not in listed:
                unseen += row.requests  # ours and live, but not in the listing we read
            if batch is not None and batch.get("processing_status") == "ended":
                self.journal.mark_ended(row.idx, batch.get("ended_at"), batch.get("request_counts"))
                self.emit("ended", {"batch": row.idx, "id": row.batch_id, "counts": batch.get("request_counts")})
                await self.ledger.release(row.idx)
        unseen += sum(r.requests for r in self.journal.batches(BatchState.INTENT))
        mine = self.journal.known_batch_ids()
        ours = unseen + sum(r.processing for r in live_batches((b for i, b in listed.items() if i in mine), "ws1"))
        self._record_reading(depth + unseen, ours)
        return Snapshot(depth, listed, unseen, at)

    def _record_reading(self, depth: int, ours: int) -> None:
        """A timeline point when the queue changed, or a minute after the last one (a plateau needs no more)."""
        now = self.clock()
        reading = (depth, self.ceiling, ours)
        if reading != self._last_reading[0] or now - self._last_reading[1] >= READING_EVERY:
            self.journal.record_reading(now, depth, self.ceiling, ours)
            self._last_reading = (reading, now)

    async def _retrieve_unlisted(self, row: BatchRow) -> dict[str, Any] | None:
        """A batch of ours the listing misses: retrieve it. A 404 is lag (the API is eventually consistent), not
        a verdict, until the batch must have expired: then it is taken as ended and its results are looked for."""
        try:
            return await self.api.retrieve_batch(str(row.batch_id))
        except NotFoundError:
            created = parse_time(row.created_at)
            if created is not None and self.clock() > created + BATCH_LIFETIME + self.s.results_grace:
                return {"id": row.batch_id, "processing_status": "ended", "ended_at": None, "request_counts": None}
            self.emit("batch_not_found", {"batch": row.idx, "id": row.batch_id, "policy": "counted as live; asked again"})
            return None

    async def cancel_live(self) -> None:
        """After a user's cancel, every batch of ours still live is canceled too (one adopted since, say)."""
        if not self.user_canceled:
            return
        for row in self.journal.batches(BatchState.CREATED):
            if row.batch_id and row.batch_id not in self.cancel_sent:
                status = await self.api.cancel_if_running(row.batch_id)
                self.cancel_sent.add(row.batch_id)
                self.emit("canceled", {"batch": row.idx, "id": row.batch_id, "status": status})

    # -- admission ----------------------------------------------------------

    async def admit_round(self, snap: Snapshot) -> None:
        waiting = self.journal.batches(BatchState.PLANNED)
        now = self.clock()
        q = QueueState(
            waiting=[b.requests for b in waiting], depth=snap.depth, unseen=snap.unseen,
            bound=self.ceiling if self.ceiling is not None else self.estimate.bound(now), margin=self.s.margin,
            in_flight=self.journal.count(BatchState.CREATED, BatchState.INTENT), max_in_flight=self.s.max_in_flight,
            backoff_until=self.backoff_until, canceled=self.user_canceled,
        )
        count = admit_round(q, now)
        if count == 0 and waiting and now >= self.backoff_until and not q.canceled:
            self.emit("waiting", {"next": waiting[0].requests, "depth": q.depth, "unseen": q.unseen,
                                  "ceiling": q.bound, "in_flight": q.in_flight})
        for row in waiting[:count]:
            self._check_stop()
            worst = self._worst_case(row) if self.s.budget is not None else None
            if worst is not None and not self._within_budget(row, worst, waiting):
                return
            if not await self.ledger.reserve(row.idx, row.requests, q.bound, snap.depth + snap.unseen):
                self.emit("waiting", {"next": row.requests, "reason": "ledger", "depth": snap.depth})
                return
            outcome = await self.create(row, snap.depth, snap.unseen, worst)
            if outcome is None:
                if self.journal.batch(row.idx).state is BatchState.PLANNED:
                    await self.ledger.release(row.idx)  # definitely not created
                return  # an unknown outcome keeps its reservation until reconciled
            await self.ledger.confirm(row.idx, outcome)
            snap.unseen += row.requests  # ours now, and not yet in any listing we read

    def _worst_case(self, row: BatchRow) -> float:
        """The most this batch can cost (USD at batch prices): every request's input bound and full max_tokens."""
        total = 0.0
        for _, _, body, _ in self._requests_of(row):
            params = orjson.loads(body)["params"]
            price = self.prices.lookup(params["model"])
            assert price is not None  # _check_prices refused a budget without one
            total += request_worst(len(body), params["max_tokens"], price)
        return total

    def _within_budget(self, row: BatchRow, worst: float, waiting: list[BatchRow]) -> bool:
        """Whether the batch may go; when not, cut what waits to the remaining budget, or stop admitting."""
        assert self.s.budget is not None
        spent = spent_usd(self.journal, self.prices) or 0.0
        d = may_spend(budget=self.s.budget, spent=spent, in_flight=self.journal.in_flight_worst(), worst=worst,
                      requests=row.requests)
        if d.action is Spend.GO:
            return True
        if d.action is Spend.WAIT:
            self.emit("waiting", {"next": row.requests, "reason": "budget", "worst_usd": round(worst, 6)})
            return False
        if d.action is Spend.CUT:
            self._recut(waiting, d.size)
            return False
        if not self.budget_stopped:
            self.budget_stopped = True
            self.emit("budget_reached", {"budget": self.s.budget, "spent": round(spent, 6),
                                         "in_flight_worst": round(self.journal.in_flight_worst(), 6),
                                         "held_back": self.journal.held_back()})
        return False

    async def create(self, row: BatchRow, depth: int, unseen: int, worst: float | None = None) -> str | None:
        """Create one batch; its id, or None when it must wait (refused, or outcome unknown)."""
        j = self.journal
        if stat_identity(self.path) != tuple(j.get_meta("input")[k] for k in ("size", "mtime_ns")):
            await self._check_identity()  # raises if the content changed
        reached("before-intent")
        j.mark_intent(row.idx, self.clock(), worst)
        reached("after-intent")
        self.emit("creating", {"batch": row.idx, "requests": row.requests, "bytes": row.bytes,
                               "answer_within": CREATE_ANSWER_WAIT})
        try:
            batch = await self.api.create_batch(self._body(row), size=row.bytes)
        except QueueFull as exc:
            self._refused(row, exc, depth, unseen)
            return None
        except (RateLimited, TransportError) as exc:
            self._deferred(row, exc)
            return None
        except CreateOutcomeUnknown as exc:
            self.emit("create_unknown", {"batch": row.idx, "reason": str(exc)})
            return None  # stays INTENT: reconciled before anything is resent
        except ApiError:
            # A definite refusal that waiting cannot fix (400, 413, spend limit, auth): nothing was created,
            # so the batch goes back to planned and the run stops, resumable once fixed. Anything else
            # (a cancellation mid-POST, a changed input mid-body) leaves the intent to reconcile.
            j.back_to_planned(row.idx)
            raise
        reached("after-create")
        batch_id = str(batch["id"])
        j.mark_created(row.idx, batch_id, batch.get("created_at"))
        self.refusal_streak = 0
        self.estimate.accepted(depth, unseen, row.requests)
        self.emit("admitted", {"batch": row.idx, "id": batch_id, "requests": row.requests, "bytes": row.bytes,
                               "depth": depth + unseen + row.requests, "ceiling": self.ceiling})
        return batch_id

    def _refused(self, row: BatchRow, exc: QueueFull, depth: int, unseen: int) -> None:
        self.journal.record_refusal(row.idx, depth, row.requests)
        self.refusals += 1
        self.refusal_streak += 1
        now = self.clock()
        self.estimate.refused(depth, unseen, row.requests, now)
        wait = refusal_wait(self.refusal_streak, exc.retry_after, self.s.min_backoff, self.s.max_backoff)
        self.backoff_until = now + wait
        self.emit("refused", {"batch": row.idx, "requests": row.requests, "depth": depth, "unseen": unseen,
                              "retry_after": exc.retry_after, "wait": round(wait, 3),
                              "learned_bound": self.estimate.upper if self.ceiling is None else None})
        reached("after-refusal")
        waiting = self.journal.batches(BatchState.PLANNED)
        size = recut_size(self.batch_size, max(b.requests for b in waiting), self.estimate.bound(now), self.s.margin)
        if size is not None:
            self._recut(waiting, size)

    def _recut(self, waiting: list[BatchRow], size: int) -> None:
        """Cut every batch not yet created into batches of at most `size` requests (one journal transaction)."""
        limits = Limits(max_requests=size, max_bytes=self.s.limits.max_bytes)
        ranges = self._recut_ranges([r for r in waiting if r.kind == "plan"], limits)
        listed = [PendingRow(line, off, len(body), custom_id(body), attempt)
                  for r in waiting if r.kind != "plan" for line, off, body, attempt in self._requests_of(r)]
        groups = pack_rows(listed, limits) if listed else []
        self.journal.recut(size, ranges, groups, lambda g: body_size(len(g), sum(r.length for r in g)))
        self.batch_size = size
        self.emit("recut", {"batch_size": size, "replaced": len(waiting), "batches": len(ranges) + len(groups),
                            "reason": "refusals show the ceiling is below the waiting batches"})

    def _recut_ranges(self, rows: list[BatchRow], limits: Limits) -> list[tuple[Any, ...]]:
        """New input-range batches over the requests of `rows`, in order, cut by the one packing rule."""
        packer = Packer(limits)
        ranges: list[tuple[Any, ...]] = []
        first = last = (0, 0, "", 0)
        for row in rows:
            for line, off, body, _ in self._requests_of(row):
                item = (line, off, custom_id(body), len(body))
                if packer.add(len(body)):
                    if packer.batches > 1:
                        ranges.append(_range(packer.closed, first, last))
                    first = item
                last = item
        if packer.count:
            ranges.append(_range((packer.count, packer.size), first, last))
        return ranges

    def _deferred(self, row: BatchRow, exc: RateLimited | TransportError) -> None:
        self.journal.back_to_planned(row.idx)
        wait = deferral_wait(getattr(exc, "retry_after", None), self.s.min_backoff, self.s.max_backoff)
        self.backoff_until = self.clock() + wait
        self.emit("create_deferred", {"batch": row.idx, "reason": str(exc), "wait": wait})

    def _requests_of(self, row: BatchRow) -> Iterator[tuple[int, int, bytes, int]]:
        return batch_requests(self.path, self.journal, row)

    async def _body(self, row: BatchRow) -> AsyncIterator[bytes]:
        """The create body, streamed from the input's bytes in 1 MB pieces; its length must be the journaled size."""
        sent = 0
        pending: list[bytes] = []
        size = 0
        for piece in body_chunks(body for _, _, body, _ in self._requests_of(row)):
            pending.append(piece)
            size += len(piece)
            if size >= 1 << 20:
                sent += size
                yield b"".join(pending)
                pending, size = [], 0
                await anyio.sleep(0)
        sent += size
        if sent != row.bytes:
            raise InputError(f"{self.path} changed: batch {row.idx} is {sent} bytes now, {row.bytes} when planned")
        # Before the last bytes leave: an intent without this mark cannot have become a batch (the server needs
        # the whole body), so a rerun resends it at once instead of waiting out the reconcile grace.
        self.journal.mark_body_complete(row.idx)
        reached("body-complete")
        if pending:
            yield b"".join(pending)

    # -- reconciliation -----------------------------------------------------

    async def reconcile(self, snap: Snapshot) -> None:
        """Settle every create whose outcome is unknown, before anything is resent."""
        intents = self.journal.batches(BatchState.INTENT)
        if not intents:
            return
        theirs, unconfirmed = others_in_flight(await self.ledger.reservations(), self.ledger.owner)
        known = self.journal.known_batch_ids() | theirs
        for row in intents:
            sent_at = row.intent_at or 0.0
            candidates = candidates_for(row.requests, sent_at, snap.listed.values(), known, self.s.clock_skew)
            rivals = sum(1 for r in intents if r.idx != row.idx and r.requests == row.requests) + unconfirmed[row.requests]
            d = decide(candidates, rivals=rivals, sent_at=sent_at, listed_at=snap.at, grace=self.s.reconcile_grace,
                       body_complete=row.body_complete)
            if d.action is Action.COMPARE:
                d = await self._compare(row, d, sent_at, snap.at)
            await self._apply(row, d, known)

    async def _compare(self, row: BatchRow, d: Decision, sent_at: float, listed_at: float) -> Decision:
        """Settle an unknown create among ended candidates by their results: our custom_ids first, then whose
        prompts they were billed for (`_ownership`). Those proven another's are never candidates again."""
        found: dict[str, Results] = {}
        for b in d.candidates:
            got = await read_results(self.api, b)
            if got is None:
                return Decision(Action.WAIT, d.candidates, "a candidate's results could not be read whole yet")
            found[str(b.get("id"))] = got
        mine = {custom_id(body) for _, _, body, _ in self._requests_of(row)}
        same = with_our_ids(mine, {k: r.ids for k, r in found.items()})
        bodies = ((custom_id(body), body) for _, _, body, _ in self._requests_of(row))
        fits = await weigh(self.api, bodies, {k: found[k].billed for k in same})
        if fits is None:
            return Decision(Action.WAIT, d.candidates, "our requests could not be counted yet")
        choice = choose(fits, [k for k in nearest_first(d.candidates, sent_at) if k in fits])
        if choice.foreign:
            self.journal.foreign(choice.foreign)
            self.emit("not_ours", {"batch": row.idx, "ids": list(choice.foreign), "why": "its usage is another's prompts"})
        return compared(choice, d.candidates, sent_at=sent_at, listed_at=listed_at, grace=self.s.reconcile_grace)

    async def _apply(self, row: BatchRow, d: Decision, known: set[str]) -> None:
        if d.action is Action.ADOPT:
            batch = d.candidates[0]
            batch_id = str(batch.get("id"))
            self.api.note_created(batch_id)
            self.journal.mark_created(row.idx, batch_id, batch.get("created_at"), adopted=d.proof)
            await self.ledger.confirm(row.idx, batch_id)
            known.add(batch_id)
            self.emit("reconciled", {"batch": row.idx, "outcome": "created", "id": batch_id, "how": d.reason})
        elif d.action is Action.ABANDON:
            self.journal.back_to_planned(row.idx)
            await self.ledger.release(row.idx)
            self.emit("reconciled", {"batch": row.idx, "outcome": "not created", "how": d.reason})
        elif d.candidates:
            self.emit("reconciling", {"batch": row.idx, "candidates": len(d.candidates), "how": d.reason})

    def form_retry_batches(self) -> None:
        """Pack requests waiting for another attempt into new batches, once every first attempt has been admitted."""
        j = self.journal
        if self.user_canceled or self.budget_stopped or j.count(BatchState.PLANNED) or not j.pending_count():
            return
        limits = Limits(max_requests=self.batch_size, max_bytes=self.s.limits.max_bytes)
        requests, batches = j.plan_retries(lambda rows: pack_rows(rows, limits),
                                           lambda g: body_size(len(g), sum(r.length for r in g)))
        self.emit("resubmitting", {"requests": requests, "batches": batches})

    # -- reporting ----------------------------------------------------------

    def progress(self, snap: Snapshot) -> None:
        j = self.journal
        self.emit("progress", {
            "total": (j.get_meta("report") or {}).get("requests", 0), "admitted": j.admitted_requests(),
            "final": j.final_count(), "depth": snap.depth + snap.unseen,
            "ceiling": self.ceiling if self.ceiling is not None else self.estimate.upper,
            "in_flight": j.count(BatchState.CREATED, BatchState.INTENT),
            "elapsed": round(self.clock() - self.started, 1),
        })

    def summary(self) -> Summary:
        return summarize(self.journal, self.out.path, refusals=self.refusals, prices=self.prices, budget=self.s.budget)


def pack_rows(rows: list[PendingRow], limits: Limits) -> list[list[PendingRow]]:
    """Requests in line order, cut by the one packing rule (`Packer`)."""
    packer = Packer(limits)
    groups: list[list[PendingRow]] = []
    for r in rows:
        if packer.add(r.length):
            groups.append([])
        groups[-1].append(r)
    return groups


def _range(closed: tuple[int, int], first: tuple[int, int, str, int], last: tuple[int, int, str, int]) -> tuple[Any, ...]:
    """(requests, bytes, first_line, last_line, start, end, first_cid, last_cid) of an input-range batch."""
    return (*closed, first[0], last[0], first[1], last[1] + last[3], first[2], last[2])


