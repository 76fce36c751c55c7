"""`--deadline` end to end: the CLI and the library over real HTTP against the fake, whose batch lane stalls,
crawls or runs well and whose real-time lane paces, refuses, overloads and loses answers as the real one may."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gatekeeper import ApiConfig, Secret, SubmitSettings, UsageError, submit_sync
from gatekeeper._prices import load_prices
from gatekeeper.cli._render import render_summary
from gatekeeper.decide._headroom import format_time, parse_time
from gatekeeper.run.shared._summary import Summary
from gatekeeper.state._journal import Journal
from gatekeeper.testing import FakeAPI, FakeConfig, FakeRealtime, Fault
from gatekeeper.watch._exporter import run_figures
from tests.fakes import WS1, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import events, gk, output_ids, start

FAST = ["--interval", "0.1", "--max-rpm", "60000", "--reconcile-grace", "1", "--max-requests", "20", "--json"]
TIGHT = ["--turnaround", "2", "--deadline-slack", "2"]
ONE_BATCH = [a for a in FAST if a not in ("--max-requests", "20")]  # (a job in one batch)
RT = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000)
# For the tests of the real-time lane itself: a stalled batch lane and a deadline whose last chance comes at once
# (the slack fills all but the first 2 s of the window): the batches are created (nothing moves on the prior
# turnaround alone), and canceled once they have waited longer than the lane needs for them, a second or two in.
# The deadline itself is far: met by half a minute, on a machine as loaded as it may be.
AT_ONCE = ["--deadline", "40s", "--deadline-slack", "38"]
# For a crawling batch lane split between the lanes: the last chance comes 12 s in (the batches have crawled for
# that long), and the slack covers the cancel's delay (a second in the fake), the real-time calls and a loaded
# machine's readings, so the deadline is met by half a minute, not by a hair.
SPLIT = ["--deadline", "40s", "--turnaround", "2", "--deadline-slack", "28"]


def _input(tmp_path: Path, n: int = 40, **params: object) -> tuple[Path, set[str]]:
    items: list = [req(f"q{i:04d}", text=f"question {i}", **params) for i in range(n)]
    return write_jsonl(tmp_path / "in.jsonl", items), {f"q{i:04d}" for i in range(n)}


def _out(path: Path) -> Path:
    return Path(str(path) + ".gatekeeper") / "results.jsonl"


def assert_one_lane_each(fake: FakeAPI, out: Path, expected: set[str], *, doubles: int = 0) -> None:
    """Every request has one line; none answered by both lanes; none answered twice in the real-time lane beyond
    the `doubles` reported as possible double charges."""
    ids = output_ids(out)
    assert len(ids) == len(set(ids)) and set(ids) == expected
    records = fake.org.records
    batch_digests = {d for _, d in records.answered}
    assert not batch_digests & set(records.realtime), "a request was answered in both lanes"
    assert sum(1 for n in records.answered.values() if n > 1) == 0
    assert sum(n - 1 for n in records.realtime.values()) == doubles


def test_a_stalled_batch_lane_finishes_in_real_time_by_the_deadline(tmp_path: Path) -> None:
    """The batch lane processes nothing: its batches wait, and at their last chance (the deadline less the slack
    less the lane's time: about 10 s in) they are canceled and their requests finish in real time, by the deadline.
    The slack (20 s) is what a loaded machine's readings, the fake's one-second cancel and the calls take at most."""
    path, expected = _input(tmp_path)
    with running_fake(rate=0.0, realtime=RT) as fake:
        done = gk(["submit", str(path), "--deadline", "30s", "--turnaround", "2", "--deadline-slack", "20", *FAST],
                  env_for(fake))
        assert done.returncode == 0, done.stderr
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 40 and s["deadline"]["met"] is True
        assert s["lanes"]["realtime"]["requests"] == 40 and s["lanes"]["batch"]["requests"] == 0
        # real time costs twice the batch price: the same tokens at standard prices
        assert s["lanes"]["realtime"]["cost_usd"] == s["cost_usd"] > 0
        canceled = [e for e in events(done.stderr) if e["event"] == "deadline_cancel"]
        assert len(canceled) == 2  # the two live batches, canceled once each
        assert_one_lane_each(fake, _out(path), expected)
        lane = fake.realtime.records
        assert lane.calls == 40 and lane.limited + lane.accelerated == 0  # paced under the limits, ramped
        first = [line for line in _out(path).read_bytes().splitlines()][0]
        assert orjson.loads(first)["result"]["message"]["usage"]["service_tier"] == "standard"


def test_a_lost_output_is_rebuilt_with_the_real_time_answers(tmp_path: Path) -> None:
    """The real-time lane's answers cannot be downloaded again: the journal keeps their lines, and a rerun whose
    output is gone writes them back, with the batch lane's downloaded again, and sends nothing."""
    path, expected = _input(tmp_path, 60)
    with running_fake(rate=1.5, realtime=RT) as fake:
        done = gk(["submit", str(path), *SPLIT, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        before = _out(path).read_bytes()
        _out(path).unlink()
        calls = fake.realtime.records.calls
        # the deadline has passed by the rerun: it was met by the run that finished the job, and stays met
        j = Journal.open(_out(path).parent)
        finished = j.get_meta("finished_at")
        j.set_meta("deadline", finished + 0.001)
        j.close()
        again = gk(["submit", str(path), *SPLIT, *FAST], env_for(fake))
        assert again.returncode == 0, again.stderr
        assert _out(path).read_bytes() == before and set(output_ids(_out(path))) == expected
        s = orjson.loads(again.stdout)
        assert fake.realtime.records.calls == calls and s["rebuilt"]["results"] == 60
        assert s["deadline"]["met"] and s["deadline"]["finished_at"] == format_time(finished)


def test_a_crawling_batch_lane_is_split_between_the_lanes(tmp_path: Path) -> None:
    path, expected = _input(tmp_path, 60)
    with running_fake(rate=1.5, realtime=RT) as fake:
        done = gk(["submit", str(path), *SPLIT, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        s = orjson.loads(done.stdout)
        lanes = s["lanes"]
        assert lanes["batch"]["requests"] > 0 and lanes["realtime"]["requests"] > 0
        assert lanes["batch"]["requests"] + lanes["realtime"]["requests"] == 60 == s["succeeded"]
        assert s["deadline"]["met"] is True and s["resubmitted"] == 0  # (moved to a lane, not resent in a batch)
        assert_one_lane_each(fake, _out(path), expected)
    report = gk(["report", str(path)], {})
    assert report.returncode == 0, report.stderr
    html = (Path(str(path) + ".gatekeeper") / "report.html").read_text()
    assert "real-time lane" in html and f"{lanes['realtime']['requests']:,} requests" in html and ": met" in html
    figures = run_figures(Path(str(path) + ".gatekeeper"), load_prices())
    assert figures["lanes"]["realtime"]["requests"] == lanes["realtime"]["requests"]
    assert figures["possible_double_charges"] == 0


def test_a_healthy_batch_lane_makes_no_real_time_call(tmp_path: Path) -> None:
    path, expected = _input(tmp_path)
    with running_fake(rate=4000.0, realtime=RT) as fake:
        done = gk(["submit", str(path), "--deadline", "3h", *FAST], env_for(fake))  # (the default turnaround is 1 h)
        assert done.returncode == 0, done.stderr
        s = orjson.loads(done.stdout)
        assert s["deadline"]["met"] is True and "realtime" not in s["lanes"]
        assert fake.realtime.records.calls == 0 and fake.org.records.requests_seen.get("messages", 0) == 0
        assert set(output_ids(_out(path))) == expected


def test_without_a_deadline_no_real_time_call_is_ever_made(tmp_path: Path) -> None:
    path, _ = _input(tmp_path, 10)
    with running_fake(rate=4000.0) as fake:
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0 and orjson.loads(done.stdout)["deadline"] is None
        assert fake.org.records.requests_seen.get("messages", 0) == 0


@pytest.mark.parametrize("point", ["realtime-answered:5", "realtime-before-commit:2"])
def test_sigkill_during_real_time_calls_then_rerun(tmp_path: Path, point: str) -> None:
    """Killed with calls out or answers uncommitted: the rerun sends the calls out again, counts each as a possible
    double charge, commits the answers received without buying them again, and every request ends with one line,
    never answered by both lanes."""
    path, expected = _input(tmp_path, 120)  # (enough that answers come in more than one commit)
    with running_fake(rate=0.0, realtime=RT) as fake:
        crashed = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake), crash_at=point)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        s = orjson.loads(done.stdout)
        doubles = s["lanes"]["realtime"]["possible_double_charges"]
        # (a call out at the kill is sent again and counted; an answer received and not yet committed is kept)
        assert doubles >= (1 if point.startswith("realtime-answered") else 0) and s["succeeded"] == 120
        answered_twice = sum(n - 1 for n in fake.org.records.realtime.values())
        assert answered_twice <= doubles  # (a call out when killed may not have reached the fake)
        ids = output_ids(_out(path))
        assert len(ids) == len(set(ids)) and set(ids) == expected
        assert not {d for _, d in fake.org.records.answered} & set(fake.org.records.realtime)


def test_three_kills_with_calls_out_never_buy_an_answer_a_third_time(tmp_path: Path) -> None:
    """Killed three times while real-time calls are out (an OOM, a triggerer hand-off): a call out at a crash is sent
    again once, counted; a request whose calls were out at two crashes ends `gatekeeper_answer_lost`, never sent a
    third time. Every request ends with one line; the fake billed none more than twice."""
    path, expected = _input(tmp_path, 160)  # (enough left for a third kill after two cut calls off)
    slow = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, latency=0.3)
    with running_fake(rate=0.0, realtime=slow) as fake:
        for _ in range(3):
            crashed = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake), crash_at="realtime-answered:3")
            assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode in (0, 1), done.stderr[-2000:]
        s = orjson.loads(done.stdout)
        lost = s["errors"].get("gatekeeper_answer_lost", 0)
        billed = list(fake.org.records.realtime.values())
        assert s["succeeded"] + lost == 160 and max(billed) <= 2, (lost, billed)
        assert billed.count(2) >= 1  # (the crashes did cut calls off: some were bought twice, and no more)
        ids = output_ids(_out(path))
        assert len(ids) == len(set(ids)) and set(ids) == expected


