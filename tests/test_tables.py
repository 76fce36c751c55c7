"""Table jobs (issue 46): a table and a template in, one result row per input row out, in order; rows judged before
anything is sent; incremental and exactly once per row across reruns, grown tables and kill -9; the library takes
pyarrow, pandas and polars tables; object storage through a real S3 protocol server on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper import ApiConfig, Secret, SubmitSettings, UsageError
from gatekeeper._prices import load_prices
from gatekeeper.tables._batch import judge_batch
from gatekeeper.tables._job import submit_table
from gatekeeper.tables._rows import Judged, TableSpec, custom_id_of, judge_row, result_columns
from gatekeeper.tables._template import parse_template
from tests.fakes import WS1, env_for, running_fake
from tests.runs import gk

MODEL = "claude-haiku-4-5-20251001"
OPTS = ["--template", "Ticket {id}: {body} {{json}}", "--model", MODEL, "--max-tokens", "20", "--interval", "0.05",
        "--reconcile-grace", "1", "--max-rpm", "60000"]


# -- pure parts -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, row, rendered, columns", [
    ("Hello {name}", {"name": "Ada"}, "Hello Ada", ("name",)),
    ("{a}{b}{a}", {"a": 1, "b": 2.5}, "12.51", ("a", "b")),
    ("braces {{literal}} {x}", {"x": "y"}, "braces {literal} y", ("x",)),
    ("a column with a space: {my col}", {"my col": "v"}, "a column with a space: v", ("my col",)),
    ("no fields", {}, "no fields", ()),
    ("", {}, "", ()),
    ("{a:b} and {x!r}", {"a:b": 1, "x!r": "y"}, "1 and y", ("a:b", "x!r")),  # (a field is the column's name as written)
    ("{x:>10}", {"x:>10": "v"}, "v", ("x:>10",)),
    ("{a[0]}.{b.c}", {"a[0]": 1, "b.c": 2}, "1.2", ("a[0]", "b.c")),
    ("ratio 3:1! {{\"k\": {v}}}", {"v": 7}, 'ratio 3:1! {"k": 7}', ("v",)),  # (`:`, `!` as text, in braces too)
    ("{{a:b}} {{x!}}", {}, "{a:b} {x!}", ()),
    ("}}{x}{{", {"x": 0}, "}0{", ("x",)),
])
def test_a_template_renders_each_row(text: str, row: dict, rendered: str, columns: tuple) -> None:
    t = parse_template(text)
    assert t.render(row) == rendered and t.columns == columns


@pytest.mark.parametrize("text, said", [
    ("{", "not closed"), ("}", "lone '}' at character 1"), ("{}", "names no column"), ("{ }", "names no column"),
    ("a {b", "not closed"), ("{a{b}", "not closed"), ("x}y", "lone '}' at character 2"),
])
def test_a_malformed_template_is_a_usage_error(text: str, said: str) -> None:
    with pytest.raises(UsageError, match="--template") as caught:
        parse_template(text)
    assert said in str(caught.value)


@pytest.mark.parametrize("text", ["{a:b} {{x}} {c!}", "}}{{", "plain", "{ spaced }"])
def test_a_templates_text_parses_back_to_itself(text: str) -> None:
    t = parse_template(text)
    assert parse_template(t.text) == t


@pytest.mark.parametrize("value, expected", [
    ("SUP-1234", "SUP-1234"), ("a_b-9", "a_b-9"),
    ("JIRA:SUP-1234", None), (1234, None), ("x" * 65, None), ("", None),
])
def test_an_id_is_kept_when_it_is_a_custom_id_else_mapped(value: Any, expected: str | None) -> None:
    cid = custom_id_of(value, "k")
    assert cid == expected if expected else (cid.startswith("id-") and len(cid) <= 64)
    assert custom_id_of(1234, "k") != custom_id_of("1234", "k")  # (an integer and its text are two ids)


def test_rows_are_judged_null_duplicate_and_sound() -> None:
    spec = TableSpec(parse_template("{body}"), MODEL, 10, id_column="id")
    assert judge_row(spec, {"id": 1, "body": None}, 3, {}).rejected == "row 3: column 'body' is null"
    assert "is on rows 1, 4" in (judge_row(spec, {"id": 7, "body": "x"}, 4, {7: [1, 4]}).rejected or "")
    many = judge_row(spec, {"id": 7, "body": "x"}, 4, {7: list(range(1, 152))}).rejected or ""  # (a cold tester: 151)
    assert "is on rows 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 141 more (ids must be unique)" in many, many
    ok = judge_row(spec, {"id": 7, "body": "x"}, 5, {})
    assert ok.key and ok.params == {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    same = judge_row(TableSpec(parse_template("{body}"), MODEL, 10), {"body": "x"}, 9, {})
    assert same.key == ok.key and same.custom_id == "r-" + ok.key  # without an id column: the request names it


@pytest.mark.parametrize("system, params", [
    (None, {}), ("You sort {kind} tickets", {}), (None, {"temperature": 0, "metadata": {"user_id": "u"}}),
    ("{kind}", {"top_k": 5, "stop_sequences": ["\n\n"], "aaa": 1, "zzz": [1, {"b": 2, "a": 1}]}),
])
def test_a_rows_request_is_exactly_its_params_with_sorted_keys(system: str | None, params: dict) -> None:
    """The joined bytes a row's request is made of are those `orjson.dumps(params, sorted keys)` gives, so its key is
    the same however it is computed (what the answers are kept under)."""
    import orjson as oj

    from gatekeeper.tables._rows import body_of, request_of

    spec = TableSpec.of("Ticket {id}: {body} \u00e9 \"quoted\"", MODEL, 7, system=system, params=params)
    for row in ({"id": 1, "body": "x", "kind": "billing"}, {"id": "é", "body": "\x00\n\"", "kind": "🙂"}):
        assert body_of(spec, row) == oj.dumps(request_of(spec, row), option=oj.OPT_SORT_KEYS)


@pytest.mark.parametrize("result, status, error", [
    ({"type": "succeeded", "message": {"content": [{"type": "text", "text": "a"}, {"type": "tool_use"},
                                                   {"type": "text", "text": "b"}], "stop_reason": "end_turn",
                                       "model": MODEL, "usage": {"input_tokens": 10, "output_tokens": 2}}},
     "succeeded", None),
    ({"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}},
     "errored", "invalid_request_error: bad"),
    ({"type": "expired"}, "expired", "expired"),
    ({"type": "rejected", "reason": "line 1: too big"}, "rejected", "row 2: line 1: too big"),
    (None, "unsent", "not sent: the run did not send it"),  # (a sound row with no answer is not a rejected one)
])
def test_an_answer_becomes_result_columns(result: dict | None, status: str, error: str | None) -> None:
    cols = result_columns(Judged(2, "k", "c"), result, load_prices())
    assert cols["status"] == status and cols["error"] == error
    if status == "succeeded":
        assert cols["text"] == "ab" and cols["input_tokens"] == 10 and cols["cost_usd"] > 0


# -- end to end --------------------------------------------------------------------------------

def _tickets(n: int, start: int = 0) -> pa.Table:
    ids = [f"JIRA:SUP-{i}" if i % 2 else i for i in range(start, start + n)]  # strings of any form, and integers
    return pa.table({"id": [str(i) for i in ids], "body": [f"printer {i} is on fire" + " again" * (i % 9) for i in range(start, start + n)],
                     "n": list(range(start, start + n))})


def _sent(fake: Any) -> int:
    return sum(b.total for b in fake.org.batches.values())


def _state(table: Any) -> Path:
    """A table job's default state folder: the table's, in the user's state folder (the test's own)."""
    import os

    from gatekeeper.tables._where import default_state_dir

    return default_state_dir(str(table), os.environ, create=False)


def test_a_csv_table_through_the_cli_then_a_rerun_a_grown_table_and_a_changed_row(tmp_path: Path) -> None:
    """One result row per input row in input order, every input column unchanged; the rerun sends nothing; a grown
    table and one changed row send only the 5 new and the 1 changed; nothing is ever answered twice."""
    table = tmp_path / "tickets.csv"
    pacsv.write_csv(_tickets(20), table)
    out = tmp_path / "result.parquet"
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        args = ["submit", str(table), *OPTS, "--id-column", "id", "--out", str(out)]
        first = gk(args + ["--json"], env)
        assert first.returncode == 0, first.stderr[-2000:]
        got = pq.read_table(out)
        assert got.column("id").to_pylist() == _tickets(20).column("id").to_pylist()
        assert got.column("n").to_pylist() == [str(i) for i in range(20)]  # (a CSV is read as written: text)
        assert set(got.column("status").to_pylist()) == {"succeeded"}
        assert _sent(fake) == 20 and orjson.loads(first.stdout)["sent"] == 20
        again = gk(args + ["--json"], env)
        assert again.returncode == 0 and orjson.loads(again.stdout)["sent"] == 0 and _sent(fake) == 20
        grown = pa.concat_tables([_tickets(20), _tickets(5, 20)]).to_pylist()
        grown[3]["body"] = "the printer is fine now"
        pacsv.write_csv(pa.Table.from_pylist(grown), table)
        planned = orjson.loads(gk(["plan", str(table), *OPTS[:6], "--id-column", "id", "--json"], env).stdout)
        assert (planned["rows"], planned["answered"], planned["to_send"]) == (25, 19, 6)  # (looked up by key)
        third = gk(args + ["--json"], env)
        assert third.returncode == 0 and orjson.loads(third.stdout)["sent"] == 6 and _sent(fake) == 26
        # (the summary for people says what the run cost, as a JSONL job's does: a cold tester found no cost line)
        cost = orjson.loads(third.stdout)["run"]["cost_usd"]
        from gatekeeper.cli._tables import render_table_result

        assert f"cost      ~${cost:,.2f}" in render_table_result(orjson.loads(third.stdout)).splitlines()
        assert not [x for x in render_table_result(orjson.loads(again.stdout)).splitlines() if x.startswith("cost")]
        final = pq.read_table(out)
        assert final.num_rows == 25 and set(final.column("status").to_pylist()) == {"succeeded"}
        twice = [cid for cid, n in fake.org.records.succeeded.items() if n > 1]
        assert len(twice) == 1  # (the changed row: its new request under its id, the old answer not reused)


def test_bad_rows_are_rejected_by_row_and_the_rest_go_on(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "a", "c", "d"], "body": ["x", "y", "z", None, "w" * 2_000]}), table)
    with running_fake() as fake:
        done = gk(["submit", str(table), "--template", "{body}", "--model", MODEL, "--max-tokens", "999999",
                   "--id-column", "id", "--interval", "0.05", "--json"], env_for(fake))  # (over the model's most)
        plan = gk(["plan", str(table), "--template", "{body}", "--model", MODEL, "--max-tokens", "5", "--id-column",
                   "id", "--json"], env_for(fake))
    result = pq.read_table(_state(table) / "result.parquet").to_pylist()
    assert done.returncode == 1, done.stderr[-2000:]
    assert [r["status"] for r in result] == ["rejected", "rejected", "rejected", "rejected", "rejected"]
    assert "is on rows 1, 3" in result[0]["error"] and "is on rows 1, 3" in result[2]["error"]
    assert result[3]["error"] == "row 4: column 'body' is null" and result[1]["error"].startswith("row 2: ")
    assert orjson.loads(plan.stdout)["rejected_count"] == 3 and plan.returncode == 1


def test_a_template_naming_a_missing_column_is_one_line_exit_2(tmp_path: Path) -> None:
    table = tmp_path / "t.arrow"
    with pa.ipc.new_file(table, pa.schema([("body", pa.string())])) as w:
        w.write_table(pa.table({"body": ["x"]}))
    done = gk(["plan", str(table), "--template", "{text}", "--model", MODEL, "--max-tokens", "5"], {})
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "'text'" in done.stderr and "its columns: body" in done.stderr
    bare = gk(["plan", str(table)], {})
    assert bare.returncode == 2 and "give --template" in bare.stderr


def test_a_kill_9_mid_job_then_the_rerun_buys_nothing_twice(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(_tickets(60), table)
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        args = ["submit", str(table), *OPTS, "--max-requests", "20"]
        killed = gk(args, env, crash_at="after-create:1")
        assert killed.returncode == -9, killed.stderr[-2000:]
        done = gk(args + ["--json"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert fake.org.records.creates == 3 and fake.org.records.succeeded_twice == 0 and _sent(fake) == 60
    result = pq.read_table(_state(table) / "result.parquet")
    assert result.num_rows == 60 and set(result.column("status").to_pylist()) == {"succeeded"}


@pytest.mark.parametrize("kind", ["pyarrow", "pandas", "polars", "duckdb"])
def test_the_library_takes_tables_that_speak_arrow(tmp_path: Path, kind: str) -> None:
    """The same rows as a pyarrow Table, a pandas or a polars DataFrame, or a DuckDB query's relation: a
    pyarrow.Table back, one row per row; a rerun of the finished job hands back the same table and sends nothing."""
    import anyio

    data: Any = _tickets(12)
    if kind == "pandas":
        data = data.to_pandas()
    elif kind == "polars":
        import polars as pl

        data = pl.from_arrow(data)
    elif kind == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.register("tickets", data)
        data = con.sql("SELECT * FROM tickets WHERE body IS NOT NULL")  # (a query's relation, not a table)
    spec = TableSpec(parse_template("Ticket {id}: {body}"), MODEL, 20, id_column="id")
    with running_fake(rate=2000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "state", interval=0.05, token_sample=0)

        def run() -> Any:
            return anyio.run(lambda: submit_table(data, spec, config=config, settings=settings))
        first, second = run(), run()
        assert _sent(fake) == 12
    assert first.table is not None and first.table.num_rows == 12
    assert first.table.column("id").to_pylist() == _tickets(12).column("id").to_pylist()
    assert second.sent == 0 and second.table is not None and second.table.equals(first.table)


def test_a_table_on_object_storage_in_and_out(tmp_path: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Parquet read from s3:// and the result written back as CSV to s3://, through the S3 protocol."""
    from pyarrow import fs

    for k, v in s3.items():
        monkeypatch.setenv(k, v)
    lake, _ = fs.FileSystem.from_uri("s3://lake/in.parquet")
    with lake.open_output_stream("lake/in.parquet") as f:
        pq.write_table(_tickets(8), f)
    with running_fake(rate=2000) as fake:
        done = gk(["submit", "s3://lake/in.parquet", *OPTS, "--id-column", "id", "--out", "s3://lake/out/result.csv",
                   "--state", str(tmp_path / "state"), "--json"], {**env_for(fake), **s3})
    assert done.returncode == 0, done.stderr[-2000:]
    with lake.open_input_file("lake/out/result.csv") as f:
        got = pacsv.read_csv(f)
    assert got.num_rows == 8 and got.column("status").to_pylist() == ["succeeded"] * 8
    assert not [i for i in lake.get_file_info(fs.FileSelector("lake/out")) if ".gatekeeper-" in i.path]


