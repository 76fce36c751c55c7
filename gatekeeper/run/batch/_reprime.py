"""Priming again: a round whose rest could not go while its prefixes were alive gets a new primer.

When other load holds the queue past a round's shortest life, the prefixes its primer wrote have left the cache;
sending the rest then would write them again, once a request. Instead one waiting request of each group becomes the
primer of a new round and the rest waits for it, as the first time (the groups found again from the requests' own
markers, by `decide._priming`). Nothing is sent twice: the requests only move between batches not yet created.
"""

from __future__ import annotations

import orjson

from ..._prices import PriceTable, tokens_per_byte
from ...decide._gate import Waiting, gate, lapsed, reprimable, rounds_ended, watch_wait
from ...decide._priming import NONE, Marks, shared_prefixes
from ...input._markers import marker_points
from ...input._sizing import Limits, body_size, pack_rows
from ...state._journal import BatchRow, BatchState, Journal, PendingRow
from ...state._records import Group
from ..shared._inputs import batch_requests
from ..shared._part import Part, RunContext


def regroup(path: str, journal: Journal, rows: list[BatchRow], prices: PriceTable,
            limits: Limits) -> tuple[list[Group], int]:
    """The new round's primer and rest batches for the waiting rest batches `rows`, and how many primers."""
    members: list[PendingRow] = []
    marks = Marks()
    measured = ((journal.get_meta("report") or {}).get("estimate") or {}).get("models") or {}
    for row in rows:
        for line, off, body, attempt in batch_requests(path, journal, row):
            request = orjson.loads(body)
            model = str(request["params"]["model"])
            if model not in marks.models:
                marks.models.append(model)
            rate = tokens_per_byte(measured, model)  # (as the plan sized them: measured where it was)
            points = ((b * rate, d, int(life == "1h")) for b, d, life in marker_points(request["params"], model))
            marks.add(marks.models.index(model), len(body) * rate, points)
            members.append(PendingRow(line, off, len(body), str(request["custom_id"]), attempt))
    chosen = shared_prefixes(marks, [float(prices.cache_minimum(m)[0]) for m in marks.models])
    first: dict[int, PendingRow] = {}
    for member, point in zip(members, chosen, strict=True):
        if point != NONE:
            first.setdefault(marks.digest[point], member)
    primers = sorted(first.values())
    taken = {m.line for m in primers}
    rest = [m for m in members if m.line not in taken]
    round_: int | None = journal.groups.next_round()
    groups: list[Group] = [("primer", round_, g) for g in pack_rows(primers, limits)]
    groups += [("rest", round_, g) for g in pack_rows(rest, limits)]
    return groups, len(primers)


def reprime(path: str, journal: Journal, rows: list[BatchRow], prices: PriceTable, limits: Limits,
            life: float | None) -> int:
    """Replace the waiting rest batches `rows` of a lapsed round by a new round (journaled at once); its number."""
    groups, _ = regroup(path, journal, rows, prices, limits)
    return journal.groups.reprime([r.idx for r in rows], groups, lambda g: body_size(len(g), sum(r.length for r in g)), life)


class PrimingGate(Part):
    """Which waiting batches of a primed job may go (`decide._gate.gate`), a lapsed round primed again once, and how
    long the loop may wait while a primer flies."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self._let_go: set[int] = set()  # lapsed rounds primed again once already, their rest going as it is

    def gated(self, planned: list[BatchRow], bound: int | None, batch_size: int) -> tuple[list[BatchRow], list[int], int, int]:
        """The batches that may go now, in order, the room each needs, the room held for rests whose primer is in
        flight, and how many are held back for a primer (`decide._gate.gate`)."""
        if all(b.cache_round is None for b in planned):
            return planned, [b.requests for b in planned], 0, 0
        ended = rounds_ended(self.journal.groups.primer_endings())
        g = gate([Waiting(b.idx, b.kind, b.requests, b.cache_round) for b in planned], ended,
                 None if bound is None else max(1, bound - self.settings.margin))
        by_idx = {b.idx: b for b in planned}
        if self._reprimed([by_idx[i] for i in g.order], planned, ended, batch_size):
            return [], [], 0, g.held  # (the next round sees the new primer)
        return [by_idx[i] for i in g.order], g.sizes, g.reserve, g.held

    def _lives(self) -> dict[str, float]:
        return ((self.journal.get_meta("report") or {}).get("priming") or {}).get("lives") or {}

    def watch_wait(self) -> float | None:
        """The longest wait to the next reading while a primer is in flight with its rest waiting
        (`decide._gate.watch_wait`); None: no primer to watch."""
        flying = {b.cache_round for b in self.journal.batches(BatchState.CREATED, BatchState.INTENT)
                  if b.kind == "primer" and b.cache_round is not None}
        if not flying:
            return None
        waiting = {b.cache_round for b in self.journal.batches(BatchState.PLANNED) if b.kind == "rest"}
        lives = self._lives()
        return watch_wait([float(lives[str(r)]) for r in flying & waiting if lives.get(str(r)) is not None])

    def _reprimed(self, going: list[BatchRow], planned: list[BatchRow], ended: dict[int, float | None],
                  batch_size: int) -> bool:
        """A round whose rest could go only after its prefixes should have left the cache (other load held the
        queue) is primed again (`_reprime`), once (`decide._gate.reprimable`), recorded as `primer_lapsed`; whether
        any was."""
        lives = self._lives()
        rounds = sorted({b.cache_round for b in going if b.kind == "rest" and b.cache_round is not None})
        gone = [r for r in rounds if lapsed(ended.get(r), lives.get(str(r)), self.clock())]
        reprimed = {int(d["round"]) for _, _, _, d in self.journal.outcomes.events_of("reprimed")}
        for r in [r for r in gone if not reprimable(r, reprimed) and r not in self._let_go]:
            self._let_go.add(r)  # (its rest goes as it is: said once a run)
            self.emit("primer_lapsed", {"round": r, "life": lives.get(str(r)), "reprimed_as": None,
                                        "why": "primed again once already: its rest goes as it is"})
        gone = [r for r in gone if reprimable(r, reprimed)]
        for r in gone:
            life = lives.get(str(r))
            self.journal.event("primer_lapsed", round=r, life=life)
            rest = [b for b in planned if b.kind == "rest" and b.cache_round == r]
            new = reprime(self.path, self.journal, rest, self.prices,
                          Limits(max_requests=batch_size, max_bytes=self.settings.limits.max_bytes), life)
            self.emit("primer_lapsed", {"round": r, "life": life, "reprimed_as": new})
        return bool(gone)
