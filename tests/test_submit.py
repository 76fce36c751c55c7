"""`gatekeeper submit` end to end: a real subprocess, real HTTP, the fake API; crashes, faults, refusals."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from gatekeeper.testing import FakeAPI, Fault
from tests.fakes import WS1, WS2, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, output_ids, start, start_and_wait_for_create, wait_for_journaled_batch

FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]


def _input(tmp_path: Path, n: int = 60, bad: int = 0) -> tuple[Path, set[str]]:
    items: list = [req(f"q{i:04d}") for i in range(n)]
    for k in range(bad):
        items.insert(5 + k, b'{"custom_id": "broken"')
    return write_jsonl(tmp_path / "in.jsonl", items), {f"q{i:04d}" for i in range(n)}


def _rerun_finishes_exactly_once(fake: FakeAPI, path: Path, expected: set[str]) -> subprocess.CompletedProcess[str]:
    """After an interrupted run: the same command, at full speed, ends with every request done exactly once."""
    fake.org.config.rate = 4000
    done = gk(["submit", str(path), *FAST], env_for(fake))
    assert done.returncode == 0, done.stderr
    assert_exactly_once(fake, _out(path), expected)
    return done


def _out(path: Path) -> Path:
    return Path(str(path) + ".gatekeeper") / "results.jsonl"


def test_submit_whole_job_and_summary(tmp_path: Path) -> None:
    """Every valid request ends with one line; the JSON summary's counts equal the file's; rejected lines are skipped."""
    path, expected = _input(tmp_path, 60, bad=2)
    with running_fake(ceiling=100, rate=2000) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 1, proc.stderr  # rejected lines are a finding
        summary = orjson.loads(proc.stdout)
        assert (summary["requests"], summary["succeeded"], summary["invalid"]) == (60, 60, 2)
        assert summary["batches"] == 3  # ceiling 100: batches of 25, four to the ceiling... 60 -> 25+25+10
        assert_exactly_once(fake, _out(path), expected)
        assert fake.org.records.max_depth <= 100 and fake.org.records.refusals == []
        evs = events(proc.stderr)
        assert any(e["event"] == "admitted" for e in evs) and any(e["event"] == "collected" for e in evs)
        # Running it again is a no-op that reports the same.
        again = gk(["submit", str(path), *FAST], env_for(fake))
        assert orjson.loads(again.stdout)["succeeded"] == 60 and fake.org.records.creates == 3


@pytest.mark.parametrize("point", ["before-intent:2", "after-intent:2", "after-create:1", "after-create:3",
                                   "mid-results:1", "mid-results:2", "before-results-commit:1"])
def test_sigkill_anywhere_then_rerun(tmp_path: Path, point: str) -> None:
    """SIGKILL at each point, rerun: each valid request in the output once, none created twice or succeeded twice."""
    path, expected = _input(tmp_path, 80)
    with running_fake(ceiling=80, rate=4000) as fake:
        crashed = gk(["submit", str(path), *FAST], env_for(fake), crash_at=point)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        assert orjson.loads(done.stdout)["succeeded"] == 80
        assert_exactly_once(fake, _out(path), expected)
        if point.startswith("after-create"):
            assert any(e["event"] == "reconciled" and e["outcome"] == "created" for e in events(done.stderr))


def test_sigkill_while_server_holds_an_accepted_create(tmp_path: Path) -> None:
    """Killed after the server accepted a create but before its answer arrived: the rerun adopts that batch."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("create", kind="delay_after_commit", delay=3.0))
        proc = start_and_wait_for_create(["submit", str(path), *FAST], env_for(fake), fake)
        proc.kill()
        proc.communicate()
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        assert_exactly_once(fake, _out(path), expected)
        assert fake.org.records.creates == 1


