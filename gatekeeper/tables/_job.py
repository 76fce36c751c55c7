"""A table job: the rows whose rendered request has no answer yet go out as an ordinary JSONL job (so the journal,
admission, exactly-once collection and every option of a JSONL job hold), their answers are kept by request, and
the result table joins every input row to its answer, in input order.

In the table's folder (`_where`, or `state_dir`): `answers.sqlite3` (every request's answer, and the runs settled,
across runs) and `runs/` (each run's requests, named by their content, with the run's own state directory). A run
that did not finish is collected before a new one is planned (`_runs`): what it had created is downloaded, its
answers kept, and what it never sent is planned again from the table as it is now, so nothing is bought twice
whatever changed in the table between a kill and the rerun.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from .._errors import GatekeeperError, JobLive, JobMissing, JournalError, OutputError
from .._prices import PriceTable, load_prices
from ..api._config import ApiConfig
from ..run.shared._settings import SubmitSettings, default_job_name
from ..state._answers import Answers
from ._io import TableSource
from ._judged import TableRows
from ._out import TableWriter, check_destination, writable_schema
from ._pending import Counts, pending_file
from ._result import claim_default, default_result
from ._rows import NOT_SENT, RESULT_COLUMNS, TableSpec, id_and_key, is_final, result_columns
from ._runs import discard, fresh_name, hold, let_go, quiet, recorded_run, run_dir, run_name, unfinished_runs
from ._where import default_state_dir, former_identity, identity, label, shown

if TYPE_CHECKING:
    from ..run.shared._summary import Summary

RESULT_ARROW_TYPES = {"custom_id": pa.string(), "status": pa.string(), "text": pa.string(), "stop_reason": pa.string(),
                "model": pa.string(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
                "cache_read_input_tokens": pa.int64(), "cache_creation_input_tokens": pa.int64(),
                "cost_usd": pa.float64(), "error": pa.string()}


@dataclass
class TableResult:
    """How a table job ended: rows by status; what its run sent (`sent`: requests answered by the API, in `batches`
    batches) and its summary (None: every row was answered already); the runs that had not finished and were
    collected first (`earlier`: each one's requests, those answered, its batches, all made by an earlier call); the
    result table (when no `out` was asked for) or where it was written (`out`, credentials masked); `grew`: the
    table had more rows than when it was judged (they wait for the next run)."""

    rows: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    batches: int = 0
    summary: Summary | None = None
    earlier: list[dict[str, Any]] = field(default_factory=list)
    out: str | None = None
    table: pa.Table | None = None
    state_dir: str = ""
    grew: bool = False
    canceled: bool = False  # a run collected first had been canceled (`cancel TABLE`): nothing new was sent
    shared: int = 0  # rows of this call's run whose request is an earlier row's: one request answers them all

    def count(self, summary: Summary) -> None:
        self.sent += summary.requests - summary.pending
        self.batches += summary.batches

    def unsent_reason(self) -> str:
        """Why a sound row has no answer, from the last run: its budget, a cancel, or a run that did not send it."""
        s = self.summary
        if s is not None and s.budget is not None and s.budget.get("held_back"):
            return "not sent: the budget was reached"
        if self.canceled or (s is not None and s.canceled_job is not None):
            return "not sent: the job was canceled"
        return NOT_SENT

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "by_status": self.by_status, "sent": self.sent, "batches": self.batches,
                "out": self.out, "state_dir": self.state_dir, "grew": self.grew, "earlier": self.earlier,
                "canceled": self.canceled, "shared": self.shared,
                "run": None if self.summary is None else self.summary.to_json()}


def open_answers(root: Path, journal: str | None, job: str | None, also: tuple[str, ...] = ()) -> Answers:
    """A table job's answers: beside its runs, or in its shared journal under its name (read under `also` too)."""
    if journal:
        assert job is not None
        return Answers.shared(journal, job, also)
    return Answers.local(root / "answers.sqlite3")


def table_job_name(where: str, spec: TableSpec, config: ApiConfig, *, legacy: bool = False) -> str:
    """A table job's default name in a shared journal: its table's identity and its spec, with the account it goes
    to (never a secret); `legacy`: with the key's digest instead, as an earlier version named it."""
    digest = hashlib.sha256(orjson.dumps([where, spec.to_json()], option=orjson.OPT_SORT_KEYS)).hexdigest()
    return default_job_name(digest, config.legacy_fingerprint() if legacy else config.fingerprint())


def job_names(where: str | None, root: Path, spec: TableSpec, config: ApiConfig) -> tuple[str, tuple[str, ...]]:
    """A table job's default name in a shared journal, by its table's identity (so the CLI from any folder, the
    library and the operator name it alike) and its account, and the names earlier versions gave it (by the key's
    digest, by the table as it was written, and by a URI's identity with its query): their answers are read too, and
    their runs found."""
    ident = str(root.resolve()) if where is None else identity(where)
    name = table_job_name(ident, spec, config)
    former = None if where is None else former_identity(where)
    before = [table_job_name(w, spec, config, legacy=True) for w in dict.fromkeys([ident, where or ident, former]) if w]
    if former is not None:
        before.append(table_job_name(former, spec, config))
    return name, tuple(b for b in dict.fromkeys(before) if b != name)


def check_out(rows: TableRows, where: str | None, root: Path) -> None:
    """Said before anything is sent: the result's format can hold the table's columns, its folder is there (or is
    the job's state folder, made before it is written)."""
    if where is not None:
        writable_schema(where, result_schema(rows.source.schema()))
        if os.path.dirname(os.path.abspath(where)) != os.path.abspath(root):
            check_destination(where)


def table_job(source: Any, spec: TableSpec, root: Path, answers: Answers) -> TableJob:
    """A table job over `source` (a path, a URI or a table in memory, whose stream is spooled beside the job)."""
    src = TableSource.of(source)
    if src.stream is not None and src.spool_dir is None:
        root.mkdir(parents=True, exist_ok=True)
        src.spool_dir = str(root)  # (on disk beside the job, not in a temporary folder that may be memory)
    return TableJob(TableRows(src, spec), root, answers)


def result_schema(schema: pa.Schema) -> pa.Schema:
    """The result table's columns: the input's, then the result columns."""
    return pa.schema([pa.field(f.name, f.type) for f in schema] + [pa.field(n, t) for n, t in RESULT_ARROW_TYPES.items()])


class TableJob:
    """One table job's files under `root`: the answers kept across runs, and its runs (`_runs`)."""

    def __init__(self, rows: TableRows, root: Path, answers: Answers) -> None:
        self.rows, self.root, self.answers = rows, root, answers
        self._held: list[int] = []  # the runs this process holds (`_runs.hold`), let go on `close`

    def unfinished(self) -> list[Path]:
        return unfinished_runs(self.root, self.answers)

    def pending(self) -> tuple[Path | None, Counts]:
        """The run of the requests not answered yet, held by this process from before its file is in place."""
        return pending_file(self.rows, self.answers, self.root / "runs", name=self._claim)

    def _claim(self, path: Path) -> Path:
        path = fresh_name(path, self.answers)
        fd = hold(path)
        if fd is None:
            raise JournalError(f"another gatekeeper is running the same requests of this table job now ({path}): "
                               "let it finish, or stop it first")
        self._held.append(fd)
        return path

    def settle(self, pending: Path, *, journal: str | None = None, job: str | None = None) -> None:
        """Keep what the run of `pending` answered (its journal in its state directory, or named `job` in the shared
        `journal`), and mark it settled."""
        _merge(self.answers, pending, run_dir(pending), journal, job)
        self.answers.settle(pending.stem)

    def write(self, where: str | None, prices: PriceTable, result: TableResult, *, default: bool = False) -> None:
        """Write the result table to `where` (None: kept in memory, `result.table`); `default`: to the job's default
        result file in its state folder instead (`_result`: its spec's own when another spec's is there)."""
        if default:
            where = str(claim_default(self.root, self.rows.spec))
        try:
            result.table = _write(self.rows, self.answers, prices, where, result)
        except OutputError as exc:
            if where is not None and os.path.dirname(os.path.abspath(where)) == os.path.abspath(self.root):
                exc.setting = "state_dir"  # (the result's default place, in the state folder: --state moves it)
            raise
        result.out = None if where is None else shown(where)
        result.rows, result.grew = sum(result.by_status.values()), self.rows.source.grew

    def close(self) -> None:
        for fd in self._held:
            let_go(fd)
        self._held = []
        self.answers.close()


async def submit_table(source: Any, spec: TableSpec, *, config: ApiConfig, settings: SubmitSettings | None = None,
                       out: str | os.PathLike[str] | None = None, prices: PriceTable | None = None,
                       encoding: str | None = None, infer_types: bool = False,
                       environ: Mapping[str, str] | None = None, **submit_options: Any) -> TableResult:
    """Send the table's unanswered rows as one job (any option of `submit` applies), keep their answers, and
    return the result table, one row per input row in input order (or write it to `out`: Parquet, CSV or Arrow
    IPC, local or object storage, whole or not at all). A run of this table job that did not finish is collected
    first. State: `settings.state_dir`, default the table's folder in the user's state folder (`environ`, default
    the process's, names it). A CSV is read as text in UTF-8 unless `encoding` or `infer_types` say otherwise."""
    return await run_table(source, spec, config=config, settings=settings, out=out, prices=prices, encoding=encoding,
                           infer_types=infer_types, environ=environ, **submit_options)


async def run_table(source: Any, spec: TableSpec, *, config: ApiConfig, settings: SubmitSettings | None = None,
                    out: str | os.PathLike[str] | None = None, default_out: bool = False,
                    prices: PriceTable | None = None, encoding: str | None = None, infer_types: bool = False,
                    environ: Mapping[str, str] | None = None, **submit_options: Any) -> TableResult:
    """`submit_table`; with `default_out` and no `out`, the result written to the job's default result file in its
    state folder (`_result`), as the CLI writes it."""
    settings = settings or SubmitSettings()
    src = TableSource.of(source, encoding=encoding, infer_types=infer_types)
    environ = environ if environ is not None else os.environ
    root = Path(settings.state_dir) if settings.state_dir is not None else \
        default_state_dir(src.where, environ, create=False)
    where = None if out is None else os.fspath(out)
    if src.stream is not None:  # (a stream given is spooled on disk beside the job, not in a folder that may be memory)
        root = root if settings.state_dir is not None else default_state_dir(src.where, environ)
        root.mkdir(parents=True, exist_ok=True)
        src.spool_dir = str(root)
    rows = TableRows(src, spec)
    default = default_out and where is None
    check_out(rows, str(default_result(root, spec)) if default else where, root)  # (a table refused: no state folder)
    if settings.state_dir is None:
        root = default_state_dir(src.where, environ)
    name, also = job_names(src.where, root, spec, config) if settings.journal and not settings.job else (settings.job, ())
    settings = replace(settings, label=settings.label or label(src.where))  # (not its run's hash: `status`, `ahead`)
    job = TableJob(rows, root, open_answers(root, settings.journal, name, also))
    prices = prices or load_prices()
    result = TableResult(state_dir=str(root))
    try:
        spent = await collect_earlier(job, config, replace(settings, job=name), prices, result, submit_options, also)
        pending, counts = (None, None) if result.canceled else job.pending()  # (a cancel holds for the run collecting it)
        budget = None if settings.budget is None else settings.budget - spent
        if pending is not None and (budget is None or budget > 0):
            runs = run_name(pending, name, config) if settings.journal else None
            run = replace(settings, state_dir=run_dir(pending), out=None, job=runs, budget=budget)
            result.summary = await _submit(pending, config, run, prices, submit_options)
            result.count(result.summary)
            result.shared = 0 if counts is None else counts.shared
            job.settle(pending, journal=settings.journal, job=runs)
        job.write(where, prices, result, default=default)
        return result
    finally:
        job.close()


async def _submit(pending: Path, config: ApiConfig, settings: SubmitSettings, prices: PriceTable,
                  options: dict[str, Any], **how: Any) -> Summary:
    from ..run._submit import submit  # (the run's modules: not imported by `plan_table`)

    try:
        return await submit(pending, config=config, settings=settings, prices=prices, **options, **how)
    except OutputError as exc:
        exc.setting = "state_dir"  # (a run's results file is in its state folder, never the table's --out)
        raise


async def collect_earlier(job: TableJob, config: ApiConfig, settings: SubmitSettings, prices: PriceTable,
                          result: TableResult, options: dict[str, Any], aliases: tuple[str, ...] = ()) -> float:
    """Finish every run of the job that did not (one live in another process is left to it), each counted in
    `result`; what they spent (USD, for the budget of the run that follows). `settings.job`: the table job's name
    in a shared journal (`aliases`: the names it had before, under which a run may have been recorded)."""
    spent = 0.0
    for pending in job.unfinished():
        fd = hold(pending)
        if fd is None:
            continue
        try:
            summary = await _collect(job, pending, config, settings, prices, options, aliases)
        except (JobLive, JournalError) as exc:
            if isinstance(exc, JobLive) or "another gatekeeper is running" in str(exc):
                continue  # (its journal is held: the run is live elsewhere)
            raise
        finally:
            let_go(fd)
        if summary is not None:
            result.earlier.append({"run": pending.stem, "requests": summary.requests,
                                   "answered": summary.requests - summary.pending, "batches": summary.batches})
            spent += float((summary.budget or {}).get("spent") or summary.cost_usd or 0.0)
            result.canceled = result.canceled or (summary.canceled_job is not None and not settings.resume_canceled)
    return spent


async def _collect(job: TableJob, pending: Path, config: ApiConfig, settings: SubmitSettings, prices: PriceTable,
                   options: dict[str, Any], aliases: tuple[str, ...] = ()) -> Summary | None:
    """Finish a run that did not: its answers kept from its journal when nothing of it is in flight (a local
    journal), else the run continued sending nothing new until what it created has ended; its file discarded when
    no job was recorded for it (nothing was sent: None)."""
    from ..run._submit import job_summary

    runs = recorded_run(pending, settings.journal, (settings.job, *aliases), config) if settings.journal else None
    state = quiet(pending, settings.journal, runs)
    if state is None:
        discard(pending)
        return None
    (options.get("on_event") or (lambda e, f: None))("collecting", {"run": pending.stem, "in_flight": not state})
    if state and not settings.journal:  # (a shared journal's run may be live on another machine: its lease says)
        try:
            job.settle(pending)
            return job_summary(run_dir(pending), prices)
        except GatekeeperError:
            pass  # (its results are not here: the run, continued, downloads them again)
    collect = replace(settings, state_dir=run_dir(pending), out=None, job=runs, collect_only=True, deadline=None)
    try:
        summary = await _submit(pending, config, collect, prices, options, continue_only=True)
    except JobMissing:
        discard(pending)
        return None
    job.settle(pending, journal=settings.journal, job=runs)
    return summary


def _merge(answers: Answers, pending: Path, run_dir: Path, journal: str | None, job: str | None) -> None:
    """Keep the run's results (and its lines refused before sending) under their requests' keys (memory: a chunk)."""
    from ..run.shared._results import export  # (as `run_name`'s)

    for only in (None, ["rejected"]):
        with open(pending, "rb") as requests:
            keeper = _Keeper(answers, map(id_and_key, requests))
            export(run_dir, keeper, in_order=True, only=only, journal=journal, job=job)  # type: ignore[arg-type]
            keeper.flush()


class _Keeper:
    """Where `export` writes a run's result lines: they come in input order, as the run's requests do (`lines`: each
    one's custom_id and key), so one walk of the requests beside them finds each one's key; kept a chunk at a time."""

    CHUNK = 10_000

    def __init__(self, answers: Answers, lines: Iterator[tuple[str, str]]) -> None:
        self.answers, self._lines = answers, lines
        self._kept: list[tuple[str, dict[str, Any], bool]] = []

    def write(self, line: bytes) -> int:
        found = orjson.loads(line)
        cid = found.get("custom_id")
        for at, key in self._lines:
            if at == cid:
                self._kept.append((key, found["result"], is_final(found["result"])))
                break
        else:  # (a result out of the requests' order would leave every later one unkept: never silently)
            raise JournalError(f"the run's result for {cid!r} is not in its requests' order: nothing after it was kept")
        if len(self._kept) >= self.CHUNK:
            self.flush()
        return len(line)

    def flush(self) -> None:
        self.answers.keep(self._kept)
        self._kept = []


def _write(rows: TableRows, answers: Answers, prices: PriceTable, where: str | None, result: TableResult) -> pa.Table | None:
    """Every row joined to its answer, in order: written to `where` whole (an empty table of the right columns when
    there are no rows: never yesterday's result left in place), or returned (None: written)."""
    writer: TableWriter | None = None
    kept: list[pa.RecordBatch] = []
    unsent = result.unsent_reason()
    for batch, judged in rows.judged():
        got = answers.results_of([j.key for j in judged if j.key is not None])
        cols = [result_columns(j, got.get(j.key) if j.key else None, prices, unsent) for j in judged]
        for c in cols:
            result.by_status[c["status"]] = result.by_status.get(c["status"], 0) + 1
        extra = [pa.array([c[name] for c in cols], type=RESULT_ARROW_TYPES[name]) for name in RESULT_COLUMNS]
        out = pa.RecordBatch.from_arrays(batch.columns + extra, names=batch.schema.names + list(RESULT_COLUMNS))
        if where is None:
            kept.append(out)
            continue
        writer = writer or TableWriter(where, out.schema)
        writer.write(out)
    empty = result_schema(rows.source.schema())
    if where is None:
        return pa.Table.from_batches(kept, schema=kept[0].schema if kept else empty)
    (writer or TableWriter(where, empty)).commit()
    return None


def submit_table_sync(source: Any, spec: TableSpec, *, config: ApiConfig, settings: SubmitSettings | None = None,
                      out: str | os.PathLike[str] | None = None, prices: PriceTable | None = None,
                      **submit_options: Any) -> TableResult:
    """`submit_table` for code that is not async. Example::

        spec = gatekeeper.TableSpec.of("Classify this ticket: {body}", "claude-haiku-4-5", 50, id_column="ticket")
        result = gatekeeper.submit_table_sync(df, spec, config=gatekeeper.ApiConfig.from_env(os.environ))
        result.table  # a pyarrow.Table: df's columns, then custom_id, status, text, ... cost_usd, error
    """
    import anyio

    return anyio.run(lambda: submit_table(source, spec, config=config, settings=settings, out=out, prices=prices,
                                          **submit_options))
