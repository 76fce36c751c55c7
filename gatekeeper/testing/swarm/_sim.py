"""A world run in simulated time: the real `submit` of every job, against the fake served in process, on trio's
`MockClock(autojump_threshold=0)` (whenever every task waits, the clock jumps to the next wake-up: a night passes in
a moment), blocking steps inline, one seeded generator for every draw, the journals and the ledger as SQLite files in
a temporary folder.

A kill is a kill -9: from that moment the run's I/O refuses every effect (its SQLite connections are closed, an
open transaction rolled back, and it can open no other; its file locks are let go; its
files cannot be opened for writing, removed or renamed; its transport sends nothing), then its task is cancelled.
A cancel alone would run `finally:` blocks that a killed process never runs; with its handles dead, what they try
has no effect, as after the real thing. An audit hook (`sys.addaudithook`) sees the run's SQLite connections, file
locks and file opens: the process a call belongs to is the task's context (`_PROCESS`), inherited by every task the
run starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import gc
import hashlib
import math
import os
import random
import sqlite3
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import trio
import trio.testing

from ..._clock import inline_threads
from ..._errors import GatekeeperError, Interrupted
from ..._prices import BYTES_PER_TOKEN_WORST, load_prices
from ...api._config import ApiConfig, Secret
from ...api._credentials import Federation
from ...decide._host import run_ended
from ...input._sizing import Limits
from ...run._submit import submit
from ...run.shared import _checkpoints
from ...run.shared._settings import SubmitSettings
from ...state._claims import Board, ClaimPost
from ...state.ledger._base import Liveness
from ...state.ledger._sqlite import SqliteLedger
from .._inprocess import InProcess
from .._model import FakeConfig, FakeRealtime, Outcome
from .._oauth import FakeFederation, identity_token
from .._server import FakeAPI
from .._wire import Fault
from ._tables import TableInput, run_table
from ._world import EPOCH, HEALTHY_TURNAROUND, DrawnJob, Kill, World

KEY, ADMIN = "test-key-ws1", "test-admin-key"
MAX_TOKENS = 16
MAX_RUNS = 40  # runs of one job at most (a job that needs more never finishes)
RERUN_AT_MOST = 2 * 3600.0  # seconds an operator waits at most before running a failing job again
TIMER_GRAIN = 0.001  # seconds: the shortest wait a simulated sleep takes
MACHINE = "swarm-host"  # every run of a world is a process of one machine, on one host ledger
LEASE = 900.0  # seconds the ledger keeps a run's reservations and claim after its last heartbeat (`--ledger-ttl`)


class SimClock:
    """`gatekeeper.Clock` on trio's clock: wall seconds from `EPOCH`."""

    def now(self) -> float:
        return EPOCH + trio.current_time()

    def monotonic(self) -> float:
        return trio.current_time()

    async def sleep(self, seconds: float) -> None:
        # (never shorter than a real timer's grain: a wait of 1e-13 s would leave the clock where it is, and a loop
        # waiting out a remainder that small would spin at one moment for ever; the real clock moves on regardless)
        await trio.sleep(0.0 if seconds <= 0 else max(seconds, TIMER_GRAIN))


# -- processes ----------------------------------------------------------------------------------------------------

