"""The submit loop's decisions, as pure functions over plain values: admission, backoff, reconciliation, settlement."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from gatekeeper._prices import Rates
from gatekeeper.api._client import results_location
from gatekeeper.api._retry import CallBudget, is_per_minute_limit
from gatekeeper.decide._admission import (
    CeilingEstimate,
    QueueState,
    admit,
    admit_round,
    batch_size_for,
    deferral_wait,
    recut_size,
    refusal_wait,
    room,
)
from gatekeeper.decide._budget import MIN_BATCH, Spend, answering_models, may_spend, request_worst
from gatekeeper.decide._downloads import Missing, download_wait, incomplete_reason, when_results_missing
from gatekeeper.decide._headroom import parse_time
from gatekeeper.decide._ownership import Choice
from gatekeeper.decide._reconcile import (
    ABSENCE_CAP,
    Action,
    candidates_for,
    compared,
    current_bound,
    decide,
    lag_retrieved,
    lag_seen,
    lag_shown,
    lag_since,
    listing_grace,
    nearest_first,
    newest_made,
    within_deadline,
)
from gatekeeper.decide._settle import CutAnswer, classify, cut_answer, errored_line, settle

# -- sizing and room ---------------------------------------------------------


@pytest.mark.parametrize(("ceiling", "margin", "max_requests", "expected"), [
    (None, 0, 100_000, 100_000),  # unknown ceiling: the per-batch limit
    (400_000, 0, 100_000, 100_000),  # four batches to the ceiling, capped by the limit
    (200_000, 0, 100_000, 50_000),
    (200_000, 40_000, 100_000, 40_000),  # the margin is left for others
    (3, 0, 100_000, 1),  # never zero
    (100, 200, 100_000, 1),  # a margin above the ceiling still sends one at a time
    (1_000, 0, 10, 10),  # the user's lower limit wins
])
def test_batch_size_for(ceiling: int | None, margin: int, max_requests: int, expected: int) -> None:
    """Batches are a quarter of the usable ceiling, within the per-batch limit, never empty."""
    assert batch_size_for(ceiling, margin, max_requests) == expected


@pytest.mark.parametrize(("ceiling", "depth", "margin", "unseen", "expected"), [
    (None, 10, 0, 0, None),
    (1000, 0, 0, 0, 1000),
    (1000, 300, 100, 200, 400),
    (1000, 1200, 0, 0, -200),  # over the ceiling (someone else's load): no room, negative
])
def test_room(ceiling: int | None, depth: int, margin: int, unseen: int, expected: int | None) -> None:
    """Room is the ceiling less depth, margin and our unseen creates."""
    assert room(ceiling, depth, margin, unseen) == expected


@pytest.mark.parametrize(("sizes", "free", "in_flight", "max_in_flight", "expected"), [
    ([10, 10, 10], 25, 0, None, 2),
    ([10, 10, 10], None, 0, None, 3),  # unknown ceiling: all may be tried
    ([30, 5], 25, 0, None, 0),  # in order: the large one is not overtaken
    ([10, 10, 10], 100, 1, 2, 1),  # the in-flight cap
    ([10], 10, 0, None, 1),  # exactly fits
    ([], 100, 0, None, 0),
    ([10], -5, 0, None, 0),
])
def test_admit(sizes: list[int], free: int | None, in_flight: int, max_in_flight: int | None, expected: int) -> None:
    """Admission takes waiting batches in order while they fit."""
    assert admit(sizes, free, in_flight=in_flight, max_in_flight=max_in_flight) == expected


@pytest.mark.parametrize(("state", "now", "expected"), [
    (QueueState(waiting=[10, 10], depth=0, unseen=0, bound=100), 0.0, 2),
    (QueueState(waiting=[10, 10], depth=85, unseen=0, bound=100), 0.0, 1),
    (QueueState(waiting=[10, 10], depth=80, unseen=15, bound=100), 0.0, 0),  # unseen creates count
    (QueueState(waiting=[10, 10], depth=0, unseen=0, bound=100, margin=85), 0.0, 1),
    (QueueState(waiting=[10, 10], depth=0, unseen=0, bound=100, backoff_until=5.0), 4.9, 0),  # backing off
    (QueueState(waiting=[10, 10], depth=0, unseen=0, bound=100, backoff_until=5.0), 5.0, 2),
    (QueueState(waiting=[10, 10], depth=0, unseen=0, bound=100, canceled=True), 0.0, 0),
    (QueueState(waiting=[10, 10], depth=10**6, unseen=0, bound=None), 0.0, 2),  # unknown: probe
    (QueueState(waiting=[], depth=0, unseen=0, bound=100), 0.0, 0),
])
def test_admit_round(state: QueueState, now: float, expected: int) -> None:
    """One round: nothing while backing off or canceled; otherwise what fits under the bound."""
    assert admit_round(state, now) == expected


@pytest.mark.parametrize(("streak", "retry_after", "expected"), [
    (1, None, 5.0), (2, None, 10.0), (3, None, 20.0), (4, None, 40.0),
    (1, 60.0, 60.0),  # the server's wait when longer
    (3, 1.0, 20.0),  # ours when longer
    (20, None, 600.0),  # capped
    (1, 5000.0, 600.0),
])
def test_refusal_wait_doubles_and_is_capped(streak: int, retry_after: float | None, expected: float) -> None:
    """Queue-full refusals back off exponentially from the floor, at least retry-after, at most the cap."""
    assert refusal_wait(streak, retry_after, 5.0, 600.0) == expected


@pytest.mark.parametrize(("retry_after", "expected"), [(None, 5.0), (12.0, 12.0), (9999.0, 600.0), (0.0, 5.0)])
def test_deferral_wait(retry_after: float | None, expected: float) -> None:
    """A deferred create waits retry-after (or the floor), capped."""
    assert deferral_wait(retry_after, 5.0, 600.0) == expected


def test_ceiling_estimate_learns_and_forgets() -> None:
    """A refusal of n at depth d bounds the ceiling below d + n; a later success above it lifts it; it expires."""
    e = CeilingEstimate(forget_after=100.0)
    assert e.bound(0.0) is None
    e.refused(depth=50_000, unseen=0, n=100_000, now=10.0)
    assert e.bound(10.0) == 149_999
    e.refused(depth=0, unseen=20_000, n=50_000, now=20.0)
    assert e.bound(20.0) == 69_999  # the tighter bound wins
    e.accepted(depth=60_000, unseen=0, n=20_000)
    assert e.upper == 80_000  # a success above the bound proves it wrong
    assert e.bound(119.0) == 80_000 and e.bound(121.0) is None


# -- reconciliation ----------------------------------------------------------

T0 = 1_700_000_000.0


def _batch(bid: str, n: int, at: float, status: str = "in_progress") -> dict[str, Any]:
    import datetime as dt

    stamp = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    counts = {"processing": n} if status != "ended" else {"succeeded": n}
    return {"id": bid, "created_at": stamp, "processing_status": status, "request_counts": counts}


def test_candidates_are_unknown_same_size_and_recent() -> None:
    """Only batches the journal does not know, of the intent's size, created after the send (less skew)."""
    listed = [_batch("a", 10, T0 + 1), _batch("b", 11, T0 + 1), _batch("c", 10, T0 - 1000), _batch("d", 10, T0 - 100),
              _batch("known", 10, T0 + 2)]
    found = candidates_for(10, T0, listed, {"known"}, clock_skew=300.0)
    assert [b["id"] for b in found] == ["a", "d"]


