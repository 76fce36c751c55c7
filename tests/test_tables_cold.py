"""Table jobs as a user meets them cold (the tester's findings of issue 64): a table the job cannot run is refused
in one line before anything is sent, in `plan` as in `submit`; a full disk under the state folder is one line
naming the file; `results`, `report` and `cancel` find a table job by its table; `plan` judges rows as `submit`
does. The CLI against the fake, where users see it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gatekeeper.tables._where import default_state_dir
from tests.fakes import env_for, running_fake
from tests.runs import gk

MODEL = "claude-haiku-4-5-20251001"
FAST = ["--interval", "0.05", "--reconcile-grace", "1", "--max-rpm", "60000"]


def _opts(template: str = "B {body}", max_tokens: str = "20") -> list[str]:
    return ["--template", template, "--model", MODEL, "--max-tokens", max_tokens, "--id-column", "id"]


def _state(table: Any) -> Path:
    return default_state_dir(str(table), os.environ, create=False)


def _said(stderr: str) -> list[str]:
    """What a run said on stderr for people (its JSON events left out)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("{")]


# -- F3: a column name twice ----------------------------------------------------------------------------------

def _duplicated(path: Path) -> None:
    if path.suffix == ".csv":
        path.write_text("id,body,body\n1,a,b\n")
    else:
        pq.write_table(pa.Table.from_arrays([pa.array(["1"]), pa.array(["a"]), pa.array(["b"])],
                                            names=["id", "body", "body"]), path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_column_named_twice_is_refused_before_anything_is_sent(tmp_path: Path, suffix: str) -> None:
    """`plan` and `submit`: one line naming the column, exit 2, nothing created, no state folder; the table with the
    column renamed then runs (and a paid row is never bought again: its request is the same)."""
    table = tmp_path / f"dup{suffix}"
    _duplicated(table)
    out = tmp_path / "dup_out.csv"
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        for command in (["plan", str(table)], ["submit", str(table), *FAST, "--out", str(out)]):
            done = gk([*command, *_opts()], env)
            said = _said(done.stderr)
            assert done.returncode == 2 and len(said) == 1 and "Traceback" not in done.stderr, done.stderr
            assert "has the column 'body' 2 times" in said[0] and "rename" in said[0], said[0]
        assert fake.org.records.creates == 0 and not out.exists() and not _state(table).exists()
        renamed = pa.table({"id": ["1"], "body": ["a"], "body_2": ["b"]})
        pq.write_table(renamed, table) if suffix == ".parquet" else table.write_text("id,body,body_2\n1,a,b\n")
        assert gk(["submit", str(table), *_opts(), *FAST, "--out", str(out)], env).returncode == 0
        _duplicated(table)  # (a row paid for, then the column doubled again: still one line, nothing bought)
        again = gk(["submit", str(table), *_opts(), *FAST, "--out", str(out)], env)
        assert again.returncode == 2 and "2 times" in again.stderr and fake.org.records.creates == 1


# -- F4: a full disk under --state ------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    from tests.test_errors import _mounted

    with _mounted(tmp_path / "disk", "16k") as disk:
        yield disk


def test_a_full_disk_under_the_state_folder_is_one_line_naming_the_file(small_disk: Path) -> None:
    """A table job's state on a disk that fills, grown run by run: each run that meets the full disk stops with one
    line naming the file in the state folder and --state (never --out, which was not the file), exit 2; given room,
    a rerun finishes the job with every row sent once."""
    from tests.test_errors import _grow

    table = small_disk.parent / "big.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(600)], "body": [f"text number {i} " * 10 for i in range(600)]}),
                   table)
    state, out = small_disk / "st", small_disk.parent / "out.parquet"
    failures = []
    with running_fake(ceiling=10_000, rate=5000) as fake:
        env = env_for(fake)
        for size in ("16k", "64k", "128k", "256k", "512k", "768k", "20m"):
            _grow(small_disk, size)
            done = gk(["submit", str(table), *_opts("Q {body}"), *FAST, "--state", str(state), "--out", str(out),
                       "--json"], env)
            if done.returncode == 0:
                break
            said = _said(done.stderr)
            assert done.returncode == 2 and len(said) == 1 and "Traceback" not in done.stderr, done.stderr
            assert str(state) in said[0] and "--out" not in said[0], said[0]
            assert "No space left on device" in said[0] or "the disk holding it is full" in said[0], said[0]
            failures.append(said[0])
        assert done.returncode == 0, done.stderr[-2000:]
        created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
        assert len(created) == len(set(created)) == 600 and fake.org.records.succeeded_twice == 0
    assert pq.read_table(out).num_rows == 600
    assert len(failures) >= 2, f"the disk filled too seldom to prove anything: {failures}"
