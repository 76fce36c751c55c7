"""Fair shares over hours of contention (issue 59): the real `Turns` of several jobs on one real SQLite ledger, time
injected (the ledger's clock and the jobs' are one simulated clock), each job deciding from its own view.

The review's runs first, as they were reported (a starving job that never saw itself starve, so that from minute
30 on nobody admitted; a joiner that took 201 batches in a row), then a job that cannot admit, a stopped job, and a
hypothesis property over simulated nights: several jobs of three priorities and several shares, joining and
stopping, on a queue kept full, where no job waits past the starvation bound while others admit, the queue is
never left with room while a job that fits it waits, and shares hold within 10% over any 20 batches."""

from __future__ import annotations

import itertools
import os
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatekeeper.decide._admission import QueueState, admit_round
from gatekeeper.decide._shares import STARVE_AFTER, fits, next_up
from gatekeeper.run.batch._turns import Turns, wanted
from gatekeeper.state.ledger._sqlite import SqliteLedger

pytestmark = pytest.mark.anyio
T0 = 1_000_000.0


class Clock:
    """One simulated clock for the ledger and every job on it."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder in memory where there is one (/dev/shm): the ledger's commits are not waiting on the disk (thousands
    of them a night; the same SQLite code either way)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        yield Path(d)


def _turns(tmp_path: Path, clock: Clock, owner: str, priority: str = "normal", share: float = 1.0) -> Turns:
    return Turns(SqliteLedger(str(tmp_path / "ledger.db"), owner, clock=clock), owner, priority, share, clock)


@pytest.mark.parametrize("priorities", [("high", "low"), ("normal", "normal")])
async def test_with_the_queue_full_for_80_minutes_the_turn_is_always_someones(tmp_path: Path,
                                                                              priorities: tuple[str, str]) -> None:
    """The review's H1 run: two jobs post a batch of 5,000 every simulated minute and nobody admits (the queue is
    full). At every round exactly one of them has the turn (the high one, or the first of two equals): nobody aged,
    since nobody admitted ahead of anyone. Before the fix both were refused from minute 30 on, for good."""
    clock = Clock()
    jobs = [_turns(tmp_path, clock, owner, priority) for owner, priority in zip("ab", priorities)]
    for minute in range(80):
        got = [await t.turn(5000) for t in jobs]
        assert got == [True, False], (minute, got)
        clock.now += 60


async def test_a_job_joining_while_the_other_wants_nothing_starts_at_its_tiers_virtual_time(tmp_path: Path) -> None:
    """The review's M1 run: A admits 200 batches alone, then posts want 0 (at its --max-in-flight) and B joins at
    that moment. From then on they alternate: B does not take 201 batches in a row."""
    clock = Clock()
    a, b = _turns(tmp_path, clock, "a"), _turns(tmp_path, clock, "b")
    for _ in range(200):
        assert await a.turn(100)
        await a.took(100, 0, 100)
        clock.now += 60
    assert await a.turn(0)
    order = []
    for _ in range(300):
        for t in (b, a):
            if await t.turn(100):
                await t.took(100, 0, 100)
                order.append(t.job)
        clock.now += 1  # (a queue that frees a batch's room every second: nobody reaches the starvation bound)
    assert max(len(list(run)) for _, run in itertools.groupby(order)) <= 2, order
    assert abs(order.count("a") - order.count("b")) <= 1, order


# -- a night, simulated ----------------------------------------------------------------------------------------------

CEILING = 20_000
TICK = 120.0  # seconds between two rounds of every job (each job's poll)
PRIORITY_OF = {"high": 0, "normal": 1, "low": 2}


@dataclass
class NightJob:
    priority: str
    share: float
    batch: int  # requests a batch
    batches: int  # batches it has to send
    join: float  # seconds into the night it starts
    stop: float | None  # seconds into the night it is stopped (Ctrl-C: it gives its claim up), or None
    max_in_flight: int | None
    margin: int


@dataclass
class SimJob:
    """One submitter: its own ledger connection, its own `Turns`, its own view (its workspace shows only its own
    batches: it sees the others only through the ledger)."""

    name: str
    spec: NightJob
    turns: Turns
    ledger: SqliteLedger
    sent: int = 0
    live: dict[int, tuple[int, float]] = field(default_factory=dict)  # batch -> (requests, ends at)
    backoff_until: float = 0.0
    stopped: bool = False
    wanting: bool = False  # what its last round posted
    higher: tuple[float, float] | None = None  # the first and the last admission ahead of it (a higher priority's)
    # in this stretch of wanting: it has waited behind higher priorities' turns for the time between them
    late: int = 0  # admissions by others since its wait behind higher priorities passed the bound

    @property
    def own_depth(self) -> int:
        return sum(n for n, _ in self.live.values())


@dataclass
class Night:
    """Jobs on one SQLite ledger (their clocks and its one simulated clock), a queue of `CEILING` whose batches each
    take a drawn time, refusals now and then (a backoff of 5 minutes). Checked every round of every job."""

    tmp: Path
    rng: random.Random
    specs: list[NightJob]
    refusal_rate: float
    clock: Clock = field(default_factory=Clock)
    jobs: list[SimJob] = field(default_factory=list)
    admissions: list[tuple[float, str, int, int]] = field(default_factory=list)  # (at, job, requests, priority)
    idle: int = 0  # rounds in a row with room for a job that wanted it, and nobody trying to admit
    tries: int = 0  # creates tried (admitted, or refused by the API)
    held: tuple[str | None, float] = (None, 0.0)  # the job the room is building up for, since when
    wants: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)

    async def run(self, hours: float) -> None:
        pending = sorted(enumerate(self.specs), key=lambda p: p[1].join)
        while self.clock.now < T0 + hours * 3600:
            t = self.clock.now - T0
            while pending and pending[0][1].join <= t:
                i, spec = pending.pop(0)
                name = f"j{i}"
                ledger = SqliteLedger(str(self.tmp / "ledger.db"), name, clock=self.clock, margin=spec.margin)
                self.jobs.append(SimJob(name, spec, Turns(ledger, name, spec.priority, spec.share, self.clock), ledger))
                self.wants[name] = []
            for job in self.jobs:
                await self._observe(job)
            fitting = self._fitting(await self.jobs[0].ledger.reservations()) if self.jobs else []
            before, tried = len(self.admissions), self.tries
            for job in self.rng.sample(self.jobs, len(self.jobs)):
                if not job.stopped:
                    await self._round(job)
            self._check_work_goes_on(fitting, self.tries - tried, self.admissions[before:], await self._holding())
            self.clock.now += TICK

    async def _observe(self, job: SimJob) -> None:
        """Its batches that ended are released; a stopped job gives its claim up once (its reservations lapse)."""
        now = self.clock.now
        if job.stopped:
            return
        if job.spec.stop is not None and now - T0 >= job.spec.stop:
            job.stopped = True
            await job.ledger.drop_claim()
            self._wanting(job, False)
            return
        for idx, (_, ends) in list(job.live.items()):
            if ends <= now:
                del job.live[idx]
                await job.ledger.release(idx)
        if round((now - T0) / TICK) % 4 == 0:  # (every 8 minutes: well within the lease of 15)
            await job.ledger.heartbeat()

    def _want(self, job: SimJob) -> tuple[int, int]:
        """What its round computes, as the runner does: its next batch for the claim, and how many it may admit."""
        left = job.spec.batches - job.sent
        q = QueueState(waiting=[job.spec.batch] * min(left, 8), depth=job.own_depth, unseen=0, bound=CEILING,
                       margin=job.spec.margin, in_flight=len(job.live), max_in_flight=job.spec.max_in_flight,
                       backoff_until=job.backoff_until)
        return wanted(job.spec.batch if left else 0, q, False, self.clock.now), admit_round(q, self.clock.now)

    async def _round(self, job: SimJob) -> None:
        want, count = self._want(job)
        self._wanting(job, want > 0)
        ok = await job.turns.turn(want, CEILING - job.spec.margin, job.own_depth)
        for k in range(count if ok and want else 0):
            if k and not await job.turns.turn(job.spec.batch, CEILING - job.spec.margin, job.own_depth):
                return
            idx = job.sent
            if not await job.ledger.reserve(idx, job.spec.batch, CEILING, job.own_depth):
                return
            self.tries += 1
            if self.rng.random() < self.refusal_rate:  # (the API refused it: nothing made, back off 5 minutes)
                await job.ledger.release(idx)
                job.backoff_until = self.clock.now + 300
                self._wanting(job, False)
                await job.turns.turn(0)  # (as the runner: backing off, it wants no room, and holds no turn)
                return
            await job.ledger.confirm(idx, f"msgbatch_{job.name}_{idx}")
            job.live[idx] = (job.spec.batch, self.clock.now + self.rng.uniform(5, 30) * 60)
            job.sent += 1
            self._admitted(job)
            await job.turns.took(job.spec.batch, job.own_depth, self._want(job)[0])

    def _wanting(self, job: SimJob, wants: bool) -> None:
        if not wants:
            job.higher, job.late = None, 0
        job.wanting = wants
        self.wants[job.name].append((self.clock.now, wants))

    def _admitted(self, job: SimJob) -> None:
        """The starvation bound: a job that wants room has waited behind higher priorities from the first of their
        admissions in its stretch of wanting to the last; once that reaches the bound, at most one batch of each
        other job (those that waited longer still) goes before its own."""
        now, p = self.clock.now, PRIORITY_OF[job.spec.priority]
        self.admissions.append((now, job.name, job.spec.batch, p))
        job.higher, job.late = None, 0
        for other in self.jobs:
            if other is job or other.stopped or not other.wanting:
                continue
            if other.higher is not None and other.higher[1] - other.higher[0] >= STARVE_AFTER:
                other.late += 1
                assert other.late <= len(self.jobs) - 1, (other.name, other.higher, self.admissions[-10:])
            if PRIORITY_OF[other.spec.priority] > p:
                other.higher = (now, now) if other.higher is None else (other.higher[0], now)

    def _fitting(self, reservations: list[Any]) -> list[str]:
        """The jobs that want room and whose next batch fits under the ceiling as the ledger grants it."""
        reserved = sum(r.requests for r in reservations)
        out = []
        for job in self.jobs:
            want, count = self._want(job) if not job.stopped else (0, 0)
            if want and count and reserved + want <= CEILING - job.spec.margin:
                out.append(job.name)
        return out

    async def _holding(self) -> str | None:
        """The job whose turn it is while its batch does not fit (it waited past the bound, or let others by for a
        batch of its own): the room builds up for it. As the ledger shows it to every job."""
        if not self.jobs:
            return None
        ledger = self.jobs[0].ledger
        claims, reserved = await ledger.claims(), sum(r.requests for r in await ledger.reservations())
        up = next_up(claims, reserved)
        return None if up is None or fits(up, reserved) else up.owner

    def _check_work_goes_on(self, fitting: list[str], tried: int, admitted: list[Any], holding: str | None) -> None:
        """No deadlock: a round in which some job's batch fits and nobody tries to admit is followed by one in which
        somebody does (a claim posted a round ago can be stale by one round), unless the room is building up for
        the job whose turn it is; and that job admits within the time its queue takes to free the room (every batch
        ends within an hour; a stopped job's reservations lapse 15 minutes after it stopped)."""
        self.idle = self.idle + 1 if fitting and not tried and holding is None else 0
        assert self.idle <= 1, (self.clock.now - T0, fitting, self.admissions[-5:])
        if holding != self.held[0] or any(a[1] == holding for a in admitted):
            self.held = (holding, self.clock.now)
        assert holding is None or self.clock.now - self.held[1] <= 80 * 60, (self.held, self.admissions[-5:])

    def share_windows(self, width: int = 20) -> list[tuple[int, dict[str, int], dict[str, float], int]]:
        """Every `width` admissions in a row of one priority during which the same jobs of it (two or more) wanted
        room at each of their rounds and admitted them all: (priority, the requests each admitted, the requests its
        share of them would be, the largest batch among them)."""
        out = []
        for p in set(PRIORITY_OF.values()):
            tier = [a for a in self.admissions if a[3] == p]
            for s in range(len(tier) - width + 1):
                window = tier[s:s + width]
                t0, t1 = window[0][0] - TICK, window[-1][0]
                names = {a[1] for a in window}
                backlogged = {j.name for j in self.jobs if PRIORITY_OF[j.spec.priority] == p
                              and all(w for at, w in self.wants[j.name] if t0 <= at <= t1)
                              and any(at <= t0 for at, _ in self.wants[j.name])}
                if len(backlogged) < 2 or names != backlogged:
                    continue
                total = sum(a[2] for a in window)
                shares = {j.name: j.spec.share for j in self.jobs if j.name in backlogged}
                got = {n: sum(a[2] for a in window if a[1] == n) for n in backlogged}
                out.append((p, got, {n: total * s_ / sum(shares.values()) for n, s_ in shares.items()},
                            max(a[2] for a in window)))
        return out


specs = st.builds(
    NightJob, priority=st.sampled_from(["high", "normal", "normal", "low"]), share=st.sampled_from([1.0, 2.0, 3.0]),
    batch=st.sampled_from([2000, 2500, 5000]), batches=st.integers(20, 200),
    join=st.sampled_from([0.0, 0.0, 1800.0, 5400.0]), stop=st.sampled_from([None, None, 7200.0, 10800.0]),
    max_in_flight=st.sampled_from([None, None, 2]), margin=st.sampled_from([0, 0, 1000]))
NIGHT = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


async def _night(tmp_path: Path, jobs: list[NightJob], seed: int, refusals: float, hours: float) -> Night:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        night = Night(Path(d), random.Random(seed), jobs, refusals)
        await night.run(hours)
    assert night.admissions
    for p, got, fair, largest in night.share_windows():
        total = sum(got.values())
        for name in got:  # (two batches of twenty is 10%; batches unlike: two of the largest)
            assert abs(got[name] - fair[name]) <= max(0.10 * total, 2 * largest), (p, got, fair)
    return night


@NIGHT
@given(st.lists(specs, min_size=2, max_size=5), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.05]))
async def test_a_night_of_contention_keeps_its_promises(tmp_path: Path, jobs: list[NightJob], seed: int,
                                                        refusals: float) -> None:
    """Four simulated hours: jobs of three priorities and several shares, batch sizes, margins and limits of
    batches in flight join, stop, and keep a queue full, with the API refusing a create now and then. Checked as it
    runs: no job waits behind higher priorities past the bound while others admit; the queue is never left with
    room while a job whose batch fits waits (but while the room builds up for the job whose turn it is, which then
    admits within the time the queue takes to free it). After: every 20 batches of one priority in a row, among
    jobs that all wanted room throughout, went to each within 10% of its share."""
    await _night(tmp_path, jobs, seed, refusals, hours=4)