@pytest.mark.parametrize(("candidates", "rivals", "listed_at", "complete", "action"), [
    ([_batch("a", 10, T0)], 0, T0 + 1, True, Action.ADOPT),
    ([_batch("a", 10, T0)], 1, T0 + 1, True, Action.WAIT),  # a rival of the same size: not decidable by listing
    ([], 0, T0 + 10, True, Action.WAIT),  # not listed yet: the listing lags
    ([], 0, T0 + 181, True, Action.ABANDON),  # grace over: not created
    ([], 0, T0 + 1, False, Action.ABANDON),  # body never finished: cannot exist
    ([_batch("a", 10, T0), _batch("b", 10, T0)], 0, T0 + 1, True, Action.WAIT),
    ([_batch("a", 10, T0, "ended"), _batch("b", 10, T0, "ended")], 0, T0 + 1, True, Action.COMPARE),
])
def test_decide(candidates: list[dict[str, Any]], rivals: int, listed_at: float, complete: bool, action: Action) -> None:
    """Adopt a unique candidate; wait for lag or for ambiguous candidates to end; abandon after the grace."""
    d = decide(candidates, rivals=rivals, sent_at=T0, listed_at=listed_at, grace=180.0, body_complete=complete)
    assert d.action is action


@pytest.mark.parametrize(("choice", "listed_at", "action", "adopted", "proof"), [
    (Choice("b", ("a",), True), T0 + 1, Action.ADOPT, "b", "results"),  # proven ours, whenever the listing was read
    (Choice("b", (), False), T0 + 1, Action.ADOPT, "b", "unproven"),  # the results could not tell: said so
    (Choice(None, ("a", "b"), False), T0 + 181, Action.ABANDON, None, ""),  # none is ours, a listing after the grace
    (Choice(None, ("a",), False), T0 + 1, Action.WAIT, None, ""),  # none is ours, but ours may not be listed yet
    (Choice(None, (), False), T0 + 180, Action.WAIT, None, ""),  # the grace not yet over
])
def test_compared_abandons_only_on_a_listing_read_after_the_grace(
        choice: Choice, listed_at: float, action: Action, adopted: str | None, proof: str) -> None:
    """A rival's batch listed, ours not yet (listing lag): no match is not "not created" until the listing the
    candidates came from was read `grace` after the send, however long reading their results took."""
    candidates = tuple(_batch(bid, 2, T0 + 1, "ended") for bid in ("a", "b"))
    d = compared(choice, candidates, sent_at=T0, listed_at=listed_at, grace=180.0)
    assert d.action is action and d.proof == proof
    assert [b["id"] for b in d.candidates if d.action is Action.ADOPT] == ([adopted] if adopted else [])


