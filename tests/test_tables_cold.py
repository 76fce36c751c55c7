"""Table jobs as a user meets them cold (the tester's findings of issue 64): a table the job cannot run is refused
in one line before anything is sent, in `plan` as in `submit`; a full disk under the state folder is one line
naming the file; `results`, `report` and `cancel` find a table job by its table; `plan` judges rows as `submit`
does. The CLI against the fake, where users see it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gatekeeper.tables._where import default_state_dir
from tests.fakes import env_for, running_fake
from tests.runs import gk, said

MODEL = "claude-haiku-4-5-20251001"
FAST = ["--interval", "0.05", "--reconcile-grace", "1", "--max-rpm", "60000"]


def _opts(template: str = "B {body}", max_tokens: str = "20") -> list[str]:
    return ["--template", template, "--model", MODEL, "--max-tokens", max_tokens, "--id-column", "id"]


def _state(table: Any) -> Path:
    return default_state_dir(str(table), os.environ, create=False)


def _said(stderr: str) -> list[str]:
    """What a run said on stderr for people (its JSON events left out, its error under --json as its line)."""
    return said(stderr)


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


# -- F5: results, report and cancel find a table job by its table ------------------------------------------------

def test_results_report_and_cancel_find_a_table_job_by_its_table(tmp_path: Path) -> None:
    """A run killed right after its second create, its batches still in flight: `cancel TABLE` cancels them (no run
    folder named), `report TABLE` draws that run and `results TABLE` exports it, saying where the result table
    is; `--state` given the table job's folder (as submit was) finds the same run."""
    table = tmp_path / "t1.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(30)], "body": [f"row {i}" for i in range(30)]}), table)
    with running_fake(rate=0.0) as fake:
        env = env_for(fake)
        killed = gk(["submit", str(table), *_opts(), *FAST, "--max-requests", "10"], env, crash_at="after-create:2")
        assert killed.returncode == -9, killed.stderr[-2000:]
        report = gk(["report", str(table), "--json"], env)
        assert report.returncode == 0 and "the table job's run" in report.stderr, report.stderr
        canceled = gk(["cancel", str(table), "--json"], env)
        assert canceled.returncode == 0, canceled.stderr
        statuses = sorted(b.status for b in fake.org.batches.values())  # (the second's create, not yet journaled,
        assert statuses == ["canceling", "in_progress"], statuses      # is reconciled and canceled by the rerun)
        exported = tmp_path / "r.jsonl"
        results = gk(["results", str(table), "--out", str(exported), "--json"], env)
        assert results.returncode == 0 and exported.exists(), results.stderr
        assert str(_state(table) / "result.parquet") in results.stderr
        by_folder = gk(["report", "--state", str(_state(table)), "--json"], env)
        run = report.stderr.split("the table job's run ")[1].split()[0]
        assert by_folder.returncode == 0 and f"run {run} in" in by_folder.stderr, by_folder.stderr
        rerun = gk(["submit", str(table), *_opts(), *FAST, "--max-requests", "10", "--json"], env)
        assert rerun.returncode == 1, rerun.stderr[-2000:]
        summary = orjson.loads(rerun.stdout)
        assert summary["canceled"] and summary["sent"] == 0 and fake.org.records.creates == 2  # (the cancel holds)
        assert "unsent" in summary["by_status"] and summary["earlier"], summary
        untouched = tmp_path / "t2.parquet"
        pq.write_table(pa.table({"id": ["a"], "body": ["b"]}), untouched)
        never = gk(["results", str(untouched)], env)
        assert never.returncode == 2 and len(_said(never.stderr)) == 1 and "no run" in never.stderr, never.stderr


# -- F2: plan judges rows as submit does ------------------------------------------------------------------------

