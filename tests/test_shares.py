"""Priorities and shares on one ceiling (issue 47): whose turn it is (pure, table-tested, and a hypothesis property
over many rounds), the claims on all three ledgers (a dead job's lapses with its lease), and jobs through the CLI
against the fake: precedence, shares, a high job killed while it waits, `status` listing the jobs."""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.decide._shares import STARVE_AFTER, Claim, ahead_of, may_admit, next_up, overtaken_by, starved
from gatekeeper.state._claims import ClaimPost, ClaimRow, behind, posted, tier_after
from gatekeeper.state._db import pg_ddl
from gatekeeper.state.ledger._sqlite import SqliteLedger
from gatekeeper.testing import Fault
from tests.fakes import running_fake
from tests.runs import events, gk, start, wait_until
from tests.scenarios import simulated, two_jobs_a_night, write_job
from tests.test_ledger import make_ledger  # noqa: F401 -- the three ledgers, parametrized

H, N, L = 0, 1, 2


def c(owner: str, priority: int = N, share: float = 1.0, want: int = 100, waited: float = 0.0, vtime: float = 0.0,
      limit: int | None = None, overtaken: int = 0, unread: int = 0) -> Claim:
    return Claim(owner, f"job-{owner}", priority, share, want, waited, vtime, limit=limit, overtaken=overtaken,
                 unread=unread)


# -- the decision ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("claims", "reserved", "up", "why"), [
    ([], 0, None, "no claims: nobody's turn, anyone may"),
    ([c("a", want=0)], 0, None, "wanting nothing holds no turn"),
    ([c("a", L), c("b", H)], 0, "b", "precedence: the high job first"),
    ([c("a", L), c("b", H, want=0)], 0, "a", "a high job that wants nothing lets the low one go"),
    ([c("a", N, vtime=300), c("b", N, vtime=100)], 0, "b", "the least virtual time after its next batch"),
    ([c("a", N, share=3, vtime=100), c("b", N, share=1, vtime=100)], 0, "a", "a bigger share: its next batch weighs less"),
    ([c("a", L, waited=1801), c("b", H)], 0, "a", "a low job waiting past the bound goes first"),
    ([c("a", L, waited=1900), c("b", L, waited=2000), c("c", H)], 0, "b", "the longest starving wait first"),
    ([c("a", N, vtime=100), c("b", N, vtime=100)], 0, "a", "ties: by owner, so every submitter agrees"),
    ([c("a", H, want=500, limit=1000), c("b", L, want=100, limit=1000)], 600, "b",
     "work conservation: a high batch larger than the room does not keep a low one that fits from it"),
    ([c("a", N, want=500, limit=1000), c("b", N, want=100, limit=1000, vtime=900)], 600, "b",
     "the same within a priority, while the other's virtual time after its batch stays within a batch of its own"),
    ([c("a", N, want=500, limit=1000), c("b", N, want=100, limit=1000, vtime=901)], 600, "a",
     "one beyond: it keeps the turn while the room builds up (the shares hold within a batch)"),
    ([c("a", H, want=100, limit=500), c("b", L, want=100, limit=1000)], 450, "b", "a margin (a lower limit) the same"),
    ([c("a", H, want=500, limit=1000, overtaken=500), c("b", L, want=100, limit=1000)], 600, "a",
     "a job that let others by for a batch of its own keeps the turn while the room builds up"),
    ([c("a", H, want=500, limit=1000, overtaken=499), c("b", L, want=100, limit=1000)], 600, "b", "not before"),
    ([c("a", L, want=500, limit=1000, waited=1800), c("b", H, want=100, limit=1000)], 600, "a",
     "a starving job keeps the turn while the room builds up for it"),
    ([c("a", H, want=500, limit=1000), c("b", L, want=600, limit=1000)], 600, None,
     "nobody fits: no one can use the room; should some come before a reservation, it is the first in order's"),
    ([c("a", H, want=500, limit=400, overtaken=500), c("b", L, want=100, limit=1000)], 600, "b",
     "a batch that would not fit however the reservations drain (load outside the ledger) keeps no turn"),
    ([c("a", L, want=500, limit=400, waited=1900), c("b", H, want=100, limit=1000)], 600, "b", "starving or not"),
    ([c("a", H, want=500, limit=400, overtaken=500, unread=100), c("b", L, want=100, limit=1000)], 600, "a",
     "but once another job admitted since that limit was read (the load outside may have drained), it keeps the turn "
     "until it reads the queue again"),
    ([c("a", H, want=500, limit=400, overtaken=100, unread=100), c("b", L, want=100, limit=1000)], 600, "b",
     "as any other would: not before the others have taken as much as its batch"),
    ([c("a", L, want=500, limit=400, waited=1900, unread=100), c("b", H, want=100, limit=1000)], 600, "a",
     "starving, the same"),
    ([c("a", N, want=500, limit=400, unread=100), c("b", N, want=100, limit=1000, vtime=901)], 600, "a",
     "within a priority, the same (the other's virtual time beyond a batch of its own)"),
    ([c("a", N, want=500, limit=400), c("b", N, want=100, limit=1000, vtime=901)], 600, "b", "not before"),
    ([c("a", H, want=500), c("b", L, want=100)], 10**9, "a", "no ceiling known: every batch fits"),
])
def test_whose_turn(claims: list[Claim], reserved: int, up: str | None, why: str) -> None:
    got = next_up(claims, reserved)
    assert (None if got is None else got.owner) == up, why
    first = min((x for x in claims if x.want), key=lambda x: (x.priority, x.vtime + x.want / x.share, x.owner), default=None)
    turn = up if up is not None else None if first is None else first.owner  # (nobody fits: the first in order)
    for claim in claims:
        assert may_admit(claim.owner, claims, reserved) == (turn is None or claim.owner == turn), why
        reach = claim.limit is None or claim.want <= claim.limit or claim.unread > 0
        by_bound = claim.owner == up and claim.waited >= STARVE_AFTER and reach
        assert starved(claim.owner, claims) == by_bound, why  # (its batch then moves no virtual time in its tier)