def test_sigkill_while_waiting(tmp_path: Path) -> None:
    """Killed while batches are processing: the rerun picks them up without creating them again."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=20) as fake:
        proc = start_and_wait_for_create(["submit", str(path), *FAST], env_for(fake), fake)
        lists = fake.org.records.requests_seen.get("list", 0)
        fake.org.wait_for(lambda r: r.requests_seen.get("list", 0) >= lists + 2, "the loop to poll again")
        proc.kill()
        proc.communicate()
        done = _rerun_finishes_exactly_once(fake, path, expected)
        assert any(e["event"] == "resumed" for e in events(done.stderr))


def test_lost_create_response_is_reconciled_not_resent(tmp_path: Path) -> None:
    """A create whose answer is dropped after commit is adopted from the listing; nothing is created twice."""
    path, expected = _input(tmp_path, 50)
    with running_fake(ceiling=200, rate=4000) as fake:
        fake.inject(Fault("create", kind="drop_after_commit", times=2))
        proc = gk(["submit", str(path), *FAST, "--max-requests", "20"], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)
        assert sum(1 for e in events(proc.stderr) if e["event"] == "reconciled" and e["outcome"] == "created") == 2


def test_a_foreign_batch_adopted_while_ours_was_not_listed_yet_is_given_back_not_resent(tmp_path: Path) -> None:
    """Another submitter's batch of the same size is listed, ours (answer lost) not yet: the lone candidate is
    adopted, and held until a listing read the grace after our send; by then ours is listed too, so the adoption is
    reopened and both are compared: the other's results carry none of our ids, ours is adopted, and nothing is sent
    twice."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=40, listing_lag=2.0) as fake:
        other = fake.org.add_batch("wrkspc_1", 40, prefix="other")  # another pipeline's, in our workspace
        other.created_wall -= 10  # listed at once; created just before our send, so a candidate by time and size
        fake.inject(Fault("create", kind="drop_after_commit"))
        # (a grace longer than the listing's lag, as the default 180 s is: ours is listed within it)
        proc = gk(["submit", str(path), *FAST, "--max-requests", "40", "--reconcile-grace", "4"], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)
        evs = events(proc.stderr)
        reopened = [e for e in evs if e["event"] in ("adoption_undone", "adoption_reopened")]
        assert [e["id"] for e in reopened] == [other.id]
        adopted = [e["id"] for e in evs if e["event"] == "reconciled" and e["outcome"] == "created"]
        assert adopted[0] == other.id and adopted[-1] != other.id and fake.org.records.creates == 1



def test_a_batch_another_submitter_holds_in_the_shared_ledger_is_never_adopted(tmp_path: Path) -> None:
    """The same race, with a shared ledger in which the other pipeline confirmed its batch: that batch is not a
    candidate at all, so ours is adopted once listed and nothing is undone or sent twice."""
    import anyio

    from gatekeeper import open_ledger

    path, expected = _input(tmp_path, 40)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with running_fake(ceiling=1000, rate=40, listing_lag=2.0) as fake:
        other = fake.org.add_batch("wrkspc_1", 40, prefix="other")
        other.created_wall -= 10

        async def theirs() -> None:
            ledger = open_ledger(url, owner="another-pipeline")
            assert await ledger.reserve(0, 40, 1000, 0)
            await ledger.confirm(0, other.id)
            await ledger.close()

        anyio.run(theirs)
        fake.inject(Fault("create", kind="drop_after_commit"))
        proc = gk(["submit", str(path), *FAST, "--max-requests", "40", "--reconcile-grace", "4", "--ledger", url],
                  env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)
        evs = events(proc.stderr)
        assert not [e for e in evs if e["event"] == "adoption_undone"]
        adopted = [e["id"] for e in evs if e["event"] == "reconciled" and e["outcome"] == "created"]
        assert len(adopted) == 1 and adopted[0] != other.id and fake.org.records.creates == 1


def test_create_5xx_529_is_unknown_then_resent_once_absent(tmp_path: Path) -> None:
    """A 500 and a 529 on create are not retried blindly; absent from the listing after the grace, they are resent."""
    path, expected = _input(tmp_path, 30)
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("create", status=500), Fault("create", status=529, error_type="overloaded_error"))
        # (absence is proven after 8 graces on a listing never seen current: 0.2 s ones, not FAST's 1 s)
        proc = gk(["submit", str(path), *FAST, "--reconcile-grace", "0.2"], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)
        evs = events(proc.stderr)
        assert sum(1 for e in evs if e["event"] == "create_unknown") == 2
        assert sum(1 for e in evs if e["event"] == "reconciled" and e["outcome"] == "not created") == 2