@pytest.mark.parametrize("model, max_tokens, reason", [
    (MODEL, "999999", "above the model's limit of 64,000"),
    ("claude-nope-9", "20", "not a model the Models API knows"),
])
def test_plan_of_a_table_judges_rows_as_submit_does(tmp_path: Path, model: str, max_tokens: str, reason: str) -> None:
    """With a key, `plan TABLE` asks the Models API as `submit` does: a max_tokens over the model's most, or a model
    it does not know, rejects every row in plan (exit 1, nothing to send) as submit rejects them, each row a record
    of `rejected` with its row and reason (as a null row's, and as the JSONL plan's lines); a sound spec's estimate
    is measured by count_tokens."""
    table = tmp_path / "n1.parquet"
    body = [None if i == 4 else f"q {i}" for i in range(30)]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(30)], "body": body}), table)
    spec = ["--template", "Q {body}", "--model", model, "--max-tokens", max_tokens, "--id-column", "id"]
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        planned = gk(["plan", str(table), *spec, "--json"], env)
        assert planned.returncode == 1, planned.stdout[-2000:]
        j = orjson.loads(planned.stdout)
        assert (j["to_send"], j["invalid"], len(j["errors"]), j["rejected_count"]) == (0, 29, 29, 30), j
        assert j["errors"][0]["row"] == 1 and reason in j["errors"][0]["reason"], j["errors"][0]
        assert [r["row"] for r in j["rejected"]] == list(range(1, 31)), j["rejected"]
        assert j["rejected"][0] == {"row": 1, "custom_id": "r0", "reason": j["errors"][0]["reason"]}
        assert j["rejected"][4] == {"row": 5, "custom_id": "r4", "reason": "column 'body' is null"}
        said = gk(["plan", str(table), *spec], env)
        assert j["errors"][-1]["row"] == 30 and "rejected: 30" in said.stdout and said.returncode == 1, said.stdout
        assert "  rejected: row 5: column 'body' is null" in said.stdout and "... and 10 more" in said.stdout
        lines = tmp_path / "n1.jsonl"  # (the JSONL plan of the same requests: its rejections by line, the same keys)
        lines.write_bytes(b"".join(orjson.dumps({"custom_id": f"r{i}", "params": {
            "model": model, "max_tokens": int(max_tokens), "messages": [{"role": "user", "content": "Q x"}]}}) + b"\n"
            for i in range(3)))
        jsonl = orjson.loads(gk(["plan", str(lines), "--json"], env).stdout)
        assert [(e["line"], e["custom_id"]) for e in jsonl["errors"]] == [(1, "r0"), (2, "r1"), (3, "r2")]
        assert reason in jsonl["errors"][0]["reason"] and set(jsonl["errors"][0]) - {"line"} == set(j["rejected"][0]) - {"row"}
        submitted = gk(["submit", str(table), *spec, *FAST, "--json"], env)
        assert submitted.returncode == 1 and orjson.loads(submitted.stdout)["by_status"] == {"rejected": 30}
        sound = gk(["plan", str(table), *spec[:2], "--model", MODEL, "--max-tokens", "20", "--id-column", "id",
                    "--json"], env)
        ok = orjson.loads(sound.stdout)
        assert sound.returncode == 1 and ok["estimate"]["method"].startswith("count_tokens")  # (the null row)
        assert (ok["rejected_count"], ok["invalid"], ok["to_send"]) == (1, 0, 29), ok
        assert fake.org.records.creates == 0


# -- F12: --out under a file ------------------------------------------------------------------------------------

