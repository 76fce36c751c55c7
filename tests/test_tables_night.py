"""Table jobs over a real night (issue 59): a row is paid for once across kills and a table that changes; a row's
request stays the same while its values do; encodings and types are judged before anything is paid; every night's
result is that night's; `plan` is a sizing report; a table job's state follows the table, not the shell, and no
secret of a URI is printed or kept. The CLI (a real process where it is killed) and the library, over HTTP against
the fake; object storage through moto's S3 server."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from gatekeeper import ApiConfig, Secret, SubmitSettings, TableSpec, UsageError
from gatekeeper.tables._job import submit_table_sync
from gatekeeper.tables._plan import plan_table
from gatekeeper.tables._where import default_state_dir
from gatekeeper.testing._wire import prompt_of
from tests.fakes import WS1, env_for, running_fake
from tests.runs import gk

MODEL = "claude-haiku-4-5-20251001"
FAST = ["--interval", "0.05", "--reconcile-grace", "1", "--max-rpm", "60000"]


def _opts(template: str = "Order {id}: {qty} x {item}") -> list[str]:
    return ["--template", template, "--model", MODEL, "--max-tokens", "20", *FAST]


def _orders(n: int, start: int = 0, qty: Any = None) -> pa.Table:
    idx = range(start, start + n)
    return pa.table({"id": [f"o-{i}" for i in idx], "item": [f"widget {i % 7}" + " again" * (i % 9) for i in idx],
                     "qty": pa.array(list(idx) if qty is None else qty, pa.int64())})


def _state(table: Any) -> Path:
    return default_state_dir(str(table), os.environ, create=False)


def _created(fake: Any) -> list[str]:
    """Every custom_id the fake was sent, once per batch it was created in."""
    return [cid for b in fake.org.batches.values() for cid, _ in b.requests]


def _prompts(fake: Any) -> Counter[str]:
    """The digests of every prompt the fake was sent (`prompt_of`), counted."""
    return Counter(digest for b in fake.org.batches.values() for _, digest in (b.prompts or ()))


def _digest(text: str) -> str:
    return prompt_of({"messages": [{"content": text, "role": "user"}]})[1]  # (as sent: keys sorted)


def _config(fake: Any) -> ApiConfig:
    return ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)


def _settings(state: Path | None = None, **kw: Any) -> SubmitSettings:
    return SubmitSettings(state_dir=state, interval=0.05, token_sample=0, reconcile_grace=1, **kw)


# -- 2. a row is paid for once across kills and a changing table ------------------------------------------------

def test_a_kill_then_a_grown_and_changed_table_pays_for_each_row_once(tmp_path: Path) -> None:
    """Killed right after its first batch (20 of 60 rows) was created; 10 rows appended and a row not yet sent
    changed; rerun: the earlier run is collected first (its batch downloaded, nothing new sent for it), then the
    rows still unanswered go out as the table is now. The fake was sent each of the 70 rows once, and never the
    changed row's old request."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(60), table)
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        args = ["submit", str(table), *_opts(), "--id-column", "id", "--max-requests", "20", "--json"]
        killed = gk(args, env, crash_at="after-create:1")
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert fake.org.records.creates == 1
        night = _orders(70).to_pylist()
        night[50]["item"] = "a gadget now"  # (its request was planned, in a batch never created)
        pq.write_table(pa.Table.from_pylist(night, schema=_orders(1).schema), table)
        done = gk(args, env)
        assert done.returncode == 0, done.stderr[-3000:]
        created = _created(fake)
        assert len(created) == len(set(created)) == 70 and fake.org.records.succeeded_twice == 0
        assert _prompts(fake)[_digest("Order o-50: 50 x widget 1 again again again again again")] == 0  # (never bought)
        assert _prompts(fake)[_digest("Order o-50: 50 x a gadget now")] == 1
    j = orjson.loads(done.stdout)
    assert [(e["requests"], e["answered"], e["batches"]) for e in j["earlier"]] == [(60, 20, 1)]
    assert j["sent"] == 50 and j["by_status"] == {"succeeded": 70}  # (what this run sent: the rest, and the new)
    result = pq.read_table(_state(table) / "result.parquet")
    assert result.column("id").to_pylist() == [f"o-{i}" for i in range(70)]


def test_plan_after_a_kill_counts_what_the_rerun_sends(tmp_path: Path) -> None:
    """Killed right after its first batch (20 of 60 rows) was created: `plan` of the same table and state says 40 to
    send, 20 out in the unfinished run (it said 60: the rows in flight counted again), and the rerun then sends
    exactly those 40, in the batches plan said."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(60), table)
    with running_fake(rate=2000) as fake:
        env = env_for(fake, admin=False)
        args = [str(table), *_opts()[:6], "--id-column", "id", "--max-requests", "20"]
        killed = gk(["submit", *args, *FAST, "--json"], env, crash_at="after-create:1")
        assert killed.returncode == -9, killed.stderr[-2000:]
        planned = gk(["plan", *args, "--json"], env)
        human = gk(["plan", *args], env)
        sent_before = len(_created(fake))
        done = gk(["submit", *args, *FAST, "--json"], env)
        sent = len(_created(fake)) - sent_before
    j = orjson.loads(planned.stdout)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert (j["to_send"], j["in_flight"], j["answered"]) == (40, 20, 0)
    assert [(b["requests"], b["first_row"], b["last_row"]) for b in j["batches"]] == [(20, 21, 40), (20, 41, 60)]
    assert [(u["requests"], u["taken"]) for u in j["unfinished"]] == [(60, 20)]
    assert "(answered already: 0; out in an unfinished run: 20; rejected: 0)" in human.stdout
    assert "to send         40 request(s) in 2 batch(es)" in human.stdout
    assert done.returncode == 0 and sent == 40 == orjson.loads(done.stdout)["sent"], done.stderr[-2000:]


def test_a_run_whose_requests_a_finished_run_had_is_a_run_of_its_own(tmp_path: Path) -> None:
    """The next night's unanswered rows can be exactly the rows a finished run sent (every one errored): that is a
    new run, sent again, not the finished one's journal read back ("finished")."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(6), table)
    spec = TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id")
    from gatekeeper.testing._model import Outcome

    with running_fake(rate=2000, outcome=lambda cid, model, attempt: Outcome("errored", "invalid_request_error")) as fake:
        first = submit_table_sync(str(table), spec, config=_config(fake), settings=_settings(max_attempts=1))
    assert first.by_status == {"errored": 6}
    with running_fake(rate=2000) as fake:
        second = submit_table_sync(str(table), spec, config=_config(fake), settings=_settings(max_attempts=1))
        assert len(_created(fake)) == 6
    assert second.by_status == {"succeeded": 6} and second.sent == 6


# -- 3. a row's request does not change when its values do not ---------------------------------------------------