@pytest.mark.parametrize(("claims", "reserved", "owner", "overtook"), [
    ([c("a", H, want=500, limit=1000), c("b", N, want=100, limit=1000), c("c", L, want=100, limit=1000)], 600, "b", ("a",)),
    ([c("a", H, want=500, limit=1000), c("b", H, want=900, limit=1000, vtime=5), c("c", L, want=100, limit=1000)], 600,
     "c", ("a", "b")),
    ([c("a", H, want=100, limit=1000), c("b", L, want=100, limit=1000)], 0, "a", ()),
    ([c("a", N, want=500, limit=1000), c("b", N, want=100, limit=1000)], 600, "b", ()),  # (its own priority: by shares)
    ([c("a", H, want=500, limit=1000), c("b", L, want=100, limit=1000, waited=1800)], 0, "b", ()),  # (starving: first)
])
def test_a_batch_that_goes_before_ones_that_do_not_fit_names_them(claims: list[Claim], reserved: int, owner: str,
                                                                  overtook: tuple[str, ...]) -> None:
    assert may_admit(owner, claims, reserved) and overtaken_by(owner, claims, reserved) == overtook


# -- what a post does to the claims (the ledgers' step, pure) -------------------------------------------------------

def row(owner: str = "me", priority: int = N, want: int = 100, vtime: float = 0.0, aged: float = 0.0,
        behind_at: float | None = None, overtaken: int = 0, limit: int | None = None, unread: int = 0) -> ClaimRow:
    return ClaimRow(owner, f"job-{owner}", priority, 1.0, want, vtime, 0, limit, aged, behind_at, overtaken, None, 0.0,
                    60.0, unread)


def post(want: int = 100, vtime: float = 0.0, priority: int = N, took: int = 0, started: float = 0.0,
         overtook: tuple[str, ...] = ()) -> ClaimPost:
    return ClaimPost("job", priority, 1.0, want, vtime, 0, 20_000, 0, took, started, overtook)


@pytest.mark.parametrize(("prev", "mine", "tier", "vtime", "why"), [
    (None, post(vtime=0.0), 500.0, 500.0, "a new job starts where its tier stands"),
    (row(want=0, vtime=100.0), post(vtime=100.0), 500.0, 500.0, "so does one that wanted nothing (at its limit of batches)"),
    (row(want=0, vtime=900.0), post(vtime=900.0), 500.0, 900.0, "never set back"),
    (row(want=100, vtime=100.0), post(vtime=100.0), 500.0, 100.0, "one that went on wanting keeps its own"),
    (None, post(want=0), 500.0, 0.0, "one that wants nothing has not joined"),
])
def test_a_joining_claim_takes_its_tiers_virtual_time(prev: ClaimRow | None, mine: ClaimPost, tier: float, vtime: float,
                                                      why: str) -> None:
    assert posted(prev, "me", mine, tier=tier, mine=0, now=10.0, ttl=60.0).vtime == vtime, why


@pytest.mark.parametrize(("other", "mine", "aged", "behind_at", "overtaken", "why"), [
    (row("o", L), post(priority=H, took=100), 0.0, 10.0, 0, "the first admission ahead of it marks the start"),
    (row("o", L, aged=5.0, behind_at=4.0), post(priority=H, took=100), 11.0, 10.0, 0, "the next one ages it by the time between"),
    (row("o", L, want=0), post(priority=H, took=100), None, None, None, "a job that wants nothing is not behind anyone"),
    (row("o", N, aged=5.0, behind_at=4.0), post(priority=N, took=100), None, None, None,
     "turns within its own priority are its share, not a wait"),
    (row("o", H), post(priority=L, took=100), None, None, None, "nor is a lower priority's admission"),
    (row("o", L, aged=5.0, behind_at=4.0), post(priority=H), None, None, None, "a post without an admission: nothing"),
    (row("o", H, overtaken=50), post(priority=L, took=100, overtook=("o",)), 0.0, None, 150,
     "a job it went before because that one's batch did not fit counts the batch"),
])
def test_an_admission_ages_the_claims_behind_it(other: ClaimRow, mine: ClaimPost, aged: float | None,
                                                behind_at: float | None, overtaken: int | None, why: str) -> None:
    got = behind(other, mine, "me", 10.0)
    assert (None if got is None else (got.aged, got.behind_at, got.overtaken)) == (
        None if aged is None else (aged, behind_at, overtaken)), why


