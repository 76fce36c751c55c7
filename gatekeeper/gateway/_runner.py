"""Which replica runs which batch's job, and the jobs this one runs.

Every `scan` seconds (and at once after a create) the runner claims live batches nobody runs: no claim, a claim
whose heartbeat is older than `lease_ttl`, or one whose replica has certainly ended (the same machine, its pid
gone; with the SQLite book, which one replica holds locked, any earlier claim). Claims are kept alive every
`lease_ttl`/3 seconds; a replica killed with -9 stops beating, and another takes its jobs over within `lease_ttl`
(the job's journal has a lease of its own, so two runs of one job never overlap). A restart resumes every job from
its journal: nothing lost, nothing sent twice.

A cancel reaches the replica that runs the job at its next heartbeat (at once on this one): the run stops at a
safe point, the cancel is recorded in its journal, and the job is run again to collect what ended. A run that
fails (the upstream down for long, its credentials refused) lets go of the batch and is tried again later, waiting
longer each time (at most five minutes: the job resumes soon after the upstream does); its requests stay where
they are. The latest failure is the replica's `trouble` until a job moves again: `/healthz` says it, and while it
is the account's (on hold, a spend limit) a create is refused as the API would refuse it.
"""

from __future__ import annotations

import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._errors import AccountRefused, GatekeeperError, Interrupted, JobLive
from ..api._config import ApiConfig
from ..decide._host import run_ended
from ..state._gateway import BatchRecord
from ..state._host import process_started, this_process
from ..state.ledger._base import new_owner
from ._create import BookCall
from ._job import run_job
from ._keys import KeyFile
from ._settings import GatewaySettings

STOP_WAIT = 75.0  # seconds a stopping replica gives its jobs to reach a safe point (a create out may take 60)
RETRY_FIRST, RETRY_MOST = 30.0, 300.0  # seconds before a failed job is tried again: doubling, at most
MOVING = frozenset({"admitted", "ended", "finished"})  # a job's events that say the upstream serves it
Log = Callable[..., None]


@dataclass(frozen=True)
class Trouble:
    """The latest failure of a job here, until a job moves again: what it said, when, and the account's refusal
    when it was one (every create would get the same answer from the API until it is lifted)."""

    error: str
    at: float
    refusal: AccountRefused | None = None

    def refuses(self, now: float) -> AccountRefused | None:
        """The account's refusal a create gets now: only while it is fresh (a job tries again within RETRY_MOST, and
        renews it if the refusal stands), so a lifted refusal with no job left to notice it refuses nothing for long."""
        return self.refusal if now - self.at < 2 * RETRY_MOST else None


@dataclass
class _Running:
    """A job this replica runs: how to stop it, and whether it runs as canceled."""

    stop: anyio.Event = field(default_factory=anyio.Event)
    canceling: bool = False
    restart: bool = False  # stopped to be run again as canceled (not because the replica stops)


