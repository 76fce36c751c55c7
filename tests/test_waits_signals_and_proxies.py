"""What a new user meets in the first hour: an API that is silent or is not the API, a proxy, a stop in any phase,
the fake's start line, one flag for the time between readings (issue 26).

Every test runs the CLI (in process, so a timeout can be shortened) against real servers on loopback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

import gatekeeper.api._http as client
from gatekeeper.testing import Fault, prompt_of
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, said, start, wait_until
from tests.services import ForwardProxy, serving, silent_server

FAST = ["--json", "--interval", "0.05", "--max-rpm", "60000", "--no-preflight"]


@pytest.fixture
def short_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read times out after 1 s here (60 s in real use), and every retry is announced."""
    monkeypatch.setattr(client, "DEFAULT_TIMEOUT", httpx.Timeout(connect=2.0, read=1.0, write=5.0, pool=2.0))
    monkeypatch.setattr(client, "NOTICE_AFTER", 0.0)


def test_no_read_waits_over_a_minute_and_a_create_says_what_it_waits_for() -> None:
    assert client.DEFAULT_TIMEOUT.read is not None and client.DEFAULT_TIMEOUT.read <= 60
    assert client.CREATE_TIMEOUT.read == client.CREATE_ANSWER_WAIT > 60


@pytest.mark.usefixtures("short_reads")
@pytest.mark.parametrize("command", ["status", "submit"])
def test_a_silent_api_is_named_with_its_setting_and_every_retry_is_said(tmp_path: Path, command: str) -> None:
    """An API that accepts connections and never answers: each retry is said on stderr, then one line names the
    URL and ANTHROPIC_BASE_URL, exit 2, and a submit leaves no state folder."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with silent_server() as url:
        started = time.monotonic()
        argv = ["status"] if command == "status" else ["submit", str(path), "--interval", "0.05", "--no-preflight"]
        proc = gk(argv, {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "k"})
        took = time.monotonic() - started
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert url in lines[-1] and "ANTHROPIC_BASE_URL" in lines[-1] and "ReadTimeout" in lines[-1]
    said = [x for x in lines[:-1] if "retry" in x or '"retrying"' in x]
    assert said and all(url in x for x in said), proc.stderr
    assert took < 30
    assert not Path(str(path) + ".gatekeeper").exists()


@pytest.mark.parametrize(("status", "kind", "body"), [
    (404, "text/html", b"<html><body><h1>404 Not Found</h1></body></html>"),  # a web server
    (404, "application/json", b'{"detail": "Not Found"}'),  # another JSON API
    (200, "text/html", b"<html>a login page</html>"),  # a captive portal
    (401, "text/html", b"<html>proxy login</html>"),
])
def test_a_base_url_that_is_not_the_api_is_one_line_exit_2(tmp_path: Path, status: int, kind: str, body: bytes) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with serving(status, kind, body) as url:
        for argv in (["status"], ["submit", str(path), "--no-preflight"], ["submit", str(path), "--dry-run"]):
            proc = gk(argv, {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "k"})
            lines = proc.stderr.splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (argv, proc.stderr)
            assert "does not answer like the Anthropic API" in lines[0] and url in lines[0]
            assert "ANTHROPIC_BASE_URL" in lines[0] and f"HTTP {status}" in lines[0]
    assert not Path(str(path) + ".gatekeeper").exists()


def test_retries_during_a_run_are_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run rides out 5xx on reads; each retry is a "retrying" event naming the endpoint."""
    monkeypatch.setattr(client, "NOTICE_AFTER", 0.0)
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"r{i}") for i in range(20)])
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("list", status=503), Fault("retrieve", status=529, error_type="overloaded_error"))
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", {f"r{i}" for i in range(20)})
    said = [e for e in events(proc.stderr) if e["event"] == "retrying"]
    assert {e["endpoint"] for e in said} == {"list", "retrieve"} and all(e["retry_in"] >= 0 for e in said)
    assert [e["bytes"] for e in events(proc.stderr) if e["event"] == "creating"][:1]