def test_a_jsonl_job_never_imports_the_table_libraries(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys, gatekeeper.cli._cli as c; c.main(['plan', sys.argv[1], '--json']) if False else None; "
            "from gatekeeper.input._planner import plan; plan(sys.argv[1]); "
            "import gatekeeper.cli._tables; "
            "print(any(m.split('.')[0] in ('pyarrow', 'pandas', 'polars') for m in sys.modules))")
    path = tmp_path / "in.jsonl"
    path.write_text(orjson.dumps({"custom_id": "a", "params": {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"}]}}).decode() + "\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_planning_a_table_never_imports_the_run_nor_http(tmp_path: Path) -> None:
    """`plan_table` sends nothing: the run's modules and httpx (a fifth of a second) stay unimported."""
    import subprocess
    import sys

    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "t.parquet")
    code = ("import sys, gatekeeper; spec = gatekeeper.TableSpec.of('Say {body}', 'claude-haiku-4-5', 5); "
            "plan = gatekeeper.plan_table(sys.argv[1], spec, state_dir=sys.argv[2]); "
            "print(plan.report.requests, sorted(m for m in ('httpx', 'anyio', 'gatekeeper.run._submit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t.parquet"), str(tmp_path / "state")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2 []"



def test_a_table_job_in_a_shared_postgresql_journal_named_once_for_its_runs(tmp_path: Path, pg_url: str,
                                                                              job_name: str) -> None:
    """`--journal postgresql://... --job NAME` on a table job: each run is a job of its own in the journal (the name
    and the run's content), its answers read back from there; the grown table's run sends only the new rows."""
    table = tmp_path / "t.parquet"
    pq.write_table(_tickets(8), table)
    with running_fake(rate=2000) as fake:
        args = ["submit", str(table), *OPTS, "--id-column", "id", "--journal", pg_url, "--job", job_name, "--json"]
        first = gk(args, env_for(fake))
        assert first.returncode == 0, first.stderr[-2000:]
        pq.write_table(pa.concat_tables([_tickets(8), _tickets(3, 8)]), table)
        second = gk(args, env_for(fake))
        assert second.returncode == 0, second.stderr[-2000:]
        assert orjson.loads(second.stdout)["sent"] == 3 and _sent(fake) == 11
        runs = [orjson.loads(r.stdout)["run"]["job"] for r in (first, second)]
    assert runs[0] != runs[1] and all(r.startswith(job_name + ".") for r in runs)
    got = pq.read_table(_state(table) / "result.parquet")
    assert got.num_rows == 11 and set(got.column("status").to_pylist()) == {"succeeded"}


texts = st.one_of(st.none(), st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
                  st.sampled_from(['","', '\\",\\"', '"', "\\", "", "\u2028", "é😀", "\x00\x1f", '{"a": 1}']))


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(texts, texts, st.one_of(st.none(), st.sampled_from(["a", "b", "JIRA:1", "c-d", "x" * 70]))),
                min_size=0, max_size=12),
       st.booleans(), st.booleans())
def test_a_batch_is_judged_as_its_rows_are(rows: list[tuple[Any, Any, Any]], with_system: bool, with_id: bool) -> None:
    """The batch path (Arrow's kernels and one escape of the batch) gives every row exactly what `judge` gives it
    row by row: the same request bytes, key, custom_id, and the same rejection for nulls and duplicate ids."""
    table = pa.table({"body": [r[0] for r in rows], "note": [r[1] for r in rows], "id": [r[2] for r in rows]},
                     schema=pa.schema([("body", pa.string()), ("note", pa.large_string()), ("id", pa.string())]))
    spec = TableSpec.of('Say "{body}" {{not a field}} then {note}', MODEL, 20,
                        system="You judge {note}." if with_system else None, id_column="id" if with_id else None)
    seen: dict[Any, list[int]] = {}
    for n, (_, _, ident) in enumerate(rows, 1):
        if with_id and ident is not None:
            seen.setdefault(ident, []).append(n)
    duplicated = {k: v for k, v in seen.items() if len(v) > 1}
    for batch in table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]:
        expect = [judge_row(spec, row, 6 + i, duplicated) for i, row in enumerate(batch.select(list(spec.columns)).to_pylist(), 1)]
        assert list(judge_batch(spec, batch, 6, duplicated)) == expect


