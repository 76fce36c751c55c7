"""The shared admission ledger: the formula, atomic grants, TTL and heartbeat, and three submitters on one ceiling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from gatekeeper._errors import LedgerError, UsageError
from gatekeeper.run.shared._beats import liveness
from gatekeeper.state._db import SqliteDb
from gatekeeper.state._host import process_started, this_process
from gatekeeper.state.ledger._base import ClaimPost, Liveness, Reservation, creating_of_size, grant
from gatekeeper.state.ledger._local import LocalLedger
from gatekeeper.state.ledger._open import open_ledger
from gatekeeper.state.ledger._postgres import PgLedger
from gatekeeper.state.ledger._redis import RedisLedger
from gatekeeper.state.ledger._sqlite import SqliteLedger
from tests.fakes import running_fake
from tests.runs import gk
from tests.scenarios import three_submitters, write_job

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "redis", "postgres"])
async def make_ledger(request: pytest.FixtureRequest, tmp_path: Path):
    """Ledgers of one shared store (a namespace of this test's own), one per owner."""
    made = []
    ns = f"t{time.monotonic_ns()}"
    clock = [1_000_000.0]  # SQLite's expiries are on this host's clock: simulated here; Redis and PostgreSQL use their own
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        open_one = lambda owner, ttl, live: RedisLedger(url, owner, ttl=ttl, namespace=ns, liveness=live)  # noqa: E731
    elif request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        open_one = lambda owner, ttl, live: PgLedger(url, owner, ttl=ttl, namespace=ns, liveness=live)  # noqa: E731
    else:
        open_one = lambda owner, ttl, live: SqliteLedger(str(tmp_path / "ledger.db"), owner, ttl=ttl,  # noqa: E731
                                                         clock=lambda: clock[0], liveness=live)

    def make(owner: str, ttl: float = 60.0, liveness: Liveness | None = None):
        made.append(open_one(owner, ttl, liveness))
        return made[-1]

    async def elapse(seconds: float) -> None:
        """Time passes: on the simulated clock for SQLite, for real where the server keeps the time."""
        if request.param == "sqlite":
            clock[0] += seconds
        else:
            await anyio.sleep(seconds)

    make.elapse = elapse  # type: ignore[attr-defined]
    yield make
    for led in made:
        await led.close()


@pytest.mark.parametrize(("reserved", "seen", "mine", "n", "ok"), [
    (0, 0, 0, 100, True), (200, 0, 0, 100, True), (200, 0, 0, 101, False),
    (100, 150, 100, 100, True), (100, 150, 100, 151, False), (0, 50, 80, 300, True)])
def test_grant_formula(reserved: int, seen: int, mine: int, n: int, ok: bool) -> None:
    """reserved + max(0, seen - mine) + n <= ceiling (300), and no other submitter's create out."""
    assert grant(reserved, seen, mine, n, 300) is ok
    assert grant(reserved, seen, mine, n, 300, others_creating=1) is False


@pytest.mark.parametrize(("granted_for", "dead_for", "holds_for", "held"), [
    (1.0, None, None, False),     # a create just out: answered in a moment, the turn stays the refused job's
    (45.0, None, None, True),     # out unanswered past 30 s: lost, or being reconciled
    (None, None, None, True),     # taken back by a rerun: being reconciled
    (1.0, 5.0, 100.0, True),      # a dead submitter's, while it holds the turn
    (1.0, 5.0, 0.0, False),       # ... and once it no longer does
])
def test_a_refusal_for_anothers_create_of_the_size_lasts_only_when_that_create_is_lost_or_dead(
        granted_for: float | None, dead_for: float | None, holds_for: float | None, held: bool) -> None:
    """What lets a refused job give its turn up (`run.batch._admit`): another's create of its size that will not be
    answered in a moment. Giving it up for a create just out let a low job take the whole freed queue while a
    normal one waited (a cold tester), and keeping it for a lost one stalled every job for 40 minutes (seed 80101)."""
    r = Reservation("B", 0, 10, None, 60.0, dead_for, granted_for, holds_for=holds_for)
    assert creating_of_size([r], "A", 10) is held
    assert creating_of_size([r], "A", 11) is False and creating_of_size([r], "B", 10) is False


async def test_reserve_confirm_release(make_ledger) -> None:
    """Reservations of two owners add up against the ceiling; release gives the room back, and a released batch
    stays named (no requests) so a lost create of another is never taken for it."""
    a, b = make_ledger("A"), make_ledger("B")
    assert await a.reserve(0, 60, 100, 0)
    await a.confirm(0, "msgbatch_a")
    assert not await b.reserve(0, 50, 100, 0)
    assert await b.reserve(0, 40, 100, 0)
    await b.confirm(0, "msgbatch_b")
    rows = await a.reservations()
    assert {(r.owner, r.requests, r.batch_id) for r in rows} == {("A", 60, "msgbatch_a"), ("B", 40, "msgbatch_b")}
    await a.release(0)
    assert await b.reserve(1, 60, 100, 0)
    await b.release(1)  # (never created: gone)
    await b.release_all()
    rows = await a.reservations()
    assert {(r.owner, r.requests, r.batch_id, r.live) for r in rows} == {("A", 0, "msgbatch_a", False),
                                                                          ("B", 0, "msgbatch_b", False)}
    assert all(r.expires_in > 86_400 for r in rows)
    await a.heartbeat()  # (a heartbeat keeps live reservations, never shortens a name)
    assert all(r.expires_in > 86_400 for r in await a.reservations())


async def test_creates_of_one_size_go_one_at_a_time_across_submitters(make_ledger) -> None:
    """While A's create is out (its reservation not confirmed), B is refused a create of its size whatever the room;
    once A's batch is confirmed (or released), B may go. A's own next batches are not held back by its own. A create
    of another size goes at once: a lost one's candidates are of its size, never taken for A's (issue 60, seed 9964:
    a job whose creates kept failing held every other job's, of any size, for 43 minutes with the queue empty)."""
    a, b = make_ledger("A"), make_ledger("B")

    async def held(led, n: int) -> bool:  # (what the refused job reads to know no room building up ends it: rule 4)
        return creating_of_size(await led.reservations(), led.owner, n, stuck_after=-1.0)  # (out: at once stuck)

    assert await a.reserve(0, 10, 1000, 0)
    assert not await b.reserve(0, 10, 1000, 0) and not await b.reserve(0, 10, None, 0)
    assert await held(b, 10) and not await held(a, 10) and not await held(b, 7)
    assert await b.reserve(5, 7, 1000, 0)  # (another size)
    assert not await a.reserve(5, 7, 1000, 0)  # (... and B's of that size out holds A's of it)
    assert await held(a, 7)
    assert await a.reserve(1, 10, 1000, 0)
    await a.confirm(0, "msgbatch_a0")
    assert not await b.reserve(0, 10, 1000, 0)  # (A's second is still out)
    await a.release(1)
    assert not await held(b, 10)
    assert await b.reserve(0, 10, 1000, 0)
    assert not await a.reserve(2, 10, 1000, 0)
    await b.confirm(0, "msgbatch_b0")
    await b.confirm(5, "msgbatch_b5")
    assert not await a.reserve(2, 990, 1000, 0) and not await held(a, 990)  # (refused for room: that builds up)


async def test_a_reservation_says_since_when_its_create_may_have_made_a_batch(make_ledger) -> None:
    """Every shared ledger records when each turn was granted (`granted_for`, seconds ago) and the print of the
    custom_ids its create sends (`ids`), carried into its orphan when its owner is found dead: a batch created before
    it, or carrying other ids, is not its create's (`decide._reconcile.rival_creates`, `carrying`). A create taken
    back by a resumed run says nothing (None: a rival of every candidate); a turn granted again says it afresh."""
    child = _sleeper()
    a = make_ledger("A", liveness=_process(child.pid))
    judge = make_ledger("judge", liveness=_process())
    await a.ping()
    assert await a.reserve(0, 10, 1000, 0, ids="10.a.b")
    await a.sending(0)
    await a.hold(1, 20, None)
    await a.sending(1)  # (a create taken back: sent or not is the journal's to say, not the ledger's)
    assert await a.reserve(2, 30, 1000, 0)  # (a create that does not say its ids)
    await a.sending(2)
    await make_ledger.elapse(1.5)
    assert await a.reserve(3, 40, 1000, 0, ids="40.c.d") and await a.reserve(3, 40, 1000, 0, ids="40.e.f")
    await a.sending(3)
    rows = {r.batch: r for r in await judge.reservations() if r.owner == "A"}
    assert (rows[1].granted_for, rows[1].ids, rows[1].sent) == (None, None, True)
    assert rows[0].granted_for is not None and 1.4 < rows[0].granted_for < 30 and rows[0].ids == "10.a.b"
    assert rows[2].granted_for is not None and rows[2].ids is None
    assert rows[3].granted_for is not None and rows[3].granted_for < 1.4 and rows[3].ids == "40.e.f"
    child.kill()
    child.wait()
    await judge.ping()
    orphans = {r.batch: r for r in await judge.reservations() if r.owner == "A"}
    assert all(r.dead_for is not None for r in orphans.values())
    assert orphans[0].granted_for is not None and orphans[0].granted_for >= 1.4 and orphans[0].ids == "10.a.b"
    assert (orphans[1].granted_for, orphans[1].ids) == (None, None)
    assert orphans[3].ids == "40.e.f"


async def test_unreserved_depth_counts_once(make_ledger) -> None:
    """Depth a submitter sees beyond its own reservations counts against the ceiling."""
    a = make_ledger("A")
    assert await a.reserve(0, 30, 100, seen=0)
    assert not await a.reserve(1, 30, 100, seen=30 + 50)  # 30 reserved + 50 unreserved + 30 > 100
    assert await a.reserve(1, 20, 100, seen=30 + 50)


async def test_concurrent_reservations_never_overshoot(make_ledger) -> None:
    """Forty concurrent reservations of 10 from four owners: exactly ten are granted against a ceiling of 100."""
    owners = [make_ledger(f"O{i}") for i in range(4)]
    granted: list[bool] = []

    async def one(led, k: int) -> None:
        granted.append(await led.reserve(k, 10, 100, 0))

    async with anyio.create_task_group() as tg:
        for k in range(10):
            for led in owners:
                tg.start_soon(one, led, k)
    assert sum(granted) == 10
    assert sum(r.requests for r in await owners[0].reservations()) == 100


async def test_dead_owner_expires_after_ttl_unless_heartbeat(make_ledger) -> None:
    """Without a heartbeat a reservation expires after its TTL; with one it stays."""
    dead, alive, other = make_ledger("dead", ttl=0.5), make_ledger("alive", ttl=0.5), make_ledger("other")
    assert await dead.reserve(0, 50, 100, 0)
    await dead.confirm(0, "msgbatch_d")
    assert await alive.reserve(0, 50, 100, 0)
    await alive.confirm(0, "msgbatch_l")
    for _ in range(4):
        await make_ledger.elapse(0.25)
        await alive.heartbeat()
    assert {r.owner for r in await other.reservations()} == {"alive"}
    assert await other.reserve(0, 50, 100, 0)


async def test_hold_takes_a_reservation_back(make_ledger) -> None:
    """A resumed submitter records its live batches without asking (they exist already)."""
    a = make_ledger("A")
    await a.hold(3, 80, "msgbatch_x")
    assert not await make_ledger("B").reserve(0, 30, 100, 0)


def _process(pid: int | None = None, *, started: str | None = None, machine: str | None = None) -> Liveness:
    """This process's liveness, recording another pid (a child, gone later), start time or machine as its own."""
    here = liveness(registered=True)
    assert here.me is not None
    me = {**here.me, **({"pid": pid, "started": process_started(pid) or ""} if pid else {}),
          **({"started": started} if started is not None else {}), **({"machine": machine} if machine else {})}
    return Liveness(me, machine or here.machine, here.ended)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


async def test_a_submitter_dead_on_this_machine_is_dropped_at_once(make_ledger) -> None:
    """kill -9 on a submitter of this machine: the next step of any submitter here drops it, not its TTL (600 s)
    later: its confirmed batch stays named, its create that was out becomes an orphan of its size (never live,
    its requests free, so another submitter reserves at once), its claim and its job registration go. The orphan
    keeps the turn for creates of its own size alone (its batch could be taken for theirs), a TTL at most."""
    child = _sleeper()
    dead, other = make_ledger("dead", ttl=600, liveness=_process(child.pid)), make_ledger("other", ttl=600, liveness=_process())
    await dead.ping()
    await other.ping()
    assert await dead.reserve(0, 50, 1000, 0)
    await dead.confirm(0, "msgbatch_d0")
    assert await dead.reserve(1, 40, 1000, 0)  # its create out
    await dead.sending(1)
    assert await dead.claim_job("input-x", {"host": "h", "pid": child.pid}) is None
    await dead.put_claim(ClaimPost("job-x", 1, 1.0, 40, 0.0, 50))
    assert not await other.reserve(0, 40, 1000, 0)  # alive: its create holds the turn for its size
    assert not await other.reserve(0, 10, 95, 0)  # ... and its requests the room
    assert await other.claim_job("input-x", {"host": "h2"}) is not None
    child.kill()
    child.wait()
    assert await other.reserve(0, 10, 95, 0)  # dead: its requests freed at once
    rows = {(r.owner, r.batch): r for r in await other.reservations()}
    assert (rows["dead", 0].requests, rows["dead", 0].batch_id, rows["dead", 0].live) == (0, "msgbatch_d0", False)
    assert rows["dead", 0].expires_in > 86_400  # (named as a released batch is, for NAMED_FOR)
    orphan = rows["dead", 1]
    assert (orphan.requests, orphan.batch_id, orphan.live) == (40, None, False) and orphan.dead_for is not None
    # (what `status` shows of it: how long it still holds the turn, and, where the ledger keeps them, whose it was)
    assert orphan.holding and orphan.holds_for is not None and 500 < orphan.holds_for <= 600
    named = (orphan.job, orphan.pid) == ("job-x", child.pid) and orphan.machine == this_process()["machine"]
    assert named or isinstance(dead, RedisLedger) and (orphan.job, orphan.pid) == (None, None)
    assert await other.claim_job("input-x", {"host": "h2"}) is None  # its registration gone
    assert [c.owner for c in await other.claims()] == []
    assert sum(r.requests for r in await other.reservations() if r.live) == 10
    await other.release(0)
    assert not await other.reserve(1, 40, 1000, 0)  # (its size: held, as a create of the dead one's may exist)


async def test_a_dead_submitters_create_holds_its_size_no_longer_than_its_ttl(make_ledger) -> None:
    """The turn a dead submitter's create keeps for its size lasts no longer than its reservation would have (its
    TTL after its last heartbeat, here 2 s); a reservation already lapsed leaves no orphan at all."""
    child, lapsed = _sleeper(), _sleeper()
    dead = make_ledger("dead", ttl=2.0, liveness=_process(child.pid))
    gone = make_ledger("gone", ttl=0.2, liveness=_process(lapsed.pid))
    other = make_ledger("other", liveness=_process())
    await gone.ping()
    assert await gone.reserve(0, 30, 1000, 0)
    await gone.sending(0)
    await make_ledger.elapse(0.5)  # ("gone"'s reservation lapses: 0.2 s)
    await dead.ping()
    assert await dead.reserve(0, 40, 1000, 0)
    await dead.sending(0)
    for proc in (child, lapsed):
        proc.kill()
        proc.wait()
    assert not await other.reserve(0, 40, 1000, 0)  # (held for its size)
    assert await other.reserve(1, 30, 1000, 0)  # (lapsed before its owner was found dead: nothing held)
    assert [r.owner for r in await other.reservations() if r.dead_for is not None] == ["dead"]
    assert [r.owner for r in await other.reservations() if r.holding] == ["dead"]
    assert creating_of_size(await other.reservations(), other.owner, 40)  # (a dead one's: however fresh)
    await make_ledger.elapse(2.1)
    assert not [r for r in await other.reservations() if r.holding]  # (a rival's name now, holding nothing)
    assert not creating_of_size(await other.reservations(), other.owner, 40)
    assert await other.reserve(0, 40, 1000, 0)


async def test_a_create_never_sent_leaves_no_orphan_and_no_rival(make_ledger) -> None:
    """Every shared ledger knows a create whose body never went out (`sending` not called: the run was killed
    between its turn and its send): it is no rival of another's lost create (`Reservation.sent`), and once its owner
    is found dead it leaves no orphan to hold the size's turn (issue 60, seed 10990: a dead job's primer, never
    sent, kept a lost create of the same size and ids unproven). One whose body went out leaves its orphan."""
    child = _sleeper()
    a = make_ledger("A", liveness=_process(child.pid))
    judge = make_ledger("judge", liveness=_process())
    await a.ping()
    assert await a.reserve(0, 10, 1000, 0) and await a.reserve(1, 20, 1000, 0)
    await a.sending(1)
    assert {r.batch: r.sent for r in await judge.reservations() if r.owner == "A"} == {0: False, 1: True}
    child.kill()
    child.wait()
    await judge.ping()
    orphans = {r.batch for r in await judge.reservations() if r.owner == "A" and r.dead_for is not None}
    assert orphans == {1}
    assert await judge.reserve(0, 10, 1000, 0)  # (no orphan of 10 holds the turn for that size)
    assert not await judge.reserve(1, 20, 1000, 0)  # (... the orphan of 20 does)


async def test_a_pid_reused_by_a_later_process_is_not_taken_for_the_submitter(make_ledger) -> None:
    """A record whose pid is in use by a process started at another time (a reused pid) has ended; one whose pid
    and start time are the live process's has not; one of another machine, or where the system does not say
    which machine this is, is left to its TTL."""
    here = _process()
    assert here.me is not None and here.machine is not None
    reused = make_ledger("reused", liveness=_process(started=str(int(here.me["started"] or 2) - 1)))
    live = make_ledger("live", liveness=here)
    remote = make_ledger("remote", liveness=_process(machine="another-boot/4026531836", started="1"))
    blind = make_ledger("blind", liveness=Liveness(None, None, here.ended))  # (reads only, judges nothing)
    for k, led in enumerate((reused, remote)):
        await led.ping()
        assert await led.reserve(k, 10, 1000, 0)
        await led.confirm(k, f"msgbatch_{k}")
    assert {r.owner for r in await blind.reservations() if r.live} == {"reused", "remote"}
    await live.ping()  # (a step of a submitter of this machine: it judges the others here)
    assert await live.reserve(2, 10, 1000, 0)
    assert {r.owner for r in await blind.reservations() if r.live} == {"live", "remote"}


async def test_a_rerun_of_a_dead_submitter_takes_its_place_back(make_ledger) -> None:
    """A dead submitter's rerun (the same owner, the job's own) records its own process before anything else: a
    sweep after that leaves it alone. It holds its unknown create again (no longer an orphan), and once finished
    leaves neither orphan nor record."""
    child = _sleeper()
    first = make_ledger("job-1", liveness=_process(child.pid))
    await first.ping()
    assert await first.reserve(0, 30, 1000, 0)
    await first.confirm(0, "msgbatch_j0")
    assert await first.reserve(1, 30, 1000, 0)
    await first.sending(1)
    child.kill()
    child.wait()
    judge = make_ledger("judge", liveness=_process())
    assert [r.dead_for is not None for r in await judge.reservations() if r.batch == 1] == [True]  # (an orphan)
    rerun = make_ledger("job-1", liveness=_process())
    await rerun.ping()
    await rerun.hold(0, 30, "msgbatch_j0")
    await rerun.hold(1, 30, None)
    rows = [(r.batch, r.requests, r.live) for r in await judge.reservations() if r.owner == "job-1"]
    assert sorted(rows) == [(0, 30, True), (1, 30, True)]  # (held again, live: not swept, no orphan left)
    assert not await judge.reserve(0, 30, 1000, 0)  # (its create is out again: creates of a size go one at a time)
    await rerun.release(1)
    await rerun.release_all()
    assert [(r.batch, r.live) for r in await judge.reservations() if r.owner == "job-1"] == [(0, False)]


async def _dead_with_a_create_out(make_ledger, n: int = 30):
    """A submitter ("job-1") with one batch confirmed and a create of `n` out, killed on this machine; a live one
    ("other") of this machine that finds it dead: its create an orphan holding the turn for `n`."""
    child = _sleeper()
    first = make_ledger("job-1", ttl=600, liveness=_process(child.pid))
    await first.ping()
    assert await first.reserve(0, n, 1000, 0)
    await first.confirm(0, "msgbatch_j0")
    assert await first.reserve(1, n, 1000, 0)
    await first.sending(1)
    child.kill()
    child.wait()
    other = make_ledger("other", ttl=600, liveness=_process())
    assert not await other.reserve(0, n, 1000, 0)
    assert [r.holding for r in await other.reservations() if r.owner == "job-1" and r.batch == 1] == [True]
    return other


async def test_a_dead_submitters_create_settled_by_anothers_listing_holds_nobody(make_ledger) -> None:
    """Issue 58 (a cold test: job B waited 593 s for job A's rerun): a live submitter that finds the dead one's
    batch settles its orphan (`settle_orphan`): named for the dead one, the turn for its size is free at once, the
    batch stays named (no other's lost create takes it), and the dead one's rerun takes the name back with its create
    (neither holding the turn nor unnamed); settled once only."""
    other = await _dead_with_a_create_out(make_ledger)
    assert await other.settle_orphan("job-1", 1, "msgbatch_j1")
    assert not await other.settle_orphan("job-1", 1, "msgbatch_j1")  # (gone: settled already)
    rows = {(r.owner, r.batch): r for r in await other.reservations()}
    assert (rows["job-1", 1].batch_id, rows["job-1", 1].requests, rows["job-1", 1].dead_for) == ("msgbatch_j1", 0, None)
    assert not creating_of_size(await other.reservations(), other.owner, 30)
    assert await other.reserve(0, 30, 1000, 0)  # (at once: the TTL is 600 s)
    await other.confirm(0, "msgbatch_o0")
    rerun = make_ledger("job-1", ttl=600, liveness=_process())
    await rerun.ping()
    await rerun.hold(1, 30, "msgbatch_j1")  # (`run.shared._beats.named_for`: the name its journal does not know yet)
    rows = {(r.owner, r.batch): r for r in await other.reservations()}
    assert (rows["job-1", 1].batch_id, rows["job-1", 1].live) == ("msgbatch_j1", True)
    assert await other.reserve(1, 30, 1000, 0)


async def test_a_dead_submitters_create_that_made_no_batch_is_dropped(make_ledger) -> None:
    """Settled as having made no batch, the orphan goes without a name: the turn for its size is free, and it is no
    rival of anyone's lost create any more."""
    other = await _dead_with_a_create_out(make_ledger)
    assert await other.settle_orphan("job-1", 1, None)
    assert not [r for r in await other.reservations() if r.owner == "job-1" and r.batch == 1]
    assert await other.reserve(0, 30, 1000, 0)


async def test_a_submitter_never_settles_its_own_orphan_for_itself(make_ledger) -> None:
    """A rerun settles its own create by reconciling it (`hold`, then `confirm` or `release`), never as another's."""
    await _dead_with_a_create_out(make_ledger)
    rerun = make_ledger("job-1", ttl=600, liveness=_process())
    assert not await rerun.settle_orphan("job-1", 1, "msgbatch_j1")
    assert [r.holding for r in await rerun.reservations() if r.owner == "job-1" and r.batch == 1] == [True]


async def test_a_record_not_renewed_for_a_week_is_dropped_whatever_its_machine(tmp_path: Path) -> None:
    """A submitter of another machine that never came back leaves no record for ever: not renewed for NAMED_FOR
    (its heartbeat renews it every ttl/3), it is dropped, its names kept; one renewed stays."""
    clock = [1_000_000.0]
    path = str(tmp_path / "ledger.db")
    month = 30 * 86_400.0  # (a TTL longer than the week: only the record's age can drop it)
    gone = SqliteLedger(path, "gone", ttl=month, clock=lambda: clock[0], liveness=_process(machine="another-boot/1", started="1"))
    kept = SqliteLedger(path, "kept", ttl=month, clock=lambda: clock[0], liveness=_process(machine="another-boot/1", started="1"))
    judge = SqliteLedger(path, "judge", clock=lambda: clock[0], liveness=_process())
    for k, led in enumerate((gone, kept)):
        await led.ping()
        assert await led.reserve(k, 10, 1000, 0)
        await led.confirm(k, f"msgbatch_{k}")
    clock[0] += 3 * 86_400.0
    await kept.heartbeat()
    assert {r.owner for r in await judge.reservations() if r.live} == {"gone", "kept"}
    clock[0] += 5 * 86_400.0
    await kept.heartbeat()
    await judge.ping()
    rows = {r.owner: r for r in await judge.reservations()}
    assert rows["kept"].live and not rows["gone"].live and rows["gone"].batch_id == "msgbatch_0"
    assert await judge.claim_job("j", {}) is None


def _count_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real = SqliteDb.open

    def counted(cls: type, target: str, *args: object, **kw: object) -> SqliteDb:
        opened.append(target)
        return real(target, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SqliteDb, "open", classmethod(counted))
    return opened


async def test_a_sqlite_ledgers_steps_share_one_connection_until_one_fails_the_file_goes_or_it_is_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its steps run on one connection (opening one a step, and the checkpoint at its close, were a fifth of a step's
    time); after a step that failed, after `close`, and once the file at its path is gone, the next step opens
    another, which finds what a new submitter would: here no ledger at all."""
    opened = _count_opens(monkeypatch)
    path = str(tmp_path / "ledger.db")
    led = SqliteLedger(path, "a")
    for k in range(3):
        assert await led.reserve(k, 10, 100, seen=0)
    assert len(await led.reservations()) == 3 and len(opened) == 1
    with pytest.raises(LedgerError, match="no such table"):
        led._tx(lambda db, now: db.execute("SELECT * FROM missing"))
    assert len(await led.reservations()) == 3 and len(opened) == 2
    await led.close()
    assert len(await led.reservations()) == 3 and len(opened) == 3
    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)
    with pytest.raises(LedgerError, match="no such table"):
        await led.reservations()
    assert len(opened) == 4


def test_a_forked_child_opens_a_connection_of_its_own_and_leaves_its_parents_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's rule: a connection is never carried across fork. The child's first step opens its own; the parent
    goes on with the one it had, its reservation and the child's both there."""
    opened = _count_opens(monkeypatch)
    led = SqliteLedger(str(tmp_path / "ledger.db"), "a")
    count = "SELECT COUNT(*) FROM reservations"
    led._tx(lambda db, now: db.execute("INSERT INTO reservations (owner, batch, requests, expires_at) VALUES "
                                       "('parent', 0, 1, 1e12)"))
    parents = led._db
    pid = os.fork()
    if pid == 0:  # (the child: its verdict is its exit status)
        try:
            ok = led._db is None and led._tx(lambda db, now: db.execute(
                "INSERT INTO reservations (owner, batch, requests, expires_at) VALUES ('child', 0, 1, 1e12)")) is not None
            os._exit(0 if ok and led._db is not parents and len(opened) == 2 else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert led._tx(lambda db, now: db.execute(count).fetchone()[0]) == 2
    assert led._db is parents and len(opened) == 1


async def test_a_redis_ledger_keeps_a_turn_no_longer_than_its_reservation(redis_url: str) -> None:
    """Redis keeps the turns in a hash of their own (beside the reservations' values an earlier version reads): a
    turn goes with its reservation (released, or its owner found dead with its create never sent), stays with a
    batch named, and goes with its orphan once the owner's rerun releases it."""
    ns = f"t{time.monotonic_ns()}"
    child = _sleeper()
    a = RedisLedger(redis_url, "A", namespace=ns, liveness=_process())
    b = RedisLedger(redis_url, "B", namespace=ns, liveness=_process(child.pid))
    try:
        await b.ping()
        assert await b.reserve(0, 5, 1000, 0, ids="5.a.b") and await b.reserve(1, 6, 1000, 0)
        await b.sending(1)
        assert await a.reserve(0, 10, 1000, 0, ids="10.a.b") and await a.reserve(1, 20, 1000, 0)
        await a.sending(1)
        await a.confirm(1, "msgbatch_a1")
        await a.release(0)
        child.kill()
        child.wait()
        await a.ping()  # (B found dead: its create never sent goes, the one sent becomes an orphan)
        await a.release_all()
        assert sorted(await a.client.hkeys(a.turns_key)) == [b"A|1", b"B|1"]  # (A's batch named, B's orphan)
        rerun = RedisLedger(redis_url, "B", namespace=ns, liveness=_process())
        await rerun.release(1)
        await rerun.close()
        assert await a.client.hkeys(a.turns_key) == [b"A|1"]
    finally:
        await a.close()
        await b.close()


def test_open_ledger_urls(tmp_path: Path) -> None:
    assert isinstance(open_ledger(None), LocalLedger) and isinstance(open_ledger("local"), LocalLedger)
    assert isinstance(open_ledger(f"sqlite://{tmp_path}/l.db", owner="x"), SqliteLedger)
    with pytest.raises(UsageError):
        open_ledger("mysql://nope")


def test_three_workspaces_with_redis_ledger_no_refusals(tmp_path: Path, redis_url: str) -> None:
    """Three submitters in three workspaces, one ceiling, one Redis ledger: no refusal, never over the ceiling."""
    out = three_submitters(tmp_path, ledger=redis_url.rstrip("0") + "1")
    assert out.codes == [0, 0, 0], out.summaries
    assert out.refusals == 0
    assert out.max_depth <= out.ceiling
    assert out.succeeded_twice == 0
    assert [s["succeeded"] for s in out.summaries] == [300, 300, 300]


def test_three_workspaces_without_ledger_are_refused(tmp_path: Path) -> None:
    """The same scenario without a ledger: submitters that cannot see each other get refused (and still finish)."""
    out = three_submitters(tmp_path, ledger="none", hold_until_refused=True)
    assert out.refusals > 0
    assert out.codes == [0, 0, 0] and [s["succeeded"] for s in out.summaries] == [300, 300, 300]


def test_three_workspaces_with_postgres_ledger_no_refusals(tmp_path: Path, pg_database: str) -> None:
    """Three submitters in three workspaces sharing a PostgreSQL ledger: no refusal, never over the ceiling."""
    out = three_submitters(tmp_path, ledger=pg_database)
    assert out.codes == [0, 0, 0], out.summaries
    assert out.refusals == 0 and out.max_depth <= out.ceiling and out.succeeded_twice == 0
    assert [s["succeeded"] for s in out.summaries] == [300, 300, 300]


def test_three_workspaces_with_sqlite_ledger(tmp_path: Path) -> None:
    """The one-host ledger gives the same guarantee across processes."""
    out = three_submitters(tmp_path, ledger=f"sqlite://{tmp_path}/ledger.db")
    assert out.codes == [0, 0, 0] and out.refusals == 0 and out.max_depth <= out.ceiling


def test_killed_submitter_capacity_returns_within_ttl(tmp_path: Path, redis_url: str) -> None:
    """A submitter killed with reservations held: they vanish within the TTL and another submitter finishes."""
    url = redis_url.rstrip("0") + "2"
    job = write_job(tmp_path / "a.jsonl", "a", 200)
    other = write_job(tmp_path / "b.jsonl", "b", 200)
    with running_fake(ceiling=300, rate=0.0, workspaces={"k1": "w1", "k2": "w2"}) as fake:
        env1 = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "k1"}
        proc = gk(["submit", str(job), "--json", "--interval", "0.05", "--max-rpm", "60000", "--ceiling", "300", "--ledger", url,
                   "--ledger-ttl", "2"], env1, crash_at="after-create:2")
        assert proc.returncode == -signal.SIGKILL
        held = anyio.run(lambda: _reservations(url))
        assert sum(r.requests for r in held) == 150  # two batches of 75
        started = time.monotonic()
        while anyio.run(lambda: _reservations(url)):  # polled: they must vanish once the 2 s TTL has passed
            # (Redis expires them on its own clock; the bound is wide for the polls of a loaded machine, and still
            # fails reservations that outlive the TTL for good, as a lost expiry or a dead owner's heartbeat would)
            assert time.monotonic() - started < 20.0, "reservations outlived their TTL"
            time.sleep(0.1)
        fake.org.config.rate = 5000.0
        env2 = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "k2"}
        done = gk(["submit", str(other), "--json", "--interval", "0.05", "--max-rpm", "60000", "--ceiling", "300", "--ledger", url], env2)
        assert done.returncode == 0, done.stderr