tier = st.builds(NightJob, priority=st.just("normal"), share=st.sampled_from([1.0, 2.0, 3.0]),
                 batch=st.sampled_from([2000, 2500, 5000]), batches=st.just(1000), join=st.just(0.0), stop=st.none(),
                 max_in_flight=st.none(), margin=st.sampled_from([0, 0, 1000]))
visitor = NightJob("high", 1.0, 5000, 1000, join=3600.0, stop=5400.0, max_in_flight=None, margin=0)


@NIGHT
@given(st.lists(tier, min_size=2, max_size=4), st.booleans(), st.integers(0, 2**32 - 1))
async def test_shares_hold_over_every_20_batches_of_a_night(tmp_path: Path, jobs: list[NightJob], high: bool,
                                                            seed: int) -> None:
    """Jobs of one priority, several shares, batch sizes and margins, all with work the whole night (a high job
    passing through for half an hour, or not): every 20 of their batches in a row went to each within 10% of its
    share (two batches of twenty; two of the largest when their batches are unlike). (No refusals here: a job backing
    off wants no room for a while, and a stretch in which one does is not one of contention among the same jobs.)"""
    night = await _night(tmp_path, [*jobs, *([visitor] if high else [])], seed, 0.0, hours=4)
    assert len(night.share_windows()) >= 5  # (the stretches checked: at least five windows of 20 in every night drawn)