@pytest.mark.parametrize("text", ["Say {a}", "{a} then", "{a}{b}", "{a}", "no fields", "x {a} y {b} z", "{{a}} {b}"])
def test_a_batch_renders_each_template_shape_as_a_row_does(text: str) -> None:
    from gatekeeper.tables._batch import _rendered

    batch = pa.record_batch({"a": ["1", None, "é"], "b": pa.array(["x", "y", None], pa.large_string())})
    template = parse_template(text)
    rows = [{k: (v or "") for k, v in row.items()} for row in batch.to_pylist()]  # (a null field renders empty)
    assert _rendered(template, batch) == [template.render(row) for row in rows]


def test_columns_that_are_not_strings_go_row_by_row() -> None:
    batch = pa.RecordBatch.from_pydict({"n": [1, None, 3], "x": [1.5, 2.0, None]})
    spec = TableSpec.of("{n} and {x}", MODEL, 5)
    assert list(judge_batch(spec, batch, 0, {})) == [judge_row(spec, r, i, {}) for i, r in enumerate(batch.to_pylist(), 1)]


@pytest.mark.parametrize("nulls", [True, False])  # (a string column without nulls is taken whole)
@pytest.mark.parametrize("collide", [False, True])
def test_duplicate_ids_are_settled_exactly(monkeypatch: pytest.MonkeyPatch, collide: bool, nulls: bool) -> None:
    """Candidates by hash, settled by the values themselves; two ids that share a hash (forced here) never make a
    false duplicate, nor hide a true one."""
    from gatekeeper.tables import _seen
    from gatekeeper.tables._io import TableSource
    from gatekeeper.tables._judged import TableRows as _Rows

    if collide:  # (every id hashes alike: each looks seen on the first row)
        monkeypatch.setattr(_seen.SeenIds, "add_many", lambda self, values, rows: [(r, 1) for r in rows if r != 1])
    ids = ["a", "b", "a", None, "c", "b", "a", None] if nulls else ["a", "b", "a", "d", "c", "b", "a", "e"]
    table = pa.table({"id": ids, "body": ["x"] * 8})
    rows = _Rows(TableSource.of(table), TableSpec.of("{body}", MODEL, 5, id_column="id"))
    assert rows.duplicated == {"a": [1, 3, 7], "b": [2, 6]}


