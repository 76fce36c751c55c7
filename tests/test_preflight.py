"""Preflight against the live Models API: doomed lines are rejected with their line numbers and never sent."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from gatekeeper.checks._preflight import Preflight, judge_model, needs_second_pass
from gatekeeper.testing import DEFAULT_MODELS, FakeModel, fake_token_count
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk

pytestmark = pytest.mark.anyio

FAST = ["--interval", "0.05", "--reconcile-grace", "1", "--max-rpm", "60000", "--json"]
MODELS = (*DEFAULT_MODELS, FakeModel("claude-legacy-1", (), "Legacy", 4096, 100_000, batch=False))


def _mixed(tmp_path: Path) -> tuple[Path, dict[int, str], set[str]]:
    """Valid lines (aliases and dated ids) mixed with doomed ones; (path, doomed line -> why, valid ids)."""
    rows = [
        req("a0", model="claude-haiku-4-5"),  # an alias
        req("a1", model="claude-haiku-4-5-20251001"),  # its dated id
        req("d0", model="claude-sonet-5"),  # a typo: unknown
        req("a2", model="claude-sonnet-5", max_tokens=128_000),  # exactly the limit
        req("d1", model="claude-legacy-1"),  # no batch support
        req("d2", model="claude-haiku-4-5", max_tokens=64_001),  # over the limit
        req("a3", model="claude-opus-5"),
    ]
    doomed = {3: "not a model the Models API knows", 5: "does not take batch requests", 6: "above the model's limit"}
    return write_jsonl(tmp_path / "in.jsonl", rows), doomed, {"a0", "a1", "a2", "a3"}


def test_plan_with_a_key_lists_exactly_the_doomed_lines(tmp_path: Path) -> None:
    """plan with a key: the unknown model (with the closest ids), the batch-less one and the max_tokens over the
    limit are rejected lines; aliases and dated ids pass; the report says the models were checked."""
    path, doomed, _ = _mixed(tmp_path)
    with running_fake(models=MODELS) as fake:
        proc = gk(["plan", str(path), "--json"], env_for(fake, admin=False))
    out = orjson.loads(proc.stdout)
    assert proc.returncode == 1
    got = {e["line"]: e["reason"] for e in out["errors"]}
    assert set(got) == set(doomed) and all(doomed[k] in got[k] for k in doomed)
    assert "claude-sonnet-5" in got[3]  # the closest id the API lists
    pf = out["preflight"]
    assert pf["checked"] and pf["models"]["claude-haiku-4-5"]["resolved"] == "claude-haiku-4-5-20251001"
    assert pf["models"]["claude-legacy-1"]["lines_rejected"] == 1 and pf["models"]["claude-sonet-5"]["lines_rejected"] == 1


def test_plan_without_a_key_says_the_models_were_not_checked(tmp_path: Path) -> None:
    """No key: nothing is asked, nothing is rejected for its model, and the report says so."""
    path, _, _ = _mixed(tmp_path)
    out = orjson.loads(gk(["plan", str(path), "--json"], {}).stdout)
    assert out["invalid"] == 0 and out["preflight"]["checked"] is False


def test_submit_sends_none_of_the_doomed_lines(tmp_path: Path) -> None:
    """submit preflights before its first create: no request errors at processing for its model; the rest finish."""
    path, doomed, valid = _mixed(tmp_path)
    with running_fake(models=MODELS, ceiling=1000, rate=5000) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 1, proc.stderr  # rejected lines are a finding
        s = orjson.loads(proc.stdout)
        assert (s["succeeded"], s["invalid"]) == (4, 3)
        assert fake.org.records.doomed == {}  # nothing errored for its model
        assert set(fake.org.records.attempts) == valid
        assert s["preflight"]["checked"]


@pytest.mark.parametrize("mode", ["404", "500"])
def test_a_missing_or_failing_models_api_never_blocks_the_job(tmp_path: Path, mode: str) -> None:
    """A Models API that answers 404 or 500 everywhere: a warning, the models unchecked, the job runs."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"r{i}") for i in range(10)])
    with running_fake(ceiling=1000, rate=5000, models_api=mode) as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert any(e["event"] == "preflight_skipped" for e in events(proc.stderr))
        assert orjson.loads(proc.stdout)["preflight"]["checked"] is False
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", {f"r{i}" for i in range(10)})
        plan = gk(["plan", str(path)], env_for(fake))
        assert plan.returncode == 0 and "warning: the Models API could not be used" in plan.stderr
        assert "not checked" in plan.stdout


