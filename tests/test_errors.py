"""One error boundary: each foreign failure becomes one line with the documented exit code, never a traceback."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from gatekeeper import ExitCode, JournalError, LedgerError, OutputError, TransportError, Unreachable, UsageError
from gatekeeper.api._http import map_transport_error
from gatekeeper.cli._cli import main
from gatekeeper.state._journal import Journal
from gatekeeper.state._lease import Lease
from gatekeeper.state._output import OutputFile, check_writable
from gatekeeper.state.ledger._open import open_ledger
from gatekeeper.state.ledger._redis import RedisLedger
from gatekeeper.testing import FakeAPI
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, gk, said, start
from tests.services import free_port, redis_server


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str],
         *argv: str) -> tuple[int, str]:
    """Run the CLI in-process; (exit code, the message), asserting stderr holds, beside JSON progress events,
    one line that is not a traceback."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("{")]
    assert "Traceback" not in err and len(lines) == 1, err
    return code, lines[0]


# -- the mapping, one kind of I/O at a time ----------------------------------

def test_httpx_failures_map_by_whether_the_api_ever_answered() -> None:
    """Before any answer a refused connection is Unreachable (exit 2, naming the URL); after, a TransportError."""
    exc = httpx.ConnectError("All connection attempts failed")
    first = map_transport_error(exc, "list", "http://127.0.0.1:9", reached=False)
    later = map_transport_error(exc, "list", "http://127.0.0.1:9", reached=True)
    assert isinstance(first, Unreachable) and first.exit_code == ExitCode.USAGE and "http://127.0.0.1:9" in str(first)
    assert isinstance(later, TransportError) and not isinstance(later, Unreachable)
    assert isinstance(map_transport_error(httpx.ReadTimeout("t"), "list", "u", reached=False), TransportError)


def test_sqlite_failure_in_a_transaction_is_a_journal_error(tmp_path: Path) -> None:
    """A sqlite3 error inside a journal transaction rolls it back and is a JournalError with the cause kept."""
    j = Journal.open(tmp_path / "state")
    with pytest.raises(JournalError) as info, j.transaction() as db:
        db.execute("INSERT INTO meta VALUES ('k', '1')")
        db.execute("INSERT INTO no_such_table VALUES (1)")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert j.get_meta("k") is None  # rolled back
    j.close()


def test_file_errors_are_output_errors(tmp_path: Path) -> None:
    """A results file in a missing folder, on a folder, or unwritable: OutputError naming the path."""
    with pytest.raises(OutputError, match="does not exist"):
        check_writable(str(tmp_path / "nope" / "out.jsonl"))
    with pytest.raises(OutputError, match="is a folder"):
        check_writable(str(tmp_path))
    gone = OutputFile(str(tmp_path / "missing" / "x.jsonl"))
    with pytest.raises(OutputError) as info:
        gone.truncate_to(0)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_redis_failure_is_a_ledger_error_without_the_password() -> None:
    """An unreachable Redis is a LedgerError naming the URL, the password masked, within seconds."""
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0"

    async def probe() -> None:
        led = RedisLedger(url, "me")
        try:
            await led.ping()
        finally:
            await led.close()

    started = time.monotonic()
    with pytest.raises(LedgerError) as info:
        anyio.run(probe)
    assert time.monotonic() - started < 10
    assert "hunter2" not in str(info.value) and "127.0.0.1" in str(info.value)
    assert info.value.__cause__ is not None


def test_socket_failure_of_the_fake_is_a_usage_error() -> None:
    """The fake on a port in use is one UsageError, not an OSError."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UsageError, match="cannot listen"):
            FakeAPI(port=s.getsockname()[1])


def test_sqlite_ledger_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    """A sqlite:/// ledger whose folder is missing is an error, and the folder is not created."""
    for url in (f"sqlite:///{tmp_path}/missing/ledger.db", f"sqlite:////{str(tmp_path).lstrip('/')}/missing/ledger.db"):
        with pytest.raises(LedgerError) as e:
            open_ledger(url)
        # (named as a user writes it, whatever slashes were given: a cold tester read sqlite://///... and folder //...)
        assert str(e.value) == f"ledger sqlite://{tmp_path}/missing/ledger.db: folder {tmp_path}/missing does not exist"
    assert not (tmp_path / "missing").exists()


# -- the CLI, case by case ---------------------------------------------------

def test_bad_out_is_refused_before_anything_is_journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--out into a missing folder or onto a folder: exit 2, no state directory; the corrected rerun works."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a"), req("b")])
    with running_fake(ceiling=100, rate=2000) as fake:
        env = env_for(fake)
        for bad in (tmp_path / "missing" / "out.jsonl", tmp_path):
            code, err = _cli(monkeypatch, capsys, env, "submit", str(path), "--out", str(bad), "--interval", "0.05", "--max-rpm", "60000")
            assert code == ExitCode.USAGE and str(bad) in err and "(--out)" in err
            assert not Path(str(path) + ".gatekeeper").exists()
        out = tmp_path / "out.jsonl"
        assert main(["submit", str(path), "--out", str(out), "--interval", "0.05", "--max-rpm", "60000", "--json"]) == ExitCode.OK
        capsys.readouterr()
        assert len(out.read_bytes().splitlines()) == 2
        code, err = _cli(monkeypatch, capsys, env, "results", str(path), "--out", str(tmp_path / "no" / "x.jsonl"))
        assert code == ExitCode.USAGE and "does not exist" in err
        code, err = _cli(monkeypatch, capsys, env, "results", str(path), "--only", "succeded")
        assert code == ExitCode.USAGE and "succeded" in err and "(--only)" in err


