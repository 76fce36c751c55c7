"""A create, from the first byte of its body to the batch it answers with: the requests spooled as they arrive
(`_stream`), every line judged as `plan` judges an input file (an invalid request is the API's 400, naming it),
the spool moved to the batch's folder, then the batch recorded in the book, unless its tenant already has it (the
same Idempotency-Key, or the same requests within the window: the SDK's retries of one create make one batch)."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import re
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio

from .._errors import GatewayRefusal, InputError
from .._wire import API_VERSIONS
from ..input._planner import plan
from ..input._sizing import Limits
from ..state._gateway import BatchRecord, GatewayBook
from ._settings import GatewaySettings
from ._stream import RequestCutter
from ._wire import new_id

SLICE = 4 << 20  # bytes of body gathered before they are cut and written (in a worker thread, off the event loop)
_LINE = re.compile(r"\bline (\d+)\b")
T = TypeVar("T")
BookCall = Callable[[Callable[[GatewayBook], T]], Awaitable[T]]


@dataclass(frozen=True)
class Received:
    """A create's requests, spooled: where, how many, their bytes and their digest (sha256 of the lines in order)."""

    path: Path
    requests: int
    bytes: int
    digest: str


class _Spool:
    """The requests of one body written as JSONL to a file of their own while the body arrives."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, name = tempfile.mkstemp(prefix="create-", suffix=".jsonl", dir=folder)
        self.path = Path(name)
        self.file = os.fdopen(fd, "wb")
        self.cutter = RequestCutter()
        self.sha = hashlib.sha256()
        self.bytes = 0

    def write(self, lines: bytes) -> None:
        if lines:
            self.file.write(lines)
            self.sha.update(lines)
            self.bytes += len(lines)

    def cut(self) -> None:
        self.write(self.cutter.cut())

    def finish(self) -> Received:
        self.write(self.cutter.finish())
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return Received(self.path, self.cutter.count, self.bytes, self.sha.hexdigest())

    def discard(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


async def receive(chunks: AsyncIterator[bytes], folder: Path) -> Received:
    """Spool a create's body into `folder` as it arrives: each chunk taken on the event loop, the requests cut and
    written a few megabytes at a time in a worker thread; a refused body leaves nothing behind."""
    spool = _Spool(folder)
    try:
        async for chunk in chunks:
            spool.cutter.append(chunk)
            if spool.cutter.pending() >= SLICE:
                await anyio.to_thread.run_sync(spool.cut)
        received = await anyio.to_thread.run_sync(spool.finish)
    except BaseException:
        spool.discard()
        raise
    if received.requests == 0:
        received.path.unlink(missing_ok=True)
        raise GatewayRefusal(400, "requests: List should have at least 1 item after validation")
    return received


def judge(path: str, api_version: str, workers: int | None = None) -> tuple[int, int, str, str | None] | None:
    """Every request judged as `plan` judges a line of an input file, by the rules of the create's API version:
    None when all pass, else (line, refused lines, reason, custom_id) of the first refused. Plain values in and
    out: it runs in a process of its own for a large create (`Judge`)."""
    try:
        report = plan(path, limits=Limits(api_version=api_version), workers=workers)
    except InputError as exc:
        return 0, 1, str(exc), None
    if not report.errors:
        return None
    first = report.errors[0]
    return first.line, len(report.errors), first.reason, first.custom_id


class Judge:
    """Where creates are judged: a small one in a worker thread; a large one (`BIG` bytes or more) in a process of
    its own that reads it with two forked readers, as `gatekeeper plan` does (a process that runs threads, as the
    server does, must not fork them itself). The process is started on the first large create, and again if it
    dies."""

    BIG = 8_000_000  # bytes: `plan`'s own threshold for its parallel readers

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def __call__(self, received: Received, api_version: str) -> None:
        """The API's 400 naming the first refused request (`requests.3: ...`), when any is refused."""
        if received.bytes < self.BIG or (os.cpu_count() or 1) < 2:
            verdict = await anyio.to_thread.run_sync(judge, str(received.path), api_version)
        else:
            verdict = await self._in_process(str(received.path), api_version)
        if verdict is None:
            return
        line, count, reason, _ = verdict
        where = f"requests.{line - 1}: " if line else ""
        more = f" (and {count - 1} more invalid requests)" if count > 1 else ""
        raise GatewayRefusal(400, where + _LINE.sub(lambda m: f"requests.{int(m.group(1)) - 1}", reason) + more)

    async def _in_process(self, path: str, api_version: str) -> tuple[int, int, str, str | None] | None:
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_die_with, initargs=(os.getpid(),))
            try:
                return await loop.run_in_executor(self._pool, judge, path, api_version, 2)
            except BrokenProcessPool:
                self._pool = None  # (it died: start another)
                if attempt == 2:
                    raise
        return None  # (never reached)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _die_with(parent: int) -> None:
    """In the judging process: exit once the gateway is gone. A gateway killed with -9 runs no shutdown, and its
    judge (and with it multiprocessing's resource tracker) would otherwise live on under init, one pair a kill."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="gatekeeper-judge-parent", daemon=True).start()


def version_of(header: str | None) -> str:
    """The create's anthropic-version: the job is sent with it, and its lines judged by its rules."""
    if header not in API_VERSIONS:
        raise GatewayRefusal(400, f"anthropic-version: {header!r} is not a version this gateway can send "
                                  f"({', '.join(API_VERSIONS)})")
    return str(header)


@dataclass(frozen=True)
class Created:
    """A create answered: the batch (new, or the one its key or its requests made before), and the seconds spent
    receiving and judging it (logged: where a large create's time goes)."""

    batch: BatchRecord
    new: bool
    received_s: float
    judged_s: float
    requests: int  # what this create's body brought (a repeated one's too: the batch is the one made before)
    bytes: int


async def create(chunks: AsyncIterator[bytes], *, tenant: str, api_version: str, idem_key: str | None, now: float,
                 settings: GatewaySettings, book: BookCall[tuple[BatchRecord, bool]], judged: Judge) -> Created:
    """Receive, judge and record a create. The batch's requests are in its folder (fsynced) before its row is
    committed: a replica that takes the job over finds them there."""
    started = time.monotonic()
    received = await receive(chunks, settings.incoming)
    at_received = time.monotonic()
    batch_id = new_id("msgbatch_")
    try:
        await judged(received, api_version)
        folder = settings.batch_dir(batch_id)
        folder.mkdir(parents=True, mode=0o700)
        os.replace(received.path, settings.input_path(batch_id))
        _fsync_dir(folder)
        _fsync_dir(folder.parent)
    except BaseException:
        received.path.unlink(missing_ok=True)
        raise
    at_judged = time.monotonic()
    record = BatchRecord(id=batch_id, tenant=tenant, status="in_progress", requests=received.requests,
                         bytes=received.bytes, digest=received.digest, idem_key=idem_key, api_version=api_version,
                         created_at=now)
    try:
        batch, new = await book(lambda b: b.create(record, settings.dedup_window))
    except BaseException:
        await anyio.to_thread.run_sync(_remove, settings.batch_dir(batch_id))
        raise
    if not new:
        await anyio.to_thread.run_sync(_remove, settings.batch_dir(batch_id))
    return Created(batch, new, round(at_received - started, 3), round(at_judged - at_received, 3), received.requests,
                   received.bytes)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