@pytest.mark.parametrize("grace, lag, expected", [
    (180.0, 0.0, 180.0),  # a listing seen current: the setting
    (180.0, 60.0, 180.0),  # it lags within the setting
    (10.0, 30.0, 60.0),  # it lags past it (a cold tester's night): twice the lag seen
    (180.0, 200.0, 400.0),
    (10.0, 5 * ABSENCE_CAP, ABSENCE_CAP),  # capped: a batch missing for ever (deleted) cannot hold a job for ever
    (2 * ABSENCE_CAP, 10.0, 2 * ABSENCE_CAP),  # a setting above the cap stays
])
def test_a_listing_that_lags_stretches_the_grace(grace: float, lag: float, expected: float) -> None:
    assert listing_grace(grace, lag) == expected


def test_lag_shown_is_the_longest_a_newly_listed_batch_was_missing() -> None:
    """A batch listed for the first time, created before the listing before (which missed it), shows the lag;
    one listed before, one created since, or one without a time shows none."""
    def b(minute: float | None) -> dict[str, Any]:
        return {"created_at": None if minute is None else f"2027-01-04T00:{minute:02.0f}:00Z"}

    before_at = parse_time("2027-01-04T00:10:00Z") or 0.0
    listed = {"old": b(0), "late": b(3), "later": b(8), "new": b(12), "odd": b(None)}
    assert lag_shown(listed, {"old"}, before_at) == 7 * 60.0
    assert lag_shown(listed, {"old", "late", "later"}, before_at) == 0.0
    assert lag_shown({}, set(), before_at) == 0.0


@pytest.mark.parametrize("grace, lag, bound, expected", [
    (180.0, 0.0, 20.0, 180.0),  # its newest batch 20 s old: current, the setting
    (180.0, 0.0, 150.0, 300.0),  # 150 s old: it may lag that long, twice that
    (180.0, 0.0, math.inf, 8 * 180.0),  # it shows nothing: eight graces
    (450.0, 0.0, 5 * 3600.0, ABSENCE_CAP),  # a quiet account (its newest five hours old): an hour at most
    (10.0, 30.0, math.inf, 80.0),  # a lag seen (60) and nothing current: the longer (eight graces)
    (180.0, 1000.0, 20.0, 2000.0),  # a lag seen past it: twice the lag seen, as before
])
def test_a_listing_never_seen_current_stretches_the_grace(grace: float, lag: float, bound: float, expected: float) -> None:
    """`bound`: the least a listing was seen to lag at most (the age of the newest batch a reading showed)."""
    assert listing_grace(grace, lag, bound) == expected


@pytest.mark.parametrize("stretched, latest, expected", [
    (1440.0, None, 1440.0),  # no deadline: the whole stretch
    (1440.0, T0 + 3600.0, 1440.0),  # the real-time lane's last chance far enough: the whole stretch
    (1440.0, T0 + 900.0, 900.0),  # nearer: until that last chance
    (300.0, T0 + 100.0, 100.0),  # before even the plain grace: that last chance (its requests go real time)
    (300.0, T0 - 50.0, 0.0),  # already past it: at once
])
def test_a_deadline_cuts_an_unknown_creates_wait_at_the_lanes_last_chance(stretched: float, latest: float | None,
                                                                          expected: float) -> None:
    assert within_deadline(stretched, T0, latest) == expected