_PROCESS: ContextVar[Process | None] = ContextVar("gatekeeper_swarm_process", default=None)
_EFFECTS = frozenset({"os.remove", "os.rename", "os.truncate", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.chmod"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Process:
    """One run of a job: its handles, and whether it was killed."""

    def __init__(self, world: Weather, kill: Kill | None) -> None:
        self.world = world
        self.kill_at = kill
        self.pid, self.started = 0, ""  # (as the host's ledger records a process: `Weather.spawn` numbers it)
        self.ended = False  # its run returned: the process is gone (as it is once killed)
        self.reached = 0
        self.dead = False
        self.connections: list[sqlite3.Connection] = []
        self.locks: list[tuple[int, int, int]] = []  # (fd, device, inode) of each file lock it took
        self.scope: anyio.CancelScope | None = None

    def kill(self) -> None:
        """kill -9: every handle refuses from now on; the run's task is cancelled at its next await."""
        if self.dead:
            return
        self.dead = True
        for conn in self.connections:  # (as the system closes a dead process's files: its transaction rolls back)
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self.connections.clear()
        for fd, _, _ in self.locks:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
        if self.scope is not None:
            self.scope.cancel()

    def bury(self) -> None:
        """After a killed run has unwound: the lock files its `finally:` blocks could not close (their files are
        still the ones it locked) are closed, as the system closes a dead process's files."""
        for fd, dev, ino in self.locks:
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == (dev, ino):
                    os.close(fd)
        self.locks.clear()

    def keep(self, conn: sqlite3.Connection) -> None:
        if len(self.connections) > 64:  # (the ledger opens one a step: forget the closed ones)
            self.connections = [c for c in self.connections if _open(c)]
        self.connections.append(conn)


def _open(conn: sqlite3.Connection) -> bool:
    try:
        conn.total_changes  # noqa: B018 (raises on a closed connection)
    except sqlite3.ProgrammingError:
        return False
    return True


def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    proc = _PROCESS.get()
    if proc is None:
        return
    if event == "sqlite3.connect" and proc.dead:
        raise sqlite3.OperationalError("unable to open database file (the process was killed)")
    if event == "sqlite3.connect/handle":
        proc.keep(args[0])
    elif event == "open" and _writes(args[1], args[2] if len(args) > 2 else None):
        if proc.dead:
            raise PermissionError(errno.EACCES, "killed", args[0])
        if proc.world.disk_full and str(args[0]).startswith(proc.world.root):
            raise OSError(errno.ENOSPC, "No space left on device", args[0])
    elif event == "fcntl.flock" and not proc.dead and args[1] & (fcntl.LOCK_EX | fcntl.LOCK_SH):
        st = os.fstat(args[0])
        proc.locks.append((args[0], st.st_dev, st.st_ino))
    elif event in _EFFECTS and proc.dead:
        raise PermissionError(errno.EACCES, "killed", args[0] if args else "")


_hooked = False


def _install() -> None:
    """The audit hook, once a process (hooks cannot be removed: outside a simulated run it returns at once)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True


def _at_point(name: str) -> None:
    """`run.shared._checkpoints.hook`: kills the run that reached its drawn point."""
    proc = _PROCESS.get()
    if proc is None or proc.kill_at is None or proc.kill_at.point != name:
        return
    proc.reached += 1
    if proc.reached == proc.kill_at.nth:
        proc.world.log.append(f"{proc.world.clock_text()} kill at {name}")
        proc.kill()


# -- the world ----------------------------------------------------------------------------------------------------

@dataclass
class RunRecord:
    job: str
    started: float
    ended: float
    how: str  # finished, killed, stopped, error: ..., bug: ...
    summary: dict[str, Any] | None = None


@dataclass
class Weather:
    """The world while it runs: the fake, the shared ledger, the disk, and what happened."""

    world: World
    root: str
    fake: FakeAPI
    clock: SimClock
    disk_full: bool = False
    log: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    events: dict[str, list[tuple[float, str, dict[str, Any]]]] = field(default_factory=dict)
    # each job's claim on the ledger as it posted it: (when, the requests it wanted room for; 0 once it wanted none,
    # its claim dropped, its run ended, or an unknown create of its own held its admissions)
    wants: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    processes: dict[int, Process] = field(default_factory=dict)

    def clock_text(self) -> str:
        return f"{(self.clock.now() - EPOCH) / 60:7.1f}m"

    def spawn(self, kill: Kill | None) -> Process:
        """A new run's process: a pid of its own, its start on the world's clock."""
        proc = Process(self, kill)
        proc.pid, proc.started = 1000 + len(self.processes), f"{self.clock.now():.3f}"
        self.processes[proc.pid] = proc
        return proc

    def liveness(self, proc: Process, workspace: str | None) -> Liveness:
        """The host ledger's knowledge of this world's processes, as `run.shared._beats.liveness` has it of a real
        machine's: a run killed or ended is dropped from the ledger by the next step of any other (not after its
        TTL); the rule is the real one (`decide._host.run_ended`), only the process table is the world's."""
        def started(pid: int) -> str | None:
            other = self.processes.get(pid)
            return None if other is None or other.ended or other.dead else other.started

        me = {"machine": MACHINE, "pid": proc.pid, "started": proc.started, "workspace": workspace}
        return Liveness(me, MACHINE, lambda record: run_ended(record, MACHINE, started))


def fake_config(world: World) -> FakeConfig:
    lo, hi = world.turnaround
    share = world.errored_share

    def outcome(cid: str, model: str, attempt: int) -> Outcome | None:
        if attempt > 1 or share <= 0:
            return None
        u = int.from_bytes(hashlib.blake2b(f"{world.seed}:{model}:{cid}".encode(), digest_size=8).digest()) / 2**64
        if u >= share:
            return None
        return Outcome("errored", "overloaded_error" if u < share / 2 else "api_error")

    return FakeConfig(**world.fake_settings(), outcome=outcome,
                      turnaround=lambda rng: _turnaround(rng, lo, hi, world.night),
                      realtime=FakeRealtime(rpm=world.realtime_rpm, overloaded=world.realtime_overloaded,
                                            lost=world.realtime_lost, latency=2.0),
                      federation=FakeFederation(token_life=world.token_life, keys_refused=True)
                      if world.token_life else None)


def _turnaround(rng: random.Random, lo: float, hi: float, night: float) -> float:
    """A batch's turnaround, drawn log-uniform; a batch made after the night, when the world is healthy again, within
    `HEALTHY_TURNAROUND` (a world whose every batch may take past its 24-hour life never lets a job finish: its
    requests expire, are sent again, and expire again, until the world ends)."""
    drawn = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return drawn if trio.current_time() < night else min(drawn, HEALTHY_TURNAROUND)


def api_config(world: World, fake: FakeAPI) -> ApiConfig:
    if world.token_life:
        jwt = identity_token(now=EPOCH, life=30 * 86_400.0)
        return ApiConfig(credential=Federation("fdrl_fake_1", "org_fake_1", identity_token=Secret(jwt)),
                         admin_key=Secret(ADMIN), base_url=fake.url)
    return ApiConfig(workspace_keys=[Secret(KEY)], admin_key=Secret(ADMIN), base_url=fake.url)


def write_input(job: DrawnJob, path: Path) -> list[tuple[str, bytes]]:
    """The job's input file: ids shared across jobs (r0, r1, ...), prompts its own; (custom_id, line) each."""
    doc = None
    if job.cached:  # (a prefix over every model's cache minimum: 4,096 of the fake's tokens)
        doc = [{"type": "text", "text": f"{job.name} shared context. " * 700, "cache_control": {"type": "ephemeral"}}]
    lines = []
    for k in range(job.requests):
        params: dict[str, Any] = {"model": job.model, "max_tokens": MAX_TOKENS,
                                  "messages": [{"role": "user", "content": f"{job.name} question {k}"}]}
        if doc is not None:
            params["system"] = doc
        lines.append((f"r{k}", orjson.dumps({"custom_id": f"r{k}", "params": params})))
    path.write_bytes(b"".join(line + b"\n" for _, line in lines))
    return lines


def budget_of(job: DrawnJob, lines: list[tuple[str, bytes]]) -> float | None:
    """`budget_share` of the job's worst case at batch prices (every request at its bound: one token per 2 bytes)."""
    if job.budget_share is None:
        return None
    rates = load_prices().lookup(job.model)
    assert rates is not None, job.model
    worst = sum(len(line) / BYTES_PER_TOKEN_WORST * rates[0] + MAX_TOKENS * rates[1] for _, line in lines) / 2e6
    return round(job.budget_share * worst, 6)


def settings_of(job: DrawnJob, here: Path, budget: float | None, world: World) -> SubmitSettings:
    return SubmitSettings(
        state_dir=here / "state", out=here / "out.jsonl", interval=job.poll, max_in_flight=job.max_in_flight,
        limits=Limits(max_requests=job.batch_size), priority=job.priority, share=job.share, budget=budget,
        deadline=None if job.deadline is None else EPOCH + job.start + job.deadline, preflight=False, token_sample=0,
        reconcile_grace=300.0)


async def weather(w: Weather) -> None:
    """The faults that strike at times: an account refusal (a spend limit) and a full disk, each from until."""
    world = w.world
    steps: list[tuple[float, str]] = []
    if world.refusal:
        steps += [(world.refusal[0], "refuse"), (world.refusal[1], "lift")]
    if world.disk_full:
        steps += [(world.disk_full[0], "full"), (world.disk_full[1], "free")]
    refusals: list[Fault] = []
    for at, what in sorted(steps):
        await w.clock.sleep(at - (w.clock.now() - EPOCH))
        w.log.append(f"{w.clock_text()} {what}")
        if what == "refuse":
            words = ("You have reached your specified API usage limits. You will regain access on "
                     f"{_date(EPOCH + (world.refusal or (0, 0))[1] + 86_400)} at 00:00 UTC.")
            refusals = [Fault(e, status=400, message=words, times=10**9) for e in ("create", "messages")]
            w.fake.inject(*refusals)
        elif what == "lift":
            for f in refusals:
                f.times = 0
        else:
            w.disk_full = what == "full"


def _date(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


class ObservedLedger(SqliteLedger):
    """The host ledger, its job's every post of its claim noted (`Weather.wants`): what it wanted, and when."""

    def __init__(self, path: str, owner: str, *, wants: list[tuple[float, int]], **kw: Any) -> None:
        super().__init__(path, owner, **kw)
        self.wants = wants

    def _note(self, want: int) -> None:
        self.wants.append((self.clock() - EPOCH, want))

    async def put_claim(self, mine: ClaimPost) -> Board:
        board = await super().put_claim(mine)
        self._note(mine.want)
        return board

    async def drop_claim(self) -> None:
        await super().drop_claim()
        self._note(0)

    async def release_all(self) -> None:
        await super().release_all()
        self._note(0)


async def drive(w: Weather, job: DrawnJob, config: ApiConfig, ledger_path: str) -> None:
    """One job, run again after every stop, kill or failure, until it finishes or the healthy world's time is up: as an
    operator would, the wait before a rerun doubling while runs fail, and a deadline that passed before the job
    could keep it dropped from the command (a deadline already past is a usage error for a job that never began)."""
    here = Path(w.root) / job.name
    here.mkdir()
    table = TableInput(job, here) if job.table else None
    budget = None if table else budget_of(job, write_input(job, here / f"{job.name}.jsonl"))
    settings = settings_of(job, here, budget, w.world)
    events = w.events.setdefault(job.name, [])
    kills, stops, changes = list(job.kills), list(job.stops), list(job.changes)
    await w.clock.sleep(job.start)
    failures = 0
    for n in range(MAX_RUNS):
        if w.clock.now() - EPOCH > w.world.end:
            break
        if table is not None and n and changes:  # (the table changed since the last run: the job is run again)
            table.change(changes.pop(0))
            w.log.append(f"{w.clock_text()} {job.name}'s table: {job.changes[len(job.changes) - len(changes) - 1]}")
        if settings.deadline is not None and w.clock.now() >= float(settings.deadline):  # type: ignore[arg-type]
            settings = dataclasses.replace(settings, deadline=None)
        proc = w.spawn(kills.pop(0) if kills else None)
        started = w.clock.now() - EPOCH
        record = RunRecord(job.name, started, started, "still running when the world ended")
        w.runs.append(record)
        await one_run(w, job, proc, stops.pop(0) if stops else None, settings, config, ledger_path, events, record,
                      table)
        if record.how == "finished" and not changes:
            return
        failures = failures + 1 if record.how.startswith(("error", "bug", "unfinished")) else 0
        await w.clock.sleep(min(job.rerun_after * 2 ** failures, RERUN_AT_MOST))


async def one_run(w: Weather, job: DrawnJob, proc: Process, stop_after: float | None, settings: SubmitSettings,
                  config: ApiConfig, ledger_path: str, events: list[tuple[float, str, dict[str, Any]]],
                  record: RunRecord, table: TableInput | None = None) -> None:
    """One run of `job` as process `proc`: killed at its `Kill`, stopped after `stop_after` seconds, its outcome in
    `record`."""
    run = _Run(w, job, proc, settings, config, ledger_path, events, record, table, anyio.Event())
    await run.supervised(stop_after)
    run.ended()


@dataclass
class _Run:
    """One process's run of a job: what its steps share (the world, the job's settings, where its outcome goes)."""

    w: Weather
    job: DrawnJob
    proc: Process
    settings: SubmitSettings
    config: ApiConfig
    ledger_path: str
    events: list[tuple[float, str, dict[str, Any]]]
    record: RunRecord
    table: TableInput | None
    stop: anyio.Event
    wants: list[tuple[float, int]] = field(init=False)

    def __post_init__(self) -> None:
        self.wants = self.w.wants.setdefault(self.job.name, [])

    def gate(self, request: httpx.Request) -> None:
        """The transport of a killed process sends nothing."""
        if self.proc.dead:
            raise httpx.ConnectError("killed", request=request)

    def emit(self, event: str, fields: dict[str, Any]) -> None:
        """An event the run told, kept with its time (none once killed); a run reconciling wants no room."""
        if not self.proc.dead:
            self.events.append((self.w.clock.now() - EPOCH, event, fields))
            if event == "create_unknown" or event == "waiting" and fields.get("reason") == "reconciling":
                self.wants.append((self.w.clock.now() - EPOCH, 0))  # (its claim stands, but it admits nothing until reconciled)

    async def supervised(self, stop_after: float | None) -> None:
        """The run, with its kill and its stop scheduled; what a killed run raised on its way down dropped."""
        with anyio.CancelScope() as scope:
            self.proc.scope = scope
            try:
                async with anyio.create_task_group() as tg:
                    if self.proc.kill_at is not None:
                        tg.start_soon(self.kill_later, self.proc.kill_at.after)
                    if stop_after is not None:
                        tg.start_soon(self.stop_later, stop_after)
                    await self.run()
                    tg.cancel_scope.cancel()
            except BaseException:
                if not self.proc.dead:
                    raise  # (whatever a killed run raised on its way down had no effect: its handles were dead)

    async def run(self) -> None:
        token = _PROCESS.set(self.proc)  # (every task the run starts inherits it)
        try:
            await self.submitted()
        finally:
            _PROCESS.reset(token)

    async def submitted(self) -> None:
        """The job's command run once, how it ended put in the record."""
        ledger = ObservedLedger(self.ledger_path, f"{self.job.name}", ttl=LEASE, clock=self.w.clock.now,
                                liveness=self.w.liveness(self.proc, self.config.workspace_print()), wants=self.wants)
        transport = InProcess(self.w.fake, self.w.clock.sleep, self.gate)
        try:
            await self.command(ledger, transport)
        except Interrupted:
            self.record.how = "stopped"
        except GatekeeperError as exc:
            self.record.how = f"error: {type(exc).__name__}: {exc}"
        except Exception:
            self.record.how = "bug: " + traceback.format_exc(limit=-3).replace("\n", " | ")

    async def command(self, ledger: ObservedLedger, transport: InProcess) -> None:
        """`submit` of the job's file, or its table's run; a job whose rest is not held back by its budget and not
        answered is unfinished."""
        w, job, record = self.w, self.job, self.record
        if self.table is not None:
            record.how, record.summary = await run_table(job, self.table, Path(w.root) / job.name, self.settings,
                                                         self.config, on_event=self.emit, stop=self.stop, ledger=ledger,
                                                         clock=w.clock, transport=transport)
            return
        summary = await submit(str(Path(w.root) / job.name / f"{job.name}.jsonl"), config=self.config,
                               settings=self.settings, on_event=self.emit, stop=self.stop, ledger=ledger, clock=w.clock,
                               transport=transport)
        record.how, record.summary = "finished", summary.to_json()
        held = (summary.budget or {}).get("held_back", 0)
        if summary.pending and summary.pending != held:  # (a budget's stop ends a job with its rest held back)
            record.how = "unfinished"

    async def kill_later(self, after: float) -> None:
        await self.w.clock.sleep(after)
        self.w.log.append(f"{self.w.clock_text()} kill {self.job.name}")
        self.proc.kill()

    async def stop_later(self, after: float) -> None:
        await self.w.clock.sleep(after)
        self.w.log.append(f"{self.w.clock_text()} stop {self.job.name}")
        self.stop.set()

    def ended(self) -> None:
        """The process gone (a killed one's files closed), the run's end recorded and its claim dropped."""
        w, proc, record = self.w, self.proc, self.record
        proc.ended = True
        if proc.dead:
            record.how, record.summary = "killed", None
            proc.bury()
        record.how = record.how.replace(w.root, "ROOT")  # (the temporary folder's name: not part of a replay)
        record.ended = w.clock.now() - EPOCH
        self.wants.append((record.ended, 0))
        w.log.append(f"{w.clock_text()} {self.job.name} run ends: {record.how[:200]}")


async def simulate(world: World, root: str) -> Weather:
    """Every job of `world` to its end (or the end of the healthy time after the night)."""
    clock = SimClock()
    fake = FakeAPI(fake_config(world), clock=clock.monotonic, epoch=EPOCH, listen=False)
    for k in world.lost_creates:
        fake.inject(Fault("create", kind="drop_after_commit", after=k))
    for endpoint, status, after, times in world.faults:
        fake.inject(Fault(endpoint, status=status, after=after, times=times,
                          retry_after="30" if status == 429 else None))
    w = Weather(world, root, fake, clock)
    config = api_config(world, fake)
    ledger_path = str(Path(root) / "ledger.db")
    async with anyio.create_task_group() as tg:
        tg.start_soon(weather, w)
        with anyio.move_on_after(world.end):  # (the world's end: a run still going then never finishes)
            async with anyio.create_task_group() as jobs:
                for job in world.jobs:
                    jobs.start_soon(drive, w, job, config, ledger_path)
        tg.cancel_scope.cancel()
    return w


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """Every draw the code makes from one seed: the module generator (jitter), trio's scheduler; checkpoints hooked."""
    import trio._core._run as trio_run

    _install()
    state = random.getstate()
    random.seed(seed)
    trio_run._r.seed(seed)
    allowed = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]  # (batches of ready tasks in a seeded order)
    hook, _checkpoints.hook = _checkpoints.hook, _at_point
    try:
        with inline_threads():
            yield
    finally:
        _checkpoints.hook = hook
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = allowed  # type: ignore[misc]
        random.setstate(state)


def run_world(world: World, root: str) -> Weather:
    """`simulate` on trio's MockClock: the whole night and its healthy days in simulated time."""
    with deterministic(world.seed), warnings.catch_warnings():
        # (a killed run abandons its downloads mid-stream: trio tells of each async generator left unclosed)
        warnings.simplefilter("ignore", ResourceWarning)
        w = anyio.run(simulate, world, root, backend="trio",
                      backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)})
        gc.collect()  # (those generators finalized here, their warnings ignored)
        # (what is left lives on: kept out of every later collection, a full one of which would otherwise walk the
        # whole heap, the imports' modules and every earlier world's survivors, a few times a seed)
        gc.freeze()
        return w