@pytest.mark.parametrize("how", ["pandas", "nan"])
def test_a_column_drifting_from_int64_to_double_buys_nothing_again(tmp_path: Path, how: str) -> None:
    """`qty` int64 one night; the next, double with one row appended whose qty is missing (pandas writes it so: the
    column becomes double, the value null; or a NaN written as such): every old row's request is the same, so
    `plan` says all 200 are answered; the new row is rejected by number, as null."""
    table = tmp_path / "orders.parquet"
    pq.write_table(_orders(200), table)
    with running_fake(rate=4000) as fake:
        env = env_for(fake)
        first = gk(["submit", str(table), *_opts(), "--id-column", "id", "--json"], env)
        assert first.returncode == 0, first.stderr[-2000:]
        rows = _orders(200).to_pylist() + [{"id": "o-200", "item": "widget 4", "qty": None}]
        if how == "pandas":
            import pandas as pd

            frame = pd.DataFrame(rows)
            assert str(frame["qty"].dtype) == "float64"
            frame.to_parquet(table)
        else:
            qty = pa.array([float(r["qty"]) if r["qty"] is not None else math.nan for r in rows], pa.float64(),
                           from_pandas=False)
            pq.write_table(pa.table({"id": [r["id"] for r in rows], "item": [r["item"] for r in rows], "qty": qty}),
                           table)
        assert pq.read_schema(table).field("qty").type == pa.float64()
        plan = gk(["plan", str(table), *_opts()[:6], "--id-column", "id", "--json"], env)
    j = orjson.loads(plan.stdout)
    assert (j["rows"], j["answered"], j["to_send"], j["rejected_count"]) == (201, 200, 0, 1)
    why = "column 'qty' is null" + (" (NaN)" if how == "nan" else "")
    assert j["rejected"] == [{"row": 201, "custom_id": "o-200", "reason": why}] and plan.returncode == 1  # (its id kept)