def test_read_faults_are_ridden_out(tmp_path: Path) -> None:
    """429 with retry-after, 503 and a dropped connection on list/retrieve/results do not fail the job."""
    path, expected = _input(tmp_path, 30)
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("list", status=429, retry_after="0.2"), Fault("list", status=503), Fault("list", kind="drop"),
                    Fault("retrieve", status=529), Fault("results", status=500))
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)


def test_other_workspace_fills_the_queue(tmp_path: Path) -> None:
    """Load from a workspace our key cannot see causes a refusal; the batch waits and goes later, nothing dropped."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=100, rate=0.0, queue_retry_after=1) as fake:
        fake.org.add_batch("wrkspc_2", 90)  # invisible to WS1; it drains only once we were refused
        run = start(["submit", str(path), *FAST, "--max-requests", "40"], env_for(fake))
        fake.org.wait_for(lambda r: len(r.refusals) >= 1, "a queue-full refusal")
        fake.org.config.rate = 200.0
        out, err = run.communicate(timeout=60)
        proc = subprocess.CompletedProcess(run.args, run.returncode, out, err)
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)
        assert len(fake.org.records.refusals) >= 1
        assert orjson.loads(proc.stdout)["refusals"] >= 1
        refused = [e for e in events(proc.stderr) if e["event"] == "refused"]
        assert refused and refused[0]["retry_after"] == 1.0 and refused[0]["wait"] >= 1.0  # the server's wait is honoured
        assert fake.org.records.max_depth <= 100


def test_second_workspace_key_prevents_the_refusal(tmp_path: Path) -> None:
    """With the other workspace's key given, its load counts in the depth and no create is refused."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=100, rate=200) as fake:
        fake.org.add_batch("wrkspc_2", 90)
        proc = gk(["submit", str(path), *FAST, "--max-requests", "40"], env_for(fake, keys=(WS1, WS2)))
        assert proc.returncode == 0, proc.stderr
        assert fake.org.records.refusals == []
        assert_exactly_once(fake, _out(path), expected)


def test_unknown_ceiling_learns_from_refusals(tmp_path: Path) -> None:
    """No Admin key and no --ceiling: submit still finishes, learning a bound from queue-full refusals."""
    path, expected = _input(tmp_path, 200)
    with running_fake(ceiling=100, rate=1000, queue_retry_after=1) as fake:  # (the default 60 s would be honoured)
        proc = gk(["submit", str(path), *FAST, "--max-requests", "30"], env_for(fake, admin=False))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, _out(path), expected)
        evs = events(proc.stderr)
        assert any(e["event"] == "ceiling_unknown" for e in evs)
        assert len(fake.org.records.refusals) <= 3
        assert fake.org.records.max_depth <= 100