def test_the_bound_and_the_lag_a_listing_shows_against_an_earlier_one() -> None:
    """`current_bound`: the newest listed batch's age (infinite when none); `lag_since`: a batch listed now, made
    after the earlier listing's newest and before it was read, was missing from it; `lag_retrieved`: a batch
    retrieved that a listing missed lagged since its making."""
    def b(minute: float | None) -> dict[str, Any]:
        return {"created_at": None if minute is None else f"2027-01-04T00:{minute:02.0f}:00Z"}

    at = parse_time("2027-01-04T00:10:00Z") or 0.0
    assert current_bound({"a": b(2), "b": b(7), "c": b(None)}, at) == 3 * 60.0
    assert current_bound({}, at) == math.inf
    listed = {"old": b(0), "late": b(3), "later": b(8), "new": b(12)}
    assert lag_since(listed, at - 9 * 60.0, at) == 7 * 60.0  # (the earlier newest: minute 1; minute 3 was missing)
    assert lag_since(listed, None, at) == 10 * 60.0  # (it showed nothing: minute 0 was missing)
    assert lag_since(listed, at - 60.0, at) == 0.0  # (made before its newest: it may have been shown)
    assert lag_retrieved(b(4), at) == 6 * 60.0 and lag_retrieved(b(11), at) == 0.0 and lag_retrieved(b(None), at) == 0.0
    assert newest_made(listed) == at + 2 * 60.0 and newest_made({}) is None


def test_lag_seen_is_the_longest_a_batch_of_ours_was_missing() -> None:
    assert lag_seen([], 100.0) == 0.0
    assert lag_seen([40.0, 95.0, 70.0], 100.0) == 60.0


def test_nearest_first_orders_candidates_by_creation_after_the_send() -> None:
    cands = [_batch("late", 2, T0 + 9, "ended"), _batch("near", 2, T0 + 1, "ended"), _batch("mid", 2, T0 + 4, "ended")]
    assert nearest_first(cands, T0) == ["near", "mid", "late"]


# -- settlement --------------------------------------------------------------

def _errored(kind: str) -> dict[str, Any]:
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": "m"}}}


@pytest.mark.parametrize(("result", "attempt", "canceled", "kind", "retry"), [
    ({"type": "succeeded", "message": {}}, 1, False, "succeeded", False),
    (_errored("overloaded_error"), 1, False, "errored", True),
    (_errored("overloaded_error"), 3, False, "errored", False),  # attempts used up: final
    (_errored("invalid_request_error"), 1, False, "errored", False),  # resending cannot help
    (_errored("some_new_error"), 1, False, "errored", False),  # unknown: not resent
    ({"type": "errored", "error": {"type": "api_error", "message": "flat"}}, 1, False, "errored", True),
    ({"type": "expired"}, 1, False, "expired", True),
    ({"type": "canceled"}, 1, False, "canceled", True),
    ({"type": "canceled"}, 1, True, "canceled", False),  # the user canceled: final
    ("garbage", 1, False, "unknown", False),
])
def test_settle(result: Any, attempt: int, canceled: bool, kind: str, retry: bool) -> None:
    """A result is resent only when another try can succeed and attempts are left."""
    v = settle(result, attempt=attempt, max_attempts=3, user_canceled=canceled)
    assert (v.type, v.retry) == (kind, retry)


def test_errored_line_is_the_api_shape() -> None:
    """gatekeeper's own errored lines classify like the API's."""
    import orjson

    obj = orjson.loads(errored_line("c1", "gatekeeper_missing_result", "why"))
    assert obj["custom_id"] == "c1" and classify(obj["result"]).error_type == "gatekeeper_missing_result"


# -- issue 10's decisions: re-cut, missing results, downloads, per-minute 429s, the call budget, results URLs --



@pytest.mark.parametrize(("size", "largest", "bound", "margin", "expected"), [
    (100_000, 100_000, 99_999, 0, 50_000),  # refused whole at depth 0: halve
    (50_000, 50_000, 49_999, 0, 25_000),
    (100_000, 100_000, None, 0, None),  # nothing learned
    (100_000, 100_000, 150_000, 0, None),  # fits under the bound
    (100_000, 100_000, 20_000, 0, 20_000),  # a tight bound cuts straight to it
    (100_000, 100_000, 99_999, 90_000, 9_999),  # the margin is left
    (1, 1, 0, 0, None),  # cannot go below one request
    (100_000, 30_000, 29_999, 0, 15_000),  # the waiting batches are what is cut
])
def test_recut_size(size: int, largest: int, bound: int | None, margin: int, expected: int | None) -> None:
    """Batches are re-cut only when the learned bound is below them: halved, never below what the bound leaves."""
    assert recut_size(size, largest, bound, margin) == expected