@pytest.mark.parametrize(("prev", "mine", "aged", "overtaken", "why"), [
    (row(aged=700.0, behind_at=3.0, overtaken=300), post(), 700.0, 300, "waiting on: its age and what overtook it kept"),
    (row(aged=700.0, behind_at=3.0, overtaken=300), post(took=100), 0.0, 200, "it admitted: its age is 0, a batch less owed"),
    (row(aged=700.0, behind_at=3.0, overtaken=300), post(want=0), 0.0, 0, "it wants nothing: it starts again"),
])
def test_a_claim_that_admits_or_stops_wanting_starts_again(prev: ClaimRow, mine: ClaimPost, aged: float, overtaken: int,
                                                           why: str) -> None:
    got = posted(prev, "me", mine, tier=0.0, mine=0, now=10.0, ttl=60.0)
    assert (got.aged, got.overtaken) == (aged, overtaken), why
    assert tier_after(40.0, post(took=100, started=55.0)) == 55.0 and tier_after(60.0, post(took=100, started=55.0)) == 60.0


@pytest.mark.parametrize(("other", "mine", "unread", "why"), [
    (row("o", H, want=500, limit=400), post(priority=L, took=100), 100,
     "its batch beyond its limit: what another admits since is counted, a lower priority's too"),
    (row("o", N, want=500, limit=400, unread=100), post(priority=N, took=50), 150, "its own priority's too, adding up"),
    (row("o", H, want=500, limit=1000), post(priority=L, took=100), 0, "within its limit: nothing counted"),
    (row("o", H, want=500), post(priority=L, took=100), 0, "no ceiling known: nothing"),
    (row("o", H, want=0, limit=400), post(priority=L, took=100), 0, "wanting nothing: nothing"),
    (row("o", H, want=500, limit=400), post(priority=L), 0, "a post without an admission: nothing"),
])
def test_an_admission_is_counted_against_a_limit_that_said_its_batch_could_not_fit(other: ClaimRow, mine: ClaimPost,
                                                                                   unread: int, why: str) -> None:
    got = behind(other, mine, "me", 10.0) or other
    assert got.unread == unread, why
    again = posted(got, "o", post(want=500, vtime=0.0, priority=other.priority), tier=0.0, mine=0, now=11.0, ttl=60.0)
    assert again.unread == 0, "its own post reads the queue again: nothing unread"