class Runner:
    """The jobs of every live batch this replica holds; `run(stop)` until `stop` is set."""

    def __init__(self, *, settings: GatewaySettings, config: ApiConfig, book: BookCall[Any], keys: KeyFile, log: Log,
                 single: bool, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.config = config
        self.book = book
        self.keys = keys
        self.log = log
        self.clock = clock
        self.owner = new_owner()
        # (its pid's start time too: a pid reused by a later process is not taken for this replica)
        self.info: dict[str, Any] = {"host": socket.gethostname(), **this_process()}
        here = self.info["machine"]
        # (a SQLite book is held by this one replica: every earlier claim in it is a dead process's)
        self.ended: Callable[[dict[str, Any]], bool] = (lambda _: True) if single else (
            lambda info: run_ended(info, here, process_started))
        self.jobs: dict[str, _Running] = {}
        self._wake = anyio.Event()
        self._fresh = True  # this start has not looked for jobs yet (`_claim`)
        self.stopping = False
        self.failures = 0  # job runs that stopped on an error (for /metrics)
        self.trouble: Trouble | None = None

    def wake(self) -> None:
        """Look for jobs now (a create was recorded)."""
        self._wake.set()

    def cancel_now(self, batch_id: str) -> None:
        """The job runs here: stop it and run it again as canceled."""
        running = self.jobs.get(batch_id)
        if running is not None and not running.canceling:
            running.restart = True
            running.stop.set()

    async def run(self, stop: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._beats, stop)
            while not stop.is_set():
                try:
                    await self._claim(tg)
                except GatekeeperError as exc:  # (the database away for a moment: look again next time)
                    self.log("claim_failed", error=str(exc))
                with anyio.move_on_after(self.settings.scan):
                    async with anyio.create_task_group() as waits:
                        for event in (self._wake, stop):
                            waits.start_soon(_set_then_cancel, event, waits.cancel_scope)
                self._wake = anyio.Event()
            await self._stop_all()
            tg.cancel_scope.cancel()

    async def _claim(self, tg: anyio.abc.TaskGroup) -> None:
        room = self.settings.max_jobs - len(self.jobs)
        if room <= 0:
            return
        fresh, self._fresh = self._fresh, False  # (the first look of this start: backoffs of a former run not kept)
        claimed = await self.book(lambda b: b.claim(self.owner, self.info, self.settings.lease_ttl, self.ended, room,
                                                    fresh=fresh))
        for record in claimed:
            if record.id not in self.jobs:
                self.jobs[record.id] = _Running(canceling=record.status == "canceling")
                tg.start_soon(self._job, record)

    async def _beats(self, stop: anyio.Event) -> None:
        """Keep this replica's claims alive; a job whose batch was canceled (by any replica) is run as canceled, one
        another replica took over is stopped."""
        while not stop.is_set():
            with anyio.move_on_after(self.settings.lease_ttl / 3):
                await stop.wait()
            try:
                held = {r.id: r for r in await self.book(lambda b: b.beat(self.owner))}
            except GatekeeperError as exc:
                self.log("heartbeat_failed", error=str(exc))
                continue
            for batch_id, running in list(self.jobs.items()):
                record = held.get(batch_id)
                if record is None:
                    running.stop.set()  # (no longer ours: its journal's lease stops it anyway)
                elif record.status == "canceling":
                    self.cancel_now(batch_id)

    async def _job(self, record: BatchRecord) -> None:
        running = self.jobs[record.id]
        error: str | None = None
        retry_in = 0.0
        try:
            counts = await self._run_until_end(record, running)
            await self.book(lambda b: b.finish(record.id, counts))
            self.log("batch_ended", batch=record.id, tenant=record.tenant, counts=counts)
        except Interrupted:
            pass  # (the replica stops, or the batch is another's now: resumed from its journal later)
        except JobLive as exc:
            error, retry_in = str(exc), self.settings.lease_ttl / 2  # (another run still holds its journal's lease)
        except GatekeeperError as exc:
            error, retry_in = str(exc), min(RETRY_FIRST * 2 ** record.failures, RETRY_MOST)
            self.trouble = Trouble(error, self.clock(), exc if isinstance(exc, AccountRefused) else None)
        except Exception as exc:  # a bug: said with its traceback, the batch tried again later, never lost
            error, retry_in = f"{type(exc).__name__}: {exc}", RETRY_MOST
            self.log("job_bug", batch=record.id, traceback=traceback.format_exc())
        finally:
            with anyio.CancelScope(shield=True):
                await self._let_go(record, error, retry_in)

    async def _run_until_end(self, record: BatchRecord, running: _Running) -> dict[str, int]:
        tenant = self.keys.tenant_named(record.tenant)
        self.log("job_started", batch=record.id, tenant=record.tenant, requests=record.requests,
                 canceling=running.canceling, priority=tenant.priority, share=tenant.share)
        while True:
            try:
                return await run_job(record, settings=self.settings, config=self.config, tenant=tenant,
                                     canceling=running.canceling, stop=running.stop, emit=self._emit)
            except Interrupted:
                if not running.restart or self.stopping:
                    raise
                running.stop, running.restart, running.canceling = anyio.Event(), False, True

    async def _let_go(self, record: BatchRecord, error: str | None, retry_in: float) -> None:
        self.jobs.pop(record.id, None)
        if error is not None:
            self.failures += 1
            self.log("job_failed", batch=record.id, error=error, retry_in=round(retry_in, 1))
        try:
            await self.book(lambda b: b.release(self.owner, record.id, error=error,
                                                retry_at=self.clock() + retry_in if error else None))
        except GatekeeperError as exc:
            self.log("release_failed", batch=record.id, error=str(exc))

    def _emit(self, event: str, fields: dict[str, Any]) -> None:
        if event in MOVING:
            self.trouble = None
        if event not in ("progress", "rejected"):  # (a line every reading of every job says nothing new)
            self.log(f"job_{event}", **fields)

    async def _stop_all(self) -> None:
        """Every job stopped at a safe point (bounded), its claim let go for another replica to take at once."""
        self.stopping = True
        for running in self.jobs.values():
            running.stop.set()
        with anyio.move_on_after(STOP_WAIT):
            while self.jobs:
                await anyio.sleep(0.05)


async def _set_then_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
