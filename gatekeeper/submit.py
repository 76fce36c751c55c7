"""The library's submit entry points: `submit` (async), `submit_sync`, `dry_run`, `cancel`."""

from __future__ import annotations

import fcntl
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson

from .admission import admit, batch_size_for, room
from .config import ApiConfig
from .errors import JournalError, UsageError
from .inputs import hash_file
from .journal import BatchState, Journal
from .ledger import Ledger, new_owner, open_ledger
from .planner import plan
from .prices import PriceTable, load_prices
from .queue import Connection, connect, read_headroom
from .retry import RetryPolicy
from .runner import Checkpoint, EventSink, Job, ResultSink, SubmitSettings, Summary, default_state_dir, summarize
from .sizing import Limits

Source = str | os.PathLike[str] | Iterable[dict[str, Any] | bytes | str]


def _resolve(source: Source, settings: SubmitSettings) -> tuple[str, Path, bool]:
    """(input path, state dir, spooled?) for a path or an iterable of requests."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path == "-":
            raise UsageError("submit needs a file it can read again on resume, not standard input: save it first")
        return path, Path(settings.state_dir or default_state_dir(path)), False
    if settings.state_dir is None:
        raise UsageError("state_dir is required when the requests are an iterable (they are spooled there)")
    return str(Path(settings.state_dir) / "input.jsonl"), Path(settings.state_dir), True


def _spool(items: Iterable[dict[str, Any] | bytes | str], path: str) -> None:
    """Write an iterable's requests to the state directory, so the job can be resumed from them."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb", buffering=1 << 20) as f:
        for item in items:
            if isinstance(item, dict):
                f.write(orjson.dumps(item))
            elif isinstance(item, str):
                f.write(item.encode())
            else:
                f.write(bytes(item).rstrip(b"\r\n"))
            f.write(b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_respool(items: Iterable[dict[str, Any] | bytes | str], path: str, journal: Journal) -> None:
    """Resuming from an iterable: its requests must be the ones the job was started with."""
    fresh = path + ".resume"
    _spool(items, fresh)
    try:
        if hash_file(fresh) != (journal.get_meta("input") or {}).get("sha256"):
            raise JournalError(f"state directory {journal.state_dir} holds a job started with other requests; "
                               "use another state_dir to start a new job")
    finally:
        os.unlink(fresh)


@asynccontextmanager
async def _locked_journal(state_dir: Path) -> AsyncIterator[Journal]:
    journal = Journal.open(state_dir)
    lock = os.open(state_dir / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(f"another gatekeeper is running with state directory {state_dir}") from None
        yield journal
    finally:
        os.close(lock)
        journal.close()


async def submit(
    source: Source,
    *,
    config: ApiConfig,
    settings: SubmitSettings | None = None,
    on_event: EventSink | None = None,
    on_result: ResultSink | None = None,
    stop: anyio.Event | None = None,
    ledger: Ledger | None = None,
    checkpoint: Checkpoint | None = None,
    retry: RetryPolicy | None = None,
    prices: PriceTable | None = None,
) -> Summary:
    """Run a whole batch job: validate, size, admit against headroom, collect, resubmit, until every request is final.

    Rerunning with the same input and state directory resumes. `on_result(custom_id, result)`
    is called once per final result, after it is committed. Set `stop` to end the run at the
    next safe point (it raises `Interrupted`, resumable).
    """
    settings = settings or SubmitSettings()
    path, state_dir, spooled = _resolve(source, settings)
    async with _locked_journal(state_dir) as journal:
        if spooled and not journal.initialized:
            _spool(source, path)  # type: ignore[arg-type]
        elif spooled:
            _check_respool(source, path, journal)  # type: ignore[arg-type]
        if ledger is None:
            ledger = open_ledger(settings.ledger, owner=_owner(journal), ttl=settings.ledger_ttl, margin=settings.margin)
        outcome: list[Summary] = []
        failure: list[Exception] = []
        try:
            async with connect(config, retry=retry) as conn, anyio.create_task_group() as tg:
                job = Job(path, settings, conn, journal, emit=on_event or (lambda e, f: None), stop=stop or anyio.Event(),
                          checkpoint=checkpoint or (lambda name: None), on_result=on_result, ledger=ledger, prices=prices)
                tg.start_soon(_heartbeat, ledger)
                try:
                    await job.prepare()
                    outcome.append(await job.run())
                except Exception as exc:  # re-raised below, outside the task group (which would wrap it)
                    failure.append(exc)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await ledger.close()
        if failure:
            raise failure[0]
        return outcome[0]


async def _heartbeat(ledger: Ledger) -> None:
    """Keep this submitter's reservations alive while it runs; they expire `ttl` after it dies."""
    while True:
        await anyio.sleep(max(0.05, ledger.ttl / 3))
        await ledger.heartbeat()


def _owner(journal: Journal) -> str:
    """The job's ledger identity, stable across resumes (so a rerun's reservations replace, not add to, its own)."""
    owner = journal.get_meta("ledger_owner")
    if owner is None:
        owner = new_owner()
        with journal.transaction() as db:
            journal.set_meta(db, "ledger_owner", owner)
    return str(owner)


def submit_sync(source: Source, **kwargs: Any) -> Summary:
    """`submit` for code that is not async."""
    return anyio.run(lambda: submit(source, **kwargs))


async def dry_run(
    source: Source, *, config: ApiConfig, settings: SubmitSettings | None = None, prices: PriceTable | None = None
) -> dict[str, Any]:
    """Plan plus live headroom: what would go now, what would wait, and the queue after. Creates nothing."""
    settings = settings or SubmitSettings()
    if not isinstance(source, (str, os.PathLike)):
        raise UsageError("dry_run takes a path")
    async with connect(config) as conn:
        h = await read_headroom(conn, ceiling=settings.ceiling)
    size = batch_size_for(h.ceiling, settings.margin, settings.limits.max_requests)
    report = plan(source, limits=Limits(max_requests=size, max_bytes=settings.limits.max_bytes))
    sizes = [b.requests for b in report.batches]
    free = room(h.ceiling, h.depth, settings.margin, 0)
    now = admit(sizes, free, in_flight=0, max_in_flight=settings.max_in_flight)
    return {
        "plan": report.to_json(), "estimate": report.estimate(prices or load_prices()), "batch_size": size, "ceiling": h.ceiling, "ceiling_source": h.ceiling_source,
        "depth": h.depth, "remaining": h.remaining, "would_create_now": now,
        "requests_now": sum(sizes[:now]), "would_wait": len(sizes) - now, "queue_after": h.depth + sum(sizes[:now]),
        "policy": "unknown ceiling: the first batch is tried and a bound learned from refusals" if h.ceiling is None else
        f"batches of at most {size:,} requests, four to the ceiling",
    }


async def cancel(state_dir: str | os.PathLike[str], *, config: ApiConfig) -> dict[str, Any]:
    """Cancel the run's live batches and record it; a rerun of submit then sends nothing new."""
    path = Path(state_dir)
    if not (path / Journal.FILE).exists():
        raise UsageError(f"no gatekeeper journal in {path}")
    journal = Journal.open(path)
    try:
        live = journal.batches(BatchState.CREATED)
        canceled = []
        async with connect(config) as conn:
            for row in live:
                batch = await conn.primary.cancel_batch(str(row.batch_id))
                canceled.append({"batch": row.idx, "id": row.batch_id, "status": batch.get("processing_status")})
        with journal.transaction() as db:
            journal.set_meta(db, "user_canceled", True)
            journal.event(db, "user_canceled", batches=len(canceled))
        return {"canceled": canceled, "not_sent": sum(b.requests for b in journal.batches(BatchState.PLANNED))}
    finally:
        journal.close()


def job_summary(state_dir: str | os.PathLike[str], prices: PriceTable | None = None) -> Summary:
    journal = Journal.open(state_dir)
    try:
        return summarize(journal, str(journal.get_meta("output") or Path(state_dir) / "results.jsonl"), prices=prices)
    finally:
        journal.close()


__all__ = ["Connection", "cancel", "dry_run", "job_summary", "submit", "submit_sync"]