jobs = st.lists(st.tuples(st.sampled_from([H, N, L]), st.sampled_from([1.0, 2.0, 3.0]),
                          st.booleans()), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(jobs, st.integers(min_value=30, max_value=120))
def test_turns_keep_precedence_shares_work_and_no_starvation(spec: list[tuple[int, float, bool]], rounds: int) -> None:
    """Rounds of admission, a batch of 100 a round, some jobs wanting nothing: the turn always goes to a job that
    wants room (work conservation); to the highest priority that waits unless someone starves (precedence); a job
    ages only behind higher priorities' admissions, and none waits past the bound plus a round for each job ahead
    (no starvation)."""
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
                        0.0 if x.owner == up.owner or not x.want else x.waited + (step if x.priority > up.priority else 0),
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
    """On each of the three ledgers, the post's step as `state._claims` says: a claim's limit from the reservations
    (its own subtracted from what it sees), everyone's claims and the reservations read back; no age while nobody
    admits; age behind a higher priority's admissions only, on the ledger's clock; a joiner at its tier's virtual
    time; a batch that went first counted against the claim it overtook; a job that admits starts again; a stopped
    job's claim gone at once (`drop_claim`), a dead one's after its TTL, `release_all` dropping it too."""
    high, low, late = make_ledger("high", ttl=60.0), make_ledger("low", ttl=1.5), make_ledger("late", ttl=60.0)
    assert await high.reserve(0, 3000, 20_000, 0)
    first = await high.put_claim(ClaimPost("nightly", H, 1.0, 5000, 0.0, 0, ceiling=20_000, seen=3000 + 500))
    assert [(x.owner, x.want, x.priority, x.limit) for x in first.claims] == [("high", 5000, H, 20_000 - 500)]
    assert first.reserved == 3000
    await low.put_claim(ClaimPost("backfill", L, 2.0, 2000, 0.0, 0, ceiling=20_000))
    await make_ledger.elapse(0.3)
    board = {x.owner: x for x in (await low.put_claim(ClaimPost("backfill", L, 2.0, 2000, 0.0, 0, ceiling=20_000))).claims}
    assert board["low"].waited == 0.0  # (nobody admitted: the queue full is not a wait behind anyone)
    await high.put_claim(ClaimPost("nightly", H, 1.0, 5000, 5.0, 5000, 20_000, 3500, took=5000, started=0.0))
    await make_ledger.elapse(0.3)
    await high.put_claim(ClaimPost("nightly", H, 1.0, 5000, 10.0, 10000, 20_000, 3500, took=5000, started=5.0))
    board = {x.owner: x for x in (await late.put_claim(ClaimPost("later", H, 1.0, 100, 0.0, 0, ceiling=20_000))).claims}
    assert 0.25 <= board["low"].waited < 1.0 and board["high"].waited == 0.0
    assert board["late"].vtime == pytest.approx(5.0)  # (the start of the last batch its tier admitted)
    await low.put_claim(ClaimPost("backfill", L, 2.0, 2000, 1000.0, 2000, 20_000, 0, took=2000, started=0.0,
                                  overtook=("high",)))
    board = {x.owner: x for x in (await high.put_claim(ClaimPost("nightly", H, 1.0, 5000, 10.0, 10000, 20_000))).claims}
    assert board["high"].overtaken == 2000 and board["low"].waited == 0.0 and board["low"].vtime == 1000.0
    await late.drop_claim()
    assert sorted(x.owner for x in await high.claims()) == ["high", "low"]
    await make_ledger.elapse(1.6)  # the low job died: no heartbeat, no post
    assert [x.owner for x in await high.claims()] == ["high"]
    await high.release_all()
    assert await high.claims() == []


async def test_every_ledger_keeps_the_claims_as_the_pure_step_says(make_ledger) -> None:  # noqa: F811
    """Eighty posts of four jobs (joining, wanting, admitting, overtaking, wanting nothing) on each ledger, and the
    same posts through `state._claims` alone: after each one the ledger reads back what the pure step says (its
    Lua script on Redis included), ages and all, on the ledger's own clock; some posts see load outside the ledger
    that leaves a batch of 500 out of reach (what others admit then is counted: `unread`)."""
    rng = random.Random(59)
    outside = random.Random(60)  # (its own generator: the sequence of posts is as it was)
    owners = {"h": H, "n": N, "m": N, "l": L}
    ledgers = {o: make_ledger(o) for o in owners}
    local = {o: 0.0 for o in owners}  # each job's own virtual time, as `Turns` keeps it
    rows: dict[str, ClaimRow] = {}
    tiers: dict[int, float] = {}
    seen = set()
    for step in range(80):
        o = rng.choice(list(owners))
        want, took = rng.choice([0, 100, 500]), rng.choice([0, 0, 100])
        overtook = tuple(x for x in owners if x != o and rng.random() < 0.3) if took else ()
        depth = outside.choice([0, 0, 19_800])  # (a limit of 200)
        mine = ClaimPost(f"job-{o}", owners[o], 2.0, want, local[o] + took / 2.0, step, 20_000, depth, took, local[o],
                         overtook)
        await make_ledger.elapse(0.002)  # (the model's clock is the step: only which ages are above 0 is compared)
        got = {c.owner: c for c in (await ledgers[o].put_claim(mine)).claims}
        when = float(step)
        rows[o] = posted(rows.get(o), o, mine, tier=tiers.get(owners[o], 0.0), mine=0, now=when, ttl=60.0)
        for other in list(rows.values()):
            moved = behind(other, mine, o, when)
            if moved is not None:
                rows[other.owner] = moved
        tiers[owners[o]] = tier_after(tiers.get(owners[o], 0.0), mine)
        seen |= {"joined"} if rows[o].vtime > mine.vtime else set()
        local[o] = got[o].vtime
        for name, r in rows.items():
            c = got[name]
            assert (c.want, c.admitted, c.limit, c.overtaken, c.unread) == (r.want, r.admitted, r.limit, r.overtaken,
                                                                            r.unread), (step, name)
            assert c.vtime == pytest.approx(r.vtime) and (c.waited > 0) == (r.aged > 0), (step, name, c, r)
            seen |= {"aged"} if r.aged else set()
            seen |= {"overtaken"} if r.overtaken else set()
            seen |= {"unread"} if r.unread else set()
    assert seen == {"aged", "overtaken", "joined", "unread"}  # (the sequence went through each)


OLD_CLAIMS = ("CREATE TABLE claims (owner TEXT PRIMARY KEY, job TEXT NOT NULL, priority INTEGER NOT NULL, share REAL NOT "
              "NULL, want INTEGER NOT NULL, vtime REAL NOT NULL, admitted INTEGER NOT NULL, waiting_since REAL, claimed_at "
              "REAL NOT NULL, expires_at REAL NOT NULL)")
OLD_ROW = ("INSERT INTO claims VALUES ('old-submitter', 'backfill', 2, 1.0, 500, 7.0, 3500, 1.0, 1.0, 9999999999.0)")


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_ledger_made_by_an_earlier_version_gets_the_new_columns(tmp_path: Path, store: str,
                                                                        request: pytest.FixtureRequest) -> None:
    """A ledger whose claims table an earlier version made (a claim of one of its submitters in it) opens: the new
    columns are added, the old claim is read (no age, no limit: every batch fits it), and posts work beside it."""
    from gatekeeper.state.ledger._postgres import PgLedger
    from gatekeeper.state.ledger._sqlite import SqliteLedger

    if store == "sqlite":
        import sqlite3

        with sqlite3.connect(tmp_path / "ledger.db") as conn:
            conn.execute(OLD_CLAIMS)
            conn.execute(OLD_ROW)
        led: Any = SqliteLedger(str(tmp_path / "ledger.db"), "new-submitter", clock=lambda: 1000.0)
    else:
        import psycopg

        url, ns = request.getfixturevalue("pg_url"), f"old{os.urandom(4).hex()}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "gatekeeper_ledger_{ns}"')
            conn.execute(f'SET search_path TO "gatekeeper_ledger_{ns}"')
            conn.execute(pg_ddl(OLD_CLAIMS))
            conn.execute(OLD_ROW)
        led = PgLedger(url, "new-submitter", namespace=ns)
    try:
        board = await led.put_claim(ClaimPost("nightly", H, 1.0, 100, 0.0, 0, ceiling=20_000))
        old = {c.owner: c for c in board.claims}["old-submitter"]
        assert (old.job, old.priority, old.want, old.vtime, old.admitted) == ("backfill", L, 500, 7.0, 3500)
        assert (old.waited, old.limit, old.overtaken) == (0.0, None, 0)
        assert next_up(board.claims, board.reserved).owner == "new-submitter"
    finally:
        await led.close()


# what a submitter of an earlier version (0.2.0) writes into a ledger it shares with this one, statements as it sends
EARLIER_WRITES = ("INSERT INTO processes VALUES ('old', 'host', 42, 'x', 1.0)", "INSERT INTO jobs VALUES ('j', 'old', '{}', 1.0)",
                  "INSERT INTO tiers VALUES (9, 1.0)",
                  "INSERT INTO claims (owner, job, priority, share, want, vtime, admitted, fit_limit, aged, behind_at, "
                  "overtaken, waiting_since, claimed_at, expires_at) VALUES ('old', 'j', 2, 1.0, 5, 0.0, 0, NULL, 0, NULL, "
                  "0, NULL, 1.0, 2.0)",
                  "INSERT INTO orphans (owner, batch, requests, since, expires_at, holds_until, granted_at, ids, job, "
                  "machine, pid) VALUES ('old', 0, 5, 1.0, 2.0, 2.0, NULL, NULL, NULL, NULL, NULL)")


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_submitter_of_an_earlier_version_still_writes_a_ledger_this_one_opened(
        tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    """Found by a helper's benchmark: a column added to `processes` (which an earlier version fills by position) broke
    every earlier submitter on the host ("table processes has 6 columns but 5 values were supplied"). A ledger this
    version opened (and migrated) takes each of an earlier version's writes."""
    from gatekeeper.state.ledger._postgres import PgLedger
    from gatekeeper.state.ledger._sqlite import SqliteLedger

    if store == "sqlite":
        import sqlite3

        led: Any = SqliteLedger(str(tmp_path / "ledger.db"), "new-submitter", clock=lambda: 1000.0)
        await led.reservations()
        with sqlite3.connect(tmp_path / "ledger.db") as conn:
            for sql in EARLIER_WRITES:
                conn.execute(sql)
    else:
        import psycopg

        url, ns = request.getfixturevalue("pg_url"), f"new{os.urandom(4).hex()}"
        led = PgLedger(url, "new-submitter", namespace=ns)
        await led.reservations()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "gatekeeper_ledger_{ns}"')
            for sql in EARLIER_WRITES:
                conn.execute(sql)
    await led.close()



def test_the_job_ahead_is_named_by_its_submitter_too_where_two_share_its_name() -> None:
    """A waiting job's `ahead` names the job whose turn it is; two inputs of one file name (`in.jsonl` from two
    folders) are told apart by their submitters (a cold tester could not tell which of them was ahead)."""
    high = Claim("host-1-aa", "in.jsonl", H, 1.0, 100)
    low = Claim("host-2-bb", "in.jsonl", L, 1.0, 100)
    other = Claim("host-3-cc", "other.jsonl", L, 1.0, 100)
    assert ahead_of("host-2-bb", [high, low]) == "in.jsonl (host-1-aa)"
    assert ahead_of("host-3-cc", [high, other]) == "in.jsonl"
    assert ahead_of("host-1-aa", [high, low]) is None

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
    job's summary says how long it waited for the other (how long is the night's test's: here the low job's batch
    fits only between its own batch's end and the high job's next reservation, a moment a loaded machine can skip,
    which read 0.0 at load 8); the high job waited for no one."""
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
    assert shares["priority"] == "low" and shares["waited_s"] >= 0
    assert orjson.loads(n_out)["shares"]["waited_s"] == 0
    assert any(e.get("reason") == "shares" for e in events(b_err))
    from gatekeeper.cli._render import render_summary
    from gatekeeper.run.shared._summary import Summary

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
    assert took < 15, f"the low job took {took:.1f} s after the kill"  # (half the lease: 2 s alone)
    assert orjson.loads(out)["shares"]["waited_s"] < 10  # (the lease waited out reads 30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_high_job_stopped_while_it_waits_gives_its_claim_up_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM (an orchestrator's stop) or Ctrl-C on a high job waiting for room: it exits 130, its claim is gone
    from the ledger as it exits (its lease, --ledger-ttl 60, is not waited out), and the low job that held back for
    it goes on at once."""
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    low, high = write_job(tmp_path / "low.jsonl", "low", 500), write_job(tmp_path / "high.jsonl", "high", 300)
    ttl = ["--ledger-ttl", "60"]
    with running_fake(ceiling=300, rate=0.0, workspaces=dict(KEYS)) as fake:
        backfill = start(["submit", str(low), *FLAGS, *ttl, "--ledger", ledger, "--priority", "low"], _env(fake, "k-low"))
        wait_until(lambda: _full(fake), "the low job to fill the queue")
        nightly = start(["submit", str(high), *FLAGS, *ttl, "--ledger", ledger, "--priority", "high"], _env(fake, "k-high"))
        wait_until(lambda: any(c.priority == H and c.want for c in _claims(ledger)), "the high job to wait for room")
        os.kill(nightly.pid, sig)
        nightly.communicate(timeout=30)
        assert nightly.returncode == 130
        assert [c.priority for c in _claims(ledger)] == [L]  # (gone as it exited, not 60 s later)
        stopped = time.monotonic()
        fake.org.config.rate = 600.0
        out, err = backfill.communicate(timeout=60)
        took = time.monotonic() - stopped
    assert backfill.returncode == 0, err[-2000:]
    assert orjson.loads(out)["succeeded"] == 500 and _by_workspace(fake).count("wrkspc_high") == 0
    assert took < 15, f"the low job took {took:.1f} s after the high one stopped"  # (its lease is 60 s)


def test_two_jobs_through_40_minutes_of_a_full_queue_never_stall() -> None:
    """The review's night, end to end: a low backfill of 3,000 and, a minute later, a high job of 9,000 (40 minutes of
    the queue's work), each in its own workspace on one SQLite ledger, through the library over real HTTP against
    the fake served in process, the whole world's clock (the fake's, the ledger's, both jobs') simulated (trio's
    MockClock: a loaded machine makes it slower, never different; `bench_shares.py` runs the same night over real
    HTTP, 120 times faster than the wall). Before the fix the low job's wait reached the bound at minute 30 and
    neither admitted again: no create from minute 31 until it was stopped at 3x the ideal. Now the high job goes
    first and both finish; the queue never sits with room for a waiting batch longer than two polls (a minute
    each), and the span stays within 1.2x the ideal. The low job's summary says how long its batch fitted while the
    turn was the high job's (the high job's says 0), in simulated seconds: a figure no machine's load moves."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:  # (no disk waits)
        night = simulated(lambda world: two_jobs_a_night(Path(d), low=3000, high=9000, world=world))
    assert {k: v["succeeded"] for k, v in night.summaries.items()} == {"low": 3000, "high": 9000}
    t0 = night.creates[0][0]
    told = [(round(at - t0), who) for at, who in night.creates]
    highs = [at for at, who in told if who == "high"]
    between = [at for at, who in told if who == "low" and highs[0] < at < highs[-1]]
    assert all(at - highs[0] >= STARVE_AFTER for at in between), told  # (precedence, but for the bound)
    assert night.stall < 2 * 60, (night.stall, night.stall_at, told)  # (two polls: no machine's load in simulated time)
    assert night.span / night.ideal < 1.2, (night.span, night.ideal)
    waited = {k: v["shares"]["waited_s"] for k, v in night.summaries.items()}
    assert waited["low"] > 0 and waited["high"] == 0, waited


def test_when_load_outside_the_ledger_drains_a_low_job_goes_first_no_further_than_the_high_jobs_batch() -> None:
    """Both jobs on one key (each lists the other's batches), simulated time: 200 requests from outside the ledger
    fill a queue of 200 when a low job starts, and a high job joins 5 s later, both with batches of 50 and a poll of
    30 s; the outside load ends at 40 s. The high job's claim said its batch could not fit however the reservations
    drained, and the low job reads the queue first (at 61 s): it may go first for as much as the high job's next
    batch (50, rule 4), and the high job then reads the queue at once and has every batch until it has none left.
    Before the fix the low job took all four batches of the room (200), and the high job began at its next poll."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        night = simulated(lambda world: two_jobs_a_night(
            Path(d), low=600, high=400, high_after=5.0, ceiling=200, rate=5.0, poll=30.0, world=world, batch=50,
            outside=200, one_workspace=True, fifo=True))
    assert {k: v["succeeded"] for k, v in night.summaries.items()} == {"low": 600, "high": 400}
    t0 = night.creates[0][0]
    told = [(round(at - t0, 1), who) for at, who in night.creates]
    last_high = max(i for i, (_, who) in enumerate(told) if who == "high")
    assert [who for _, who in told[:last_high]].count("low") == 1, told  # (one batch of 50: the high job's own)
    first_high = next(at for at, who in told if who == "high")
    assert first_high - told[0][0] <= 1.0, told  # (its watch woke it: not its next poll, 10 s on)


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


