"""A table job in Airflow. `execute` renders the rows not answered yet into the job's run (a JSONL job named by its
content) on the worker; the trigger continues that run. Where the trigger's machine cannot see the worker's file, it
renders the rows again from the table's URI (object storage reads the same from any machine) and checks that it
made the same run. When the run has ended its answers are kept and the result table is written: to `results_path`
(Parquet, CSV or Arrow IPC by suffix, local or object storage through pyarrow), else the job's default result in its
folder (`result.parquet`, or its spec's own beside it: `tables._result`). A run of the job that did not finish (a
killed worker or triggerer) is collected on the worker first, as the CLI does. Imported only for a table job: a JSONL job never imports pyarrow."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

from .._errors import JobMissing
from .._prices import load_prices
from ..api._config import ApiConfig
from ..run.shared._summary import Summary
from ..tables._job import TableJob, TableResult, check_out, collect_earlier, job_names, open_answers, table_job
from ..tables._result import default_result
from ..tables._rows import TableSpec
from ..tables._where import default_state_dir
from ._job import JobSpec, configured_state_dir, settings_of, state_base


def table_json(template: str, model: str | None, max_tokens: int | None, *, system: str | None,
               id_column: str | None, params: dict[str, Any] | None) -> dict[str, Any]:
    """The operator's table arguments as the trigger gets them: templates read (`@path`) and checked on the worker."""
    if not model or not max_tokens:
        from .._errors import UsageError

        raise UsageError("a table job needs model= and max_tokens=", setting="model")
    return TableSpec.of(template, model, int(max_tokens), system=system, id_column=id_column, params=params).to_json()


def table_names(where: str, table: dict[str, Any], config: ApiConfig, given: str | None) -> tuple[str, tuple[str, ...]]:
    """A table job's default name: its table's identity (as the CLI's and the library's), its spec, its account;
    and the names it had before (their answers are read too). A job whose folder an earlier version made under its
    key-named name (below `state_dir=` or `[gatekeeper] state_dir`, else $AIRFLOW_HOME/gatekeeper) goes on under
    that name."""
    spec = TableSpec.from_json(table)
    name, also = job_names(where, Path("."), spec, config)
    base = state_base(given)
    for before in also:
        if (base / before).is_dir() and not (base / name).is_dir():
            return before, (name, *(a for a in also if a != before))
    return name, also


def table_folder(given: str | None, job: str, where: str) -> Path:
    """A table job's folder: the job's under the operator's `state_dir` or `[gatekeeper] state_dir`, when one is
    set; else the table's folder in the user's state folder, where the CLI and the library on this host keep the
    same table's answers (the job's folder under $AIRFLOW_HOME/gatekeeper, where an earlier version kept it, is
    used where it exists)."""
    if given or configured_state_dir():
        return state_base(given) / job
    before = state_base(None) / job
    return before if before.is_dir() else default_state_dir(where, os.environ)


def _job(spec: JobSpec) -> TableJob:
    """The table job; its answers beside its runs, or in its PostgreSQL journal (seen from every machine)."""
    assert spec.table is not None
    root = Path(spec.state_dir)
    return table_job(spec.input_path, TableSpec.from_json(spec.table), root,
                     open_answers(root, settings_of(spec).journal, spec.job, tuple(spec.aliases)))


def prepare_table(spec: JobSpec, config: ApiConfig) -> tuple[JobSpec, dict[str, Any] | None]:
    """The job with its run named (the rows not answered yet, written on this machine), or, when every row is
    answered or rejected, the small summary of the result table written at once. A run that did not finish is
    collected here first (sending nothing new)."""
    job = _job(spec)
    try:
        if job.unfinished():
            import anyio

            asked = dataclasses.replace(config, api_version=spec.api_version) if spec.api_version else config
            anyio.run(lambda: collect_earlier(job, asked, settings_of(spec), load_prices(), TableResult(), {},
                                              tuple(spec.aliases)))
        check_out(job.rows, spec.results_path or str(default_result(job.root, job.rows.spec)), job.root)
        pending, _ = job.pending()
        if pending is None:
            return spec, _written(job, spec, None)
        return JobSpec(**{**spec.to_kwargs(), "run": pending.stem}), None
    finally:
        job.close()


def render_again(spec: JobSpec) -> None:
    """Where this machine lacks the run's file, render it from the table; it must be the run `execute` named."""
    if spec.run is None or Path(spec.for_run().input_path).exists():
        return
    job = _job(spec)
    try:
        pending, _ = job.pending()
    finally:
        job.close()
    if pending is None or pending.stem != spec.run:
        raise JobMissing(f"the trigger on {socket.gethostname()} finds other unanswered rows in {spec.input_path} than "
                         f"`execute` found on {spec.prepared_on or 'the worker'} (the answers kept there are not "
                         "seen here)", where=spec.state_dir)


def finish_table(spec: JobSpec, summary: Summary) -> dict[str, Any]:
    """The run ended: keep its answers, write the result table; the task's small summary."""
    job = _job(spec)
    try:
        run = spec.for_run()
        job.settle(Path(run.input_path), journal=settings_of(run).journal, job=settings_of(run).job)
        return _written(job, spec, summary)
    finally:
        job.close()


def _written(job: TableJob, spec: JobSpec, summary: Summary | None) -> dict[str, Any]:
    result = TableResult(state_dir=spec.state_dir, summary=summary)
    if summary is not None:
        result.count(summary)
    job.write(spec.results_path, load_prices(), result, default=spec.results_path is None)  # (`_result`)
    return small_table_summary(spec, result)


def small_table_summary(spec: JobSpec, result: TableResult) -> dict[str, Any]:
    """The task's XCom for a table job: rows by status, what was sent, the cost, where the result table is."""
    by, run = result.by_status, result.summary
    rows = sum(by.values())
    return {"job": spec.job, "output": result.out, "rows": rows, "by_status": dict(by), "requests": rows,
            "sent": result.sent, "succeeded": by.get("succeeded", 0),
            "errored": by.get("errored", 0), "expired": by.get("expired", 0), "canceled": by.get("canceled", 0),
            "invalid": by.get("rejected", 0), "unsent": by.get("unsent", 0), "batches": result.batches,
            "resubmitted": 0 if run is None else run.resubmitted, "cost_usd": 0.0 if run is None else run.cost_usd,
            "complete": run is None or run.complete, "ok": by.get("succeeded", 0) == rows, "state_dir": spec.state_dir,
            "lanes": {} if run is None else {k: v["requests"] for k, v in run.lanes.items()},
            "deadline_met": None if run is None or run.deadline is None else run.deadline["met"]}
