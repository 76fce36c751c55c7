"""Two jobs in one workspace with the same custom_ids and batches of one size: a lost create answer must never
join the other job's answers to our requests (issue 25), nor send our own batch again, whatever the API's usage
says against count_tokens (issue 33).

Every job here is a real CLI process against the fake over HTTP. The fake bills each request's prompt tokens (as
counted, or as `FakeConfig.usage` says: count - k, a scale, a constant, none) and stamps each answer with its
prompt's digest (`prompt_of`), so the judge can tell, line by line, whether a result answers the request it is
joined to.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import orjson
import pytest

from gatekeeper.cli._render import render_summary
from gatekeeper.run.shared._summary import Summary
from gatekeeper.testing import FakeAPI, Fault, prompt_of
from tests.fakes import env_for, running_fake
from tests.runs import events, gk, start

N = 60  # requests a job: one batch each
# (the grace must outlast a create's latency under load plus the listing's lag: shorter ones abandoned creates that
# had reached the server on a loaded CI machine, and sent them again)
# These tests weigh what the results and their usage say: the path that remains without a ledger (`--ledger none`;
# by default creates go one at a time through the host's). A test with a ledger names it after these flags.
FLAGS = ["--json", "--interval", "0.05", "--max-rpm", "60000", "--max-requests", str(N), "--reconcile-grace", "5",
         "--token-sample", "2", "--ledger", "none"]


WORLDS = ["count", "count-20", "scale:0.85", "const:10", "none"]  # what the API bills against count_tokens
TELLING = ("count", "count-20", "scale:0.85")  # usages that follow the prompt: the results can tell jobs apart


def write_job(path: Path, words: str, n: int = N, first: int = 0) -> Path:
    """n requests with the custom_ids every pipeline uses (row-0, row-1, ...), prompts of this job's own, their
    lengths drawn apart from another job's (as two pipelines' prompts are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    test = str(path.parent.parent)  # (tests sharing one ledger at once never send the same input: it is one job)
    rng = random.Random(words)
    with open(path, "wb") as f:
        for i in range(first, first + n):
            text = f"{test} {words} {i}: " + words * rng.randint(1, 40)
            f.write(orjson.dumps({"custom_id": f"row-{i}", "params": {
                "model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}}) + b"\n")
    return path


def kept_apart(x: dict) -> bool:
    """A line of gatekeeper's own in place of an answer whose batch could not be proven this job's."""
    return x["result"]["type"] == "errored" and x["result"]["error"]["error"]["type"] == "gatekeeper_unproven"


def judge(fake: FakeAPI, jobs: list[Path], *, creates: int | None = None) -> dict[Path, int]:
    """Every job has one line per request and each line answers its own request (the prompt the answer was
    billed and stamped for is that line's), or says its answer was kept apart (its batch never proven ours);
    nothing was created or answered twice. How many lines each job kept apart."""
    kept: dict[Path, int] = {}
    for path in jobs:
        params = {o["custom_id"]: o["params"] for o in map(orjson.loads, path.read_bytes().splitlines())}
        out = Path(str(path) + ".gatekeeper") / "results.jsonl"
        lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        assert sorted(x["custom_id"] for x in lines) == sorted(params), f"{path}: not one line per request"
        kept[path] = sum(map(kept_apart, lines))
        for x in lines:
            if kept_apart(x):
                continue
            tokens, digest = prompt_of(params[x["custom_id"]])
            message = x["result"]["message"]
            assert message["id"] == "msg_" + digest, f"{path}: {x['custom_id']} joined to another job's answer"
            assert fake.config.usage != "count" or message["usage"]["input_tokens"] == tokens
    answered = fake.org.records.answered
    sent = sum(len(p.read_bytes().splitlines()) for p in jobs)
    assert set(answered.values()) == {1}, "a request was answered twice"
    # (a request whose line was kept apart may never have been sent: its batch, found by listing, was another's
    # and usage, an estimate, could not say so; nothing is sent again on it)
    assert sent - sum(kept.values()) <= len(answered) <= sent, (len(answered), sent, kept)
    assert fake.org.records.creates == (len(jobs) if creates is None else creates), "a batch was created twice"
    return kept


def ended(proc: subprocess.CompletedProcess[str] | tuple[int, str, str]) -> dict:
    """A submit's summary, having checked its exit: 1 (findings) exactly when answers were kept apart, naming
    their batches; else 0."""
    code, out, err = proc if isinstance(proc, tuple) else (proc.returncode, proc.stdout, proc.stderr)
    summary = orjson.loads(out)
    unproven = (summary["adoptions"] or {}).get("unproven") or []
    assert code == (1 if unproven else 0), err[-3000:]
    assert bool(unproven) == ("gatekeeper_unproven" in summary["errors"])
    return summary


def _run_both(fake: FakeAPI, jobs: list[Path], extra: list[str]) -> list[dict]:
    """Both jobs at once, as two processes sharing the workspace key; their summaries."""
    runs = [start(["submit", str(p), *FLAGS, *extra], env_for(fake)) for p in jobs]
    outs = [r.communicate(timeout=120) for r in runs]
    return [{**ended((r.returncode, out, err)), "events": events(err)} for r, (out, err) in zip(runs, outs, strict=True)]


def listed_unproven(path: Path, truly_ours: set[str] | None = None) -> list[dict]:
    """`results --only unproven`: the answers kept apart, each with its batch; those of `truly_ours` (default:
    every batch listed) checked to answer their own request (the batch kept apart is, in truth, this job's)."""
    proc = gk(["results", str(path), "--only", "unproven"], {})
    assert proc.returncode == 0, proc.stderr
    params = {o["custom_id"]: o["params"] for o in map(orjson.loads, path.read_bytes().splitlines())}
    kept = [orjson.loads(x) for x in proc.stdout.splitlines()]
    for x in kept:
        assert x["batch_id"].startswith("msgbatch_")
        if truly_ours is None or x["batch_id"] in truly_ours:
            assert x["result"]["message"]["id"] == "msg_" + prompt_of(params[x["custom_id"]])[1]
    return kept


def _ledger_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str | None:
    if kind == "none":
        return None
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("redis_url" if kind == "redis" else "pg_database"))


@pytest.mark.parametrize("ledger", ["none", "sqlite", "redis", "postgresql"])
@pytest.mark.parametrize("lost", [1, 2])
def test_two_jobs_with_the_same_ids_never_join_each_others_answers(
        tmp_path: Path, request: pytest.FixtureRequest, ledger: str, lost: int) -> None:
    """Both jobs send one batch of the same size at once; the first `lost` create answers are lost and new
    batches reach the listing a second late. Each job ends with its own answers, whatever it had to compare."""
    url = _ledger_url(ledger, tmp_path, request)
    jobs = [write_job(tmp_path / "a" / "in.jsonl", "alpha"), write_job(tmp_path / "b" / "in.jsonl", "beta gamma ")]
    with running_fake(ceiling=10_000, rate=60, listing_lag=1.0) as fake:
        fake.inject(Fault("create", kind="drop_after_commit", times=lost))
        summaries = _run_both(fake, jobs, ["--ledger", url] if url else [])
        judge(fake, jobs)
    adoptions = [s["adoptions"] for s in summaries if s["adoptions"]]
    assert len(adoptions) == lost  # each job whose answer was lost says how its batch was found
    assert all(a["unproven"] == [] for a in adoptions)  # different prompts: every adoption was proven
    taken = [e for s in summaries for e in s["events"] if e["event"] == "reconciled" and e["outcome"] == "created"]
    assert len(taken) >= lost


def test_two_candidates_wait_to_end_and_the_one_billed_for_our_prompts_is_adopted(tmp_path: Path) -> None:
    """Our answer is lost while another job's batch of our size and ids is live beside ours: gatekeeper does not
    guess. It waits for both to end, adopts ours by its usage, records the other as another's, and a run killed
    before it wrote a line still holds the other excluded when it resumes."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha")
    theirs = write_job(tmp_path / "b" / "in.jsonl", "beta gamma ")
    with running_fake(ceiling=10_000, rate=30) as fake:
        other = start(["submit", str(theirs), *FLAGS], env_for(fake))  # the other pipeline, in our workspace
        fake.org.wait_for(lambda r: r.creates == 1, "the other job's create")
        fake.inject(Fault("create", kind="drop_after_commit"))
        killed = gk(["submit", str(ours), *FLAGS], env_for(fake), crash_at="before-results-commit")
        assert killed.returncode == -9, killed.stderr[-3000:]
        their_id = next(b.id for b in fake.org.batches.values() if b.seq == 1)
        evs = events(killed.stderr)
        assert [e["how"] for e in evs if e["event"] == "reconciling"][:1] == ["waiting for the candidates to end"]
        assert [e["ids"] for e in evs if e["event"] == "not_ours"] == [[their_id]]
        rerun = gk(["submit", str(ours), *FLAGS], env_for(fake))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert other.communicate(timeout=120) and other.returncode == 0
        judge(fake, [ours, theirs])
    s = orjson.loads(rerun.stdout)
    assert s["adoptions"] == {"proven": 1, "unproven": [], "unchecked": 0, "not_ours": [their_id]}


@pytest.mark.parametrize("world", WORLDS)
def test_a_lone_candidate_of_another_job_is_never_kept_when_ours_can_be_found(tmp_path: Path, world: str) -> None:
    """Our job has two batches; the first's create is answered (so this job learns how it is billed), the second's
    is lost while another job's batch of its size and custom_ids is the only candidate listed (ours lags). It is
    adopted on size and time, then weighed before a line is written: where the usage follows the prompt it bills
    unlike our requests and is given back; where it cannot tell (a constant, no usage) it is held until the
    listing's grace has passed, ours is listed beside it, and the one created nearest our send is taken, reported
    unproven. Either way every line answers its own request and nothing is created twice."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha", 2 * N)
    theirs = write_job(tmp_path / "b" / "in.jsonl", "beta gamma ", N, first=N)  # (row-60 ... row-119, as our second)
    with running_fake(ceiling=10_000, rate=400, usage=world) as fake:
        done = gk(["submit", str(theirs), *FLAGS], env_for(fake))  # the other pipeline's, in our workspace
        assert done.returncode == 0, done.stderr
        their_id = next(iter(fake.org.batches))
        fake.org.config.listing_lag = 2.0  # ours will reach the listing late (the grace outlasts it)
        fake.inject(Fault("create", kind="drop_after_commit", after=1))
        proc = gk(["submit", str(ours), *FLAGS], env_for(fake))
        kept = judge(fake, [ours, theirs], creates=3)
        mine = next(b.id for b in fake.org.batches.values() if b.seq == 3)
    evs = events(proc.stderr)
    adopted = [e["id"] for e in evs if e["event"] == "reconciled" and e["outcome"] == "created"]
    assert adopted[0] == their_id and adopted[-1] == mine
    a = ended(proc)["adoptions"]
    if world in TELLING:
        assert a["not_ours"] == [their_id] and a["unproven"] == [] and kept[ours] == 0
    else:  # the usage cannot tell: the nearest to our send is taken, and every candidate it cannot be told from is
        # collected too (issue 58): each one's answers kept apart (exit 1), listed on request, none joined
        assert a["not_ours"] == [] and a["unproven"] == sorted([mine, their_id]) and kept[ours] == N
        listed = listed_unproven(ours, truly_ours={mine})
        assert {x["batch_id"] for x in listed} == {mine, their_id} and len(listed) == 2 * N


@pytest.mark.parametrize("ledger", [False, True])
@pytest.mark.parametrize("world", WORLDS)
def test_our_own_batch_found_by_listing_is_never_sent_again_whatever_the_usage(tmp_path: Path, world: str,
                                                                              ledger: bool) -> None:
    """One job, the answer to its first create lost (and to the next one's too): whatever the API bills against
    count_tokens, each batch found by listing is kept, never sent again; nothing is created twice. Where the usage
    cannot prove it ours and no ledger can, its answers are kept apart (exit 1, listed by `results --only
    unproven`); with a shared ledger, through which creates go one at a time, it is proven ours whatever the usage."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha", 3 * N)
    with running_fake(ceiling=10_000, rate=400, usage=world, listing_lag=0.5) as fake:
        fake.inject(Fault("create", kind="drop_after_commit", times=2))
        extra = ["--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"] if ledger else []
        proc = gk(["submit", str(ours), *FLAGS, *extra], env_for(fake))
        kept = judge(fake, [ours], creates=3)
    summary = ended(proc)
    assert summary["adoptions"]["not_ours"] == [] and summary["succeeded"] + kept[ours] == 3 * N
    assert not [e for e in events(proc.stderr) if e["event"] == "adoption_undone"]
    if ledger:
        assert summary["adoptions"]["proven"] == 2 and kept[ours] == 0
    elif world not in TELLING:
        assert kept[ours] == 2 * N and len(listed_unproven(ours)) == 2 * N


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("point", ["after-create:1", "after-create:2"])
def test_a_kill_right_after_a_create_then_a_rerun_sends_nothing_again(tmp_path: Path, world: str, point: str) -> None:
    """The commonest crash: SIGKILL right after a create was answered (before the journal knew its id), then the
    same command again. Whatever the usage says against count_tokens, the batch found by listing is kept: three
    batches created in all, every line its own answer."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha", 3 * N)
    with running_fake(ceiling=10_000, rate=400, usage=world) as fake:
        killed = gk(["submit", str(ours), *FLAGS], env_for(fake), crash_at=point)
        assert killed.returncode == -9, killed.stderr[-2000:]
        rerun = gk(["submit", str(ours), *FLAGS], env_for(fake))
        kept = judge(fake, [ours], creates=3)
    a = ended(rerun)["adoptions"]
    assert a["not_ours"] == [] and a["proven"] + len(a["unproven"]) == 1  # (the creates before it were journaled)
    assert kept[ours] == N * len(a["unproven"])  # (an adoption not proven: its answers kept apart, never resent)



def backdate(fake: FakeAPI, seconds: float) -> None:
    """The batches created so far, stamped `seconds` earlier: a rival created before our send, by its stamp rather
    than by a wait."""
    for b in list(fake.org.batches.values()):
        b.created_at -= seconds

@pytest.mark.parametrize("world", WORLDS)
def test_a_rival_beside_ours_is_told_apart_wherever_the_usage_follows_the_prompt(tmp_path: Path, world: str) -> None:
    """Another job's batch of our size and ids is live beside ours when our answer is lost: both end, then the one
    that alone bills as our requests is ours, proven; where the usage cannot tell, the nearest to our send (ours,
    the other created a second earlier) is taken, reported unproven. Every line answers its own request."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha")
    theirs = write_job(tmp_path / "b" / "in.jsonl", "beta gamma ")
    with running_fake(ceiling=10_000, rate=30, usage=world) as fake:
        other = start(["submit", str(theirs), *FLAGS], env_for(fake))
        fake.org.wait_for(lambda r: r.creates == 1, "the other job's create")
        backdate(fake, 1.0)  # (created well before our send, as a rival usually is)
        fake.inject(Fault("create", kind="drop_after_commit"))
        proc = gk(["submit", str(ours), *FLAGS], env_for(fake))
        assert other.communicate(timeout=120) and other.returncode == 0
        kept = judge(fake, [ours, theirs])
        their_id = next(b.id for b in fake.org.batches.values() if b.seq == 1)
        mine = next(b.id for b in fake.org.batches.values() if b.seq == 2)
    a = ended(proc)["adoptions"]
    if world in TELLING:
        assert a == {"proven": 1, "unproven": [], "unchecked": 0, "not_ours": [their_id]}
    else:  # (the nearest to our send taken, the other collected beside it: both kept apart, exit 1)
        assert a == {"proven": 0, "unproven": sorted([mine, their_id]), "unchecked": 0, "not_ours": []}
        assert kept[ours] == N and len(listed_unproven(ours, truly_ours={mine})) == 2 * N


@pytest.mark.parametrize("ledger", [False, True])
@pytest.mark.parametrize("world", TELLING)
@pytest.mark.parametrize("point", ["after-intent", "body-complete", "mid-results", "before-results-commit"])
def test_a_kill_between_the_steps_still_joins_only_our_answers(tmp_path: Path, point: str, world: str,
                                                              ledger: bool) -> None:
    """Job A is SIGKILLed at a step while job B runs beside it (both answers lost); A's rerun finishes, and
    the foreign batch it set aside stays set aside, whatever offset or scale the usage has against the count: no
    line is ever joined to the other job's answer. Without a ledger an adoption the usage cannot prove (an offset
    or scale, and no batch of ours whose create was answered to learn it from) is kept apart; with one, every
    adoption is proven."""
    jobs = [write_job(tmp_path / "a" / "in.jsonl", "alpha"), write_job(tmp_path / "b" / "in.jsonl", "beta gamma ")]
    extra = ["--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"] if ledger else []
    with running_fake(ceiling=10_000, rate=60, listing_lag=1.0, usage=world) as fake:
        # (a batch of another size made just now: the listing is seen current, and absence is proven after the
        # grace; an account whose listing shows nothing recent waits longer, tests/test_loop_in_simulated_time.py)
        fake.org.add_batch("wrkspc_1", 7, status="ended", prefix="current")
        fake.inject(Fault("create", kind="drop_after_commit", times=2))
        env = env_for(fake)
        b = start(["submit", str(jobs[1]), *FLAGS, *extra], env)
        killed = gk(["submit", str(jobs[0]), *FLAGS, *extra], env, crash_at=point)
        assert killed.returncode == -9, killed.stderr[-2000:]  # (every point is reached: the kill happened)
        rerun = gk(["submit", str(jobs[0]), *FLAGS, *extra], env)
        out, err = b.communicate(timeout=120)
        theirs = ended((b.returncode, out, err))
        # (killed as its body went out, A's batch may never have been created; without a ledger, B's batch, alone
        # with A's ids, cannot be told from A's but by usage, an estimate: A keeps it apart rather than send again)
        for key in [k for k in fake.org.records.answered if k[0].startswith("current-")]:
            del fake.org.records.answered[key]  # (the batch of another size, not the jobs')
        created = fake.org.records.creates
        kept = judge(fake, jobs, creates=created)
        assert created == 2 or (not ledger and created == 1 and kept[jobs[0]] == N)
    a = ended(rerun)["adoptions"]
    if ledger:
        assert (a is None or a["unproven"] == []) and (theirs["adoptions"] is None or theirs["adoptions"]["unproven"] == [])


def test_a_summary_names_an_adoption_the_results_could_not_prove(tmp_path: Path) -> None:
    """Another job with our prompts and our ids has a batch live beside ours when our answer is lost: the results
    cannot tell the two apart, and the summary says so rather than claiming proof. We take the one created
    nearest our send (ours), never the other job's, keep its answers apart (exit 1: never joined as if proven,
    listed by `results --only unproven`), and nothing is sent twice."""
    jobs = [write_job(tmp_path / "a" / "in.jsonl", "same"), write_job(tmp_path / "b" / "in.jsonl", "same")]
    with running_fake(ceiling=10_000, rate=30) as fake:
        other = start(["submit", str(jobs[1]), *FLAGS], env_for(fake))
        fake.org.wait_for(lambda r: r.creates == 1, "the other job's create")
        backdate(fake, 1.0)  # (created well before our send, as a rival usually is)
        fake.inject(Fault("create", kind="drop_after_commit"))
        ours = gk(["submit", str(jobs[0]), *FLAGS], env_for(fake))
        assert other.communicate(timeout=120) and other.returncode == 0
        answered = fake.org.records.answered
        assert fake.org.records.creates == 2 and len(answered) == N and set(answered.values()) == {2}
        mine = next(b.id for b in fake.org.batches.values() if b.seq == 2)
        theirs = next(b.id for b in fake.org.batches.values() if b.seq == 1)
    s = ended(ours)
    assert s["adoptions"] == {"proven": 0, "unproven": sorted([mine, theirs]), "unchecked": 0, "not_ours": []}
    text = render_summary(Summary(**{**s, "adoptions": s["adoptions"]}))
    assert "could not tell from another submitter's" in text and "results --only unproven" in text
    lines = [orjson.loads(x) for x in (Path(str(jobs[0]) + ".gatekeeper") / "results.jsonl").read_bytes().splitlines()]
    assert len(lines) == N and all(kept_apart(x) for x in lines)
    # (both candidates collected, each answer kept apart with its batch: if the nearest was not ours, ours is there)
    listed = listed_unproven(jobs[0])
    assert {x["batch_id"] for x in listed} == {mine, theirs} and len(listed) == 2 * N


def test_an_authentication_error_while_counting_our_requests_stops_the_run(tmp_path: Path) -> None:
    """Counting our requests to weigh two candidates is refused (401): the run stops with one line and exit 2,
    never adopting a batch on no evidence; the rerun with a working key weighs them and finishes."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha")
    theirs = write_job(tmp_path / "b" / "in.jsonl", "beta gamma ")
    args = [*FLAGS, "--no-preflight"]
    with running_fake(ceiling=10_000, rate=30) as fake:
        other = start(["submit", str(theirs), *args], env_for(fake))
        fake.org.wait_for(lambda r: r.creates == 1, "the other job's create")
        fake.inject(Fault("create", kind="drop_after_commit"),
                    Fault("count_tokens", status=401, error_type="authentication_error", message="invalid x-api-key"))
        proc = gk(["submit", str(ours), *args], env_for(fake))
        assert proc.returncode == 2, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert "Traceback" not in proc.stderr and "authentication_error" in last and "count" in last.lower()
        assert not [e for e in events(proc.stderr) if e["event"] == "reconciled"]
        rerun = gk(["submit", str(ours), *args], env_for(fake))
        assert rerun.returncode == 0 and other.communicate(timeout=120) and other.returncode == 0, rerun.stderr[-2000:]
        judge(fake, [ours, theirs])