def _unconfirmed(path: Path) -> list[tuple[str, int]]:
    """The live reservations on a SQLite ledger that name no batch: each counts as a create out, holding every other
    job's creates."""
    import sqlite3

    with sqlite3.connect(path) as db:
        return db.execute("SELECT owner, batch FROM reservations WHERE batch_id IS NULL AND requests > 0").fetchall()


def test_a_reservation_no_batch_came_of_holds_no_one_back(tmp_path: Path) -> None:
    """A create refused outright (a 400: nothing made) frees its reservation as the run stops; and a rerun frees one
    an earlier run left unconfirmed (reserved, then killed before its intent was journaled). Otherwise, on a shared
    ledger, a `low` job resumed beside a `high` one deadlocks with it: the high job may not create while the low one's
    reservation says a create is out, and the low job waits for the high one's turn (the swarm's seed 24)."""
    path = tmp_path / "ledger.db"
    ledger = f"sqlite:///{path}"
    low, high = write_job(tmp_path / "low.jsonl", "low", 100), write_job(tmp_path / "high.jsonl", "high", 100)
    with running_fake(ceiling=300, workspaces=dict(KEYS)) as fake:
        fake.inject(Fault("create", status=400, error_type="invalid_request_error", message="refused"))
        r = gk(["submit", str(low), *FLAGS, "--ledger", ledger, "--priority", "low"], _env(fake, "k-low"))
        assert r.returncode != 0 and fake.org.records.creates == 0, r.stderr[-2000:]
        assert _unconfirmed(path) == []
        import sqlite3

        with sqlite3.connect(path) as db:  # (as a run killed between its reservation and its intent leaves it)
            owner = db.execute("SELECT owner FROM jobs").fetchone()[0]
            db.execute("INSERT INTO reservations (owner, batch, requests, batch_id, expires_at) VALUES (?, 0, 100, NULL, ?)",
                       (owner, time.time() + 900))
        nightly = start(["submit", str(high), *FLAGS, "--ledger", ledger, "--priority", "high"], _env(fake, "k-high"))
        wait_until(lambda: any(c.priority == H and c.want for c in _claims(ledger)), "the high job to want room")
        backfill = start(["submit", str(low), *FLAGS, "--ledger", ledger, "--priority", "low"], _env(fake, "k-low"))
        n_out, n_err = nightly.communicate(timeout=60)
        b_out, b_err = backfill.communicate(timeout=60)
    assert nightly.returncode == 0 and backfill.returncode == 0, (n_err[-2000:], b_err[-2000:])
    assert _unconfirmed(path) == []