def test_the_budget_wins_over_the_deadline(tmp_path: Path) -> None:
    """A budget the real-time lane's worst case would pass: nothing moves, the batch lane finishes late, and the
    summary says the deadline was missed for the budget (exit 1)."""
    path, expected = _input(tmp_path, 10)
    # the batch lane's worst case for these 10 is $0.002, the real-time lane's $0.004: the budget takes one, not both
    with running_fake(rate=2.5, realtime=RT) as fake:
        done = gk(["submit", str(path), "--deadline", "2s", "--budget", "0.003", *TIGHT, *FAST], env_for(fake))
        assert done.returncode == 1, done.stderr
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 10 and s["deadline"] == {**s["deadline"], "met": False, "missed_for_budget": True}
        assert fake.realtime.records.calls == 0
        assert any(e["event"] == "deadline_for_budget" for e in events(done.stderr))
        passed = [e for e in events(done.stderr) if e["event"] == "deadline_passed"]  # (said when it passes, once)
        assert len(passed) == 1 and passed[0]["unfinished"] > 0, done.stderr[-2000:]
        assert set(output_ids(_out(path))) == expected
        human = render_summary(Summary(**s))
        assert "MISSED (the budget kept work from the real-time lane)" in human


def test_a_429_storm_is_ridden_out_on_retry_after(tmp_path: Path) -> None:
    path, expected = _input(tmp_path, 20)
    with running_fake(rate=0.0, realtime=RT) as fake:
        fake.inject(Fault("messages", status=429, retry_after="1", error_type="rate_limit_error", times=6,
                          message="This request would exceed your organization's rate limit of 6,000 requests per minute"))
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        limited = [e for e in events(done.stderr) if e["event"] == "realtime_limited"]
        assert len(limited) == 6 and all(e["retry_after"] == 1.0 for e in limited)
        assert_one_lane_each(fake, _out(path), expected)