@pytest.mark.parametrize("expected", [0, 5_000, 50_000])  # (0 and 5,000 grow the table as it fills)
def test_seen_requests_tell_requests_apart_in_little_room(expected: int) -> None:
    import numpy as np

    from gatekeeper.tables._seen import SeenRequests, _Slots

    seen = SeenRequests(expected)
    bodies = [b'{"n":%d}' % i for i in range(20_000)]
    assert seen.add_many(bodies[:7_000]) == set() and seen.add_many(bodies[7_000:]) == set()
    assert seen.add_many(bodies[::7]) == set(range(len(bodies[::7]))) and len(seen) == 20_002 - 2
    assert seen.add_many([b"x", bodies[1], b"x", b"y"]) == {1, 2} and len(seen) == 20_002  # (repeats within a call)
    # two fingerprints alike in their 64-bit hash but not in their word are apart; alike in both, one
    slots = _Slots(expected)
    h, w = np.array([5, 5, 5], np.uint64), np.array([1, 2, 1], np.uint32)
    found, _ = slots.put(h[:2], w[:2], match_word=True)
    assert list(found) == [False, False] and list(slots.put(h[2:], w[2:], match_word=True)[0]) == [True]


def test_seen_ids_name_candidates_with_the_row_first_seen() -> None:
    from gatekeeper.tables._seen import SeenIds

    seen = SeenIds()
    values = [f"JIRA:SUP-{i}" for i in range(10_000)] + [7, 7.0, "x"]  # (7 == 7.0 in Python: one id)
    found = seen.add_many(values, list(range(1, len(values) + 1)))
    assert found == [(10_002, 10_001)]
    again = seen.add_many(["JIRA:SUP-3", "new", "x"], [20_000, 20_001, 20_002])
    assert again == [(20_000, 4), (20_002, 10_003)]