def test_ctrl_c_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    """SIGINT: exit 130 with the resume command on stderr (under --json the last line, the JSON error of an
    `Interrupted`, exit code 130); the rerun finishes the job."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=10) as fake:
        proc = start_and_wait_for_create(["submit", str(path), *FAST], env_for(fake), fake)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        error = orjson.loads(err.splitlines()[-1])["error"]
        assert error["type"] == "Interrupted" and error["exit_code"] == 130, error
        assert error["message"].startswith("interrupted; batches already created keep processing. Resume with: gatekeeper submit")
        _rerun_finishes_exactly_once(fake, path, expected)


def test_second_ctrl_c_exits_at_once_and_is_safe(tmp_path: Path) -> None:
    """Two SIGINTs: exit 130 at once; the journal is still consistent and the rerun finishes exactly once."""
    path, expected = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=10) as fake:
        proc = start_and_wait_for_create(["submit", str(path), *FAST], env_for(fake), fake)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 130
        _rerun_finishes_exactly_once(fake, path, expected)


def test_results_while_running_are_whole_lines(tmp_path: Path) -> None:
    """`gatekeeper results` during a run gives what is final so far: whole lines, no duplicates."""
    path, expected = _input(tmp_path, 90)
    with running_fake(ceiling=90, rate=60) as fake:
        proc = start(["submit", str(path), *FAST, "--max-requests", "30"], env_for(fake))
        seen = []
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            r = gk(["results", str(path)], {})
            if r.returncode in (0, 1) and r.stdout:
                lines = r.stdout.splitlines()
                ids = [orjson.loads(x)["custom_id"] for x in lines]
                assert len(ids) == len(set(ids)) and set(ids) <= expected
                seen.append(len(ids))
            time.sleep(0.1)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert any(0 < n < 90 for n in seen), seen  # it was read part-way
        assert_exactly_once(fake, _out(path), expected)


def test_progress_line_on_a_terminal(tmp_path: Path) -> None:
    """On a TTY, progress is one status line redrawn in place (not JSON events)."""
    import os
    import pty
    import subprocess
    import sys

    path, _ = _input(tmp_path, 30)
    with running_fake(ceiling=1000, rate=100) as fake:
        master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_")) or k == "GATEKEEPER_HOME"}
        env.update(env_for(fake))
        proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "submit", str(path), "--interval", "0.05", "--max-rpm", "60000"],
                                env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        out, _ = proc.communicate(timeout=30)
        os.close(master)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0
    assert "\r" in screen and "admitted" in screen and "in flight" in screen and "elapsed" in screen
    assert '{"event"' not in screen
    assert "succeeded   30" in out


def test_changed_input_is_refused(tmp_path: Path) -> None:
    """A state directory is bound to its input: a changed file is refused with exit 2 and one line."""
    path, _ = _input(tmp_path, 10)
    with running_fake(ceiling=1000, rate=4000) as fake:
        assert gk(["submit", str(path), *FAST], env_for(fake)).returncode == 0
        write_jsonl(path, [req("other")])
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 2
        assert "is different" in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_state_dir_and_output_are_private(tmp_path: Path) -> None:
    """The state directory and the results are readable by the owner only."""
    path, _ = _input(tmp_path, 5)
    with running_fake(ceiling=1000, rate=4000) as fake:
        assert gk(["submit", str(path), *FAST], env_for(fake)).returncode == 0
    state = Path(str(path) + ".gatekeeper")
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "results.jsonl").stat().st_mode & 0o777 == 0o600
    assert (state / "journal.sqlite3").stat().st_mode & 0o077 == 0


def test_dry_run_creates_nothing(tmp_path: Path) -> None:
    """--dry-run reports what would go now and what would wait, and creates nothing."""
    path, _ = _input(tmp_path, 100)
    with running_fake(ceiling=100, rate=0.0, speed=0.0) as fake:
        fake.org.add_batch("wrkspc_1", 40)
        proc = gk(["submit", str(path), "--dry-run", "--json"], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        r = orjson.loads(proc.stdout)
        assert (r["batch_size"], r["depth"], r["would_create_now"], r["would_wait"], r["queue_after"]) == (25, 40, 2, 2, 90)
        assert fake.org.records.creates == 0


def test_cancel_while_a_create_is_unanswered_says_so_and_the_batch_is_canceled_once_found(tmp_path: Path) -> None:
    """`cancel` while the first create's answer was lost: no id to cancel, and it says so (a cold tester read "0
    batch(es) canceled" while the batch ran on); the running submit finds it in the listing and cancels it."""
    path, _ = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=0.0, listing_lag=3.0, cancel_delay=0.0) as fake:
        fake.inject(Fault("create", kind="drop_after_commit"))
        proc = start_and_wait_for_create(["submit", str(path), *FAST, "--reconcile-grace", "30"], env_for(fake), fake)
        c = gk(["cancel", str(path), "--json"], env_for(fake))
        assert c.returncode == 0, c.stderr
        assert orjson.loads(c.stdout) == {"canceled": [], "not_sent": 0, "unanswered_creates": 1, "refused": [],
                                          "permission": None}
        human = gk(["cancel", str(path)], env_for(fake))
        assert "1 create(s) still unanswered" in human.stdout
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err[-2000:]
        assert orjson.loads(out)["canceled"] == 40 and fake.org.records.creates == 1
        assert [b.status for b in fake.org.batches.values()] == ["ended"]


