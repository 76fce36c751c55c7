"""Prompt caching end to end (issue 28): `plan`'s caching report, and `submit` priming shared prefixes so that the
rest of each group reads the cache, against the fake over HTTP. The fake caches as section 15 of api.md says the
API does: a batch's requests never see each other's writes, so only a prefix written by a batch that has ended
can be read; it bills every token by kind, so a run's reported cost is compared with what the fake billed."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

import gatekeeper.input._parallel
from gatekeeper import ApiConfig, Secret, SubmitSettings, load_prices, plan, submit_sync
from gatekeeper.testing import FakeAPI
from tests.fakes import WS1, env_for, running_fake
from tests.runs import assert_exactly_once, gk

DOCS, QUESTIONS = 24, 5
FLAGS = ["--json", "--interval", "0.05", "--max-rpm", "60000", "--max-requests", "40"]
WORDS = ["revenue", "risk", "margin", "lease", "audit", "segment", "cash", "debt", "goodwill", "tax"]


def corpus(path: Path, *, docs: int = DOCS, short: int = 6, unknown: int = 2, unmarked: int = 4) -> Path:
    """A shuffled document-question job: each filing (about 1,900 fake tokens) asked `QUESTIONS` questions in a marked
    system block, odd filings with the 1h life; `short` requests marking a prefix below the minimum; `unknown`
    requests of a model missing from the minimums table; `unmarked` requests sharing a long unmarked system prompt."""
    rng = random.Random(7)
    rows = []
    for d in range(docs):
        doc = f"Filing {d}: " + " ".join(rng.choice(WORDS) for _ in range(900))
        marker = {"type": "ephemeral", "ttl": "1h" if d % 2 else "5m"}
        rows += [{"custom_id": f"d{d}-q{k}", "params": {
            "model": "claude-sonnet-5", "max_tokens": 32,
            "system": [{"type": "text", "text": doc, "cache_control": marker}],
            "messages": [{"role": "user", "content": f"Question {k} about filing {d}?"}]}} for k in range(QUESTIONS)]
    rows += [{"custom_id": f"short-{i}", "params": {
        "model": "claude-sonnet-5", "max_tokens": 32,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": f"q {i}"}]}} for i in range(short)]
    rows += [{"custom_id": f"new-{i}", "params": {
        "model": "claude-newmodel-9", "max_tokens": 32,
        "system": [{"type": "text", "text": "Context. " * 40, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": f"q {i}"}]}} for i in range(unknown)]
    rows += [{"custom_id": f"plain-{i}", "params": {
        "model": "claude-sonnet-5", "max_tokens": 32, "system": "You are a careful analyst. " * 300,
        "messages": [{"role": "user", "content": f"q {i}"}]}} for i in range(unmarked)]
    rng.shuffle(rows)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_plan_reports_caching_in_text_and_json_and_the_parallel_reader_agrees(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = corpus(tmp_path / "in.jsonl")
    report = orjson.loads(gk(["plan", str(path), "--json"], {}).stdout)["caching"]
    sonnet = report["models"]["claude-sonnet-5"]
    assert (sonnet["requests_marked"], sonnet["prefixes"], sonnet["shared_prefixes"], sonnet["requests_sharing"]) == \
        (DOCS * QUESTIONS + 6, DOCS, DOCS, DOCS * QUESTIONS)
    assert sonnet["below_minimum"] == 6 and sonnet["minimum_tokens"] == 1024 and sonnet["minimum_known"]
    assert sonnet["lives"] == {"1h": DOCS // 2 * QUESTIONS, "5m": DOCS // 2 * QUESTIONS + 6}
    assert 1100 < sonnet["prefix_tokens"]["median"] < 2500
    cost = sonnet["input_cost_usd"]
    assert cost["primed"] < cost["none"] < cost["cold"]  # writes cost more than plain input; reads far less
    other = report["models"]["claude-newmodel-9"]
    assert (other["minimum_tokens"], other["minimum_known"], other["input_cost_usd"]["none"]) == (1024, False, None)
    [unmarked] = report["unmarked"]
    assert (unmarked["part"], unmarked["requests"]) == ("system", 4) and unmarked["saving_usd"] > 0
    text = gk(["plan", str(path)], {}).stdout
    assert "24 distinct prefixes, 24 shared by 120 requests" in text
    assert "6 below the minimum of 1,024 tokens (not cached)" in text and "(assumed: not in the table)" in text
    assert "unmarked: 4 claude-sonnet-5 requests share a system" in text
    monkeypatch.setattr(gatekeeper.input._parallel, "PIECE_BYTES", 8192)  # many pieces, prefixes spread over them
    prices = load_prices()
    two, one = plan(path, workers=2), plan(path)
    assert two.caching(prices) == one.caching(prices)
    # what priming would read: the parallel reader's custom_ids are read back from the file, the same
    a, b = two.cache_scan, one.cache_scan
    assert a is not None and b is not None and len(a) > 100
    assert (list(a.lines), list(a.offsets), a.cids) == (list(b.lines), list(b.offsets), b.cids)


def _billed_cost(fake: FakeAPI) -> float:
    prices = load_prices()
    total = 0.0
    for model, (tin, tout, w5, w1h, read) in fake.org.records.billed.items():
        total += prices.cost(model, tin, tout, w5 + w1h, read, w1h) or 0.0
    return round(total, 6)


def _judge_priming(fake: FakeAPI, path: Path) -> None:
    """Each filing's questions went after the batch of its first one had ended, and every one of them read it."""
    ids = {o["custom_id"] for o in map(orjson.loads, path.read_bytes().splitlines())}
    assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids - {f"new-{i}" for i in range(2)})
    batch_of = {cid: b for b in fake.org.batches.values() for cid, _ in b.requests}
    for d in range(DOCS):
        first = min((batch_of[f"d{d}-q{k}"] for k in range(QUESTIONS)), key=lambda b: b.created_at)
        for k in range(QUESTIONS):
            b = batch_of[f"d{d}-q{k}"]
            assert b is first or (first.ended_at is not None and b.created_at >= first.ended_at), f"d{d}-q{k} went early"
            usage = b.usage[[c for c, _ in b.requests].index(f"d{d}-q{k}")]
            assert (usage.read > 0) == (b is not first), f"d{d}-q{k}: read {usage.read}"