def test_a_submit_goes_through_the_proxy_the_environment_names(tmp_path: Path) -> None:
    """HTTP_PROXY is honoured as httpx honours it: the API's host here resolves only at the proxy, so the job can
    only finish through it; NO_PROXY=* turns it off (the host then cannot be reached: exit 2, named)."""
    ids = {f"p{i}" for i in range(30)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in sorted(ids)])
    with running_fake(ceiling=1000, rate=4000) as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        proxy = ForwardProxy({"api.gatekeeper.test": "127.0.0.1"})
        try:
            env = env_for(fake, ANTHROPIC_BASE_URL=f"http://api.gatekeeper.test:{port}", HTTP_PROXY=proxy.url)
            off = gk(["submit", str(path), *FAST], {**env, "NO_PROXY": "*"})
            assert off.returncode == 2 and "api.gatekeeper.test" in off.stderr, off.stderr
            proc = gk(["submit", str(path), *FAST], env)
            assert proc.returncode == 0, proc.stderr
            assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        finally:
            proxy.close()
    paths = {(method, p.rsplit("/", 1)[-1] if "results" in p else p) for method, _, p in proxy.seen}
    assert ("POST", "/v1/messages/batches") in paths and ("GET", "results") in paths
    assert {host for _, host, _ in proxy.seen} == {"api.gatekeeper.test"}
    assert orjson.loads(proc.stdout)["succeeded"] == 30


# -- signals: the first stops at a safe point within a second or two, in every phase; a second exits at once --

PHASES = {  # phase -> (the fake's endpoint whose call marks it, the held call's delay (none: a big input), flags)
    "planning": ("list", None, ["--no-preflight"]),
    "preflight": ("models", 30.0, []),
    "sampling": ("count_tokens", 30.0, []),
    # (the held create is answered when its 4 s are up: the stop waits for that answer, saying so, rather than leave
    # an outcome to reconcile)
    "creating": ("create", 4.0, ["--no-preflight"]),
    "collecting": ("results", 30.0, ["--no-preflight"]),
}


