"""Priming again: a round whose rest could not go while its prefixes were alive gets a new primer.

When other load holds the queue past a round's shortest life, the prefixes its primer wrote have left the cache;
sending the rest then would write them again, once a request. Instead one waiting request of each group becomes the
primer of a new round and the rest waits for it, as the first time (the groups found again from the requests' own
markers, by `decide._priming`). Nothing is sent twice: the requests only move between batches not yet created.
"""

from __future__ import annotations

import orjson

from ..._prices import PriceTable, tokens_per_byte
from ...decide._priming import NONE, Marks, shared_prefixes
from ...input._markers import marker_points
from ...input._sizing import Limits, body_size, pack_rows
from ...state._journal import BatchRow, Journal, PendingRow
from ...state._records import Group
from ..shared._inputs import batch_requests


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