def test_a_csv_is_read_as_written_unless_types_are_asked_to_be_inferred(tmp_path: Path) -> None:
    """`02134` stays `02134` in the prompt and the result; the ids `007` and `7` are two ids. With
    --infer-types, pyarrow's inference as before: `7` twice, both rejected."""
    table = tmp_path / "zips.csv"
    table.write_text("zip,sku\n02134,007\n10001,7\n")
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        args = ["submit", str(table), *_opts("Where is {zip}?"), "--id-column", "sku", "--json"]
        done = gk(args + ["--out", str(tmp_path / "r.csv")], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert _prompts(fake)[_digest("Where is 02134?")] == 1
        inferred = gk(["plan", str(table), *_opts("Where is {zip}?")[:6], "--id-column", "sku", "--infer-types",
                       "--json"], env)
    got = pacsv.read_csv(tmp_path / "r.csv", convert_options=pacsv.ConvertOptions(
        column_types={"zip": pa.string(), "sku": pa.string()}))
    assert got.column("zip").to_pylist() == ["02134", "10001"] and got.column("sku").to_pylist() == ["007", "7"]
    j = orjson.loads(inferred.stdout)
    assert j["rejected_count"] == 2 and "is on rows 1, 2" in j["rejected"][0]["reason"]


def test_a_csvs_spelling_is_its_request_and_a_frame_does_not_share_a_files_answers(tmp_path: Path) -> None:
    """As docs/tables.md says: a CSV is text, so `3` written `3.0` the next night is a changed row, bought again (a
    Parquet column drifting from int64 to double is not: above); written as integers again, the first night's answer
    is found. The same rows given as a DataFrame do not find the file's answers: they are kept by the table's
    identity, and every table in memory shares one folder, the file's not."""
    import pandas as pd

    table = tmp_path / "orders.csv"
    table.write_text("id,item,qty\no-1,widget,3\no-2,gadget,4\n")
    args = ["submit", str(table), *_opts(), "--id-column", "id", "--json"]
    spec = TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id")
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        assert orjson.loads(gk(args, env).stdout)["sent"] == 2
        table.write_text("id,item,qty\no-1,widget,3.0\no-2,gadget,4\n")
        assert orjson.loads(gk(args, env).stdout)["sent"] == 1
        table.write_text("id,item,qty\no-1,widget,3\no-2,gadget,4\n")
        assert orjson.loads(gk(args, env).stdout)["sent"] == 0
        frame = pd.DataFrame({"id": ["o-1", "o-2"], "item": ["widget", "gadget"], "qty": [3, 4]})
        done = submit_table_sync(frame, spec, config=_config(fake), settings=_settings())
        assert done.sent == 2 and done.by_status == {"succeeded": 2}
        again = submit_table_sync(frame.copy(), spec, config=_config(fake), settings=_settings())
        assert again.sent == 0 and again.by_status == {"succeeded": 2}  # (tables in memory share their answers)
    assert _prompts(fake)[_digest("Order o-1: 3.0 x widget")] == 1
    assert _prompts(fake)[_digest("Order o-1: 3 x widget")] == 2  # (the file's night, then the DataFrame's)


def test_lists_and_structs_render_as_json_and_nan_ids_are_rejected(tmp_path: Path) -> None:
    """A list or struct value is rendered as JSON (not Python's repr); two NaN ids are two rows without an id,
    each rejected, not one id sent once (which crossed their answers)."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": pa.array([1.0, math.nan, 3.0, math.nan], from_pandas=False),
                             "tags": [["x", "y"], ["z"], [], ["é"]],
                             "meta": [{"n": 1, "w": 2.0}, {"n": 2, "w": 0.5}, {"n": 3, "w": 1.0}, {"n": 4, "w": 1.5}]}),
                   table)
    with running_fake(rate=2000) as fake:
        done = gk(["submit", str(table), *_opts("Tags {tags} {meta}"), "--id-column", "id", "--json"], env_for(fake))
        assert _prompts(fake)[_digest('Tags ["x","y"] {"n":1,"w":2}')] == 1
        assert _prompts(fake)[_digest('Tags [] {"n":3,"w":1}')] == 1 and len(_created(fake)) == 2
    result = pq.read_table(_state(table) / "result.parquet").to_pylist()
    assert [r["status"] for r in result] == ["succeeded", "rejected", "succeeded", "rejected"]
    assert result[1]["error"] == "row 2: the id column 'id' is null (NaN)" and done.returncode == 1


def test_an_integer_id_is_mapped_so_its_custom_id_outlives_the_column_turning_double(tmp_path: Path) -> None:
    """Integer ids are mapped (`id-` and a digest of the value as its integer), not sent as their text: an id column
    int64 one night and double the next (pandas' way once a NaN appears) keeps every row's custom_id, where `1.0`
    would not be the custom id `1`; the text `1` is its own custom_id (ids are compared as written)."""
    table = tmp_path / "t.parquet"
    spec = TableSpec.of("Say {body}", MODEL, 20, id_column="id")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "body": ["a", "b"]}), table)
    with running_fake(rate=2000) as fake:
        first = submit_table_sync(str(table), spec, config=_config(fake), settings=_settings())
        pq.write_table(pa.table({"id": pa.array([1.0, 2.0, math.nan], pa.float64(), from_pandas=False),
                                 "body": ["a", "b", "c"]}), table)
        second = submit_table_sync(str(table), spec, config=_config(fake), settings=_settings())
        text = submit_table_sync(pa.table({"id": ["1"], "body": ["a"]}), spec, config=_config(fake),
                                 settings=_settings(tmp_path / "text"))
        assert len(_created(fake)) == 2 + 1  # (the double night sent nothing again; the text's own state, once)
    assert first.table is not None and second.table is not None and text.table is not None
    ids = first.table.column("custom_id").to_pylist()
    assert all(i.startswith("id-") for i in ids) and second.table.column("custom_id").to_pylist()[:2] == ids
    assert text.table.column("custom_id").to_pylist() == ["1"] and second.sent == 0


def test_two_specs_over_one_table_keep_default_results_of_their_own(tmp_path: Path) -> None:
    """Two jobs over one table with different templates, without --out: both wrote `STATE/result.parquet`, the
    second over the first's answers (a cold tester). The first spec keeps `result.parquet` (a pipeline reads that
    path); the other's is `result-<its spec's digest>.parquet`, in its `result` line and --json `out`; each rerun
    writes its own again; the library without `out` writes no file."""
    from gatekeeper.tables._result import SHORT, spec_digest

    table = tmp_path / "tt.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "body": ["the printer is on fire", "no login"]}), table)
    classify, summarize = _opts("Classify {body}")[:6], _opts("Summarize this for me, please: {body}")[:6]
    state = _state(table)
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        first = gk(["submit", str(table), *classify, *FAST, "--id-column", "id"], env)
        assert first.returncode == 0 and f"result    {state / 'result.parquet'}" in first.stdout, first.stderr[-2000:]
        mine = pq.read_table(state / "result.parquet")
        second = gk(["submit", str(table), *summarize, *FAST, "--id-column", "id", "--json"], env)
        assert second.returncode == 0, second.stderr[-2000:]
        digest = spec_digest(TableSpec.of("Summarize this for me, please: {body}", MODEL, 20, id_column="id"))
        theirs = state / f"result-{digest[:SHORT]}.parquet"
        assert orjson.loads(second.stdout)["out"] == str(theirs)
        assert pq.read_table(state / "result.parquet").equals(mine)  # (the first's answers, unmoved)
        assert pq.read_table(theirs).column("input_tokens").to_pylist() != mine.column("input_tokens").to_pylist()
        again = gk(["submit", str(table), *classify, *FAST, "--id-column", "id", "--json"], env)
        assert orjson.loads(again.stdout)["out"] == str(state / "result.parquet") and len(_created(fake)) == 4
        other = submit_table_sync(str(table), TableSpec.of("Other {body}", MODEL, 20, id_column="id"),
                                  config=_config(fake), settings=_settings())
        assert other.out is None and other.table is not None  # (the library without `out`: a table, no file)
    assert sorted(p.name for p in state.glob("result*.parquet")) == sorted(["result.parquet", theirs.name])


# -- 4. encodings and types are judged before anything is paid ---------------------------------------------------

@pytest.mark.parametrize("encoding, says", [("ascii", "is not ascii: line 2 has the byte 0xe9"),
                                             ("shift_jis", "is not shift_jis: line 2 has the byte 0xe9"),
                                             ("utf-16", "is not utf-16: UTF-16 stream does not start with BOM")])
def test_a_csv_the_encoding_named_cannot_read_is_one_line(tmp_path: Path, encoding: str, says: str) -> None:
    """`--encoding` naming the wrong encoding: one line naming it and the line (a cold tester met a traceback)."""
    table = tmp_path / "menu.csv"
    table.write_bytes("dish\ncafé crème\n".encode("latin-1"))
    opts = ["--template", "Translate: {dish}", "--model", MODEL, "--max-tokens", "20", "--encoding", encoding]
    with running_fake(rate=2000) as fake:
        for command in ("plan", "submit"):
            refused = gk([command, str(table), *opts], env_for(fake))
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert says in refused.stderr and "Traceback" not in refused.stderr
        assert fake.org.records.creates == 0


def test_a_utf16_csv_is_refused_naming_its_encoding_then_read_in_it(tmp_path: Path) -> None:
    """A UTF-16 CSV (its NULs read as UTF-8: a cold tester's was refused as "Expected 2 columns, got 1", its
    encoding unnamed): one line naming UTF-16 and --encoding, exit 2, nothing sent; with `--encoding utf-16`, read."""
    table = tmp_path / "u16.csv"
    table.write_text("id,dish\n1,sixteen\n2,two\n", encoding="utf-16")
    with running_fake(rate=2000) as fake:
        args = ["submit", str(table), *_opts("Translate: {dish}"), "--json"]
        refused = gk(args, env_for(fake))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "UTF-16 byte-order mark" in refused.stderr and "--encoding" in refused.stderr
        assert fake.org.records.creates == 0
        done = gk([*args, "--encoding", "utf-16"], env_for(fake))
        assert done.returncode == 0 and _prompts(fake)[_digest("Translate: sixteen")] == 1, done.stderr[-2000:]


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_wide_csv_without_a_bom_is_refused_naming_its_encoding_then_read_in_it(tmp_path: Path,
                                                                                  encoding: str) -> None:
    """A UTF-16 or UTF-32 CSV without a byte-order mark (a cold tester's was refused as "cannot be read as csv (CSV
    parse error: Expected 2 columns, got 1)", its encoding unnamed; one of ASCII alone was read with NULs in its
    names): one line naming the encoding and --encoding, exit 2, by plan and submit, nothing sent; read in it."""
    table = tmp_path / "u.csv"
    table.write_bytes("id,dish\n1,café\n2,two\n".encode(encoding))
    with running_fake(rate=2000) as fake:
        for args in (["plan", str(table), *_opts("Translate: {dish}")[:6]], ["submit", str(table), *_opts("Translate: {dish}")]):
            refused = gk(args, env_for(fake))
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert f"is not UTF-8: its first bytes hold NULs as {encoding.upper()} without a byte-order mark" \
                f" does; name its encoding ({encoding}, if that is it)" in refused.stderr, refused.stderr
            assert "--encoding" in refused.stderr
        assert fake.org.records.creates == 0
        done = gk(["submit", str(table), *_opts("Translate: {dish}"), "--encoding", encoding], env_for(fake))
        assert done.returncode == 0 and _prompts(fake)[_digest("Translate: café")] == 1, done.stderr[-2000:]


def test_utf8_text_is_never_taken_for_utf16_without_a_bom() -> None:
    from gatekeeper.tables._encoding import unmarked_of

    for text in ("id,body\n1,café\n", "日本語,テキスト\n" * 4, "a\n" * 40, "x"):
        assert unmarked_of(text.encode()) is None
    assert unmarked_of("日本語,テキスト\n".encode("utf-16-le")) is None  # (no NUL: not guessed)
    assert unmarked_of("id,body\n".encode("utf-16-be")) == "UTF-16-BE"


def test_a_csv_that_is_not_utf8_is_refused_naming_its_encoding_or_read_in_the_one_named(tmp_path: Path) -> None:
    table = tmp_path / "menu.csv"
    table.write_bytes("dish\ncafé crème\n".encode("latin-1"))
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        args = ["submit", str(table), *_opts("Translate: {dish}"), "--json"]
        refused = gk(args, env)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "is not UTF-8: line 2 has the byte 0xe9" in refused.stderr and "Windows-1252" in refused.stderr
        assert "--encoding" in refused.stderr and fake.org.records.creates == 0
        done = gk(args + ["--encoding", "cp1252"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert _prompts(fake)[_digest("Translate: café crème")] == 1
        spec = TableSpec.of("Translate: {dish}", MODEL, 20)
        with pytest.raises(UsageError, match="is not UTF-8: line 2"):
            submit_table_sync(str(table), spec, config=_config(fake), settings=_settings(tmp_path / "lib"))
        again = submit_table_sync(str(table), spec, config=_config(fake), encoding="latin-1",
                                  settings=_settings(tmp_path / "lib"))
        assert again.by_status == {"succeeded": 1} and len(_created(fake)) == 2  # (its own state: sent once more)
        with pytest.raises(UsageError, match="only a CSV is read with an encoding"):
            plan_table(str(tmp_path / "x.parquet"), spec, encoding="latin-1")


def test_a_byte_that_is_not_utf8_after_the_first_block_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """Refused by the pass that judges every row, before the run: the first 4 MB read fine, the bad byte is later."""
    table = tmp_path / "big.csv"
    with open(table, "wb") as f:
        f.write(b"body\n" + b"".join(b"ticket number %d is fine\n" % i for i in range(250_000)) + b"caf\xe9\n")
    assert table.stat().st_size > 5 << 20
    with running_fake(rate=2000) as fake:
        refused = gk(["submit", str(table), *_opts("{body}")], env_for(fake))
        assert refused.returncode == 2 and "line 250002" in refused.stderr and fake.org.records.creates == 0


def test_an_output_format_that_cannot_hold_a_column_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """A list column to CSV: one line naming it, exit 2, nothing created; a string_view column (polars' strings) is
    written to CSV as string."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["a", "b"], "tags": [["x"], ["y", "z"]]}), table)
    with running_fake(rate=2000) as fake:
        refused = gk(["submit", str(table), *_opts("{body}"), "--out", str(tmp_path / "r.csv")], env_for(fake))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "csv cannot hold the column 'tags' (list<" in refused.stderr
        assert fake.org.records.creates == 0 and not (tmp_path / "r.csv").exists()
        assert not _state(table).exists()  # (refused before its state folder was made)
        import polars as pl

        frame = pl.DataFrame({"body": ["a", "b"], "note": ["n1", None]})
        assert pa.RecordBatchReader.from_stream(frame).schema.field("body").type == pa.string_view()
        done = submit_table_sync(frame, TableSpec.of("{body} {note}", MODEL, 20), config=_config(fake),
                                 settings=_settings(tmp_path / "s"), out=tmp_path / "views.csv")
    assert done.by_status == {"succeeded": 1, "rejected": 1}
    got = pacsv.read_csv(tmp_path / "views.csv")
    assert got.column("body").to_pylist() == ["a", "b"] and got.schema.field("body").type == pa.string()


# -- 5. every night's result is that night's ---------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".arrow"])
def test_an_empty_night_writes_an_empty_result_of_the_right_columns(tmp_path: Path, suffix: str) -> None:
    """Three rows one night, none the next (a header-only CSV too): exit 0 and a result of no rows with the input's
    columns and the result columns, never yesterday's rows left in place."""
    table = tmp_path / f"daily{suffix}"
    out = tmp_path / f"out{suffix}"

    def write(t: pa.Table) -> None:
        if suffix == ".parquet":
            pq.write_table(t, table)
        elif suffix == ".csv":
            pacsv.write_csv(t, table)
        else:
            with pa.ipc.new_file(table, t.schema) as w:
                w.write_table(t)

    def read() -> pa.Table:
        return pq.read_table(out) if suffix == ".parquet" else pacsv.read_csv(out) if suffix == ".csv" else \
            pa.ipc.open_file(out).read_all()

    columns = {"id": pa.string(), "body": pa.string()}
    with running_fake(rate=2000) as fake:
        args = ["submit", str(table), *_opts("{body}"), "--id-column", "id", "--out", str(out), "--json"]
        write(pa.table({"id": ["a", "b", "c"], "body": ["x", "y", "z"]}, schema=pa.schema(columns)))
        assert gk(args, env_for(fake)).returncode == 0 and read().num_rows == 3
        write(pa.table({"id": [], "body": []}, schema=pa.schema(columns)))
        if suffix == ".csv":
            assert table.read_text().strip() == '"id","body"'  # (a header and no row)
        empty = gk(args, env_for(fake))
    assert empty.returncode == 0, empty.stderr[-2000:]
    got = read()
    assert got.num_rows == 0 and got.column_names[:3] == ["id", "body", "custom_id"] and "error" in got.column_names
    assert orjson.loads(empty.stdout)["rows"] == 0


def test_the_library_hands_back_an_empty_table_for_an_empty_one(tmp_path: Path) -> None:
    with running_fake(rate=2000) as fake:
        empty = pa.table({"body": pa.array([], pa.string()), "n": pa.array([], pa.int64())})
        done = submit_table_sync(empty, TableSpec.of("{body}", MODEL, 20), config=_config(fake),
                                 settings=_settings(tmp_path / "s"))
    assert isinstance(done.table, pa.Table) and done.table.num_rows == 0
    assert done.table.column_names[:3] == ["body", "n", "custom_id"] and done.table.schema.field("n").type == pa.int64()


def test_rows_a_budget_left_unsent_are_unsent_and_the_summary_says_nothing_was_created(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(30), table)
    with running_fake(rate=2000) as fake:
        done = gk(["submit", str(table), *_opts(), "--budget", "0.0000001"], env_for(fake))
        assert fake.org.records.creates == 0
    assert done.returncode == 1, done.stderr[-2000:]
    assert "rows      30   (unsent 30)" in done.stdout and "sent      0 request(s) in 0 batch(es); 30 row(s) not sent" \
        in done.stdout
    result = pq.read_table(_state(table) / "result.parquet").to_pylist()
    assert {(r["status"], r["error"]) for r in result} == {("unsent", "not sent: the budget was reached")}


def test_rows_appended_while_the_job_runs_are_left_for_the_next_run_and_counted_once(tmp_path: Path) -> None:
    """The table grows while its run is out: the result holds the rows judged, each once (not 20 more as
    "no answer"), says the table grew, and the next run sends only the new rows."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(40), table)
    spec = TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id")

    def grow(event: str, fields: dict) -> None:
        if event == "planned":
            pq.write_table(_orders(60), table)

    with running_fake(rate=2000) as fake:
        first = submit_table_sync(str(table), spec, config=_config(fake), settings=_settings(), on_event=grow)
        assert first.rows == 40 and first.by_status == {"succeeded": 40} and first.grew
        assert first.table is not None and first.table.num_rows == 40
        second = submit_table_sync(str(table), spec, config=_config(fake), settings=_settings())
        assert second.sent == 20 and len(_created(fake)) == 60 and not second.grew


# -- 6. plan on a table is a sizing report -----------------------------------------------------------------------

def test_plan_sizes_a_table_as_submit_cuts_it_at_the_ceiling(tmp_path: Path) -> None:
    """2,000 rows under a ceiling of 1,000: 8 batches of 250 (a quarter of the ceiling), 2 rounds of creates, the
    cost at batch prices; `submit` at that ceiling then makes the same 8 batches."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(2000), table)
    with running_fake(rate=20000, ceiling=1000) as fake:
        env = env_for(fake)
        plan = gk(["plan", str(table), *_opts()[:6], "--id-column", "id", "--json"], env)  # (the Admin key reads it)
        text = gk(["plan", str(table), *_opts()[:6], "--ceiling", "1000"], {})
        done = gk(["submit", str(table), *_opts(), "--id-column", "id", "--json"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert sorted(b.total for b in fake.org.batches.values()) == [250] * 8
    j = orjson.loads(plan.stdout)
    assert (len(j["batches"]), j["batch_size"], j["waves"], j["ceiling"]) == (8, 250, 2, 1000)
    assert j["estimate"]["input_tokens"] > 0 and j["estimate"]["input_cost_usd"] > 0
    assert "2,000 request(s) in 8 batch(es) of at most 250; 2 round(s) of creates at the ceiling 1,000" in text.stdout
    assert "estimate        ~" in text.stdout


def test_plan_reports_rejections_as_records_with_flat_memory(tmp_path: Path) -> None:
    """1,000 of 1,500 rows null: the count, and the first 100 as records (row, custom_id, reason), the keys the
    JSONL plan's rejections and batches use where they mean the same."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": [None if i % 3 else f"b{i}" for i in range(1500)]}), table)
    j = orjson.loads(gk(["plan", str(table), *_opts("{body}")[:6], "--json"], {}).stdout)
    assert j["rejected_count"] == 1000 and len(j["rejected"]) == 100
    assert j["rejected"][0] == {"row": 2, "custom_id": None, "reason": "column 'body' is null"}
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text('{"custom_id": "a", "params": {}}\n' + orjson.dumps(
        {"custom_id": "b", "params": {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    }).decode() + "\n")
    lines = orjson.loads(gk(["plan", str(jsonl), "--json"], {}).stdout)
    assert set(lines["errors"][0]) - {"line"} == set(j["rejected"][0]) - {"row"}
    assert set(lines["batches"][0]) - {"first_line", "last_line"} == set(j["batches"][0]) - {"first_row", "last_row"}
    assert (j["batches"][0]["first_row"], j["batches"][0]["last_row"]) == (1, 1498)  # (rows, not the run's lines)
    for key in ("requests", "invalid", "errors", "batches", "largest_request", "models", "request_bytes", "limits"):
        assert key in j, key


@pytest.mark.parametrize("system", [None, "Be brief about {item}"])  # (sized, and planned through the run's file)
def test_plan_names_the_largest_request_by_its_row(tmp_path: Path, system: str | None) -> None:
    """`largest_request` names its row, as the table's rejections and batches do (a cold tester found `line`, the
    line of the run's file: rows rejected before it shift it); a JSONL plan's keeps `line`."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "item": [None, None, "x", "y" * 500]}), table)
    opts = _opts("{item}")[:6] + ([] if system is None else ["--system", system])
    j = orjson.loads(gk(["plan", str(table), *opts, "--id-column", "id", "--json"], {}).stdout)
    assert {k: v for k, v in j["largest_request"].items() if k != "bytes"} == {"row": 4, "custom_id": "d"}, j
    assert j["largest_request"]["bytes"] > 500


def test_plan_keeps_the_first_rejections_the_models_api_refuses_and_counts_the_rest(tmp_path: Path) -> None:
    """A model the Models API does not know refuses each of 300 rows: `rejected` has the first 100 as records (the
    memory of a hundred, however many rows), `rejected_count`, `invalid` and the preflight's tally count all 300.
    Rows sharing a refused request (300 rows, 63 distinct requests) are each rejected too, as `submit` rejects them:
    `invalid` counts the 63 requests, `rejected_count` the 300 rows."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(300), table)
    spec = ["--model", "claude-nope-9", "--max-tokens", "20", "--id-column", "id", "--token-sample", "0", "--json"]
    with running_fake(rate=2000) as fake:
        done = gk(["plan", str(table), "--template", "{id} {item}", *spec], env_for(fake))
        shared = gk(["plan", str(table), "--template", "{item}", *spec], env_for(fake))
        submitted = gk(["submit", str(table), "--template", "{item}", *spec, *FAST], env_for(fake))
    j = orjson.loads(done.stdout)
    assert done.returncode == 1 and (j["rejected_count"], j["invalid"], j["to_send"]) == (300, 300, 0), j
    assert [r["row"] for r in j["rejected"]] == list(range(1, 101)) and len(j["errors"]) == 100
    assert j["rejected"][99]["custom_id"] == "o-99" and "not a model the Models API knows" in j["rejected"][99]["reason"]
    assert j["preflight"]["models"]["claude-nope-9"]["lines_rejected"] == 300
    s = orjson.loads(shared.stdout)
    assert (s["rejected_count"], s["invalid"], s["to_send"]) == (300, 63, 0), s
    assert [r["row"] for r in s["rejected"]] == list(range(1, 101))
    assert s["rejected"][70] == {"row": 71, "custom_id": "o-70", "reason": s["rejected"][7]["reason"]}  # (row 8's)
    assert orjson.loads(submitted.stdout)["by_status"] == {"rejected": 300}


def test_rows_with_one_request_share_it_and_plan_and_submit_say_how_many(tmp_path: Path) -> None:
    """200 rows with --id-column, of 180 distinct prompts: plan and submit say 180 requests for 200 rows (20 share a
    request with an identical row), the fake is sent 180 and each row gets its request's answer, keeping its id."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [f"o-{i}" for i in range(200)], "body": [f"b {i % 180}" for i in range(200)]}),
                   table)
    args = ["--template", "{body}", "--model", MODEL, "--max-tokens", "20", "--id-column", "id"]
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        plan = orjson.loads(gk(["plan", str(table), *args, "--json"], env).stdout)
        text = gk(["plan", str(table), *args], env).stdout
        done = gk(["submit", str(table), *args, *FAST, "--json", "--out", str(tmp_path / "r.parquet")], env)
        said = gk(["submit", str(table), *args, *FAST, "--state", str(tmp_path / "s")], env).stdout
        assert len(_created(fake)) == 360  # (180 a run: the second has a state of its own)
    assert (plan["rows"], plan["to_send"], plan["shared"]) == (200, 180, 20), plan
    assert "shared          20 row(s) share a request with an identical row" in text, text
    j = orjson.loads(done.stdout)
    assert (j["sent"], j["shared"], j["by_status"]) == (180, 20, {"succeeded": 200}), j
    assert "shared    20 row(s) share a request with an identical row" in said, said
    result = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert result[185]["id"] == "o-185" and result[185]["text"] == result[5]["text"] and result[185]["custom_id"] == "o-185"


# -- 7. state follows the table, not the shell -------------------------------------------------------------------

def test_an_s3_table_finds_its_state_from_any_folder_and_no_secret_is_printed_or_kept(
        tmp_path: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from one folder, then another: the second sends nothing (the state is the table's, in the user's state
    folder). A URI carrying a key and secret works, and the secret is in no output line nor any file of the state."""
    from pyarrow import fs

    for k, v in s3.items():
        monkeypatch.setenv(k, v)
    lake, _ = fs.FileSystem.from_uri("s3://lake/x")
    with lake.open_output_stream("lake/night/in.parquet") as f:
        pq.write_table(_orders(12), f)
    secret = "SuperSecret123"
    where = f"s3://AKIAEXAMPLE:{secret}@lake/night/in.parquet?region=us-east-1"
    out = f"s3://AKIAEXAMPLE:{secret}@lake/night/out.parquet"
    with running_fake(rate=2000) as fake:
        env = {**env_for(fake), **s3}
        args = ["submit", where, *_opts(), "--id-column", "id", "--out", out]
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        monkeypatch.chdir(tmp_path / "a")
        first = gk(args, env)
        monkeypatch.chdir(tmp_path / "b")
        second = gk(args + ["--json"], env)
        missing = gk(["plan", where.replace("in.parquet", "nothing.parquet"), *_opts()[:6]], env)
        assert len(_created(fake)) == 12
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-2000:]
    assert orjson.loads(second.stdout)["sent"] == 0
    assert "result    s3://***@lake/night/out.parquet" in first.stdout
    assert orjson.loads(second.stdout)["out"] == "s3://***@lake/night/out.parquet"
    assert missing.returncode == 2 and "s3://***@lake/night/nothing.parquet" in missing.stderr
    for text in (first.stdout, first.stderr, second.stdout, second.stderr, missing.stderr):
        assert secret not in text
    for text in (first.stderr, missing.stderr):  # (the warning names the object store's settings, not PostgreSQL's)
        assert "other users can read with ps; give the credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" \
            in text and "PGPASSWORD" not in text
    home = Path(os.environ["XDG_STATE_HOME"])
    kept = [p for p in home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert kept == [] and not list((tmp_path / "a").iterdir()) and not list((tmp_path / "b").iterdir())


def test_an_s3_tables_state_follows_the_object_not_its_connection_settings(
        tmp_path: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`?region=` and `?endpoint_override=&scheme=` say how to reach the object, not which it is: the same object
    given with them, or without a query, finds the answers already paid for (the fake is sent each row once); a
    secret in the query is in no output line nor any file."""
    from pyarrow import fs

    for k, v in s3.items():
        monkeypatch.setenv(k, v)
    lake, _ = fs.FileSystem.from_uri("s3://lake/x")
    with lake.open_output_stream("lake/night/q.parquet") as f:
        pq.write_table(_orders(6), f)
    endpoint = s3["AWS_ENDPOINT_URL"].removeprefix("http://")
    secret = "SuperSecret456"
    forms = ["s3://lake/night/q.parquet?region=us-east-1", "s3://lake/night/q.parquet",
             f"s3://lake/night/q.parquet?endpoint_override={endpoint}&scheme=http&region=us-east-1",
             f"s3://testing:{secret}@lake/night/q.parquet?region=us-east-1"]
    with running_fake(rate=2000) as fake:
        env = {**env_for(fake), **s3}
        runs = [gk(["submit", where, *_opts(), "--id-column", "id", "--json"], env) for where in forms]
        assert len(_created(fake)) == 6
    assert [r.returncode for r in runs] == [0] * 4, runs[-1].stderr[-2000:]
    assert [orjson.loads(r.stdout)["sent"] for r in runs] == [6, 0, 0, 0]
    assert len({orjson.loads(r.stdout)["state_dir"] for r in runs}) == 1
    assert not any(secret in r.stdout + r.stderr for r in runs)
    home = Path(os.environ["GATEKEEPER_HOME"])
    assert [p for p in home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()] == []


def test_state_an_earlier_version_keyed_by_a_uris_query_is_still_found(
        tmp_path: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier version keyed an `s3://...?region=us-east-1` table's folder by the URI with its query: after the
    upgrade the same command finds the answers there and sends nothing (the fake is sent each row once); the
    library's `plan_table` sees them answered too."""
    import hashlib

    from pyarrow import fs

    for k, v in s3.items():
        monkeypatch.setenv(k, v)
    lake, _ = fs.FileSystem.from_uri("s3://lake/x")
    with lake.open_output_stream("lake/night/old.parquet") as f:
        pq.write_table(_orders(5), f)
    where = "s3://lake/night/old.parquet?region=us-east-1"
    home = Path(os.environ["GATEKEEPER_HOME"]) / "tables"
    # (the folder an earlier version made: the file's name and the digest of the URI with its query, sorted)
    before = home / f"old.parquet-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    with running_fake(rate=2000) as fake:
        env = {**env_for(fake), **s3}
        old = gk(["submit", where, *_opts(), "--id-column", "id", "--state", str(before)], env)
        assert old.returncode == 0, old.stderr[-2000:]
        now = gk(["submit", where, *_opts(), "--id-column", "id", "--json"], env)
        assert now.returncode == 0, now.stderr[-2000:]
        assert len(_created(fake)) == 5
    j = orjson.loads(now.stdout)
    assert j["sent"] == 0 and j["state_dir"] == str(before) and j["by_status"] == {"succeeded": 5}
    assert plan_table(where, TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id")).answered == 5


def test_the_cli_and_the_library_find_each_others_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI from one folder, then the library given the same path from another (a relative path, made
    absolute): nothing bought twice; the library's `plan_table` sees every row answered."""
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(15), table)
    spec = TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id")
    with running_fake(rate=2000) as fake:
        assert gk(["submit", str(table), *_opts(), "--id-column", "id"], env_for(fake)).returncode == 0
        monkeypatch.chdir(tmp_path)
        assert plan_table("t.parquet", spec).answered == 15
        again = submit_table_sync("t.parquet", spec, config=_config(fake))
        assert len(_created(fake)) == 15
    assert again.sent == 0 and again.by_status == {"succeeded": 15} and again.state_dir == str(_state(table))


def test_state_an_earlier_version_kept_beside_the_table_is_still_found(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    pacsv.write_csv(_orders(5), table)
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        before = gk(["submit", str(table), *_opts(), "--state", f"{table}.gatekeeper"], env)  # (where it used to be)
        assert before.returncode == 0
        now = gk(["submit", str(table), *_opts(), "--json"], env)
        assert len(_created(fake)) == 5
    j = orjson.loads(now.stdout)
    assert j["sent"] == 0 and j["state_dir"] == f"{table}.gatekeeper" and j["out"] == f"{table}.gatekeeper/result.parquet"


def test_a_result_file_is_readable_as_the_umask_allows(tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(3), table)
    old = os.umask(0o022)
    try:
        with running_fake(rate=2000) as fake:
            done = submit_table_sync(str(table), TableSpec.of("{item}", MODEL, 20), config=_config(fake),
                                     settings=_settings(), out=tmp_path / "r.parquet")
    finally:
        os.umask(old)
    assert done.by_status == {"succeeded": 3}
    assert (tmp_path / "r.parquet").stat().st_mode & 0o777 == 0o644


def test_plan_reads_a_postgresql_journals_answers(tmp_path: Path, pg_url: str, job_name: str) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(_orders(9), table)
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        args = ["--id-column", "id", "--journal", pg_url, "--job", job_name]
        assert gk(["submit", str(table), *_opts(), *args], env).returncode == 0
        named = orjson.loads(gk(["plan", str(table), *_opts()[:6], *args, "--json"], env).stdout)
        derived = gk(["plan", str(table), *_opts()[:6], "--id-column", "id", "--journal", pg_url, "--json"], env)
    assert (named["answered"], named["to_send"]) == (9, 0)
    assert orjson.loads(derived.stdout)["answered"] == 0  # (another name: a job of its own, nothing answered there)


def test_a_duckdb_query_is_streamed_once_and_spooled_on_disk(tmp_path: Path) -> None:
    """A DuckDB relation is read through the Arrow C stream once, into a file beside the job, mapped back for each
    pass (not materialized in memory); its file is gone once mapped."""
    import duckdb

    from gatekeeper.tables._io import TableSource

    con = duckdb.connect()
    rel = con.sql("SELECT 'o-' || i::VARCHAR AS id, 'widget ' || (i % 7)::VARCHAR AS item, i AS qty "
                  "FROM range(50) t(i)")
    source = TableSource.of(rel)
    assert source.stream is not None and source.table is None
    with running_fake(rate=2000) as fake:
        done = submit_table_sync(source, TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id"),
                                 config=_config(fake), settings=_settings(tmp_path / "s"))
        assert len(_created(fake)) == 50
    assert done.table is not None and done.table.column("qty").to_pylist() == list(range(50))
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".gatekeeper-table-")]


