"""The library's entry points: `submit` (async), `submit_sync`, `dry_run`, `preflight`, `cancel`, `job_summary`.
Their plumbing lives in the rooms it belongs to: `_spool` (an iterable input), `_opening` (the journal, the job's
name), `_beats` (reservations and the lease kept alive)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from .._clock import WALL, Clock
from .._errors import Interrupted, JobMissing, UsageError
from .._prices import PriceTable, load_prices
from ..api._config import ApiConfig
from ..api._http import Sleep
from ..api._queue import connect, read_headroom
from ..api._retry import RetryPolicy
from ..checks._preflight import plan_checked
from ..decide._admission import admit, batch_size_for, room
from ..input._planner import PlanReport
from ..input._reader import open_source
from ..input._sizing import Limits
from ..state._journal import BatchState, Journal, open_job
from ..state._output import check_writable
from ..state.ledger._base import Ledger
from ..state.ledger._open import LedgerChoice, choose_ledger, open_ledger
from ._loop import ResultSink, SubmitLoop
from .realtime._realtime import CALLS_OUT_WAIT
from .shared._beats import give_up_claim, heartbeat, lease_heartbeat, ledger_owner, liveness
from .shared._beside import beside
from .shared._cancel import REFUSED, cancel_batch
from .shared._opening import job_journal, out_path
from .shared._settings import EventSink, SubmitSettings
from .shared._spool import adopt_spool, check_respool, resolve_source, spool
from .shared._summary import Canceled, CanceledBatch, DryRun, Summary, summarize

if TYPE_CHECKING:
    from ..input._reader import Source


async def submit(
    source: Source,
    *,
    config: ApiConfig,
    settings: SubmitSettings | None = None,
    on_event: EventSink | None = None,
    on_result: ResultSink | None = None,
    stop: anyio.Event | None = None,
    ledger: Ledger | None = None,
    retry: RetryPolicy | None = None,
    prices: PriceTable | None = None,
    prepare_only: bool = False,
    continue_only: bool = False,
    environ: Mapping[str, str] | None = None,
    clock: Clock = WALL,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Summary:
    """Run a whole batch job: validate, size, admit against headroom, collect, resubmit, until every request is final.

    Rerunning with the same input and state directory resumes. `on_result(custom_id, result)`
    is called once per final result, after it is committed; a resumed run (a rerun of a finished job too) first
    hands it every result earlier runs committed. Set `stop` to end the run at the
    next safe point (it raises `Interrupted`, resumable). With `prepare_only`, it plans and preflights the input and
    records the job (or, on a rerun, checks it is the same input), sends nothing, and returns the job's summary as
    it stands: an orchestrator's first step on a worker, before the loop runs elsewhere (gatekeeper.airflow). With
    `continue_only` (that second step), it only continues a job already recorded: where the journal holds none (a
    state directory not shared with the machine that prepared it), `JobMissing` is raised before anything is
    created or sent. Creates go through `ledger`, else `settings.ledger`: by default this host's, in the state folder
    `environ` names (`choose_ledger`; None: this process's environment, read here and nowhere deeper). Every reading
    of time and every wait of the run is on `clock` (the real one by default; a simulation hands down its own);
    `transport` replaces the network under the API's client.
    """
    settings = settings or SubmitSettings()
    # (before anything is recorded: an unwritable state folder is said, and leaves nothing behind)
    chosen = None if ledger is not None else choose_ledger(settings.ledger, os.environ if environ is None else environ)
    path, state_dir, spooled = resolve_source(source, settings)
    if continue_only and not settings.journal and not (state_dir / Journal.FILE).is_file():
        raise JobMissing(f"no job was prepared in {state_dir} on this machine", where=str(state_dir))
    if not spooled:  # a missing or unreadable input is said before the API is called
        stream, _, _ = open_source(path)
        if stream is not None:
            stream.close()
    if settings.out is not None:
        check_writable(os.fspath(settings.out))  # before the state directory exists: a bad path is never journaled
    async with job_journal(source, path, spooled, state_dir, settings, config, clock.now) as journal:
        if continue_only and not journal.initialized:
            raise JobMissing(f"no job {journal.job!r} was prepared in {journal.where}", where=journal.where)
        results_at = out_path(settings, journal)
        if spooled:
            _spool_for(source, path, journal)
        config = kept_version(config, journal)
        ledger = ledger or _ledger_of(chosen, journal, settings, config, clock)
        emit = on_event or (lambda e, f: None)
        try:
            async with connect(config, retry=retry, max_rpm=settings.max_rpm, on_retry=_retry_events(on_event),
                               clock=clock, transport=transport) as conn:
                loop = SubmitLoop(path, settings, conn, journal, out_path=results_at, emit=emit, stop=stop or anyio.Event(),
                                  on_result=on_result, ledger=ledger, prices=prices, clock=clock.now, sleep=clock.sleep)
                await ledger.ping()  # an unreachable ledger is reported before anything is sent
                beats = [lambda: heartbeat(ledger, emit, clock.sleep)]
                if journal.job:
                    beats.append(lambda: lease_heartbeat(journal, settings.lease_ttl, emit))  # (the server's clock)
                return await beside(lambda: _steps(loop, ledger, stop, prepare_only, clock.sleep), *beats)
        finally:
            await give_up_claim(ledger)
            await ledger.close()


def _ledger_of(chosen: LedgerChoice | None, journal: Journal, settings: SubmitSettings, config: ApiConfig,
               clock: Clock) -> Ledger:
    """The ledger chosen, opened for this job: its owner stable across reruns, this process recorded there."""
    assert chosen is not None
    return open_ledger(chosen.url, owner=ledger_owner(journal), ttl=settings.ledger_ttl, margin=settings.margin,
                       namespace=config.scope, liveness=liveness(registered=True, workspace=config.workspace_print()), clock=clock.now)


async def _steps(loop: SubmitLoop, ledger: Ledger, stop: anyio.Event | None, prepare_only: bool, sleep: Sleep) -> Summary:
    """The job run to its end; or, `prepare_only`, prepared and its summary as it stands."""
    if not prepare_only:
        return await _stoppable(stop, loop.prepare, loop.run, busy=loop.busy, waiting=loop.say_waiting, sleep=sleep)  # type: ignore[no-any-return]
    await _stoppable(stop, loop.prepare, sleep=sleep)
    await ledger.release_all()  # (the run that continues the job claims it again)
    return loop.summary()


def _spool_for(source: Source, path: str, journal: Journal) -> None:
    """An iterable input as the job's file: a shared journal's own spool, a new job's, or a rerun's checked."""
    if journal.job:
        adopt_spool(path, journal)
    elif not journal.initialized:
        spool(source, path)  # type: ignore[arg-type]
    else:
        check_respool(source, path, journal)  # type: ignore[arg-type]


UNRECORDED_VERSION = "2023-06-01"  # what a job recorded before versions were kept ran under (the only version then)


def kept_version(config: ApiConfig, journal: Journal) -> ApiConfig:
    """The API version a job keeps: the one it started with (its journal's), whatever the environment says when no
    version is asked; a rerun that asks for another is refused (its lines were judged by the first one's rules). A
    job recorded before versions were kept ran under 2023-06-01, the only one there was."""
    if not journal.initialized:
        return config
    started = (journal.get_meta("settings") or {}).get("api_version") or UNRECORDED_VERSION
    if config.api_version is not None and config.api_version != started:
        raise UsageError(f"this job started with API version {started} and keeps it (its lines were judged by that "
                         f"version's rules): rerun without --api-version/GATEKEEPER_API_VERSION, or with {started}",
                         setting="api_version")
    return dataclasses.replace(config, api_version=started)


STOP_GRACE = 1.0  # seconds a stopped run has to reach a safe point of its own before its step is cut short


async def _stoppable(stop: anyio.Event | None, *steps: Callable[[], Awaitable[Any]],
                     busy: Callable[[], bool] = lambda: False, waiting: Callable[[], None] = lambda: None,
                     sleep: Sleep = anyio.sleep) -> Any:
    """Run `steps` in turn (the last one's result), cut short `STOP_GRACE` seconds after `stop` is set when they have
    not stopped by then. Every await of a run is a safe point: a transaction or a results file being written rolls
    back, an intent is reconciled on resume, planning is abandoned before anything is recorded. So a stop lands in
    a second or two in every phase: planning, sampling, preflight, creating, collecting; and, while `busy()` (a create
    or real-time calls out), up to the lane's wait for them: a create cut off would leave an outcome to reconcile
    (another job's batch to tell from ours), a call cut off a possible double charge."""
    async def run_steps() -> Any:
        last = None
        for step in steps:
            last = await step()
        return last

    async def cut() -> None:
        assert stop is not None
        await stop.wait()
        await sleep(STOP_GRACE)
        if busy():
            waiting()
        waited = 0.0
        while busy() and waited < CALLS_OUT_WAIT:  # (on the run's clock, as every wait)
            await sleep(0.05)
            waited += 0.05
        raise Interrupted("interrupted")  # (ends the steps where they are: every await is a safe point)

    return await beside(run_steps, *([cut] if stop is not None else []))


def _retry_events(on_event: EventSink | None) -> Callable[[dict[str, Any]], None] | None:
    """Every retried call as a "retrying" event: nobody waits for an answer in silence."""
    if on_event is None:
        return None
    return lambda fields: on_event("retrying", fields)


def submit_sync(
    source: Source,
    *,
    config: ApiConfig,
    settings: SubmitSettings | None = None,
    on_event: EventSink | None = None,
    on_result: ResultSink | None = None,
    ledger: Ledger | None = None,
    retry: RetryPolicy | None = None,
    prices: PriceTable | None = None,
    prepare_only: bool = False,
    continue_only: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Summary:
    """`submit` for code that is not async: the same job, the same arguments (a stop is a KeyboardInterrupt)."""
    return anyio.run(lambda: submit(source, config=config, settings=settings, on_event=on_event, on_result=on_result,
                                    ledger=ledger, retry=retry, prices=prices, prepare_only=prepare_only,
                                    continue_only=continue_only, environ=environ))


async def dry_run(
    source: Source, *, config: ApiConfig, settings: SubmitSettings | None = None, prices: PriceTable | None = None,
    on_event: EventSink | None = None,
) -> DryRun:
    """Plan plus live headroom: what would go now, what would wait, and the queue after. Creates nothing.
    `on_event` hears of retried calls ("retrying")."""
    settings = settings or SubmitSettings()
    if not isinstance(source, (str, os.PathLike)):
        raise UsageError("dry_run takes a path")
    async with connect(config, max_rpm=settings.max_rpm, on_retry=_retry_events(on_event)) as conn:
        h = await read_headroom(conn, ceiling=settings.ceiling)
        size = batch_size_for(h.ceiling, settings.margin, settings.limits.max_requests)
        report = await plan_checked(source, conn.primary if settings.preflight else None,
                                    limits=Limits(max_requests=size, max_bytes=settings.limits.max_bytes,
                                                  api_version=config.version),
                                    token_sample=settings.token_sample)
    sizes = [b.requests for b in report.batches]
    free = room(h.ceiling, h.depth, settings.margin, 0)
    now = admit(sizes, free, in_flight=0, max_in_flight=settings.max_in_flight)
    prices = prices or load_prices()
    return DryRun(
        plan=report, estimate=report.estimate(prices), caching=report.caching(prices), batch_size=size, ceiling=h.ceiling,
        ceiling_source=h.ceiling_source, depth=h.depth, remaining=h.remaining, would_create_now=now,
        requests_now=sum(sizes[:now]), would_wait=len(sizes) - now, queue_after=h.depth + sum(sizes[:now]),
        policy="unknown ceiling: the first batch is tried and a bound learned from refusals" if h.ceiling is None else
        f"batches of at most {size:,} requests, four to the ceiling",
    )


async def preflight(source: Source, *, config: ApiConfig, limits: Limits | None = None,
                    max_rpm: float | None = None, on_event: EventSink | None = None) -> PlanReport:
    """`plan` with every line judged against the live Models API and the input tokens measured with count_tokens.

    `report.preflight` says whether the models were checked (and, per model, the resolved id, its max_tokens and
    the lines it rejected); `report.calibration` the measured tokens per byte. Never raises for a Models API that
    is missing or failing: the report says the models were not checked.
    """
    async with connect(config, max_rpm=max_rpm, on_retry=_retry_events(on_event)) as conn:
        # (judged by the rules of the version it will be sent with)
        return await plan_checked(source, conn.primary,
                                  limits=(limits or Limits()).under(config.version))


async def cancel(state_dir: str | os.PathLike[str], *, config: ApiConfig, max_rpm: float | None = None,
                 journal: str | None = None, job: str | None = None, on_event: EventSink | None = None) -> Canceled:
    """Cancel the run's live batches; a rerun of submit then sends nothing new and collects what ended.

    A batch the credentials may not cancel (a 403: an IAM policy without the cancel action) is in
    `Canceled.refused`, journaled: it runs on, no run asks again, and submit collects it when it ends.

    The cancel is recorded before any batch is touched, so even a cancel cut short
    stops every later submit of this job from creating more. A batch that has
    already ended (400, 404 or 409 on cancel) counts as not running; the others are
    still canceled.
    """
    j = open_job(state_dir, journal=journal, job=job, readonly=False)
    try:
        j.set_meta("user_canceled", True, "user_canceled")
        # The batches it cancels stay canceled by the user after --resume-canceled lifts the cancel: their canceled
        # lines are final whichever run collects them (and an unknown create's batch, reconciled later, too).
        live = [r.idx for r in j.batches(BatchState.CREATED, BatchState.INTENT)]
        j.set_meta("canceled_batches", sorted({*(j.get_meta("canceled_batches") or []), *live}))
        canceled: list[CanceledBatch] = []
        refused: list[CanceledBatch] = []
        permission = None
        async with connect(config, max_rpm=max_rpm, on_retry=_retry_events(on_event)) as conn:
            # (An unknown create has no id yet: the next submit reconciles it and, the cancel recorded, cancels it.)
            for row in j.batches(BatchState.CREATED):
                assert row.batch_id is not None
                status = await cancel_batch(conn.primary, j, row)  # (a 403: the batch runs on, the mark stays)
                (refused if status == REFUSED else canceled).append(CanceledBatch(row.idx, row.batch_id, status))
            if refused:
                permission = conn.primary.calls.platform.permission("cancel")
        # (requests moved to the real-time lane and not yet called are never sent either)
        return Canceled(tuple(canceled), sum(b.requests for b in j.batches(BatchState.PLANNED)) + j.lane.queued(),
                        len(j.batches(BatchState.INTENT)), tuple(refused), permission)
    finally:
        j.close()


def job_summary(state_dir: str | os.PathLike[str], prices: PriceTable | None = None, *, journal: str | None = None,
                job: str | None = None) -> Summary:
    """How a job stands, from its journal alone: in `state_dir`, or the job named `job` in a shared `journal`."""
    j = open_job(state_dir, journal=journal, job=job)
    try:
        return summarize(j, str(j.get_meta("output") or Path(state_dir) / "results.jsonl"), prices=prices)
    finally:
        j.close()



