"""Priorities and shares on one ceiling (issue 47): whose turn it is (pure, table-tested, and a hypothesis property
over many rounds), the claims on all three ledgers (a dead job's lapses with its lease), and jobs through the CLI
against the fake: precedence, shares, a high job killed while it waits, `status` listing the jobs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.decide._shares import Claim, joined_vtime, may_admit, next_up
from gatekeeper.state.ledger._base import ClaimPost
from tests.fakes import running_fake
from tests.runs import events, gk, start, wait_until
from tests.scenarios import write_job
from tests.test_ledger import make_ledger  # noqa: F401 -- the three ledgers, parametrized

H, N, L = 0, 1, 2


def c(owner: str, priority: int = N, share: float = 1.0, want: int = 100, waited: float = 0.0, vtime: float = 0.0) -> Claim:
    return Claim(owner, f"job-{owner}", priority, share, want, waited, vtime)


# -- the decision ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("claims", "up", "why"), [
    ([], None, "no claims: nobody's turn, anyone may"),
    ([c("a", want=0)], None, "wanting nothing holds no turn"),
    ([c("a", L), c("b", H)], "b", "precedence: the high job first"),
    ([c("a", L), c("b", H, want=0)], "a", "work conservation: a high job that wants nothing lets the low one go"),
    ([c("a", N, vtime=300), c("b", N, vtime=100)], "b", "the least virtual time after its next batch"),
    ([c("a", N, share=3, vtime=100), c("b", N, share=1, vtime=100)], "a", "a bigger share: its next batch weighs less"),
    ([c("a", L, waited=1801), c("b", H)], "a", "a low job waiting past the bound goes first"),
    ([c("a", L, waited=1900), c("b", L, waited=2000), c("c", H)], "b", "the longest starving wait first"),
    ([c("a", N, vtime=100), c("b", N, vtime=100)], "a", "ties: by owner, so every submitter agrees"),
])
def test_whose_turn(claims: list[Claim], up: str | None, why: str) -> None:
    got = next_up(claims)
    assert (None if got is None else got.owner) == up, why
    for claim in claims:
        assert may_admit(claim.owner, claims) == (up is None or claim.owner == up), why


@pytest.mark.parametrize(("own", "others", "expect"), [
    (0.0, [], 0.0),
    (0.0, [c("a", vtime=500), c("b", vtime=800)], 500.0),  # a newcomer starts where its tier stands
    (900.0, [c("a", vtime=500)], 900.0),  # never set back
    (0.0, [c("a", H, vtime=500)], 0.0),  # another tier's time is not its own
    (0.0, [c("a", vtime=500, want=0)], 0.0),  # nor that of a job waiting for nothing
])
def test_a_joining_job_takes_its_tiers_virtual_time(own: float, others: list[Claim], expect: float) -> None:
    assert joined_vtime(own, N, others) == expect


jobs = st.lists(st.tuples(st.sampled_from([H, N, L]), st.sampled_from([1.0, 2.0, 3.0]),
                          st.booleans()), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(jobs, st.integers(min_value=30, max_value=120))
def test_turns_keep_precedence_shares_work_and_no_starvation(spec: list[tuple[int, float, bool]], rounds: int) -> None:
    """Rounds of admission, a batch of 100 a round, some jobs wanting nothing: the turn always goes to a job that
    wants room (work conservation); to the highest priority that waits unless someone starves (precedence); nobody
    waits past the bound plus a round for each job ahead (no starvation)."""
    bound, step = 50.0, 1.0
    claims = [Claim(f"o{i}", f"j{i}", p, s, 100 if wants else 0) for i, (p, s, wants) in enumerate(spec)]
    for _ in range(rounds):
        up = next_up(claims, starve_after=bound)
        waiting = [x for x in claims if x.want]
        if not waiting:
            assert up is None
            return
        assert up is not None and up.want > 0
        if all(x.waited < bound for x in waiting):
            assert up.priority == min(x.priority for x in waiting)
        assert max(x.waited for x in waiting) <= bound + step * len(claims)
        claims = [Claim(x.owner, x.job, x.priority, x.share, x.want,
                        0.0 if x.owner == up.owner or not x.want else x.waited + step,
                        x.vtime + (100 / x.share if x.owner == up.owner else 0)) for x in claims]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0]), min_size=2, max_size=5), st.integers(min_value=1, max_value=40))
def test_shares_hold_over_every_window_of_a_few_batches(shares: list[float], start: int) -> None:
    """Jobs of one priority, all with work: in every window of consecutive admissions, each job's batches are its
    share of the window within two batches (one at each end of the window), wherever it starts."""
    claims = [Claim(f"o{i}", f"j{i}", N, s, 100) for i, s in enumerate(shares)]
    order: list[str] = []
    for _ in range(start + 4 * int(sum(shares))):
        up = next_up(claims, starve_after=float("inf"))
        assert up is not None
        order.append(up.owner)
        claims = [x if x.owner != up.owner else Claim(x.owner, x.job, N, x.share, 100, 0.0, x.vtime + 100 / x.share)
                  for x in claims]
    total = sum(shares)
    for width in (int(total), int(total) * 2, int(total) * 4):
        window = order[start:start + width]
        for i, share in enumerate(shares):
            assert abs(window.count(f"o{i}") - width * share / total) <= 1.5, (width, shares)


# -- the ledgers ------------------------------------------------------------------------------------

pytestmark = pytest.mark.anyio


async def test_claims_are_posted_read_and_lapse_with_their_lease(make_ledger) -> None:  # noqa: F811
    """Each submitter posts its claim and reads everyone's; a wait runs on the ledger's clock until the job admits;
    a dead submitter's claim lapses after its TTL; `release_all` drops it at once."""
    high, low = make_ledger("high", ttl=0.5), make_ledger("low", ttl=60.0)
    seen = await high.put_claim(ClaimPost("nightly", H, 1.0, 5000, 0.0, 0))
    assert [(x.owner, x.want, x.priority) for x in seen] == [("high", 5000, H)]
    await make_ledger.elapse(0.3)
    both = {x.owner: x for x in await low.put_claim(ClaimPost("backfill", L, 2.0, 5000, 10.0, 20000))}
    assert both["high"].waited >= 0.25 and both["low"].waited < 0.25 and both["low"].admitted == 20000
    assert not may_admit("low", list(both.values()))
    again = {x.owner: x for x in await low.put_claim(ClaimPost("backfill", L, 2.0, 5000, 12.5, 25000, reset_wait=True))}
    assert again["low"].waited < 0.1 and again["low"].vtime == 12.5
    await make_ledger.elapse(0.6)  # the high job died: no heartbeat, no post
    assert [x.owner for x in await low.claims()] == ["low"]
    await low.release_all()
    assert await low.claims() == []


