"""The two-process reader gives exactly the one-process report."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import orjson
import pytest

import gatekeeper.input._parallel
from gatekeeper import Limits, plan
from gatekeeper.input._parallel import forked_map, piece_bounds
from tests.helpers import req


def _messy_file(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = [b"\xef\xbb\xbf" + orjson.dumps(req("first"))]
    for i in range(n):
        roll = rng.random()
        if roll < 0.05:
            lines.append(orjson.dumps(req(f"id{rng.randrange(i + 1)}")))  # a likely duplicate, often across pieces
        elif roll < 0.08:
            lines.append(b'{"custom_id": "broken", ')
        elif roll < 0.10:
            lines.append(b"")
        elif roll < 0.12:
            lines.append(orjson.dumps(req(f"bad{i}", max_tokens=0)))
        else:
            lines.append(orjson.dumps(req(f"id{i}", model=rng.choice(["m-a", "m-b", "m-c"]), text="x" * rng.randrange(300))))
    path.write_bytes(b"\r\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_parallel_report_equals_sequential(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same batches, rejections (in line order), duplicates across pieces, models and largest request."""
    monkeypatch.setattr(gatekeeper.input._parallel, "PIECE_BYTES", 8192)  # many small pieces
    path = _messy_file(tmp_path / "in.jsonl", 3000, seed)
    limits = Limits(max_requests=170, max_bytes=40_000)
    one = plan(path, limits=limits).to_json()
    two = plan(path, limits=limits, workers=2).to_json()
    assert one == two
    assert any("duplicate" in e["reason"] for e in two["errors"])


def test_piece_bounds_start_at_line_starts(tmp_path: Path) -> None:
    """Pieces tile the file and each starts right after a newline."""
    path = tmp_path / "f"
    data = b"".join(b"x" * (i % 37) + b"\n" for i in range(2000))
    path.write_bytes(data)
    bounds = piece_bounds(str(path), len(data), 1000)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(data[s - 1:s] == b"\n" for s, _ in bounds[1:])


def test_the_last_pieces_shrink_so_the_workers_end_together(tmp_path: Path) -> None:
    """Full pieces while a lot is left; then a quarter of what is left a worker, down to an eighth of a piece."""
    path = tmp_path / "f"
    data = b"".join(b"y" * 99 + b"\n" for _ in range(100_000))  # 10 MB of 100-byte lines
    path.write_bytes(data)
    sizes = [b - a for a, b in piece_bounds(str(path), len(data), 1 << 20, workers=2)]
    assert 1 << 20 <= sizes[0] < (1 << 20) + 100 and sizes.index(min(sizes[:-1])) > len(sizes) // 2
    assert all(a >= b for a, b in zip(sizes, sizes[1:-1]))  # never growing again (the last is what is left)
    assert min(sizes[:-1]) >= (1 << 20) // 8 and sum(sizes) == len(data)