def test_resume_does_not_ask_again(tmp_path: Path) -> None:
    """The answers are kept in the journal: a resumed run asks the Models API nothing."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"r{i}") for i in range(10)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        crashed = gk(["submit", str(path), *FAST], env_for(fake), crash_at="after-create:1")
        assert crashed.returncode != 0
        asked = fake.org.records.requests_seen.get("model", 0)
        assert asked >= 1
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr
        assert fake.org.records.requests_seen.get("model", 0) == asked


# -- the pure part -------------------------------------------------------------

@pytest.mark.parametrize(("info", "refused", "limit"), [
    (None, "not a model the Models API knows", None),
    ({"id": "m-1", "max_tokens": 100, "capabilities": {"batch": {"supported": False}}}, "does not take batch", 100),
    ({"id": "m-1", "max_tokens": 100, "capabilities": {"batch": {"supported": True}}}, None, 100),
    ({"id": "m-1"}, None, None),  # older answers without the newer fields: usable, nothing to judge by
])
def test_judge(info: dict | None, refused: str | None, limit: int | None) -> None:
    """A model is refused when unknown or without batch support; its max_tokens limit is kept when given."""
    m = judge_model("m", info, ["m-1", "m-2"])
    assert (m.refused is None) is (refused is None) and (refused is None or refused in m.refused)
    assert m.max_tokens == limit


def test_second_pass_only_when_a_line_can_fail() -> None:
    """No second reading of the file unless a model is refused or a max_tokens seen is above a limit."""
    ok = Preflight(True, None, {"m": judge_model("m", {"id": "m", "max_tokens": 100}, [])})
    assert not needs_second_pass(ok, {"m": 100})
    assert needs_second_pass(ok, {"m": 101})
    assert needs_second_pass(Preflight(True, None, {"x": judge_model("x", None, [])}), {"x": 1})
    assert not needs_second_pass(Preflight(False, "down"), {"m": 10**6})


# -- the budget, end to end ----------------------------------------------------

def test_budget_stops_before_it_and_a_higher_budget_finishes(tmp_path: Path) -> None:
    """--budget: batches are cut to what the budget allows and admission stops before it (exit 1, a clear line);
    the actual cost stays under it; a rerun with a higher budget finishes, nothing sent twice."""
    ids = {f"b{i:04d}" for i in range(1000)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c, text="Hello") for c in sorted(ids)])
    with running_fake(ceiling=100_000, rate=50_000) as fake:
        proc = gk(["submit", str(path), *FAST, "--budget", "0.05"], env_for(fake))
        assert proc.returncode == 1, proc.stderr
        s = orjson.loads(proc.stdout)
        evs = events(proc.stderr)
        assert any(e["event"] == "recut" for e in evs) and any(e["event"] == "budget_reached" for e in evs)
        assert 0 < s["succeeded"] < 1000 and s["budget"]["held_back"] == 1000 - s["succeeded"]
        tokens = fake_token_count(req("b0000", text="Hello")["params"])  # the fake's usage (every prompt alike), haiku prices
        actual = len(fake.org.records.succeeded) * 0.5 * (tokens * 1.0 + 12 * 5.0) / 1e6
        assert s["cost_usd"] == pytest.approx(actual) and actual <= 0.05
        human = gk(["submit", str(path), "--interval", "0.05", "--max-rpm", "60000", "--budget", "0.05"], env_for(fake))
        assert "requests not sent. Rerun with a higher --budget" in human.stdout
        done = gk(["submit", str(path), *FAST, "--budget", "1"], env_for(fake))
        assert done.returncode == 0, done.stderr
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


def test_a_budget_stop_ends_the_run_when_it_is_decided_not_a_poll_later(tmp_path: Path) -> None:
    """With a 3 s poll, the budget's verdict on the batch that waited for the ones in flight is taken as soon as
    their collection freed budget: a cut batch goes at once and the stop follows its batch's collection at once (it
    waited a whole poll after each collection before)."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"b{i:04d}", text="Hello") for i in range(1000)])
    with running_fake(ceiling=100_000, rate=50_000) as fake:
        proc = gk(["submit", str(path), "--interval", "3", "--max-rpm", "60000", "--json", "--budget", "0.05"],
                  env_for(fake))
    assert proc.returncode == 1, proc.stderr[-2000:]
    evs = events(proc.stderr)
    at = {e["event"]: e["t"] for e in evs}  # (each event's last time)
    collected = [e["t"] for e in evs if e["event"] == "collected"]
    recut = [e["t"] for e in evs if e["event"] == "recut"]
    later = [r for r in recut if r > collected[0]]
    # (each at its collection, not the 3 s poll after it: 2 s is a loaded machine's margin)
    assert later and all(any(0 <= r - c < 2.0 for c in collected) for r in later), evs
    assert 0 <= at["budget_reached"] - collected[-1] < 2.0 and at["finished"] - at["budget_reached"] < 2.0


