"""A job in a PostgreSQL journal, end to end over real HTTP: it outlives its host, its lease keeps it single,
and its output is rebuilt from the API when it resumes where the file is missing or short."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from gatekeeper import ApiConfig, JobLive, Secret, SubmitSettings, submit_sync
from gatekeeper.run.shared._opening import job_name_of
from gatekeeper.state._host import machine_id
from gatekeeper.state._journal import Journal
from tests.fakes import WS1, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, output_ids, start_and_wait_for_create

CI_POSTGRES = Path(__file__).resolve().parent.parent / ".ci" / "postgres"

FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]


def _without_password(url: str) -> tuple[str, str]:
    """(the URL without its password, the password): the password goes in PGPASSWORD, never on the command line."""
    parts = urlsplit(url)
    netloc = f"{parts.username}@{parts.hostname}:{parts.port}"
    return parts._replace(netloc=netloc).geturl(), parts.password or ""


def _host(tmp_path: Path, name: str, n: int, tag: str) -> Path:
    """A fresh "host": its own folder holding a copy of the input (unique to the test: `tag`) under a name of its own."""
    folder = tmp_path / name
    folder.mkdir()
    return write_jsonl(folder / f"requests-{name}.jsonl", [req(f"{tag}-{i:04d}") for i in range(n)])


def _lease_expired(args: list[str], env: dict[str, str], timeout: float = 10.0):
    """Run `args` until it is no longer refused for a live lease (a killed run's lease lasts --lease-ttl)."""
    deadline = time.monotonic() + timeout
    while True:
        done = gk(args, env)
        if done.returncode != 2 or "is running on" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(0.2)  # the lease's TTL passing: there is nothing to await


def _leased_job(pg_url: str, path: Path, env: dict[str, str]) -> Journal:
    """The shared journal of the job submit makes of `path` by default (named from its content and the key)."""
    return Journal.open_shared(pg_url, job_name_of(str(path), ApiConfig.from_env(env)), path.parent)


def _ran_elsewhere(pg_url: str, path: Path, env: dict[str, str]) -> None:
    """Make the lease of `path`'s job say that its run was on another machine, whose processes this one cannot see."""
    journal = _leased_job(pg_url, path, env)
    try:
        here = orjson.dumps({"machine": machine_id()}).decode()[1:-1]
        journal.db.execute("UPDATE gatekeeper.jobs SET info = replace(info, ?, ?) WHERE name = ?",
                           (here, '"machine":"elsewhere"', journal.job))
        assert (journal.lease.holder() or {}).get("machine") == "elsewhere"
    finally:
        journal.close()


@pytest.mark.parametrize("point", ["after-intent:2", "after-create:2", "mid-results:2", "before-results-commit:2"])
def test_killed_with_its_disk_then_resumed_on_another_host(tmp_path: Path, pg_url: str, point: str, job_name: str) -> None:
    """SIGKILL at a staggered point, the whole state directory, output and input deleted, then the same job resumed
    from another folder with a copy of the input at another path: one line per request, none created or succeeded
    twice, and what had been collected before the kill downloaded again and counted in the summary."""
    url, password = _without_password(pg_url)
    n = 100
    first = _host(tmp_path, "a", n, job_name)  # the default job name comes from the content: unique to this test
    second = _host(tmp_path, "b", n, job_name)
    with running_fake(ceiling=50, rate=4000) as fake:
        env = env_for(fake, PGPASSWORD=password)
        # A TTL of 4 s: the killed run's lease must still be live when the second host first asks, however slow
        # the machine (at 1 s, eight workers on two cores outran it; at 2 s, a CI run beside a benchmark did).
        common = ["--journal", url, "--lease-ttl", "4", *FAST]
        crashed = gk(["submit", str(first), *common], env, crash_at=point)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        _ran_elsewhere(pg_url, first, env)  # a dead run on this machine frees its lease at once: play another host
        refused = gk(["submit", str(second), *common], env)
        assert refused.returncode == 2 and "is running on" in refused.stderr and "last seen" in refused.stderr
        assert "its lease expires in " in refused.stderr and "(4 s after its last heartbeat)" in refused.stderr
        assert password not in refused.stderr
        collected = [e for e in events(crashed.stderr) if e["event"] == "collected"]
        shutil.rmtree(first.parent)
        done = _lease_expired(["submit", str(second), *common], env)
        assert done.returncode == 0, done.stderr
        summary = orjson.loads(done.stdout)
        assert summary["succeeded"] == n and summary["complete"]
        out = Path(str(second) + ".gatekeeper") / "results.jsonl"
        assert_exactly_once(fake, out, {f"{job_name}-{i:04d}" for i in range(n)})
        rebuilt = summary["rebuilt"] or {"batches": 0, "results": 0}
        assert rebuilt["batches"] == len(collected) and rebuilt["results"] == sum(e["final"] for e in collected)
        assert fake.org.records.succeeded_twice == 0
        assert password not in done.stderr + done.stdout


def test_a_rerun_on_the_machine_where_a_run_was_killed_takes_its_lease_at_once(tmp_path: Path, pg_url: str,
                                                                                job_name: str) -> None:
    """kill -9, then the same command at once: the killed run's lease (600 s) names this machine and a pid that is
    gone, so `report` calls the job interrupted, and the rerun takes it without waiting, records why, and finishes
    it exactly once."""
    url, password = _without_password(pg_url)
    path = _host(tmp_path, "a", 60, job_name)
    with running_fake(ceiling=30, rate=4000) as fake:
        env = env_for(fake, PGPASSWORD=password)
        args = ["submit", str(path), "--journal", url, "--lease-ttl", "600", *FAST]
        crashed = gk(args, env, crash_at="after-create:1")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        report = gk(["report", str(path), "--journal", url, "--json"], env)
        assert orjson.loads(report.stdout)["status"] == "interrupted", report.stderr  # not "running" for 600 s
        started = time.monotonic()
        done = gk(args, env)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 60  # (not the lease's 600 s)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", {f"{job_name}-{i:04d}" for i in range(60)})
    journal = _leased_job(pg_url, path, env)
    try:
        taken = [e[3] for e in journal.outcomes.events_of("lease_taken_over")]
    finally:
        journal.close()
    assert [(t["why"], t["previous"]["machine"]) for t in taken] == [("ended", machine_id())]


def test_a_short_output_is_rebuilt_in_its_order_from_the_last_whole_batch(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """The library, a named job: the output cut in the middle of a batch is rebuilt from that batch on, line for
    line as it was; a deleted output is rebuilt whole; nothing is created again."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"s{i:03d}") for i in range(90)])
    with running_fake(ceiling=60, rate=4000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(journal=pg_url, job=job_name, state_dir=tmp_path / "st", interval=0.05, max_rpm=60_000, ceiling=60)
        submit_sync(str(path), config=config, settings=settings)
        out = tmp_path / "st" / "results.jsonl"
        whole = out.read_bytes()
        creates = fake.org.records.creates
        out.write_bytes(whole[: len(whole) // 2 + 7])  # a torn line in the middle of a batch
        summary = submit_sync(str(path), config=config, settings=settings)
        assert out.read_bytes() == whole and fake.org.records.creates == creates
        assert summary.rebuilt is not None and 0 < summary.rebuilt["batches"] < summary.batches
        out.unlink()
        summary = submit_sync(str(path), config=config, settings=settings)
        assert out.read_bytes() == whole and summary.rebuilt["results"] >= 90


def test_archived_results_at_rebuild_are_reported_not_resent(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """Results the API no longer has when the output is rebuilt become final results-unavailable lines; exit 1."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"z{i:03d}") for i in range(30)])
    with running_fake(ceiling=100, rate=4000) as fake:
        env = env_for(fake)
        args = ["submit", str(path), "--journal", pg_url, "--job", job_name, *FAST]
        assert gk(args, env).returncode == 0
        creates = fake.org.records.creates
        fake.org.config.retention_days = 0.0  # every batch is now past its results' retention: archived
        out = Path(str(path) + ".gatekeeper") / "results.jsonl"
        out.unlink()
        done = gk(args, env)
        assert done.returncode == 1, done.stderr
        lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        assert sorted(x["custom_id"] for x in lines) == [f"z{i:03d}" for i in range(30)]
        assert {x["result"]["error"]["error"]["type"] for x in lines} == {"gatekeeper_results_unavailable"}
        assert orjson.loads(done.stdout)["rebuilt"]["unavailable"] == 30 and fake.org.records.creates == creates


def test_a_live_job_is_refused_by_name_until_its_lease_expires(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """Two hosts, one job name: the second is refused naming the first's host, and runs once the lease has expired."""
    from gatekeeper.state._journal import Journal

    path = write_jsonl(tmp_path / "in.jsonl", [req("only")])
    holder = Journal.open_shared(pg_url, job_name, tmp_path / "elsewhere")
    try:
        holder.lease.take("other-run", {"host": "worker-7", "pid": 4242}, ttl=600)
        with running_fake(ceiling=100, rate=4000) as fake:
            done = gk(["submit", str(path), "--journal", pg_url, "--job", job_name, *FAST], env_for(fake))
            assert done.returncode == 2 and "running on worker-7 (pid 4242)" in done.stderr
            assert "Traceback" not in done.stderr and fake.org.records.creates == 0
            with pytest.raises(JobLive):
                submit_sync(str(path), config=ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url),
                            settings=SubmitSettings(journal=pg_url, job=job_name, state_dir=tmp_path / "x"))
    finally:
        holder.close()


def test_job_without_a_shared_journal_and_bad_journal_urls_are_usage_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [req("x")])
    with running_fake(ceiling=100) as fake:
        named = gk(["submit", str(path), "--job", "nightly", *FAST], env_for(fake))
        assert named.returncode == 2 and "--job" in named.stderr and "postgresql://" in named.stderr
        bad = gk(["submit", str(path), "--journal", "mysql://u:pw@h/db", *FAST], env_for(fake))
        assert bad.returncode == 2 and "postgresql://" in bad.stderr and "pw" not in bad.stderr.replace("postgresql", "")
        down = gk(["submit", str(path), "--journal", "postgresql://gk:hunter2@127.0.0.1:9/gk", *FAST], env_for(fake))
        assert down.returncode == 2 and "127.0.0.1:9" in down.stderr and "hunter2" not in down.stderr
        assert "Traceback" not in down.stderr and fake.org.records.creates == 0
    assert not (Path(str(path) + ".gatekeeper") / "results.jsonl").exists()  # refused before anything was written


@pytest.fixture
def own_postgres() -> Iterator[dict[str, str]]:
    """A PostgreSQL server of this test's own (it is restarted mid-test): PG_TEST_URL, PG_TEST_DATA, PG_TEST_BIN."""
    if not shutil.which("pg_ctl") and not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        if os.environ.get("CI"):
            pytest.fail("CI must provide Debian's postgresql")
        pytest.skip("no PostgreSQL server binaries on this machine")
    started = subprocess.run([str(CI_POSTGRES), "start"], capture_output=True, text=True, check=True)
    env = dict(re.findall(r"export (\w+)='([^']*)'", started.stdout))
    try:
        yield env
    finally:
        subprocess.run([str(CI_POSTGRES), "stop", env["PG_TEST_DATA"]], check=False)


def test_a_postgres_restart_mid_run_is_ridden_out(tmp_path: Path, own_postgres: dict[str, str]) -> None:
    """The server restarted while batches are in flight: the run reconnects (or stops resumably and a rerun ends
    it); never a traceback, every request once, nothing created twice."""
    url, password = _without_password(own_postgres["PG_TEST_URL"])
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"r{i:03d}") for i in range(120)])
    with running_fake(ceiling=60, rate=60) as fake:  # about 2 s of processing: the restart lands mid-run
        env = env_for(fake, PGPASSWORD=password)
        args = ["submit", str(path), "--journal", url, "--job", "restart", "--lease-ttl", "5", *FAST]
        proc = start_and_wait_for_create(args, env, fake)
        ctl = [f"{own_postgres['PG_TEST_BIN']}/pg_ctl", "-D", f"{own_postgres['PG_TEST_DATA']}/db", "-m", "fast", "-w", "restart"]
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_postgres, *ctl], check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, err = proc.communicate(timeout=90)
        assert "Traceback" not in err and password not in err
        if proc.returncode != 0:  # stopped resumably, with one line naming the journal
            assert proc.returncode == 2 and "journal postgresql://" in err.splitlines()[-1] and "run again to resume" in err, err
            fake.org.config.rate = 4000
            done = gk(args, env)
            assert done.returncode == 0, done.stderr
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", {f"r{i:03d}" for i in range(120)})


