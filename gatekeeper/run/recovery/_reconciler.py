"""Reconciliation: every create whose outcome is unknown is settled against the listing, and, when the listing
cannot tell, against the candidates' results (`_evidence`, weighed by `decide._ownership`), before anything is resent."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..._errors import NotFoundError
from ...api._http import CREATE_ANSWER_WAIT
from ...decide._downloads import Missing
from ...decide._ownership import choose
from ...decide._reconcile import (
    Action,
    Decision,
    Rival,
    candidates_for,
    carrying,
    compared,
    decide,
    lag_retrieved,
    ledger_names_the_rest,
    listing_grace,
    listing_would_show,
    made_in_time,
    nearest_first,
    others_in_flight,
    rival_creates,
    rivals_among,
    unlisted_theirs,
    within_deadline,
)
from ...state._journal import BatchRow, BatchState
from ...state.ledger._base import NAMED_FOR
from ..batch._collect import custom_id, missing_verdict
from ..batch._evidence import Ours, Results, count_ours, learned_relations, our_side, pairs_of, read_results, wanted_ids
from ..shared._part import Part, RunContext, Snapshot

ASKED_A_READING = 3  # other submitters' unlisted batches retrieved at most, a reading, to learn the listing's lag


class Reconciler(Part):
    """Settles the run's unknown creates, one listing at a time. What a decision reads is kept until it is made:
    each candidate's results are downloaded once, our requests read once, each id counted once."""

    def __init__(self, ctx: RunContext, note_lag: Callable[[float], None]) -> None:
        super().__init__(ctx)
        self.note_lag = note_lag  # (the Observer's: it keeps the longest lag seen, for every later listing and rerun)
        # with a deadline: the latest an unknown create may wait (`within_deadline`), and where its requests go
        # when cut there (the keeper's real-time lane; whether they went)
        self.latest: float | None = None
        self.to_realtime: Callable[[BatchRow], bool] | None = None
        self.takes: Callable[[BatchRow], bool] = lambda row: False  # (whether the lane takes them: open, the budget)
        self._theirs: dict[str, dict[str, Any] | None] = {}  # another's batch id -> its retrieve (None: not found)
        self._said: set[int] = set()  # our batches whose wait past the grace was said (`_unproven`)
        self._ours: dict[int, Ours] = {}
        self._results: dict[tuple[int, str], Results] = {}  # (our batch, candidate id) -> what its results say of it
        self._counts: dict[int, dict[str, int]] = {}

    async def reconcile(self, snap: Snapshot) -> None:
        """Settle every create whose outcome is unknown, before anything is resent (those the deadline cut too: a
        batch one made is adopted and collected, its answers joined where the real-time lane has not answered)."""
        intents = self.journal.batches(BatchState.INTENT, BatchState.CUT)
        if not intents:
            return
        reservations = await self.ledger.reservations()
        theirs, _ = others_in_flight(reservations, self.ledger.owner)
        known = self.journal.adoptions.known_batch_ids() | theirs
        for row in intents:
            await self._settle(row, snap, intents, reservations, known)

    async def _settle(self, row: BatchRow, snap: Snapshot, intents: list[BatchRow], reservations: list[Any],
                      known: set[str]) -> None:
        """One unknown create against this listing: adopted, abandoned (with a deadline, cut at the real-time
        lane's last chance: its requests moved there, the create still reconciled), compared, or left waiting."""
        sent_at, skew = row.intent_at or 0.0, self.settings.clock_skew
        stretched = snap.grace(self.settings.reconcile_grace)
        candidates = candidates_for(row.requests, sent_at, snap.listed.values(), known, skew)
        rivals = self._rivals(row, intents, reservations, candidates, stretched)
        grace = self._within_deadline(row, stretched)
        d = decide(candidates, rivals=len(rivals), sent_at=sent_at, listed_at=snap.at, grace=grace,
                   body_complete=row.body_complete, named_after=self._named_after(snap.at))
        if d.action is Action.ABANDON and row.body_complete:  # (absence as proof: is the listing current?)
            lag = max(snap.lag, await self._lagging(snap, reservations))
            stretched = max(stretched, listing_grace(self.settings.reconcile_grace, lag, snap.bound))
            grace = self._within_deadline(row, stretched)
            d = decide(candidates, rivals=len(rivals), sent_at=sent_at, listed_at=snap.at, grace=grace,
                       named_after=self._named_after(snap.at))
        if d.action is Action.WAIT and not candidates:
            self._unproven(row, snap, sent_at, grace)
        if d.action is Action.COMPARE:
            d = await self._compare(row, d, sent_at, snap.at, rivals, grace)
        await self._apply(row, d, known, cut=grace < stretched)

    def _within_deadline(self, row: BatchRow, stretched: float) -> float:
        """The wait, cut at the real-time lane's last chance when there is a deadline and the lane would take the
        create's requests (open to these credentials, within the budget); else the whole wait: cut without the lane
        to take them, they would go in another batch (swarm seed 144: the budget refused the lane, paid twice). A
        create cut already waits its whole wait: its requests are the lane's, and only a batch it made is looked for."""
        if row.state is BatchState.CUT:
            return stretched
        grace = within_deadline(stretched, row.intent_at or 0.0, self.latest)
        return grace if grace >= stretched or self.takes(row) else stretched

    def _rivals(self, row: BatchRow, intents: list[BatchRow], reservations: list[Any],
                candidates: list[dict[str, Any]], grace: float) -> list[Rival]:
        """Each other unknown create of the size that may have made one of the candidates: ours (with the print of
        the ids each sent, read from the input: one that sent other ids never made the candidate that carries ours;
        swarm seed 60044: a rerun's creates taken back without their print in the ledger), or another's, with the
        earliest its batch may have been made (another's orphan only if it may fall among our candidates: it shows
        within the grace, or never)."""
        rivals = [Rival(r.intent_at if r.intent_at is not None else -math.inf, self._side(r).ids.text())
                  for r in intents if r.idx != row.idx and r.requests == row.requests]
        sent_at, skew = row.intent_at or 0.0, self.settings.clock_skew
        rivals += rival_creates(reservations, self.ledger.owner, row.requests, sent_at - skew, self.clock(), grace)
        return rivals_among(candidates, rivals, skew)

    async def _lagging(self, snap: Snapshot, reservations: list[Any]) -> float:
        """The listing's lag shown by other submitters' batches the ledger names and the listing misses
        (`unlisted_theirs`), retrieved: a listing that has not shown a batch made minutes ago proves nothing
        absent that was sent since (noted, so every later reading and a rerun wait as long)."""
        unlisted = unlisted_theirs(reservations, self.ledger.owner, snap.listed)
        for batch_id in [i for i in unlisted if i not in self._theirs][:ASKED_A_READING]:
            try:
                self._theirs[batch_id] = await self.api.retrieve_batch(batch_id)
            except NotFoundError:  # (another workspace's, or not readable yet: no evidence either way)
                self._theirs[batch_id] = None
        lag = max((lag_retrieved(b, snap.at) for i in unlisted if (b := self._theirs.get(i))), default=0.0)
        if lag:
            self.note_lag(lag)
        return lag

    def _unproven(self, row: BatchRow, snap: Snapshot, sent_at: float, grace: float) -> None:
        """Say once why a lost create waits past the grace: the listing was never seen current (`listing_grace`)."""
        plain = listing_grace(self.settings.reconcile_grace, snap.lag)
        if row.idx in self._said or not listing_would_show(sent_at, snap.at, plain):
            return
        self._said.add(row.idx)
        self.emit("listing_unproven", {"batch": row.idx, "waits_s": round(grace, 1),
                                       "newest_listed_s": None if math.isinf(snap.bound) else round(snap.bound, 1),
                                       "policy": "a listing never seen current proves nothing absent: the create is "
                                                 "sent again only after this wait, if its batch has not shown"})

    def _named_after(self, now: float) -> float | None:
        """Since when a shared ledger names every other submitter's batch (None: no shared ledger, or a clock skew
        allowed so wide that a dead submitter's lost create could fall among our candidates)."""
        if not self.ledger.owner or self.settings.clock_skew >= self.ledger.ttl:
            return None
        return now - NAMED_FOR / 2

    async def _compare(self, row: BatchRow, d: Decision, sent_at: float, listed_at: float,
                       rivals: list[Rival], grace: float) -> Decision:
        """Settle an unknown create among ended candidates by their results: our custom_ids first, then whose
        prompts they were billed for (`_ownership`). Those proven another's are never candidates again."""
        ours = self._side(row)
        for b in d.candidates:  # (kept per batch of ours: what a candidate billed is kept for our sampled ids only)
            if (row.idx, str(b.get("id"))) not in self._results:
                got = await self._read(b, ours)
                if got is None:
                    return Decision(Action.WAIT, d.candidates, "a candidate's results could not be read whole yet")
                self._results[row.idx, str(b.get("id"))] = got
        found = {str(b.get("id")): self._results[row.idx, str(b.get("id"))] for b in d.candidates}
        same = {k: r for k, r in found.items() if r.missing or r.ids == ours.ids}
        whole = [k for k, r in same.items() if not r.missing]
        proven = None if len(whole) != len(same) else ledger_names_the_rest(
            d.candidates, whole, rivals=carrying(rivals, ours.ids.text()), named_after=self._named_after(listed_at),
            clock_skew=self.settings.clock_skew)
        if proven is not None:
            return Decision(Action.ADOPT, tuple(b for b in d.candidates if str(b.get("id")) == proven),
                            "the one candidate with our custom_ids that no other unknown create can have made (by its "
                            "turn's time, its ids or a create never sent), every other submitter's batch named in the "
                            "shared ledger", "ledger")
        timely = None if len(whole) != len(same) else made_in_time(
            d.candidates, whole, sent_at=sent_at, answer_wait=CREATE_ANSWER_WAIT, clock_skew=self.settings.clock_skew)
        if timely is not None:
            return Decision(Action.ADOPT, tuple(b for b in d.candidates if str(b.get("id")) == timely),
                            "the one candidate with our custom_ids made while our create could still be answered (the "
                            "others were made after it was given up)", "results")
        # (a candidate without our custom_ids is not this create's, but may be another unknown create of ours: it is
        # left as it is, never set aside)
        counts = await count_ours(self.api, ours.sample, wanted_ids(ours.sample, (r.billed for r in same.values())),
                                  self._counts.setdefault(row.idx, {}))
        if counts is None:
            return Decision(Action.WAIT, d.candidates, "our requests could not be counted yet")
        learned = await learned_relations(self.api, self.journal, self.path) if counts else {}
        evidence = {k: pairs_of(ours.sample, counts, r.billed) for k, r in same.items()}
        self.emit("weighed", {"batch": row.idx, "candidates": len(d.candidates), "with_our_ids": len(same),
                              "compared": {k: len(v) for k, v in evidence.items()}, "counted": len(counts),
                              "learned": sorted(learned or {})})
        with_ids = [k for k in nearest_first(d.candidates, sent_at) if k in same]
        choice = choose(evidence, with_ids, sampled=len(ours.sample), learned=learned or {})
        if choice.foreign and choice.ours is not None:  # (set aside only beside the one taken: usage ranks, never more)
            self.journal.adoptions.foreign(choice.foreign)
            self.emit("not_ours", {"batch": row.idx, "ids": list(choice.foreign), "why": "its usage is another's prompts"})
        return compared(choice, d.candidates, sent_at=sent_at, listed_at=listed_at, grace=grace,
                        with_our_ids=with_ids)

    def _side(self, row: BatchRow) -> Ours:
        """What our requests of `row` are (their ids' print, a sample), read once from the input."""
        ours = self._ours.get(row.idx)
        if ours is None:
            ours = self._ours[row.idx] = our_side((custom_id(body), body) for _, _, body, _ in self._requests_of(row))
        return ours

    async def _read(self, batch: dict[str, Any], ours: Ours) -> Results | None:
        """A candidate's results; missing past the grace from its end, a candidate that cannot be weighed."""
        try:
            return await read_results(self.api, batch, set(ours.sample))
        except NotFoundError:
            pass
        v = missing_verdict(None, batch, self.settings, self.clock())
        return None if v.action is Missing.WAIT else Results(missing=True)

    async def _apply(self, row: BatchRow, d: Decision, known: set[str], cut: bool = False) -> None:
        """What a decision does (`cut`: an abandon only because the deadline cut the wait)."""
        if d.action in (Action.ADOPT, Action.ABANDON):
            self._forget(row, d)
        if d.action is Action.ADOPT:
            batch = d.candidates[0]
            batch_id = str(batch.get("id"))
            self.api.note_created(batch_id)
            self.journal.mark_created(row.idx, batch_id, batch.get("created_at"), adopted=d.proof, apart=d.apart)
            await self.ledger.confirm(row.idx, batch_id)
            known.update((batch_id, *d.apart))
            self.emit("reconciled", {"batch": row.idx, "outcome": "created", "id": batch_id, "how": d.reason,
                                     **({"kept_apart": list(d.apart)} if d.apart else {})})
        elif d.action is Action.ABANDON and row.state is BatchState.CUT:  # (its requests the lane's already)
            self.journal.lane.uncut(row.idx)
            self.emit("reconciled", {"batch": row.idx, "outcome": "not created", "how": d.reason, "cut": True})
        elif d.action is Action.ABANDON and cut and self.to_realtime is not None and self.to_realtime(row):
            await self.ledger.release(row.idx)  # (no batch could make the deadline now: its requests went real time)
            self.emit("reconciled", {"batch": row.idx, "outcome": "cut", "how": d.reason,
                                     "policy": "its requests go real time, counted as charged once; a batch the create "
                                               "made is still looked for, and its answers joined where the lane has "
                                               "not answered"})
        elif d.action is Action.ABANDON:
            self.journal.back_to_planned(row.idx)
            await self.ledger.release(row.idx)
            self.emit("reconciled", {"batch": row.idx, "outcome": "not created", "how": d.reason})
        elif d.candidates:
            self.emit("reconciling", {"batch": row.idx, "candidates": len(d.candidates), "how": d.reason})

    def _forget(self, row: BatchRow, d: Decision) -> None:
        self._ours.pop(row.idx, None)
        self._counts.pop(row.idx, None)
        for b in d.candidates:
            self._results.pop((row.idx, str(b.get("id"))), None)