@pytest.mark.parametrize(("refused", "bound", "expected"), [
    (1, 1, None),     # one request refused (a primer, with a lost create counted unseen): the queue is full, no more
    (1, 0, None),
    (5, 4, 4),        # a small batch refused at depth 0: what it shows is a size below it
    (15, 14, 7),      # the batch refused whole: halved
    (None, 1, 1),     # (the refused batch not said: as before)
])
def test_a_recut_is_never_to_a_size_the_refusal_itself_shows_does_not_fit(refused: int | None, bound: int,
                                                                          expected: int | None) -> None:
    """A refusal of a batch no larger than the size a re-cut would choose says the queue is full now, not that the
    batches are too large: nothing is cut (issue 60, swarm seed 7503: a one-request primer refused cut every waiting
    batch of 15 to one request, 40 batches one at a time outrunning the world)."""
    assert recut_size(15, 15, bound, 0, refused) == expected


DAY = 86_400.0


@pytest.mark.parametrize(("archived", "ended", "created", "now", "action"), [
    (False, T0, T0 - 100, T0 + 60, Missing.WAIT),  # just ended: the API is eventually consistent
    (False, T0, T0 - 100, T0 + 3599, Missing.WAIT),
    (False, T0, T0 - 100, T0 + 3601, Missing.UNAVAILABLE),  # the grace is over
    (True, T0, T0 - 100, T0 + 1, Missing.UNAVAILABLE),  # archived: gone at once
    (False, T0, T0 - 30 * DAY, T0 + 1, Missing.UNAVAILABLE),  # older than the retention
    (False, None, T0, T0 + DAY + 60, Missing.WAIT),  # end unknown: from the latest possible end
    (False, None, T0, T0 + DAY + 3601, Missing.UNAVAILABLE),
])
def test_when_results_missing(archived: bool, ended: float | None, created: float, now: float, action: Missing) -> None:
    """404s and null results_urls are waited out for the grace from the end; archived results end at once."""
    v = when_results_missing(archived=archived, ended_at=ended, created_at=created, now=now, grace=3600.0, retention=29 * DAY)
    assert v.action is action and v.reason


@pytest.mark.parametrize(("lines", "expected", "left", "complete"), [
    (100, 100, 0, True), (99, 100, 1, False), (101, 100, 0, False),
    (100, 100, 3, True),  # complete by the counts: what is left is reported, not waited for
    (5, None, 0, True), (5, 0, 2, False),  # counts unknown: every request must be seen
])
def test_incomplete_reason(lines: int, expected: int | None, left: int, complete: bool) -> None:
    """A download counts as complete only when its lines match the batch's total."""
    assert (incomplete_reason(lines, expected, left) is None) is complete


def test_download_wait_doubles_to_a_cap() -> None:
    """Failed downloads are retried after 5, 10, 20 ... seconds, at most the cap."""
    assert [download_wait(n, 5.0, 60.0) for n in (1, 2, 3, 4, 5)] == [5.0, 10.0, 20.0, 40.0, 60.0]


def test_a_batch_canceled_for_a_deadline_is_asked_for_at_an_even_pace() -> None:
    """Its requests wait for its results to reach the real-time lane: at most `urgent` (a quarter of the deadline's
    slack), never under the first wait (found by the swarm, seeds 1436 and 5268: a doubling wait of 80 and 160 s read
    a canceled batch's results past the deadline)."""
    assert [download_wait(n, 5.0, 300.0, urgent=15.0) for n in (1, 2, 3, 6)] == [5.0, 10.0, 15.0, 15.0]
    assert download_wait(6, 5.0, 300.0, urgent=1.0) == 5.0


@pytest.mark.parametrize(("headers", "per_minute"), [
    ({"anthropic-ratelimit-requests-remaining": "0", "retry-after": "7"}, True),
    ({"anthropic-ratelimit-requests-remaining": "12"}, False),
    ({"retry-after": "60"}, False),  # a retry-after alone shows nothing: taken as queue-full on create
    ({}, False),
])
def test_is_per_minute_limit(headers: dict[str, str], per_minute: bool) -> None:
    """Only the request counter's headers show a 429 to be per-minute."""
    assert is_per_minute_limit(headers) is per_minute