def test_overloaded_and_lost_answers_are_retried_and_lost_ones_counted(tmp_path: Path) -> None:
    path, expected = _input(tmp_path, 30)
    rough = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, overloaded=0.1, lost=0.1)
    with running_fake(rate=0.0, realtime=rough) as fake:  # (backoffs take seconds: a window of 40 s, 2 s before moving)
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.stdout, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        lane = fake.realtime.records
        assert lane.overloaded >= 2 and lane.lost >= 2
        # a request whose answer was lost twice ends errored (exit 1), never sent a third time
        lost_twice = s["errors"].get("gatekeeper_answer_lost", 0)
        assert done.returncode == (1 if lost_twice else 0) and s["succeeded"] + lost_twice == 30
        doubles = s["lanes"]["realtime"]["possible_double_charges"]
        assert doubles + lost_twice == lane.lost
        assert_one_lane_each(fake, _out(path), expected, doubles=doubles)


def test_requests_that_may_run_past_ten_minutes_are_streamed(tmp_path: Path) -> None:
    path, expected = _input(tmp_path, 6, max_tokens=30_000)
    with running_fake(rate=0.0, realtime=RT) as fake:
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        assert fake.realtime.records.streamed == 6
        lines = [orjson.loads(line) for line in _out(path).read_bytes().splitlines()]
        assert all(x["result"]["message"]["content"][0]["text"] for x in lines)
        assert {x["custom_id"] for x in lines} == expected


def test_the_library_takes_a_deadline(tmp_path: Path) -> None:
    path, expected = _input(tmp_path, 20)
    with running_fake(rate=0.0, realtime=RT) as fake:
        config = ApiConfig(base_url=fake.url, workspace_keys=[Secret(WS1)], admin_key=Secret("test-admin-key"))
        summary = submit_sync(str(path), config=config, settings=SubmitSettings(deadline="40s", deadline_slack=38, interval=0.1,
                                                                                   max_rpm=60000))
        assert summary.ok and summary.deadline is not None and summary.deadline["met"]
        assert summary.lanes["realtime"]["requests"] == 20
        assert_one_lane_each(fake, _out(path), expected)


def test_a_deadline_that_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    path, _ = _input(tmp_path, 2)
    with running_fake() as fake:
        bad = gk(["submit", str(path), "--deadline", "tomorrow"], env_for(fake))
        assert bad.returncode == 2 and "neither a duration" in bad.stderr and "Traceback" not in bad.stderr
        config = ApiConfig(base_url=fake.url, workspace_keys=[Secret(WS1)])
        with pytest.raises(UsageError, match="already passed"):
            submit_sync(str(path), config=config, settings=SubmitSettings(deadline="2020-01-01T00:00:00Z"))


def test_plan_says_whether_the_batch_lane_alone_makes_the_deadline(tmp_path: Path) -> None:
    path, _ = _input(tmp_path, 40)
    with running_fake(realtime=RT, ceiling=20) as fake:
        tight = gk(["plan", str(path), "--deadline", "90m", "--json"], env_for(fake))
        assert tight.returncode == 0, tight.stderr
        d = orjson.loads(tight.stdout)["deadline"]
        # two waves of an hour under a ceiling of 20: one fits in 90 minutes, the other's 20 go real time
        assert (d["batch_lane_alone"], d["realtime_requests"], d["realtime_in_time"]) == (False, 20, True)
        assert d["assumes"]["rate_limits_from"] == "admin-api" and d["assumes"]["waves"] == 2
        assert d["assumes"]["rate_limits"]["requests_per_minute"] == 6000 and d["extra_input_cost_usd"] > 0
        # (the fake's Admin API gives the input limit as current models do: cache-aware, reads not counted)
        assert d["assumes"]["rate_limits"]["input_limit_counts_cache_reads"] is False
        assert d["assumes"]["rate_limits_of"] and set(d["assumes"]["rate_limits_of"]) <= set(orjson.loads(
            gk(["plan", str(path), "--json"], {}).stdout)["models"])
        roomy = gk(["plan", str(path), "--deadline", "3h", "--json"], env_for(fake))
        assert orjson.loads(roomy.stdout)["deadline"]["batch_lane_alone"] is True
        human = gk(["plan", str(path), "--deadline", "50m"], env_for(fake, admin=False))  # (no ceiling read: one wave)
        assert "40 request(s) through the real-time lane" in human.stdout and "the lowest tier's" in human.stdout


