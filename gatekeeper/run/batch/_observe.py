"""Reading the queue: every key's listing, our batches that ended moved on, our live requests the listing misses
counted, and a point on the job's timeline when the queue changed."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..._errors import NotFoundError
from ...api._queue import read_live, recent_batches
from ...decide._downloads import BATCH_LIFETIME
from ...decide._headroom import LIVE_STATES, live_batches, parse_time
from ...decide._reconcile import current_bound, lag_seen, lag_shown, lag_since, listing_grace, newest_made
from ...state._journal import BatchRow, BatchState
from ..shared._part import Part, RunContext, Snapshot

READING_EVERY = 60.0  # seconds: the timeline's longest gap while the queue holds still


class Observer(Part):
    """Reads the queue for the loop; `ceiling` gives the ceiling the timeline records beside each reading."""

    def __init__(self, ctx: RunContext, ceiling: Callable[[], int | None]) -> None:
        super().__init__(ctx)
        self.ceiling = ceiling
        self._last: tuple[tuple[int, int | None, int] | None, float] = (None, 0.0)
        # batches of ours (their creates answered) not listed yet, by send time, watched until listed even once
        # ended: how long the listing lags (`listing_grace`), its longest seen in `_lag` (and the journal: "listing_lag")
        self._unlisted: dict[str, float] = {}
        # (an earlier run's too: a rerun reconciling a create its killed run left unknown has read no listing yet)
        self._lag = float(self.journal.get_meta("listing_lag") or 0.0)
        self._said = self._lag  # the lag last said in a `listing_lags` event (a rerun's journal: already said)
        self._before: tuple[set[str], float] | None = None  # the last listing's ids, and when it was read
        # kept for reruns: the last listing's newest batch's making and when it was read (`lag_since`), and the least
        # a listing was seen to lag at most (`current_bound`; none seen: infinite)
        read = self.journal.get_meta("listing_read") or {}
        self._read_before = (read.get("newest"), read["at"]) if "at" in read else None
        self._bound = math.inf if read.get("bound") is None else float(read["bound"])
        self._kept = float(read.get("at") or 0.0)  # when "listing_read" was last written

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
            if row.batch_id and row.batch_id not in listed:  # (it exists: its create was answered)
                self._unlisted.setdefault(row.batch_id, row.intent_at or parse_time(row.created_at) or at)
            if batch is not None and batch.get("processing_status") == "ended":
                self.journal.mark_ended(row.idx, batch.get("ended_at"), batch.get("request_counts"))
                self.emit("ended", {"batch": row.idx, "id": row.batch_id, "counts": batch.get("request_counts")})
                await self.ledger.release(row.idx)
        unseen += sum(r.requests for r in self.journal.batches(BatchState.INTENT))
        mine = self.journal.adoptions.known_batch_ids()
        ours = unseen + sum(r.processing for r in live_batches((b for i, b in listed.items() if i in mine), "ws1"))
        self._record(depth + unseen, ours)
        self._learn_lag(listed, at)
        return Snapshot(depth, listed, unseen, at, self._lag, self._bound)

    def _learn_lag(self, listed: dict[str, dict[str, Any]], at: float) -> None:
        """What this listing says of the listing's lag: batches it shows late (against the last listing, this run's
        or an earlier run's), ours it still misses, and how current it is at most; kept for reruns."""
        shown = 0.0 if self._before is None else lag_shown(listed, *self._before)
        if self._read_before is not None:
            shown = max(shown, lag_since(listed, *self._read_before))
        newest, bound = newest_made(listed), min(self._bound, current_bound(listed, at))
        # (kept when it says more, or a minute on: a journal write every reading was a commit on the loop's path;
        # an older reading's time is weaker evidence, never wrong)
        changed = self._read_before is None or newest != self._read_before[0] or bound != self._bound
        if changed or at - self._kept >= READING_EVERY:
            self.journal.set_meta("listing_read", {"newest": newest, "at": at,
                                                   "bound": None if math.isinf(bound) else round(bound, 1)})
            self._kept = at
        self._read_before, self._bound = (newest, at), bound
        self.note_lag(max(lag_seen(self._unlisted.values(), at), shown))
        self._before = (set(listed), at)
        self._unlisted = {k: sent for k, sent in self._unlisted.items() if k not in listed}

    def note_lag(self, lag: float) -> None:
        """Keep the longest lag seen; say so when it stretches the grace, and again each time it doubles what was
        said (a cold tester read a 5 s lag said once while the listing lagged 60 s and a lost create waited 132 s)."""
        setting = self.settings.reconcile_grace
        if listing_grace(setting, lag) > setting and lag >= 2.0 * self._said:
            self._said = lag
            self.emit("listing_lags", {"lag_s": round(lag, 1), "grace_s": round(listing_grace(setting, lag), 1),
                                       "policy": "a lost create's absence proves nothing before twice the lag seen"})
        if lag > self._lag:
            self.journal.set_meta("listing_lag", round(lag, 1))
            self._lag = lag

    def _record(self, depth: int, ours: int) -> None:
        """A timeline point when the queue changed, or a minute after the last one (a plateau needs no more)."""
        now, ceiling = self.clock(), self.ceiling()
        reading = (depth, ceiling, ours)
        if reading != self._last[0] or now - self._last[1] >= READING_EVERY:
            self.journal.outcomes.record_reading(now, depth, ceiling, ours)
            self._last = (reading, now)

    async def _retrieve_unlisted(self, row: BatchRow) -> dict[str, Any] | None:
        """A batch of ours the listing misses: retrieve it. A 404 is lag (the API is eventually consistent), not
        a verdict, until the batch must have expired: then it is taken as ended and its results are looked for."""
        try:
            # (one try: a 404 is asked again at the next reading; retried here, one batch after another, a listing
            # that lagged held the loop 13 s a batch: a cold tester)
            return await self.api.retrieve_batch(str(row.batch_id), wait_if_new=False)
        except NotFoundError:
            created = parse_time(row.created_at)
            if created is not None and self.clock() > created + BATCH_LIFETIME + self.settings.results_grace:
                return {"id": row.batch_id, "processing_status": "ended", "ended_at": None, "request_counts": None}
            self.emit("batch_not_found", {"batch": row.idx, "id": row.batch_id, "policy": "counted as live; asked again"})
            return None