def test_a_candidate_whose_results_stay_missing_is_decided_on_the_rest_after_the_grace(tmp_path: Path) -> None:
    """Another job's batch beside ours answers 404 for its results for good: past --results-grace it is weighed as
    a candidate without evidence (never waited on forever, never set aside on no evidence), and ours, whose
    results bill as our requests, is taken, unproven (the other could not be read): its answers kept apart."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha")
    theirs = write_job(tmp_path / "b" / "in.jsonl", "beta gamma ")
    args = [*FLAGS, "--results-grace", "1"]
    with running_fake(ceiling=10_000, rate=30) as fake:
        other = start(["submit", str(theirs), *args], env_for(fake))
        fake.org.wait_for(lambda r: r.creates == 1, "the other job's create")
        next(iter(fake.org.batches.values())).results_lost = True
        backdate(fake, 1.0)  # (created well before our send)
        fake.inject(Fault("create", kind="drop_after_commit"))
        proc = gk(["submit", str(ours), *args], env_for(fake))
        other.kill()  # (its own results are lost: it would wait out its retries and grace; only ours are judged)
        other.communicate(timeout=30)
        params = {o["custom_id"]: o["params"] for o in map(orjson.loads, ours.read_bytes().splitlines())}
        lines = [orjson.loads(x) for x in (Path(str(ours) + ".gatekeeper") / "results.jsonl").read_bytes().splitlines()]
        assert sorted(x["custom_id"] for x in lines) == sorted(params) and all(kept_apart(x) for x in lines)
        assert fake.org.records.creates == 2 and set(fake.org.records.answered.values()) == {1}
        mine = next(b.id for b in fake.org.batches.values() if b.seq == 2)
        theirs_id = next(b.id for b in fake.org.batches.values() if b.seq == 1)
    # (the other, unreadable, is kept apart beside ours, named, never joined; its answers are not there to list)
    assert ended(proc)["adoptions"] == {"proven": 0, "unproven": sorted([mine, theirs_id]), "unchecked": 0, "not_ours": []}
    assert len(listed_unproven(ours)) == N
    assert [e["id"] for e in events(proc.stderr) if e["event"] == "kept_apart_unavailable"] == [theirs_id]


@pytest.mark.parametrize("world", ["count", "scale:0.85"])
def test_two_lost_creates_of_one_size_are_each_weighed_on_their_own_ids(tmp_path: Path, world: str) -> None:
    """Both of our creates (one size) lose their answers while another job's two batches of that size and ids are
    listed: each unknown create is weighed on its own sampled ids (a candidate read for one is never reused for the
    other's evidence): both are ours (proven where the usage bills as counted), the other's two are set aside, and
    every line answers its own request."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha", 2 * N)
    theirs = write_job(tmp_path / "b" / "in.jsonl", "beta gamma ", 2 * N)
    with running_fake(ceiling=10_000, rate=400, usage=world) as fake:
        done = gk(["submit", str(theirs), *FLAGS], env_for(fake))
        assert done.returncode == 0, done.stderr
        fake.org.config.listing_lag = 1.0
        fake.inject(Fault("create", kind="drop_after_commit", times=2))
        proc = gk(["submit", str(ours), *FLAGS], env_for(fake))
        kept = judge(fake, [ours, theirs], creates=4)
    a = ended(proc)["adoptions"]
    assert a["proven"] + len(a["unproven"]) == 2 and len(a["not_ours"]) == 2
    assert world != "count" or a["proven"] == 2
    assert kept[ours] == N * len(a["unproven"])  # (scale:0.85 with nothing learned proves nothing: kept apart)