def _job_of(batch) -> str:
    return str(batch.requests[0][0]).split("-")[0]


def test_jobs_that_see_each_others_batches_keep_precedence(tmp_path: Path) -> None:
    """Two jobs with one key (one workspace: each lists the other's batches, as on one host): a high job that
    arrives while a low one fills the queue gets every batch created from then on until it has none left. Before
    the fix the high job counted the low job's listed batches twice (once as reserved, once as load no reservation
    covers), so its claim's batch never fitted (`fit_limit` 0), and the low job took every room that freed while the
    high job, reading the queue every 30 s, found it full each time."""
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    low, high = write_job(tmp_path / "low.jsonl", "low", 600), write_job(tmp_path / "high.jsonl", "high", 300)
    with running_fake(ceiling=300, rate=0.0, workspaces=dict(KEYS)) as fake:
        backfill = start(["submit", str(low), *FLAGS, "--ledger", ledger, "--priority", "low"], _env(fake, "k-low"))
        wait_until(lambda: _full(fake), "the low job to fill the queue")
        slow = [*FLAGS[:1], "--interval", "30", *FLAGS[3:]]  # (the high job reads the queue every 30 s, as by default)
        nightly = start(["submit", str(high), *slow, "--ledger", ledger, "--priority", "high"], _env(fake, "k-low"))
        wait_until(lambda: any(c.priority == H and c.want for c in _claims(ledger)), "the high job to wait for room")
        mine = next(c for c in _claims(ledger) if c.priority == H)
        first = fake.org.records.creates
        fake.org.config.rate = 300.0  # the queue moves
        moved = time.monotonic()
        n_out, n_err = nightly.communicate(timeout=90)
        took = time.monotonic() - moved
        b_out, b_err = backfill.communicate(timeout=60)
    assert nightly.returncode == 0 and backfill.returncode == 0, (n_err[-2000:], b_err[-2000:])
    order = [_job_of(b) for b in sorted(fake.org.batches.values(), key=lambda b: b.seq)]
    highs = order.count("high")
    assert set(order[:first]) == {"low"} and order[first:first + highs] == ["high"] * highs, order
    assert set(order[first + highs:]) == {"low"}, order
    assert mine.limit == 300, mine  # (the low job's batches are reserved: no load outside the ledger)
    assert took < 20, took  # (it reads the queue when the ledger shows room freed, not at its next poll)


