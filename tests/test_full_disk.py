"""A full disk under a run with real-time calls out (issue 58, point 3): the run stops as any error stop does, waits
for the calls out, journals their answers in the room its ballast frees, and the rerun buys none of them again.
End to end over real HTTP against the fake: on a real tmpfs filled while calls are out (root, or skipped), and on a
journal whose COMMITs find no room once calls are out (anywhere: the disk simulated where the journal writes)."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gatekeeper import ApiConfig, JournalError, Secret, SubmitSettings, submit
from gatekeeper._errors import OutputError, disk_full
from gatekeeper.state import _journal
from gatekeeper.state._ballast import Ballast, room_for
from gatekeeper.state._db import SqliteDb, sqlite_said
from gatekeeper.state._journal import Journal
from gatekeeper.testing import FakeRealtime
from tests.fakes import ADMIN, WS1, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import events, gk, output_ids, start

# A stalled batch lane whose batches are canceled a second or two in, their requests sent real time (test_deadline's
# AT_ONCE); each answer takes 3 s, so 64 calls are out when the disk fills.
ARGS = ["--deadline", "40s", "--deadline-slack", "38", "--interval", "0.1", "--max-rpm", "60000", "--reconcile-grace", "1",
        "--max-requests", "20", "--json"]
SLOW = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, latency=3.0)


def _input(tmp_path: Path, n: int) -> tuple[Path, set[str]]:
    ids = [f"q{i:04d}" for i in range(n)]
    return write_jsonl(tmp_path / "in.jsonl", [req(cid, text=f"question {cid}") for cid in ids]), set(ids)


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (skipped where mounting is not allowed)."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the simulated disk below runs anywhere)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(path: Path) -> None:
    """Write zeros to `path` until the disk holding it is full."""
    block = b"\0" * (1 << 16)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return


def test_a_full_tmpfs_settles_the_calls_out_and_the_rerun_buys_none_again(tmp_path: Path) -> None:
    """A cold tester's finding: 100 requests real time, the journal and the results on a 4 MB tmpfs filled while 64
    calls are out. The run stops with the full disk's line (exit 2), after saying it waits for the calls out
    (`realtime_stopping`, the full disk its reason) and freeing its ballast; every call out answered, the rerun (the
    disk freed, the tmpfs still 4 MB: the journal's log stays small) finishes with each request sent once, none
    counted as a possible double charge. Before, the run stopped at once: 18 to 36 of 100 sent again."""
    path, expected = _input(tmp_path, 100)
    with _tmpfs(tmp_path / "tfs", "4m") as tfs, running_fake(rate=0.0, realtime=SLOW) as fake:
        args = ["submit", str(path), "--state", str(tfs / "st"), "--out", str(tfs / "res.jsonl"), *ARGS]
        run = start(args, env_for(fake))
        fake.org.wait_for(lambda _: fake.realtime.records.calls >= 64, "64 calls out", timeout=60)
        _fill(tfs / "filler")
        _, err = run.communicate(timeout=120)
        assert run.returncode == 2, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert ("No space left" in last or "disk is full" in last) and "Traceback" not in err, last
        seen = events(err)
        stopping = [e for e in seen if e["event"] == "realtime_stopping"]
        assert len(stopping) == 1 and stopping[0]["calls_out"] > 0, err[-3000:]
        assert "No space left" in stopping[0]["reason"] or "disk is full" in stopping[0]["reason"]
        assert [e["bytes"] for e in seen if e["event"] == "ballast_freed"] == [room_for(64, 64)]
        assert not [e for e in seen if e["event"] == "realtime_unrecorded"]
        assert fake.realtime.records.answered == fake.realtime.records.calls  # (none cut off)
        (tfs / "filler").unlink()
        done = gk(args, env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["succeeded"] == 100 and s["lanes"]["realtime"]["possible_double_charges"] == 0, (err[-4000:], done.stderr[-3000:])
        assert fake.realtime.records.calls == 100 and "realtime_unknown" not in done.stderr
        ids = output_ids(tfs / "res.jsonl")
        assert len(ids) == len(set(ids)) and set(ids) == expected
        assert not (tfs / "st" / Ballast.NAME).exists()  # (the run's own, gone with it)


class FillingJournalDisk:
    """The journal's disk, full from the moment `armed()` holds: every COMMIT of the journal in `folder` then finds
    no room (SQLITE_FULL, as a write-ahead log's append does), until the ballast there is deleted; then the room it
    held is taken, `COMMIT_ROOM` bytes a commit (a record and its pages), until it is used up."""

    COMMIT_ROOM = 16_384

    def __init__(self, folder: Path, armed: Callable[[], bool]) -> None:
        self.folder, self.armed = folder, armed
        self.full = False
        self.held = 0  # bytes the ballast held when last seen
        self.used = 0
        self.refused = 0

    def execute(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def execute(db: SqliteDb, sql: str, args: Any = ()) -> Any:
            if sql == "COMMIT" and str(db.path).startswith(str(self.folder)) and not self._room():
                self.refused += 1
                exc = sqlite3.OperationalError("database or disk is full")
                exc.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
                raise db.error(sqlite_said(db.where, exc, None)) from exc
            return original(db, sql, args)
        return execute

    def _room(self) -> bool:
        self.full = self.full or self.armed()
        if not self.full:
            return True
        ballast = self.folder / Ballast.NAME
        if ballast.exists():
            self.held = ballast.stat().st_size
            return False
        if self.used + self.COMMIT_ROOM > self.held:
            return False
        self.used += self.COMMIT_ROOM
        return True


@pytest.mark.anyio
async def test_a_journal_that_finds_no_room_settles_the_calls_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same without root: 80 requests real time, each answer taking 3 s; once 40 calls are out, the journal's
    disk is full (its COMMITs refused). The run stops with the journal's line, saying it waits for the calls out;
    each answer is journaled in the room the ballast frees, no call is left out (`sent`); the rerun, the disk freed,
    sends nothing again. Before, the lane's first write that found no room ended the run at once, the calls out
    cut off and sent again by the rerun."""
    path, expected = _input(tmp_path, 80)
    state = tmp_path / "s"
    seen: list[tuple[str, dict]] = []
    with running_fake(rate=0.0, realtime=SLOW) as fake:
        disk = FillingJournalDisk(state, lambda: fake.realtime.records.calls >= 40)
        monkeypatch.setattr(SqliteDb, "execute", disk.execute(SqliteDb.execute))
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        settings = SubmitSettings(state_dir=state, interval=0.1, max_rpm=60_000, deadline=time.time() + 40, deadline_slack=38,
                                  reconcile_grace=1)
        with pytest.raises(JournalError, match="disk is full"):
            await submit(path, config=config, settings=settings, on_event=lambda e, f: seen.append((e, f)))
        monkeypatch.undo()  # (room made)
        journal = Journal.open(state)
        try:
            out = journal.db.execute("SELECT COUNT(*) FROM realtime WHERE state = 'sent'").fetchone()[0]
            assert out == 0, f"{out} calls left out: each is sent again, a possible double charge"
        finally:
            journal.close()
        stopping = [f for e, f in seen if e == "realtime_stopping"]
        assert len(stopping) == 1 and stopping[0]["calls_out"] > 0 and "disk is full" in stopping[0]["reason"]
        assert fake.realtime.records.answered == fake.realtime.records.calls  # (every call out answered before the stop)
        assert [e for e, _ in seen if e == "ballast_freed"] == ["ballast_freed"]
        assert not [f for e, f in seen if e == "realtime_unrecorded"]
        assert disk.refused > 0 and 0 < disk.used <= disk.held  # (the ballast's room, and no more, was used)
        summary = await submit(path, config=config, settings=settings)
        assert summary.succeeded == 80 and summary.lanes["realtime"]["possible_double_charges"] == 0
        assert fake.realtime.records.calls == 80
    ids = output_ids(state / "results.jsonl")
    assert len(ids) == len(set(ids)) and set(ids) == expected


def test_the_ballast_holds_its_room_and_frees_it(tmp_path: Path) -> None:
    """The ballast is allocated (not sparse), grows only, frees its bytes once, and is never made again after."""
    ballast = Ballast(tmp_path)
    assert ballast.hold(1 << 20) and ballast.path is not None
    assert ballast.path.stat().st_blocks * 512 >= 1 << 20  # (blocks on the disk, not a sparse file's promise)
    assert ballast.hold(1 << 10) and ballast.path.stat().st_size == 1 << 20  # (never shrunk)
    assert ballast.release() == 1 << 20 and not ballast.path.exists()
    assert ballast.hold(1 << 20) and not ballast.path.exists() and ballast.release() == 0
    assert Ballast(None).hold(1 << 30)  # (a shared journal: nothing kept here)
    assert room_for(64, 64) < room_for(64, 8192) < 64 * (8192 * 4 + 20_000)


def test_a_full_disk_is_told_from_other_failures() -> None:
    """What frees the ballast: a write that found no room, in a file (ENOSPC, a quota) or in SQLite (SQLITE_FULL)."""
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
    try:
        raise JournalError("journal: database or disk is full") from full
    except JournalError as exc:
        assert disk_full(exc)
    try:
        raise OutputError("cannot write") from OSError(errno.EDQUOT, "Disk quota exceeded")
    except OutputError as exc:
        assert disk_full(exc)
    try:
        raise OutputError("cannot write") from OSError(errno.EACCES, "Permission denied")
    except OutputError as exc:
        assert not disk_full(exc)


def test_a_commit_that_fails_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A COMMIT that finds no room leaves SQLite's transaction open: it is rolled back, so the run's next change
    fails on the disk (or succeeds in the room freed), never on "a transaction within a transaction"."""
    journal = Journal.open(tmp_path)
    original = SqliteDb.execute
    refuse = [True]

    def execute(db: SqliteDb, sql: str, args: Any = ()) -> Any:
        if sql == "COMMIT" and refuse[0]:
            refuse[0] = False
            raise db.error("journal: database or disk is full")
        return original(db, sql, args)

    monkeypatch.setattr(SqliteDb, "execute", execute)
    try:
        with pytest.raises(JournalError, match="disk is full"):
            journal.set_meta("probe", 1)
        assert not journal.db.in_transaction and journal.get_meta("probe") is None
        journal.set_meta("probe", 2)
        assert journal.get_meta("probe") == 2
    finally:
        journal.close()


def test_the_journal_log_is_checkpointed_and_kept_small(tmp_path: Path) -> None:
    """The journal's write-ahead log is checkpointed every WAL_PAGES and cut back to WAL_KEEP once checkpointed:
    a thousand small changes (a real-time lane's records) leave it under half a megabyte, where SQLite's defaults let
    it reach 4 MB; a large change grows it, and the next checkpoint cuts it back."""
    journal = Journal.open(tmp_path)
    wal = tmp_path / (Journal.FILE + "-wal")
    try:
        assert journal.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == _journal.WAL_PAGES
        biggest = 0
        for i in range(1000):
            journal.set_meta(f"k{i % 50}", f"{i:04d}" * 50)
            biggest = max(biggest, wal.stat().st_size)
        assert biggest < (_journal.WAL_PAGES + 10) * 4120
        journal.set_meta("large", "y" * (4 << 20))  # (a batch's settlement: one transaction of 4 MB)
        assert wal.stat().st_size > 4 << 20
        for i in range(2 * _journal.WAL_PAGES):
            journal.set_meta(f"k{i % 50}", f"{i:04d}" * 50)
        assert wal.stat().st_size <= max(_journal.WAL_KEEP, (_journal.WAL_PAGES + 10) * 4120)
    finally:
        journal.close()