def test_cancel_then_rerun(tmp_path: Path) -> None:
    """cancel stops the live batches; a rerun collects them, sends nothing new and does not resubmit the canceled."""
    path, _ = _input(tmp_path, 40)
    with running_fake(ceiling=20, rate=0.0, cancel_delay=0.0) as fake:
        proc = start_and_wait_for_create(["submit", str(path), *FAST], env_for(fake), fake)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        c = gk(["cancel", str(path), "--json"], env_for(fake))
        assert c.returncode == 0, c.stderr
        assert len(orjson.loads(c.stdout)["canceled"]) == fake.org.records.creates
        done = gk(["submit", str(path), *FAST], env_for(fake))
        s = orjson.loads(done.stdout)
        assert done.returncode == 1 and s["canceled"] > 0 and s["resubmitted"] == 0
        assert fake.org.records.creates == len(orjson.loads(c.stdout)["canceled"])
        assert len(output_ids(_out(path))) == s["canceled"]
        assert s["canceled_job"]["not_sent"] == 40 - s["canceled"] > 0 and s["canceled_job"]["at"]
        human = gk(["submit", str(path), "--interval", "0.05", "--max-rpm", "60000"], env_for(fake))
        assert human.returncode == 1 and "by `gatekeeper cancel` at" in human.stdout
        assert f"{40 - s['canceled']:,} request(s) never sent" in human.stdout and "--resume-canceled" in human.stdout
        fake.org.config.rate = 4000
        rest = gk(["submit", str(path), *FAST, "--resume-canceled"], env_for(fake))
        r = orjson.loads(rest.stdout)
        assert rest.returncode == 1 and r["canceled_job"] is None and r["pending"] == 0  # the canceled stay final
        assert r["succeeded"] == 40 - s["canceled"] and r["canceled"] == s["canceled"]
        ids = output_ids(_out(path))
        assert len(ids) == len(set(ids)) == 40 and fake.org.records.succeeded_twice == 0


def test_a_cancel_the_credentials_may_not_make_marks_the_job_and_the_batch_runs_on_to_be_collected(tmp_path: Path) -> None:
    """An IAM policy without the cancel action (a 403 on cancel; a cold tester's `fake-api --google --deny
    batches.cancel`): `cancel` marks the job, says the batch could not be canceled and how to undo the mark (exit 1,
    not 2); the running submit never asks again, collects the batch when it ends and finishes (exit 1, the cancel
    noted), and a plain rerun finishes too, instead of stopping on the same 403 while the batch is billed."""
    path, _ = _input(tmp_path, 40)
    with running_fake(ceiling=20, rate=0.0, cancel_delay=0.0) as fake:
        fake.inject(Fault("cancel", status=403, error_type="permission_error", message="not allowed to cancel", times=50))
        proc = start_and_wait_for_create(["submit", str(path), *FAST], env_for(fake), fake)
        wait_for_journaled_batch(_out(path).with_name("journal.sqlite3"))  # (so `cancel` has an id to be refused)
        c = gk(["cancel", str(path)], env_for(fake))
        assert c.returncode == 1 and "Traceback" not in c.stderr, c.stderr
        assert "job marked canceled: nothing new will be sent" in c.stdout and "could not be canceled, for lack of the " \
            "right to cancel batches" in c.stdout and "--resume-canceled" in c.stdout, c.stdout
        lists = fake.org.records.requests_seen.get("list", 0)  # (a reading or two with the batches live, then they end)
        fake.org.wait_for(lambda r: r.requests_seen.get("list", 0) >= lists + 2, "the submit's next readings")
        fake.org.config.rate = 4000
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err[-2000:]
        s, live = orjson.loads(out), fake.org.records.creates
        assert s["succeeded"] == 20 and s["canceled_job"]["left_live"] == live and s["canceled_job"]["not_sent"] == 20
        asked = fake.org.records.requests_seen.get("cancel", 0)
        assert live <= asked <= 2 * live  # (`cancel`'s, and the submit's of a batch it reached first)
        said = [e["id"] for e in events(err) if e["event"] == "cancel_refused"]
        assert sorted(said) == sorted(b.id for b in fake.org.batches.values())  # (each once, asked or not)
        again = gk(["submit", str(path), "--interval", "0.05", "--max-rpm", "60000"], env_for(fake))
        assert again.returncode == 1 and "ran on to their end" in again.stdout, again.stderr
        assert fake.org.records.requests_seen.get("cancel", 0) == asked and fake.org.records.creates == live
        assert len(output_ids(_out(path))) == 20