def _listed(bid: str, processing: int, status: str = "in_progress") -> dict[str, Any]:
    return {"id": bid, "processing_status": status, "request_counts": {"processing": processing}}


def _res(owner: str, bid: str | None, n: int = 50, dead_for: float | None = None) -> Any:
    from gatekeeper.state.ledger._base import Reservation
    return Reservation(owner, 0, n, bid, 60.0, dead_for)


@pytest.mark.parametrize(("listed", "reservations", "covered", "why"), [
    ([_listed("a", 50), _listed("b", 50)], [_res("x", "a"), _res("x", "b")], 100, "another's batches, listed: covered"),
    ([_listed("a", 50), _listed("b", 50)], [_res("me", "a"), _res("x", "b")], 50, "ours are `mine` in the grant"),
    ([_listed("a", 30)], [_res("x", "a")], 30, "what the listing shows of it, not its size"),
    ([_listed("a", 50, "ended")], [_res("x", "a")], 0, "an ended batch holds no room"),
    ([_listed("a", 50)], [_res("x", "a", 0)], 0, "a released batch's name covers nothing"),
    ([_listed("a", 50)], [_res("x", "a", dead_for=5.0)], 0, "nor does a dead owner's orphan"),
    ([_listed("a", 50)], [_res("x", None)], 0, "a create unanswered names no batch"),
    ([_listed("c", 50)], [_res("x", "a")], 0, "load outside the ledger stays seen"),
])
def test_the_depth_seen_leaves_out_what_other_jobs_reserve(listed: list[dict[str, Any]], reservations: list[Any],
                                                           covered: int, why: str) -> None:
    from gatekeeper.run.batch._turns import others_reserved
    assert others_reserved(listed, reservations, "me") == covered, why