def test_the_budget_holds_under_a_price_table_whose_cache_writes_cost_five_times_input(tmp_path: Path) -> None:
    """A cold job of marked documents (each request its own: every request writes its document) under a table whose
    5-minute write costs 5x input: the worst case prices input at the table's own dearest rate, so the bill (the
    fake's billed tokens at that table) never passes the budget, though the default multipliers' worst case
    would have let every batch go (and billed about twice the budget)."""
    from gatekeeper import load_prices

    rows = [{"custom_id": f"d{i:04d}", "params": {
        "model": "claude-opus-5", "max_tokens": 16, "messages": [{"role": "user", "content": f"question {i}"}],
        "system": [{"type": "text", "text": f"document {i:04d}: " + "lorem ipsum " * 200,
                    "cache_control": {"type": "ephemeral"}}]}} for i in range(1000)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    table = tmp_path / "prices.json"
    table.write_bytes(orjson.dumps({"as_of": "test", "models": {"claude-opus-5": {
        "input": 1.0, "output": 5.0, "cache_write": 5.0, "cache_write_1h": 10.0, "cache_read": 0.1}}}))
    size = len(orjson.dumps(rows[0]))  # (every line is within a few bytes of it)
    old_worst = 1000 * 0.5 * (size / 2 * 1.0 * 1.25 + 16 * 5.0) / 1e6  # the default multipliers' worst case
    budget = round(old_worst * 1.05, 6)
    with running_fake(ceiling=100_000, rate=50_000) as fake:
        proc = gk(["submit", str(path), *FAST, "--budget", str(budget), "--prices", str(table), "--no-prime",
                   "--max-requests", "250"], env_for(fake))
        assert proc.returncode == 1, proc.stderr[-2000:]
        billed = fake.org.records.billed["claude-opus-5"]
    prices = load_prices(table)
    bill = prices.cost("claude-opus-5", billed[0], billed[1], billed[2] + billed[3], billed[4], billed[3])
    assert bill is not None and 0 < bill <= budget
    assert billed[2] > 0 and orjson.loads(proc.stdout)["budget"]["held_back"] > 0
    per_request = bill / len(fake.org.records.succeeded)
    assert per_request * 1000 > 1.5 * budget  # (sending everything would have passed the budget)


def test_budget_with_an_unpriced_model_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """A budget cannot be kept for a model without a price: exit 2 before any create."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a", model="claude-unpriced-9")])
    with running_fake(models=(*DEFAULT_MODELS, FakeModel("claude-unpriced-9")), ceiling=1000, rate=5000) as fake:
        proc = gk(["submit", str(path), *FAST, "--budget", "10"], env_for(fake))
        assert proc.returncode == 2 and "claude-unpriced-9" in proc.stderr
        assert fake.org.records.creates == 0


# -- measured tokens -------------------------------------------------------------

def test_token_estimate_is_measured_within_5_percent(tmp_path: Path) -> None:
    """With a key, the input-token estimate comes from count_tokens on a sample per model, within 5% of the
    fake's own count over the whole file; without one it is bytes / 4, labelled so."""
    import random

    from gatekeeper.checks._calibrate import count_body
    from gatekeeper.testing import fake_token_count

    rng = random.Random(7)
    rows = [req(f"t{i}", model=("claude-sonnet-5" if i % 3 else "claude-opus-5"),
                text=" ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(5, 400))))
            for i in range(3000)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    truth: dict[str, int] = {}
    for r in rows:
        truth[r["params"]["model"]] = truth.get(r["params"]["model"], 0) + fake_token_count(count_body(r["params"]))
    with running_fake() as fake:
        out = orjson.loads(gk(["plan", str(path), "--json"], env_for(fake, admin=False)).stdout)
    for model, tokens in truth.items():
        est = out["estimate"]["models"][model]
        assert est["method"] == "count_tokens" and est["sample"] == 50
        assert abs(est["input_tokens"] - tokens) / tokens < 0.05, (model, est, tokens)
    bare = orjson.loads(gk(["plan", str(path), "--json"], {}).stdout)["estimate"]
    assert "bytes / 4" in bare["method"] and all(m["method"] == "bytes / 4" for m in bare["models"].values())


@pytest.mark.parametrize("whole", [True, False], ids=["read-whole", "probed"])
@pytest.mark.parametrize(("lines_a", "lines_b", "per_model"), [(3, 0, 5), (40, 7, 5), (200, 1, 50), (0, 0, 5)])
def test_token_sample_is_each_models_lines_up_to_the_size_reproducibly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: bool, lines_a: int, lines_b: int, per_model: int) -> None:
    """Each model's sample is min(its lines, per_model) distinct lines, the same on every run, whether the file is
    small enough to be read whole or large enough to be probed at random offsets."""
    import gatekeeper.checks._calibrate as calibrate

    if not whole:
        monkeypatch.setattr(calibrate, "WHOLE_FILE_BYTES", 0)
    rows = [req(f"a{i}", model="m-a", text=f"a {i}") for i in range(lines_a)] + \
           [req(f"b{i}", model="m-b", text=f"b {i}") for i in range(lines_b)]
    path = str(write_jsonl(tmp_path / "in.jsonl", rows))
    picked = calibrate.pick_samples(path, ["m-a", "m-b", "m-none"], per_model=per_model)
    texts = {m: [p["messages"][0]["content"] for _, p in rows] for m, rows in picked.items()}
    want = {"m-a": lines_a, "m-b": lines_b, "m-none": 0}
    for model, have in want.items():
        sample = texts[model]
        assert len(sample) == len(set(sample)) == min(have, per_model), (model, sample)
    if whole:  # every line of a model is read: a model with fewer lines than the sample has all of them
        assert lines_b > per_model or sorted(texts["m-b"]) == sorted(f"b {i}" for i in range(lines_b))
    assert calibrate.pick_samples(path, ["m-a", "m-b", "m-none"], per_model=per_model) == picked


def test_token_sampling_of_few_huge_lines_reads_a_bounded_amount(tmp_path: Path) -> None:
    """Two models of 30 lines of 2 MB each, a sample of 50 that can never fill: the probes stop at their byte
    budget (64 MB) instead of reading lines to their ends 20,000 times (minutes at full CPU before)."""
    import gatekeeper.checks._calibrate as calibrate

    rows = [req(f"r{i}", model=("m-a", "m-b")[i % 2], text="x" * (2 << 20)) for i in range(60)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    started = time.process_time()  # (this process's CPU: what the reads cost, not how busy the machine is)
    picked = calibrate.pick_samples(str(path), ["m-a", "m-b"], per_model=50)
    assert all(0 < len(picked[m]) <= 30 for m in ("m-a", "m-b")), {m: len(v) for m, v in picked.items()}
    assert time.process_time() - started < 5


@pytest.mark.parametrize("fault", [{"status": 429, "retry_after": "0"}, {"status": 529}, {"kind": "drop"}],
                         ids=["429", "529", "dropped"])
def test_a_rough_count_tokens_is_ridden_out(tmp_path: Path, fault: dict) -> None:
    """count_tokens answering 429 (with retry-after), 529 or dropping the connection: the call is tried again and
    the small file's whole sample is still measured. (One fault a run: the preflight's policy is one retry a call,
    and with eight calls in flight two faults could meet the same call.)"""
    from gatekeeper.testing import Fault

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"c{i}", text="word " * i) for i in range(20)])
    with running_fake() as fake:
        fake.inject(Fault("count_tokens", **fault))
        rough = gk(["plan", str(path), "--json"], env_for(fake, admin=False))
        assert not any(f.times for f in fake.faults.items)  # the fault was met
    assert rough.returncode == 0, rough.stderr
    model = orjson.loads(rough.stdout)["estimate"]["models"]["claude-haiku-4-5-20251001"]
    assert model["method"] == "count_tokens" and model["sample"] == 20