# -- jobs through the CLI, against the fake --------------------------------------------------------

KEYS = {"k-low": "wrkspc_low", "k-high": "wrkspc_high"}  # (each job in a workspace of its own: only the ledger sees both)
FLAGS = ["--json", "--interval", "0.05", "--max-rpm", "60000", "--ceiling", "300", "--max-requests", "100",
         "--no-preflight", "--token-sample", "0"]


def _env(fake, key: str) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": key}


def _claims(url: str) -> list[Claim]:
    from gatekeeper.state.ledger._open import open_ledger

    async def read() -> list[Claim]:
        led = open_ledger(url, owner="probe")
        try:
            return await led.claims()
        finally:
            await led.close()
    return anyio.run(read)


def _full(fake) -> bool:
    return sum(b.total for b in fake.org.batches.values()) >= 300


def _by_workspace(fake) -> list[str]:
    return [b.workspace for b in sorted(fake.org.batches.values(), key=lambda b: b.seq)]


def test_a_high_job_goes_before_a_low_one_and_its_queued_batches_drain(tmp_path: Path) -> None:
    """A low job fills the queue; a high job then waits for room: every batch created from then on is the high
    job's until it has none left (the low job's queued batches drain, nothing is canceled); both finish; the low
    job's summary says how long it waited for the other; alone, nothing changes."""
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    low, high = write_job(tmp_path / "low.jsonl", "low", 600), write_job(tmp_path / "high.jsonl", "high", 300)
    with running_fake(ceiling=300, rate=0.0, workspaces=dict(KEYS)) as fake:
        backfill = start(["submit", str(low), *FLAGS, "--ledger", ledger, "--priority", "low"], _env(fake, "k-low"))
        wait_until(lambda: _full(fake), "the low job to fill the queue")
        nightly = start(["submit", str(high), *FLAGS, "--ledger", ledger, "--priority", "high"], _env(fake, "k-high"))
        wait_until(lambda: any(c.priority == H and c.want for c in _claims(ledger)), "the high job to wait for room")
        first = fake.org.records.creates
        fake.org.config.rate = 300.0  # the queue moves
        n_out, n_err = nightly.communicate(timeout=60)
        b_out, b_err = backfill.communicate(timeout=60)
    assert nightly.returncode == 0 and backfill.returncode == 0, (n_err[-2000:], b_err[-2000:])
    order = _by_workspace(fake)
    high_batches = order.count("wrkspc_high")
    assert set(order[:first]) == {"wrkspc_low"} and order[first:first + high_batches] == ["wrkspc_high"] * high_batches
    assert set(order[first + high_batches:]) == {"wrkspc_low"}
    assert all(b.cancel_initiated_at is None for b in fake.org.batches.values())
    shares = orjson.loads(b_out)["shares"]
    assert shares["priority"] == "low" and shares["waited_s"] > 0
    assert orjson.loads(n_out)["shares"]["waited_s"] == 0
    assert any(e.get("reason") == "shares" for e in events(b_err))
    from gatekeeper.cli._render import render_summary
    from gatekeeper.run.job._summary import Summary

    line = [x for x in render_summary(Summary(shares=shares)).splitlines() if x.startswith("shares")]
    assert line and "priority low" in line[0] and f"{shares['waited_s']:,.1f} s" in line[0]


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger of this test's own on each of the three stores."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url")).rstrip("0") + "7"  # (a database no other test uses)
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_database"))
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def test_a_high_job_killed_while_it_waits_blocks_no_one_past_its_lease(tmp_path: Path, ledger_url: str) -> None:
    """kill -9 on a high job waiting for room: the low job, which held back for it, goes on and finishes within the
    lease time (--ledger-ttl), on each of the three ledgers; and since the dead job ran on this machine, at once:
    its claim is dropped as soon as its process is gone, not a lease of 30 s later (issue 58)."""
    ledger = ledger_url
    low, high = write_job(tmp_path / "low.jsonl", "low", 500), write_job(tmp_path / "high.jsonl", "high", 300)
    ttl = ["--ledger-ttl", "30"]
    with running_fake(ceiling=300, rate=0.0, workspaces=dict(KEYS)) as fake:
        backfill = start(["submit", str(low), *FLAGS, *ttl, "--ledger", ledger, "--priority", "low"], _env(fake, "k-low"))
        wait_until(lambda: _full(fake), "the low job to fill the queue")
        nightly = start(["submit", str(high), *FLAGS, *ttl, "--ledger", ledger, "--priority", "high"], _env(fake, "k-high"))
        wait_until(lambda: any(c.priority == H and c.want for c in _claims(ledger)), "the high job to wait for room")
        os.kill(nightly.pid, signal.SIGKILL)
        nightly.communicate()  # (its pipes closed)
        killed = time.monotonic()
        fake.org.config.rate = 600.0
        out, err = backfill.communicate(timeout=60)
        took = time.monotonic() - killed
    assert backfill.returncode == 0, err[-2000:]
    assert _by_workspace(fake).count("wrkspc_high") == 0 and orjson.loads(out)["succeeded"] == 500
    # (no lease waited out: the queue's own time, and the margin a loaded machine needs)
    assert took < 2 + 5, f"the low job took {took:.1f} s after the kill"
    assert orjson.loads(out)["shares"]["waited_s"] < 2 + 1