# -- pure parts -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, text", [
    (7, "7"), (7.0, "7"), (-0.0, "0"), (2.5, "2.5"), (1e-7, "1e-07"), (math.inf, "inf"), ("02134", "02134"),
    (b"caf\xc3\xa9", "café"), (["x", "y"], '["x","y"]'), ({"n": 1, "w": 2.0}, '{"n":1,"w":2}'),
    ([[1.0, 2.5], []], "[[1,2.5],[]]"), ([("k", 1)], '[["k",1]]'), (True, "True"),
])
def test_a_value_renders_as_its_text_whatever_its_columns_type(value: Any, text: str) -> None:
    """An integral float renders as its integer (int64 drifting to double leaves every request as it was); lists,
    structs and maps as JSON, their integral floats too; bytes as UTF-8."""
    from gatekeeper.tables._template import parse_template

    assert parse_template("{v}").render({"v": value}) == text


@pytest.mark.parametrize("value, why", [
    (None, "null"), (math.nan, "null (NaN)"), (b"caf\xe9", "not UTF-8 text (byte 0xe9 at 3)"), ("", None), (0.0, None),
])
def test_a_value_that_cannot_be_rendered_says_why(value: Any, why: str | None) -> None:
    from gatekeeper.tables._template import parse_template

    assert parse_template("{v}").unfit({"v": value}) == (None if why is None else f"column 'v' is {why}")


