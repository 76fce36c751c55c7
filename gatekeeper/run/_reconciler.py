"""Reconciliation: every create whose outcome is unknown is settled against the listing, and, when the listing
cannot tell, against the candidates' results (`_evidence`, weighed by `decide._ownership`), before anything is resent."""

from __future__ import annotations

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
from ..state._journal import BatchRow, BatchState
from ._collect import custom_id
from ._evidence import Results, read_results, weigh
from ._part import Part, Snapshot


class Reconciler(Part):
    """Settles the run's unknown creates, one listing at a time."""

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