async def _reservations(url: str) -> list:
    led = RedisLedger(url, "probe")
    try:
        return [r for r in await led.reservations() if r.live]  # (not the names released batches leave)
    finally:
        await led.close()


def test_status_shows_ledger_reservations(tmp_path: Path, redis_url: str) -> None:
    """`status --ledger` reports reservations beside the observed depth."""
    import orjson

    url = redis_url.rstrip("0") + "3"

    async def seed() -> None:
        led = RedisLedger(url, "pipeline-7")
        await led.reserve(0, 120, 1000, 0)
        await led.close()

    anyio.run(seed)
    with running_fake(ceiling=1000, rate=0.0) as fake:
        proc = gk(["status", "--json", "--ledger", url], {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key-ws1",
                                                          "ANTHROPIC_ADMIN_KEY": "test-admin-key"})
        out = orjson.loads(proc.stdout)
        assert out["ledger"]["reserved"] == 120 and out["ledger"]["reservations"][0]["owner"] == "pipeline-7"


def _open_ledger_at(path: str, barrier, results) -> None:  # (a forked submitter: top-level, so fork can run it)
    barrier.wait()
    try:
        SqliteLedger(path, owner=str(os.getpid()))
        results.put("ok")
    except Exception as exc:  # what the submitter would have printed
        results.put(str(exc))