def test_submit_primes_each_shared_prefix_and_the_rest_reads_it(tmp_path: Path) -> None:
    """Through the CLI: every filing's other questions read its cache (100% of the ideal, in rounds of 50), the
    summary's cost is what the fake billed, and the same job sent with --no-prime in one batch (as it was sent
    before priming) reads nothing and costs more than twice as much."""
    path = corpus(tmp_path / "in.jsonl")
    with running_fake(ceiling=100, rate=400, speed=20) as fake:  # rounds of half the queue: 50 requests
        dry = orjson.loads(gk(["submit", str(path), *FLAGS, "--dry-run"], env_for(fake)).stdout)
        assert dry["caching"]["models"]["claude-sonnet-5"]["shared_prefixes"] == DOCS and fake.org.records.creates == 0
        proc = gk(["submit", str(path), *FLAGS], env_for(fake))
        primed = orjson.loads(proc.stdout)
        assert proc.returncode == 1, proc.stderr[-2000:]  # the unknown model's two requests are refused by preflight
        _judge_priming(fake, path)
        assert primed["cost_usd"] == _billed_cost(fake)
        billed = fake.org.records.billed["claude-sonnet-5"]
    c = primed["caching"]
    assert c["read_share_of_ideal"] >= 0.95 and c["read_tokens"] == billed[4]
    assert (c["write_5m_tokens"], c["write_1h_tokens"]) == (billed[2], billed[3]) and c["saving_usd"] > 0
    assert c["priming"]["rounds"] >= 3 and c["priming"]["primers"] == DOCS
    cold_path = corpus(tmp_path / "cold.jsonl")
    with running_fake(rate=400, speed=20) as fake:
        proc = gk(["submit", str(cold_path), *FLAGS[:-2], "--no-prime"], env_for(fake))  # one batch, as users send it
        cold = orjson.loads(proc.stdout)
        assert cold["cost_usd"] == _billed_cost(fake)
    assert cold["caching"]["read_tokens"] == 0 and cold["caching"]["priming"] is None
    assert primed["cost_usd"] < 0.5 * cold["cost_usd"]