def test_call_budget_allows_a_burst_then_the_rate() -> None:
    """20 calls go at once; then one each 60/per_minute seconds; a pause holds every call."""
    b = CallBudget(per_minute=60.0, burst=20.0, tokens=20.0)
    assert [b.delay(0.0) for _ in range(20)] == [0.0] * 20
    assert b.delay(0.0) == pytest.approx(1.0)
    assert b.delay(1.0) == pytest.approx(1.0)  # one token came back, two were asked
    b.pause(100.0)
    assert b.delay(50.0) == pytest.approx(50.0)


@pytest.mark.parametrize(("url", "expected"), [
    ("https://api.anthropic.com/v1/messages/batches/msgbatch_1/results", "http://gw.local:8080/v1/messages/batches/msgbatch_1/results"),
    ("/v1/messages/batches/msgbatch_1/results", "http://gw.local:8080/v1/messages/batches/msgbatch_1/results"),
    ("https://store.example/signed/abc?sig=s", "https://store.example/signed/abc?sig=s"),
    ("https://api.anthropic.com/v1/messages/batches/msgbatch_OTHER/results",
     "https://api.anthropic.com/v1/messages/batches/msgbatch_OTHER/results"),  # not this batch's path: as given
])
def test_results_location_goes_through_the_gateway(url: str, expected: str) -> None:
    """The API's own results path is fetched from the configured base URL; anything else as given."""
    assert results_location(url, "http://gw.local:8080", "msgbatch_1") == expected


# -- the budget -----------------------------------------------------------------



DEFAULT = Rates(1.0, 5.0, 1.25, 0.1, 2.0)  # the default multipliers


@pytest.mark.parametrize(("rates", "hour", "per_input"), [
    ([DEFAULT], False, 1.25),  # the 5-minute write is the dearest way to bill input
    ([DEFAULT], True, 2.0),  # a request that may write a 1-hour entry
    ([Rates(1.0, 5.0, 5.0, 0.1, 2.0)], False, 5.0),  # a table whose writes cost 5x input: its own rate
    ([Rates(1.0, 5.0, 5.0, 0.1, 7.0)], True, 7.0),
    ([Rates(3.0, 5.0, 1.0, 0.1, 2.0)], True, 3.0),  # writes cheaper than input: input's
    ([Rates(1.0, 5.0, 1.25, 9.0, 2.0)], False, 9.0),  # an odd table whose reads are dearest
])
def test_request_worst_prices_input_at_the_tables_dearest_rate(rates: list[Rates], hour: bool, per_input: float) -> None:
    """0.5 x (bytes/2 tokens x the dearest input rate + max_tokens x price_out) / 1e6."""
    assert request_worst(1000, 100, rates, hour_write=hour) == pytest.approx(0.5 * (500 * per_input + 100 * 5.0) / 1e6)


def test_request_worst_takes_the_dearest_model_that_may_answer() -> None:
    """A request naming fallback models may be answered (and billed) by any of them."""
    dear = Rates(15.0, 75.0, 18.75, 1.5, 30.0)
    assert request_worst(1000, 100, [DEFAULT, dear]) == request_worst(1000, 100, [dear])
    assert answering_models({"model": "a", "fallbacks": [{"model": "b"}, "c", {"x": 1}, 7]}) == ["a", "b", "c"]
    assert answering_models({"model": "a"}) == ["a"]


@pytest.mark.parametrize(("spent", "in_flight", "worst", "n", "action", "size"), [
    (0.0, 0.0, 5.0, 1000, Spend.GO, 0),
    (4.0, 1.0, 5.0, 1000, Spend.GO, 0),  # exactly the budget
    (4.0, 1.0, 5.1, 1000, Spend.WAIT, 0),  # in flight settles below its worst: wait
    (6.0, 0.0, 5.0, 1000, Spend.CUT, 800),  # 4.0 left at 0.005 a request
    (9.9, 0.0, 5.0, 1000, Spend.STOP, 0),  # 20 requests' worth: under the smallest batch
    (10.0, 0.0, 5.0, 1000, Spend.STOP, 0),
])
def test_may_spend(spent: float, in_flight: float, worst: float, n: int, action: Spend, size: int) -> None:
    """Go when the worst case fits; wait for what is in flight; else cut to what fits, or stop below MIN_BATCH."""
    d = may_spend(budget=10.0, spent=spent, in_flight=in_flight, worst=worst, requests=n)
    assert (d.action, d.size) == (action, size)