def test_unreachable_api_names_the_url_and_exits_2_quickly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens at the base URL: status and submit say so in one line, exit 2, within seconds."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    url = f"http://127.0.0.1:{free_port()}"
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "k"}
    for argv in (["status"], ["submit", str(path)], ["submit", str(path), "--dry-run"]):
        started = time.monotonic()
        code, err = _cli(monkeypatch, capsys, env, *argv)
        assert code == ExitCode.USAGE and url in err, err
        assert time.monotonic() - started < 5
    assert not Path(str(path) + ".gatekeeper").exists() or not Journal.open(str(path) + ".gatekeeper").initialized


def test_a_missing_input_is_named_before_the_api_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in the input's name is the first thing said (a local fact), even with the API unreachable: one line,
    exit 2, no state folder."""
    missing = tmp_path / "typo.jsonl"
    env = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{free_port()}", "ANTHROPIC_API_KEY": "k"}
    code, err = _cli(monkeypatch, capsys, env, "submit", str(missing))
    assert (code, err) == (ExitCode.USAGE, f"gatekeeper: cannot read {missing}: No such file or directory")
    assert not Path(str(missing) + ".gatekeeper").exists()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 32 KB at tmp_path/disk (grown with `_grow`), unmounted after: a disk that fills, for real."""
    with _mounted(tmp_path / "disk", "32k") as disk:
        yield disk


@contextlib.contextmanager
def _mounted(disk: Path, size: str) -> Iterator[Path]:
    import subprocess

    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True,
                          text=True, check=False)
    if made.returncode != 0:
        why = f"cannot mount a tmpfs here (root and the mount capability needed): {made.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the full-disk tests: {why}")  # (a skip there would hide them for good)
        pytest.skip(why)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _grow(disk: Path, size: str) -> None:
    import subprocess

    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_the_rerun_with_room_sends_nothing_twice(small_disk: Path) -> None:
    """The state folder on a disk that fills: each run that meets the full disk stops with one line naming the file
    and exit 2 (the journal, or the results file), at whatever step it was; given room, a rerun finishes the job with
    every request once and nothing created twice (a create whose answer could not be journaled is found and proven
    ours)."""
    ids = {f"d-{i:04d}" for i in range(300)}
    path = write_jsonl(small_disk.parent / "in.jsonl", [req(c, text="a prompt of some length " * 4) for c in sorted(ids)])
    state = small_disk / "state"
    failures = []
    with running_fake(ceiling=10_000, rate=5000) as fake:
        env = env_for(fake)
        for size in ("32k", "96k", "192k", "384k", "768k", "20m"):
            _grow(small_disk, size)
            done = gk(["submit", str(path), "--state", str(state), "--interval", "0.05", "--json"], env)
            if done.returncode == 0:
                break
            lines = said(done.stderr)
            assert done.returncode == ExitCode.USAGE and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
            # (SQLite's "disk I/O error" too is told to be the full disk it is)
            assert "the disk holding it is full" in lines[0] or "No space left on device" in lines[0], lines[0]
            assert str(state) in lines[0], lines[0]  # (it names the file)
            failures.append(lines[0])
        assert done.returncode == 0, done.stderr[-2000:]
        assert_exactly_once(fake, state / "results.jsonl", ids)
        assert fake.org.records.creates == 1  # (one batch: never sent again)
    assert failures, "the disk never filled: the test proves nothing"
    _exports_on_a_full_disk(state, len(ids))


