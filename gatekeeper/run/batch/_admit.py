"""Admission: what goes out now against the live headroom, the budget and the shared ledger, and each create
journaled before its first byte leaves (its outcome unknown until answered or reconciled)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import anyio

from ..._errors import (
    ApiError,
    CreateOutcomeUnknown,
    QueueFull,
    RateLimited,
    ServerError,
    TokenExpired,
    TransportError,
)
from ...api._http import CREATE_ANSWER_WAIT
from ...decide._admission import CeilingEstimate, QueueState, admit_round, deferral_wait, recut_size, refusal_wait
from ...decide._budget import Spend, body_worst
from ...decide._ownership import id_rank
from ...decide._reconcile import listing_grace, listing_would_show
from ...input._sizing import Limits, Packer, body_size, pack_rows
from ...state._journal import BatchRow, BatchState, PendingRow
from ...state._records import Group
from ..shared._budget import check_spend
from ..shared._cancel import REFUSED, cancel_batch
from ..shared._checkpoints import reached
from ..shared._inputs import stat_identity
from ..shared._part import Part, RunContext, Snapshot
from ..shared._prepare import check_identity
from ..shared._settings import SubmitSettings
from ._body import body_digest, stream_body
from ._collect import custom_id
from ._evidence import IdPrint
from ._orphans import reserve_settling
from ._reprime import PrimingGate
from ._turns import Turns, others_reserved, wanted


def waits_unproven(snap: Snapshot, settings: SubmitSettings, unknown: list[BatchRow]) -> bool:
    """Whether an unknown create has waited out the grace (its lag seen aside) on a listing never seen current, and
    so waits longer (`decide._reconcile.listing_grace`): the job's other batches then go, to show it current."""
    plain = listing_grace(settings.reconcile_grace, snap.lag)
    return snap.grace(settings.reconcile_grace) > plain and \
        any(listing_would_show(r.intent_at or 0.0, snap.at, plain) for r in unknown)