def test_rows_with_one_request_share_one_answer(tmp_path: Path) -> None:
    """Without an id column a row is its request: three rows that render alike are sent once and all answered."""
    from gatekeeper.tables._plan import plan_table

    table = pa.table({"body": ["same", "other", "same", "same"]})
    spec = TableSpec.of("{body}", MODEL, 5)
    report = plan_table(table, spec, state_dir=tmp_path / "p").report
    assert report is not None and report.requests == 2 and report.invalid == 0  # (written once, not refused twice)
    with running_fake(rate=2000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        import anyio

        done = anyio.run(lambda: submit_table(table, spec, config=config, settings=SubmitSettings(
            state_dir=tmp_path / "s", interval=0.05, token_sample=0)))
        assert _sent(fake) == 2
    got = done.table.to_pylist()  # type: ignore[union-attr]
    assert [r["status"] for r in got] == ["succeeded"] * 4 and got[0]["custom_id"] == got[2]["custom_id"] == got[3]["custom_id"]


def test_a_runs_answers_are_kept_by_one_walk_of_its_requests_and_never_out_of_order() -> None:
    """Results in the requests' order each find their key (a result the run never got is passed over); one out of
    that order is an error, not every later answer silently unkept."""
    from gatekeeper import JournalError
    from gatekeeper.tables._job import _Keeper
    from gatekeeper.tables._rows import id_and_key

    spec = TableSpec.of("{body}", MODEL, 5)
    judged = [judge_row(spec, {"body": f"text {i}"}, i, {}) for i in range(1, 5)]
    lines = [j.line() for j in judged]
    assert [id_and_key(line) for line in lines] == [(j.custom_id, j.key) for j in judged]

    class Kept:
        def __init__(self) -> None:
            self.rows: list[tuple[str, dict, bool]] = []

        def keep(self, rows: list[tuple[str, dict, bool]]) -> None:
            self.rows += rows

    def result(j: Any) -> bytes:
        return orjson.dumps({"custom_id": j.custom_id, "result": {"type": "succeeded", "n": j.row}})

    kept = Kept()
    keeper = _Keeper(kept, map(id_and_key, lines))  # type: ignore[arg-type]
    for j in (judged[0], judged[2], judged[3]):
        keeper.write(result(j))
    keeper.flush()
    assert kept.rows == [(j.key, {"type": "succeeded", "n": j.row}, True) for j in (judged[0], judged[2], judged[3])]
    late = _Keeper(Kept(), map(id_and_key, lines))  # type: ignore[arg-type]
    late.write(result(judged[2]))
    with pytest.raises(JournalError, match="order"):
        late.write(result(judged[1]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "a much longer ticket body " * 4, "é\"\\", "x" * 1500])),
                min_size=1, max_size=40),
       st.integers(1, 7), st.integers(400, 1400), st.sampled_from([{}, {"temperature": 0.5}, {"stream": True}]),
       st.booleans(), st.booleans())