def test_a_budget_never_cuts_below_the_smallest_batch() -> None:
    """Money left for fewer than MIN_BATCH requests stops admitting rather than sending a crumb of a batch."""
    worst_each = 0.005
    just_under = may_spend(budget=10.0, spent=10.0 - (MIN_BATCH - 1) * worst_each, in_flight=0.0, worst=5.0, requests=1000)
    enough = may_spend(budget=10.0, spent=10.0 - MIN_BATCH * worst_each, in_flight=0.0, worst=5.0, requests=1000)
    assert just_under.action is Spend.STOP and (enough.action, enough.size) == (Spend.CUT, MIN_BATCH)


@pytest.mark.parametrize(("ends", "have", "kept"), [
    ([100, 250, 400], 0, 0),      # the output is gone: rebuild every batch
    ([100, 250, 400], 99, 0),     # the first batch is torn
    ([100, 250, 400], 100, 1),    # exactly the first batch
    ([100, 250, 400], 399, 2),    # the last batch is torn
    ([100, 250, 400], 400, 3),    # whole (the caller does not rebuild then)
    ([], 0, 0),
])
def test_kept_spans(ends: list[int], have: int, kept: int) -> None:
    """A rebuild keeps the batches lying whole in the file, and downloads the rest again."""
    from gatekeeper.run.recovery._rebuild import kept_spans

    assert kept_spans(ends, have) == kept


HERE = "boot-1/4026531836"


@pytest.mark.parametrize(("holder", "here", "ended"), [
    ({"host": "a", "pid": 41, "machine": HERE}, HERE, True),        # died on this machine: free at once
    ({"host": "a", "pid": 42, "machine": HERE}, HERE, False),       # its pid is in use (by it, or by another program)
    ({"pid": 42, "machine": HERE, "started": "900"}, HERE, False),  # in use by the process recorded: alive
    ({"pid": 42, "machine": HERE, "started": "800"}, HERE, True),   # reused by a process started since: it ended
    ({"pid": 43, "machine": HERE, "started": "800"}, HERE, False),  # in use, the system not saying since when
    ({"pid": 41, "machine": HERE, "started": "800"}, HERE, True),   # gone, whatever it recorded
    ({"pid": 42, "machine": "boot-2/4026531836", "started": "800"}, HERE, False),  # another machine's pid 42
    ({"host": "b", "pid": 41, "machine": "boot-2/4026531836"}, HERE, False),  # another machine, or this one rebooted
    ({"host": "a", "pid": 41, "machine": "boot-1/4026532999"}, HERE, False),  # another container: its own pids
    ({"host": "a", "pid": 41}, HERE, False),                        # recorded no identity (an older gatekeeper)
    ({"host": "a", "pid": 41, "machine": None}, None, False),       # neither side knows its machine
    ({"host": "a", "pid": "41", "machine": HERE}, HERE, False),     # a pid that is not a number
    ({"host": "a", "pid": 0, "machine": HERE}, HERE, False),        # kill(0) would ask about our own group
    ({}, HERE, False),
])
def test_run_ended(holder: dict[str, Any], here: str | None, ended: bool) -> None:
    """A lease's holder (or a ledger's submitter) has certainly ended only on this machine (same boot and pid
    namespace), its pid gone or reused by a process started at another time than the one recorded."""
    from gatekeeper.decide._host import run_ended

    assert run_ended(holder, here, started=lambda pid: {41: None, 42: "900", 43: ""}[pid]) is ended