@pytest.mark.parametrize("args, said, not_said", [
    (["s3://K:S@lake/t.parquet"], "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://", "PGPASSWORD"),
    (["gs://u:p@b/t.csv"], "GOOGLE_APPLICATION_CREDENTIALS for gs://", "PGPASSWORD"),
    (["abfs://acct:key@c/t.parquet"], "AZURE_STORAGE_ACCOUNT_KEY", "PGPASSWORD"),
    (["postgresql://u:p@h/db"], "PGPASSWORD or ~/.pgpass", "AWS_"),
    (["--journal=postgresql://u:p@h/db"], "PGPASSWORD or ~/.pgpass", "AWS_"),
    (["s3://K:S@lake/t.parquet", "redis://u:p@h/0"], "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://; give it in "
     "PGPASSWORD", "GOOGLE"),
])
def test_a_secret_on_the_command_line_is_sent_where_its_kind_of_url_reads_it(args: list[str], said: str,
                                                                               not_said: str) -> None:
    from gatekeeper.cli._common import where_secrets_go

    advice = where_secrets_go(args)
    assert said in advice and not_said not in advice


@pytest.mark.parametrize("where, ident, shown, secret", [
    ("t.parquet", None, "t.parquet", False),
    ("s3://lake/t.parquet", "s3://lake/t.parquet", "s3://lake/t.parquet", False),
    ("s3://AKIA:Se%2Fcret@lake/t.parquet", "s3://lake/t.parquet", "s3://***@lake/t.parquet", True),
    ("s3://AKIA@lake/t.parquet", "s3://lake/t.parquet", "s3://***@lake/t.parquet", False),
    ("s3://lake/t.parquet?region=eu&endpoint_override=x", "s3://lake/t.parquet",
     "s3://lake/t.parquet?region=eu&endpoint_override=x", False),
    ("gs://lake/t.csv?access_token=abc&x=1", "gs://lake/t.csv", "gs://lake/t.csv?access_token=***&x=1", True),
    ("abfs://acct:KEY==@c.dfs.core.windows.net/t.arrow", "abfs://c.dfs.core.windows.net/t.arrow",
     "abfs://***@c.dfs.core.windows.net/t.arrow", True),
])
def test_a_tables_identity_and_shown_form_carry_no_secret(where: str, ident: str | None, shown: str,
                                                         secret: bool) -> None:
    from gatekeeper.tables._where import folder_name, former_identity, has_secret, identity, scrub
    from gatekeeper.tables._where import shown as shown_as

    assert identity(where) == (os.path.abspath(where) if ident is None else ident)
    former = former_identity(where)  # (an earlier version's, with the query: its folder is still found)
    assert former is None or ("abc" not in former and former.startswith(identity(where) + "?")), former
    assert shown_as(where) == shown and has_secret(where) == secret
    if "Se%2Fcret" in where:  # (quoted as given, or as the URI parser decoded it)
        said = scrub(f"failed to open {where}: user AKIA, password Se/cret (Se%2Fcret)", where)
        assert "cret" not in said and "s3://***@lake/t.parquet" in said
    assert folder_name(where) == folder_name(where.replace("AKIA:Se%2Fcret@", "")) and "Se" not in folder_name(where)