def test_a_cancel_stops_the_real_time_lane_too(tmp_path: Path) -> None:
    """`gatekeeper cancel` while the real-time lane works: the calls out finish, nothing new is sent in either lane,
    and what was never called is counted as not sent."""
    path, expected = _input(tmp_path, 40)
    slow = FakeRealtime(rpm=120, itpm=2_000_000, otpm=400_000)  # (2 a second: the lane is still busy when canceled)
    with running_fake(rate=0.0, realtime=slow) as fake:  # (one batch, canceled whole: all 40 go to the lane)
        run = start(["submit", str(path), *AT_ONCE, *ONE_BATCH], env_for(fake))
        fake.org.wait_for(lambda _: fake.realtime.records.answered >= 3, "the lane's first answers", timeout=40)
        canceled = gk(["cancel", str(path), "--json"], env_for(fake))
        assert canceled.returncode == 0, canceled.stderr
        out, err = run.communicate(timeout=60)
        s = orjson.loads(out)
        calls = fake.realtime.records.calls
        assert s["canceled_job"]["not_sent"] == 40 - s["succeeded"] > 0 and s["pending"] == 40 - s["succeeded"]
        assert calls == s["lanes"]["realtime"]["calls"]
        ids = output_ids(_out(path))
        assert len(ids) == len(set(ids)) and set(ids) <= expected