def test_a_plain_spec_is_planned_as_written_exactly_as_plan_reads_the_run(
        tmp_path_factory: pytest.TempPathFactory, bodies: list[str | None], max_requests: int, max_bytes: int,
        params: dict, strict: bool, templated_system: bool) -> None:
    """`plan_table` plans the run's requests from their sizes, writing nothing (`SizedPlan`), when the spec's probe
    is plain, and through `plan` otherwise: either way, the report `plan` gives of the file the run would send, field
    for field (batches cut by the limits, offsets, the largest request, requests too large to batch, rejections)."""
    from gatekeeper.input._planner import SizedPlan, plan
    from gatekeeper.input._sizing import Limits
    from gatekeeper.tables._io import TableSource
    from gatekeeper.tables._judged import TableRows as _Rows
    from gatekeeper.tables._pending import pending_file as _pending
    from gatekeeper.tables._pending import sized as _sized
    from gatekeeper.tables._plan import _plain

    tmp = tmp_path_factory.mktemp("written")
    limits = Limits(max_requests=max_requests, max_bytes=max_bytes,
                    api_version="2026-10-21" if strict else "2023-06-01")
    table = pa.table({"body": bodies, "n": list(range(len(bodies)))})
    spec = TableSpec.of("Classify: {body}", MODEL, 20, params=params,
                        system="About {n}" if templated_system else "Be brief.")
    refused = "stream" in params or ("temperature" in params and strict)  # (temperature: by 2026-10-21 only)
    assert _plain(spec, limits) == (not refused and not templated_system)
    pending, counts = _pending(_Rows(TableSource.of(table), spec), None, tmp)
    if pending is None or refused or templated_system:  # (planned through `plan` itself)
        return
    sized = _sized(_Rows(TableSource.of(table), spec), None, written := SizedPlan(limits, MODEL))
    assert (sized.rows, sized.rejected, sized.first_rejected, sized.unsent) == \
        (counts.rows, counts.rejected, counts.first_rejected, counts.unsent)
    got, want = written.finish(), plan(pending, limits=limits)
    assert (got.to_json(), got.batches, got.model_bytes, got.request_bytes) == \
        (want.to_json(), want.batches, want.model_bytes, want.request_bytes)

