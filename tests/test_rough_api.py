"""Exactly once against an API as rough as the real one, end to end: the CLI over real HTTP against the fake.

Each roughness alone, then all of them at once with lost answers, server errors and SIGKILLs, rerun until done.
Judged by the fake's own records and the output: one final line per valid request, nothing processed twice,
no key or call where it must not go, no traceback.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gatekeeper.testing import FakeAPI, Fault, Outcome
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, output_ids, start_and_wait_for_create

FAST = ["--interval", "0.05", "--reconcile-grace", "1", "--max-rpm", "60000", "--json"]


def _job(tmp_path: Path, n: int = 60) -> tuple[Path, set[str]]:
    ids = [f"j{i:04d}" for i in range(n)]
    return write_jsonl(tmp_path / "in.jsonl", [req(c) for c in ids]), set(ids)


def _out(path: Path) -> Path:
    return Path(str(path) + ".gatekeeper") / "results.jsonl"


def _processed_once(fake: FakeAPI, expected: set[str]) -> None:
    """Nothing was sent to the model twice: the fake processed each request exactly once."""
    assert {c: n for c, n in fake.org.records.attempts.items() if n != 1} == {}
    assert set(fake.org.records.attempts) == expected


def _finish(fake: FakeAPI, args: list[str], *, env: dict[str, str] | None = None, code: int = 0) -> dict[str, Any]:
    proc = gk(args, env or env_for(fake))
    assert "Traceback" not in proc.stderr
    assert proc.returncode == code, proc.stderr[-2000:]
    return dict(orjson.loads(proc.stdout))


@pytest.mark.parametrize("damage", ["short", "half_line", "reset"])
def test_damaged_downloads_are_retried_never_resent(tmp_path: Path, damage: str) -> None:
    """A download that ends short, tears its last line or is reset is downloaded again; nothing is resent."""
    path, expected = _job(tmp_path)
    with running_fake(ceiling=60, rate=5000, damaged_downloads=2, damage=(damage,)) as fake:
        summary = _finish(fake, ["submit", str(path), *FAST])
        assert summary["succeeded"] == 60 and summary["resubmitted"] == 0
        assert_exactly_once(fake, _out(path), expected)
        _processed_once(fake, expected)
        assert all(n == 3 for n in fake.org.records.downloads.values())  # two damaged, the third whole


def test_results_404_and_null_url_after_the_end_are_waited_out(tmp_path: Path) -> None:
    """Results that 404, and a results_url that is null, for a while after the end: the run waits, then collects."""
    path, expected = _job(tmp_path)
    # (windows of seconds, not tenths: a run on a loaded machine still meets them, so the wait is seen at any load)
    with running_fake(ceiling=60, rate=5000, results_not_found_after_end=2.0, null_results_url_after_end=4.0) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert any(e["event"] == "results_pending" for e in events(proc.stderr))
        assert_exactly_once(fake, _out(path), expected)
        _processed_once(fake, expected)


def test_listing_lag_and_404_after_create_create_nothing_twice(tmp_path: Path) -> None:
    """New batches missing from the listing and answering 404 for a while: nothing is created twice."""
    path, expected = _job(tmp_path)
    with running_fake(ceiling=60, rate=5000, listing_lag=0.5, not_found_after_create=0.5) as fake:
        _finish(fake, ["submit", str(path), *FAST, "--reconcile-grace", "30"])
        assert_exactly_once(fake, _out(path), expected)
        _processed_once(fake, expected)


def test_archived_results_end_the_job_not_the_run(tmp_path: Path) -> None:
    """Results archived before they were collected: one final errored line each, nothing resent, exit 1."""
    path, expected = _job(tmp_path, 30)
    with running_fake(ceiling=100, rate=5000) as fake:
        crashed = gk(["submit", str(path), *FAST], env_for(fake), crash_at="mid-results:1")
        assert crashed.returncode == -signal.SIGKILL
        creates = fake.org.records.creates
        fake.org.advance(30 * 86_400)  # 30 days later: the results are archived
        summary = _finish(fake, ["submit", str(path), *FAST], code=1)
        assert fake.org.records.creates == creates  # nothing resent
        assert summary["errors"] == {"gatekeeper_results_unavailable": 30} and summary["complete"]
        lines = [orjson.loads(x) for x in _out(path).read_bytes().splitlines()]
        assert {x["custom_id"] for x in lines} == expected
        assert all(x["result"]["error"]["error"]["type"] == "gatekeeper_results_unavailable" for x in lines)


@pytest.mark.parametrize("origin", ["gateway", "signed"])
def test_results_through_a_gateway_or_a_signed_link(tmp_path: Path, origin: str) -> None:
    """The API's own results path goes through the configured base URL; a signed link is fetched without the key."""
    path, expected = _job(tmp_path)
    with running_fake(ceiling=60, rate=5000, results_origin=origin) as fake:
        _finish(fake, ["submit", str(path), *FAST])
        assert_exactly_once(fake, _out(path), expected)
        assert fake.org.records.bypass_calls == 0 and fake.org.records.wrong_origin_keys == 0
        assert fake.org.records.requests_seen.get("results", 0) >= 1