def test_the_password_is_never_in_ps_logs_or_errors(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """From GATEKEEPER_JOURNAL the URL (password and all) is not in the process's command line; events, the
    interrupt's resume line and the summary never hold it; a password typed on the command line is warned about."""
    _, password = _without_password(pg_url)
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"p{i:03d}") for i in range(60)])
    with running_fake(ceiling=30, rate=30) as fake:
        proc = start_and_wait_for_create(["submit", str(path), "--job", job_name, *FAST],
                                         env_for(fake, GATEKEEPER_JOURNAL=pg_url), fake, isolated=True)  # its own argv
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "Resume with: gatekeeper submit" in err
        assert password not in cmdline + out + err and "--job" in cmdline
        typed = gk(["submit", str(path), "--journal", pg_url, "--job", job_name, *FAST], env_for(fake))
        assert typed.returncode == 0, typed.stderr
        assert "other users can read with ps" in typed.stderr and password not in typed.stderr + typed.stdout


def test_results_report_and_cancel_read_a_named_job_from_any_folder(tmp_path: Path, pg_url: str, job_name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading commands find a shared journal's job by --job (or by INPUT and key), with --json, from anywhere,
    and leave that folder as it was (`cancel --job` made the working folder 0700: a clean clone's CI then failed)."""
    here = tmp_path / "anywhere"
    here.mkdir(mode=0o755)
    here.chmod(0o755)
    monkeypatch.chdir(here)
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"{job_name}-{i}") for i in range(12)])
    with running_fake(ceiling=100, rate=4000) as fake:
        env = env_for(fake)
        submitted = gk(["submit", str(path), "--journal", pg_url, *FAST], env)
        assert submitted.returncode == 0, submitted.stderr
        name = orjson.loads(submitted.stdout)["job"]
        out = tmp_path / "copy.jsonl"
        by_name = gk(["results", "--journal", pg_url, "--job", name, "--out", str(out), "--in-order", "--json"], env)
        assert by_name.returncode == 0 and orjson.loads(by_name.stdout)["written"] == 12, by_name.stderr
        assert output_ids(out) == [f"{job_name}-{i}" for i in range(12)]
        by_input = gk(["report", str(path), "--journal", pg_url, "--json"], env)
        assert by_input.returncode == 0 and orjson.loads(by_input.stdout)["status"] == "finished"
        assert orjson.loads(by_input.stdout)["summary"]["job"] == name
        cancel = gk(["cancel", "--journal", pg_url, "--job", name, "--json"], env)
        assert cancel.returncode == 0 and orjson.loads(cancel.stdout)["canceled"] == []
        assert here.stat().st_mode & 0o777 == 0o755 and not list(here.iterdir())
        missing = gk(["results", "--journal", pg_url, "--job", "no-such-job", "--json", "--out", str(out)], env)
        assert missing.returncode == 2 and "no job named 'no-such-job'" in missing.stderr
        unnamed = gk(["report", "--journal", pg_url], {})
        assert unnamed.returncode == 2 and "--job NAME" in unnamed.stderr
        Path(orjson.loads(submitted.stdout)["output"]).unlink()  # a new host: the job's output is not here
        elsewhere = gk(["results", "--journal", pg_url, "--job", name], env)
        said = [x for x in elsewhere.stderr.splitlines() if "holds a password" not in x]  # (the URL on argv)
        assert elsewhere.returncode == 2 and len(said) == 1 and "sends nothing twice" in said[0]
        assert "Rerun the same `gatekeeper submit` on this host" in said[0]