def _big_input(path: Path, n: int) -> set[str]:
    ids = [f"s{i}" for i in range(n)]
    path.write_bytes(b"".join(orjson.dumps(req(c, text="x" * 40)) + b"\n" for c in ids))
    return set(ids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_stop_lands_within_two_seconds_in_every_phase(tmp_path: Path, phase: str, sig: signal.Signals) -> None:
    """The run is held in a phase (a big input being planned, or a call the fake holds for 30 s); one SIGINT or
    SIGTERM ends it with exit 130 and the resume line within two seconds (a create out: once it is answered); the
    rerun finishes, nothing twice."""
    endpoint, delay, flags = PHASES[phase]
    path = tmp_path / "in.jsonl"
    ids = _big_input(path, 600_000 if phase == "planning" else 30)  # (planning 600,000 takes a few seconds)
    with running_fake(ceiling=1_000_000, rate=100_000) as fake:
        if delay is not None:
            fake.inject(Fault(endpoint, kind="delay", delay=delay))  # (a Fault is used up: one of its own per test)
        run = start(["submit", str(path), "--json", "--interval", "0.05", "--max-rpm", "60000", *flags], env_for(fake))
        fake.org.wait_for(lambda r: r.requests_seen.get(endpoint, 0) >= 1 or run.poll() is not None, f"the {phase} phase", 30)
        time.sleep(0.1)
        assert run.poll() is None, f"the run ended before it could be stopped while {phase}"
        signalled = time.monotonic()
        run.send_signal(sig)
        _, err = run.communicate(timeout=30)
        took = time.monotonic() - signalled
        assert run.returncode == 130 and "Traceback" not in err, err[-2000:]
        bound = 2.5 if phase != "creating" else 4.0 + 2.5
        assert "Resume with: gatekeeper submit" in err and took < bound, (took, err[-500:])
        if phase == "creating":  # the create was waited for, not cut off: nothing is left unknown
            assert '"event":"create_stopping"' in err and '"event":"create_unknown"' not in err, err[-2000:]
        if phase == "planning":  # stopped while planning, not after: nothing recorded, nothing left behind
            assert '"event":"planned"' not in err and not Path(str(path) + ".gatekeeper").exists()
        elif sig == signal.SIGTERM:  # the rerun picks up where it stopped, and nothing is sent twice
            done = gk(["submit", str(path), *FAST], env_for(fake))
            assert done.returncode == 0, done.stderr[-2000:]
            assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    _big_input(path, 30)
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("create", kind="delay", delay=30))
        run = start(["submit", str(path), *FAST], env_for(fake))
        fake.org.wait_for(lambda r: r.requests_seen.get("create", 0) >= 1, "the create")
        run.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        signalled = time.monotonic()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
        # (the create is held 30 s and a stopping run waits for it: only the second signal ends it sooner; 5 s is
        # a loaded machine's margin, where 0.9 left none)
        assert run.returncode == 130 and time.monotonic() - signalled < 5, err[-1000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_plan_stops_on_either_signal(sig: signal.Signals) -> None:
    """`plan -` reading a pipeline that is still writing ends with exit 130 on SIGINT or SIGTERM, at once."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "plan", "-", "--json"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert run.stdin is not None
    run.stdin.write(b"".join(orjson.dumps(req(f"r{i}")) + b"\n" for i in range(1000)))
    run.stdin.flush()  # (and the pipe stays open: the upstream is still writing)
    time.sleep(0.5)
    assert run.poll() is None
    signalled = time.monotonic()
    run.send_signal(sig)
    _, err = run.communicate(timeout=30)
    # (the pipe stays open: without the signal's exit it runs until communicate's 30 s; 10 s holds on a loaded machine)
    assert run.returncode == 130 and b"Traceback" not in err and time.monotonic() - signalled < 10, err[-1000:]


def test_a_command_started_with_sigint_ignored_still_stops_on_it() -> None:
    """`gatekeeper plan ... &` in a shell script starts with SIGINT ignored (a shell does that to its background
    jobs, and Python keeps it so): `kill -INT` meant for it did nothing, and a test suite started so saw a big
    table's `plan` run on past its Ctrl-C (twice in clean-clone runs). It stops as Ctrl-C stops it: exit 130."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "plan", "-", "--json"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert run.stdin is not None
    run.stdin.write(b"".join(orjson.dumps(req(f"r{i}")) + b"\n" for i in range(1000)))
    run.stdin.flush()  # (and the pipe stays open: the upstream is still writing)
    time.sleep(0.5)
    assert run.poll() is None
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=30)  # (ignored, it runs until this times out: the pipe stays open)
    assert run.returncode == 130 and b'"type":"Interrupted"' in err and b"Traceback" not in err, err[-1000:]