def test_unknown_ceiling_below_one_batch_is_recut_and_finishes(tmp_path: Path) -> None:
    """No ceiling known, batches at the per-batch limit, the organization's ceiling below one batch:
    the unsent batches are re-cut smaller until they fit, and the job finishes with nothing lost."""
    path, expected = _job(tmp_path, 2000)
    with running_fake(ceiling=600, rate=20_000, queue_retry_after=None) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake, admin=False))
        assert proc.returncode == 0, proc.stderr[-2000:]
        recuts = [e["batch_size"] for e in events(proc.stderr) if e["event"] == "recut"]
        assert recuts == [1000, 500]  # halved until a batch fits under 600
        assert len(fake.org.records.refusals) <= 4
        assert_exactly_once(fake, _out(path), expected)
        _processed_once(fake, expected)


def test_queue_full_429_without_the_word_queue_backs_off(tmp_path: Path) -> None:
    """A queue-full 429 in words that do not mention the queue is still taken as queue-full (growing waits)."""
    path, expected = _job(tmp_path, 40)
    with running_fake(ceiling=100, rate=0.0, queue_message="Rate limited", queue_retry_after=None) as fake:
        fake.org.add_batch("wrkspc_2", 100)  # hidden load: every create is refused until it drains
        run = start_and_wait_for_refusals(path, fake, 2)
        fake.org.config.rate = 5000.0
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        refused = [e for e in events(err) if e["event"] == "refused"]
        assert len(refused) >= 2 and refused[1]["wait"] > refused[0]["wait"]
        assert_exactly_once(fake, _out(path), expected)


def start_and_wait_for_refusals(path: Path, fake: FakeAPI, n: int) -> Any:
    from tests.runs import start

    run = start(["submit", str(path), *FAST, "--max-requests", "20"], env_for(fake))
    fake.org.wait_for(lambda r: len(r.refusals) >= n, f"{n} refusals")
    return run


def test_rpm_limit_is_respected_by_the_call_budget(tmp_path: Path) -> None:
    """With --max-rpm under the organization's limit, the API never has to refuse a call for RPM."""
    path, expected = _job(tmp_path, 20)
    with running_fake(ceiling=100, rate=5000, rpm=40, rpm_window=2.0) as fake:
        args = ["submit", str(path), "--interval", "0.05", "--json", "--max-rpm", "600"]  # 20 per 2 s at most
        _finish(fake, args)
        assert fake.org.records.rpm_refusals == 0
        assert_exactly_once(fake, _out(path), expected)


def test_rpm_429s_slow_the_loop_instead_of_failing_it(tmp_path: Path) -> None:
    """Over the RPM limit, 429s with retry-after on every endpoint slow the run down; it still finishes."""
    path, expected = _job(tmp_path, 10)
    with running_fake(ceiling=100, rate=5000, rpm=3, rpm_window=1.0) as fake:
        _finish(fake, ["submit", str(path), *FAST, "--max-requests", "5"])
        assert fake.org.records.rpm_refusals > 0
        assert_exactly_once(fake, _out(path), expected)