class Admitter(Part):
    """Creates batches as the queue has room, and keeps what admission has learned: the ceiling (or a bound on it
    from refusals), the backoff after a refusal, the batch size, and whether the budget allows more."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.ceiling: int | None = None
        self.estimate = CeilingEstimate()
        self.backoff_until = 0.0
        self.refusal_streak = 0
        self.server_streak = 0  # typed 5xx refusals of creates in a row (their waits double)
        self.creating = False
        self.refusals = 0
        self.batch_size = ctx.settings.limits.max_requests
        # the budget allows no more (or the run only collects): finish what is in flight, send nothing new
        self.budget_stopped = ctx.settings.collect_only
        self.budget_action: Spend | None = None  # this round's budget verdict (None: none was asked for)
        self._live_at_wait = 0  # the batches in flight when the budget last said wait
        self._worst: tuple[tuple[int, int, int], float] | None = None  # (batch, requests, bytes), its worst cost
        self._ids: tuple[tuple[int, int, int], str] | None = None  # (batch, requests, bytes), its custom_ids' print
        self.priming = PrimingGate(ctx)
        shares = self.journal.get_meta("shares") or {}
        self.turns = Turns(ctx.ledger, ctx.settings.label or self.journal.job or os.path.basename(ctx.path),
                           ctx.settings.priority, ctx.settings.share, ctx.clock, float(shares.get("waited_s", 0.0)))

    async def admit_round(self, snap: Snapshot) -> None:
        self.budget_action = None
        if self.settings.collect_only:
            # (it holds no turn: a killed run of its own, whose rerun this is, left a claim that wants room)
            await self.turns.turn(0)
            return
        planned = self.journal.batches(BatchState.PLANNED)
        if planned and self._reconciling(snap, planned[0].requests):
            return
        now = self.clock()
        bound = self.ceiling if self.ceiling is not None else self.estimate.bound(now)
        waiting, sizes, reserve, held = self._gated(planned, bound)
        q = QueueState(
            waiting=sizes, depth=snap.depth, unseen=snap.unseen + reserve, bound=bound, margin=self.settings.margin,
            in_flight=self.journal.count(BatchState.CREATED, BatchState.INTENT), max_in_flight=self.settings.max_in_flight,
            backoff_until=self.backoff_until, canceled=self.user_canceled,
        )
        count = admit_round(q, now)
        worst = self._worst_case(waiting[0]) if count and self.settings.budget is not None else None
        if worst is not None and not self._within_budget(waiting[0], worst, planned):
            await self.turns.turn(0)  # (held by its budget: it holds no turn meanwhile)
            return
        ceiling = None if q.bound is None else q.bound - q.margin - reserve
        seen = await self._seen(snap)
        want = wanted(waiting[0].requests if waiting else 0, q, self.budget_stopped, now)
        if not await self.turns.turn(want, ceiling, seen):
            self.emit("waiting", {"next": waiting[0].requests, "reason": "shares", "ahead": self.turns.ahead})
            return
        if count == 0 and planned and now >= self.backoff_until and not q.canceled:
            self.emit("waiting", {"next": waiting[0].requests, "depth": q.depth, "unseen": q.unseen,
                                  "ceiling": q.bound, "in_flight": q.in_flight} if waiting else
                      {"reason": "primer", "held": held, "depth": q.depth, "in_flight": q.in_flight})
        for k, row in enumerate(waiting[:count]):
            self.check_stop()
            if k and not await self.turns.turn(row.requests, ceiling, seen):
                return  # (each batch of a round takes its turn)
            if k and self.settings.budget is not None:
                worst = self._worst_case(row)
                if not self._within_budget(row, worst, planned):
                    await self.turns.turn(0)
                    return
            granted, stuck = await reserve_settling(self.ctx, snap, row.idx, row.requests, q.bound, seen, self._ids_print(row))
            if not granted:
                if stuck:
                    await self.turns.turn(0)  # (it holds no turn meanwhile; one held for room keeps it, rule 4)
                return
            outcome = await self.create(row, snap.depth, snap.unseen, worst)
            if outcome is None:
                if self.journal.batch(row.idx).state is BatchState.PLANNED:
                    await self.ledger.release(row.idx)  # definitely not created
                    await self.turns.turn(0)  # (backing off: it holds no turn meanwhile)
                return  # an unknown outcome keeps its reservation (and the turn) until reconciled
            await self.ledger.confirm(row.idx, outcome)
            snap.unseen += row.requests  # ours now, and not yet in any listing we read
            seen += row.requests
            rest = waiting[k + 1:]  # (its claim says at once what it wants next: the others need not wait a round)
            after = dataclasses.replace(q, in_flight=q.in_flight + k + 1)
            await self.turns.took(row.requests, seen,
                                  wanted(rest[0].requests if rest else 0, after, self.budget_stopped, now))

    def _reconciling(self, snap: Snapshot, next_batch: int) -> bool:
        """With a shared ledger, one unknown create at a time: the turn stays ours until it is reconciled (a lone
        unnamed candidate, proven at once), never until a rival of the same size ends and is weighed. Past the grace
        on a listing never seen current the job's other batches go on meanwhile: theirs, listed, show it current."""
        unknown = self.journal.batches(BatchState.INTENT)
        if not self.ledger.owner or not unknown or waits_unproven(snap, self.settings, unknown):
            return False
        self.emit("waiting", {"next": next_batch, "reason": "reconciling", "unknown_creates": len(unknown)})
        return True

    async def _seen(self, snap: Snapshot) -> int:
        """The depth this job sees for the ledger (`Turns.turn`, `reserve`): less what other submitters' reservations
        already cover of it."""
        seen = snap.depth + snap.unseen
        if not self.ledger.owner:
            return seen
        return seen - others_reserved(snap.listed.values(), await self.ledger.reservations(), self.ledger.owner)

    def _gated(self, planned: list[BatchRow], bound: int | None) -> tuple[list[BatchRow], list[int], int, int]:
        return self.priming.gated(planned, bound, self.batch_size)

    def _ids_print(self, row: BatchRow) -> str | None:
        """A print of the batch's custom_ids for a shared ledger, which records it with the reservation: a lost
        create's candidate carrying other ids is then never taken for this one's (None without a shared ledger)."""
        if not self.ledger.owner:
            return None
        key = (row.idx, row.requests, row.bytes)
        if self._ids is None or self._ids[0] != key:
            ids = IdPrint()
            for _, _, body, _ in self._requests_of(row):
                ids.add(id_rank(custom_id(body)))
            self._ids = (key, ids.text())
        return self._ids[1]

    def _worst_case(self, row: BatchRow) -> float:
        """The most this batch can cost (USD at batch prices): every request's input bound and full max_tokens
        (kept for the batch that waits: it is weighed every round until it goes)."""
        if self._worst is None or self._worst[0] != (row.idx, row.requests, row.bytes):
            self._worst = ((row.idx, row.requests, row.bytes), sum(body_worst(body, line, self.prices)
                                                        for line, _, body, _ in self._requests_of(row)))
        return self._worst[1]

    def _within_budget(self, row: BatchRow, worst: float, waiting: list[BatchRow]) -> bool:
        """Whether the batch may go; when not, cut what waits to the remaining budget, or stop admitting."""
        assert self.settings.budget is not None
        d = check_spend(self.journal, self.prices, self.settings.budget, worst, row.requests)
        self.budget_action = d.action
        if d.action is Spend.GO:
            return True
        if d.action is Spend.WAIT:
            self._live_at_wait = self.journal.count(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED)
            self.emit("waiting", {"next": row.requests, "reason": "budget", "worst_usd": round(worst, 6)})
            return False
        if d.action is Spend.CUT:
            self._recut(waiting, d.decision.size, "the budget left is below the waiting batch's worst case")
            return False
        if not self.budget_stopped:
            self.budget_stopped = True
            self.emit("budget_reached", {"budget": self.settings.budget, "spent": round(d.spent, 6),
                                         "in_flight_worst": round(d.in_flight, 6),
                                         "held_back": self.journal.held_back()})
        return False

    def budget_now(self) -> bool:
        """Whether the next round is due at once for the budget's sake: a batch was cut to what the budget left, or
        one waited for the batches in flight and a collection since freed budget (its verdict is taken now: a stop
        ends the run at once, a batch that fits goes at the next reading, neither a poll later)."""
        live = self.journal.count(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED)
        if self.budget_action is Spend.WAIT and not self.budget_stopped and live < self._live_at_wait:
            planned = self.journal.batches(BatchState.PLANNED)
            if planned and self._within_budget(planned[0], self._worst_case(planned[0]), planned):
                return True
        return self.budget_action in (Spend.CUT,)

    async def create(self, row: BatchRow, depth: int, unseen: int, worst: float | None = None) -> str | None:
        """Create one batch; its id, or None when it must wait (refused, or outcome unknown). While a create is out
        `creating` is set: a stop waits for its answer (bounded) rather than leave an unknown outcome to reconcile."""
        self.creating = True
        try:
            return await self._create(row, depth, unseen, worst)
        except ApiError:
            if self.journal.batch(row.idx).state is BatchState.PLANNED:  # (refused outright: nothing was made)
                with anyio.CancelScope(shield=True):
                    await self.ledger.release(row.idx)  # (an unconfirmed reservation holds every other job's creates)
            raise
        finally:
            self.creating = False

    async def _create(self, row: BatchRow, depth: int, unseen: int, worst: float | None) -> str | None:
        j = self.journal
        if stat_identity(self.path) != tuple(j.get_meta("input")[k] for k in ("size", "mtime_ns")):
            await check_identity(self.journal, self.path)  # raises if the content changed
        # (SigV4 signs the body's digest)
        digest = await body_digest(b for _, _, b, _ in self._requests_of(row)) if self.api.calls.signs_body else None
        try:
            await self.api.calls.authenticated()  # (a token exchanged before the intent: a refusal leaves none to reconcile)
        except TransportError as exc:
            self._deferred(row, exc)
            return None
        reached("before-intent")
        j.mark_intent(row.idx, self.clock(), worst)
        reached("after-intent")
        self.emit("creating", {"batch": row.idx, "requests": row.requests, "bytes": row.bytes,
                               "answer_within": CREATE_ANSWER_WAIT})
        await self.ledger.sending(row.idx)  # (unmarked, the ledger knows no batch came of the reservation)
        try:
            body = stream_body((b for _, _, b, _ in self._requests_of(row)), row, self.journal, self.path, self.clock)
            batch = await self.api.create_batch(body, size=row.bytes, body_sha256=digest)
        except QueueFull as exc:
            self._refused(row, exc, depth, unseen)
            return None
        except (RateLimited, TransportError, TokenExpired) as exc:  # (refused before it was read: nothing made)
            self._deferred(row, exc)
            return None
        except ServerError as exc:  # (a 5xx whose typed code proves nothing was made: `_codes.NOT_MADE`)
            # An outage of the account's (its encryption key out of reach) may last: each try uploads the whole body
            # again, so the waits double as after a full queue's refusals.
            self.server_streak += 1
            self._deferred(row, exc, refusal_wait(self.server_streak, exc.retry_after, self.settings.min_backoff,
                                                  self.settings.max_backoff))
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
        self.refusal_streak = self.server_streak = 0
        self.estimate.accepted(depth, unseen, row.requests)
        self.emit("admitted", {"batch": row.idx, "id": batch_id, "requests": row.requests, "bytes": row.bytes,
                               "depth": depth + unseen + row.requests, "ceiling": self.ceiling})
        if self.user_canceled:  # a cancel (another process, Airflow's on_kill) recorded while the create was out
            status = await cancel_batch(self.api, j, j.batch(row.idx))
            if status != REFUSED:  # (refused: journaled, it runs on; the loop's next reading says so, once)
                self.emit("canceled", {"batch": row.idx, "id": batch_id, "status": status})
        return batch_id

    def _refused(self, row: BatchRow, exc: QueueFull, depth: int, unseen: int) -> None:
        self.journal.record_refusal(row.idx, depth, row.requests)
        self.refusals += 1
        self.refusal_streak += 1
        now = self.clock()
        self.estimate.refused(depth, unseen, row.requests, now)
        wait = refusal_wait(self.refusal_streak, exc.retry_after, self.settings.min_backoff, self.settings.max_backoff)
        self.backoff_until = now + wait
        self.emit("refused", {"batch": row.idx, "requests": row.requests, "depth": depth, "unseen": unseen,
                              "retry_after": exc.retry_after, "wait": round(wait, 3),
                              "learned_bound": self.estimate.upper if self.ceiling is None else None})
        reached("after-refusal")
        waiting = self.journal.batches(BatchState.PLANNED)
        size = recut_size(self.batch_size, max(b.requests for b in waiting), self.estimate.bound(now), self.settings.margin,
                          row.requests)
        if size is not None:
            self._recut(waiting, size, "refusals show the ceiling is below the waiting batches")

    def _recut(self, waiting: list[BatchRow], size: int, reason: str) -> None:
        """Cut every batch not yet created into batches of at most `size` requests (one journal transaction)."""
        limits = Limits(max_requests=size, max_bytes=self.settings.limits.max_bytes)
        ranges = _recut_ranges([r for r in waiting if r.kind == "plan"], limits, self._requests_of)
        groups: list[Group] = []
        for r in waiting:  # each member-listed batch cut apart, keeping its kind and round (priming depends on both)
            if r.kind != "plan":
                rows = [PendingRow(line, off, len(body), custom_id(body), attempt)
                        for line, off, body, attempt in self._requests_of(r)]
                groups += [(r.kind, r.cache_round, g) for g in pack_rows(rows, limits)]
        self.journal.groups.recut(size, ranges, groups, lambda g: body_size(len(g), sum(r.length for r in g)))
        self.batch_size = size
        self.emit("recut", {"batch_size": size, "replaced": len(waiting), "batches": len(ranges) + len(groups),
                            "reason": reason})

    def _deferred(self, row: BatchRow, exc: RateLimited | TransportError | TokenExpired | ServerError,
                  wait: float | None = None) -> None:
        self.journal.back_to_planned(row.idx)
        if wait is None:
            wait = deferral_wait(getattr(exc, "retry_after", None), self.settings.min_backoff, self.settings.max_backoff)
        self.backoff_until = self.clock() + wait
        self.emit("create_deferred", {"batch": row.idx, "reason": str(exc), "wait": wait})


def _recut_ranges(rows: list[BatchRow], limits: Limits, requests_of: Any) -> list[tuple[Any, ...]]:
    """New input-range batches over the requests of `rows`, in order, cut by the one packing rule."""
    packer = Packer(limits)
    ranges: list[tuple[Any, ...]] = []
    first = last = (0, 0, "", 0)
    for row in rows:
        for line, off, body, _ in requests_of(row):
            item = (line, off, custom_id(body), len(body))
            if packer.add(len(body)):
                if packer.batches > 1:
                    ranges.append(_range(packer.closed, first, last))
                first = item
            last = item
    if packer.count:
        ranges.append(_range((packer.count, packer.size), first, last))
    return ranges


def _range(closed: tuple[int, int], first: tuple[int, int, str, int], last: tuple[int, int, str, int]) -> tuple[Any, ...]:
    """(requests, bytes, first_line, last_line, start, end, first_cid, last_cid) of an input-range batch."""
    return (*closed, first[0], last[0], first[1], last[1] + last[3], first[2], last[2])
