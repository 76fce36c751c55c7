"""The operator: plan and record the job on a worker, defer the loop to the triggerer, deliver and report."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from .._errors import GatekeeperError
from ..api._config import ApiConfig
from ..decide._deadline import parse_deadline
from ..run.shared._opening import job_name_of, recorded_in
from ._job import JobSpec, _url, cancel_job, connection_config, failure, finished, run_job, state_base
from ._trigger import GatekeeperTrigger

ON_KILL_WAIT = 60.0  # seconds `on_kill` waits for the cancel calls


JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _table_where(where: str) -> str:
    """A table's path made absolute; an object-storage URI as given."""
    from ..tables._names import SCHEMES

    return where if where.startswith(SCHEMES) else os.path.abspath(where)


class GatekeeperSubmitOperator(BaseOperator):
    """
    Submit a JSONL of Message Batches requests through gatekeeper: split into legal batches, admitted against the
    organization's queue ceiling, collected, resubmitted where another try can succeed, exactly once.

    ``execute`` validates and sizes the input on the worker (with the Models API's preflight and a token sample),
    records the job in its journal, then defers: the trigger runs admission, collection and resubmission in the
    triggerer, holding no worker slot, and fires when every request is final, having copied the results file to
    ``results_path``; ``execute_complete`` returns the small summary it fired with. The trigger only continues the
    job ``execute`` recorded: on a triggerer that cannot see it (a state folder not shared, and no PostgreSQL
    ``journal``) it fails at once, naming what is missing, and sends nothing. Every rerun (a retry, a cleared task, another
    Dag run over the same input, a restarted triggerer, a killed worker) continues the same job from its journal:
    no batch is created twice. Retries are safe: prefer ``retries >= 1``.

    :param input_path: the requests, one ``{"custom_id", "params"}`` a line; readable by the workers and the
        triggerers. (templated)
    :param results_path: where the finished results go: a local path, or an object-storage URL
        (``s3://conn_id@bucket/key`` as ``ObjectStoragePath`` reads it); None leaves them in the state directory.
        (templated)
    :param conn_id: an Anthropic connection: password the workspace key, host an optional base URL, extra
        ``admin_key`` (to read the queue's ceiling) and ``extra_workspace_keys``.
    :param journal: None for a SQLite journal in the job's state directory (one machine), or a ``postgresql://``
        URL or the id of an Airflow Postgres connection (several workers and triggerers).
    :param job: the job's name (templated); default, as the CLI names it, from the input's content and the key.
    :param ledger: a shared ledger (``redis://``, ``postgresql://``, ``sqlite:///`` URL, or a connection id) when
        several pipelines on several machines share one queue ceiling; default: ``GATEKEEPER_LEDGER`` where the job
        runs, else that machine's own (``"host"``); ``"none"`` opts out (ownership after a lost create answer then
        rests on usage alone).
    :param ceiling: the queue ceiling to keep under, when no Admin key can read it.
    :param budget: USD at most, at batch prices, worst case counted (both lanes, with a deadline).
    :param api_version: the anthropic-version sent on every call: ``"2023-06-01"`` (the default) or
        ``"2026-10-21"`` (its refused parameters reject a line before anything is sent). A job keeps the version it
        started with.
    :param deadline: finish by then (templated): a duration from when the task starts (``"6h"``) or an ISO 8601
        time (``"{{ data_interval_end.add(hours=6).isoformat() }}"``); what the batch lane is projected to miss goes
        through the real-time Messages API at standard prices. Resolved once, when the task prepares the job.
    :param max_attempts: tries a request gets at most.
    :param poll_interval: seconds between readings of the queue while the job runs.
    :param deferrable: run the loop in the triggerer (default); False runs the same loop on the worker.
    :param fail_on_findings: fail the task when the job ended with findings (rejected lines, requests that did not
        succeed); by default it succeeds and the summary counts them.
    :param state_dir: where local state directories go (default ``[gatekeeper] state_dir``, else
        ``$AIRFLOW_HOME/gatekeeper``); each job's is a folder named after the job.
    :param priority: on a shared ``ledger``: ``"high"``, ``"normal"`` (default) or ``"low"``; while a job of higher
        priority waits for room, lower ones admit nothing new (docs/ledger.md).
    :param share: on a shared ``ledger``: room freed goes to the waiting jobs of one priority in proportion to their
        shares (default 1).
    :param template: a table job (docs/tables.md): ``input_path`` is a table (Parquet, CSV or Arrow IPC, a path or an
        ``s3://``, ``gs://`` or ``az://`` URI, which a triggerer on any machine reads the same) and each row's request
        is this text with ``{column}`` fields (or ``@path``, read on the worker); with ``model`` and ``max_tokens``,
        and optionally ``system``, ``id_column`` and ``request_params`` (more request params). Only the rows not answered by
        an earlier run are sent; the result table (every input row, then its result columns) goes to
        ``results_path`` (by suffix; object storage through pyarrow, credentials from the cloud's standard
        environment), else ``result.parquet`` in the job's folder. Not templated by Jinja: its ``{{``/``}}`` are
        literal braces.
    """

    template_fields: Sequence[str] = ("input_path", "results_path", "job", "deadline")

    def __init__(self, *, input_path: str, results_path: Any = None, conn_id: str = "anthropic_default",
                 journal: str | None = None, job: str | None = None, ledger: str | None = None,
                 ceiling: int | None = None, budget: float | None = None, max_attempts: int = 3,
                 poll_interval: float = 60, deferrable: bool = True, fail_on_findings: bool = False,
                 state_dir: str | None = None, deadline: str | None = None, api_version: str | None = None,
                 template: str | None = None, system: str | None = None, model: str | None = None,
                 max_tokens: int | None = None, id_column: str | None = None,
                 request_params: dict[str, Any] | None = None, priority: str = "normal", share: float = 1.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.input_path = input_path
        self.results_path = results_path
        self.conn_id = conn_id
        self.journal = journal
        self.job = job
        self.ledger = ledger
        self.ceiling = ceiling
        self.budget = budget
        self.max_attempts = max_attempts
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.fail_on_findings = fail_on_findings
        self.state_dir = state_dir
        self.deadline = deadline
        self.api_version = api_version
        self.template = template
        self.system, self.model, self.max_tokens, self.id_column = system, model, max_tokens, id_column
        self.request_params = request_params
        if priority not in ("high", "normal", "low") or not share > 0:
            raise AirflowException(f"gatekeeper: priority={priority!r} must be high, normal or low and share={share!r} "
                                   "a positive number")
        self.priority, self.share = priority, float(share)
        self._spec: JobSpec | None = None

    def _table(self) -> dict[str, Any] | None:
        """A table job's spec as plain data (None: a JSONL job); a table given without a template is refused."""
        from ..tables._names import names_a_table

        if self.template is None:
            if names_a_table(os.fspath(self.input_path)):
                raise AirflowException(f"gatekeeper: {self.input_path} is a table: give template= (and model=, "
                                       "max_tokens=) to make its requests")
            return None
        from ..tables import _require_pyarrow

        try:
            _require_pyarrow()
            from ._table import table_json

            return table_json(self.template, self.model, self.max_tokens, system=self.system,
                              id_column=self.id_column, params=self.request_params)
        except GatekeeperError as exc:
            raise AirflowException(f"gatekeeper: {exc}") from None

    def _job_spec(self, config: ApiConfig) -> JobSpec:
        table, where = self._table(), os.fspath(self.input_path)
        self._no_secrets(table is not None)
        if table is None:
            found = recorded_in(_url(self.journal), state_base(self.state_dir))  # (a job named the old way goes on)
            name, where = self.job or job_name_of(where, config, recorded=found), os.path.abspath(where)
            aliases: tuple[str, ...] = ()
        else:
            from ._table import table_names

            name, aliases = (self.job, ()) if self.job else table_names(where, table, config, self.state_dir)
            where = _table_where(where)
        if not JOB_NAME.fullmatch(name) or name in (".", ".."):  # (it names a folder: never a path of its own)
            raise AirflowException(f"gatekeeper: job {name!r} must be 1-128 letters, digits, '.', '_' or '-' "
                                   "(it names the job's state folder)")
        return JobSpec(conn_id=self.conn_id, input_path=where, table=table,
                       state_dir=str(self._folder(name, where, table is not None)),
                       results_path=None if self.results_path is None else str(self.results_path),
                       journal=self.journal, job=name, ledger=self.ledger, ceiling=self.ceiling, budget=self.budget,
                       max_attempts=self.max_attempts, poll_interval=float(self.poll_interval),
                       prepared_on=socket.gethostname(), state_base=self.state_dir, deadline=self._deadline(),
                       api_version=self.api_version, priority=self.priority, share=self.share,
                       aliases=list(aliases))

    def _no_secrets(self, table: bool) -> None:
        """No password goes into the trigger's arguments, which are stored in Airflow's database: not a journal's
        or a ledger's, nor one in a table's URI or its result's."""
        for setting, value in (("journal", self.journal), ("ledger", self.ledger)):
            if value and "://" in value and urlsplit(value).password:
                raise AirflowException(f"gatekeeper: {setting}= carries a password, which would be stored with the "
                                       "trigger: give an Airflow connection id instead (or a URL without the password, "
                                       "with PGPASSWORD set on workers and triggerers)")
        if not table:
            return
        from ..tables._where import has_secret

        for setting, value in (("input_path", self.input_path), ("results_path", self.results_path)):
            if value and has_secret(os.fspath(value)):
                raise AirflowException(f"gatekeeper: {setting}= carries a credential, which would be stored with the "
                                       "trigger: give the cloud's standard credentials on workers and triggerers "
                                       "instead (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a role, ...)")

    def _folder(self, name: str, where: str, table: bool) -> Path:
        if not table:
            return state_base(self.state_dir) / name
        from ._table import table_folder

        return table_folder(self.state_dir, name, where)

    def _deadline(self) -> float | None:
        if not self.deadline:
            return None
        try:
            return parse_deadline(str(self.deadline), time.time())
        except ValueError as exc:
            raise AirflowException(f"gatekeeper: deadline={self.deadline!r}: {exc}") from None

    def execute(self, context: Any) -> Any:
        config = connection_config(self.conn_id)
        spec = self._spec = self._job_spec(config)
        try:
            if spec.table is not None:
                from ._table import prepare_table

                spec, answered = prepare_table(spec, config)
                self._spec = spec
                if answered is not None:  # (every row answered already: the result table is written; nothing to run)
                    return self._complete({"status": "success", "summary": answered})
            if not self.deferrable:
                summary = run_job(spec.for_run(), config)
                return self._complete({"status": "success", "summary": finished(spec, summary)})
            prepared = run_job(spec.for_run(), config, prepare_only=True)
        except GatekeeperError as exc:
            raise AirflowException(failure(exc)["message"]) from None
        self.log.info("gatekeeper: job %s recorded (%d requests, %d rejected lines); deferring to the triggerer",
                      spec.job, prepared.requests, prepared.invalid)
        self.defer(trigger=GatekeeperTrigger(**spec.to_kwargs()), method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._complete(event)

    def _complete(self, event: dict[str, Any] | None) -> dict[str, Any]:
        """The task's result from the trigger's event: its small summary, or the failure it reports."""
        if not event or event.get("status") not in ("success", "error"):
            raise AirflowException(f"gatekeeper: unexpected trigger event {event!r}")
        if event["status"] == "error":  # (a retry continues a job; it cannot mend a setting or a missing journal)
            remedy = "fix the setting, then clear the task" if event.get("usage") else "a retry continues the job"
            raise AirflowException(f"gatekeeper: {event['message']} (exit {event['exit_code']}); {remedy}")
        summary: dict[str, Any] = event["summary"]
        self.log.info("gatekeeper: %d of %d succeeded, %d errored, %d expired, %d canceled, %d rejected; cost %s; "
                      "results %s", summary["succeeded"], summary["requests"], summary["errored"], summary["expired"],
                      summary["canceled"], summary["invalid"], summary["cost_usd"], summary["output"])
        if self.fail_on_findings and not summary["ok"]:
            raise AirflowException(f"gatekeeper: the job ended with findings: {summary}")
        return summary

    def on_kill(self) -> None:
        """The task was killed while it ran on the worker: cancel the job's live batches (as `gatekeeper cancel`).

        Airflow calls this from its signal handler, possibly while `execute`'s own event loop runs in this thread:
        the cancel runs in a thread of its own."""
        config = connection_config(self.conn_id)
        spec = self._spec or self._job_spec(config)
        counted: list[int] = []
        worker = threading.Thread(target=lambda: counted.append(cancel_job(spec.for_run(), config)),
                                  name="gatekeeper-cancel")
        worker.start()
        worker.join(ON_KILL_WAIT)
        self.log.info("gatekeeper: %s live batch(es) of the job canceled", counted[0] if counted else "the")