def test_cancel_with_an_ended_batch_first_cancels_the_rest(tmp_path: Path) -> None:
    """The first batch has ended: cancel still cancels every other live batch and records it; submit sends nothing."""
    path, _ = _job(tmp_path, 60)
    with running_fake(ceiling=1000, rate=0.0, cancel_delay=0.0, cancel_ended="error") as fake:
        proc = start_and_wait_for_create(["submit", str(path), *FAST, "--max-requests", "20"], env_for(fake), fake)

        fake.org.wait_for(lambda r: r.creates == 3, "three creates")
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        first = min(fake.org.batches.values(), key=lambda b: b.seq)
        first.processed = first.total
        fake.org.config.rate = 0.0
        with fake.org.lock:
            fake.org._end(first, fake.org.now(), leftover="expired")
        c = gk(["cancel", str(path), "--json"], env_for(fake))
        assert c.returncode == 0, c.stderr
        statuses = sorted(b["status"] for b in orjson.loads(c.stdout)["canceled"])
        assert statuses[-1] == "ended" and set(statuses[:-1]) == {"canceling"}  # (the third may be an unknown create)
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr[-2000:]
        assert fake.org.records.creates == 3  # the cancel was recorded: nothing new was created
        assert all(b.status == "ended" for b in fake.org.batches.values())  # a batch adopted later was canceled too
        assert len(output_ids(_out(path))) == 60


def test_kill_during_upload_is_resent_without_the_grace(tmp_path: Path) -> None:
    """Killed after the intent but before the body was complete: the rerun resends at once (no 180 s wait)."""
    path, expected = _job(tmp_path, 30)
    with running_fake(ceiling=100, rate=5000) as fake:
        crashed = gk(["submit", str(path), *FAST, "--reconcile-grace", "180"], env_for(fake), crash_at="after-intent:1")
        assert crashed.returncode == -signal.SIGKILL and fake.org.records.creates == 0
        started = time.monotonic()
        proc = gk(["submit", str(path), *FAST, "--reconcile-grace", "180"], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert time.monotonic() - started < 30
        abandoned = [e for e in events(proc.stderr) if e["event"] == "reconciled"]
        assert abandoned and abandoned[0]["how"] == "the body was never sent whole"
        assert_exactly_once(fake, _out(path), expected)


def test_a_second_live_run_of_the_same_input_is_refused(tmp_path: Path, redis_url: str) -> None:
    """With a shared ledger, the same input submitted from a second state directory is refused, naming the first."""
    path, expected = _job(tmp_path, 30)
    ledger = redis_url.rstrip("0") + "5"
    with running_fake(ceiling=100, rate=0.0) as fake:
        first = start_and_wait_for_create(["submit", str(path), *FAST, "--ledger", ledger], env_for(fake), fake)
        second = gk(["submit", str(path), *FAST, "--ledger", ledger, "--state", str(tmp_path / "other")], env_for(fake))
        assert second.returncode == 2 and "already being submitted" in second.stderr
        assert str(Path(str(path) + ".gatekeeper").resolve()) in second.stderr
        fake.org.config.rate = 5000.0
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert_exactly_once(fake, _out(path), expected)
        _processed_once(fake, expected)


def test_everything_at_once_with_kills_then_reruns_until_done(tmp_path: Path) -> None:
    """Every roughness together, lost create answers, 5xx/529/429 and SIGKILLs at staggered moments; rerun until
    done. Every valid request ends with exactly one line, nothing is processed twice, no key or call strays."""
    path, expected = _job(tmp_path, 150)
    transient = {"j0007", "j0100", "j0122"}
    config = dict(
        ceiling=400, rate=3000, listing_lag=0.2, not_found_after_create=0.2, results_not_found_after_end=0.2,
        null_results_url_after_end=0.1, damaged_downloads=1, results_origin="gateway", rpm=400, rpm_window=1.0,
        queue_message="Rate limited", queue_retry_after=None,
        outcome=lambda cid, model, attempt: Outcome("errored", "overloaded_error") if cid in transient and attempt == 1 else None,
    )
    with running_fake(**config) as fake:  # type: ignore[arg-type]
        fake.inject(Fault("create", kind="drop_after_commit"), Fault("create", status=529), Fault("list", status=503),
                    Fault("retrieve", status=500), Fault("results", status=429, retry_after="1"),
                    Fault("create", kind="delay_after_commit", delay=0.3))
        args = ["submit", str(path), *FAST, "--max-requests", "25"]
        for point in ("after-intent:3", "after-create:2", "body-complete:3", "mid-results:1", "before-results-commit:2"):
            crashed = gk(args, env_for(fake, admin=False), crash_at=point)
            assert "Traceback" not in crashed.stderr
            assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]  # each point is reached
        for _ in range(5):
            done = gk(args, env_for(fake, admin=False))
            assert "Traceback" not in done.stderr
            if done.returncode == 0:
                break
        assert done.returncode == 0, done.stderr[-2000:]
        ids = output_ids(_out(path))
        assert len(ids) == len(set(ids)) and set(ids) == expected
        created: dict[str, int] = {}
        for b in fake.org.batches.values():
            for cid, _ in b.requests:
                created[cid] = created.get(cid, 0) + 1
        assert {c: n for c, n in created.items() if n != (2 if c in transient else 1)} == {}
        assert fake.org.records.succeeded_twice == 0
        assert all(fake.org.records.attempts[c] == 2 for c in transient)  # the transient errors, and only they, went twice
        assert {c: n for c, n in fake.org.records.attempts.items() if n != 1 and c not in transient} == {}
        assert fake.org.records.bypass_calls == 0 and fake.org.records.wrong_origin_keys == 0