def test_a_full_disk_under_a_deadline_never_buys_a_real_time_answer_a_third_time(small_disk: Path) -> None:
    """The same disk that fills, with a deadline that sends the job through the real-time lane (the batch lane
    stalled): each run that meets the full disk stops with one line and exit 2; an answer received is kept (or, if
    not even that could be written, bought once more, never a third time); given room, a rerun finishes the job
    with every request once."""
    from gatekeeper.testing import prompt_of

    ids = {f"r-{i:03d}" for i in range(60)}
    rows = [req(c, text="a prompt of some length " * 4 + c) for c in sorted(ids)]
    path = write_jsonl(small_disk.parent / "in.jsonl", rows)
    state = small_disk / "state"
    failures = 0
    with running_fake(ceiling=10_000, rate=0.0) as fake:
        env = env_for(fake)
        for size in ("32k", "96k", "160k", "256k", "384k", "20m"):
            _grow(small_disk, size)
            done = gk(["submit", str(path), "--state", str(state), "--interval", "0.05", "--json", "--deadline", "20s",
                       "--deadline-slack", "18"], env)
            if done.returncode in (0, 1):
                break
            lines = said(done.stderr)
            assert done.returncode == ExitCode.USAGE and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
            failures += 1
        assert done.returncode in (0, 1), done.stderr[-2000:]
        calls = fake.org.records.realtime
        digests = {prompt_of(r["params"])[1] for r in rows}
        assert max(calls.values()) <= 2 and set(calls) == digests, calls  # (each real time, at most twice)
        out = [orjson.loads(x) for x in (state / "results.jsonl").read_bytes().splitlines()]
        assert sorted(x["custom_id"] for x in out) == sorted(ids)
    assert failures, "the disk never filled: the test proves nothing"


def test_the_library_spooling_onto_a_full_disk_leaves_nothing_half_written(tmp_path: Path) -> None:
    """`submit_sync` of an iterable whose state folder is on a disk that fills, grown run by run: each run that meets
    the full disk (the journal, then the spooled input) is one JournalError naming the file, leaves no half-spooled
    input (which a rerun would take for the job's requests) and creates nothing; with room, the job runs once."""
    from gatekeeper import ApiConfig, Secret, SubmitSettings, submit_sync
    from tests.fakes import WS1

    rows = [req(f"s-{i}", text="a prompt of some length " * 8) for i in range(400)]
    spool_failures = 0
    with _mounted(tmp_path / "disk", "16k") as disk, running_fake(ceiling=1000, rate=5000) as fake:
        state = disk / "state"
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        for size in ("16k", "64k", "96k", "128k", "256k", "10m"):
            _grow(disk, size)
            try:
                done = submit_sync(rows, config=config, settings=SubmitSettings(state_dir=state, interval=0.05))
                break
            except JournalError as exc:
                assert "No space left on device" in str(exc) or "the disk holding it is full" in str(exc), exc
                spool_failures += "spooled requests" in str(exc)
            spooled = state / "input.jsonl"
            assert not [p.name for p in state.iterdir() if p.name.endswith(".tmp")], "a temporary left"
            assert not spooled.exists() or len(spooled.read_bytes().splitlines()) == len(rows), "half a spool left"
            assert fake.org.records.creates == 0
        assert done.succeeded == 400 and fake.org.records.creates == 1
    assert spool_failures, "the disk never filled while spooling: the test proves nothing"