def test_count_tokens_down_leaves_the_estimate_to_bytes_per_token(tmp_path: Path) -> None:
    """count_tokens failing every time: plan still plans (exit 0, no traceback), the estimate labelled bytes / 4."""
    from gatekeeper.testing import Fault

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"c{i}") for i in range(20)])
    with running_fake() as fake:
        fake.inject(Fault("count_tokens", status=500, times=10_000))
        down = gk(["plan", str(path), "--json"], env_for(fake, admin=False))
    assert down.returncode == 0 and "Traceback" not in down.stderr
    estimate = orjson.loads(down.stdout)["estimate"]
    assert "bytes / 4" in estimate["method"] and estimate["models"]["claude-haiku-4-5-20251001"]["method"] == "bytes / 4"


async def test_library_preflight_reports_models_and_tokens(tmp_path: Path) -> None:
    """gatekeeper.preflight (the library) gives plan's report with the models judged and the tokens measured."""
    import gatekeeper

    path, doomed, _ = _mixed(tmp_path)
    with running_fake(models=MODELS) as fake:
        config = gatekeeper.ApiConfig(workspace_keys=[gatekeeper.Secret("test-key-ws1")], base_url=fake.url)
        report = await gatekeeper.preflight(str(path), config=config)
    assert {e.line for e in report.errors} == set(doomed)
    assert report.preflight is not None and report.preflight["checked"]
    assert report.calibration is not None and report.calibration["measured"]