def test_submitters_opening_a_new_sqlite_ledger_at_once_all_get_it(tmp_path: Path) -> None:
    """Six processes open one new SQLite ledger at the same instant, ten times: none is refused. (SQLite refuses a
    racing switch to WAL at once, "database is locked", instead of waiting: 8 rounds of 40 failed before.)"""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for round_ in range(10):
        path = str(tmp_path / f"ledger-{round_}.db")
        barrier, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_open_ledger_at, args=(path, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        assert outcomes == ["ok"] * 6, outcomes


def test_a_platforms_queue_is_kept_apart_in_a_shared_ledger(tmp_path: Path) -> None:
    """First-party and Claude Platform on AWS jobs given one ledger URL never share a ceiling: the AWS workspace's
    reservations live in its own namespace (`ApiConfig.scope`), invisible to the first-party one and back."""
    from gatekeeper import ApiConfig
    from gatekeeper.state.ledger._open import open_ledger

    aws = ApiConfig.from_env({"AWS_REGION": "eu-west-1", "ANTHROPIC_AWS_WORKSPACE_ID": "wrkspc_X1",
                              "ANTHROPIC_AWS_API_KEY": "k"}, "aws")
    first = ApiConfig.from_env({"ANTHROPIC_API_KEY": "sk"})
    assert aws.scope == "aws_eu_west_1_wrkspc_x1" and first.scope == ""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"

    async def both() -> tuple[int, int]:
        mine, theirs = open_ledger(url, owner="a", namespace=first.scope), open_ledger(url, owner="b", namespace=aws.scope)
        assert await mine.reserve(0, 900, 1000, 0)
        assert await theirs.reserve(0, 900, 1000, 0)  # (a ceiling of its own: the first-party 900 does not count)
        seen = (len(await mine.reservations()), len(await theirs.reservations()))
        await mine.close()
        await theirs.close()
        return seen

    assert anyio.run(both) == (1, 1)