def test_later_batches_go_while_an_unknown_create_is_reconciled(tmp_path: Path) -> None:
    """A create whose body went whole but whose answer was lost waits out the grace; meanwhile the batches after it
    are admitted (its requests counted as in the queue), and it is resent once, after the grace."""
    path, expected = _job(tmp_path, 60)
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.inject(Fault("create", kind="drop"))  # the server read the body, created nothing, answered nothing
        # (without a ledger: with one, this job sends nothing else until it is reconciled; see test_host_ledger)
        proc = gk(["submit", str(path), *FAST, "--max-requests", "20", "--reconcile-grace", "2", "--ledger", "none"],
                  env_for(fake))
        assert proc.returncode == 0, proc.stderr
        order = [(e["event"], e.get("batch")) for e in events(proc.stderr)
                 if e["event"] in ("create_unknown", "admitted", "reconciled")]
        assert order[0] == ("create_unknown", 0)
        settled = order.index(("reconciled", 0))
        assert {("admitted", 1), ("admitted", 2)} <= set(order[1:settled])  # admitted while batch 0 was unknown
        assert ("admitted", 0) in order[settled:]
        assert_exactly_once(fake, _out(path), expected)


@pytest.mark.parametrize("ledger", [[], ["--ledger", "none"]])
def test_a_listing_that_lags_past_the_grace_proves_nothing_absent(tmp_path: Path, ledger: list[str]) -> None:
    """The grace set shorter than the listing's lag (a cold tester's night: 10 s against 30): a live batch of ours,
    its create answered, is seen missing from the listing, so a lost create's absence proves nothing until twice
    that long has passed; it is found and adopted, never sent again (before: sent again, paid twice, exit 0)."""
    path, expected = _job(tmp_path, 60)
    with running_fake(ceiling=1000, rate=5000, listing_lag=3.0) as fake:
        fake.inject(Fault("create", kind="drop_after_commit", after=1, times=2))  # the 2nd and 3rd creates' answers lost
        proc = gk(["submit", str(path), *FAST, "--max-requests", "20", "--reconcile-grace", "0.5", *ledger],
                  env_for(fake))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert fake.org.records.creates == 3  # one a batch: the lost two adopted, never made again
        assert_exactly_once(fake, _out(path), expected)
        _processed_once(fake, expected)
    from gatekeeper.state._journal import Journal

    journal = Journal.open(Path(str(path) + ".gatekeeper"))  # (the lag seen, kept for a rerun: it reads none at first)
    try:
        assert 0.5 < journal.get_meta("listing_lag") < 60
    finally:
        journal.close()


def test_batches_of_ours_missing_from_a_lagging_listing_never_hold_the_readings(tmp_path: Path) -> None:
    """Our fresh batches missing from a lagging listing, and 404 to a retrieve meanwhile (the API is eventually
    consistent): each is asked once a reading, never retried in the reading one after another (a cold tester: no
    reading for 60 s with 4 fresh batches, 13 s of retries each)."""
    path, expected = _job(tmp_path, 40)
    with running_fake(ceiling=1000, rate=0.0, listing_lag=30.0, not_found_after_create=30.0) as fake:
        proc = start_and_wait_for_create(["submit", str(path), *FAST, "--max-requests", "10"], env_for(fake), fake)
        time.sleep(4.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    readings = [e for e in events(err) if e["event"] == "progress"]
    assert len(readings) >= 10, [e["event"] for e in events(err)][-20:]