def _exports_on_a_full_disk(state: Path, lines: int) -> None:
    """`results --out` and `report --out` onto a disk too small for them: one line naming the file, exit 2, and nothing
    left there (no half file, no temporary); with room, the export is whole."""
    with _mounted(state.parent.parent / "exports", "16k") as disk:
        with open(disk / "filler", "wb") as f, contextlib.suppress(OSError):  # (all but a few bytes taken)
            f.write(b"x" * 15_000)
        for argv, what in ((["results", "--state", str(state), "--out", str(disk / "export.jsonl")], "the results"),
                           (["report", "--state", str(state), "--out", str(disk / "report.html")], "the report")):
            done = gk(argv, {})
            said = [x for x in done.stderr.splitlines() if x.strip()]
            assert done.returncode == ExitCode.USAGE and len(said) == 1 and "Traceback" not in done.stderr, done.stderr
            assert "No space left on device" in said[0] and what in said[0], said[0]
            assert os.listdir(disk) == ["filler"], "a failed export left a file behind"
        _grow(disk, "10m")
        assert gk(["results", "--state", str(state), "--out", str(disk / "export.jsonl")], {}).returncode == 0
        assert len((disk / "export.jsonl").read_bytes().splitlines()) == lines


def test_unreachable_redis_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A Redis ledger nobody listens at: status and submit exit 2 naming it, and submit created nothing."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    ledger = f"redis://127.0.0.1:{free_port()}/0"
    with running_fake(ceiling=100, rate=2000) as fake:
        for argv in (["status", "--ledger", ledger], ["submit", str(path), "--ledger", ledger]):
            code, err = _cli(monkeypatch, capsys, env_for(fake), *argv)
            assert code == ExitCode.USAGE and ledger in err
        assert fake.org.records.creates == 0


