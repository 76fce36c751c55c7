"""One batch's job, as the library runs any job: `submit` on the batch's requests (split, admitted against the
ceiling with its tenant's priority and share, resubmitted where it can succeed, recovered after lost answers),
`cancel` when its tenant canceled it; then the request_counts the book reports, and result lines for the requests
the job never sent, so that the results hold exactly one line a request."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import anyio
import orjson

from .._errors import GatekeeperError
from ..api._config import ApiConfig
from ..run._submit import cancel, submit
from ..run.shared._results import export
from ..run.shared._settings import SubmitSettings
from ..run.shared._summary import Summary
from ..state._gateway import BatchRecord
from ..state._journal import Journal
from ..state._output import replacing
from ._keys import Tenant
from ._settings import GatewaySettings

Emit = Callable[[str, dict[str, Any]], None]
CANCELED = {"type": "canceled"}


def job_name(batch_id: str) -> str:
    """The job's name in a shared (PostgreSQL) journal."""
    return f"gateway-{batch_id}"


def job_settings(record: BatchRecord, settings: GatewaySettings, tenant: Tenant) -> SubmitSettings:
    """The batch's job as `submit` runs it: its folder, the gateway's shared ledger with its tenant's priority and
    share, no preflight or token sample (the API judges params when it processes them, as it would for the client),
    and never refused as a duplicate of another tenant's identical requests."""
    return SubmitSettings(
        state_dir=settings.job_dir(record.id), out=settings.results_path(record.id), ceiling=settings.ceiling,
        margin=settings.margin, interval=settings.interval, reconcile_grace=settings.reconcile_grace,
        max_attempts=settings.max_attempts, ledger=settings.ledger_url(),
        ledger_ttl=settings.ledger_ttl, priority=tenant.priority, share=tenant.share, max_rpm=settings.max_rpm,
        allow_duplicate=True, preflight=False, token_sample=0, journal=settings.journal,
        job=job_name(record.id) if settings.journal else None, lease_ttl=settings.lease_ttl,
    )


async def run_job(record: BatchRecord, *, settings: GatewaySettings, config: ApiConfig, tenant: Tenant,
                  canceling: bool, stop: Any, emit: Emit) -> dict[str, int]:
    """The job run to its end (resumed where an earlier run left it); its request_counts. A canceled batch's cancel
    is recorded in its journal first (live batches canceled, nothing new sent), then the run collects what ended."""
    config = dataclasses.replace(config, api_version=record.api_version)
    job = settings.journal and job_name(record.id)
    if canceling:
        if not settings.journal and not (settings.job_dir(record.id) / Journal.FILE).exists():
            emit("job_canceled_unsent", {"batch": record.id, "requests": record.requests})
            return await anyio.to_thread.run_sync(lambda: unsent_results(record, settings, None, canceled=True))
        await cancel(settings.job_dir(record.id), config=config, journal=settings.journal, job=job or None)
    settings.job_dir(record.id).mkdir(mode=0o700, exist_ok=True)  # (its results file's folder, before submit checks it)
    summary = await submit(str(settings.input_path(record.id)), config=config, settings=job_settings(record, settings, tenant),
                           stop=stop, on_event=lambda event, fields: emit(event, {"batch": record.id, **fields}))
    return await anyio.to_thread.run_sync(lambda: unsent_results(record, settings, summary, canceled=canceling))


def unsent_results(record: BatchRecord, settings: GatewaySettings, summary: Summary | None, *,
                   canceled: bool) -> dict[str, int]:
    """The batch's request_counts, with a result line written (unsent.jsonl) for each request its job never sent:
    `canceled`, as the API ends the requests of a canceled batch it never processed, or, for a line the job's own
    plan refused, `errored` with the reason. (Blocking: run it in a thread.)"""
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if summary is not None:
        counts.update(succeeded=summary.succeeded, errored=summary.errored, canceled=summary.canceled, expired=summary.expired)
        if summary.pending and not canceled:
            raise GatekeeperError(f"the job of {record.id} ended with {summary.pending} requests unanswered")
        if not summary.pending and not summary.invalid:
            settings.unsent_path(record.id).unlink(missing_ok=True)
            return counts
    answered = _answered(settings, record) if summary is not None else set()
    refused = _refused(settings, record) if summary is not None and summary.invalid else {}
    with open(settings.input_path(record.id), "rb") as src, \
            replacing(str(settings.unsent_path(record.id)), "the results of requests never sent") as out:
        for line in src:
            cid = str(orjson.loads(line).get("custom_id"))
            if cid in answered:
                continue
            why = refused.get(cid)
            result: dict[str, Any] = CANCELED if why is None else {"type": "errored", "error": {
                "type": "error", "error": {"type": "invalid_request_error", "message": why}, "request_id": None}}
            counts["canceled" if why is None else "errored"] += 1
            out.write(orjson.dumps({"custom_id": cid, "result": result}) + b"\n")
    return counts


def _answered(settings: GatewaySettings, record: BatchRecord) -> set[str]:
    """The custom_ids the job's results file answers."""
    try:
        with open(settings.results_path(record.id), "rb") as f:
            return {str(orjson.loads(line).get("custom_id")) for line in f if line.strip()}
    except FileNotFoundError:
        return set()


def _refused(settings: GatewaySettings, record: BatchRecord) -> dict[str, str]:
    """custom_id -> why, for each line the job's plan refused (none, normally: the create was judged alike)."""
    buf = io.BytesIO()
    export(settings.job_dir(record.id), buf, only=["rejected"], journal=settings.journal,
           job=job_name(record.id) if settings.journal else None)
    out = {}
    for line in buf.getvalue().splitlines():
        obj = orjson.loads(line)
        out[str(obj.get("custom_id"))] = str(obj.get("result", {}).get("reason"))
    return out