def test_a_cancel_refused_to_the_running_submit_is_said_once_and_the_run_finishes(tmp_path: Path) -> None:
    """`cancel` while the create's answer was lost (no id to cancel): the running submit finds the batch and its
    cancel is refused (a 403): one event, never asked again, the batch collected when it ends, exit 1."""
    path, _ = _input(tmp_path, 40)
    with running_fake(ceiling=1000, rate=0.0, listing_lag=3.0, cancel_delay=0.0) as fake:
        fake.inject(Fault("create", kind="drop_after_commit"))
        fake.inject(Fault("cancel", status=403, error_type="permission_error", message="not allowed to cancel", times=50))
        proc = start_and_wait_for_create(["submit", str(path), *FAST, "--reconcile-grace", "30"], env_for(fake), fake)
        c = gk(["cancel", str(path), "--json"], env_for(fake))
        assert c.returncode == 0 and orjson.loads(c.stdout)["refused"] == [], c.stderr
        fake.org.wait_for(lambda r: r.requests_seen.get("cancel", 0) > 0, "the submit's cancel", 30)
        fake.org.config.rate = 4000
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err[-2000:]
        refused = [e for e in events(err) if e["event"] == "cancel_refused"]
        assert len(refused) == 1 and "right to cancel batches" in refused[0]["policy"]
        assert fake.org.records.requests_seen.get("cancel", 0) == 1
        assert orjson.loads(out)["succeeded"] == 40 and fake.org.records.creates == 1


def test_submit_usage_errors(tmp_path: Path) -> None:
    """No key: exit 2; stdin: exit 2; each with one line."""
    path, _ = _input(tmp_path, 3)
    proc = gk(["submit", str(path)], {})
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr and "Traceback" not in proc.stderr
    proc = gk(["submit", "-"], {"ANTHROPIC_API_KEY": "x"})
    assert proc.returncode == 2 and "standard input" in proc.stderr