async def test_a_high_job_that_lists_the_low_ones_batches_keeps_the_turn_as_they_drain(tmp_path: Path) -> None:
    """Simulated time, one SQLite ledger, the real `Turns`: a low job's four batches fill a queue of 200; a high job
    that lists them (one workspace) posts its claim; the low job's batches end and it releases them. Its claim must
    then leave the room to the high job (the issue: the high job's `seen` counted the low job's batches beside their
    reservations, its limit was 0, and the low job took the room), and the high job's watch wakes it at once."""
    from gatekeeper.run.batch._turns import Turns, others_reserved

    clock = [1_000_000.0]
    now = lambda: clock[0]  # noqa: E731
    lo_led = SqliteLedger(str(tmp_path / "ledger.db"), "x", clock=now)
    hi_led = SqliteLedger(str(tmp_path / "ledger.db"), "y", clock=now)
    lo, hi = Turns(lo_led, "lo", "low", 1.0, now), Turns(hi_led, "hi", "high", 1.0, now)
    listing = []
    for k in range(4):
        assert await lo.turn(50, 200, 50 * k)
        assert await lo_led.reserve(k, 50, 200, 50 * k)
        await lo_led.confirm(k, f"b{k}")
        listing.append(_listed(f"b{k}", 50))
        await lo.took(50, 50 * (k + 1), 50)
    seen = 200 - others_reserved(listing, await hi_led.reservations(), "y")
    assert seen == 0
    assert await hi.turn(50, 200, seen) and not await hi_led.reserve(9, 50, 200, seen)  # (its turn; no room yet)
    assert not await lo.turn(50, 200, 200) and lo.ahead == "hi"
    woke: list[float] = []

    async def watch() -> None:
        async def tick(s: float) -> None:
            clock[0] += s
            await anyio.sleep(0)
        await hi.watch(tick)
        woke.append(clock[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.2)  # (its first look at the ledger taken, in a thread: a loaded machine is slow to)
        for k in range(4):
            await anyio.sleep(0)
            await lo_led.release(k)  # (the low job saw its batches end)
        with anyio.move_on_after(10):  # (bounded: a watch that never wakes fails below, never hangs the suite)
            while not woke:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert woke, "the high job's watch did not wake when room freed"
    assert not await lo.turn(50, 200, 0) and lo.ahead == "hi"  # (the low job leaves the room to it)
    assert await hi.turn(50, 200, 0) and await hi_led.reserve(9, 50, 200, 0)


async def test_room_beside_another_jobs_listed_batches_is_granted(tmp_path: Path) -> None:
    """A queue of 200 holds 100 of another job's, which this job lists: its batch of 50 is granted (the issue's
    `waiting ledger` with 100 of 200 free: the listed batches were counted beside their reservations, 250 > 200)."""
    from gatekeeper.run.batch._turns import others_reserved

    other, me = SqliteLedger(str(tmp_path / "l.db"), "x", clock=lambda: 1e6), SqliteLedger(str(tmp_path / "l.db"), "y", clock=lambda: 1e6)
    for k in range(2):
        assert await other.reserve(k, 50, 200, 50 * k)
        await other.confirm(k, f"b{k}")
    seen = 100 - others_reserved([_listed("b0", 50), _listed("b1", 50)], await me.reservations(), "y")
    assert seen == 0 and await me.reserve(0, 50, 200, seen)
    assert await me.reserve(1, 50, 200, seen + 50) and not await me.reserve(2, 50, 200, seen + 100)  # (then full)


async def test_a_turn_that_comes_before_the_watch_starts_wakes_it_at_once(tmp_path: Path) -> None:
    """A low job's round finds the turn the high job's; before its watch starts, the high job posts `want 0` (its last
    batch admitted). The watch must wake at once, not wait for the turn to change again (a cold tester's low job sat
    18.8 and 26.8 s with room free and nothing else wanting it, until its next reading); and a round that still finds
    the turn another's is not woken at once again (no loop of readings)."""
    from gatekeeper.run.batch._turns import Turns

    clock = [1_000_000.0]
    now = lambda: clock[0]  # noqa: E731
    lo_led = SqliteLedger(str(tmp_path / "ledger.db"), "x", clock=now)
    hi_led = SqliteLedger(str(tmp_path / "ledger.db"), "y", clock=now)
    lo, hi = Turns(lo_led, "lo", "low", 1.0, now), Turns(hi_led, "hi", "high", 1.0, now)
    assert await hi.turn(50, 1000, 0)
    assert not await lo.turn(50, 1000, 0) and lo.ahead == "hi"
    slept: list[float] = []

    async def tick(s: float) -> None:
        slept.append(s)
        clock[0] += s
        await anyio.sleep(0)

    with anyio.fail_after(10):
        await hi.turn(0, 1000, 50)  # (the high job wants nothing more: the turn is the low job's now)
        await lo.watch(tick)
    assert slept == []  # (woken at its first look)
    assert await hi.turn(50, 1000, 50)
    assert not await lo.turn(50, 1000, 50) and lo.ahead == "hi"
    with anyio.move_on_after(2):
        await lo.watch(tick)
    assert slept, "a round that finds the turn another's was woken at once"