@pytest.mark.parametrize("point", ["after-create:1", "after-create:3", "before-results-commit:2", "body-complete:4"])
def test_a_kill_anywhere_in_a_primed_job_loses_nothing_and_sends_nothing_twice(tmp_path: Path, point: str) -> None:
    """SIGKILL at a primer's or a rest's create, or mid-collection; the rerun finishes the job from its journal:
    each request once, every rest after its primer, the cache still read."""
    path = corpus(tmp_path / "in.jsonl", unknown=0)
    # (templated prompts share their prefix: their usage cannot prove a batch found by listing after the kill; with
    # a shared ledger creates go one at a time and it is proven ours; without, its answers would be kept apart)
    ledger = ["--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"]
    with running_fake(ceiling=100, rate=400, speed=20) as fake:
        killed = gk(["submit", str(path), *FLAGS, *ledger], env_for(fake), crash_at=point)
        assert killed.returncode in (-9, 137), killed.stderr[-2000:]
        rerun = gk(["submit", str(path), *FLAGS, *ledger, "--reconcile-grace", "2"], env_for(fake))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        _judge_priming(fake, path)
        s = orjson.loads(rerun.stdout)
        assert s["caching"]["read_share_of_ideal"] >= 0.95 and s["cost_usd"] == _billed_cost(fake)


def test_priming_against_a_rough_api(tmp_path: Path) -> None:
    """The API as rough as it gets: a primer's and a rest's create answers lost after the batch was made, new
    batches missing from the listing and answering 404 for a while, 5xx and 529, every batch's first download
    damaged. Each request still goes once, every rest after its primer has ended, the cache is read, and the
    summary's cost is what the fake billed."""
    from gatekeeper.testing import Fault

    path = corpus(tmp_path / "in.jsonl", unknown=0)
    rough = {"listing_lag": 0.3, "not_found_after_create": 0.2, "results_not_found_after_end": 0.2,
             "null_results_url_after_end": 0.1, "damaged_downloads": 1}
    with running_fake(ceiling=100, rate=400, speed=20, **rough) as fake:
        fake.inject(Fault("create", kind="drop_after_commit", times=2), Fault("create", status=500),
                    Fault("list", status=529), Fault("results", status=500), Fault("retrieve", kind="drop"))
        ledger = ["--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"]  # (templated prompts: see the kill test)
        proc = gk(["submit", str(path), *FLAGS, *ledger, "--reconcile-grace", "2"], env_for(fake))
        assert proc.returncode == 0, proc.stderr[-3000:]
        _judge_priming(fake, path)
        s = orjson.loads(proc.stdout)
        assert s["cost_usd"] == _billed_cost(fake) and s["caching"]["read_share_of_ideal"] >= 0.95
        assert s["adoptions"] is not None and s["adoptions"]["proven"] >= 1  # the lost answers were reconciled


def test_the_library_primes_too_and_a_lost_output_is_rebuilt(tmp_path: Path) -> None:
    """`submit_sync` with the default settings primes (and `prime=False` does not); the output of a primed job,
    lost, is rebuilt from the API by the next run, line for line."""
    path = corpus(tmp_path / "in.jsonl", unknown=0)
    with running_fake(rate=400, speed=20) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        settings = SubmitSettings(interval=0.05, max_rpm=60000, token_sample=2)
        s = submit_sync(path, config=config, settings=SubmitSettings(**{**settings.__dict__, "limits": settings.limits}))
        assert s.caching is not None and s.caching["read_share_of_ideal"] >= 0.95 and s.caching["priming"]["rounds"] == 1
        out = Path(s.output)
        before = sorted(out.read_bytes().splitlines())
        out.unlink()
        again = submit_sync(path, config=config, settings=settings)
        assert sorted(out.read_bytes().splitlines()) == before and again.rebuilt is not None
        creates = fake.org.records.creates
    cold_path = corpus(tmp_path / "cold.jsonl", unknown=0)
    with running_fake(rate=400, speed=20) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        cold = submit_sync(cold_path, config=config, settings=SubmitSettings(interval=0.05, max_rpm=60000, token_sample=2,
                                                                             prime=False))
    assert cold.caching is not None and cold.caching["read_tokens"] == 0 and creates == 3


