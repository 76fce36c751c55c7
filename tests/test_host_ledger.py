"""A ledger on every host by default (issue 58): creates one at a time through this user's SQLite ledger on this
machine, so a lost create's lone candidate is proven ours whatever its usage; a submitter killed here never holds
the others back; `status` names the ledger; `--ledger none` keeps the path where usage is the only evidence, and
there every candidate it cannot tell apart is collected and kept apart.

The jobs are the CLI as real processes (killed with `crash_at`) and the library, against the fake over HTTP; each
test has its own state folder (GATEKEEPER_HOME, set by conftest), so its own host ledger."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from gatekeeper._errors import UsageError
from gatekeeper.decide._orphans import NO_BATCH, orphan_batch
from gatekeeper.decide._ownership import Pair, choose
from gatekeeper.decide._reconcile import (
    Action,
    Rival,
    carrying,
    compared,
    dead_rivals,
    ledger_names_the_rest,
    made_in_time,
    rival_creates,
    rivals_among,
)
from gatekeeper.state.ledger._base import Reservation
from gatekeeper.state.ledger._open import choose_ledger, host_ledger_file
from gatekeeper.testing import FakeAPI, prompt_of
from tests.fakes import WS2, env_for, running_fake
from tests.runs import events, gk, start
from tests.test_ownership import FLAGS as OWNERSHIP_FLAGS
from tests.test_ownership import N, ended, judge, write_templated

# (--ledger none stands first in the ownership tests' flags; "host" after it is the default named)
HOST = [*OWNERSHIP_FLAGS, "--ledger", "host"]
FAST = ["--json", "--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "5", "--token-sample", "2"]


# -- the choice, the rivals, the candidates kept apart: pure ------------------------------------------------------

@pytest.mark.parametrize(("setting", "environ", "kind", "url"), [
    (None, {}, "host", "host"),                                               # nothing said: this host's
    (None, {"GATEKEEPER_LEDGER": "redis://r:6379/0"}, "shared", "redis://r:6379/0"),
    (None, {"GATEKEEPER_LEDGER": "none"}, "none", None),
    (None, {"GATEKEEPER_LEDGER": " "}, "host", "host"),                        # (blank is unset)
    ("none", {"GATEKEEPER_LEDGER": "redis://r:6379/0"}, "none", None),         # the flag wins
    ("local", {}, "none", None),                                               # (its earlier name)
    ("host", {"GATEKEEPER_LEDGER": "redis://r:6379/0"}, "host", "host"),
    ("postgresql://gk:secret@db/gk", {}, "shared", "postgresql://gk:***@db/gk"),
])
def test_the_ledger_a_run_uses(tmp_path: Path, setting: str | None, environ: dict[str, str], kind: str,
                               url: str | None) -> None:
    """Without --ledger, GATEKEEPER_LEDGER, else this host's (in the state folder the environment names, one file a
    host); `none` opts out. What `status` prints of it hides a password."""
    env = {"GATEKEEPER_HOME": str(tmp_path / "home"), **environ}
    chosen = choose_ledger(setting, env)
    assert chosen.kind == kind
    expected = f"sqlite://{host_ledger_file(tmp_path / 'home')}" if url == "host" else url
    assert chosen.to_json()["url"] == expected
    assert (tmp_path / "home" / "ledger").is_dir() is (kind == "host")


def test_one_host_ledger_a_machine_and_an_unwritable_folder_is_one_line(tmp_path: Path) -> None:
    """A home folder shared by machines keeps one ledger a host (SQLite's WAL needs a host of its own); a state
    folder that cannot be made is a usage error naming it."""
    assert host_ledger_file(tmp_path, "node-1.example") != host_ledger_file(tmp_path, "node-2.example")
    assert host_ledger_file(tmp_path, "a/b c").name == "a_b_c.db"
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=str(tmp_path / "file")):
        choose_ledger(None, {"GATEKEEPER_HOME": str(tmp_path / "file" / "gk")})


def _r(owner: str, requests: int, dead_for: float | None, batch_id: str | None = None) -> Reservation:
    return Reservation(owner, 0, requests, batch_id, 600.0, dead_for)


@pytest.mark.parametrize(("reservations", "since", "rivals"), [
    ([_r("them", 100, 5.0)], 990.0, 1),        # found dead 5 s ago (at 995), our send after: it may be its batch
    ([_r("them", 100, 5.0)], 995.0 + 600, 1),   # ... until the lag (the listing's grace) after it was found dead
    ([_r("them", 100, 5.0)], 995.0 + 601, 0),   # later sends never meet it: it holds no one back for long
    ([_r("them", 90, 5.0)], 990.0, 0),          # another size: never our candidate
    ([_r("me", 100, 5.0)], 990.0, 0),           # our own (a rerun weighs its own intents)
    ([_r("them", 100, None)], 990.0, 0),        # a live submitter's unconfirmed create: counted by others_in_flight
    ([_r("them", 100, 5.0), _r("also", 100, 1.0)], 990.0, 2),
])
def test_a_dead_submitters_unknown_create_is_a_rival_for_a_while(reservations: list[Reservation], since: float,
                                                                  rivals: int) -> None:
    """An orphan (a dead submitter's create that may have reached the server) is a rival of our lost creates of its
    size whose candidates could include its batch: created before it was found dead, or within the lag after."""
    assert dead_rivals(reservations, "me", 100, since, now=1000.0, lag=600.0) == rivals


def test_every_candidate_the_usage_cannot_tell_apart_is_kept_apart() -> None:
    """Three candidates with our ids under a constant usage: the nearest is taken, unproven, and the other two
    are collected beside it (`apart`), none set aside as another's, none joined."""
    pairs = [Pair("m", 100 + 7 * i, 10) for i in range(24)]
    choice = choose({"a": pairs, "b": pairs, "c": pairs}, ["b", "a", "c"], sampled=24)
    assert (choice.ours, choice.proven, choice.foreign, set(choice.alike)) == ("b", False, (), {"a", "c"})
    batches = tuple({"id": k, "created_at": "2026-01-01T00:00:00Z", "processing_status": "ended"} for k in "abc")
    d = compared(choice, batches, sent_at=0.0, listed_at=1e12, grace=5.0, with_our_ids=["b", "a", "c"])
    assert (d.action, [b["id"] for b in d.candidates], d.proof, set(d.apart)) == (Action.ADOPT, ["b"], "unproven", {"a", "c"})
    proven = choose({"a": [Pair("m", p.counted, p.counted) for p in pairs]}, ["a"], sampled=24)
    assert proven.proven and proven.alike == ()
    none_bill = compared(choose({}, [], sampled=24), batches, sent_at=0.0, listed_at=1e12, grace=5.0,
                         with_our_ids=["c", "a"])
    assert (none_bill.action, [b["id"] for b in none_bill.candidates], none_bill.apart) == (Action.ADOPT, ["c"], ("a",))


# -- one job on one machine: the scenarios, scaled down ----------------------------------------------------

def _spread_job(path: Path, n: int, seed: int = 1) -> dict[str, str]:
    """n requests with prompts of widely spread length, their ids prefixed by the folder's name; each id's prompt
    digest."""
    rng = random.Random(seed)
    digests = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for i in range(n):
            params = {"model": "claude-haiku-4-5", "max_tokens": 16,
                      "messages": [{"role": "user", "content": f"{path.parent.name} {i}: " + "x" * rng.randint(5, 300)}]}
            digests[f"{path.parent.name}{i}"] = prompt_of(params)[1]
            f.write(orjson.dumps({"custom_id": f"{path.parent.name}{i}", "params": params}) + b"\n")
    return digests


def _answers(path: Path, digests: dict[str, str], fake: FakeAPI) -> tuple[int, int]:
    """(answers in place: each request's own succeeded answer, once; lines kept apart); nothing answered or
    created twice (the fake's records)."""
    lines = [orjson.loads(x) for x in (Path(str(path) + ".gatekeeper") / "results.jsonl").read_bytes().splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(digests), "not one line per request"
    mine = sum(1 for x in lines if x["result"]["type"] == "succeeded"
               and x["result"]["message"]["id"] == "msg_" + digests[x["custom_id"]])
    apart = sum(1 for x in lines if x["result"]["type"] == "errored"
                and x["result"]["error"]["error"]["type"] == "gatekeeper_unproven")
    assert set(fake.org.records.answered.values()) <= {1}, "a request was answered twice"
    created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
    assert len(created) == len(set(created)), "a request was created in two batches"
    return mine, apart


KILLS = ["after-create:2", "body-complete:3", "after-intent:2", "mid-results:1"]


@pytest.mark.parametrize(("usage", "kills"), [("count", KILLS), ("const:10", KILLS), ("noisy:0.04", [])])
def test_one_job_on_one_host_finishes_through_lost_answers_and_kills(tmp_path: Path, usage: str,
                                                                     kills: list[str]) -> None:
    """The issue's single-host scenarios scaled down: 3,000 requests in batches of 250, a quarter of create answers
    lost, kill -9 at staggered points and the same command rerun; under a usage that follows the prompt, a
    gateway's constant, and count x (1 +- 4%) per prompt. With no --ledger given (this host's), the last run exits
    0 with every request's own answer in place, none kept apart, nothing created or answered twice."""
    path = tmp_path / "job" / "in.jsonl"
    digests = _spread_job(path, 3000)
    args = ["submit", str(path), *FAST, "--max-requests", "250"]
    with running_fake(ceiling=100_000, rate=20_000, usage=usage, lost_creates=0.25, seed=3, listing_lag=0.3) as fake:
        for point in kills:
            killed = gk(args, env_for(fake), crash_at=point)
            assert killed.returncode == -9, (point, killed.stderr[-2000:])
        done = gk(args, env_for(fake), timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        mine, apart = _answers(path, digests, fake)
        lost = fake.org.records.lost_answers
    summary = orjson.loads(done.stdout)
    assert (mine, apart) == (3000, 0) and summary["succeeded"] == 3000
    assert lost >= 2, "the scenario lost too few answers to say anything"
    a = summary["adoptions"]
    assert a["unproven"] == [] and a["proven"] >= 1 and a["not_ours"] == []


def test_without_a_ledger_the_same_job_keeps_answers_apart(tmp_path: Path) -> None:
    """The control: the same job behind a gateway's constant usage with --ledger none ends with findings (exit 1),
    the batches found after a lost answer kept apart (never joined, never resent): what the host's ledger ends."""
    path = tmp_path / "job" / "in.jsonl"
    digests = _spread_job(path, 1000)
    args = ["submit", str(path), *FAST, "--max-requests", "250", "--ledger", "none"]
    with running_fake(ceiling=100_000, rate=20_000, usage="const:10", lost_creates=0.5, seed=3, listing_lag=0.3) as fake:
        done = gk(args, env_for(fake), timeout=240)
        mine, apart = _answers(path, digests, fake)
    assert done.returncode == 1 and apart > 0 and mine + apart == 1000, done.stderr[-2000:]
    assert orjson.loads(done.stdout)["adoptions"]["unproven"]


def test_the_library_uses_the_host_ledger_of_the_environment_it_is_given(tmp_path: Path) -> None:
    """`submit_sync` with default settings: the host ledger in the state folder of the `environ` passed (nowhere
    else), so lost create answers behind a constant usage are proven ours; with `ledger="none"` they are not."""
    import gatekeeper

    home = tmp_path / "elsewhere"
    path = tmp_path / "job" / "in.jsonl"
    digests = _spread_job(path, 600)
    with running_fake(ceiling=100_000, rate=20_000, usage="const:10", lost_creates=0.5, seed=5, listing_lag=0.3) as fake:
        config = gatekeeper.ApiConfig.from_env(env_for(fake))
        settings = gatekeeper.SubmitSettings(interval=0.05, reconcile_grace=5, max_rpm=60_000, token_sample=2,
                                             limits=gatekeeper.Limits(max_requests=100))
        summary = gatekeeper.submit_sync(str(path), config=config, settings=settings,
                                         environ={"GATEKEEPER_HOME": str(home)})
        mine, apart = _answers(path, digests, fake)
        lost = fake.org.records.lost_answers
    assert summary.ok and (mine, apart) == (600, 0) and lost >= 1
    assert summary.adoptions is not None and summary.adoptions["unproven"] == [] and summary.adoptions["proven"] >= 1
    assert host_ledger_file(home).is_file()
    assert not (Path(os.environ["GATEKEEPER_HOME"]) / "ledger").exists()  # (the environment given, not this one)


def test_two_jobs_on_one_host_with_the_same_ids_never_cross_without_a_ledger_named(tmp_path: Path) -> None:
    """Two jobs on this host, the same custom_ids and one template, usage = count x (1 +- 3%), create answers
    lost, no ledger named: both go through the host's, so every lost create's lone candidate is its own; every line
    answers its own request, every adoption proven, both exit 0."""
    jobs = [write_templated(tmp_path / "a" / "in.jsonl", "alpha", 2 * N),
            write_templated(tmp_path / "b" / "in.jsonl", "omega", 2 * N)]
    with running_fake(ceiling=10_000, rate=400, usage="noisy:0.03", listing_lag=0.5, lost_creates=0.5, seed=2) as fake:
        runs = [start(["submit", str(p), *HOST], env_for(fake)) for p in jobs]
        outs = [r.communicate(timeout=120) for r in runs]
        summaries = [ended((r.returncode, out, err)) for r, (out, err) in zip(runs, outs, strict=True)]
        kept = judge(fake, jobs, creates=4)
        lost = fake.org.records.lost_answers
    assert kept == {jobs[0]: 0, jobs[1]: 0} and lost >= 1
    adoptions = [s["adoptions"] for s in summaries if s["adoptions"]]
    assert sum(a["proven"] for a in adoptions) == lost and all(a["unproven"] == [] for a in adoptions)


# -- a job killed on the host holds no one back --------------------------------------------------------------------

@pytest.mark.parametrize("point", ["body-complete:1", "after-create:1"])
def test_a_job_killed_on_this_host_never_holds_another_back(tmp_path: Path, point: str) -> None:
    """Job A is killed with its create out (its reservation unconfirmed: the host's turn) and a TTL of 10 minutes;
    job B on the same host, its batches of another size, then finishes at once (A's process is gone: its requests
    freed, its create kept as a rival of its size only), and A's rerun finishes too: every line once, nothing
    created or answered twice."""
    a, b = tmp_path / "a" / "in.jsonl", tmp_path / "b" / "in.jsonl"
    da, db = _spread_job(a, 200, seed=1), _spread_job(b, 300, seed=2)
    ttl = ["--ledger-ttl", "600"]
    with running_fake(ceiling=100_000, rate=20_000, listing_lag=0.3) as fake:
        killed = gk(["submit", str(a), *FAST, *ttl], env_for(fake), crash_at=point)
        assert killed.returncode == -9, killed.stderr[-2000:]
        started = time.monotonic()
        other = gk(["submit", str(b), *FAST, *ttl], env_for(fake), timeout=120)
        took = time.monotonic() - started
        assert other.returncode == 0, other.stderr[-2000:]
        rerun = gk(["submit", str(a), *FAST, *ttl], env_for(fake))
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert _answers(a, da, fake) == (200, 0) and _answers(b, db, fake) == (300, 0)
    assert took < 60, f"job B took {took:.1f} s behind a killed job"  # (a TTL of 600 s was not waited out)
    assert not [e for e in events(other.stderr) if e["event"] == "waiting" and e.get("reason") == "ledger"]


def test_a_killed_jobs_create_keeps_the_turn_for_its_own_size_only_until_its_ttl(tmp_path: Path) -> None:
    """The one thing a killed job's create that was out still holds: creates of its very size (its batch, if the
    server made it, could be taken for theirs after a lost answer), a TTL (here 8 s) after its process was found
    gone at most, where nothing shows job B that it lists A's workspace (B's key is another's, and nothing of A is
    named yet); then job B, of that size, goes and finishes, and A's rerun settles its own: nothing twice."""
    a, b = tmp_path / "a" / "in.jsonl", tmp_path / "b" / "in.jsonl"
    da, db = _spread_job(a, 200, seed=1), _spread_job(b, 200, seed=2)
    ttl = ["--ledger-ttl", "8"]
    with running_fake(ceiling=100_000, rate=20_000, listing_lag=0.3) as fake:
        killed = gk(["submit", str(a), *FAST, *ttl], env_for(fake), crash_at="body-complete:1")
        assert killed.returncode == -9, killed.stderr[-2000:]
        started = time.monotonic()
        other = gk(["submit", str(b), *FAST, *ttl], env_for(fake, keys=(WS2,)), timeout=120)  # (held for good ends here)
        took = time.monotonic() - started
        assert other.returncode == 0, other.stderr[-2000:]
        rerun = gk(["submit", str(a), *FAST, *ttl], env_for(fake))
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert _answers(a, da, fake) == (200, 0) and _answers(b, db, fake) == (200, 0)
    assert took > 5, f"job B took {took:.1f} s: it did not wait for the killed create's TTL"
    waits = [e for e in events(other.stderr) if e["event"] == "waiting" and e.get("reason") == "ledger"]
    # (what holds it, named: a cold tester watched two jobs wait 13 minutes on an empty queue, told only "ledger")
    assert waits and all(e["held_by"]["dead_job"] == "in.jsonl" and e["held_by"]["pid"] > 0 for e in waits), waits[:3]


@pytest.mark.parametrize("made", [True, False])
@pytest.mark.parametrize("create", [2, 1], ids=["second-create", "first-create"])
def test_a_killed_jobs_create_of_anothers_size_is_settled_by_the_others_listing(tmp_path: Path, create: int,
                                                                                made: bool) -> None:
    """Issue 58 (a cold test: job B, of job A's size, waited 593 s, until A's rerun came): A is killed with a create
    out (made by the server, its answer held back; or killed as the body went, never made) and a TTL of 10 minutes;
    B, of the same size and on the same key, sees A's workspace (its second create: A's first batch is listed, and
    named for A; its very first, nothing of A named yet: the ledger records the same workspace print for both), so it
    names A's batch for A, or finds none a grace later, and goes on without waiting for A's rerun; the rerun takes
    the name back with its create and adopts it (or finds it never made): every line once, nothing twice."""
    from gatekeeper.testing import Fault

    a, b = tmp_path / "a" / "in.jsonl", tmp_path / "b" / "in.jsonl"
    da, db = _spread_job(a, 200, seed=1), _spread_job(b, 300, seed=2)
    same = ["--ledger-ttl", "600", "--max-requests", "100"]
    with running_fake(ceiling=100_000, rate=20_000, listing_lag=0.3) as fake:
        if made:
            fake.inject(Fault("create", kind="delay_after_commit", delay=20.0, after=create - 1))
            killed = start(["submit", str(a), *FAST, *same], env_for(fake))
            fake.org.wait_for(lambda r: r.creates >= create or killed.poll() is not None, "A's create", 30)
            killed.kill()
            assert killed.wait(10) == -9 and fake.org.records.creates == create
        else:
            assert gk(["submit", str(a), *FAST, *same], env_for(fake), crash_at=f"body-complete:{create}").returncode == -9
        started = time.monotonic()
        other = gk(["submit", str(b), *FAST, *same], env_for(fake), timeout=120)
        took = time.monotonic() - started
        assert other.returncode == 0, other.stderr[-2000:]
        rerun = gk(["submit", str(a), *FAST, *same], env_for(fake))
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert _answers(a, da, fake) == (200, 0) and _answers(b, db, fake) == (300, 0)
    assert took < 60, f"job B took {took:.1f} s behind a killed job's create"
    settled = [(e["batch"], e["requests"], e["outcome"]) for e in events(other.stderr) if e["event"] == "orphan_settled"]
    assert settled == [(create - 1, 100, "named" if made else "made no batch")]
    reconciled = [e for e in events(rerun.stderr) if e["event"] == "reconciled" and e["batch"] == create - 1]
    assert [e["outcome"] for e in reconciled] == ["created" if made else "not created"]


# -- what status says -----------------------------------------------------------------------------------------------

def test_status_names_the_ledger_in_use(tmp_path: Path) -> None:
    """`status` names the ledger (JSON and human): this host's by default, with its file in the state folder;
    `--ledger none` and GATEKEEPER_LEDGER=none say there is none. A reading never creates the state folder."""
    home = Path(os.environ["GATEKEEPER_HOME"])
    with running_fake(ceiling=1000, rate=0.0) as fake:
        js = gk(["status", "--json"], env_for(fake))
        human = gk(["status"], env_for(fake))
        none = gk(["status", "--json", "--ledger", "none"], env_for(fake))
        by_env = gk(["status"], env_for(fake, GATEKEEPER_LEDGER="none"))
    assert js.returncode == 0, js.stderr
    ledger = orjson.loads(js.stdout)["ledger"]
    assert ledger["kind"] == "host" and ledger["url"] == f"sqlite://{host_ledger_file(home, socket.gethostname())}"
    assert ledger["reserved"] == 0 and not home.joinpath("ledger").exists()
    assert ledger["file"] == str(host_ledger_file(home, socket.gethostname()))  # (the first-party queue: no suffix)
    assert f"ledger    this host's, {ledger['file']}" in human.stdout
    assert orjson.loads(none.stdout)["ledger"] == {"kind": "none", "url": None, "file": None, "reserved": 0, "reservations": [],
                                                    "jobs": [], "orphans": []}
    assert "ledger    none (--ledger none)" in by_env.stdout


@pytest.mark.parametrize("ledger", ["host", "sqlite", "postgres"])
def test_status_shows_a_killed_jobs_orphan_and_why_it_is_held(tmp_path: Path, ledger: str,
                                                              request: pytest.FixtureRequest) -> None:
    """A job killed (SIGKILL) with its create's body out leaves an orphan on the ledger: its requests freed, the turn
    for creates of its size held until its reservation would have lapsed. `status` (JSON and text) shows it: which
    job, its pid on this host, how many requests, since when, when it lapses. One killed between its reservation and
    its send holds nothing, and status shows nothing."""
    url = {"host": [], "sqlite": ["--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"],
           "postgres": ["--ledger", request.getfixturevalue("pg_database")] if ledger == "postgres" else []}[ledger]
    a, b = tmp_path / "a" / "in.jsonl", tmp_path / "b" / "in.jsonl"
    _spread_job(a, 40, seed=1), _spread_job(b, 40, seed=2)
    with running_fake(ceiling=100_000, rate=0.0) as fake:
        early = start(["submit", str(b), *FAST, *url, "--ledger-ttl", "600"],
                      {**env_for(fake), "GATEKEEPER_CRASH_AT": "after-intent:1"})
        assert early.wait(timeout=60) == -9
        nothing = gk(["status", "--json", *url], env_for(fake))
        killed = start(["submit", str(a), *FAST, *url, "--ledger-ttl", "600"],
                       {**env_for(fake), "GATEKEEPER_CRASH_AT": "body-complete:1"})
        assert killed.wait(timeout=60) == -9
        js = gk(["status", "--json", *url], env_for(fake))
        text = gk(["status", *url], env_for(fake))
    assert nothing.returncode == 0, nothing.stderr[-2000:]
    assert orjson.loads(nothing.stdout)["ledger"]["orphans"] == []  # (its create never went out: no batch, no turn)
    assert js.returncode == 0, js.stderr[-2000:]
    held = orjson.loads(js.stdout)["ledger"]
    assert held["reserved"] == 0 and held["reservations"] == []  # (its requests are free: no room held)
    [orphan] = held["orphans"]
    assert orphan["job"] == "in.jsonl" and orphan["pid"] == killed.pid and orphan["this_host"] is True
    assert orphan["requests"] == 40 and orphan["sent"] is True and 0 <= orphan["dead_for"] < 60
    assert 500 < orphan["lapses_in"] <= 600  # (its TTL after its last heartbeat)
    assert (f"orphan of dead job in.jsonl (pid {killed.pid} on this host), batch {orphan['batch']}: its create of 40 "
            "requests was out when it died") in text.stdout and "holds the turn for creates of 40 requests" in text.stdout


def test_an_unwritable_state_folder_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """The host's ledger cannot be made (the state folder is under a file): submit exits 2 with one line naming
    the folder and GATEKEEPER_HOME, before any state directory is made or anything sent."""
    (tmp_path / "file").write_text("")
    path = tmp_path / "job" / "in.jsonl"
    _spread_job(path, 10)
    with running_fake() as fake:
        proc = gk(["submit", str(path), *FAST], env_for(fake, GATEKEEPER_HOME=str(tmp_path / "file" / "gk")))
        creates = fake.org.records.creates
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and str(tmp_path / "file" / "gk") in last[0] and "GATEKEEPER_HOME" in last[0]
    assert creates == 0 and not Path(str(path) + ".gatekeeper").exists()


def test_status_says_an_unwritable_state_folder_in_one_line_and_makes_nothing(tmp_path: Path) -> None:
    """`status` reads this host's ledger where it is and never creates it; a state folder that could not be made (under
    a file) is the same one line as submit's, exit 2, not a ledger file that cannot exist (a cold test's finding)."""
    (tmp_path / "file").write_text("")
    with running_fake() as fake:
        proc = gk(["status", "--json"], env_for(fake, GATEKEEPER_HOME=str(tmp_path / "file" / "gk")))
        ok = gk(["status", "--json"], env_for(fake, GATEKEEPER_HOME=str(tmp_path / "new" / "gk")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and str(tmp_path / "file" / "gk") in last[0] and "GATEKEEPER_HOME" in last[0]
    assert ok.returncode in (0, 1), ok.stderr  # (a folder not made yet but makeable: read as empty, not made)
    assert not (tmp_path / "new").exists()


# -- the fake ------------------------------------------------------------------------------------------------------

def test_the_fake_loses_a_share_of_create_answers_from_its_command_line() -> None:
    """`fake-api --lose-creates 0.5 --seed 3`: about half of the creates are committed and their answers lost (the
    connection closed), every batch listed, the count said on exit."""
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", "0", "--json",
                            "--lose-creates", "0.5", "--seed", "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        text = ""
        while True:  # (one JSON object, over several lines)
            text += run.stdout.readline()
            try:
                url = orjson.loads(text)["url"]
                break
            except orjson.JSONDecodeError:
                continue
        headers = {"x-api-key": "test-key-ws1", "anthropic-version": "2023-06-01"}
        body = {"requests": [{"custom_id": "a", "params": {"model": "claude-haiku-4-5", "max_tokens": 8,
                                                               "messages": [{"role": "user", "content": "hi"}]}}]}
        lost = 0
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            for _ in range(20):
                try:
                    client.post("/v1/messages/batches", json=body).raise_for_status()
                except httpx.TransportError:
                    lost += 1
            listed = client.get("/v1/messages/batches", params={"limit": 100}).json()["data"]
        assert 3 <= lost <= 17 and len(listed) == 20
    finally:
        run.terminate()
        run.communicate(timeout=30)
    bad = subprocess.run([sys.executable, "-m", "gatekeeper", "fake-api", "--lose-creates", "1"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--lose-creates" in bad.stderr


def test_a_journal_from_before_keeps_its_answers_apart_and_takes_one_a_candidate(tmp_path: Path) -> None:
    """Migration 0011: the answers a journal kept apart before it (one a request) are kept, and a request now keeps
    one answer a candidate batch."""
    import sqlite3

    from gatekeeper.state._journal import MIGRATIONS, Journal

    path = tmp_path / Journal.FILE
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    before = [(name, sql) for name, sql in MIGRATIONS if name < "0011"]
    for name, sql in before:
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (?, 0)", (name,))
    conn.execute("INSERT INTO unproven VALUES (7, 'r7', 'msgbatch_a', X'7b7d')")
    conn.close()
    j = Journal.open(tmp_path)
    try:
        with j.transaction() as db:
            db.execute("INSERT INTO unproven VALUES (7, 'r7', 'msgbatch_b', X'5b5d')")
        assert sorted(j.outcomes.unproven()) == [("r7", "msgbatch_a", b"{}"), ("r7", "msgbatch_b", b"[]")]
    finally:
        j.close()


def _b(k: str, at: str = "2027-01-04T00:10:00Z") -> dict[str, object]:
    return {"id": k, "created_at": at, "processing_status": "ended"}


@pytest.mark.parametrize(("with_ids", "rivals", "named_after", "early", "proven"), [
    (["a"], 0, 0.0, False, "a"),        # one candidate carries our ids, the ledger names every other: it is ours
    (["a", "b"], 0, 0.0, False, None),  # two carry them: usage weighs them
    (["a"], 1, 0.0, False, None),       # a rival of our size is out (an unconfirmed create, a dead one's orphan)
    (["a"], 0, None, False, None),      # no shared ledger: usage decides
    (["a"], 0, 0.0, True, None),        # a candidate older than what the ledger still names
])
def test_the_ledger_proves_the_one_candidate_with_our_ids(with_ids: list[str], rivals: int, named_after: float | None,
                                                         early: bool, proven: str | None) -> None:
    """Several ended candidates of our size, one with our custom_ids (a table job's earlier run, given the same
    ledger, made the other): with every other submitter's batch named in the ledger, that one is this create's
    whatever the usage says (found by the swarm, seed 581: its answers were kept apart under a noisy usage)."""
    from gatekeeper.decide._headroom import parse_time

    cands = [_b("a"), _b("b", "2027-01-04T00:01:00Z" if early else "2027-01-04T00:09:00Z")]
    after = None if named_after is None else (parse_time("2027-01-04T00:05:00Z") or 0.0)
    assert ledger_names_the_rest(cands, with_ids, rivals=[Rival(-math.inf)] * rivals, named_after=after) == proven


T0 = 1_799_020_800.0  # 2027-01-04T00:00:00Z


def _at(minute: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + minute * 60))


@pytest.mark.parametrize(("made", "rivals", "proven"), [
    # (our lost create's candidates, created at minute m, both with our ids) and the rivals (turn granted at minute)
    ({"a": 11}, [Rival(61.0)], "a"),               # the rival's turn came 50 minutes after: not its batch (seed 1513)
    ({"a": 11}, [Rival(14.0)], None),              # ... within the clock skew (5 minutes): it may be
    ({"a": 11}, [Rival(-math.inf)], None),         # a ledger that does not say when: a rival, as before
    ({"a": 0, "b": 15}, [Rival(15.0)], "a"),       # the one no rival can have made is ours, the other the rival's (5253)
    ({"a": 0, "b": 15}, [Rival(15.0), Rival(-math.inf)], None),
    ({"a": 0, "b": 1}, [Rival(15.0)], None),       # two no rival can have made: usage weighs them
])
def test_a_candidate_made_before_a_rivals_turn_is_not_its_batch(made: dict[str, float], rivals: list[Rival],
                                                                proven: str | None) -> None:
    """A batch is never created before its create's turn was granted: a candidate with our custom_ids made before
    every rival's turn (less the clock skew) is proven ours by the ledger (issue 60: seeds 1513, 5253, where the
    answers were kept apart, unproven, under a usage that could not tell)."""
    cands = [_b(k, _at(m)) for k, m in made.items()]
    starts = [Rival(T0 + r.start * 60 if r.start != -math.inf else r.start, r.ids) for r in rivals]
    assert ledger_names_the_rest(cands, list(made), rivals=starts, named_after=T0 - 86_400, clock_skew=300.0) == proven


@pytest.mark.parametrize(("made", "taken"), [
    # (candidates with our custom_ids, made at minute m; our body went out whole at minute 0; 10 minutes' answer wait,
    # 5 minutes' clock skew)
    ({"a": 0, "b": 15.3}, "a"),         # the other made after our create was given up (seed 8126): ours is the first
    ({"a": 0, "b": 14.9}, None),        # ... within the wait and the skew: either may be ours
    ({"a": 0.5, "b": 1.0}, None),       # two made in time: usage weighs them
    ({"a": 20.0, "b": 30.0}, None),     # none made in time: nothing is proven by the clock
    ({"a": 0.0}, None),                 # a lone candidate: its own rules (never set apart by the clock alone)
])
def test_a_candidate_made_after_our_create_was_given_up_is_not_its_batch(made: dict[str, float], taken: str | None) -> None:
    """The server had our body whole when we recorded it; a batch made more than the answer wait (and the clock
    skew) later is another create's, made after ours was given up: of two candidates with our custom_ids, the one
    made in time is ours (issue 60, seed 8126: two jobs of one set of ids each lost a create of its size)."""
    cands = [_b(k, _at(m)) for k, m in made.items()]
    assert made_in_time(cands, list(made), sent_at=T0, answer_wait=600.0, clock_skew=300.0) == taken


def test_rivals_are_those_whose_turn_and_ids_could_have_made_a_candidate() -> None:
    """`rival_creates` reads each other unknown create of our size off the ledger with its turn's time and its ids'
    print; `rivals_among` keeps those whose turn came before a candidate was made (every one when none is listed);
    `carrying` those that may have sent our ids (a print recorded and unlike ours: never ours, seed 1767)."""
    rs = [Reservation("them", 0, 20, None, 600.0, granted_for=60.0, ids="20.a.b"),
          Reservation("dead", 0, 20, None, 600.0, dead_for=30.0, granted_for=3000.0, ids="20.c.d"),
          Reservation("held", 0, 20, None, 600.0),                      # (taken back by a resumed run: unknown)
          Reservation("them", 1, 20, "msgbatch_x", 600.0, granted_for=10.0),  # (confirmed: named, never a rival)
          Reservation("them", 2, 7, None, 600.0, granted_for=10.0),    # (another size)
          Reservation("me", 0, 20, None, 600.0, granted_for=10.0)]     # (our own)
    rivals = rival_creates(rs, "me", 20, since=900.0, now=1000.0, lag=300.0)
    assert sorted(rivals, key=lambda r: r.start) == [Rival(-math.inf, None), Rival(-2000.0, "20.c.d"), Rival(940.0, "20.a.b")]
    early, late = {"created_at": _at(0)}, {"created_at": _at(60)}
    assert rivals_among([early], [Rival(T0 + 3600)], 300.0) == []
    assert rivals_among([early, late], [Rival(T0 + 3600)], 300.0) == [Rival(T0 + 3600)]
    assert rivals_among([], [Rival(T0 + 3600)], 300.0) == [Rival(T0 + 3600)]
    assert carrying(rivals, "20.a.b") == [r for r in rivals if r.ids in (None, "20.a.b")]
    assert len(carrying(rivals, "20.e.f")) == 1  # (only the one that does not say)


# -- a killed job's create settled by another job's listing (issue 58) ----------------------------------------------

def _listed(k: str, minute: float, n: int = 20) -> dict[str, object]:
    return {"id": k, "created_at": _at(minute), "request_counts": {"processing": n}}


ORPHAN = Reservation("dead", 1, 20, None, 600.0, dead_for=600.0, granted_for=660.0, holds_for=300.0)
DEAD_NAMED = Reservation("dead", 0, 0, "msgbatch_d0", 86_400.0)  # (a batch of the dead job, confirmed: named)


@pytest.mark.parametrize(("held", "listed", "listed_min", "found"), [
    # the orphan's turn came at minute 59 and it was found dead at minute 60; now is minute 70
    ([DEAD_NAMED], [_listed("msgbatch_d0", 58), _listed("x", 59.5)], 70, "x"),           # its one batch: named
    ([DEAD_NAMED], [_listed("msgbatch_d0", 58)], 70, NO_BATCH),                         # none, the grace past: none
    ([DEAD_NAMED], [_listed("msgbatch_d0", 58)], 62, None),                             # ... within the grace
    ([], [_listed("x", 59.5)], 70, None),                  # no batch of the dead job listed: its workspace unseen
    ([DEAD_NAMED], [_listed("msgbatch_d0", 58), _listed("x", 59.5), _listed("y", 59.6)], 70, None),  # two
    ([DEAD_NAMED], [_listed("msgbatch_d0", 58), _listed("x", 59.5, n=21)], 70, NO_BATCH),  # another size
    ([DEAD_NAMED], [_listed("msgbatch_d0", 58), _listed("x", 40)], 70, NO_BATCH),       # made before its turn
    ([DEAD_NAMED, Reservation("b", 0, 0, "x", 600.0)],
     [_listed("msgbatch_d0", 58), _listed("x", 59.5)], 70, NO_BATCH),                  # another's, named
    ([DEAD_NAMED, Reservation("b", 0, 20, None, 600.0)],
     [_listed("msgbatch_d0", 58), _listed("x", 59.5)], 70, None),                       # a live rival of the size
    ([DEAD_NAMED, Reservation("b", 0, 20, None, 600.0, granted_for=1.0)],
     [_listed("msgbatch_d0", 58), _listed("x", 59.5)], 70, "x"),                        # ... whose turn came after
])
def test_a_killed_jobs_create_is_settled_by_what_another_job_lists(held: list[Reservation], listed: list[dict],
                                                                   listed_min: float, found: str | None) -> None:
    """`orphan_batch`: a dead job's unknown create is settled from another job's listing only where that listing
    shows the dead job's workspace (a batch the ledger names for it is listed): its one unnamed batch of its size made
    from its turn to the grace after it was found dead, and no other unknown create that can have made it; none in a
    listing read the grace after it was found dead; else (None) it holds the turn as before."""
    now = T0 + 70 * 60
    assert orphan_batch(ORPHAN, [ORPHAN, *held], listed, set(), now=now, listed_at=T0 + listed_min * 60, grace=180.0,
                        clock_skew=0.0) == found
    assert orphan_batch(ORPHAN, [ORPHAN, *held], listed, {"x"}, now=now, listed_at=now, grace=180.0,
                        clock_skew=0.0) != "x"  # (a batch the reader's journal knows is never the orphan's)


FIRST = Reservation("dead", 0, 20, None, 600.0, dead_for=600.0, granted_for=660.0, holds_for=300.0, workspace="w1")


@pytest.mark.parametrize(("mine", "listed", "listed_min", "found"), [
    # a job killed on its first create: nothing of it named; the ledger records the print of the workspace it listed
    ("w1", [_listed("x", 59.5)], 70, "x"),             # the same print: its one batch, named
    ("w1", [], 70, NO_BATCH),                          # ... none, the grace past: it made none
    ("w1", [], 62, None),                              # ... within the grace: cannot tell yet
    ("w1", [_listed("x", 59.5), _listed("y", 59.6)], 70, None),  # two of its size: cannot tell
    ("w2", [_listed("x", 59.5)], 70, None),            # another print: its workspace may not be listed
    ("w2", [], 70, None),                              # ... and "none listed" proves nothing
    (None, [_listed("x", 59.5)], 70, None),            # our print unknown (a bearer token's workspace)
])
def test_a_job_killed_on_its_first_create_is_settled_only_by_a_listing_of_its_workspace(
        mine: str | None, listed: list[dict], listed_min: float, found: str | None) -> None:
    """`orphan_batch` with the workspace prints the ledger records: the same print proves the listing shows the dead
    job's workspace even before any batch of it is named; another print, or none, leaves the orphan holding."""
    now = T0 + 70 * 60
    assert orphan_batch(FIRST, [FIRST], listed, set(), now=now, listed_at=T0 + listed_min * 60, grace=180.0,
                        clock_skew=0.0, workspace=mine) == found
    unknown = dataclasses.replace(FIRST, workspace=None)  # (an earlier version's orphan: its print unknown)
    assert orphan_batch(unknown, [unknown], listed, set(), now=now, listed_at=now, grace=180.0, clock_skew=0.0,
                        workspace=mine) is None


def test_who_holds_the_turn_for_a_size_is_named() -> None:
    """`holder_of_size`: a dead job's create of that size first (its job, pid, the seconds it still holds), else
    another's create out unanswered; never our own, a named batch, or another size."""
    from gatekeeper.state.ledger._base import holder_of_size

    dead = Reservation("d", 0, 20, None, 600.0, dead_for=5.0, granted_for=9.0, holds_for=300.0, job="a.jsonl", pid=42)
    out = Reservation("o", 0, 20, None, 600.0, granted_for=40.0)
    assert holder_of_size([out, dead], "me", 20) == {"dead_job": "a.jsonl", "pid": 42, "owner": "d", "lapses_in": 300.0}
    assert holder_of_size([out], "me", 20) == {"owner": "o", "out_for": 40.0}
    assert holder_of_size([out, dead], "me", 21) is None
    assert holder_of_size([Reservation("me", 0, 20, None, 600.0), Reservation("x", 1, 20, "msgbatch_x", 600.0)],
                          "me", 20) is None
