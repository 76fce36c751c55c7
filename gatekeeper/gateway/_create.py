"""A create, from the first byte of its body to the batch it answers with: the requests spooled as they arrive
(`_stream`), every line judged as `plan` judges an input file (an invalid request is the API's 400, naming it),
the spool moved to the batch's folder, then the batch recorded in the book, unless its tenant already has it (the
same Idempotency-Key, or the same requests within the window: the SDK's retries of one create make one batch)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
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

    def feed(self, data: bytes) -> None:
        self.write(self.cutter.feed(data))

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
    """Spool a create's body into `folder` as it arrives, cut into requests in slices off the event loop; a
    refused body leaves nothing behind."""
    spool = _Spool(folder)
    try:
        pending = bytearray()
        async for chunk in chunks:
            pending += chunk
            if len(pending) >= SLICE:
                data = bytes(pending)
                pending.clear()
                await anyio.to_thread.run_sync(spool.feed, data)
        await anyio.to_thread.run_sync(spool.feed, bytes(pending))
        received = await anyio.to_thread.run_sync(spool.finish)
    except BaseException:
        spool.discard()
        raise
    if received.requests == 0:
        received.path.unlink(missing_ok=True)
        raise GatewayRefusal(400, "requests: List should have at least 1 item after validation")
    return received


def judge(received: Received, api_version: str) -> None:
    """Every request judged as `plan` judges a line of an input file, by the rules of the create's API version;
    the first one refused is the API's 400, named by its place in the body (`requests.3: ...`)."""
    try:
        report = plan(str(received.path), limits=Limits(api_version=api_version))
    except InputError as exc:
        raise GatewayRefusal(400, f"requests: {exc}") from None
    if report.errors:
        first = report.errors[0]
        reason = _LINE.sub(lambda m: f"requests.{int(m.group(1)) - 1}", first.reason)
        more = f" (and {len(report.errors) - 1} more invalid requests)" if len(report.errors) > 1 else ""
        raise GatewayRefusal(400, f"requests.{first.line - 1}: {reason}{more}")


def version_of(header: str | None) -> str:
    """The create's anthropic-version: the job is sent with it, and its lines judged by its rules."""
    if header not in API_VERSIONS:
        raise GatewayRefusal(400, f"anthropic-version: {header!r} is not a version this gateway can send "
                                  f"({', '.join(API_VERSIONS)})")
    return str(header)


async def create(chunks: AsyncIterator[bytes], *, tenant: str, api_version: str, idem_key: str | None, now: float,
                 settings: GatewaySettings, book: BookCall[tuple[BatchRecord, bool]]) -> tuple[BatchRecord, bool]:
    """Receive, judge and record a create; (the batch, whether it is new). The batch's requests are in its folder
    (fsynced) before its row is committed: a replica that takes the job over finds them there."""
    received = await receive(chunks, settings.incoming)
    batch_id = new_id("msgbatch_")
    try:
        await anyio.to_thread.run_sync(judge, received, api_version)
        folder = settings.batch_dir(batch_id)
        folder.mkdir(parents=True, mode=0o700)
        os.replace(received.path, settings.input_path(batch_id))
        _fsync_dir(folder)
        _fsync_dir(folder.parent)
    except BaseException:
        received.path.unlink(missing_ok=True)
        raise
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
    return batch, new


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