def test_damaged_downloads_at_rebuild_are_retried_and_never_resent(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """The API as rough at rebuild as at collection: each batch's next two downloads end short or tear a line;
    the rebuild retries each until it verifies, writes the output as it was, and sends nothing again."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"d{i:03d}") for i in range(60)])
    events_seen: list[tuple[str, dict]] = []
    with running_fake(ceiling=60, rate=4000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(journal=pg_url, job=job_name, state_dir=tmp_path / "st", interval=0.05, max_rpm=60_000,
                                  ceiling=60, min_backoff=0.05)
        submit_sync(str(path), config=config, settings=settings)
        out = tmp_path / "st" / "results.jsonl"
        whole, creates = out.read_bytes(), fake.org.records.creates
        before = dict(fake.org.records.downloads)
        fake.org.config.damaged_downloads = 3  # downloads 2 and 3 of every batch are damaged (1 was the first run's)
        fake.org.config.damage = ("short", "half_line")
        out.unlink()
        summary = submit_sync(str(path), config=config, settings=settings, on_event=lambda e, f: events_seen.append((e, f)))
        assert out.read_bytes() == whole and fake.org.records.creates == creates
        assert {b: n - before[b] for b, n in fake.org.records.downloads.items()} == {b: 3 for b in before}
        assert sum(e == "download_failed" and f.get("rebuild") for e, f in events_seen) == 2 * len(before)
        assert summary.rebuilt == {"batches": len(before), "results": 60, "unavailable": 0}


def test_library_iterable_in_a_shared_journal_resumes_and_refuses_other_requests(tmp_path: Path, pg_url: str,
                                                                                   job_name: str) -> None:
    """Requests given as dicts are spooled into the state directory; the same job resumes from a new folder with
    the same requests, and other requests under the same name are refused before anything is sent."""
    from gatekeeper import JournalError

    items = [req(f"{job_name}-{i}") for i in range(20)]
    with running_fake(ceiling=100, rate=4000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)

        def settings(folder: str) -> SubmitSettings:
            return SubmitSettings(journal=pg_url, job=job_name, state_dir=tmp_path / folder, interval=0.05, max_rpm=60_000, ceiling=100)

        first = submit_sync(items, config=config, settings=settings("a"))
        creates = fake.org.records.creates
        again = submit_sync(items, config=config, settings=settings("b"))
        assert first.succeeded == again.succeeded == 20 and again.rebuilt["results"] == 20
        with pytest.raises(JournalError, match="other requests"):
            submit_sync(items[:-1], config=config, settings=settings("b"))
        assert fake.org.records.creates == creates
        assert len(output_ids(tmp_path / "b" / "results.jsonl")) == 20


def test_exporter_shows_a_job_of_the_shared_journal(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """`exporter --journal URL --job NAME` serves the job's figures under its name, wherever it ran."""
    from tests.runs import start
    from tests.test_exporter import _wait_for

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"{job_name}-{i}") for i in range(15)])
    url_only, password = _without_password(pg_url)
    with running_fake(ceiling=1000, rate=5000) as fake:
        env = env_for(fake, PGPASSWORD=password)
        assert gk(["submit", str(path), "--journal", url_only, "--job", job_name, *FAST], env).returncode == 0
        proc = start(["exporter", "--port", "0", "--interval", "1", "--json", "--journal", url_only, "--job", job_name,
                      "--max-rpm", "60000"], env)
        try:
            assert proc.stdout is not None
            m = _wait_for(orjson.loads(proc.stdout.readline())["url"], "gatekeeper_readings_total", 1)
            run = (("run", job_name),)
            assert m[("gatekeeper_run_requests", run)] == 15
            assert m[("gatekeeper_run_final_requests", (*run, ("type", "succeeded")))] == 15
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=20)


def test_a_lost_output_is_rebuilt_with_the_local_journal_too(tmp_path: Path) -> None:
    """The SQLite journal in the state directory: a deleted results file is downloaded again, not padded or lost."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"l{i}") for i in range(40)])
    with running_fake(ceiling=100, rate=4000) as fake:
        assert gk(["submit", str(path), *FAST], env_for(fake)).returncode == 0
        out = Path(str(path) + ".gatekeeper") / "results.jsonl"
        whole, creates = out.read_bytes(), fake.org.records.creates
        out.unlink()
        again = gk(["submit", str(path), *FAST], env_for(fake))
        assert again.returncode == 0 and out.read_bytes() == whole and fake.org.records.creates == creates
        assert orjson.loads(again.stdout)["rebuilt"]["results"] == 40