def test_the_fakes_start_line_is_what_to_paste(tmp_path: Path) -> None:
    """`fake-api` prints the exports a newcomer pastes; with exactly those, the commands reach it; stopped, it says
    what it received (so "nothing sent twice" can be checked against it), billing as `--usage` says."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", "0", "--usage", "count-3"],
                           stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert run.stdout is not None
        first, second = run.stdout.readline(), run.stdout.readline()
        assert "Ctrl-C stops it" in first and second.startswith("export ANTHROPIC_BASE_URL=http://127.0.0.1:")
        env = dict(pair.split("=", 1) for pair in second.split()[1:])
        assert set(env) == {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_ADMIN_KEY"}
        status = gk(["status", "--json"], env)
        assert status.returncode in (0, 1) and orjson.loads(status.stdout)["ceiling"] is not None, status.stderr
        path = write_jsonl(tmp_path / "in.jsonl", [req("a"), req("b")])
        assert gk(["submit", str(path), "--interval", "0.05", "--json"], env).returncode == 0
        lines = map(orjson.loads, (Path(str(path) + ".gatekeeper") / "results.jsonl").read_bytes().splitlines())
        line = next(x for x in lines if x["custom_id"] == "a")
        assert line["result"]["message"]["usage"]["input_tokens"] == prompt_of(req("a")["params"])[0] - 3
    finally:
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)  # (as `fake_api_process`: 10 s ran out at load 16, its summary not yet out)
    assert run.returncode == 0
    assert "the fake received 1 creates (0 refused for a full queue) and 2 requests; 2 succeeded, 0 answered twice" in out
    assert "; 0 create answer(s) lost" in out


def test_the_fake_rehearses_a_deadline_on_the_aws_platform_from_its_command_line(tmp_path: Path) -> None:
    """`fake-api --aws --rate 0 --realtime-rpm 600`: batches that never move, the real-time lane's limits, and Claude
    Platform on AWS, all from the command line. With the lines it prints (JSON here), a submit with a deadline signs
    every call, probes the lane's limits, moves the stalled work and meets the deadline; the fake's summary counts
    what it received."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", "0", "--aws", "--rate", "0",
                            "--realtime-rpm", "600", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert run.stdout is not None
        lines = [run.stdout.readline()]
        while lines[-1].rstrip() != "}":  # (one indented JSON object)
            lines.append(run.stdout.readline())
        env = orjson.loads("".join(lines))["env"]
        assert {"AWS_REGION", "ANTHROPIC_AWS_WORKSPACE_ID", "ANTHROPIC_AWS_BASE_URL", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY", "GATEKEEPER_PLATFORM"} <= set(env)
        env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
        path = write_jsonl(tmp_path / "in.jsonl", [req(f"d{i}") for i in range(8)])
        # (the last chance 2 s in, as ever; the lane has 28 s to answer 8 calls, so the deadline is met at load 8)
        done = gk(["submit", str(path), "--interval", "0.05", "--json", "--deadline", "30s", "--deadline-slack", "28"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 8 and s["lanes"]["realtime"]["requests"] == 8 and s["deadline"]["met"] is True
    finally:
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)  # (as `fake_api_process`: 10 s ran out at load 16, its summary not yet out)
    received = orjson.loads(out)["received"]
    assert run.returncode == 0 and received["answered_twice"] == 0 and received["creates"] <= 1


@pytest.mark.parametrize("command", [["fake-api", "--port", "0"], ["exporter", "--port", "0", "--interval", "0.05", "--max-rpm", "60000"],
                                     ["status", "--watch", "0.05", "--max-rpm", "60000", "--json"]])
def test_a_long_command_stopped_by_sigterm_ends_as_ctrl_c_ends_it(command: list[str]) -> None:
    """`kill`, `docker stop` or systemd stop `fake-api`, `exporter` and `status --watch` as Ctrl-C does: exit 0, no
    traceback, and the fake says what it received. (Readings every 50 ms: the stop lands in one as often as between
    two, and every reading is in the one event loop whose runner takes the stop.)"""
    with running_fake(ceiling=1000, rate=4000) as fake:
        run = start(command, env_for(fake))
        assert run.stdout is not None and run.stdout.readline()  # (serving, or the first reading shown)
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=10)
    assert run.returncode == 0 and "Traceback" not in err, err[-2000:]
    if command[0] == "fake-api":
        assert "the fake received 0 creates (0 refused for a full queue) and 0 requests" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_fake_in_the_background_of_a_script_stops_on_sigint_and_sigterm(sig: signal.Signals) -> None:
    """`gatekeeper fake-api ... &` in a shell script starts with SIGINT ignored (a shell does that to its background
    jobs, and Python keeps it so): `kill -INT` and `kill` (TERM) still stop it as Ctrl-C does, exit 0 with what it
    received, well inside the wait."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert run.stdout is not None and "Ctrl-C stops it" in run.stdout.readline()
        run.send_signal(sig)
        out, err = run.communicate(timeout=10)
    finally:
        run.kill()
        run.communicate()
    assert run.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert "the fake received 0 creates (0 refused for a full queue) and 0 requests" in out


@pytest.mark.parametrize("command", [["status", "--watch", "0.2", "--json"],
                                     ["exporter", "--port", "0", "--interval", "0.2", "--json"]])
def test_sigterm_inside_a_reading_stops_the_long_command_cleanly(command: list[str]) -> None:
    """The stop lands while a reading waits on a slow listing (inside the async client and its task groups): still
    exit 0 and no traceback."""
    with running_fake(ceiling=1000, rate=4000) as fake:
        run = start(command, env_for(fake))
        assert run.stdout is not None and run.stdout.readline()
        seen = fake.org.records.requests_seen.get("list", 0)
        fake.inject(Fault("list", kind="delay", delay=20))
        wait_until(lambda: fake.org.records.requests_seen.get("list", 0) > seen, "the next reading's listing")
        time.sleep(0.1)  # (into the wait for the answer)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=10)
    assert run.returncode == 0 and "Traceback" not in err and "Group" not in err, err[-2000:]


def test_sigterm_while_a_task_runs_is_asyncios_clean_stop() -> None:
    """The CLI's SIGTERM handler, reached while a task's own code runs inside `anyio.run`, hands the stop to asyncio's
    runner as Ctrl-C does: the task goes on to its next await and is cancelled there (its cleanup runs as for any
    cancellation), rather than a KeyboardInterrupt raised in the middle of its code; the run ends promptly with a
    plain KeyboardInterrupt (the CLI's 130)."""
    import anyio

    from gatekeeper.cli._cli import _interrupt

    reached: list[str] = []

    async def main() -> None:
        async def child() -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # (the handler runs here, in the task, before the next line)
            reached.append("the next line")
            try:
                await anyio.sleep(5)
            except anyio.get_cancelled_exc_class():
                reached.append("cancelled at the await")
                raise

        async with anyio.create_task_group() as tg:
            tg.start_soon(child)

    before = signal.signal(signal.SIGTERM, _interrupt)
    # (as the CLI has it, SIGINT restored where the suite came with it ignored: asyncio's runner takes it only then)
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            anyio.run(main)
        assert time.monotonic() - started < 2 and reached == ["the next line", "cancelled at the await"]
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, was)


def test_a_short_command_stopped_by_sigterm_exits_130() -> None:
    """`status` held on a slow listing, stopped by SIGTERM: 130 and one line, as Ctrl-C (not killed by the signal)."""
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("list", kind="delay", delay=20))
        run = start(["status", "--json"], env_for(fake))
        wait_until(lambda: fake.org.records.requests_seen.get("list", 0) > 0, "the listing")
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=10)
    assert run.returncode == 130 and said(err)[-1] == "gatekeeper: interrupted", err[-2000:]
    assert orjson.loads(err.strip().splitlines()[-1])["error"] == {"type": "Interrupted", "message": "interrupted",
                                                                     "exit_code": 130}  # (under --json, as JSON)