def write_templated(path: Path, job: str, n: int = N) -> Path:
    """n requests with the ids every pipeline uses and one template (a classification prompt with a field of
    nearly equal length each): usage per request cannot tell two such jobs apart, nor, with an estimate's error,
    prove this one's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for i in range(n):
            text = f"Classify the sentiment of this review, one word. Review #{i:04d} from {job}: fine, as expected."
            f.write(orjson.dumps({"custom_id": f"row-{i}", "params": {
                "model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}}) + b"\n")
    return path


@pytest.mark.parametrize("ledger", [False, True])
@pytest.mark.parametrize("kill", [None, "after-create:1"])
def test_noisy_usage_on_templated_prompts_never_resends_our_batch(tmp_path: Path, kill: str | None,
                                                                  ledger: bool) -> None:
    """Usage = count x (1 ± 4%) per prompt, prompts of one template: the review's case, where our own batch was
    judged another's and sent again. Lost create answers (or a kill right after a create) never lead to a second
    create, nothing is answered twice; without a ledger the batches found by listing are kept apart (exit 1,
    listed with their own answers), with one they are proven ours."""
    ours = write_templated(tmp_path / "a" / "in.jsonl", "alpha", 3 * N)
    extra = ["--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"] if ledger else []
    with running_fake(ceiling=10_000, rate=400, usage="noisy:0.04", listing_lag=0.5) as fake:
        if kill is None:
            fake.inject(Fault("create", kind="drop_after_commit", times=2))
        else:
            killed = gk(["submit", str(ours), *FLAGS, *extra], env_for(fake), crash_at=kill)
            assert killed.returncode == -9, killed.stderr[-2000:]
        proc = gk(["submit", str(ours), *FLAGS, *extra], env_for(fake))
        kept = judge(fake, [ours], creates=3)
        downloads = fake.org.records.requests_seen.get("results", 0)
    a = ended(proc)["adoptions"]
    assert a["not_ours"] == [] and not [e for e in events(proc.stderr) if e["event"] == "adoption_undone"]
    adopted = a["proven"] + len(a["unproven"])
    assert adopted == (2 if kill is None else 1)
    if ledger:
        assert a["unproven"] == [] and kept[ours] == 0
    else:
        assert kept[ours] == N * len(a["unproven"]) and len(listed_unproven(ours)) == kept[ours]
    # waiting out the listing's grace sleeps: an adoption is downloaded at most three times (weighed, weighed again
    # once the grace is over, settled apart), never once a reading; with a ledger, once
    assert downloads <= (3 if not ledger else 1) * adopted + (3 - adopted), downloads


def test_two_jobs_with_the_same_ids_and_template_never_cross_answers_through_a_ledger(tmp_path: Path) -> None:
    """The issue's case: two jobs with the same custom_ids and one template (their fields differ), usage = count x
    (1 ± 3%) per prompt, most create answers lost, both on one SQLite ledger. Creates go one at a time through the
    ledger, so each lost create's lone unnamed candidate is its own: every line answers its own request, every
    adoption proven, nothing created or answered twice, both exit 0."""
    jobs = [write_templated(tmp_path / "a" / "in.jsonl", "alpha", 2 * N),
            write_templated(tmp_path / "b" / "in.jsonl", "omega", 2 * N)]
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with running_fake(ceiling=10_000, rate=400, usage="noisy:0.03", listing_lag=0.5) as fake:
        fake.inject(Fault("create", kind="drop_after_commit", times=3))
        summaries = _run_both(fake, jobs, ["--ledger", url])
        kept = judge(fake, jobs, creates=4)
        waited = [e for s in summaries for e in s["events"] if e["event"] == "waiting" and e.get("reason") == "ledger"]
    assert kept == {jobs[0]: 0, jobs[1]: 0}
    adoptions = [s["adoptions"] for s in summaries if s["adoptions"]]
    assert sum(a["proven"] for a in adoptions) == 3 and all(a["unproven"] == [] for a in adoptions)
    assert waited, "creates were not taken one at a time"


def test_credentials_without_the_count_tokens_action_keep_the_adoption_apart_instead_of_stopping(tmp_path: Path) -> None:
    """A policy without the count-tokens action (403; Claude Platform on AWS run with --no-preflight --token-sample
    0): a lost create's batch cannot be weighed, so its answers are kept apart (exit 1) rather than the run stopping
    at the same point on every rerun; nothing is created twice."""
    ours = write_job(tmp_path / "a" / "in.jsonl", "alpha")
    args = [*FLAGS, "--no-preflight", "--token-sample", "0"]
    with running_fake(ceiling=10_000, rate=400, listing_lag=0.5) as fake:
        fake.inject(Fault("create", kind="drop_after_commit"),
                    Fault("count_tokens", status=403, error_type="permission_error", message="not allowed", times=1000))
        proc = gk(["submit", str(ours), *args], env_for(fake))
        kept = judge(fake, [ours], creates=1)
    assert ended(proc)["adoptions"]["unproven"] and kept[ours] == N
