"""The submit loop: observe the queue, collect what ended, reconcile, admit what fits, wait.

Every step that changes the world is journaled before it is taken (the intent
before a create) or in the same transaction as its effect (results rows with
the output file's committed length), so the loop can be killed anywhere and a
rerun of the same command continues: nothing lost, nothing submitted twice.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson

from .admission import CeilingEstimate, admit, batch_size_for, room
from .client import ApiClient
from .errors import (
    ApiError,
    AuthenticationError,
    CreateOutcomeUnknown,
    GatekeeperError,
    InputError,
    JournalError,
    QueueFull,
    RateLimited,
    TransportError,
    ExitCode,
    UsageError,
)
from .headroom import LIVE_STATES, live_batches
from .inputs import hash_file, iter_range, read_at, stat_identity
from .journal import BatchRow, BatchState, Journal
from .ledger import Ledger, LocalLedger
from .planner import plan
from .prices import PriceTable, load_prices
from .queue import LIVE_HORIZON, Connection, read_ceiling, read_live
from .sizing import Limits, Packer, body_chunks, body_size
from .verdicts import classify, usage_of

Checkpoint = Callable[[str], None]
EventSink = Callable[[str, dict[str, Any]], None]
ResultSink = Callable[[str, dict[str, Any]], None]


class Interrupted(GatekeeperError):
    """The run was stopped on request; the journal is consistent and the run resumable."""

    exit_code = ExitCode.INTERRUPTED


@dataclass(frozen=True)
class SubmitSettings:
    """Settings of one submit run. Every field has a documented default."""

    state_dir: Path | None = None  # default: INPUT.gatekeeper/ beside the input
    out: Path | None = None  # default: STATE_DIR/results.jsonl
    ceiling: int | None = None  # --ceiling; default: read with the Admin key
    margin: int = 0  # requests of headroom left for others
    poll: float = 30.0  # seconds between queue readings
    max_in_flight: int | None = None  # batches of ours live at once, at most
    max_attempts: int = 3  # attempts per request, the first included
    limits: Limits = field(default_factory=Limits)
    reconcile_grace: float = 180.0  # seconds an unknown create may take to show in the listing
    clock_skew: float = 300.0  # tolerance between our clock and created_at
    min_backoff: float = 5.0  # shortest wait after a queue-full refusal
    max_backoff: float = 600.0
    ledger: str | None = None  # None/"local", "sqlite:///path", "redis://host:port/db"
    ledger_ttl: float = 900.0  # seconds a dead submitter's reservations outlive its last heartbeat


@dataclass
class Summary:
    """How the job ended. `to_json` is what `submit --json` prints."""

    requests: int = 0
    succeeded: int = 0
    errored: int = 0
    expired: int = 0
    canceled: int = 0
    invalid: int = 0
    batches: int = 0
    pending: int = 0  # valid requests without a final result yet (an interrupted run)
    resubmitted: int = 0
    succeeded_after_retry: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float | None = None
    refusals: int = 0
    output: str = ""
    state_dir: str = ""
    complete: bool = False

    @property
    def ok(self) -> bool:
        return self.complete and self.invalid == 0 and self.succeeded == self.requests

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "succeeded": self.succeeded, "errored": self.errored, "expired": self.expired,
            "canceled": self.canceled, "invalid": self.invalid, "batches": self.batches, "pending": self.pending,
            "resubmitted": self.resubmitted, "succeeded_after_retry": self.succeeded_after_retry,
            "errors": self.errors, "usage": self.usage, "cost_usd": self.cost_usd, "refusals": self.refusals,
            "complete": self.complete, "output": self.output, "state_dir": self.state_dir,
        }


def default_state_dir(input_path: str) -> Path:
    return Path(input_path + ".gatekeeper")


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _total(batch: dict[str, Any]) -> int:
    counts = batch.get("request_counts") or {}
    return sum(int(v) for v in counts.values() if isinstance(v, int))


@dataclass
class Snapshot:
    """One reading of the queue, with what it says about our own batches."""

    depth: int
    listed: dict[str, dict[str, Any]]  # id -> batch, primary workspace
    unseen: int  # our live requests the listing does not show


class Job:
    """One submit run over one input and one state directory."""

    def __init__(
        self,
        input_path: str,
        settings: SubmitSettings,
        conn: Connection,
        journal: Journal,
        *,
        emit: EventSink,
        stop: anyio.Event,
        checkpoint: Checkpoint = lambda name: None,
        on_result: ResultSink | None = None,
        ledger: Ledger | None = None,
        clock: Callable[[], float] = time.monotonic,
        prices: PriceTable | None = None,
    ) -> None:
        self.prices = prices
        self.path = input_path
        self.s = settings
        self.conn = conn
        self.api: ApiClient = conn.primary
        self.journal = journal
        self.emit = emit
        self.stop = stop
        self.checkpoint = checkpoint
        self.on_result = on_result
        self.ledger = ledger or LocalLedger()
        self.clock = clock
        self.out_path = str(settings.out or (journal.state_dir / "results.jsonl"))
        self.ceiling: int | None = None
        self.ceiling_source: str | None = None
        self.estimate = CeilingEstimate()
        self.backoff_until = 0.0
        self.refusal_streak = 0
        self.refusals = 0
        self.batch_size = settings.limits.max_requests
        self.started = clock()

    # -- preparation --------------------------------------------------------

    async def prepare(self) -> None:
        """Read the ceiling; plan the input into the journal, or check it is the same input on resume."""
        self.ceiling, self.ceiling_source, error = await read_ceiling(self.conn, self.s.ceiling)
        if error and self.ceiling is None:
            self.emit("ceiling_unknown", {"reason": error, "policy": "learn a bound from queue-full refusals"})
        j = self.journal
        if j.initialized:
            self._check_identity()
            recorded = j.get_meta("output")
            if self.s.out is None and recorded:
                self.out_path = recorded
            elif recorded and os.path.abspath(self.out_path) != recorded:
                raise JournalError(f"this job writes its results to {recorded}; --out cannot change on resume")
            meta = j.get_meta("settings") or {}
            self.batch_size = int(meta.get("batch_size", self.batch_size))
            self.emit("resumed", {"state_dir": str(j.state_dir), "batches": len(j.batches()),
                                  "collected": len(j.batches(BatchState.COLLECTED))})
            return
        self.batch_size = batch_size_for(self.ceiling, self.s.margin, self.s.limits.max_requests)
        limits = Limits(max_requests=self.batch_size, max_bytes=self.s.limits.max_bytes)
        size, mtime = stat_identity(self.path)
        report = plan(self.path, limits=limits, hash_content=True)
        if stat_identity(self.path) != (size, mtime):
            raise InputError(f"{self.path} changed while it was being read")
        with j.transaction() as db:
            j.set_meta(db, "input", {"path": os.path.abspath(self.path), "size": size, "mtime_ns": mtime,
                                     "sha256": report.content_hash})
            j.set_meta(db, "settings", {"batch_size": self.batch_size, "max_bytes": self.s.limits.max_bytes,
                                        "max_attempts": self.s.max_attempts, "ceiling_at_plan": self.ceiling})
            j.set_meta(db, "report", {"requests": report.requests, "invalid": report.invalid, "lines": report.lines,
                                      "models": report.models})
            j.set_meta(db, "output_committed", 0)
            j.set_meta(db, "output", os.path.abspath(self.out_path))
            j.insert_batches(db, ((b.index, "plan", b.requests, b.bytes, b.first_line, b.last_line, b.start_offset,
                                   b.end_offset, b.first_custom_id, b.last_custom_id) for b in report.batches))
            db.executemany("INSERT INTO rejections VALUES (?, ?, ?)",
                           ((e.line, e.custom_id, e.reason) for e in report.errors))
            j.event(db, "planned", requests=report.requests, batches=len(report.batches), invalid=report.invalid)
        self.emit("planned", {"requests": report.requests, "invalid": report.invalid, "batches": len(report.batches),
                              "batch_size": self.batch_size, "ceiling": self.ceiling})
        for err in report.errors[:20]:
            self.emit("rejected", err.to_json())

    def _check_identity(self) -> None:
        j = self.journal
        known = j.get_meta("input")
        size, mtime = stat_identity(self.path)
        if (size, mtime) == (known["size"], known["mtime_ns"]):
            return
        digest = hash_file(self.path) if size == known["size"] else ""
        if digest != known["sha256"]:
            raise JournalError(
                f"state directory {j.state_dir} belongs to {known['path']} as it was when the job started "
                f"({known['size']:,} bytes, sha256 {known['sha256'][:12]}); {self.path} is different. "
                "Use another --state, or restore the input"
            )
        with j.transaction() as db:
            j.set_meta(db, "input", {**known, "mtime_ns": mtime, "path": os.path.abspath(self.path)})

    # -- the loop -----------------------------------------------------------

    async def run(self) -> Summary:
        self._truncate_output()
        for row in self.journal.batches(BatchState.INTENT, BatchState.CREATED):
            await self.ledger.hold(row.idx, row.requests, row.batch_id)  # a resumed run takes its reservations back
        while True:
            self._check_stop()
            snap = await self.observe()
            await self.collect_ended()
            await self.reconcile(snap)
            self.form_retry_batches()
            if self.done():
                break
            await self.admit_round(snap)
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
        with anyio.move_on_after(max(0.0, seconds)):
            await self.stop.wait()
        self._check_stop()

    @property
    def user_canceled(self) -> bool:
        return bool(self.journal.get_meta("user_canceled"))

    def done(self) -> bool:
        j = self.journal
        if self.user_canceled:  # nothing new goes out; finish what is live
            return not j.batches(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED)
        open_states = (BatchState.PLANNED, BatchState.INTENT, BatchState.CREATED, BatchState.ENDED)
        return not j.batches(*open_states) and not j.scalar("SELECT COUNT(*) FROM pending")

    # -- observing ----------------------------------------------------------

    async def observe(self) -> Snapshot:
        """List the queue over every key; move our batches that ended; count what the listing misses."""
        listed: dict[str, dict[str, Any]] = {}
        horizon = time.time() - LIVE_HORIZON.total_seconds()
        try:
            async for b in self.api.iter_batches(limit=1000):
                created = _parse_time(b.get("created_at"))
                if created is not None and created < horizon:
                    break
                listed[str(b.get("id"))] = b
        except AuthenticationError as exc:
            raise UsageError(f"{self.api.label} was refused by the API (HTTP {exc.status} {exc.error_type or 'error'})") from None
        depth = sum(r.processing for r in live_batches(listed.values(), "ws1"))
        for i, other in enumerate(self.conn.workspaces[1:], start=2):
            depth += sum(r.processing for r in await read_live(other, f"ws{i}"))
        unseen = 0
        for row in self.journal.batches(BatchState.CREATED):
            batch = listed.get(row.batch_id or "")
            if batch is None:
                batch = await self.api.retrieve_batch(str(row.batch_id))
                if batch.get("processing_status") in LIVE_STATES:
                    unseen += row.requests
            if batch.get("processing_status") == "ended":
                with self.journal.transaction() as db:
                    self.journal.set_state(db, row.idx, BatchState.ENDED, ended_at=batch.get("ended_at"),
                                           counts=orjson.dumps(batch.get("request_counts")).decode())
                self.emit("ended", {"batch": row.idx, "id": row.batch_id, "counts": batch.get("request_counts")})
                await self.ledger.release(row.idx)
        unseen += sum(r.requests for r in self.journal.batches(BatchState.INTENT))
        await self.ledger.observe(depth)
        return Snapshot(depth, listed, unseen)

    # -- admission ----------------------------------------------------------

    async def admit_round(self, snap: Snapshot) -> None:
        now = self.clock()
        if now < self.backoff_until or self.user_canceled:
            return
        waiting = self.journal.batches(BatchState.PLANNED)
        if not waiting:
            return
        depth, unseen = snap.depth, snap.unseen
        bound = self.ceiling if self.ceiling is not None else self.estimate.bound(now)
        free = room(bound, depth, self.s.margin, unseen)
        in_flight = len(self.journal.batches(BatchState.CREATED, BatchState.INTENT))
        count = admit([b.requests for b in waiting], free, in_flight=in_flight, max_in_flight=self.s.max_in_flight)
        if count == 0:
            self.emit("waiting", {"next": waiting[0].requests, "depth": depth, "unseen": unseen, "ceiling": bound,
                                  "in_flight": in_flight})
        for row in waiting[:count]:
            self._check_stop()
            if not await self.ledger.reserve(row.idx, row.requests, bound, depth + unseen):
                self.emit("waiting", {"next": row.requests, "reason": "ledger", "depth": depth})
                return
            outcome = await self.create(row, depth, unseen)
            if outcome is None:
                if self.journal.batch(row.idx).state is BatchState.PLANNED:
                    await self.ledger.release(row.idx)  # definitely not created
                return  # an unknown outcome keeps its reservation until reconciled
            await self.ledger.confirm(row.idx, outcome)
            unseen += row.requests  # ours now, and not yet in any listing we read
            snap.unseen = unseen

    async def create(self, row: BatchRow, depth: int, unseen: int) -> str | None:
        """Create one batch; its id, or None when it must wait (refused, or outcome unknown)."""
        j = self.journal
        if stat_identity(self.path) != tuple(j.get_meta("input")[k] for k in ("size", "mtime_ns")):
            self._check_identity()  # raises if the content changed
        self.checkpoint("before-intent")
        with j.transaction() as db:
            j.set_state(db, row.idx, BatchState.INTENT, intent_at=time.time())
        self.checkpoint("after-intent")
        try:
            batch = await self.api.create_batch(self._body(row), size=row.bytes)
        except QueueFull as exc:
            self._refused(row, exc, depth, unseen)
            return None
        except (RateLimited, TransportError) as exc:
            with j.transaction() as db:
                j.set_state(db, row.idx, BatchState.PLANNED, intent_at=None)
            wait = getattr(exc, "retry_after", None) or self.s.min_backoff
            self.backoff_until = self.clock() + min(wait, self.s.max_backoff)
            self.emit("create_deferred", {"batch": row.idx, "reason": str(exc), "wait": wait})
            return None
        except CreateOutcomeUnknown as exc:
            self.emit("create_unknown", {"batch": row.idx, "reason": str(exc)})
            return None  # stays INTENT: reconciled before anything is resent
        except ApiError:
            # A definite refusal we cannot fix by waiting (400, 413, spend limit, auth): nothing was
            # created, so the batch goes back to planned and the run stops, resumable once fixed.
            # Anything else (a cancellation mid-POST, a changed input mid-body) leaves the intent to reconcile.
            with j.transaction() as db:
                j.set_state(db, row.idx, BatchState.PLANNED, intent_at=None)
            raise
        self.checkpoint("after-create")
        batch_id = str(batch["id"])
        with j.transaction() as db:
            j.set_state(db, row.idx, BatchState.CREATED, batch_id=batch_id, created_at=batch.get("created_at"))
        self.refusal_streak = 0
        self.estimate.accepted(depth, unseen, row.requests)
        self.emit("admitted", {"batch": row.idx, "id": batch_id, "requests": row.requests, "bytes": row.bytes,
                               "depth": depth + unseen + row.requests, "ceiling": self.ceiling})
        return batch_id

    def _refused(self, row: BatchRow, exc: QueueFull, depth: int, unseen: int) -> None:
        with self.journal.transaction() as db:
            self.journal.set_state(db, row.idx, BatchState.PLANNED, intent_at=None)
            self.journal.event(db, "queue_full", row.idx, depth=depth, requests=row.requests)
        self.refusals += 1
        self.refusal_streak += 1
        now = self.clock()
        self.estimate.refused(depth, unseen, row.requests, now)
        wait = max(exc.retry_after or 0.0, self.s.min_backoff * 2 ** (self.refusal_streak - 1))
        self.backoff_until = now + min(wait, self.s.max_backoff)
        self.emit("refused", {"batch": row.idx, "requests": row.requests, "depth": depth, "unseen": unseen,
                              "retry_after": exc.retry_after, "wait": round(min(wait, self.s.max_backoff), 3),
                              "learned_bound": self.estimate.upper if self.ceiling is None else None})

    def _requests_of(self, row: BatchRow) -> Iterator[tuple[int, int, bytes, int]]:
        """(line, offset, bytes, attempt) of every request in a batch, in order, one at a time."""
        if row.kind == "plan":
            skip = self.journal.rejected_lines(row.first_line, row.last_line)
            for line, off, body in iter_range(self.path, row.start_offset, row.end_offset, row.first_line, skip):
                yield line, off, body, 1
            return
        for line, off, length, _, attempt in self.journal.members(row.idx):
            yield line, off, read_at(self.path, off, length), attempt

    async def _body(self, row: BatchRow) -> AsyncIterator[bytes]:
        """The create body, streamed from the input's bytes; its length must be the journaled size."""
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
        if pending:
            yield b"".join(pending)

    # -- reconciliation -----------------------------------------------------

    async def reconcile(self, snap: Snapshot) -> None:
        """Settle every create whose outcome is unknown, before anything is resent."""
        intents = self.journal.batches(BatchState.INTENT)
        if not intents:
            return
        known = self.journal.known_batch_ids()
        for row in intents:
            sent_at = row.intent_at or 0.0
            candidates = [
                b for b in snap.listed.values()
                if str(b.get("id")) not in known and _total(b) == row.requests
                and (_parse_time(b.get("created_at")) or 0.0) >= sent_at - self.s.clock_skew
            ]
            rivals = [r for r in intents if r.idx != row.idx and r.requests == row.requests]
            if len(candidates) == 1 and not rivals:
                self._adopt(row, candidates[0], how="listing")
                await self.ledger.confirm(row.idx, str(candidates[0].get("id")))
                known.add(str(candidates[0].get("id")))
                continue
            if not candidates:
                if time.time() - sent_at > self.s.reconcile_grace:
                    with self.journal.transaction() as db:
                        self.journal.set_state(db, row.idx, BatchState.PLANNED, intent_at=None)
                    await self.ledger.release(row.idx)
                    self.emit("reconciled", {"batch": row.idx, "outcome": "not created", "how": "absent from listing"})
                continue
            # Ambiguous: wait for the candidates to end, then match on their results' custom_ids.
            if any(b.get("processing_status") != "ended" for b in candidates):
                self.emit("reconciling", {"batch": row.idx, "candidates": len(candidates), "how": "waiting for them to end"})
                continue
            mine = {self._custom_id(body) for _, _, body, _ in self._requests_of(row)}
            for b in candidates:
                ids = {orjson.loads(line).get("custom_id") async for line in self.api.iter_results(b)}
                if ids == mine:
                    self._adopt(row, b, how="results")
                    await self.ledger.confirm(row.idx, str(b.get("id")))
                    known.add(str(b.get("id")))
                    break
            else:
                with self.journal.transaction() as db:
                    self.journal.set_state(db, row.idx, BatchState.PLANNED, intent_at=None)
                await self.ledger.release(row.idx)
                self.emit("reconciled", {"batch": row.idx, "outcome": "not created", "how": "no candidate's results match"})

    @staticmethod
    def _custom_id(body: bytes) -> str:
        return str(orjson.loads(body)["custom_id"])

    def _adopt(self, row: BatchRow, batch: dict[str, Any], how: str) -> None:
        batch_id = str(batch.get("id"))
        self.api.note_created(batch_id)
        with self.journal.transaction() as db:
            self.journal.set_state(db, row.idx, BatchState.CREATED, batch_id=batch_id, created_at=batch.get("created_at"))
        self.emit("reconciled", {"batch": row.idx, "outcome": "created", "id": batch_id, "how": how})

    # -- results ------------------------------------------------------------

    def _truncate_output(self) -> None:
        committed = self.journal.committed_output()
        fd = os.open(self.out_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != committed:
                os.ftruncate(fd, committed)  # drop a partial batch a crash left behind
                os.fsync(fd)
        finally:
            os.close(fd)

    async def collect_ended(self) -> None:
        for row in self.journal.batches(BatchState.ENDED):
            self._check_stop()
            await self.collect(row)

    async def collect(self, row: BatchRow) -> None:
        """Stream one ended batch's results into the output; commit them with the journal in one transaction."""
        j = self.journal
        members: dict[str, tuple[int, int, int, int]] = {}
        for line, off, body, attempt in self._requests_of(row):
            members[self._custom_id(body)] = (line, off, len(body), attempt)
        start = j.committed_output()
        pos = start
        finals: list[tuple[Any, ...]] = []
        retries: list[tuple[Any, ...]] = []
        history: list[tuple[Any, ...]] = []
        user_canceled = bool(j.get_meta("user_canceled"))
        max_attempts = int((j.get_meta("settings") or {}).get("max_attempts", self.s.max_attempts))
        batch = await self.api.retrieve_batch(str(row.batch_id))
        fd = os.open(self.out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        final_count = retry_count = 0

        def flush(db: Any) -> None:
            # Rows go to SQLite as they come (inside the one open transaction), so memory does not grow with the batch.
            nonlocal final_count, retry_count
            db.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", finals)
            db.executemany("INSERT OR REPLACE INTO pending VALUES (?, ?, ?, ?, ?)", retries)
            db.executemany("INSERT OR REPLACE INTO attempts VALUES (?, ?, ?, ?, ?, ?)", history)
            final_count += len(finals)
            retry_count += len(retries)
            finals.clear()
            retries.clear()
            history.clear()

        committed = False
        try:
            with j.transaction() as db, os.fdopen(fd, "ab", buffering=1 << 20) as out:
                seen = 0
                async for raw in self.api.iter_results(batch):
                    seen += 1
                    if seen % 2048 == 0:
                        self._check_stop()
                    if len(finals) >= 5000 or len(history) >= 1000:
                        flush(db)
                    try:
                        obj = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        self.emit("bad_result_line", {"batch": row.idx, "bytes": len(raw)})
                        continue
                    cid = obj.get("custom_id") if isinstance(obj, dict) else None
                    member = members.pop(cid, None) if isinstance(cid, str) else None
                    if member is None:
                        self.emit("unknown_result", {"batch": row.idx, "custom_id": cid})
                        continue
                    line, off, length, attempt = member
                    result = obj.get("result")
                    v = classify(result, user_canceled=user_canceled)
                    if v.retry and attempt < max_attempts:
                        retries.append((line, off, length, cid, attempt + 1))
                        history.append((line, attempt, row.idx, v.type, v.error_type, raw))
                        continue
                    out.write(raw)
                    out.write(b"\n")
                    model, tin, tout, tcc, tcr = usage_of(result) if v.type == "succeeded" else (None, 0, 0, 0, 0)
                    finals.append((line, cid, v.type, v.error_type, attempt, pos, len(raw) + 1, model, tin, tout, tcc, tcr))
                    pos += len(raw) + 1
                    if pos - start == len(raw) + 1:
                        self.checkpoint("mid-results")
                for cid, (line, off, length, attempt) in members.items():
                    # Listed in the batch but absent from its results: never dropped silently.
                    self.emit("missing_result", {"batch": row.idx, "custom_id": cid})
                    if attempt < max_attempts:
                        retries.append((line, off, length, cid, attempt + 1))
                        continue
                    raw = orjson.dumps({"custom_id": cid, "result": {"type": "errored", "error": {"type": "error", "error": {
                        "type": "gatekeeper_missing_result", "message": "the batch's results had no line for this request"},
                        "request_id": None}}})
                    out.write(raw + b"\n")
                    finals.append((line, cid, "errored", "gatekeeper_missing_result", attempt, pos, len(raw) + 1,
                                   None, 0, 0, 0, 0))
                    pos += len(raw) + 1
                out.flush()
                os.fsync(out.fileno())
                flush(db)
                j.set_meta(db, "output_committed", pos)
                j.set_state(db, row.idx, BatchState.COLLECTED)
                self.checkpoint("before-results-commit")
            committed = True
        finally:
            if not committed:
                self._truncate_output()
        self.emit("collected", {"batch": row.idx, "id": row.batch_id, "final": final_count, "retry": retry_count})
        if self.on_result is not None:
            self._replay(start, pos)

    def _replay(self, start: int, end: int) -> None:
        """Hand the newly committed lines to the library caller, read back from the output (bounded memory)."""
        assert self.on_result is not None
        with open(self.out_path, "rb") as f:
            f.seek(start)
            while f.tell() < end:
                obj = orjson.loads(f.readline())
                self.on_result(obj["custom_id"], obj["result"])

    def form_retry_batches(self) -> None:
        """Pack requests waiting for another attempt into new batches, once every first attempt has been admitted."""
        j = self.journal
        if self.user_canceled or j.batches(BatchState.PLANNED) or not j.scalar("SELECT COUNT(*) FROM pending"):
            return
        rows = list(j.db.execute("SELECT line, offset, length, custom_id, attempt FROM pending ORDER BY line"))
        packer = Packer(Limits(max_requests=self.batch_size, max_bytes=self.s.limits.max_bytes))
        groups: list[list[tuple[int, int, int, str, int]]] = []
        for r in rows:
            if packer.add(r[2]):
                groups.append([])
            groups[-1].append(r)
        idx = j.next_batch_index()
        with j.transaction() as db:
            for g in groups:
                j.insert_batches(db, [(idx, "retry", len(g), body_size(len(g), sum(r[2] for r in g)), g[0][0], g[-1][0],
                                       g[0][1], g[-1][1] + g[-1][2], g[0][3], g[-1][3])])
                db.executemany("INSERT INTO members VALUES (?, ?, ?, ?, ?, ?)",
                               [(idx, line, off, length, cid, attempt) for line, off, length, cid, attempt in g])
                idx += 1
            db.execute("DELETE FROM pending")
            j.event(db, "resubmission_planned", requests=len(rows), batches=len(groups))
        self.emit("resubmitting", {"requests": len(rows), "batches": len(groups)})

    # -- reporting ----------------------------------------------------------

    def progress(self, snap: Snapshot) -> None:
        j = self.journal
        report = j.get_meta("report") or {}
        self.emit("progress", {
            "total": report.get("requests", 0),
            "admitted": int(j.scalar("SELECT COALESCE(SUM(requests), 0) FROM batches WHERE kind = 'plan' AND state NOT IN ('planned', 'intent')")),
            "final": int(j.scalar("SELECT COUNT(*) FROM results")),
            "depth": snap.depth + snap.unseen, "ceiling": self.ceiling if self.ceiling is not None else self.estimate.upper,
            "in_flight": len(j.batches(BatchState.CREATED, BatchState.INTENT)),
            "elapsed": round(self.clock() - self.started, 1),
        })

    def summary(self) -> Summary:
        return summarize(self.journal, self.out_path, refusals=self.refusals, prices=self.prices)


def summarize(j: Journal, out_path: str, *, refusals: int = 0, prices: PriceTable | None = None) -> Summary:
    report = j.get_meta("report") or {}
    by_type = j.counts_by_type()
    s = Summary(
        requests=int(report.get("requests", 0)),
        succeeded=by_type.get("succeeded", 0), errored=by_type.get("errored", 0), expired=by_type.get("expired", 0),
        canceled=by_type.get("canceled", 0), invalid=int(report.get("invalid", 0)),
        batches=int(j.scalar("SELECT COUNT(*) FROM batches WHERE batch_id IS NOT NULL")),
        errors={k or "unknown": v for k, v in j.counts_by_error().items()},
        resubmitted=int(j.scalar("SELECT COUNT(DISTINCT line) FROM attempts")),
        succeeded_after_retry=int(j.scalar("SELECT COUNT(*) FROM results WHERE type = 'succeeded' AND attempts > 1")),
        refusals=refusals, output=out_path, state_dir=str(j.state_dir),
    )
    final = int(j.scalar("SELECT COUNT(*) FROM results"))
    s.pending = s.requests - final
    s.complete = s.pending == 0
    row = j.db.execute("SELECT COALESCE(SUM(input_tokens),0), COALESCE(SUM(output_tokens),0), "
                       "COALESCE(SUM(cache_creation_tokens),0), COALESCE(SUM(cache_read_tokens),0) FROM results").fetchone()
    s.usage = {"input_tokens": row[0], "output_tokens": row[1], "cache_creation_input_tokens": row[2],
               "cache_read_input_tokens": row[3]}
    prices = prices or load_prices()
    total: float | None = 0.0
    for model, tin, tout, tcc, tcr in j.db.execute(
            "SELECT model, SUM(input_tokens), SUM(output_tokens), SUM(cache_creation_tokens), SUM(cache_read_tokens) "
            "FROM results WHERE type = 'succeeded' GROUP BY model"):
        cost = prices.cost(model, tin or 0, tout or 0, tcc or 0, tcr or 0)
        total = None if cost is None or total is None else total + cost
    s.cost_usd = None if total is None else round(total, 6)
    return s
