"""One gatekeeper job as Airflow runs it: what the operator hands the trigger (`JobSpec`, plain and serializable),
the job run to its end or only prepared, the results delivered where the pipeline reads them, and the small summary
that becomes the task's XCom. Shared by the operator (worker) and the trigger (triggerer); Airflow is imported
only for connections, object storage and configuration."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from .._errors import GatekeeperError, JobMissing, UsageError
from ..api._config import ApiConfig
from ..run._submit import cancel, submit
from ..run.shared._beside import beside
from ..run.shared._settings import SubmitSettings
from ..run.shared._summary import Summary
from ..state._output import replacing
from ._connection import api_config, connection_url

STOP_POLL = 0.2  # seconds between looks at a stop asked from another thread


@dataclass(frozen=True)
class JobSpec:
    """Everything the trigger needs to continue the job: no key, no password (connections go by id)."""

    conn_id: str
    input_path: str
    state_dir: str
    results_path: str | None
    journal: str | None  # None: SQLite in state_dir; a postgresql:// URL, or the id of an Airflow Postgres connection
    job: str | None  # the job's name in a shared journal
    ledger: str | None  # a ledger URL, or the id of an Airflow connection to one
    ceiling: int | None
    budget: float | None
    max_attempts: int
    poll_interval: float
    prepared_on: str = ""  # the host whose `execute` prepared the job (named when a trigger cannot find it)
    state_base: str | None = None  # the operator's state_dir argument: each machine resolves the folder by one rule
    deadline: float | None = None  # wall seconds, resolved once when the task prepared the job (so a trigger keeps it)
    api_version: str | None = None  # the anthropic-version asked for (None: the job's, else 2023-06-01)
    table: dict[str, Any] | None = None  # a table job: its `TableSpec` as plain data (`input_path` is the table)
    run: str | None = None  # a table job's run: the name of the file of its unanswered requests, by their content
    aliases: list[str] = field(default_factory=list)  # a table job's names before (its answers kept under them too)
    priority: str = "normal"  # on a shared ledger (see decide._shares)
    share: float = 1.0

    def here(self) -> JobSpec:
        """This job as this machine sees it: its state folder resolved by the same rule as on the worker (the
        operator's argument, else this machine's `[gatekeeper] state_dir`, else its $AIRFLOW_HOME; a table job's,
        else the table's folder in this machine's user state folder)."""
        name = self.job or os.path.basename(self.state_dir)
        if self.table is not None:
            from ._table import table_folder

            return replace(self, state_dir=str(table_folder(self.state_base, name, self.input_path)))
        return replace(self, state_dir=str(state_base(self.state_base) / name))

    def for_run(self) -> JobSpec:
        """The JSONL job a table job's run is: its requests, its state directory, its name in a shared journal."""
        if self.run is None:
            return self
        runs = Path(self.state_dir) / "runs"
        return replace(self, input_path=str(runs / f"{self.run}.jsonl"), state_dir=str(runs / f"{self.run}.gatekeeper"),
                       job=f"{self.job}.{self.run}", table=None, run=None)

    def to_kwargs(self) -> dict[str, Any]:
        return asdict(self)