def test_the_in_process_helper_honours_its_timeout(tmp_path: Path) -> None:
    """A run held longer than the helper's timeout is stopped, and the test is told (not left waiting)."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("list", kind="delay", delay=20))
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            gk(["submit", str(path), *FAST], env_for(fake), timeout=1.0)
        assert time.monotonic() - started < 5


def test_one_flag_for_the_time_between_readings(capsys: pytest.CaptureFixture[str]) -> None:
    """`--interval` in every command that reads again and again; submit's old `--poll` still lands there, with one
    warning line naming the new name."""
    from gatekeeper.cli._parser import build_parser

    def parsed(*argv: str) -> object:
        return build_parser(list(argv)).parse_args(list(argv))

    assert parsed("submit", "in.jsonl", "--interval", "7").interval == 7.0  # type: ignore[attr-defined]
    assert capsys.readouterr().err == ""
    assert parsed("submit", "in.jsonl", "--poll", "5").interval == 5.0  # type: ignore[attr-defined]
    assert capsys.readouterr().err == "gatekeeper: warning: --poll is deprecated: use --interval (it means the same)\n"
    watch = parsed("status", "--watch", "--interval", "2")
    assert watch.watch is True and watch.interval == 2.0  # type: ignore[attr-defined]
    assert parsed("exporter", "--interval", "9").interval == 9.0  # type: ignore[attr-defined]
    assert parsed("fake-api", "--simulated-ceiling", "50").simulated_ceiling == 50  # type: ignore[attr-defined]
    assert parsed("fake-api", "--usage", "scale:0.9").usage == "scale:0.9"  # type: ignore[attr-defined]