@pytest.mark.parametrize("sizes, ceiling, margin, rounds", [
    ([250] * 8, 1000, 0, 2), ([250] * 9, 1000, 0, 3), ([250] * 8, 1000, 250, 3), ([], 1000, 0, 0),
    ([1500, 10], 1000, 0, 2), ([400, 400, 400], 1000, 0, 2), ([1] * 5, 1, 0, 5),
])
def test_waves_are_rounds_of_creates_into_an_empty_queue(sizes: list[int], ceiling: int, margin: int,
                                                         rounds: int) -> None:
    from gatekeeper.decide._admission import waves

    assert waves(sizes, ceiling, margin) == rounds


def test_a_file_that_is_not_utf8_is_named_by_what_it_looks_like(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from gatekeeper.tables import _encoding

    assert "UTF-16 byte-order mark" in _encoding.not_utf8(io.BytesIO("a,b\n".encode("utf-16")))
    monkeypatch.setattr(_encoding, "CHUNK", 7)  # (characters and lines cut across chunks)
    utf8 = "naïve,é\n日本,x\n".encode() * 3
    assert _encoding.not_utf8(io.BytesIO(utf8 + "café\n".encode("cp1252"))).startswith(
        "is not UTF-8: line 7 has the byte 0xe9, which reads as Windows-1252 (Latin-1) 'café'")


@pytest.mark.parametrize("result, final", [
    ({"type": "succeeded"}, True), ({"type": "expired"}, False), ({"type": "canceled"}, False),
    ({"type": "errored", "error": {"type": "error", "error": {"type": "api_error"}}}, False),
    ({"type": "errored", "error": {"type": "error", "error": {"type": "gatekeeper_unproven"}}}, True),
    ({"type": "errored", "error": {"type": "error", "error": {"type": "gatekeeper_results_unavailable"}}}, True),
    ({"type": "errored", "error": {"type": "gatekeeper_missing_result"}}, True),
    # a real-time answer lost twice: paid for up to twice, never a third time, in the next run either (swarm, 3157)
    ({"type": "errored", "error": {"type": "error", "error": {"type": "gatekeeper_answer_lost"}}}, True),
])
def test_an_answer_that_may_have_been_billed_is_never_sent_again(result: dict, final: bool) -> None:
    """A request whose answer was kept apart (its batch not proven ours) or whose results the API no longer has
    was processed, maybe billed: the next run does not send it again (the JSONL job's rule), while an error the
    API answered with is sent again."""
    from gatekeeper.tables._rows import is_final

    assert is_final(result) == final


def test_a_jsonl_plan_at_a_ceiling_cuts_batches_as_submit_does(tmp_path: Path) -> None:
    """--ceiling means the same to a JSONL plan: batches of a quarter of it (less --margin), and their rounds."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"custom_id": f"r{i}", "params": {
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": f"hi {i}"}]}}) + b"\n"
        for i in range(2000)))
    j = orjson.loads(gk(["plan", str(path), "--ceiling", "1000", "--margin", "200", "--json"], {}).stdout)
    assert [b["requests"] for b in j["batches"]] == [200] * 10 and j["waves"] == 3
    assert "waves" not in orjson.loads(gk(["plan", str(path), "--json"], {}).stdout)


def test_string_view_columns_take_the_batch_path_and_judge_as_rows_do() -> None:
    """polars' strings (string_view) are rendered by the batch path's C-level maps, nulls included, with the very
    requests `judge_row` makes row by row."""
    from gatekeeper.tables._batch import _strings, judge_batch
    from gatekeeper.tables._rows import judge_row

    batch = pa.record_batch({"body": pa.array(["a", None, "é \"q\"", ""], pa.string_view()),
                             "id": pa.array(["x", "y", "x", "z"], pa.string_view())})
    spec = TableSpec.of("Say {body}", MODEL, 5, id_column="id")
    assert _strings(batch, spec.template)
    rows = [judge_row(spec, r, i, {"x": [1, 3]}) for i, r in enumerate(batch.to_pylist(), 1)]
    assert list(judge_batch(spec, batch, 0, {"x": [1, 3]})) == rows
    assert [r.rejected is None for r in rows] == [False, False, False, True]


def test_answers_an_earlier_version_kept_in_a_journal_under_the_old_name_are_found(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier version named a table job in a shared journal by the table as written (a relative path) and the
    key's digest; its answers are read under that name, and its run that did not finish is found under it."""
    from gatekeeper.tables._job import table_job_name

    table = tmp_path / "t.parquet"
    pq.write_table(_orders(8, start=int.from_bytes(os.urandom(3), "big")), table)  # (rows of this test's own)
    monkeypatch.chdir(tmp_path)
    spec = TableSpec.of("Order {id}: {qty} x {item}", MODEL, 20, id_column="id")
    with running_fake(rate=2000) as fake:
        env = env_for(fake)
        old = table_job_name("t.parquet", spec, _config(fake), legacy=True)
        args = ["submit", "t.parquet", *_opts(), "--id-column", "id", "--journal", pg_url]
        assert gk(args + ["--job", old], env).returncode == 0  # (as the earlier version named it)
        again = gk(args + ["--json"], env)
        assert again.returncode == 0 and orjson.loads(again.stdout)["sent"] == 0 and len(_created(fake)) == 8, again.stderr


def test_columns_named_with_colons_and_bangs_are_templated_as_written(tmp_path: Path) -> None:
    """A field is the column's name as written between its braces: `{a:b}` and `{ok!}` are columns (no format
    specs), `:` and `!` in text and in doubled braces are text; the fake is sent each row's prompt so rendered."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a:b": ["x", "y"], "ok!": [1, 2]}), table)
    template = 'Ratio {a:b}! is {ok!} {{"k": "v:w!"}}'
    with running_fake(rate=2000) as fake:
        plan = gk(["plan", str(table), *_opts(template)[:6], "--json"], env_for(fake))
        done = gk(["submit", str(table), *_opts(template)], env_for(fake))
        prompts = _prompts(fake)
    assert plan.returncode == 0 and orjson.loads(plan.stdout)["to_send"] == 2, plan.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    assert prompts == Counter({_digest('Ratio x! is 1 {"k": "v:w!"}'): 1, _digest('Ratio y! is 2 {"k": "v:w!"}'): 1})


@pytest.mark.parametrize("how", [[], ["--id-column", "id"], ["--system", "You sort {item}"]],
                         ids=["sized", "ids", "planned-through-a-file"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_plan_of_a_big_table_stops_within_a_second(tmp_path: Path, how: list[str], sig: str) -> None:
    """Ctrl-C (or SIGTERM) while `plan` reads and judges a 600,000-row Parquet, as a real process: exit 130, the
    one line, no traceback, within about a second; nothing left in the state folder (issue 59, F9)."""
    import signal
    import time

    from tests.runs import start

    table = tmp_path / "big.parquet"
    pq.write_table(_orders(600_000), table, row_group_size=600_000)  # (one row group: the longest read pyarrow makes)
    run = start(["plan", str(table), *_opts()[:6], "--state", str(tmp_path / "state"), *how], {})
    time.sleep(1.5)
    assert run.poll() is None, "the plan ended before it could be stopped"
    signalled = time.monotonic()
    run.send_signal(getattr(signal, sig))
    out, err = run.communicate(timeout=60)
    took = time.monotonic() - signalled
    # (once in a full run at load 15, exit 0 with nothing on stderr: the output says whether the plan had finished)
    assert run.returncode == 130 and err == "gatekeeper: interrupted\n" and out == "", (run.returncode, err[-2000:],
                                                                                      out[-600:], took)
    assert took < 1.5, took  # (about a second at any load this suite runs at)
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("*.jsonl"))


# -- 1. the ledger names a table job by its table ---------------------------------------------------------------------

def test_a_table_job_is_named_by_its_table_on_the_ledger(tmp_path: Path) -> None:
    """A cold tester's finding (issue 59): other jobs and `status` named a table job by its run's file, a hash.
    A table job waiting on a full queue is named by its table's file name in the ledger's jobs, as `status --json`
    lists them, never by its run."""
    from tests.runs import start, wait_until

    table = tmp_path / "tickets.csv"
    pacsv.write_csv(_orders(30), table)
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    with running_fake(rate=0.0) as fake:
        run = start(["submit", str(table), *_opts(), "--ledger", ledger, "--json"], env_for(fake))
        try:
            def named() -> list[str]:
                shown = gk(["status", "--json", "--ledger", ledger], env_for(fake))
                assert shown.returncode in (0, 1), shown.stderr[-2000:]
                return [j["job"] for j in orjson.loads(shown.stdout)["ledger"]["jobs"]]
            wait_until(lambda: bool(named()), "the table job's claim", timeout=60)
            assert named() == ["tickets.csv"]
        finally:
            run.kill()
            run.communicate()
