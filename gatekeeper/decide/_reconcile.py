"""Settling a create whose outcome is unknown. Pure: the listing and the clock come in as values.

A create can reach the server and its answer be lost (a reset, a timeout, a
kill). The API has no idempotency key and no batch label, so the journal's
intent (size, send time) is matched against the listing: a batch we do not know
already, of exactly that size, created no earlier than the send time minus the
clock skew.

- one candidate and no other unknown create of the same size that may have made it (ours, or another submitter's
  that a ledger shows unconfirmed, or left unconfirmed by a submitter found dead: `dead_rivals`; one whose turn came
  after the candidate was made, or whose body the ledger knows never went out, cannot: `rival_creates`,
  `rivals_among`): adopt it. With a ledger (this host's,
  by default, or a shared one) this is proof (`named_after`): creates go one at a time through it and every other
  submitter's batch is named there, so a lone unnamed batch of our size is ours (the candidates are those created
  after our send less the clock skew, which is shorter than the ledger's TTL: a submitter of another machine whose
  reservation lapsed did so a TTL after its turn, and one found dead on its machine stays a rival of its size for
  a TTL after). Without one (`--ledger none`) it is adopted on size and time alone, its results weighed when
  collected;
- no candidate in a listing read `grace` after the send: it was not created;
- several candidates (or a rival of the same size): wait until they end, then
  compare their results with our requests: custom_ids first (the one that carries ours and that no rival can have
  made, by its turn's time or the print of the ids it sent, is proven ours with a shared ledger:
  `ledger_names_the_rest`), then whose prompts the usage was billed for (`_ownership`), and adopt what that proves
  (`compared`).

Time is the listing's, never the moment of deciding: comparing results can take
a while (a damaged download, a 429), and a listing read before ours was listed
proves nothing about it however late the decision comes.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._headroom import parse_time, total_requests
from ._ownership import Choice


class Action(str, enum.Enum):
    ADOPT = "adopt"  # this batch is ours
    ABANDON = "abandon"  # nothing was created: the batch goes back to planned
    WAIT = "wait"  # not decidable yet
    COMPARE = "compare"  # every candidate ended: read their results and compare custom_ids


@dataclass(frozen=True)
class Decision:
    action: Action
    candidates: tuple[dict[str, Any], ...] = field(default=())
    reason: str = ""
    # an adoption's evidence: "listing" (size and time alone: its results are checked when collected), "ledger"
    # (a lone unnamed candidate while creates go one at a time through a shared ledger), "results" (they proved it
    # ours) or "unproven" (they could not tell it from another submitter's: its answers are kept apart)
    proof: str = ""
    # an unproven adoption: the other candidates with our custom_ids the evidence cannot tell from it, collected
    # beside it and their answers kept apart too (never joined, never resent)
    apart: tuple[str, ...] = ()


ABSENCE_CAP = 3600.0  # seconds: the longest a lagging listing stretches the grace (a job always ends)


def listing_would_show(sent_at: float, listed_at: float, grace: float) -> bool:
    """Whether a listing read at `listed_at` would show a batch sent at `sent_at` (the listing lags by up to `grace`)."""
    return listed_at - sent_at > grace


UNKNOWN_FACTOR = 8.0  # graces a lost create waits, at most, on a listing never seen current (its lag unknown)


def listing_grace(grace: float, lag_seen: float, bound: float = 0.0) -> float:
    """How long after a send a listing must be read for a batch's absence from it to prove it was never made:
    the setting, or twice the longest this run saw a batch that exists missing from the listing, if longer (capped at
    `ABSENCE_CAP`). A listing that lags past the setting would otherwise prove a batch that exists absent, and it
    would be sent again: paid twice.

    `bound` is the most the listing was seen to lag (`current_bound`: the age of the newest batch a reading showed;
    infinite while it has shown none). A listing never seen current may lag past the setting unseen (swarm seed
    63: the night's first create lost, a listing 15 minutes behind, nothing else made), so absence waits twice that
    bound, at most `UNKNOWN_FACTOR` graces (an hour at most; the swarm's lags reach 6): the batch, if made, is listed meanwhile and adopted;
    a create that made nothing is sent again later, never twice."""
    unknown = min(2.0 * bound, UNKNOWN_FACTOR * grace, ABSENCE_CAP)
    return max(grace, min(2.0 * lag_seen, ABSENCE_CAP), unknown)


def within_deadline(stretched: float, sent_at: float, latest: float | None) -> float:
    """The stretched absence wait (`listing_grace`) a deadline allows: up to `latest`, the last moment the
    real-time lane can still answer the create's requests in time (None: no deadline), even below the plain grace
    (the setting, or twice a lag seen) unless that last chance comes first. A create that made nothing must not hold
    its requests past the deadline (swarm seed 11294: a create answered 529 three times on a quiet account, each
    waiting 13 minutes, a 30-minute deadline missed); cut there, its requests go real time at once, never in another
    batch, and a batch it did make is paid at most twice, the real-time lane's own bound (seed 87: cut at half the
    time and sent again as a batch, its first batch, made, never collected)."""
    if latest is None:
        return stretched
    return min(stretched, max(0.0, latest - sent_at))


def current_bound(listed: dict[str, dict[str, Any]], listed_at: float) -> float:
    """The most a listing read at `listed_at` can lag: the age of the newest batch it shows (it would not show that
    one if it lagged more); infinite when it shows none. A quiet account's bound is loose; any recent batch, ours or
    another's, tightens it."""
    newest = newest_made(listed)
    return math.inf if newest is None else max(0.0, listed_at - newest)


def lag_seen(live_unlisted: Iterable[float], listed_at: float) -> float:
    """The longest a batch of ours (its create answered: it exists) has been missing from a listing read at
    `listed_at`, from the moments each was sent (0 when none is missing)."""
    return max((listed_at - sent for sent in live_unlisted), default=0.0)


def lag_shown(listed: dict[str, dict[str, Any]], before: set[str], before_at: float) -> float:
    """The longest lag a batch listed now for the first time shows (anyone's: another job's, or from outside): it
    was missing from the listing read at `before_at` (whose ids are `before`) though created before it (0 when
    none). A run that has seen none of its own creates answered yet learns the listing's lag from these, before its
    first lost create's absence would be taken for proof (swarm seeds 5, 27: a lag of 450-900 s, a first create's
    answer lost, sent again after the 300 s grace: paid twice)."""
    made = (parse_time(b.get("created_at")) for i, b in listed.items() if i not in before)
    return max((before_at - c for c in made if c is not None and c < before_at), default=0.0)


def newest_made(listed: dict[str, dict[str, Any]]) -> float | None:
    """When the newest batch a listing shows was made (None: it shows none)."""
    return max((c for b in listed.values() if (c := parse_time(b.get("created_at"))) is not None), default=None)


def lag_since(listed: dict[str, dict[str, Any]], newest_before: float | None, before_at: float) -> float:
    """The lag a listing shows against one read earlier (at `before_at`, its newest batch made at `newest_before`),
    however long before and by whichever run: a batch listed now, made after that newest yet before that reading,
    was missing from it (else it would have been the newest), so the listing lagged at least that long. Kept in the
    journal, this reaches a rerun (swarm seed 5: a run that read an empty listing at 14 minutes, ended by a refusal,
    then a later run listing a batch made at 0: a lag of 14 minutes at least, where the grace was 5)."""
    floor = -math.inf if newest_before is None else newest_before
    made = (parse_time(b.get("created_at")) for b in listed.values())
    return max((before_at - c for c in made if c is not None and floor < c < before_at), default=0.0)


def lag_retrieved(retrieved: dict[str, Any], listed_at: float) -> float:
    """The lag a batch shows that a listing read at `listed_at` missed and a retrieve then found: it existed since its
    `created_at`, so the listing lags at least that long (0 when it was made after the listing was read)."""
    made = parse_time(retrieved.get("created_at"))
    return 0.0 if made is None else max(0.0, listed_at - made)


def unlisted_theirs(reservations: Iterable[Any], owner: str, listed: Iterable[str]) -> list[str]:
    """Batch ids other submitters confirmed in the ledger (their creates answered: they exist) that a listing misses:
    retrieved, each shows how far the listing lags before a lost create of ours is taken for never made (swarm seed 5:
    a listing lagging 900 s against a 300 s grace, a job's first create lost while another job's batch, made 3
    minutes before, was still unlisted). One the retrieve does not find proves nothing (another workspace's key)."""
    shown = set(listed)
    return sorted({r.batch_id for r in reservations if r.owner != owner and r.batch_id and r.batch_id not in shown})


def others_in_flight(reservations: Iterable[Any], owner: str) -> tuple[set[str], Counter[int]]:
    """From a ledger's live reservations (`Reservation`s): the batch ids other submitters hold, never a
    candidate for our create, and how many of their creates of each size are not confirmed yet, rivals of ours
    (the lone candidate of that size may be theirs). A dead submitter's orphans are weighed by `dead_rivals`;
    `rival_creates` says when each rival's batch may have been made, and which ids it sent."""
    theirs = [r for r in reservations if r.owner != owner]
    return ({r.batch_id for r in theirs if r.batch_id},
            Counter(r.requests for r in theirs if not r.batch_id and r.dead_for is None))


def dead_rivals(reservations: Iterable[Any], owner: str, requests: int, since: float, now: float, lag: float) -> int:
    """How many creates of dead submitters (`Reservation.dead_for`: found dead on their machine with the create
    unconfirmed) may be a candidate of our size created `since` or later (our send less the clock skew): a dead
    submitter's batch, if any, was created before it was found dead, or within `lag` after (the server finishing a
    create whose body was in: the listing's grace, the bound our own lost creates are settled by). Later sends never
    meet it: a dead submitter holds no one back for long."""
    return len(_dead(reservations, owner, requests, since, now, lag))


def _dead(reservations: Iterable[Any], owner: str, requests: int, since: float, now: float, lag: float) -> list[Any]:
    return [r for r in reservations if r.owner != owner and r.dead_for is not None and r.requests == requests
            and now - r.dead_for + lag >= since]


class Rival(NamedTuple):
    """Another unknown create of our size: the earliest moment (on our clock) its batch may have been made, and a
    print of the custom_ids it sent (None where unknown)."""

    start: float
    ids: str | None = None


def rival_creates(reservations: Iterable[Any], owner: str, requests: int, since: float, now: float,
                  lag: float) -> list[Rival]:
    """Each other submitter's unknown create of our size: a live submitter's unconfirmed create, and a dead one's
    that may fall among our candidates (`dead_rivals`); never one the ledger knows was not sent (`Reservation.sent`:
    a dead submitter's leaves no orphan then). Its start is its reservation's grant (`Reservation.
    granted_for`: a batch is never created before its turn was granted), or minus infinity where the ledger does not
    say; its ids the print the ledger recorded (`Reservation.ids`)."""
    live = [r for r in reservations if r.owner != owner and not r.batch_id and r.dead_for is None and r.requests == requests
            and r.sent]  # (one not sent when the ledger was read was not sent when our listing was, read before)
    return [Rival(-math.inf if r.granted_for is None else now - r.granted_for, r.ids)
            for r in (*live, *_dead(reservations, owner, requests, since, now, lag))]


def rivals_among(candidates: Iterable[dict[str, Any]], rivals: Iterable[Rival], clock_skew: float) -> list[Rival]:
    """The rival creates that may have made one of these candidates: a batch created before a rival's turn (less
    the clock skew) is not its batch. A rival whose turn came after every candidate was made cannot be taken for
    ours, so it does not hold our proof (issue 60, seed 1513: a dead job's orphan reserved 50 minutes after our lost
    create). With no candidate every rival counts."""
    made = [parse_time(b.get("created_at")) or 0.0 for b in candidates]
    return [r for r in rivals if not made or r.start - clock_skew <= max(made)]


def carrying(rivals: Iterable[Rival], ours: str) -> list[Rival]:
    """The rivals that may have sent our custom_ids (`ours`, their print): one whose print the ledger recorded and
    differs sent other ids, so a candidate that carries ours is not its batch (issue 60, seed 1767: a dead job's
    orphan of our size with ids of its own)."""
    return [r for r in rivals if r.ids is None or r.ids == ours]


def candidates_for(requests: int, sent_at: float, listed: Iterable[dict[str, Any]], known: set[str],
                   clock_skew: float) -> list[dict[str, Any]]:
    """Group batches that could be this create's: unknown to the journal, same size, not older than the send."""
    return [
        b for b in listed
        if str(b.get("id")) not in known and total_requests(b) == requests
        and (parse_time(b.get("created_at")) or 0.0) >= sent_at - clock_skew
    ]


def decide(candidates: list[dict[str, Any]], *, rivals: int, sent_at: float, listed_at: float, grace: float,
           body_complete: bool = True, named_after: float | None = None) -> Decision:
    """What to do with one unknown create. `rivals`: other unknown creates of the same size; `listed_at`: when
    the listing the candidates come from began to be read; `named_after`: with a shared ledger, since when it names
    every other submitter's batch (None: no shared ledger).

    `body_complete` False means the journal shows the body never finished: the server
    cannot have created a batch from it, so there is nothing to wait for.
    """
    if not body_complete:
        return Decision(Action.ABANDON, reason="the body was never sent whole")
    if len(candidates) == 1 and not rivals:
        if named_after is not None and (parse_time(candidates[0].get("created_at")) or 0.0) >= named_after:
            return Decision(Action.ADOPT, (candidates[0],), "the one batch of its size since our send that the ledger "
                            "names for no other submitter (creates go one at a time)", "ledger")
        return Decision(Action.ADOPT, (candidates[0],), "one candidate in the listing", "listing")
    if not candidates:
        if listing_would_show(sent_at, listed_at, grace):
            return Decision(Action.ABANDON, reason="absent from listing")
        return Decision(Action.WAIT, reason="not listed yet")
    if any(b.get("processing_status") != "ended" for b in candidates):
        return Decision(Action.WAIT, tuple(candidates), "waiting for the candidates to end")
    return Decision(Action.COMPARE, tuple(candidates), "every candidate ended")


def ledger_names_the_rest(candidates: Iterable[dict[str, Any]], with_our_ids: Sequence[str], *,
                          rivals: Sequence[Rival], named_after: float | None, clock_skew: float = 0.0) -> str | None:
    """Among ended candidates, the one the shared ledger proves this create's, if any: of those that carry our
    custom_ids (read whole), exactly one that no rival create may have made (`rivals`: those that may carry our ids,
    `carrying`; a batch created before a rival's turn, less the clock skew, is not its batch), and the ledger names
    every other submitter's batch since before the first candidate (`named_after`). The other unnamed ones are then
    a rival's, or this owner's own earlier creates (a table job's earlier run, given the same ledger), never an
    unnamed submitter's. None: usage decides."""
    listed = list(candidates)
    if named_after is None or any((parse_time(b.get("created_at")) or 0.0) < named_after for b in listed):
        return None
    by_id = {str(b.get("id")): b for b in listed}
    free = [k for k in with_our_ids if k in by_id and not rivals_among([by_id[k]], rivals, clock_skew)]
    return free[0] if len(free) == 1 else None


def made_in_time(candidates: Iterable[dict[str, Any]], with_our_ids: Sequence[str], *, sent_at: float,
                 answer_wait: float, clock_skew: float = 0.0) -> str | None:
    """Of the candidates that carry our custom_ids (read whole), the one made while our create could still be
    answered, when the others were all made later: the server had our body whole at `sent_at`, and a batch made
    more than `answer_wait` (what the client waits for the answer) after it is another create's, made after ours was
    given up (issue 60, seed 8126: another job's create of our ids, 15 minutes after ours was cut by a kill). None:
    no candidate is set apart so, or not exactly one is left."""
    by_id = {str(b.get("id")): b for b in candidates}
    latest = sent_at + answer_wait + clock_skew
    timely = [k for k in with_our_ids if k in by_id and (parse_time(by_id[k].get("created_at")) or 0.0) <= latest]
    return timely[0] if len(timely) == 1 and len(with_our_ids) > 1 else None


def nearest_first(candidates: Iterable[dict[str, Any]], sent_at: float) -> list[str]:
    """Candidate ids by how soon after our send they were created (the tie-break when results cannot tell)."""
    return [str(b.get("id")) for b in sorted(candidates, key=lambda b: abs((parse_time(b.get("created_at")) or 0.0) - sent_at))]


def compared(choice: Choice, candidates: tuple[dict[str, Any], ...], *, sent_at: float, listed_at: float,
             grace: float, with_our_ids: Sequence[str] = ()) -> Decision:
    """After every candidate's results were read whole and weighed (`_ownership.choose`): adopt the one chosen.
    When none can be ours, wait until a listing read `grace` after the send (ours may not have been listed yet).
    Then, if no candidate carries our custom_ids, ours was not created (exact evidence): abandon, to send it again.
    If some do but their usage bills unlike our requests, that is an estimate's word, never a reason to send ours
    again: the nearest of them (`with_our_ids`, nearest first) is taken, unproven, and each of them is kept apart
    (`apart`: every candidate the evidence cannot tell from the one taken is collected, none joined)."""
    if choice.ours is not None:
        how = choice.basis or ("its results fit our requests" if choice.proven else "the results cannot tell it from another's")
        return Decision(Action.ADOPT, tuple(b for b in candidates if str(b.get("id")) == choice.ours), how,
                        "results" if choice.proven else "unproven", () if choice.proven else choice.alike)
    if not listing_would_show(sent_at, listed_at, grace):
        return Decision(Action.WAIT, candidates, "no candidate's results are ours, and ours may not be listed yet")
    if with_our_ids:
        return Decision(Action.ADOPT, tuple(b for b in candidates if str(b.get("id")) == with_our_ids[0]),
                        "none bills as our requests, but usage is an estimate: each with our custom_ids is kept "
                        "apart, nothing sent again", "unproven", tuple(with_our_ids[1:]))
    return Decision(Action.ABANDON, reason="no candidate carries our custom_ids")