def test_status_lists_the_jobs_on_the_ledger(tmp_path: Path) -> None:
    """`status --ledger` names every job with its priority, share, queued requests and wait; the exporter the same."""
    from gatekeeper.state.ledger._sqlite import SqliteLedger

    path = tmp_path / "ledger.db"

    async def seed() -> None:
        led = SqliteLedger(str(path), "pipeline-7")
        await led.put_claim(ClaimPost("nightly-dashboard", H, 2.0, 100, 0.0, 400))
        assert await led.reserve(0, 120, 1000, 0)

    anyio.run(seed)
    with running_fake(ceiling=1000, rate=0.0) as fake:
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key-ws1", "ANTHROPIC_ADMIN_KEY": "test-admin-key"}
        js = gk(["status", "--json", "--ledger", f"sqlite:///{path}"], env)
        human = gk(["status", "--ledger", f"sqlite:///{path}"], env)
    [job] = orjson.loads(js.stdout)["ledger"]["jobs"]
    assert job["job"] == "nightly-dashboard" and job["priority"] == "high" and job["share"] == 2.0
    assert job["queued"] == 120 and job["want"] == 100 and job["admitted"] == 400
    assert "nightly-dashboard" in human.stdout and "high" in human.stdout and "waiting" in human.stdout
    from gatekeeper.state.ledger._base import LedgerReading, Reservation
    from gatekeeper.watch._exporter import MetricsCollector, RunFigures

    reading = LedgerReading([Reservation("pipeline-7", 0, 120, None, 60.0)],
                            [Claim("pipeline-7", "nightly-dashboard", H, 2.0, 100, 5.0, 0.0, 400)])
    families = {f.name: f for f in MetricsCollector(RunFigures(ledger=reading), 90).collect()}
    [queued] = families["gatekeeper_ledger_job_queued_requests"].samples
    assert queued.labels == {"job": "nightly-dashboard", "priority": "high"} and queued.value == 120
    assert families["gatekeeper_ledger_job_waiting_seconds"].samples[0].value == 5.0