def test_a_result_under_a_file_says_it_is_not_a_folder(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a"], "body": ["b"]}), table)
    (tmp_path / "afile").write_text("x")
    with running_fake() as fake:
        done = gk(["submit", str(table), *_opts(), "--out", str(tmp_path / "afile" / "r.parquet")], env_for(fake))
        assert fake.org.records.creates == 0
    said = _said(done.stderr)
    assert done.returncode == 2 and len(said) == 1 and "is a file, not a folder (--out)" in said[0], said


# -- issue 59 F4: a header alone, without a newline -------------------------------------------------------------

def test_a_csv_of_a_header_alone_without_a_newline_is_an_empty_table(tmp_path: Path) -> None:
    """`printf 'id,qty,zip,body' > h.csv`: no row, as with the newline (exit 0, an empty result of its columns),
    not "the CSV is empty"; a file of nothing at all still is."""
    table, out = tmp_path / "h.csv", tmp_path / "out.parquet"
    table.write_bytes(b"id,qty,zip,body")
    with running_fake(rate=2000) as fake:
        planned = gk(["plan", str(table), *_opts("{body}"), "--json"], env_for(fake))
        assert planned.returncode == 0 and orjson.loads(planned.stdout)["rows"] == 0, planned.stderr
        done = gk(["submit", str(table), *_opts("{body}"), *FAST, "--out", str(out), "--json"], env_for(fake))
        assert done.returncode == 0 and orjson.loads(done.stdout)["rows"] == 0, done.stderr[-2000:]
        got = pq.read_table(out)
        assert got.num_rows == 0 and got.column_names[:5] == ["id", "qty", "zip", "body", "custom_id"]
        table.write_bytes(b"")
        empty = gk(["plan", str(table), *_opts("{body}")], env_for(fake))
        assert empty.returncode == 2 and "the CSV is empty (not even a header row)" in empty.stderr
        assert fake.org.records.creates == 0


# -- issue 59 F6: a rejected row keeps its id; plan while a submit runs -----------------------------------------

@pytest.mark.parametrize("template, qty", [("{body}", [1, 2, 3]), ("{body} {qty}", [1, None, 3])],
                         ids=["text-null", "int-null"])
def test_a_row_rejected_for_its_values_keeps_its_id(tmp_path: Path, template: str, qty: list[Any]) -> None:
    """A null in a templated column (a text column's, judged by columns; an integer's, row by row) rejects the row,
    and its custom_id is still its id, in `plan --json` and in the result table (a cold tester read None)."""
    table, out = tmp_path / "t.parquet", tmp_path / "out.parquet"
    body = ["x", None, "z"] if template == "{body}" else ["x", "y", "z"]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "qty": pa.array(qty, pa.int64()), "body": body}), table)
    with running_fake(rate=2000) as fake:
        planned = gk(["plan", str(table), *_opts(template), "--json"], env_for(fake))
        j = orjson.loads(planned.stdout)
        assert planned.returncode == 1 and [(r["row"], r["custom_id"]) for r in j["rejected"]] == [(2, "b")], j
        done = gk(["submit", str(table), *_opts(template), *FAST, "--out", str(out), "--json"], env_for(fake))
        assert done.returncode == 1, done.stderr[-2000:]
        got = pq.read_table(out).to_pydict()
        assert got["custom_id"] == ["a", "b", "c"] and got["status"] == ["succeeded", "rejected", "succeeded"]


def test_plan_says_a_submit_is_running_the_run_now(tmp_path: Path) -> None:
    """While a submit of the table is live, `plan` says a submit is running its run (a second one is refused), not
    that "submit collects it first"; once that submit has stopped, it says the next submit collects it."""
    from tests.runs import start_and_wait_for_create

    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(20)], "body": [f"q {i}" for i in range(20)]}), table)
    with running_fake(rate=0.0) as fake:
        env = env_for(fake)
        proc = start_and_wait_for_create(["submit", str(table), *_opts(), *FAST], env, fake)
        try:
            live = gk(["plan", str(table), *_opts()], env)
            assert "a submit is running it now" in live.stdout and "collects it first" not in live.stdout, live.stdout
            second = gk(["submit", str(table), *_opts(), *FAST], env)
            assert second.returncode == 2 and "another gatekeeper is running" in second.stderr
        finally:
            proc.kill()
            proc.wait(timeout=30)
        j = orjson.loads(gk(["plan", str(table), *_opts(), "--json"], env).stdout)
        assert [u["running"] for u in j["unfinished"]] == [False]
        after = gk(["plan", str(table), *_opts()], env)
        assert "submit collects it first" in after.stdout, after.stdout
