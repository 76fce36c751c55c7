"""Keeping a deadline: each reading, what the batch lane is projected not to finish in time moves to the real-time
lane (`decide._deadline` decides; this part acts, and journals each step).

Until one of the job's batches has ended, what its batches show (how long they have gone with nothing done) must
say the batch lane misses, not the prior turnaround alone; and the lane's limits must be known (the Admin API's, an
answer's headers) or read by a probe, made only once the batch lane is known to be late. Credentials that may not
call the Messages API (a 403 to the probe: on Claude Platform on AWS, a policy without the invoke action) close the
lane for the run, said once: the batch lane goes on, and the deadline may be missed.

A batch not yet created moves whole; a live batch is canceled, and its unfinished requests come back (once it has
ended and its results are collected) as requests waiting for another attempt; those move instead of forming a new
batch. With a budget, a move is made only when the real-time lane's worst case (the standard price, twice the
batch price) fits what is left of it: the budget wins over the deadline, and a deadline missed for it is said so.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..._errors import AuthenticationError, UsageError
from ..._prices import BATCH_DISCOUNT, BYTES_PER_TOKEN_PACING
from ...api._messages import Kind, probe_params, send_message
from ...decide._budget import Spend, body_worst
from ...decide._deadline import (
    Held,
    JobBatch,
    Moves,
    canceled_collect,
    canceled_watch,
    kept_slack,
    moves,
    newly_given_back,
    project,
    reading_by,
    resolve_deadline,
    stalled_for,
    turnaround,
)
from ...decide._headroom import format_time, parse_time
from ...decide._pacing import Cost
from ...state._journal import BatchRow, BatchState, Journal
from ..shared._budget import check_spend
from ..shared._checkpoints import reached
from ..shared._inputs import read_at
from ..shared._part import Part, RunContext, Snapshot
from ..shared._settings import SubmitSettings
from ._realtime import RealtimeLane

DONE_COUNTS = ("succeeded", "errored", "canceled", "expired")
MAX_PROBES = 3  # limit-reading calls a model at most


def deadline_of(s: SubmitSettings, now: float) -> float:
    """The run's deadline as wall seconds; a setting error when it cannot be read or has passed."""
    assert s.deadline is not None
    try:
        return resolve_deadline(s.deadline, now)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc), setting="deadline") from None


class Window:
    """A deadline's window, from the job's first run's start (the journal's first `deadline` event): what is kept in
    hand before the deadline (`kept_slack`), and for a canceled batch's results (`canceled_collect`)."""

    def __init__(self, ctx: RunContext, deadline: float) -> None:
        self.ctx, self.deadline = ctx, deadline
        self._span: float | None = None

    def span(self) -> float:
        if self._span is None:
            first = self.ctx.journal.outcomes.events_of("deadline")
            self._span = self.deadline - (first[0][0] if first else self.ctx.clock())
        return self._span

    def slack(self) -> float:
        return kept_slack(self.ctx.settings.deadline_slack, self.span())

    def collect(self) -> float:
        return canceled_collect(self.span())