def connection_config(conn_id: str) -> ApiConfig:
    """The ApiConfig of an Airflow connection (a blocking call: off any event loop)."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    return api_config(conn_id, conn.password, conn.host, conn.extra_dejson, login=conn.login, conn_type=conn.conn_type)


def _url(value: str | None) -> str | None:
    """A URL as given (or a ledger's "host" or "none"), or the URL of the Airflow connection named so."""
    if not value or "://" in value or value in ("host", "none", "local"):
        return value
    from airflow.sdk import BaseHook

    return connection_url(BaseHook.get_connection(value))


def state_base(given: str | None) -> Path:
    """Where local state directories go: the operator's argument, else `[gatekeeper] state_dir`, else
    $AIRFLOW_HOME/gatekeeper."""
    if given:
        return Path(given)
    configured = configured_state_dir()
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(configured) if configured else Path(home) / "gatekeeper"


def configured_state_dir() -> str | None:
    """`[gatekeeper] state_dir`, when this machine's Airflow configuration sets it."""
    from airflow.sdk import conf

    return conf.get("gatekeeper", "state_dir", fallback=None) or None


def settings_of(spec: JobSpec) -> SubmitSettings:
    return SubmitSettings(
        state_dir=Path(spec.state_dir), ceiling=spec.ceiling, budget=spec.budget, max_attempts=spec.max_attempts,
        interval=spec.poll_interval, journal=_url(spec.journal), job=spec.job if spec.journal else None,
        ledger=_url(spec.ledger), deadline=spec.deadline, priority=spec.priority, share=spec.share,
    )


def run_job(spec: JobSpec, config: ApiConfig, *, prepare_only: bool = False, continue_only: bool = False,
            stop: threading.Event | None = None) -> Summary:
    """The job run in this thread to its end (or only prepared; or, `continue_only`, only continued: the trigger
    never starts a job afresh): a stop asked through `stop`, from any thread, ends it at its next safe point
    (`Interrupted`, resumable)."""
    async def main() -> Summary:
        ended = anyio.Event()

        async def relay() -> None:  # (an anyio.Event is set from its own loop's thread only)
            if stop is None:
                await anyio.sleep_forever()
            while stop is not None and not stop.is_set():
                await anyio.sleep(STOP_POLL)
            ended.set()

        asked = replace(config, api_version=spec.api_version) if spec.api_version else config
        return await beside(lambda: submit(spec.input_path, config=asked, settings=settings_of(spec), stop=ended,
                                           prepare_only=prepare_only, continue_only=continue_only), relay)

    try:
        return anyio.run(main)
    except JobMissing as exc:
        raise JobMissing(f"the trigger on {socket.gethostname()} cannot find the job {spec.job!r} that `execute` "
                         f"prepared on {spec.prepared_on or 'the worker'} ({exc.where})", where=exc.where) from None


def cancel_job(spec: JobSpec, config: ApiConfig) -> int:
    """Cancel the job's live batches as `gatekeeper cancel` does (recorded in its journal); how many were live."""
    settings = settings_of(spec)
    done = anyio.run(lambda: cancel(spec.state_dir, config=config, journal=settings.journal, job=settings.job))
    return len(done.batches)


def deliver(summary: Summary, results_path: str | None) -> str:
    """Copy the finished results file, byte for byte, to `results_path` (a local path, or an object-storage URL
    read by Airflow's ObjectStoragePath); where it now is."""
    if not results_path:
        return summary.output
    if "://" in results_path:
        from airflow.sdk import ObjectStoragePath

        target = ObjectStoragePath(results_path)
        target.parent.mkdir(parents=True, exist_ok=True)  # (a folder on a file system; nothing on a bucket store)
        with open(summary.output, "rb") as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        return str(target)
    Path(results_path).parent.mkdir(parents=True, exist_ok=True)
    with open(summary.output, "rb") as src, replacing(results_path, "the results") as dst:  # (whole or not at all)
        shutil.copyfileobj(src, dst, 1 << 20)
    return results_path


def finished(spec: JobSpec, summary: Summary) -> dict[str, Any]:
    """The job ended: its results delivered (a table job's answers kept and its result table written); the task's
    small summary."""
    if spec.table is not None:
        from ._table import finish_table

        return finish_table(spec, summary)
    return small_summary(summary, deliver(summary, spec.results_path))


def small_summary(summary: Summary, output: str) -> dict[str, Any]:
    """What the task returns as its XCom: counts, cost, where the results are, the job. A few hundred bytes, whatever
    the job's size."""
    return {"job": summary.job or os.path.basename(summary.state_dir), "output": output, "requests": summary.requests,
            "succeeded": summary.succeeded, "errored": summary.errored, "expired": summary.expired,
            "canceled": summary.canceled, "invalid": summary.invalid, "batches": summary.batches,
            "resubmitted": summary.resubmitted, "cost_usd": summary.cost_usd, "complete": summary.complete,
            "ok": summary.ok, "state_dir": summary.state_dir,
            "lanes": {k: v["requests"] for k, v in summary.lanes.items()},
            "deadline_met": None if summary.deadline is None else summary.deadline["met"]}


def failure(exc: BaseException) -> dict[str, Any]:
    """A trigger event for a job that stopped on an error: its message (keys are never in one) and exit code."""
    code = int(exc.exit_code) if isinstance(exc, GatekeeperError) else 1
    return {"status": "error", "message": f"{type(exc).__name__}: {exc}", "exit_code": code,
            "usage": isinstance(exc, UsageError)}
