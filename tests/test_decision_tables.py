"""Table rows for the small pure decisions the larger tests only pass through: the deadline forecast `plan` prints,
how long a batch has stalled, API timestamps read and written, what a verdict tells the user to do, and the most
one request line can cost."""

from __future__ import annotations

import orjson
import pytest

from gatekeeper import Limits, PlanReport, UsageError
from gatekeeper._prices import load_prices
from gatekeeper.checks._forecast import forecast_from_limits
from gatekeeper.decide._budget import body_worst
from gatekeeper.decide._deadline import JobBatch, newly_given_back, stalled_for
from gatekeeper.decide._headroom import Headroom, ModelLimits, QueuedBatch, format_time, parse_time, repair_lines

NOW = 1_800_000_000.0
HAIKU, OPUS = "claude-haiku-4-5-20251001", "claude-opus-4-6"


def _report(n: int = 1000, model: str = HAIKU, max_tokens: int = 100) -> PlanReport:
    return PlanReport(limits=Limits(), requests=n, models={model: n}, max_tokens_peak={model: max_tokens})


FAST = ModelLimits(4000, 2_000_000, 400_000)
SLOW = ModelLimits(50, 30_000, 8_000)


@pytest.mark.parametrize("window, ceiling, limits, alone, moved, in_time, of", [
    (7200, None, {}, True, 0, True, []),  # one wave of an hour in two hours: the batch lane alone
    (9000, 250, {}, False, 500, True, []),  # four waves, two fit: 500 go real time at 50 RPM (about 10 min)
    (1800, None, {}, False, 1000, True, []),  # no wave fits: all of it, about 20 min at the lowest tier's pace
    (900, None, {}, False, 1000, False, []),  # 15 minutes is too short for 1,000 at 50 RPM
    (900, None, {HAIKU: FAST, OPUS: SLOW}, False, 1000, True, [HAIKU]),  # the job's own model's limits, not the other's
    (900, None, {OPUS: FAST, "claude-sonnet-4-5": SLOW}, False, 1000, False, [OPUS, "claude-sonnet-4-5"]),  # the slowest
])
def test_the_deadline_forecast(window: float, ceiling: int | None, limits: dict[str, ModelLimits], alone: bool,
                               moved: int, in_time: bool, of: list[str]) -> None:
    estimate = {"input_tokens": 100_000, "input_cost_usd": 2.0}
    f = forecast_from_limits(_report(), estimate, deadline=NOW + window, now=NOW, limits=limits, ceiling=ceiling,
                          turnaround=3600, slack=60)
    assert (f["batch_lane_alone"], f["realtime_requests"], f["realtime_in_time"]) == (alone, moved, in_time)
    assert f["extra_input_cost_usd"] == pytest.approx(2.0 * moved / 1000)
    assert f["window_seconds"] == window and f["at"] == format_time(NOW + window)
    assert f["assumes"]["rate_limits_of"] == of
    assert f["assumes"]["rate_limits_from"] == ("admin-api" if limits else "the lowest tier's (no Admin key read them)")
    assert f["assumes"]["waves"] == (-(-1000 // ceiling) if ceiling else 1)


@pytest.mark.parametrize("batch, stalled", [
    (JobBatch(0, 100, NOW - 600, 0), 600.0),  # nothing shown done for ten minutes
    (JobBatch(0, 100, NOW - 600, 1), 0.0),  # anything done: not stalled
    (JobBatch(0, 100, NOW + 5, 0), 0.0),  # created "after" now (clocks disagree): never negative
    (JobBatch(0, 100, NOW, 0), 0.0),
])
def test_how_long_a_batch_has_stalled(batch: JobBatch, stalled: float) -> None:
    assert stalled_for(batch, NOW) == stalled


@pytest.mark.parametrize("text, expected", [
    ("2027-01-15T08:00:00Z", 1_800_000_000.0),
    ("2027-01-15T08:00:00+00:00", 1_800_000_000.0),
    ("2027-01-15T09:00:00+01:00", 1_800_000_000.0),
    ("2027-01-15T08:00:00.250000Z", 1_800_000_000.25),
    ("2027-01-15T08:00:00", 1_800_000_000.0),  # no offset: UTC, as the API means it
    ("2027-01-15", 1_799_971_200.0),
    ("yesterday", None), ("", None), (None, None), (1_800_000_000, None),
])
def test_api_timestamps_are_read(text: object, expected: float | None) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("at", [0.0, 1_800_000_000.0, 1_800_000_000.9, 4_102_444_800.0])
def test_a_written_time_reads_back_to_the_second(at: float) -> None:
    assert format_time(at).endswith("+00:00") and parse_time(format_time(at)) == float(int(at))


BIG = QueuedBatch("msgbatch_big", "in_progress", 90_000, "ws2")


def _platform(name: str) -> object:
    """A platform object by name, as `repair_lines` asks it (its settings made up: repairs do not depend on them)."""
    from gatekeeper.api._anthropic import ANTHROPIC
    from gatekeeper.api._aws import AwsPlatform

    return {"anthropic": ANTHROPIC, "aws": AwsPlatform("us-east-1", "wrkspc_1", "https://aws.example.test")}[name]


@pytest.mark.parametrize("state, headroom, platform, says, never", [
    ("queue-clear", Headroom(1000, 10), "anthropic", ["nothing to change"], ["--ceiling"]),
    ("queue-limit-unknown", Headroom(None, 10), "anthropic", ["ANTHROPIC_ADMIN_KEY", "--ceiling N"], ["AWS"]),
    ("queue-limit-unknown", Headroom(None, 10), "aws", ["no Admin API", "--ceiling N"], ["ANTHROPIC_ADMIN_KEY"]),
    ("queue-near-limit", Headroom(100_000, 95_000, (BIG,)), "anthropic",
     ["wait for one to end", "msgbatch_big (ws2) alone holds 90,000 of the 100,000", "24 hours"], []),
    ("queue-exhausted", Headroom(100_000, 100_000), "anthropic", ["wait for one to end", "24 hours"], ["alone holds"]),
])
def test_what_a_verdict_tells_the_user_to_do(state: str, headroom: Headroom, platform: str, says: list[str],
                                            never: list[str]) -> None:
    text = "\n".join(repair_lines(state, headroom, _platform(platform)))
    assert all(s in text for s in says) and not any(n in text for n in never), text


def _line(model: str = HAIKU, max_tokens: int = 1000, **params: object) -> bytes:
    return orjson.dumps({"custom_id": "a", "params": {"model": model, "max_tokens": max_tokens,
                                                     "messages": [{"role": "user", "content": "x" * 200}], **params}})


@pytest.mark.parametrize("body, per_in, per_out", [
    (_line(), 1.25, 5.0),  # haiku: every input token at its dearest (a 5-minute write), max_tokens at output
    (_line(max_tokens=10), 1.25, 5.0),
    (_line(fallbacks=[OPUS]), 6.25, 25.0),  # a fallback that may answer: the dearer model's rates
    (_line(fallbacks=[{"model": OPUS}]), 6.25, 25.0),
    (_line(system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]), 2.0, 5.0),
])
def test_the_most_a_request_line_can_cost(body: bytes, per_in: float, per_out: float) -> None:
    max_tokens = orjson.loads(body)["params"]["max_tokens"]
    expected = 0.5 * (len(body) * 0.5 * per_in + max_tokens * per_out) / 1e6  # batch price: half
    assert body_worst(body, 7, load_prices()) == pytest.approx(expected)


def test_a_line_whose_model_has_no_price_is_named() -> None:
    with pytest.raises(UsageError, match=r"claude-unknown-9 \(line 7"):
        body_worst(_line(fallbacks=["claude-unknown-9"]), 7, load_prices())


@pytest.mark.parametrize("canceled, collected, given, new", [
    ([], [0, 1], set(), set()),  # nothing canceled for the deadline: retries form batches as ever
    ([5], [0, 1, 2], set(), set()),  # canceled, not yet collected
    ([5], [0, 5], set(), {5}),  # collected this reading: what it gave back goes real time (a cold tester's F4)
    ([5], [0, 5], {5}, set()),  # seen before: later retries are weighed as any (`moves`), not moved for it
    ([5, 6], [5, 6], {5}, {6}),
])
def test_what_a_deadline_cancel_gave_back_goes_real_time_once(canceled: list[int], collected: list[int],
                                                              given: set[int], new: set[int]) -> None:
    assert newly_given_back(canceled, collected, given) == new