class DeadlineKeeper(Part):
    """Moves work to the real-time lane when the batch lane is projected to miss the deadline."""

    def __init__(self, ctx: RunContext, deadline: float, lane: RealtimeLane) -> None:
        super().__init__(ctx)
        self.deadline = deadline
        self.lane = lane
        self.stalled = 0.0  # the longest any of this run's batches has gone with nothing done (seconds)
        self.unanswered = 0.0  # the longest a create of this run has gone with its outcome unknown (seconds)
        # batch -> the span it was projected to take when canceled (kept in the journal: a rerun projects with them)
        self.canceled_spans: dict[int, float] = {int(k): float(v) for k, v in
                                                 (self.journal.get_meta("deadline_canceled_spans") or {}).items()}
        self.sampled = False
        self.probes: dict[str, int] = {}  # model -> calls made only to read its limits
        self.answered: set[str] = set()  # models whose probe was answered (with their limits, or without: a gateway)
        self.closed: str | None = None  # why the lane may not be used this run (the credentials may not call it)
        self.window = Window(ctx, deadline)
        self.slack, self._collect = self.window.slack, self.window.collect
        self.passed_said = False
        self.asked: set[int] = set()  # batches this run asked to cancel and saw canceling (not re-asked on a stale listing)

    def _sample(self, n: int = 50) -> None:
        """The lane's projections start from this job's own requests: their models, and the mean cost of the first
        few."""
        self.sampled = True
        self.lane.paces.models = {str(m): int(n) for m, n in ((self.journal.get_meta("report") or {}).get("models") or {}).items()}
        rows = self.journal.batches()
        costs = []
        for _, _, body, _ in self._requests_of(rows[0]) if rows else ():
            costs.append(Cost(int(len(body) / BYTES_PER_TOKEN_PACING), int(orjson.loads(body)["params"]["max_tokens"])))
            if len(costs) >= n:
                break
        if costs and not self.lane.sent:
            self.lane.paces.mean_cost = Cost(sum(c.input for c in costs) // len(costs), sum(c.output for c in costs) // len(costs))

    async def steer(self, snap: Snapshot) -> None:
        self._say_passed()
        if self.closed is not None:
            return
        if not self.sampled:
            self._sample()
        await self._recancel(snap)
        m = self.decide(snap)
        if m.probe:  # (then decided again on what it measured: an assumed lane moves nothing)
            if not await self._probe():
                return
            m = self.decide(snap)
        given_back = _given_back(self.journal)
        if not m.any and not given_back:
            return
        refused = set(self.journal.get_meta("deadline_cancel_refused") or [])
        for idx in (i for i in m.cancel if i not in refused):
            span = m.projected[idx] - (parse_time(self.journal.batch(idx).created_at) or snap.at)
            await self._cancel(self.journal.batch(idx), span)
        for idx in m.move:
            self.move_planned(self.journal.batch(idx))
        if (m.move_pending or given_back) and self.journal.groups.pending_count():
            worst = self._worst_pending()
            if worst is not None:
                n = self.journal.lane.move_pending(worst)
                self.emit("to_realtime", {"requests": n, "source": "retry", "deadline": format_time(self.deadline),
                                          "lane_needs_s": self._lane_needs()})
        self.lane.wake.set()

    def _say_passed(self) -> None:
        """Once the deadline has passed with work unfinished, say so at once (the run goes on to finish it, in the
        batch lane: a budget, or credentials that may not call the real-time lane, kept it there), not only in the
        summary hours later."""
        if self.passed_said or self.clock() <= self.deadline:
            return
        j = self.journal
        left = sum(r.requests for r in j.batches(BatchState.PLANNED, BatchState.INTENT, BatchState.CREATED, BatchState.ENDED))
        left += j.groups.pending_count() + j.lane.unanswered()
        if left:
            self.passed_said = True
            self.emit("deadline_passed", {"deadline": format_time(self.deadline), "unfinished": left,
                                          "policy": "the run goes on until every request is final (exit 1: missed)"})

    async def _probe(self) -> bool:
        """Read the limits of each of the job's models the lane has not measured, with the smallest call there is
        (one output token); at most `MAX_PROBES` a model. Its cost is journaled with the lane's. Whether the lane
        may be used (not when the credentials may not call it)."""
        lane = self.lane
        for model in sorted(m for m in lane.paces.models if m not in lane.paces.limits and not lane.paces.pace(m).learned):
            if self.probes.get(model, 0) >= MAX_PROBES:
                continue
            self.probes[model] = self.probes.get(model, 0) + 1
            call = await send_message(self.api, orjson.dumps(probe_params(model)), stream=False)
            if call.kind is Kind.ACCOUNT and call.error is not None:
                if not (isinstance(call.error, AuthenticationError) and call.error.status == 403):
                    raise call.error  # (a key revoked, billing, a usage limit: the batch lane is refused alike)
                self._close(call.detail)
                return False
            lane.paces.pace(model).observe(call.headers, self.clock())
            if call.kind is Kind.ANSWERED:
                self.answered.add(model)
            usage = call.message.get("usage") if call.message else None
            self.journal.lane.probed(model, usage if isinstance(usage, dict) else None)
            self.emit("realtime_probe", {"model": model, "measured": lane.paces.pace(model).learned,
                                         "why": "the batch lane is known to miss the deadline; the lane's limits are "
                                                "read before anything moves to it"})
        return True

    def _close(self, why: str) -> None:
        """The credentials may not call the Messages API: the lane is not used this run (said once); the batch lane
        goes on, rather than the run stopping before any batch exists, at the same point on every rerun."""
        self.closed = why
        self.emit("realtime_closed", {"reason": why, "policy": "the real-time lane is not used this run; the batch lane "
                                      "goes on, and the deadline may be missed; grant the credentials "
                                      f"{self.api.calls.platform.permission('messages')} for the deadline to use it"})

    def wait(self, wait: float) -> float:
        """The loop's wait before its next reading, cut to come at this job's last chance (`reading_by`): the lane's
        time for every request not yet answered (in batches planned or live, waiting for another attempt, or queued
        in the lane)."""
        if self.closed is not None:
            return wait
        j = self.journal
        canceled = set(j.get_meta("deadline_canceled") or [])
        ending = sum(1 for r in j.batches(BatchState.CREATED) if r.idx in canceled)
        wait = canceled_watch(wait, ending, self.slack())
        live = [r for r in j.batches(BatchState.CREATED) if r.idx not in canceled and not r.cut]  # (cut: counted in the lane)
        n = sum(r.requests for r in j.batches(BatchState.PLANNED)) + sum(r.requests for r in live)
        n += j.groups.pending_count() + j.lane.unanswered()
        if n == 0:
            return wait
        lane = self.lane.paces.seconds_for(n) + self._collect()  # (`moves`' last chance)
        return reading_by(now=self.clock(), deadline=self.deadline, lane=lane, wait=wait, slack=self.slack())

    def _limits_read(self) -> bool:
        """Whether each of the job's models the lane has not measured was probed: answered without its limits, or
        tried `MAX_PROBES` times."""
        paces = self.lane.paces
        return bool(paces.models) and all(m in paces.limits or paces.pace(m).learned or m in self.answered
                                          or self.probes.get(m, 0) >= MAX_PROBES for m in paces.models)

    def decide(self, snap: Snapshot) -> Moves:
        j = self.journal
        canceled = set(j.get_meta("deadline_canceled") or [])
        # (a batch found by listing is not canceled before its results prove it ours: it may be another job's)
        live = [JobBatch(r.idx, r.requests, parse_time(r.created_at) or snap.at, _done(snap.listed.get(r.batch_id or "")))
                for r in j.batches(BatchState.CREATED)
                if r.idx not in canceled and not r.cut and _proven(j.adoptions.of(r.idx))]  # (cut: the lane's work)
        # (a create whose outcome is unknown may hold its requests: it is neither moved nor counted as movable)
        held = [Held(r.idx, r.requests) for r in j.batches(BatchState.PLANNED)] + [Held(None, j.groups.pending_count())]
        finished = j.batches(BatchState.ENDED, BatchState.COLLECTED)
        ended = [(c, e) for c, e in ((parse_time(r.created_at), parse_time(r.ended_at)) for r in finished
                                     if r.idx not in canceled) if c is not None and e is not None]
        now = self.clock()
        self.stalled = max([self.stalled, *(stalled_for(b, now) for b in live)])
        self.unanswered = max([self.unanswered, *(now - r.intent_at for r in j.batches(BatchState.INTENT) if r.intent_at)])
        spans = [*self.canceled_spans.values(), *(project(b, now, 0.0) - b.created for b in live if b.done)]
        turn = turnaround(ended, self.settings.turnaround, self.stalled, spans)
        # (until one of its batches has ended, the job's own turnaround is unknown: what its batches show decides, a
        # create left unanswered as long as one that waited with nothing done: the batch lane took nothing meanwhile)
        evidence = None if any(r.idx not in canceled for r in finished) else \
            turnaround([], 0.0, max(self.stalled, self.unanswered), spans)
        # (a batch canceled for the deadline gives its requests to the lane once it has ended: they are ahead in it)
        coming = sum(r.requests for r in j.batches(BatchState.CREATED, BatchState.ENDED) if r.idx in canceled)
        return moves(now=now, deadline=self.deadline, live=live, held=held, turn=turn, lane_time=self.lane.paces.seconds_for,
                     collect=self._collect(),
                     queued=j.lane.unanswered() + coming, slack=self.slack(), evidence=evidence,
                     measured=self.lane.paces.measured, read=self._limits_read())

    async def _cancel(self, row: BatchRow, span: float) -> None:
        """Cancel a live batch for the deadline; `span`: what it was projected to take (the job's turnaround counts it:
        the requests it gives back are projected as a new batch of the same stalled lane would be)."""
        if self._refused_by_budget(sum(self._worst(body, line) for line, _, body, _ in self._requests_of(row)), row.requests):
            return
        self.canceled_spans[row.idx] = span
        # (journaled before it is asked: a run killed between the two would otherwise send its requests back into a
        # new batch on the rerun; the rerun asks again, `recancel`)
        self.journal.set_meta("deadline_canceled_spans", {str(k): v for k, v in self.canceled_spans.items()})
        self.journal.set_meta("deadline_canceled", sorted({*(self.journal.get_meta("deadline_canceled") or []), row.idx}),
                              "deadline_cancel", batch=row.idx, id=row.batch_id)
        reached("deadline-cancel-journaled")
        await self._ask(row)

    async def _ask(self, row: BatchRow) -> None:
        """Ask the API to cancel a batch journaled as canceled for the deadline."""
        try:
            status = await self.api.cancel_if_running(str(row.batch_id))
        except AuthenticationError as exc:
            if exc.status != 403:
                raise
            return self._cancel_refused(row, exc)
        reached("deadline-canceled")
        if status != "ended":  # ("ended" may be a 404 for a batch created a moment before: asked again, `_recancel`)
            self.asked.add(row.idx)
        self.emit("deadline_cancel", {"batch": row.idx, "id": row.batch_id, "status": status,
                                      "why": "projected to end after the deadline; its unfinished requests go real time"})

    async def _recancel(self, snap: Snapshot) -> None:
        """Each reading: a batch journaled as canceled for the deadline that the listing shows still in progress is
        asked to cancel again (the run before was killed between the journal and the cancel, or the cancel was
        answered 404 by a batch created a moment before, which the API may not show yet)."""
        canceled = set(self.journal.get_meta("deadline_canceled") or [])
        for row in self.journal.batches(BatchState.CREATED):
            listed = snap.listed.get(row.batch_id or "")
            if row.idx in canceled - self.asked and listed is not None and listed.get("processing_status") == "in_progress":
                await self._ask(row)  # (journaled already, its budget weighed then: only asked again)

    def _cancel_refused(self, row: BatchRow, exc: AuthenticationError) -> None:
        """The credentials may not cancel (an IAM policy without the cancel action): the batch stays live and is
        never asked again in this job; the run goes on (its deadline may be missed), rather than stopping at the
        same decision on every rerun."""
        self.canceled_spans.pop(row.idx, None)
        self.journal.set_meta("deadline_canceled_spans", {str(k): v for k, v in self.canceled_spans.items()})
        self.journal.set_meta("deadline_canceled", [i for i in self.journal.get_meta("deadline_canceled") or [] if i != row.idx])
        refused = sorted({*(self.journal.get_meta("deadline_cancel_refused") or []), row.idx})
        self.journal.set_meta("deadline_cancel_refused", refused, "deadline_cancel_refused", batch=row.idx, id=row.batch_id)
        self.emit("deadline_cancel_refused", {"batch": row.idx, "id": row.batch_id, "reason": str(exc),
                                              "policy": "left live, not asked again; grant the credentials "
                                                        f"{self.api.calls.platform.permission('cancel')} for the "
                                                        "deadline to move it"})

    def takes(self, row: BatchRow) -> bool:
        """Whether the lane would take a batch's requests now: open to these credentials, within the budget."""
        if self.closed is not None:
            return False
        worst = [self._worst(body, line) for line, _, body, _ in self._requests_of(row)]
        return not self._refused_by_budget(sum(worst), len(worst))

    def move_unknown(self, row: BatchRow) -> bool:
        """A create whose batch may have been made, its wait cut by the deadline: its requests go through the lane
        counted as charged once already, so a call lost (a kill) is not made again (swarm seed 100095); the create
        stays to be reconciled (`state._realtime.move_cut`): a batch it made is collected. Whether they went."""
        return self.move_planned(row, cut=True)

    def move_planned(self, row: BatchRow, cut: bool = False) -> bool:
        """A planned (or `cut`) batch's requests to the real-time lane, within the budget; whether they went."""
        rows, worst = [], []
        for line, off, body, attempt in self._requests_of(row):
            rows.append((line, off, len(body), _cid(body), attempt))
            worst.append(self._worst(body, line))
        if self._refused_by_budget(sum(worst), len(rows)):
            return False
        n = (self.journal.lane.move_cut if cut else self.journal.lane.move_planned)(row.idx, rows, worst)
        self.emit("to_realtime", {"batch": row.idx, "requests": n, "source": "cut" if cut else "planned",
                                  "deadline": format_time(self.deadline), "lane_needs_s": self._lane_needs()})
        return bool(n)

    def _lane_needs(self) -> float:
        """Seconds the lane is projected to need for all it holds, at the pace it keeps."""
        return round(self.lane.paces.seconds_for(self.journal.lane.unanswered()), 1)

    def _worst_pending(self) -> dict[int, float] | None:
        pending = self.journal.groups.pending_rows()
        worst = {line: self._worst(read_at(self.path, off, n), line) for line, off, n, _, _ in pending}
        return None if self._refused_by_budget(sum(worst.values()), len(pending)) else worst

    def _worst(self, body: bytes, line: int) -> float:
        """A request's worst case in the real-time lane: at standard prices (the batch price's double); 0 without
        a budget."""
        return 0.0 if self.settings.budget is None else body_worst(body, line, self.prices) / BATCH_DISCOUNT

    def _refused_by_budget(self, worst: float, requests: int) -> bool:
        """Whether the budget forbids moving work whose real-time worst case is `worst` (said once, and recorded)."""
        if self.settings.budget is None:
            return False
        if check_spend(self.journal, self.prices, self.settings.budget, worst, requests).action is Spend.GO:
            return False  # (the batch lane's rule: a real-time move is never cut, only made or not)
        if not self.journal.get_meta("deadline_for_budget"):
            self.journal.set_meta("deadline_for_budget", True, "deadline_for_budget", requests=requests, worst_usd=worst)
            self.emit("deadline_for_budget", {"requests": requests, "worst_usd": round(worst, 6), "budget": self.settings.budget,
                                              "why": "the real-time lane's worst case would pass the budget: the "
                                                     "deadline may be missed"})
        return True


def _proven(adoption: dict[str, Any] | None) -> bool:
    return adoption is None or adoption.get("proof") in ("results", "ledger")


def _done(batch: dict[str, Any] | None) -> int:
    counts = (batch or {}).get("request_counts") or {}
    return sum(int(counts.get(k) or 0) for k in DONE_COUNTS)


def _cid(body: bytes) -> str:
    return str(orjson.loads(body)["custom_id"])


def _given_back(j: Journal) -> bool:
    """Whether a batch canceled for the deadline has been collected since the last reading (journaled: a kill between
    its collection and this reading is seen by the rerun): what it gave back goes to the lane, ahead, never into a
    new batch of the lane that was too slow (`moves` counted it as coming to the lane)."""
    given = set(j.get_meta("deadline_given_back") or [])
    new = newly_given_back(j.get_meta("deadline_canceled") or [], [r.idx for r in j.batches(BatchState.COLLECTED)], given)
    if new:
        j.set_meta("deadline_given_back", sorted(given | new))
    return bool(new)