def _die(*args: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_worker_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader process killed mid-file (as SIGBUS would, on a file cut short) is an InputError, not a traceback."""
    from gatekeeper._errors import InputError

    monkeypatch.setattr(gatekeeper.input._parallel, "PIECE_BYTES", 8192)
    monkeypatch.setattr(gatekeeper.input._parallel, "scan_piece", _die)
    path = _messy_file(tmp_path / "in.jsonl", 500, 7)
    with pytest.raises(InputError, match="reader process died"):
        plan(path, workers=2)


def test_duplicates_name_their_first_line_across_many_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Line numbers of first sightings are kept relative to each piece: they come back right far into the file."""
    monkeypatch.setattr(gatekeeper.input._parallel, "PIECE_BYTES", 4096)
    lines = [orjson.dumps(req(f"r{i}")) for i in range(4000)] + [orjson.dumps(req("r3999")), orjson.dumps(req("r17"))]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    errors = plan(path, workers=2).errors
    assert [(e.line, e.custom_id) for e in errors] == [(4001, "r3999"), (4002, "r17")]
    assert "first on line 4000" in errors[0].reason and "first on line 18" in errors[1].reason


def test_a_file_that_shrank_under_the_plan_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece past the end of the file (it shrank after being cut) is an InputError naming the file."""
    from gatekeeper._errors import InputError

    path = _messy_file(tmp_path / "in.jsonl", 300, 3)
    size = path.stat().st_size
    monkeypatch.setattr(gatekeeper.input._parallel, "piece_bounds", lambda p, s, n, w: [(0, size // 2), (size // 2, size + 10_000)])
    with pytest.raises(InputError, match="changed while being read"):
        plan(path, workers=2)


_MET = ""  # a file piece 1 makes: piece 0 holds its worker until then, so the other worker must take a piece


def _slow_every_fifth(i: int) -> tuple[int, int]:
    if i == 1:
        Path(_MET).touch()
    if i == 0:  # (on a loaded machine one worker could otherwise take all 40 before the other is scheduled)
        until = time.monotonic() + 60
        while not os.path.exists(_MET) and time.monotonic() < until:
            time.sleep(0.005)
    if i % 5 == 0:
        time.sleep(0.02)  # (slow work, not a wait: the later pieces are made first and must be held back)
    return i, os.getpid()


@pytest.mark.parametrize("ahead", [1, 8])
def test_pieces_come_back_in_order_whichever_worker_ends_first(monkeypatch: pytest.MonkeyPatch, ahead: int,
                                                               tmp_path: Path) -> None:
    """Workers claim pieces as they free up; the parent yields them in input order, holding at most `MAX_AHEAD`
    out of order (1: it then listens only for the worker that has the piece it needs)."""
    monkeypatch.setattr(gatekeeper.input._parallel, "MAX_AHEAD", ahead)
    monkeypatch.setattr(sys.modules[__name__], "_MET", str(tmp_path / "met"))
    got = list(forked_map(_slow_every_fifth, 40, 2, "in.jsonl"))  # type: ignore[arg-type]
    assert [i for i, _ in got] == list(range(40))
    assert len({pid for _, pid in got}) == 2  # both workers took pieces


@pytest.mark.parametrize("workers", [None, 2])
@pytest.mark.parametrize("limit", [1, 40, 1500])
def test_ids_spilled_past_the_limit_give_the_same_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          workers: int | None, limit: int) -> None:
    """Past `ids_in_memory` the ids go to disk and repeats are told at the end, then the file is read again told them:
    the report is the one an index in memory gives, duplicates (first lines included) and batch edges alike."""
    import gatekeeper.input._duplicates as dupes

    monkeypatch.setattr(gatekeeper.input._parallel, "PIECE_BYTES", 8192)
    monkeypatch.setattr(dupes, "FLUSH", 64)  # many blocks a part
    lates: list[dict[int, int]] = []
    late = dupes.DuplicateCheck.late
    monkeypatch.setattr(dupes.DuplicateCheck, "late", lambda self: lates.append(late(self)) or lates[-1])
    path = _messy_file(tmp_path / "in.jsonl", 3000, 7)
    limits = Limits(max_requests=170, max_bytes=40_000)
    kept = plan(path, limits=limits, workers=workers).to_json()
    assert lates == [{}]  # (under the default limit: nothing spilled, read once)
    lates.clear()
    spilled = plan(path, limits=limits, workers=workers, ids_in_memory=limit).to_json()
    assert spilled == kept
    told = {e["line"] for e in kept["errors"] if "duplicate" in e["reason"]}
    assert len(lates) == 1 and set(lates[0]) == told  # the second reading knew them all


@pytest.mark.parametrize(("ids", "requests", "repeats"), [
    ([f"id{i}" for i in range(500)], 500, 0),  # no repeat at all
    ([f"id{i % 30 if i < 40 else i}" for i in range(300)], 290, 10),  # every repeat told in memory, before the spill
])
def test_a_file_with_no_repeat_past_the_limit_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           ids: list[str], requests: int, repeats: int) -> None:
    import gatekeeper.input._planner as planner

    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(req(cid)) + b"\n" for cid in ids))
    reads = []
    scan = planner.scan
    monkeypatch.setattr(planner, "scan", lambda *a, **k: reads.append(k["repeats"]) or scan(*a, **k))
    report = plan(path, ids_in_memory=100)
    assert reads == [None] and report.requests == requests and len(report.errors) == repeats


def test_no_room_to_spill_is_one_line_naming_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk (here, a folder that cannot be written) under TMPDIR: a UsageError naming TMPDIR, no traceback."""
    import tempfile

    from gatekeeper import UsageError

    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(req(f"id{i}")) + b"\n" for i in range(50)))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing" / "folder"))
    with pytest.raises(UsageError, match="cannot set custom_ids aside in .*missing/folder.*TMPDIR") as caught:
        plan(path, ids_in_memory=10)
    assert caught.value.setting == "TMPDIR"


def test_a_pipe_keeps_its_ids_in_memory(tmp_path: Path) -> None:
    """Standard input cannot be read again: no limit, the repeats told as they come."""
    import subprocess
    import sys

    lines = b"".join(orjson.dumps(req(f"id{i % 40}")) + b"\n" for i in range(60))
    code = ("import json, gatekeeper; r = gatekeeper.plan('-', ids_in_memory=5); "
            "print(json.dumps([r.requests, len(r.errors)]))")
    out = subprocess.run([sys.executable, "-c", code], input=lines, capture_output=True, check=True, timeout=60)
    assert orjson.loads(out.stdout) == [40, 20]


@pytest.mark.parametrize(("known", "lines", "base", "found"), [
    ({}, [1, 2, 3], 0, []),
    ({5: 1}, [1, 2, 3], 0, []),  # after the run
    ({5: 1}, [1, 2, 3], 2, [(2, 1)]),  # base 2: relative line 3 is line 5
    ({4: 2}, [1, 3, 5], 0, []),  # between two lines of the run (a rejected line, not a request)
    ({1: 0, 9: 3, 12: 9}, [1, 4, 9, 12], 0, [(0, 0), (2, 3), (3, 9)]),
    ({7: 2}, [], 0, []),
])
def test_known_repeats_name_their_positions_in_a_run(known: dict[int, int], lines: list[int], base: int,
                                                    found: list[tuple[int, int]]) -> None:
    from array import array

    from gatekeeper.input._duplicates import KnownRepeats

    rel = array("I", lines)
    assert KnownRepeats(known).add_many(rel, array("q", [0] * len(rel)), array("i", [0] * len(rel)), base) == found



@pytest.mark.parametrize(("expected", "parts"), [
    (0, 64), (1_000_000, 64), (64 << 17, 64), ((64 << 17) + 1, 128), (10_000_000, 128), (100_000_000, 1024),
    (10**12, 4096),
])
def test_a_spill_has_parts_of_about_131072_ids(expected: int, parts: int) -> None:
    """Parts grow in number with the file, not in size (up to 4,096: their bits stay above the home slots)."""
    from gatekeeper.input._duplicates import parts_for

    assert parts_for(expected) == parts