def test_this_process_is_alive_and_a_reaped_child_is_not() -> None:
    import subprocess
    import sys

    from gatekeeper.state._host import machine_id, pid_alive, process_started, this_process

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    assert pid_alive(os.getpid()) and not pid_alive(int(child.stdout))
    assert process_started(int(child.stdout)) is None
    me = this_process()
    assert me["pid"] == os.getpid() and process_started(os.getpid()) == me["started"]
    if sys.platform == "linux":  # (its start in clock ticks since boot: a later process started later)
        import time

        zombie = subprocess.Popen([sys.executable, "-c", "pass"])
        deadline = time.monotonic() + 20
        while process_started(zombie.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # (exited, not yet reaped: a zombie has ended, it holds nothing)
        assert process_started(zombie.pid) is None and pid_alive(zombie.pid)
        zombie.wait()
        assert int(me["started"]) > 0
    here = machine_id()  # boot id and pid namespace: what tells this machine (and this container) from another
    assert here is None or (here.count("/") == 1 and all(here.split("/")))


def test_others_in_flight_are_their_ids_and_unconfirmed_sizes() -> None:
    """Another submitter's confirmed batch is never our candidate; its unconfirmed creates are rivals by size."""
    from gatekeeper.decide._reconcile import others_in_flight
    from gatekeeper.state.ledger._base import Reservation

    rs = [Reservation("me", 0, 40, None, 10), Reservation("me", 1, 40, "b-mine", 10),
          Reservation("them", 0, 40, "b-theirs", 10), Reservation("them", 1, 40, None, 10),
          Reservation("them", 2, 7, None, 10), Reservation("also", 0, 40, None, 10)]
    theirs, unconfirmed = others_in_flight(rs, "me")
    assert theirs == {"b-theirs"} and unconfirmed == {40: 2, 7: 1}
    assert others_in_flight([], "me") == (set(), {})


# -- cache markers the API refuses ----------------------------------------------

def _marked(*lives: str | None, top: object = None, where: str = "messages") -> dict:
    blocks = [{"type": "text", "text": f"b{i}", **({"cache_control": {"type": "ephemeral", **({"ttl": t} if t else {})}}
                                                    if t != "-" else {})} for i, t in enumerate(lives)]
    params: dict = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": blocks if where == "messages" else "q"}]}
    if where == "system":
        params["system"] = blocks
    if top is not None:
        params["cache_control"] = top
    return params


@pytest.mark.parametrize(("params", "refused"), [
    (_marked(None), None),  # one marker, the default 5m life
    (_marked("1h", "1h", "5m", None), None),  # four, the 1h ones first
    (_marked("5m", "1h"), "1h cache_control marker after a 5m one"),
    (_marked("5m", "-", "1h", where="system"), "1h cache_control marker after a 5m one"),
    (_marked("5m", "5m", "5m", "5m", "5m"), "5 cache_control markers"),
    (_marked("10m"), "ttl '10m'"),
    (_marked("-", top={"type": "ephemeral", "ttl": "2h"}), "ttl '2h'"),
    (_marked("5m", "5m", "5m", "5m", top={"type": "ephemeral"}), None),  # the automatic marker: not counted (the docs leave it open)
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "no markers"}]}, None),
])
def test_markers_the_api_refuses_are_found_before_sending(params: dict, refused: str | None) -> None:
    from gatekeeper.input._markers import marker_reason

    reason = marker_reason(params)
    assert (reason is None) if refused is None else (reason is not None and refused in reason), reason


@pytest.mark.parametrize(("readings", "interval", "wait"), [
    (1, 30.0, 1.0), (2, 30.0, 2.0), (3, 30.0, 4.0), (5, 30.0, 16.0), (6, 30.0, 30.0), (50, 30.0, 30.0),
    (100_000, 30.0, 30.0),  # a day of fast readings: never an overflow
    (1, 0.05, 0.05),  # never slower than the interval asked for
    (0, 30.0, 1.0),
])
def test_readings_start_fast_and_settle_at_the_interval(readings: int, interval: float, wait: float) -> None:
    from gatekeeper.decide._admission import reading_wait

    assert reading_wait(readings, interval) == wait


@pytest.mark.parametrize(("result", "lane", "want"), [
    ({"type": "succeeded", "message": {}}, "queued", CutAnswer(join=True, charged=True)),  # (a call lost twice waits)
    ({"type": "succeeded", "message": {}}, "sent", CutAnswer(join=True, charged=True)),  # (its call's answer kept aside)
    ({"type": "succeeded", "message": {}}, "received", CutAnswer(join=False, charged=True)),  # the lane's first
    ({"type": "succeeded", "message": {}}, "answered", CutAnswer(join=False, charged=True)),
    ({"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error"}}}, "queued",
     CutAnswer(join=True, charged=True)),  # (final: the same whichever lane)
    ({"type": "expired"}, "queued", CutAnswer(join=False, charged=False)),  # not processed: the lane sends it
    ({"type": "canceled"}, "answered", CutAnswer(join=False, charged=False)),
    ({"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error"}}}, "queued",
     CutAnswer(join=False, charged=False)),
])
def test_a_cut_creates_batch_answers_where_the_lane_has_not(result: dict[str, Any], lane: str, want: CutAnswer) -> None:
    """A batch found after the deadline cut its create's wait: each answer joined only where the real-time lane has
    not answered, never one the batch did not process (swarm seed 100095)."""
    assert cut_answer(result, lane) == want