def test_plan_with_a_key_and_no_api_still_plans(tmp_path: Path) -> None:
    """plan needs no API: with a key set but nothing answering at the base URL, it warns and plans (exit 0)."""
    from tests.services import free_port

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"p{i}") for i in range(5)])
    url = f"http://127.0.0.1:{free_port()}"
    proc = gk(["plan", str(path), "--json"], {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": url})
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout)
    assert out["requests"] == 5 and out["preflight"]["checked"] is False
    assert proc.stderr.count("warning") == 1 and url in proc.stderr and "Traceback" not in proc.stderr


async def test_planning_leaves_the_event_loop_free() -> None:
    """Planning reads the whole input (minutes for gigabytes) in a thread: the event loop, where the heartbeats of a
    run's lease and reservations run, keeps turning meanwhile. Here a slow source takes 0.3 s to read."""
    import time

    import anyio

    from gatekeeper import Limits
    from gatekeeper.checks._preflight import plan_checked

    def slow_source():
        for i in range(10):
            time.sleep(0.03)  # a slow disk
            yield orjson.dumps(req(f"s{i}"))

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        report = await plan_checked(slow_source(), None, limits=Limits())
        tg.cancel_scope.cancel()
    assert report.requests == 10
    assert ticks >= 10, f"the event loop turned {ticks} times in 0.3 s of planning"  # 0 when planning held it


@pytest.mark.parametrize("command", ["plan", "submit"])
def test_a_refused_key_is_exit_2_naming_the_variable(tmp_path: Path, command: str) -> None:
    """A key the API refuses (401) is not "no key": plan and submit stop with one line naming the variable."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with running_fake(ceiling=1000, rate=5000) as fake:
        proc = gk([command, str(path), *(FAST if command == "submit" else [])],
                  {**env_for(fake), "ANTHROPIC_API_KEY": "not-a-key"})
        assert fake.org.records.creates == 0
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "ANTHROPIC_API_KEY" in last and "refused" in last and "not-a-key" not in proc.stderr + proc.stdout
