"""Results that finish the job: resubmission rules, the output's invariants, `gatekeeper results`, the library."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from gatekeeper import ApiConfig, SubmitSettings, submit_sync
from gatekeeper.api._config import Secret
from gatekeeper.decide._settle import classify
from gatekeeper.state._journal import Journal
from gatekeeper.testing import DEFAULT_MODELS, FakeModel, Outcome, fake_token_count
from tests.fakes import WS1, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import events, gk, output_ids

FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]


def _rule(cid: str, model: str, attempt: int) -> Outcome | None:
    if model == "no-such-model":
        return Outcome("errored", "invalid_request_error", "model: no-such-model")
    if cid.startswith("exp") and attempt == 1:
        return Outcome("expired")
    if cid.startswith("flaky") and attempt <= 2:
        return Outcome("errored", "overloaded_error" if attempt == 1 else "api_error")
    if cid.startswith("flat") and attempt == 1:
        return Outcome("errored", "api_error", flat=True)
    if cid.startswith("doomed"):
        return Outcome("errored", "overloaded_error")
    return None


def _job(tmp_path: Path) -> tuple[Path, list[str]]:
    items = ([req(f"ok{i}") for i in range(20)] + [req(f"exp{i}") for i in range(5)] + [req(f"flaky{i}") for i in range(4)]
             + [req(f"flat{i}") for i in range(3)] + [req(f"bad{i}", model="no-such-model") for i in range(3)]
             + [req("doomed0")])
    return write_jsonl(tmp_path / "job.jsonl", items), [i["custom_id"] for i in items]


def test_resubmission_rules_end_to_end(tmp_path: Path) -> None:
    """Expired and transient errors are resent and end succeeded; invalid ones are sent once; attempts are capped."""
    path, ids = _job(tmp_path)
    with running_fake(ceiling=1000, rate=5000, outcome=_rule) as fake:
        # --no-preflight: the unknown model goes out and errors at processing, as without a Models API
        proc = gk(["submit", str(path), *FAST, "--no-preflight"], env_for(fake))
        assert proc.returncode == 1, proc.stderr  # some requests did not succeed
        s = orjson.loads(proc.stdout)
        attempts = fake.org.records.attempts
    assert (s["succeeded"], s["errored"]) == (32, 4)
    assert s["errors"] == {"invalid_request_error": 3, "overloaded_error": 1}
    assert all(attempts[f"bad{i}"] == 1 for i in range(3))  # never sent twice
    assert attempts["doomed0"] == 3  # --max-attempts 3, the first included
    assert all(attempts[f"flaky{i}"] == 3 for i in range(4)) and all(attempts[f"exp{i}"] == 2 for i in range(5))
    assert s["resubmitted"] == 5 + 4 + 3 + 1
    assert s["succeeded_after_retry"] == 5 + 4 + 3
    out = Path(str(path) + ".gatekeeper") / "results.jsonl"
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(ids)  # one final line per request
    kinds = Counter(x["result"]["type"] for x in lines)
    assert (kinds["succeeded"], kinds["errored"]) == (s["succeeded"], s["errored"])  # summary equals the file
    params = {o["custom_id"]: o["params"] for o in map(orjson.loads, path.read_bytes().splitlines())}
    ok = [x["custom_id"] for x in lines if x["result"]["type"] == "succeeded"]
    assert s["usage"]["input_tokens"] == sum(fake_token_count(params[c]) for c in ok)  # usage follows each prompt
    assert s["usage"]["output_tokens"] == 12 * 32
    assert any(e["event"] == "resubmitting" for e in events(proc.stderr))
    db = sqlite3.connect(Path(str(path) + ".gatekeeper") / "journal.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 5 + 8 + 3 + 2  # earlier attempts kept


def test_max_attempts_one_sends_nothing_again(tmp_path: Path) -> None:
    """--max-attempts 1: expired results are final."""
    path = write_jsonl(tmp_path / "j.jsonl", [req("exp0"), req("ok")])
    with running_fake(ceiling=1000, rate=5000, outcome=_rule) as fake:
        s = orjson.loads(gk(["submit", str(path), *FAST, "--max-attempts", "1"], env_for(fake)).stdout)
        assert (s["expired"], s["succeeded"], s["resubmitted"]) == (1, 1, 0)
        assert fake.org.records.creates == 1


def test_results_on_another_origin_get_no_key(tmp_path: Path) -> None:
    """A results_url on another origin is fetched without the key; the job still completes."""
    path = write_jsonl(tmp_path / "j.jsonl", [req(f"r{i}") for i in range(10)])
    with running_fake(ceiling=1000, rate=5000, results_origin="signed") as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert fake.org.records.requests_seen.get("results", 0) >= 1
        assert fake.org.records.wrong_origin_keys == 0


def test_results_command_in_order_and_only(tmp_path: Path) -> None:
    """`results --in-order` follows input order; `--only` filters by result and error type; counts match."""
    path, ids = _job(tmp_path)
    with running_fake(ceiling=1000, rate=5000, outcome=_rule) as fake:
        gk(["submit", str(path), *FAST, "--no-preflight"], env_for(fake))
    ordered = tmp_path / "ordered.jsonl"
    proc = gk(["results", str(path), "--in-order", "--out", str(ordered), "--json"], {})
    assert proc.returncode == 0, proc.stderr  # a good export, whatever the results hold
    assert output_ids(ordered) == ids
    assert orjson.loads(proc.stdout)["written"] == len(ids)
    errs = gk(["results", str(path), "--only", "errored"], {})
    assert len(errs.stdout.splitlines()) == 4
    piped = gk(["results", str(path), "--only", "errored", "--json"], {})  # lines on stdout, the summary on stderr
    assert piped.stdout == errs.stdout and orjson.loads(piped.stderr)["written"] == 4 and piped.returncode == 0
    invalid = gk(["results", str(path), "--only", "invalid_request_error"], {})
    assert {orjson.loads(x)["custom_id"] for x in invalid.stdout.splitlines()} == {"bad0", "bad1", "bad2"}
    everything = gk(["results", "--state", str(path) + ".gatekeeper"], {})
    assert sorted(orjson.loads(x)["custom_id"] for x in everything.stdout.splitlines()) == sorted(ids)
    assert gk(["results", "--state", str(tmp_path / "nowhere")], {}).returncode == 2


def test_library_submit_from_iterable_with_result_callback(tmp_path: Path) -> None:
    """submit_sync takes an iterable, spools it, and calls on_result once per final result."""
    seen: list[str] = []
    with running_fake(ceiling=1000, rate=5000, outcome=_rule) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "state", interval=0.05, ceiling=1000, reconcile_grace=1.0)
        rows = (req(f"exp{i}") if i % 3 == 0 else req(f"lib{i}") for i in range(30))
        summary = submit_sync(rows, config=config, settings=settings, on_result=lambda cid, result: seen.append(cid))
        again: list[tuple[str, dict]] = []
        rows = (req(f"exp{i}") if i % 3 == 0 else req(f"lib{i}") for i in range(30))
        rerun = submit_sync(rows, config=config, settings=settings, on_result=lambda cid, r: again.append((cid, r)))
        assert fake.org.records.creates == rerun.batches
    assert summary.succeeded == 30 and summary.complete and summary.ok
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 30
    assert (tmp_path / "state" / "input.jsonl").exists()
    # (a rerun of the finished job hands back every result the first run did, and sends nothing)
    assert sorted(cid for cid, _ in again) == sorted(seen) and all(r["type"] == "succeeded" for _, r in again)


def test_price_override_and_cost(tmp_path: Path) -> None:
    """The cost comes from the price table at batch prices; a user table overrides it; unknown models give null."""
    prices = tmp_path / "prices.json"
    prices.write_text('{"as_of": "test", "models": {"claude-haiku-4-5": {"input": 2.0, "output": 10.0}}}')
    path = write_jsonl(tmp_path / "j.jsonl", [req(f"r{i}") for i in range(4)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        s = orjson.loads(gk(["submit", str(path), *FAST, "--prices", str(prices)], env_for(fake)).stdout)
    tokens = sum(fake_token_count(req(f"r{i}")["params"]) for i in range(4))
    assert s["cost_usd"] == pytest.approx(0.5 * (tokens * 2.0 + 4 * 12 * 10.0) / 1e6)
    path2 = write_jsonl(tmp_path / "k.jsonl", [req("x", model="mystery-model")])
    with running_fake(ceiling=1000, rate=5000, models=(*DEFAULT_MODELS, FakeModel("mystery-model"))) as fake:
        s = orjson.loads(gk(["submit", str(path2), *FAST], env_for(fake)).stdout)
    assert s["cost_usd"] is None


def test_plan_estimates_tokens_and_cost(tmp_path: Path) -> None:
    """plan estimates input tokens from request bytes and prices them."""
    path = write_jsonl(tmp_path / "j.jsonl", [req(f"r{i}", text="x" * 400) for i in range(10)])
    out = orjson.loads(gk(["plan", str(path), "--json"], {}).stdout)
    est = out["estimate"]
    assert est["input_tokens"] == round(out["request_bytes"] / 4)
    assert est["input_cost_usd"] == pytest.approx(0.5 * est["input_tokens"] * 1.0 / 1e6, abs=1e-4)


@pytest.mark.parametrize(
    ("result", "retry", "etype"),
    [({"type": "succeeded"}, False, None), ({"type": "expired"}, True, None), ({"type": "canceled"}, True, None),
     ({"type": "errored", "error": {"type": "error", "error": {"type": "api_error"}}}, True, "api_error"),
     ({"type": "errored", "error": {"type": "overloaded_error", "message": "x"}}, True, "overloaded_error"),
     ({"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error"}}}, False, "invalid_request_error"),
     ({"type": "errored", "error": {"type": "error", "error": {"type": "brand_new_error"}}}, False, "brand_new_error"),
     ({"type": "mystery"}, False, None), ("garbage", False, None)],
)
def test_classify(result: object, retry: bool, etype: str | None) -> None:
    """Transient errors, expired and canceled are retried; the rest, unknown types included, are final."""
    v = classify(result)
    assert (v.retry, v.error_type) == (retry, etype)


_USAGE = {"input_tokens": 11, "output_tokens": 36, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 40,
          "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20}, "service_tier": "batch"}


@pytest.mark.parametrize("result", [
    {"type": "succeeded", "message": {"id": "msg_1", "model": "m", "content": [{"type": "text", "text": "x" * 5000}],
                                      "stop_reason": "refusal", "usage": _USAGE}},
    {"type": "succeeded", "message": {"model": "m", "content": [], "usage": {"input_tokens": "7", "output_tokens": None}}},
    {"type": "succeeded", "message": {"model": "m", "stop_reason": 5}},  # (no usage: a gateway's)
    {"type": "succeeded", "message": "not an object"}, {"type": "succeeded", "message": None}, {"type": "succeeded"},
    {"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error", "message": "m"}}},
    {"type": "errored", "error": {"type": "invalid_request_error", "message": "flat"}},
    {"type": "expired"}, {"type": "canceled"}, {"type": "mystery"}, {}, "garbage", None, [1],
])
def test_a_result_line_read_by_its_types_gets_the_verdicts_of_its_values(result: object) -> None:
    """A downloaded line is decoded by types that skip the answer's text (`read_line`): its verdict, usage, stop
    reason and billed prompt are the ones its plain values give, whatever shape a gateway sends."""
    from gatekeeper.decide._settle import read_line, stop_of, usage_of
    from gatekeeper.run.batch._evidence import billed_prompt

    raw = orjson.dumps({"custom_id": "c1", "result": result})
    cid, typed = read_line(raw)
    assert cid == "c1"
    assert classify(typed) == classify(result)
    if isinstance(result, dict):
        assert usage_of(typed) == usage_of(result) and stop_of(typed) == stop_of(result)
        assert billed_prompt(typed) == billed_prompt(result)
    assert read_line(b'["not", "an", "object"]')[0] is None


@pytest.mark.parametrize("cut", [1, 7, 64, 1000])
def test_streamed_results_are_cut_into_lines_across_chunks(cut: int) -> None:
    """The results stream's lines, however its chunks fall: each non-blank line once, stripped (CRLF, blanks), a
    line longer than many chunks whole, and a last line without its newline."""
    import anyio

    from gatekeeper.api._client import _lines

    lines = [b'{"a":1}', b"", b'  {"b":2}\r', b'{"c":"' + b"x" * 3000 + b'"}', b"\r", b'{"d":4}']
    body = b"\n".join(lines)

    class Chunked:
        async def aiter_bytes(self):  # type: ignore[no-untyped-def]
            for k in range(0, len(body), cut):
                yield body[k:k + cut]

    async def read() -> list[bytes]:
        return [line async for line in _lines(Chunked())]  # type: ignore[arg-type]

    assert anyio.run(read) == [line.strip() for line in lines if line.strip()]


def test_user_canceled_is_not_retried() -> None:
    assert classify({"type": "canceled"}, user_canceled=True).retry is False


def test_library_resume_with_other_requests_is_refused(tmp_path: Path) -> None:
    """Resuming an iterable job with different requests is refused; with the same ones it resumes."""
    from gatekeeper._errors import JournalError

    with running_fake(ceiling=1000, rate=5000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "state", interval=0.05, ceiling=1000, reconcile_grace=1.0)
        first = submit_sync([req(f"a{i}") for i in range(5)], config=config, settings=settings)
        again = submit_sync([req(f"a{i}") for i in range(5)], config=config, settings=settings)
        assert first.succeeded == again.succeeded == 5 and fake.org.records.creates == 1
        with pytest.raises(JournalError, match="other requests"):
            submit_sync([req("b0")], config=config, settings=settings)


def test_cancelled_mid_create_is_reconciled_not_resent(tmp_path: Path) -> None:
    """A library call cancelled while the server holds an accepted create keeps the intent; the resume adopts it."""
    import anyio

    from gatekeeper import submit
    from gatekeeper.state._journal import BatchState
    from gatekeeper.testing import Fault

    path = write_jsonl(tmp_path / "j.jsonl", [req(f"c{i}") for i in range(10)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.inject(Fault("create", kind="delay_after_commit", delay=3.0))
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(state_dir=tmp_path / "state", interval=0.05, ceiling=1000, reconcile_grace=1.0)

        async def cancelled() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: submit(path, config=config, settings=settings))
                with anyio.fail_after(20):
                    while fake.org.records.creates == 0:  # the server holds the create; its answer is late
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()

        anyio.run(cancelled)
        j = Journal.open(tmp_path / "state")
        assert [b.state for b in j.batches()] == [BatchState.INTENT]
        j.close()
        summary = submit_sync(path, config=config, settings=settings)
        assert summary.succeeded == 10 and fake.org.records.creates == 1


def test_results_for_pipelines_rejected_lines_exit_codes_and_a_closed_pipe(tmp_path: Path) -> None:
    """Rejected input lines do not fail a good export (exit 0, like report) and are said on stderr; `--only
    rejected` lists them with line and reason; a reader that closes the pipe early ends the export quietly."""
    items: list[dict | bytes] = [req(f"r{i}", text="x" * 200) for i in range(3000)]
    items[5] = b'{"custom_id": "broken", "params": '
    items[9] = req("r1")  # a duplicate id
    path = write_jsonl(tmp_path / "in.jsonl", items)
    with running_fake(ceiling=100_000, rate=50_000) as fake:
        assert gk(["submit", str(path), *FAST], env_for(fake)).returncode == 1  # the submit reports its findings
    proc = gk(["results", str(path), "--out", str(tmp_path / "out.jsonl")], {})
    assert proc.returncode == 0 and "2 input line(s) were rejected" in proc.stderr, proc.stderr
    assert gk(["report", str(path), "--json"], {}).returncode == 0
    rejected = gk(["results", str(path), "--only", "rejected"], {})
    lines = [orjson.loads(x) for x in rejected.stdout.splitlines()]
    assert [(x["line"], x["result"]["type"]) for x in lines] == [(6, "rejected"), (10, "rejected")]
    assert "duplicate" in lines[1]["result"]["reason"] and lines[1]["custom_id"] == "r1"
    both = gk(["results", str(path), "--only", "errored,rejected"], {})
    assert len(both.stdout.splitlines()) == 2 and both.returncode == 0
    head = subprocess.Popen([sys.executable, "-m", "gatekeeper", "results", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert head.stdout is not None and head.stdout.readline().startswith(b'{"custom_id"')
    head.stdout.close()  # `| head -1`
    _, err = head.communicate(timeout=60)
    assert head.returncode == 0 and err == b"", err


def test_doomed_cache_markers_are_rejected_lines_never_sent(tmp_path: Path) -> None:
    """Five markers, or a 1h after a 5m, in a request: `plan` and `submit` reject those lines with their line
    numbers and why; the rest is sent and succeeds, and the fake (which errors them at processing) never sees them."""
    def marked(cid: str, *lives: str) -> dict:
        blocks = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral", "ttl": t}} for i, t in enumerate(lives)]
        return {"custom_id": cid, "params": {"model": "claude-haiku-4-5", "max_tokens": 16,
                                             "messages": [{"role": "user", "content": blocks}]}}

    rows = [req("ok0"), marked("five", "5m", "5m", "5m", "5m", "5m"), marked("fine", "1h", "5m"),
            marked("late", "5m", "1h"), req("ok1")]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    planned = orjson.loads(gk(["plan", str(path), "--json"], {}).stdout)
    assert [(e["line"], e["custom_id"]) for e in planned["errors"]] == [(2, "five"), (4, "late")]
    assert "at most 4" in planned["errors"][0]["reason"] and "1h markers first" in planned["errors"][1]["reason"]
    with running_fake(ceiling=1000, rate=5000) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        sent = {cid for b in fake.org.batches.values() for cid, _ in b.requests}
    assert proc.returncode == 1 and sent == {"ok0", "fine", "ok1"}, proc.stderr
    s = orjson.loads(proc.stdout)
    assert (s["succeeded"], s["invalid"]) == (3, 2)


def test_answers_that_stopped_early_are_told_apart_and_exported(tmp_path: Path) -> None:
    """A refusal and a max_tokens truncation are billed successes: the summary (human and --json) counts them by stop
    reason, `results --only refused` / `--only truncated` export just those lines, and the report and the exporter
    show them."""
    from prometheus_client.parser import text_string_to_metric_families

    def rule(cid: str, model: str, attempt: int) -> Outcome | None:
        return Outcome(stop_reason="refusal" if cid.startswith("r") else "max_tokens") if cid[0] in "rt" else None

    ids = [f"r{i}" for i in range(3)] + [f"t{i}" for i in range(5)] + [f"ok{i}" for i in range(12)]
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in ids])
    with running_fake(ceiling=1000, rate=5000, outcome=rule) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        human = gk(["submit", str(path), "--interval", "0.05"], env_for(fake))
    s = orjson.loads(proc.stdout)
    assert s["succeeded"] == 20 and s["stop_reasons"] == {"end_turn": 12, "max_tokens": 5, "refusal": 3}
    assert "stopped early: max_tokens 5 · refusal 3 (`gatekeeper results --only refused,truncated`" in human.stdout
    refused = gk(["results", str(path), "--only", "refused"], {})
    assert refused.returncode == 0 and sorted(orjson.loads(x)["custom_id"] for x in refused.stdout.splitlines()) == ids[:3]
    truncated = gk(["results", str(path), "--only", "truncated", "--in-order"], {})
    assert [orjson.loads(x)["custom_id"] for x in truncated.stdout.splitlines()] == ids[3:8]
    both = gk(["results", str(path), "--only", "refused,truncated"], {})
    assert len(both.stdout.splitlines()) == 8
    report = gk(["report", str(path), "--json"], {})
    assert orjson.loads(report.stdout)["summary"]["stop_reasons"]["refusal"] == 3
    html = gk(["report", str(path), "--out", str(tmp_path / "r.html")], {})
    assert html.returncode == 0 and "Succeeded answers by stop reason" in (tmp_path / "r.html").read_text()
    state = str(path) + ".gatekeeper"
    with running_fake(ceiling=1000, rate=5000) as fake:
        exporter = subprocess.Popen([sys.executable, "-m", "gatekeeper", "exporter", "--port", "0", "--interval", "1",
                                     "--json", "--state", state], stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, **env_for(fake), "PYTHONPATH": os.getcwd()})
        try:
            assert exporter.stdout is not None
            import httpx

            url = orjson.loads(exporter.stdout.readline())["url"]
            for _ in range(100):  # (the run's figures appear with the first reading)
                page = httpx.get(url, timeout=10).text
                if "gatekeeper_run_succeeded_requests{" in page:
                    break
                time.sleep(0.1)
        finally:
            exporter.terminate()
            exporter.communicate(timeout=10)
    got = {(m.name, m.labels.get("stop_reason")): m.value for f in text_string_to_metric_families(page) for m in f.samples
           if m.name == "gatekeeper_run_succeeded_requests"}
    assert got == {("gatekeeper_run_succeeded_requests", "end_turn"): 12, ("gatekeeper_run_succeeded_requests", "max_tokens"): 5,
                   ("gatekeeper_run_succeeded_requests", "refusal"): 3}


def test_results_and_report_without_input_read_the_one_run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's `[INPUT]`: omitted, the one run in the current directory is read (and named on stderr); with
    none or several, exit 2 naming what is there."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a"), req("b")])
    with running_fake(ceiling=1000, rate=5000) as fake:
        assert gk(["submit", str(path), *FAST], env_for(fake)).returncode == 0
    monkeypatch.chdir(tmp_path)
    got = gk(["results"], {})
    assert got.returncode == 0 and sorted(orjson.loads(x)["custom_id"] for x in got.stdout.splitlines()) == ["a", "b"]
    assert "the run in this directory: in.jsonl.gatekeeper" in got.stderr
    assert orjson.loads(gk(["report", "--json"], {}).stdout)["summary"]["succeeded"] == 2
    monkeypatch.chdir(tmp_path.parent)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    none = gk(["results"], {})
    assert none.returncode == 2 and "holds no run" in none.stderr