@pytest.mark.parametrize("case", ["missing", "empty", "blank lines", "unreachable api", "unreachable redis"])
def test_a_run_that_fails_before_a_job_exists_leaves_no_state_folder(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped path, an empty or blank-only input, an API or a ledger nobody answers at: exit 2 in one line,
    and no INPUT.gatekeeper/ left behind (plan and submit apply one rule to an input without requests)."""
    path = tmp_path / "in.jsonl"
    if case != "missing":
        path.write_bytes({"empty": b"", "blank lines": b"\n  \n\r\n"}.get(case, orjson.dumps(req("a")) + b"\n"))
    with running_fake(ceiling=100, rate=2000) as fake:
        env = env_for(fake)
        extra = []
        if case == "unreachable api":
            env = {**env, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{free_port()}"}
        if case == "unreachable redis":
            extra = ["--ledger", f"redis://127.0.0.1:{free_port()}/0"]
        code, err = _cli(monkeypatch, capsys, env, "submit", str(path), "--interval", "0.05", *extra)
        assert code == ExitCode.USAGE, err
        assert fake.org.records.creates == 0
    assert not Path(str(path) + ".gatekeeper").exists()
    if case in ("empty", "blank lines"):
        assert "holds no requests" in err
        code, err = _cli(monkeypatch, capsys, {}, "plan", str(path))
        assert code == ExitCode.USAGE and "holds no requests" in err


def test_empty_input_says_so_and_does_not_tie_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An empty input: exit 2, 'is empty'; the same path filled later submits normally."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"")
    with running_fake(ceiling=100, rate=2000) as fake:
        code, err = _cli(monkeypatch, capsys, env_for(fake), "submit", str(path), "--interval", "0.05", "--max-rpm", "60000")
        assert code == ExitCode.USAGE and "holds no requests" in err
        write_jsonl(path, [req("a")])
        assert main(["submit", str(path), "--interval", "0.05", "--max-rpm", "60000", "--json"]) == ExitCode.OK


@pytest.mark.parametrize("argv", [["fake-api", "--port", "99999"], ["fake-api", "--port", "{busy}"]])
def test_fake_api_port_problems_are_one_line(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An out-of-range or busy port: one line, exit 2."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        argv = [a.replace("{busy}", str(s.getsockname()[1])) for a in argv]
        code, err = _cli(monkeypatch, capsys, {}, *argv)
    assert code == ExitCode.USAGE and "port" in err


def test_redis_outage_mid_run_stops_resumably(tmp_path: Path) -> None:
    """Redis dies while a submit runs: the run ends with one line (or rides it out); once Redis is back the
    same command finishes every request exactly once."""
    items = [req(f"r{i:03d}") for i in range(60)]
    path = write_jsonl(tmp_path / "in.jsonl", items)
    port = free_port()
    with running_fake(ceiling=40, rate=40) as fake:
        args = ["submit", str(path), "--json", "--interval", "0.05", "--max-rpm", "60000", "--ceiling", "40", "--ledger",
                f"redis://127.0.0.1:{port}/0", "--ledger-ttl", "3"]
        with redis_server(port) as (_, proc):
            run = start(args, env_for(fake))
            fake.org.wait_for(lambda r: r.creates > 0 or run.poll() is not None, "a create")
            assert run.poll() is None, "the run ended before it created anything"
            proc.kill()
        _, err = run.communicate(timeout=60)
        assert "Traceback" not in err
        if run.returncode != 0:
            assert run.returncode == ExitCode.USAGE and f"127.0.0.1:{port}" in err.splitlines()[-1]
        with redis_server(port):
            done = gk(args, env_for(fake))
        assert done.returncode == 0, done.stderr
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", {f"r{i:03d}" for i in range(60)})


def test_a_state_folder_that_cannot_be_made_suggests_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A state directory the system refuses (here under /proc, refused even to root): one line naming it and
    the flag that moves it, exit 2."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with running_fake(ceiling=100, rate=2000) as fake:
        code, err = _cli(monkeypatch, capsys, env_for(fake), "submit", str(path), "--state", "/proc/gatekeeper-state")
    assert code == ExitCode.USAGE and "/proc/gatekeeper-state" in err
    assert "choose a folder you can write (--state)" in err


@pytest.mark.anyio
@pytest.mark.parametrize(("helper_fails", "body_fails", "raised"), [
    (True, False, "JournalError"),  # a helper's error ends the body and is raised as it is
    (False, True, "InputError"),
    (False, False, None),
])
async def test_beside_raises_the_first_error_of_the_body_or_a_helper(helper_fails: bool, body_fails: bool,
                                                                     raised: str | None) -> None:
    from gatekeeper._errors import InputError
    from gatekeeper.run.shared._beside import beside

    async def body() -> str:
        await anyio.sleep(0.05 if body_fails else (10 if helper_fails else 0.01))
        if body_fails:
            raise InputError("bad line 3")
        return "done"

    async def helper() -> None:
        if helper_fails:
            raise JournalError("the lease's connection: connection refused")
        await anyio.sleep(10)

    if raised is None:
        assert await beside(body, helper) == "done"
    else:
        with pytest.raises((InputError, JournalError)) as info:
            await beside(body, helper)
        assert type(info.value).__name__ == raised


def test_a_lease_connection_that_fails_at_start_is_one_error_not_a_group(tmp_path: Path, pg_database: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared journal's lease heartbeat opens a second connection; when that fails, the library raises the
    JournalError (the CLI prints its one line, exit 2), not an ExceptionGroup."""
    from gatekeeper import ApiConfig, SubmitSettings, submit_sync
    from gatekeeper.api._config import Secret

    def refused(self: Lease) -> object:
        raise JournalError("the lease's second connection: connection refused", setting="journal")

    monkeypatch.setattr(Lease, "second_connection", refused)
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with running_fake(ceiling=1000, rate=5000) as fake:
        config = ApiConfig(base_url=fake.url, workspace_keys=[Secret("test-key-ws1")])
        with pytest.raises(JournalError, match="second connection"):
            submit_sync(path, config=config, settings=SubmitSettings(journal=pg_database, job="lease-fails", interval=0.05,
                                                                      ceiling=1000))


def test_no_room_to_set_ids_aside_is_one_line_naming_tmpdir(small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the ids kept in memory, `plan` sets them aside under TMPDIR: on a disk that fills, one UsageError naming
    the folder and TMPDIR (exit 2), and nothing is left behind on that disk."""
    import tempfile

    from gatekeeper import plan

    path = write_jsonl(small_disk.parent / "in.jsonl", [req(f"t-{i:05d}") for i in range(6000)])  # 96 KB set aside
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk))
    with pytest.raises(UsageError) as caught:
        plan(path, ids_in_memory=100)
    message = str(caught.value)
    assert f"cannot set custom_ids aside in {small_disk}" in message and "No space left on device" in message
    assert caught.value.setting == "TMPDIR" and caught.value.exit_code == ExitCode.USAGE
    assert list(small_disk.iterdir()) == []