async def test_a_job_that_cannot_admit_holds_no_turn_from_one_that_can(tmp_path: Path) -> None:
    """The review's M7: a high job whose next batch is larger than the room, or held by its margin, or backing off
    after a refusal, does not keep the turn from a low job whose batch fits; a high job that let the low one by for
    a batch of its own size then keeps the turn while the room builds up for it."""
    clock = Clock()
    high, low = _turns(tmp_path, clock, "high", "high"), _turns(tmp_path, clock, "low", "low")
    assert await high.ledger.reserve(0, 17_000, CEILING, 0)
    await high.ledger.confirm(0, "msgbatch_0")
    await high.turn(1000, CEILING - 2500, 17_000)  # (3,000 free, less its margin of 2,500: its batch does not fit)
    assert await low.turn(1000, CEILING, 0) and low.overtaking == ("high",)
    assert not await high.turn(1000, CEILING - 2500, 17_000) and high.ahead == "low"
    await high.turn(0)  # (backing off after a refusal: it wants no room for now)
    assert await low.turn(1000, CEILING, 0) and low.overtaking == ()
    await high.turn(5000, CEILING, 17_000)  # (a batch larger than the room)
    assert await low.turn(2000, CEILING, 0) and low.overtaking == ("high",)
    await low.took(2000, 0, 2000)  # (the low job's batches are left out of the ledger here: the room stays 3,000)
    assert await low.turn(2000, CEILING, 0)  # (4,000 of the 5,000 it may take ahead of it)
    await low.took(2000, 0, 2000)
    await low.took(2000, 0, 2000)  # (and a third, in the same round)
    assert await high.turn(5000, CEILING, 17_000)  # (let by for 6,000: now it waits for its room, and keeps the turn)
    assert not await low.turn(1000, CEILING, 0) and low.ahead == "high"