def test_max_in_flight_limits_live_batches(tmp_path: Path) -> None:
    """--max-in-flight 1: one batch of ours in the queue at a time, whatever the headroom."""
    path, expected = _input(tmp_path, 60)
    with running_fake(ceiling=1000, rate=2000) as fake:
        proc = gk(["submit", str(path), *FAST, "--max-requests", "20", "--max-in-flight", "1"], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert fake.org.records.max_depth == 20 and fake.org.records.creates == 3
        assert_exactly_once(fake, _out(path), expected)


def test_refused_key_in_submit_is_named_by_position(tmp_path: Path) -> None:
    """A workspace key the API refuses: exit 2, named by position, the key never printed."""
    path, _ = _input(tmp_path, 5)
    with running_fake(ceiling=1000) as fake:
        proc = gk(["submit", str(path), *FAST], {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "wrong-secret-key-77"})
    assert proc.returncode == 2
    assert "workspace key 1 was refused" in proc.stderr and "wrong-secret-key-77" not in proc.stderr + proc.stdout


def test_a_first_run_by_hand_ends_in_seconds_and_says_what_it_waits_for(tmp_path: Path) -> None:
    """The bundled example against the fake with the default 30 s interval: the first readings come after 1, 2,
    4 s, so a sub-second job does not sit out a whole interval; progress names the batch in flight and when the
    next reading comes."""
    import shutil
    import time

    path = tmp_path / "requests.jsonl"
    shutil.copy(Path(__file__).resolve().parent.parent / "examples" / "requests.jsonl", path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        started = time.monotonic()
        proc = gk(["submit", str(path), "--json"], env_for(fake))
        took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert took < 10, took
    progress = [e for e in events(proc.stderr) if e["event"] == "progress"]
    assert progress and progress[0]["next_reading_in"] == 1.0 and progress[0]["batches"][0].startswith("msgbatch_")


@pytest.mark.parametrize(("batches", "in_flight", "shown"), [
    (["msgbatch_a"], 1, "1 in flight ·"),
    (["msgbatch_a", "msgbatch_b", "#4 (create unanswered)"], 5, "batches msgbatch_a, msgbatch_b, #4 (create unanswered) +2"),
    ([], 0, "0 in flight ·"),
])
def test_the_progress_line_names_the_batches_in_flight_and_the_next_reading(batches: list[str], in_flight: int,
                                                                             shown: str) -> None:
    import io

    from gatekeeper.cli._progress import Progress

    out = io.StringIO()
    Progress(out, "tty", columns=lambda: 300)("progress", {"total": 300, "admitted": 300, "final": 0, "depth": 300, "ceiling": 1000,
                                      "in_flight": in_flight, "batches": batches, "elapsed": 1.0, "next_reading_in": 2.0})
    assert shown in out.getvalue() and "next reading in 2 s" in out.getvalue()


def test_continue_only_never_starts_a_job(tmp_path: Path) -> None:
    """An orchestrator's second step continues a job recorded by its first; where none is recorded it raises
    JobMissing (exit 2) before creating the state folder or sending anything."""
    from gatekeeper import ApiConfig, JobMissing, Secret, SubmitSettings, submit_sync

    path, _ = _input(tmp_path, 5)
    with running_fake(ceiling=1000, rate=5000) as fake:
        config = ApiConfig(workspace_keys=[Secret("test-key-ws1")], base_url=fake.url)
        with pytest.raises(JobMissing, match="nothing was sent") as info:
            submit_sync(path, config=config, settings=SubmitSettings(state_dir=tmp_path / "st", interval=0.05),
                        continue_only=True)
        assert info.value.exit_code == 2 and not (tmp_path / "st").exists()
        assert sum(fake.org.records.requests_seen.values()) == 0
        submit_sync(path, config=config, settings=SubmitSettings(state_dir=tmp_path / "st", interval=0.05), prepare_only=True)
        done = submit_sync(path, config=config, settings=SubmitSettings(state_dir=tmp_path / "st", interval=0.05),
                           continue_only=True)
        assert done.succeeded == 5 and fake.org.records.creates == 1


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_the_progress_line_fits_the_terminal_and_says_a_time_left_once_it_can(columns: int) -> None:
    """Redrawn in place, the line never reaches the terminal's last column (a wrapped line leaves a stale one at
    each redraw); it keeps the parts people look for first; a time left shows from the first results on."""
    import io

    from gatekeeper.cli._progress import Progress

    out = io.StringIO()
    progress = Progress(out, "tty", columns=lambda: columns)
    base = {"total": 120_000, "admitted": 60_000, "depth": 19_500, "ceiling": 20_000, "in_flight": 4,
            "batches": ["msgbatch_0123456789abcdefghij", "msgbatch_klmnopqrstuvwxyz0123"], "next_reading_in": 30.0}
    progress("progress", {**base, "final": 0, "elapsed": 60.0})
    progress("progress", {**base, "final": 30_000, "elapsed": 120.0})
    progress("progress", {**base, "final": 60_000, "elapsed": 180.0})
    lines = [x for x in out.getvalue().split("\r") if x.strip()]
    assert all(len(x) <= columns - 1 for x in lines), [len(x) for x in lines]
    assert lines[0].startswith("done 0/120,000") and "left" not in lines[0]
    assert "~0:06:00 left" in lines[1]  # (the first results: 30,000 in 120 s since the start, 90,000 more in 360 s)
    assert "~0:02:00 left" in lines[2]  # (30,000 more in 60 s since the first: 60,000 more in 120 s)
    if columns >= 200:
        assert "4 in flight" in lines[2] and "next reading in 30 s" in lines[2]


def test_ids_set_aside_on_disk_are_sent_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job past the ids kept in memory (here 10; a million by default): repeats found only at the end of the first
    reading are rejected as they are in memory, and every other request is created once, over real HTTP."""
    import gatekeeper.input._duplicates as dupes
    from gatekeeper import ApiConfig, Secret, SubmitSettings, submit_sync

    monkeypatch.setattr(dupes, "IDS_IN_MEMORY", 10)
    items = [req(f"q{i:03d}") for i in range(80)] + [req(f"q{i:03d}", text="again") for i in (3, 41, 79)]
    path = write_jsonl(tmp_path / "in.jsonl", items)
    with running_fake(ceiling=100, rate=4000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        s = submit_sync(path, config=config, settings=SubmitSettings(state_dir=tmp_path / "s", interval=0.05, max_rpm=60000))
        assert (s.requests, s.succeeded, s.invalid) == (80, 80, 3)
        created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
        assert sorted(created) == [f"q{i:03d}" for i in range(80)]
        bodies = [body for b in fake.org.batches.values() for _, body in b.requests]
        assert not any("again" in orjson.dumps(body).decode() for body in bodies)  # the first line is the one sent
