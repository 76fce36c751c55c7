"""Shared multi-submitter scenarios: three submitters on one ceiling (tests/test_ledger.py, bench_ledger.py); two
jobs through a night with the world's clock sped up (tests/test_shares.py, bench_shares.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import orjson

from gatekeeper import ApiConfig, Clock, Secret, SubmitSettings
from gatekeeper._clock import WALL, inline_threads
from gatekeeper.api._queue import connect
from gatekeeper.input._sizing import Limits
from gatekeeper.run._loop import SubmitLoop
from gatekeeper.state._journal import BatchState, Journal
from gatekeeper.state.ledger._sqlite import SqliteLedger
from gatekeeper.testing import FakeAPI, FakeConfig
from tests.forkserver import spawn

KEYS = ["ledger-ws1", "ledger-ws2", "ledger-ws3"]
T = TypeVar("T")


@dataclass
class Outcome:
    refusals: int
    max_depth: int
    ceiling: int
    succeeded_twice: int
    codes: list[int]
    summaries: list[dict]


def write_job(path: Path, prefix: str, n: int) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"custom_id": f"{prefix}-{i}", "params": {
                "model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": f"item {i}"}]}}) + b"\n")
    return path


def three_submitters(tmp: Path, *, ledger: str | None, ceiling: int = 300, per_job: int = 300, rate: float = 600.0,
                     hold_until_refused: bool = False) -> Outcome:
    """Three submitters, one workspace each (none sees the others' batches), one organization ceiling.

    `hold_until_refused`: nothing is processed until the first refusal, so that submitters started a little
    apart still meet a full queue (what a test of refusals needs, whatever the machine's speed).
    """
    cfg = FakeConfig(ceiling=ceiling, rate=0.0 if hold_until_refused else rate,
                     workspaces={k: f"wrkspc_{i}" for i, k in enumerate(KEYS)}, queue_retry_after=1)
    with FakeAPI(cfg) as fake:
        procs = []
        for i, key in enumerate(KEYS):
            job = write_job(tmp / f"job{i}.jsonl", f"j{i}", per_job)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_")) or k == "GATEKEEPER_HOME"}
            env.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": key})
            args = ["submit", str(job), "--json", "--interval", "0.05", "--max-rpm", "60000",
                    "--ceiling", str(ceiling), "--reconcile-grace", "2", "--no-preflight"]
            if ledger:
                args += ["--ledger", ledger]
            procs.append(spawn(args, env))  # three real processes (forked from the fork server)
        if hold_until_refused:
            fake.org.wait_for(lambda r: bool(r.refusals), "a refusal", 60)
            fake.org.config.rate = rate
        results = [p.communicate(timeout=300) for p in procs]
        r = fake.org.records
        return Outcome(
            refusals=len(r.refusals), max_depth=r.max_depth, ceiling=ceiling, succeeded_twice=r.succeeded_twice,
            codes=[p.returncode for p in procs],
            summaries=[orjson.loads(out) if out.strip() else {"stderr": err[-500:]} for out, err in results],
        )


# -- two pipelines through a night, the whole world's clock sped up ----------------------------------------------------

@dataclass
class World:
    """One clock for the fake, the ledger and both jobs, running `speed` times faster than the wall: a batch, a poll
    interval, a lease and the starvation bound all pass `speed` times faster, and keep their proportions."""

    speed: float
    t0: float = field(default_factory=time.time)
    m0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return self.t0 + (time.monotonic() - self.m0) * self.speed

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds) / self.speed)

    def fake(self, cfg: FakeConfig) -> FakeAPI:
        return FakeAPI(cfg)

    def transport(self, fake: FakeAPI) -> httpx.AsyncBaseTransport | None:
        return None  # (real HTTP to the fake's socket)

    def clock(self) -> Clock:
        return WALL


class SimulatedWorld:
    """The same world on trio's `MockClock` (run under `simulated`): the fake served in process, every wait on the
    simulated clock, so a night takes the CPU it needs and nothing races the wall clock (a loaded machine only makes
    it slower, never different)."""

    speed = 1.0  # (simulated seconds a simulated second: the proportions `World` keeps by speeding up are kept as they are)

    def __init__(self) -> None:
        from gatekeeper.testing.swarm._sim import SimClock

        self.sim = SimClock()

    def now(self) -> float:
        return self.sim.now()

    async def sleep(self, seconds: float) -> None:
        await self.sim.sleep(seconds)

    def fake(self, cfg: FakeConfig) -> FakeAPI:
        return FakeAPI(cfg, clock=self.sim.monotonic, epoch=self.sim.now(), listen=False)

    def transport(self, fake: FakeAPI) -> httpx.AsyncBaseTransport | None:
        from gatekeeper.testing._inprocess import InProcess

        return InProcess(fake, self.sim.sleep)

    def clock(self) -> Clock:
        return self.sim


def simulated(fn: Callable[[SimulatedWorld], Awaitable[T]]) -> T:
    """`fn(world)` run to its end on trio's MockClock, which jumps to the next wake-up whenever every task waits
    (blocking steps inline, as the swarm runs them, so that a step on a thread does not look like a wait)."""
    import trio
    import trio.testing

    with inline_threads():
        return anyio.run(lambda: fn(SimulatedWorld()), backend="trio",
                         backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)})


@dataclass
class Night:
    """What a night of two jobs showed, in simulated seconds."""

    span: float  # from the first job's start to the last one's end
    ideal: float  # every request at the queue's rate
    stall: float  # the longest stretch with room in the queue for a batch that waited, and no create
    stall_at: float  # when it began, from the start
    creates: list[tuple[float, str]]  # (when, which job) of every create
    summaries: dict[str, Any]  # each job's summary (a job stopped at `give_up_after` has none)


async def two_jobs_a_night(tmp: Path, *, speed: float = 1.0, low: int, high: int, high_after: float = 60.0,
                           ceiling: int = 2000, rate: float = 5.0, poll: float = 60.0, give_up_after: float = 3.0,
                           world: World | SimulatedWorld | None = None, batch: int | None = None, outside: int = 0,
                           one_workspace: bool = False, fifo: bool = False) -> Night:
    """A `low` backfill of `low` requests, and `high_after` simulated seconds later a `high` job of `high`, each in a
    workspace of its own on one SQLite ledger (only the ledger sees both), against the fake: over real HTTP with the
    world's clock run `speed` times faster than the wall (`World`, the default), or in process in simulated time
    (`SimulatedWorld`, under `simulated`). Its queue holds `ceiling` requests and processes `rate` a simulated second.
    Batches of a quarter of the ceiling. Both are stopped `give_up_after` times the ideal span after the start, if
    they have not finished by then. `batch`: requests a batch at most; `outside`: a batch of that many requests from
    outside the ledger in the low job's workspace at the start; `one_workspace`: both jobs in it (each lists the other's
    batches, and the load outside); `fifo`: the queue processes one batch at a time, in order."""
    world = world or World(speed)
    keys = {"k-low": "wrkspc_low", "k-high": "wrkspc_low" if one_workspace else "wrkspc_high"}
    cfg = FakeConfig(ceiling=ceiling, rate=rate, speed=world.speed, workspaces=keys, queue_retry_after=1, fifo=fifo)
    ledger_path = str(tmp / "ledger.db")
    creates: list[tuple[float, str]] = []
    jobs: dict[str, Any] = {}
    stall = [0.0, 0.0, 0.0]  # (the current stretch's start, the longest, when the longest began)
    with world.fake(cfg) as fake:
        if outside:
            fake.org.add_batch("wrkspc_low", outside, prefix="outside")

        async def one(name: str, n: int, key: str, priority: str, after: float) -> None:
            await world.sleep(after)
            path = write_job(tmp / f"{name}.jsonl", name, n)
            settings = SubmitSettings(ceiling=ceiling, interval=poll, priority=priority, preflight=False, token_sample=0,
                                      ledger_ttl=900.0, state_dir=tmp / f"{name}.state",
                                      **({"limits": Limits(max_requests=batch)} if batch else {}))
            journal = Journal.open(tmp / f"{name}.state", clock=world.now)
            ledger = SqliteLedger(ledger_path, f"{name}-owner", clock=world.now)
            config = ApiConfig(workspace_keys=[Secret(key)], base_url=fake.url)
            try:
                async with connect(config, max_rpm=60_000, clock=world.clock(), transport=world.transport(fake)) as conn:
                    emit = lambda e, f: creates.append((world.now(), name)) if e == "admitted" else None  # noqa: E731
                    job = SubmitLoop(str(path), settings, conn, journal, out_path=str(tmp / f"{name}.out.jsonl"), emit=emit,
                              stop=anyio.Event(), ledger=ledger, clock=world.now, sleep=world.sleep)
                    jobs[name] = job
                    await job.prepare()
                    summaries[name] = (await job.run()).to_json()
            finally:
                jobs.pop(name, None)
                journal.close()

        async def beat() -> None:  # (the ledger's heartbeat, on the world's clock)
            while True:
                await world.sleep(300.0)
                for job in list(jobs.values()):
                    await job.ledger.heartbeat()

        async def watch() -> None:  # (room: the ceiling less the batches not ended, as the listings show them)
            while True:
                await world.sleep(0.02 * 120)  # (every 0.02 s of the wall at the test's speed, 120)
                waiting = [b.requests for j in jobs.values() for b in j.journal.batches(BatchState.PLANNED)[:1]]
                now, creates_seen = world.now(), len(creates)
                fake.org.sync()
                with fake.org.lock:
                    live = sum(b.total for b in fake.org.batches.values() if b.status != "ended")
                if waiting and live + min(waiting) <= ceiling and creates_seen == watch_creates[0]:
                    if now - stall[0] > stall[1]:
                        stall[1:] = [now - stall[0], stall[0]]
                else:
                    stall[0], watch_creates[0] = now, creates_seen

        summaries: dict[str, Any] = {}
        watch_creates = [0]
        start = world.now()
        stall[0] = start  # (a stretch begins no earlier than the night: the first look may already see room)
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            tg.start_soon(watch)
            with anyio.move_on_after(give_up_after * (low + high) / rate / world.speed):
                async with anyio.create_task_group() as both:
                    both.start_soon(one, "low", low, "k-low", "low", 0.0)
                    both.start_soon(one, "high", high, "k-high", "high", high_after)
            tg.cancel_scope.cancel()
        return Night(world.now() - start, (low + high) / rate, stall[1], stall[2] - start, creates, summaries)