async def test_a_job_past_the_bound_goes_first_and_its_batch_costs_its_share_nothing(tmp_path: Path) -> None:
    """A low job wanting room while a high one admits for 30 minutes (its own batches fitting all along) is then
    first, whatever its priority; that batch came out of the high job's room, so its virtual time does not move (the
    jobs of its own priority owe it nothing and it owes them nothing). The full queue before the first of the high
    job's admissions counted for nothing."""
    clock = Clock()
    high, low = _turns(tmp_path, clock, "high", "high"), _turns(tmp_path, clock, "low", "low")
    assert await low.turn(100) and await high.turn(100)
    clock.now += 3600  # (an hour of a full queue: nobody admits, nobody ages)
    for _ in range(31):
        assert await high.turn(100) and not await low.turn(100)
        await high.took(100, 0, 100)
        clock.now += 60
    assert not await high.turn(100) and high.ahead == "low"
    assert await low.turn(100) and low.starving
    await low.took(100, 0, 100)
    assert low.vtime == 0.0 and await high.turn(100) and not await low.turn(100)


async def test_a_limit_read_before_the_queue_drained_keeps_the_turn_from_a_lower_job(tmp_path: Path) -> None:
    """Load outside the ledger fills a queue of 200 (both jobs list it: one key): the high job's claim says its batch
    of 50 cannot fit however the reservations drain, so it holds no turn. The load drains; the low job reads the
    queue first and may go first for as much as the high job's next batch (50), no further: the high job's limit
    was read before the queue drained, so the turn is its own until it reads the queue again (its watch wakes at
    once). Before the fix the low job took every room that freed until the high job's next poll (the measured case:
    100 and more, where the rules allow 50). Where the load outside is still there when it reads, the low job goes
    on."""
    clock = Clock()
    high, low = _turns(tmp_path, clock, "high", "high"), _turns(tmp_path, clock, "low", "low")
    await high.turn(50, 200, 200)  # (its reading: 200 outside the ledger; nobody fits)
    assert not await low.turn(50, 200, 200)
    clock.now += 40  # the outside load ends; the low job reads the queue first
    assert await low.turn(50, 200, 0) and low.overtaking == ("high",)
    assert await low.ledger.reserve(0, 50, 200, 0)
    await low.ledger.confirm(0, "msgbatch_l0")
    await low.took(50, 50, 50)
    assert not await low.turn(50, 200, 50) and low.ahead == "high", "the low job went on past the high job's batch"
    slept: list[float] = []

    async def tick(s: float) -> None:
        slept.append(s)
        clock.now += s

    await high.watch(tick)  # (woken at its first look: the turn is its own by a limit others have admitted past)
    assert slept == []
    assert await high.turn(50, 200, 0) and await high.ledger.reserve(0, 50, 200, 0)  # (it reads the queue: room)
    await high.ledger.confirm(0, "msgbatch_h0")
    await high.took(50, 50, 50)
    # the same again, but the load outside is still there when the high job reads: it lets the low job by
    await high.turn(50, 200, 250)  # (200 outside the ledger beside its own 50)
    assert await low.turn(50, 200, 50) and await low.ledger.reserve(1, 50, 200, 50)
    await low.ledger.confirm(1, "msgbatch_l1")
    await low.took(50, 100, 50)
    assert not await low.turn(50, 200, 100)  # (its limit may be stale again: read once more)
    assert not await high.turn(50, 200, 250) and high.ahead == "low"
    assert await low.turn(50, 200, 100)