def test_the_real_time_lane_in_a_postgresql_journal(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """A shared journal keeps the real-time lane too: its calls journaled under the job's lease, its answers'
    lines kept, so a host without the output rebuilds it from the journal and sends nothing."""
    path, expected = _input(tmp_path, 20)
    with running_fake(rate=0.0, realtime=RT) as fake:
        args = ["submit", str(path), *AT_ONCE, *FAST, "--journal", pg_url, "--job", job_name]
        done = gk(args, env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["lanes"]["realtime"]["requests"] == 20 and s["deadline"]["met"]
        out = Path(s["output"])
        first = out.read_bytes()
        out.unlink()
        again = gk(args, env_for(fake))
        assert again.returncode == 0, again.stderr[-3000:]
        assert out.read_bytes() == first and set(output_ids(out)) == expected
        assert orjson.loads(again.stdout)["rebuilt"] == {"batches": 0, "results": 20, "unavailable": 0}
        assert fake.realtime.records.calls == 20


def test_a_stop_lets_the_calls_out_answer_before_it_exits(tmp_path: Path) -> None:
    """Ctrl-C while real-time calls are out, each taking two seconds: nothing new is sent, the stop says it waits for
    the calls out, they answer and are committed, and the rerun finishes with no possible double charge."""
    path, expected = _input(tmp_path, 40)
    slow = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, latency=2.0)  # (a call outlives a second's grace)
    with running_fake(rate=0.0, realtime=slow) as fake:
        run = start(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        fake.org.wait_for(lambda _: fake.realtime.records.answered >= 5, "the lane's first answers", timeout=40)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=70)
        assert run.returncode == 130, err[-2000:]
        stopping = [e for e in events(err) if e["event"] == "realtime_stopping"]
        assert len(stopping) == 1 and stopping[0]["calls_out"] > 0
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        s = orjson.loads(done.stdout)
        assert s["lanes"]["realtime"]["possible_double_charges"] == 0 and s["succeeded"] == 40
        assert_one_lane_each(fake, _out(path), expected)


@pytest.mark.parametrize("usage", ["none", "const:10", "scale:0.85"])
def test_the_lane_under_usage_that_only_roughly_follows_the_prompt(tmp_path: Path, usage: str) -> None:
    """Usage is an estimate (or absent): it only corrects the pace, never decides what is sent again. Every request
    is answered once, in one lane, with no 429, and what the summary counts is what the fake billed."""
    path, expected = _input(tmp_path, 20)
    with running_fake(rate=0.0, realtime=RT, usage=usage) as fake:
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        s = orjson.loads(done.stdout)
        lane = fake.realtime.records
        assert s["succeeded"] == 20 and lane.calls == 20 and lane.limited + lane.accelerated == 0
        billed = sum(c[0] + c[2] + c[3] + c[4] for c in fake.org.records.billed.values())  # (input, writes, reads)
        counted = s["usage"]["input_tokens"] + s["usage"]["cache_creation_input_tokens"] + s["usage"]["cache_read_input_tokens"]
        assert counted == (0 if usage == "none" else billed)
        assert_one_lane_each(fake, _out(path), expected)


USAGE_LIMIT = ("You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC.")


@pytest.mark.parametrize(("status", "error_type", "message", "details"), [
    (401, "authentication_error", "invalid x-api-key", None),
    (403, "permission_error", "Your API key does not have permission to use the specified resource.", None),
    (402, "billing_error", "Billing error", None),
    (400, "invalid_request_error", USAGE_LIMIT, None),
    (429, "rate_limit_error", "Spend cap reached", {"error_code": "enforced_spend_limit_reached"}),
    (400, "invalid_request_error", "This organization has been disabled.",
     {"error_code": "organization_on_hold", "appeal_url": "https://appeal.example.test/o"}),
])
def test_a_refusal_of_the_account_stops_the_lane_with_its_requests_still_queued(
        tmp_path: Path, status: int, error_type: str, message: str, details: dict[str, str] | None) -> None:
    """The account refused mid-lane (a revoked key, a policy without the action, billing, the usage limit, the spend
    cap): not one request is counted failed; the run stops with one line (exit 2), and once the account is fixed
    the same command finishes every request, each answered once."""
    path, expected = _input(tmp_path, 30)
    with running_fake(rate=0.0, realtime=RT) as fake:
        fake.inject(Fault("messages", status=status, error_type=error_type, message=message, details=details,
                          times=1000, after=8))
        stopped = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert stopped.returncode == 2, stopped.stderr[-2000:]
        last = stopped.stderr.strip().splitlines()[-1]
        assert "Traceback" not in stopped.stderr and message.split(".")[0] in last, stopped.stderr[-3000:]
        answered = fake.realtime.records.answered
        assert 0 < answered < 30
        lines = [orjson.loads(x) for x in _out(path).read_bytes().splitlines()]
        assert {x["result"]["type"] for x in lines} <= {"succeeded"} and len(lines) <= answered  # (none failed)
        fake.faults.items.clear()  # (the key replaced, the limit lifted)
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode in (0, 1), done.stderr[-2000:]
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 30 and s["errored"] == 0
        assert_one_lane_each(fake, _out(path), expected)


def test_a_relative_deadline_is_resolved_once_for_the_job(tmp_path: Path) -> None:
    """`--deadline 1h` is read by the job's first run and kept in its journal: a rerun an hour later (or an Airflow
    retry) that says `3h` again is told the kept one stands, and is judged by it."""
    path, expected = _input(tmp_path, 10)
    with running_fake(rate=0.0, realtime=RT) as fake:
        run = start(["submit", str(path), "--deadline", "1h", *FAST], env_for(fake))
        fake.org.wait_for(lambda r: r.creates >= 1, "the first create", timeout=30)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
        assert run.returncode == 130, err[-2000:]
        fake.config.rate = 4000.0
        done = gk(["submit", str(path), "--deadline", "3h", *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        kept = [e for e in events(done.stderr) if e["event"] == "deadline_kept"]
        assert len(kept) == 1 and kept[0]["at"] != kept[0]["given"]
        s = orjson.loads(done.stdout)
        assert s["deadline"]["met"] is True and fake.realtime.records.calls == 0
        assert s["deadline"]["at"] == kept[0]["at"] and set(output_ids(_out(path))) == expected
        at = parse_time(s["deadline"]["at"])
        assert at is not None and 3000 < at - time.time() <= 3600  # (the first run's hour, not the rerun's three)


@pytest.mark.anyio
async def test_answers_waiting_for_the_write_lock_never_outnumber_the_calls_allowed_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A settlement holds the run's write lock for seconds (a large batch downloading) while a fast real-time lane
    has calls out: what the lane holds in memory (calls out, answers not yet committed) never passes IN_FLIGHT,
    because each call's slot is held until its answer is committed (and a call is journaled as sent under the same
    lock). Then the job finishes, every request once."""
    import time as _time

    import anyio

    from gatekeeper import submit
    from gatekeeper.run.realtime import _realtime
    from tests.fakes import ADMIN

    seen: list[int] = []
    original = _realtime.RealtimeLane.run

    async def run_with_the_lock_taken(lane: _realtime.RealtimeLane) -> None:
        async def hold() -> None:
            while not lane.out_now:  # (once calls are out)
                await anyio.sleep(0.01)
            async with lane.write_lock:
                until = _time.monotonic() + 1.5
                while _time.monotonic() < until:
                    seen.append(len(lane.out_now) + len(lane.answers))  # (calls out and answers not committed)
                    await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await original(lane)

    monkeypatch.setattr(_realtime.RealtimeLane, "run", run_with_the_lock_taken)
    path, _ = _input(tmp_path, 150)
    with running_fake(rate=0.0, realtime=FakeRealtime(rpm=60_000, itpm=50_000_000, otpm=10_000_000, latency=0.0)) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "s", interval=0.1, max_rpm=60_000, deadline=_time.time() + 40,
                                  deadline_slack=38)
        summary = await submit(path, config=config, settings=settings)
    assert summary.succeeded == 150 and summary.lanes["realtime"]["requests"] == 150
    assert seen and max(seen) > 0, "no call was out while the lock was held: the test proves nothing"
    assert max(seen) <= _realtime.IN_FLIGHT, max(seen)


@pytest.mark.anyio
async def test_work_moved_to_an_idle_lane_is_sent_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's dispatcher and its committer each wait on a wake of their own: work moved to the idle lane (a
    stalled batch canceled at its last chance) is sent at once, not after the lane's idle look (made ten minutes
    here, so that a wake lost is a stall no load can hide). They shared one event, and each cleared it once woken:
    the dispatcher slept out the look after the move (3.8 s of a 30 s lane at 90 requests a minute)."""
    import anyio

    from gatekeeper import submit
    from gatekeeper.run.realtime import _realtime
    from tests.fakes import ADMIN

    monkeypatch.setattr(_realtime, "IDLE_LOOK", 600.0)
    path, expected = _input(tmp_path, 20)
    with running_fake(rate=0.0, realtime=RT) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "s", interval=0.1, max_rpm=60_000, deadline=time.time() + 40,
                                  deadline_slack=38, token_sample=2)
        with anyio.fail_after(80):  # (the lane's own time is a second or two; a wake lost, ten minutes)
            summary = await submit(path, config=config, settings=settings)
    assert summary.succeeded == 20 and summary.lanes["realtime"]["requests"] == 20
    assert summary.deadline is not None and summary.deadline["met"] is True


def test_a_cancel_the_credentials_may_not_make_leaves_the_batch_live_and_the_run_going(tmp_path: Path) -> None:
    """An IAM policy without the cancel action (403 on cancel): the deadline's cancel is refused once, said in one
    event, never asked again, and the run goes on with the batch live (not stopped at the same decision on every
    rerun); it finishes in the batch lane, the deadline missed (exit 1), every request once."""
    path, expected = _input(tmp_path, 20)
    with running_fake(rate=2.0, realtime=RT) as fake:  # (the batch ends 10 s in: past the 8 s deadline, however loaded)
        fake.inject(Fault("cancel", status=403, error_type="permission_error", message="not allowed to cancel", times=10))
        done = gk(["submit", str(path), "--deadline", "8s", "--deadline-slack", "6", *FAST], env_for(fake))
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        refused = [e for e in events(done.stderr) if e["event"] == "deadline_cancel_refused"]
        assert len(refused) == 1 and "permission_error" in refused[0]["reason"]
        assert fake.org.records.requests_seen.get("cancel", 0) == 1
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 20 and s["lanes"]["batch"]["requests"] == 20 and s["deadline"]["met"] is False
        assert_one_lane_each(fake, _out(path), expected)


LANE_90 = FakeRealtime(rpm=90, itpm=2_000_000, otpm=400_000)  # the review's lane: 90 requests a minute


@pytest.mark.parametrize(("n", "deadline", "slack"), [(80, "45s", "5"), (600, "2m", "60")])
def test_a_batch_lane_that_ends_at_once_is_tried_first_when_the_lane_cannot_make_the_window_either(
        tmp_path: Path, n: int, deadline: str, slack: str) -> None:
    """The review's S2: a batch lane that ends in under a second, a real-time lane of 90 requests a minute, measured
    through the Admin API, that needs longer than the window (80 in 53 s of 40; 600 in 400 s of 60). The first
    reading moves nothing on the prior turnaround: the batches are created, end, and the deadline is met, with not
    one real-time call (it moved every request, at twice the price, and missed by 102 s)."""
    path, expected = _input(tmp_path, n)
    with running_fake(rate=4000.0, realtime=LANE_90) as fake:  # (one batch of them all, as the review's)
        done = gk(["submit", str(path), "--deadline", deadline, "--deadline-slack", slack, *ONE_BATCH], env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["deadline"]["met"] is True and s["lanes"]["batch"]["requests"] == n and "realtime" not in s["lanes"]
        assert fake.org.records.requests_seen.get("messages", 0) == 0 and fake.realtime.records.calls == 0
        assert not [e for e in events(done.stderr) if e["event"] in ("to_realtime", "deadline_cancel", "realtime_probe")]
        assert set(output_ids(_out(path))) == expected


def _simulated_submit(path: Path, cfg: FakeConfig, *, deadline_in: float, **settings: Any) -> tuple[Summary, FakeAPI]:
    """The library's `submit` of `path` (an Admin key, a deadline `deadline_in` seconds from the start) against the
    fake served in process, every wait on trio's MockClock: a deadline's decisions come out as they would on an idle
    machine, however loaded this one is, and its minutes take the CPU they need."""
    from gatekeeper import submit
    from tests.fakes import ADMIN
    from tests.scenarios import SimulatedWorld, simulated

    async def run(world: SimulatedWorld) -> tuple[Summary, FakeAPI]:
        with world.fake(cfg) as fake:
            config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
            at = SubmitSettings(deadline=world.now() + deadline_in, **settings)
            return await submit(path, config=config, settings=at, clock=world.clock(), transport=world.transport(fake)), fake
    return simulated(run)


def test_a_batch_that_waits_with_nothing_shown_is_not_canceled_for_a_lane_that_would_end_it_later(
        tmp_path: Path) -> None:
    """A batch lane that shows nothing for 25 s, then ends (as the real API shows a batch: no progress until its end),
    80 requests, a deadline 45 s on, a lane of 90 requests a minute measured through the Admin API (53 s for them).
    Twice the batch's wait passes the window about 20 s in; the lane would end them a minute later still, so the
    batch is left to end: the deadline is met in the batch lane, with not one real-time call. (It was canceled
    against the prior hour 20 s in, and all 80 went real time at twice the price and missed the deadline by 39 s.)
    In simulated time: over the wall it waited the 25 s out."""
    path, expected = _input(tmp_path, 80)
    s, fake = _simulated_submit(path, FakeConfig(rate=4000.0, turnaround=lambda _: 25.0, realtime=LANE_90),
                                deadline_in=45, deadline_slack=5, interval=0.1, max_rpm=60_000, reconcile_grace=1)
    assert s.deadline["met"] is True and s.lanes["batch"]["requests"] == 80 and "realtime" not in s.lanes
    assert fake.realtime.records.calls == 0 and fake.org.records.requests_seen.get("cancel", 0) == 0
    assert set(output_ids(_out(path))) == expected


@pytest.mark.parametrize("invoke", ["allowed", "refused"])
def test_no_call_is_paid_for_while_the_batch_lane_is_not_known_to_be_late(tmp_path: Path, invoke: str) -> None:
    """The review's S3: no Admin key (as on Claude Platform on AWS), a batch lane that ends in half a second, a ten
    minute deadline shorter than the prior hour: no probe is made (one was, and with credentials lacking the invoke
    permission it stopped the job with exit 2 before any batch existed): the batch lane finishes, exit 0."""
    path, expected = _input(tmp_path, 40)
    with running_fake(rate=80.0, realtime=RT) as fake:  # (40 requests in half a second)
        if invoke == "refused":
            fake.inject(Fault("messages", status=403, error_type="permission_error", times=1000,
                              message="User is not authorized to perform: bedrock:InvokeModel"))
        done = gk(["submit", str(path), "--deadline", "10m", *FAST], env_for(fake, admin=False))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["deadline"]["met"] is True and s["lanes"]["batch"]["requests"] == 40
        assert fake.org.records.requests_seen.get("messages", 0) == 0 and s["lanes"].get("realtime") is None
        assert set(output_ids(_out(path))) == expected


def test_a_short_deadline_makes_no_probe_for_a_batch_lane_not_known_to_be_late(tmp_path: Path) -> None:
    """A cold tester's night: no Admin key, a batch lane that ends at once, a lane of 90 requests a minute, 80 requests,
    `--deadline 45s` and the default slack. A minute's slack in a 45 s window called every request late at the first
    reading, and a paid probe went out 26 ms after the create; the slack is now at most a quarter of the window: no
    call to the Messages API, the batch lane meets the deadline."""
    path, expected = _input(tmp_path, 80)
    with running_fake(rate=5000.0, realtime=LANE_90) as fake:
        done = gk(["submit", str(path), "--deadline", "45s", *ONE_BATCH], env_for(fake, admin=False))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["deadline"]["met"] is True and s["lanes"]["batch"]["requests"] == 80 and "realtime" not in s["lanes"]
        assert fake.org.records.requests_seen.get("messages", 0) == 0 and fake.realtime.records.calls == 0
        assert not [e for e in events(done.stderr) if e["event"] in ("realtime_probe", "to_realtime")]
        assert set(output_ids(_out(path))) == expected


def test_a_probe_refused_the_invoke_permission_warns_once_and_the_batch_lane_runs_on(tmp_path: Path) -> None:
    """No Admin key and a batch lane known late (its batches wait with nothing done past the deadline's last chance):
    the lane's limits are read with one probe; a 403 to it (a policy without the invoke action) is said once
    (`realtime_closed`), nothing moves, no other call is made, and the run goes on in the batch lane: when that
    recovers the job finishes, with the exit code its finish earns (not 2)."""
    path, expected = _input(tmp_path, 40)
    with running_fake(rate=0.0, realtime=RT) as fake:
        fake.inject(Fault("messages", status=403, error_type="permission_error", times=1000,
                          message="User is not authorized to perform: bedrock:InvokeModel"))
        run = start(["submit", str(path), *AT_ONCE, *FAST], env_for(fake, admin=False))
        fake.org.wait_for(lambda r: r.requests_seen.get("messages", 0) >= 1, "the probe", timeout=40)
        fake.config.rate = 4000.0  # (the batch lane recovers)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err[-3000:]
        closed = [e for e in events(err) if e["event"] == "realtime_closed"]
        assert len(closed) == 1 and "InvokeModel" in closed[0]["reason"] and "Traceback" not in err
        assert fake.org.records.requests_seen.get("messages", 0) == 1
        s = orjson.loads(out)
        assert s["lanes"]["batch"]["requests"] == 40 and s["lanes"].get("realtime") is None and s["deadline"]["met"]
        assert not [e for e in events(err) if e["event"] in ("to_realtime", "deadline_cancel")]
        assert set(output_ids(_out(path))) == expected


USAGE_LIMIT_ON_LIST = ("You have reached your specified API usage limits. You will regain access on 2027-01-01 at "
                       "00:00 UTC.")


@pytest.mark.parametrize(("status", "error_type", "message"), [
    (401, "authentication_error", "invalid x-api-key"),
    (400, "invalid_request_error", USAGE_LIMIT_ON_LIST),
])
def test_an_error_of_the_batch_lane_settles_the_calls_out_before_the_run_stops(
        tmp_path: Path, status: int, error_type: str, message: str) -> None:
    """The review's S7: 40 requests in the real-time lane, each answer taking 3 s, when a listing of the batch lane is
    refused (a key revoked, the usage limit). The run stops with the error's line (exit 2), but first says it waits
    for the calls out (`realtime_stopping`, with the reason), keeps their answers and commits them; the rerun buys
    none again: the fake answered no request twice (it answered all 40 twice)."""
    path, expected = _input(tmp_path, 40)
    slow = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, latency=3.0)
    with running_fake(rate=0.0, realtime=slow) as fake:
        run = start(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        fake.org.wait_for(lambda _: fake.realtime.records.calls >= 40, "the 40 calls out", timeout=40)
        fake.inject(Fault("list", status=status, error_type=error_type, message=message, times=1000))
        _, err = run.communicate(timeout=90)
        assert run.returncode == 2, err[-3000:]
        assert message.split(".")[0] in err.strip().splitlines()[-1] and "Traceback" not in err
        stopping = [e for e in events(err) if e["event"] == "realtime_stopping"]
        assert len(stopping) == 1 and stopping[0]["calls_out"] > 0 and message.split(".")[0] in stopping[0]["reason"]
        assert fake.realtime.records.answered == 40
        fake.faults.items.clear()  # (the key replaced, the limit lifted)
        done = gk(["submit", str(path), *AT_ONCE, *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 40 and s["lanes"]["realtime"]["possible_double_charges"] == 0
        assert fake.realtime.records.calls == 40
        assert_one_lane_each(fake, _out(path), expected)


@pytest.mark.anyio
async def test_a_full_disk_in_the_batch_lane_settles_the_calls_out_too(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch lane's own step fails with no API error at all (its output's disk full) while the real-time lane has
    calls out, each answer taking 2 s: the run waits for them (`realtime_stopping`, the error its reason), journals
    each answer, and then stops with the error; nothing is out, and nothing is lost."""
    import time as _time

    from gatekeeper import submit
    from gatekeeper._errors import OutputError
    from gatekeeper.run import _loop
    from tests.fakes import ADMIN

    path, _ = _input(tmp_path, 30)
    seen: list[tuple[str, dict]] = []

    def full_once_calls_are_out(job: _loop.SubmitLoop) -> None:
        if job.lane.out_now:
            raise OutputError("writing results.jsonl: [Errno 28] No space left on device")

    slow = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, latency=2.0)
    with running_fake(rate=0.0, realtime=slow) as fake:
        monkeypatch.setattr(_loop.SubmitLoop, "form_retry_batches", full_once_calls_are_out)  # (a step of the batch lane's)
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "s", interval=0.1, max_rpm=60_000, deadline=_time.time() + 40,
                                  deadline_slack=38)
        with pytest.raises(OutputError, match="No space left"):
            await submit(path, config=config, settings=settings, on_event=lambda e, f: seen.append((e, f)))
        calls, answered = fake.realtime.records.calls, fake.realtime.records.answered
    stopping = [f for e, f in seen if e == "realtime_stopping"]
    assert len(stopping) == 1 and stopping[0]["calls_out"] > 0 and "No space left" in stopping[0]["reason"]
    journal = Journal.open(tmp_path / "s")
    try:
        assert journal.lane.out() == 0 and journal.lane.stats()["possible_double_charges"] == 0
        assert calls == answered > 0 and journal.outcomes.final_count() == answered
    finally:
        journal.close()


@pytest.mark.parametrize("point", ["deadline-cancel-journaled:1", "deadline-canceled:1"])
def test_a_kill_at_a_deadline_cancel_sends_its_requests_real_time_on_the_rerun(tmp_path: Path, point: str) -> None:
    """Killed as a batch is canceled for the deadline (journaled, not yet asked; or asked, not yet said): the rerun
    asks for the cancel again if the batch still runs, and sends what it gives back real time, never into a new batch
    of the stalled lane (a cold tester's F4: the cancel was asked before it was journaled, and a kill between the two
    made a new batch of its requests, canceled in its turn, the deadline missed)."""
    path, expected = _input(tmp_path)
    with running_fake(rate=0.0, realtime=RT) as fake:
        args = ["submit", str(path), "--deadline", "40s", "--turnaround", "2", "--deadline-slack", "25", *FAST]
        crashed = gk(args, env_for(fake), crash_at=point)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        done = gk(args, env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 40 and s["deadline"]["met"] is True
        assert s["lanes"]["realtime"]["requests"] == 40 and s["lanes"]["batch"]["requests"] == 0
        assert fake.org.records.creates == 2  # the two batches of the first run, none made of what they gave back
        assert_one_lane_each(fake, _out(path), expected)


def test_the_keeper_projects_the_pace_the_lane_keeps_when_its_calls_are_slow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 58, point 4: the limits allow 10 calls a second, but each answer takes 0.5 s and two calls may be out
    (a lane bound by slow calls, as 64 long ones bind it): the lane keeps 4 a second at most. Once it has had work
    waiting past its ramp, the keeper projects what is left at that measured pace (what the rest then took, give or
    take a third), never at the limits' pace (less than half of it). In simulated time (the fake in process, its
    latency and every wait on trio's MockClock): over the wall, a loaded machine slowed the lane between the
    keeper's readings and moved what the rest took, and the run took 25 s of it."""
    import anyio

    from gatekeeper import submit
    from gatekeeper.run.realtime import _deadline, _realtime
    from gatekeeper.testing import FakeConfig
    from tests.fakes import ADMIN
    from tests.scenarios import SimulatedWorld, simulated

    monkeypatch.setattr(_realtime, "IN_FLIGHT", 2)
    readings: list[tuple[float, int, float, float]] = []  # (when, requests left, the keeper's projection, the limits')
    original = _deadline.DeadlineKeeper.wait
    path, _ = _input(tmp_path, 90)

    async def night(world: SimulatedWorld) -> tuple[Summary, float]:
        def wait(keeper: _deadline.DeadlineKeeper, seconds: float) -> float:
            left = keeper.journal.lane.unanswered()
            if left and keeper.lane.paces.busy_from is not None:
                paces = keeper.lane.paces
                readings.append((world.sim.monotonic(), left, keeper._lane_needs(), left / paces.per_second()))
            return original(keeper, seconds)

        monkeypatch.setattr(_deadline.DeadlineKeeper, "wait", wait)
        realtime = FakeRealtime(rpm=600, itpm=50_000_000, otpm=10_000_000, latency=0.5)
        with world.fake(FakeConfig(rate=0.0, realtime=realtime)) as fake:
            config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
            settings = SubmitSettings(state_dir=tmp_path / "s", interval=0.5, max_rpm=60_000,
                                      deadline=world.now() + 120, deadline_slack=118, token_sample=2)
            with anyio.fail_after(110):
                summary = await submit(path, config=config, settings=settings, clock=world.clock(),
                                       transport=world.transport(fake))
            return summary, world.sim.monotonic()

    summary, ended = simulated(night)
    assert summary.succeeded == 90 and summary.lanes["realtime"]["requests"] == 90
    first = readings[0][0]
    late = [r for r in readings if r[0] - first >= 16.0 and r[1] >= 12]  # (past the ramp and a window's measure)
    assert late, "the lane finished before the keeper measured its pace: the test proves nothing"
    for at, left, projected, at_the_limits in late:
        assert projected >= 2 * at_the_limits, (left, projected, at_the_limits)
        assert projected == pytest.approx(ended - at, rel=0.35), (left, projected, ended - at)
