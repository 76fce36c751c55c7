"""A dead submitter's unknown create, settled by another submitter's listing (issue 58). Pure: the ledger's
reservations, the listing and the clock come in as values.

A submitter killed on this machine with a create out leaves an *orphan* that keeps the turn for creates of its size
(`state.ledger._base`): a batch it made, unnamed, would otherwise be taken for another's lost create of that size.
Its rerun settles it; until then a live submitter whose listing shows the dead one's workspace (the ledger records
the same workspace print for both, or one of the batches it names for the dead one is listed: a print alone
settles a job killed on its very first create) can settle it for it, so that nobody waits for a rerun that may
never come:

- the one unnamed batch of the orphan's size made between its turn and the listing's grace after it was found dead
  (less and plus the clock skew), when no other unknown create of that size can have made it: its batch, named in
  the ledger for the dead submitter (every other submitter's lost create then leaves it out);
- no such batch in a listing read the grace after it was found dead (its body went out before): it made none;
- anything else (several, a rival, a listing not read late enough, or one that may not show its workspace): the
  orphan holds the turn as before, until its rerun or its TTL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ._headroom import parse_time, total_requests

NO_BATCH = ""  # the orphan's create made no batch


def orphan_batch(orphan: Any, reservations: Iterable[Any], listed: Iterable[dict[str, Any]], known: set[str], *,
                 now: float, listed_at: float, grace: float, clock_skew: float, workspace: str | None = None) -> str | None:
    """The batch the dead submitter's create `orphan` (`Reservation` with `dead_for`) made, as this listing (read
    at `listed_at`) shows it: its id, `NO_BATCH` when it made none, None when the listing cannot tell. `known`: the
    batch ids the reader's journal knows; `grace`: how long after a send a listing proves a batch absent;
    `workspace`: the print of the workspace the listing is of (`ApiConfig.workspace_print`; None: unknown)."""
    if orphan.dead_for is None or orphan.granted_for is None:
        return None  # (an earlier version's orphan: when its turn came is unknown)
    held = list(reservations)
    batches = {str(b.get("id")): b for b in listed}
    if not _lists_its_workspace(orphan, held, batches, workspace):
        return None
    named = {r.batch_id for r in held if r.batch_id} | known
    found = now - orphan.dead_for
    window = (now - orphan.granted_for - clock_skew, found + grace + clock_skew)
    made = [b for i, b in batches.items() if i not in named and total_requests(b) == orphan.requests
            and _within(b, window)]
    if any(_within(b, w) for w in _rival_windows(orphan, held, now, grace, clock_skew) for b in made):
        return None
    if len(made) == 1:
        return str(made[0].get("id"))
    return NO_BATCH if not made and listed_at - found > grace else None


def _lists_its_workspace(orphan: Any, held: list[Any], batches: dict[str, Any], workspace: str | None) -> bool:
    """Whether the listing is of the orphan's workspace: the ledger records the same print for both, or a batch
    it names for the orphan's owner is listed. (Otherwise its batch may be in a workspace this listing does not show,
    and "none listed" would prove nothing.)"""
    same = workspace is not None and getattr(orphan, "workspace", None) == workspace
    return same or any(r.owner == orphan.owner and r.batch_id in batches for r in held)


def _within(batch: dict[str, Any], window: tuple[float, float]) -> bool:
    made = parse_time(batch.get("created_at"))
    return made is not None and window[0] <= made <= window[1]


def _rival_windows(orphan: Any, held: list[Any], now: float, grace: float,
                   clock_skew: float) -> list[tuple[float, float]]:
    """When each other unknown create of the orphan's size (a live submitter's, or another orphan) may have made
    its batch: from its turn (or ever, where unknown) to now (to the grace after it was found dead, for an orphan)."""
    out = []
    for r in held:
        if r.batch_id or r.requests != orphan.requests or not r.sent or (r.owner, r.batch) == (orphan.owner, orphan.batch):
            continue
        start = -math.inf if r.granted_for is None else now - r.granted_for - clock_skew
        end = math.inf if r.dead_for is None else now - r.dead_for + grace + clock_skew
        out.append((start, end))
    return out