def test_cancel_of_a_primed_job_and_its_rerun(tmp_path: Path) -> None:
    """cancel while the rests wait for their primers: the live batches are canceled, nothing more is sent; with
    --resume-canceled the rerun sends the rest, each request once."""
    path = corpus(tmp_path / "in.jsonl", unknown=0)
    with running_fake(rate=0.0, cancel_delay=0.0) as fake:
        env = env_for(fake)
        import signal

        from tests.runs import start_and_wait_for_create

        proc = start_and_wait_for_create(["submit", str(path), *FLAGS], env, fake)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        c = gk(["cancel", str(path), "--json"], env)
        assert c.returncode == 0, c.stderr
        sent = fake.org.records.creates
        fake.org.config.rate = 4000
        rest = gk(["submit", str(path), *FLAGS, "--resume-canceled"], env)
        r = orjson.loads(rest.stdout)
        assert rest.returncode == 1 and r["pending"] == 0 and r["canceled"] > 0, rest.stderr[-2000:]
        created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
        assert len(created) == len(set(created)) and fake.org.records.creates > sent
        by_id = defaultdict(int)
        for line in (Path(str(path) + ".gatekeeper") / "results.jsonl").read_bytes().splitlines():
            by_id[orjson.loads(line)["custom_id"]] += 1
        assert set(by_id.values()) == {1} and len(by_id) == r["requests"]


def test_report_and_exporter_show_what_caching_did(tmp_path: Path) -> None:
    """`report` (JSON and HTML) and the exporter's metrics carry the realized reads and writes by life, the read
    share of the ideal and the saving, equal to the summary's."""
    from tests.runs import start
    from tests.test_exporter import _wait_for

    path = corpus(tmp_path / "in.jsonl", unknown=0)
    with running_fake(rate=400, speed=20) as fake:
        s = orjson.loads(gk(["submit", str(path), *FLAGS], env_for(fake)).stdout)["caching"]
        state = str(path) + ".gatekeeper"
        report = orjson.loads(gk(["report", str(path), "--json"], {}).stdout)
        assert gk(["report", str(path), "--out", str(tmp_path / "r.html")], {}).returncode == 0
        html = (tmp_path / "r.html").read_text()
        proc = start(["exporter", "--port", "0", "--interval", "1", "--json", "--state", state, "--max-rpm", "60000"],
                     env_for(fake))
        assert proc.stdout is not None
        m = _wait_for(orjson.loads(proc.stdout.readline())["url"], "gatekeeper_readings_total", 1)
        proc.send_signal(2)
        proc.communicate(timeout=60)
    assert report["summary"]["caching"] == s and s["read_tokens"] > 0 and s["write_1h_tokens"] > 0
    assert "cache write tokens, 1h" in html and f"{s['read_tokens']:,}" in html
    run = ("run", Path(state).name)
    assert m[("gatekeeper_run_cache_tokens", (("kind", "read"), run))] == s["read_tokens"]
    assert m[("gatekeeper_run_cache_tokens", (("kind", "write_1h"), run))] == s["write_1h_tokens"]
    assert m[("gatekeeper_run_cache_read_share", (run,))] == s["read_share_of_ideal"]
    assert m[("gatekeeper_run_cache_saving_usd", (run,))] == pytest.approx(s["saving_usd"])


def test_a_primed_job_in_a_postgresql_journal_survives_a_kill(tmp_path: Path, pg_url: str, job_name: str) -> None:
    """The primer and rest batches, their members, rounds and claimed lines live in a shared journal too: killed
    after a rest's create, the job finishes from PostgreSQL with every request once and the cache read."""
    from tests.test_shared_journal import _without_password

    url, password = _without_password(pg_url)
    path = corpus(tmp_path / "in.jsonl", unknown=0)
    with running_fake(ceiling=100, rate=400, speed=20) as fake:
        env = env_for(fake, PGPASSWORD=password)
        common = [*FLAGS, "--journal", url, "--job", job_name, "--reconcile-grace", "2",
                  "--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"]  # (templated prompts: see the kill test above)
        killed = gk(["submit", str(path), *common], env, crash_at="after-create:3")
        assert killed.returncode in (-9, 137), killed.stderr[-2000:]
        rerun = gk(["submit", str(path), *common], env)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        _judge_priming(fake, path)
        assert orjson.loads(rerun.stdout)["caching"]["read_share_of_ideal"] >= 0.95
