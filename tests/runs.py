"""Running the CLI as a real subprocess against an in-test fake, and checking a job's output."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from gatekeeper.cli._cli import main
from gatekeeper.testing import FakeAPI
from tests.forkserver import Run, spawn

# A submit counts 2 requests a model with count_tokens, not the default 50, unless its test names --token-sample:
# the estimate has tests of its own (test_preflight), and 50 round trips at every other test's submit were about
# 14 s of the suite's 75 s of CPU. The calls still go out, so every submit still meets a rough count_tokens.
TOKEN_SAMPLE = "2"


def _tuned(args: list[str]) -> list[str]:
    return [*args, "--token-sample", TOKEN_SAMPLE] if args[:1] == ["submit"] and "--token-sample" not in args else args


def gk(args: list[str], env: dict[str, str], *, timeout: float = 120, crash_at: str | None = None,
       isolated: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the CLI with exactly `env` as its ANTHROPIC_/GATEKEEPER_ environment; (code, stdout, stderr).

    In this process (main() with stdout and stderr captured: no interpreter start, so the suite stays fast),
    unless the run must be a real process: `crash_at` (it SIGKILLs itself: a process forked from the worker's fork
    server) or `isolated` (a fresh `python -m gatekeeper`, interpreter start and imports included).
    """
    args = _tuned(args)
    if isolated:
        return subprocess.run([sys.executable, "-m", "gatekeeper", *args], env=_environ(env), capture_output=True,
                              text=True, timeout=timeout, check=False)
    if crash_at:
        run = spawn(args, {**_environ(env), "GATEKEEPER_CRASH_AT": crash_at})
        out, err = run.communicate(timeout=timeout)
        return subprocess.CompletedProcess(run.args, run.returncode, out, err)
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)  # with .buffer, as main() writes bytes too
    saved = dict(os.environ)
    # The timeout holds here too: when it is up, the run is sent a Ctrl-C (it stops as a user's would) and the test
    # fails with TimeoutExpired, whatever the run then returned. A real SIGINT to the main thread, not
    # `interrupt_main`: only a real signal wakes an event loop asleep in its selector (through its wakeup fd).
    fired = threading.Event()
    main_thread = threading.main_thread().ident
    assert main_thread is not None
    alarm = threading.Timer(timeout, lambda: (fired.set(), signal.pthread_kill(main_thread, signal.SIGINT)))
    full = _environ(env)  # (read before it is cleared: the run inherits the rest of the environment, as a process would)
    try:
        os.environ.clear()
        os.environ.update(full)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
            alarm.start()
            code = main(args)
        text = out.getvalue().decode()
    finally:
        alarm.cancel()
        stdout.detach()  # (closing the wrapper would close `out`)
        os.environ.clear()
        os.environ.update(saved)
    if fired.is_set():
        raise subprocess.TimeoutExpired(["gatekeeper", *args], timeout, text, err.getvalue())
    return subprocess.CompletedProcess(["gatekeeper", *args], code, text, err.getvalue())


def _environ(env: dict[str, str]) -> dict[str, str]:
    """This process's environment without its ANTHROPIC_/GATEKEEPER_ variables (but the test's own state folder,
    GATEKEEPER_HOME: its host ledger is the test's own), and `env`."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_")) or k == "GATEKEEPER_HOME"}
    full.update(env)
    return full


def start(args: list[str], env: dict[str, str], *, isolated: bool = False) -> Run | subprocess.Popen[str]:
    """The CLI as a real process of its own, to be signalled or killed: forked from the worker's fork server, or
    `isolated`, a fresh `python -m gatekeeper` (for what only a fresh process shows, such as its command line)."""
    args = _tuned(args)
    if isolated:
        return subprocess.Popen([sys.executable, "-m", "gatekeeper", *args], env=_environ(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return spawn(args, _environ(env))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Poll `condition` until it holds; fail the test naming `what` if it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


def start_and_wait_for_create(args: list[str], env: dict[str, str], fake: FakeAPI, timeout: float = 20, *,
                              isolated: bool = False) -> Run | subprocess.Popen[str]:
    """Start the CLI and return once the fake has accepted its first create (failing the test if it never does)."""
    proc = start(args, env, isolated=isolated)
    fake.org.wait_for(lambda r: r.creates > 0 or proc.poll() is not None, "the first create", timeout)
    assert fake.org.records.creates > 0, f"the CLI exited ({proc.returncode}) before creating anything"
    return proc


def wait_for_journaled_batch(journal: Path, timeout: float = 20) -> None:
    """Return once the run's journal holds a batch id: the fake's accepting a create comes before the run has read
    its answer, and a `cancel` in between finds only an unanswered create."""
    def journaled() -> bool:
        if not journal.exists():
            return False
        with contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as db:
            try:
                return db.execute("SELECT 1 FROM batches WHERE batch_id IS NOT NULL").fetchone() is not None
            except sqlite3.OperationalError:  # (the schema not made yet, or a write in progress)
                return False
    wait_until(journaled, f"a batch id in {journal}", timeout)


def events(stderr: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            out.append(orjson.loads(line))
    return out


def said(stderr: str) -> list[str]:
    """The lines of stderr a person reads: each that is not a JSON event, and a command's error under --json (the
    JSON `{"event": "error", ...}`) as the plain line it stands for, `gatekeeper: MESSAGE`."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("{"):
            out += [line] if line.strip() else []
        elif (event := orjson.loads(line)).get("event") == "error":
            out.append(f"gatekeeper: {event['error']['message']}")
    return out


def output_ids(path: Path) -> list[str]:
    data = path.read_bytes() if path.exists() else b""
    assert data == b"" or data.endswith(b"\n"), "the output ends in a partial line"
    return [orjson.loads(line)["custom_id"] for line in data.splitlines()]


def assert_exactly_once(fake: FakeAPI, out: Path, expected: set[str]) -> None:
    """Every valid request has one line; nothing was created twice; nothing succeeded twice."""
    ids = output_ids(out)
    assert len(ids) == len(set(ids)), "a request appears twice in the output"
    assert set(ids) == expected
    created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
    assert len(created) == len(set(created)), "a request was created in two batches"
    assert fake.org.records.succeeded_twice == 0


def killed_after_a_create_then_rerun(fake: FakeAPI, path: Path, ids: set[str], args: list[str],
                                     env: dict[str, str]) -> None:
    """SIGKILL right after the first create was answered, then the same command: exit 0, every line once, nothing
    created twice."""
    killed = gk(args, env, crash_at="after-create:1")
    assert killed.returncode == -9, killed.stderr[-2000:]
    done = gk(args, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


@contextlib.contextmanager
def fake_api_process(*args: str) -> Iterator[dict[str, str]]:
    """`gatekeeper fake-api ARGS --json` served in a process of its own: the environment it prints to paste. The
    files it points at (a service account, an identity token) are removed when it stops."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", "0", *args, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    env: dict[str, str] = {}
    try:
        assert run.stdout is not None
        lines = [run.stdout.readline()]
        while lines[-1].rstrip() != "}":
            assert lines[-1], run.stderr.read() if run.stderr else "fake-api ended"
            lines.append(run.stdout.readline())
        env = orjson.loads("".join(lines))["env"]
        yield env
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=60)
        for name in ("GOOGLE_APPLICATION_CREDENTIALS", "ANTHROPIC_IDENTITY_TOKEN_FILE"):
            if env.get(name):
                Path(env[name]).unlink(missing_ok=True)
