"""A table job: the rows whose rendered request has no answer yet go out as an ordinary JSONL job (so the journal,
admission, exactly-once collection and every option of a JSONL job hold), their answers are kept by request, and
the result table joins every input row to its answer, in input order.

On disk, beside the table (or in `state_dir`): `answers.sqlite3` (every request's answer, across runs) and `runs/`
(each run's requests, named by their content, with the run's own state directory). A rerun after a crash at any
point renders the same unanswered rows, so it is the same run: it resumes, and buys nothing twice.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from .._errors import JournalError, UsageError
from .._prices import PriceTable, load_prices
from ..api._config import ApiConfig
from ..input._parallel import auto_workers
from ..input._planner import PlanReport, SizedPlan, plain_request, plan
from ..input._sizing import Limits
from ..run.job._settings import SubmitSettings, default_job_name
from ..state._answers import Answers
from ._batch import Judgements, judge_batch
from ._io import TableSource, TableWriter
from ._rows import RESULT_COLUMNS, Judged, TableSpec, body_of, hashable, id_and_key, result_columns
from ._seen import SeenIds, SeenRequests
from ._template import check_columns

if TYPE_CHECKING:
    from ..run.job._summary import Summary

RESULT_TYPES = {"custom_id": pa.string(), "status": pa.string(), "text": pa.string(), "stop_reason": pa.string(),
                "model": pa.string(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
                "cache_read_input_tokens": pa.int64(), "cache_creation_input_tokens": pa.int64(),
                "cost_usd": pa.float64(), "error": pa.string()}


@dataclass
class TableResult:
    """How a table job ended: rows by status, the run's summary (None: every row was answered already), and the
    result table (when no `out` was asked for) or where it was written."""

    rows: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    sent: int = 0  # requests this run sent (or found already sent: a resumed run)
    summary: Summary | None = None
    out: str | None = None
    table: pa.Table | None = None
    state_dir: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "by_status": self.by_status, "sent": self.sent, "out": self.out,
                "state_dir": self.state_dir, "run": None if self.summary is None else self.summary.to_json()}


@dataclass
class TablePlan:
    rows: int = 0
    rejected: list[str] = field(default_factory=list)  # table-level reasons, row numbers first
    answered: int = 0  # rows whose request has an answer already
    report: PlanReport | None = None  # the requests still to send, planned as a JSONL job's

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {"rows": self.rows, "rejected": self.rejected[:100], "rejected_count": len(self.rejected),
                "answered": self.answered, "to_send": 0 if r is None else r.requests,
                "invalid": 0 if r is None else r.invalid, "batches": 0 if r is None else len(r.batches),
                "errors": [] if r is None else [e.to_json() for e in r.errors[:100]]}


class _Rows:
    """One table's rows judged, pass after pass (the id column's duplicates found first)."""

    def __init__(self, source: TableSource, spec: TableSpec) -> None:
        self.source, self.spec = source, spec
        schema = source.schema()
        self.columns = list(schema.names)
        for template in (spec.template, spec.system):
            if template is not None:
                check_columns(template, self.columns)
        if spec.id_column and spec.id_column not in self.columns:
            raise UsageError(f"--id-column {spec.id_column!r}: the table has no such column; its columns: "
                             f"{', '.join(self.columns[:20])}", setting="id_column")
        clash = [c for c in RESULT_COLUMNS if c in self.columns]
        if clash:
            raise UsageError(f"the table already has the result column(s) {', '.join(clash)}: rename them, or "
                             "select the input columns", setting="source")
        self.duplicated = self._duplicates()

    def _duplicates(self) -> dict[Any, list[int]]:
        """Each id on more than one row, with its rows: candidates by hash in one pass over the id column (memory:
        `SeenIds`), settled exactly by a second pass over the candidates' rows."""
        col = self.spec.id_column
        candidates = self._candidates(col) if col is not None else {}
        if col is None or not candidates:
            return {}
        rows = set(candidates) | set(candidates.values())
        values = {number: hashable(value) for number, value in self._ids(col) if number in rows}
        if any(values[later] != values[first] for later, first in candidates.items()):  # (two ids of one hash: the
            return _grouped((n, hashable(v)) for n, v in self._ids(col) if v is not None)  # index may hide one)
        return _grouped(sorted(values.items()))

    def _candidates(self, col: str) -> dict[int, int]:
        """Each row whose id looks seen before (by hash), with the row it looks seen on."""
        seen, number = SeenIds(self.source.rows_hint), 0
        candidates: dict[int, int] = {}
        for batch in self.source.batches([col]):
            column = batch.column(col)
            values, rows = column.to_pylist(), range(number + 1, number + len(column) + 1)
            if column.null_count or not pa.types.is_string(column.type):  # (else each value as it is: no step a row)
                present = [(n, hashable(v)) for n, v in zip(rows, values) if v is not None]
                values, rows = [v for _, v in present], [n for n, _ in present]  # type: ignore[assignment]
            candidates.update(seen.add_many(values, rows))
            number += len(column)
        return candidates

    def _ids(self, col: str) -> Iterator[tuple[int, Any]]:
        number = 0
        for batch in self.source.batches([col]):
            for value in batch.column(col).to_pylist():
                number += 1
                yield number, value

    def judged(self, every_column: bool = True, keyed: bool = True) -> Iterator[tuple[pa.RecordBatch, Judgements]]:
        """Each record batch (of every column, or of the spec's alone) and its rows judged (`judge_batch`)."""
        number = 0
        spec, duplicated = self.spec, self.duplicated
        for batch in self.source.batches(None if every_column else list(spec.columns)):
            yield batch, judge_batch(spec, batch, number, duplicated, keyed=keyed)
            number += batch.num_rows


def _grouped(rows: Iterable[tuple[int, Any]]) -> dict[Any, list[int]]:
    """Each id on more than one of `rows` (row number, id), with its rows in order."""
    first: dict[Any, int] = {}
    dup: dict[Any, list[int]] = {}
    for number, key in rows:
        if key in first:
            dup.setdefault(key, [first[key]]).append(number)
        else:
            first[key] = number
    return dup


def default_state_dir(source: TableSource) -> Path:
    if source.where is not None and "://" not in source.where:
        return Path(source.where + ".gatekeeper")
    digest = hashlib.sha256((source.where or "the table given").encode()).hexdigest()[:12]
    return Path.cwd() / f"table-{digest}.gatekeeper"


@dataclass
class _Counts:
    rows: int = 0
    answered: int = 0
    rejected: list[str] = field(default_factory=list)
    unsent: int = 0  # distinct requests not answered yet


def _pending(rows: _Rows, answers: Answers | None, runs: Path) -> tuple[Path | None, _Counts]:
    """The requests not answered yet, one per request (rows with the same request share it), written to a file
    named by its content (None: every row is answered or rejected)."""
    runs.mkdir(parents=True, exist_ok=True)
    tmp = runs / "pending.jsonl.tmp"
    digest = hashlib.sha256()
    with open(tmp, "wb") as f:
        for judged, keep in _unsent_rows(rows, answers, counts := _Counts()):
            lines = judged.lines(keep)
            f.write(lines)
            digest.update(lines)
    if not counts.unsent:
        tmp.unlink()
        return None, counts
    path = runs / f"{digest.hexdigest()[:16]}.jsonl"
    os.replace(tmp, path)
    return path, counts


def _sized(rows: _Rows, answers: Answers | None, plan: SizedPlan) -> _Counts:
    """`_pending`'s requests fed to `plan` as sizes: nothing written (a third of a plan's time went to the file), and
    without answers to look up, no key computed."""
    for judged, keep in _unsent_rows(rows, answers, counts := _Counts(), keyed=answers is not None):
        sizes, cids = judged.sizes(keep)
        if sizes:
            plan.add(sizes, cids)
    return counts


def _unsent_rows(rows: _Rows, answers: Answers | None, counts: _Counts, keyed: bool = True
                 ) -> Iterator[tuple[Judgements, list[bool] | None]]:
    """Each batch's rows judged, and which of them go in the run (`_unsent`), counted in `counts`."""
    seen = SeenRequests(rows.source.rows_hint)
    for _, judged in rows.judged(every_column=False, keyed=keyed):
        counts.rows += len(judged)
        counts.rejected += [judged.rejected[i] for i in sorted(judged.rejected)]
        yield judged, _unsent(judged, answers, seen, counts)
    counts.unsent = len(seen)


def _unsent(judged: Judgements, answers: Answers | None, seen: SeenRequests, counts: _Counts) -> list[bool] | None:
    """Which of a batch's rows go in the run: neither rejected nor answered, and the first row of their request
    (None: every row, the common case, told without a step a row). Answered rows are counted here."""
    n, rejected = len(judged), judged.rejected
    places = None if not rejected else [i for i in range(n) if i not in rejected]
    if answers is not None:
        keys = judged.keys
        assert keys is not None, "answers are looked up by key"
        valid = keys if places is None else [keys[i] for i in places]
        done = answers.answered_among(valid) if valid else set()  # type: ignore[arg-type]
        if done:
            counts.answered += sum(k in done for k in valid)
            places = [i for i in (range(n) if places is None else places) if keys[i] not in done]
    bodies = judged.bodies
    again = seen.add_many(bodies if places is None else [bodies[i] for i in places])  # (positions among those)
    if places is None and not again:
        return None
    keep = [False] * n
    for j, i in enumerate(range(n) if places is None else places):
        keep[i] = j not in again
    return keep


def open_answers(root: Path, journal: str | None, job: str | None) -> Answers:
    """A table job's answers: beside its runs, or in its shared journal under its name."""
    if journal:
        assert job is not None
        return Answers.shared(journal, job)
    return Answers.local(root / "answers.sqlite3")


def table_job_name(where: str, spec: TableSpec, config: ApiConfig) -> str:
    """A table job's default name in a shared journal: its table's path or URI and its spec, with the credential.
    (Still the key's digest, `legacy_fingerprint`: a table job's answers are kept under its name, and a new name
    without a lookup of the old one would send answered rows again. JSONL jobs are named by the account.)"""
    digest = hashlib.sha256(orjson.dumps([where, spec.to_json()], option=orjson.OPT_SORT_KEYS)).hexdigest()
    return default_job_name(digest, config.legacy_fingerprint())


def plan_table(source: Any, spec: TableSpec, *, limits: Limits | None = None,
               state_dir: str | os.PathLike[str] | None = None) -> TablePlan:
    """Judge every row and plan the requests still to send, as `plan` plans a JSONL file; nothing is sent (the
    answers read are those kept beside the runs, in `state_dir`)."""
    src = TableSource.of(source)
    rows = _Rows(src, spec)
    root = Path(state_dir) if state_dir is not None else default_state_dir(src)
    answers = Answers.local(root / "answers.sqlite3") if (root / "answers.sqlite3").exists() else None
    import tempfile

    limits = limits or Limits()
    try:
        if _plain(spec, limits):
            counts = _sized(rows, answers, sized := SizedPlan(limits, spec.model))
            report = sized.finish() if counts.unsent else None
        else:
            with tempfile.TemporaryDirectory() as tmp:
                pending, counts = _pending(rows, answers, Path(tmp))
                report = None if pending is None else plan(pending, limits=limits, workers=auto_workers(pending))
    finally:
        if answers is not None:
            answers.close()
    return TablePlan(counts.rows, counts.rejected, counts.answered, report)


def _plain(spec: TableSpec, limits: Limits) -> bool:
    """Whether the spec's requests can be planned from their sizes, nothing written (`SizedPlan`): its request with a
    stand-in prompt (and system, when that has no fields) is one `plan` takes with nothing to note. A system
    rendered per row may be long, which the caching report notes: those go through `plan`."""
    if spec.system is not None and spec.system.columns:
        return False
    body = body_of(spec, dict.fromkeys(spec.template.columns, "x"))
    return plain_request(Judged(1, "", "r-probe", body).line().rstrip(b"\n"), limits)


class TableJob:
    """One table job's files under `root`: the answers kept across runs, and the run of the requests still
    unanswered (`pending`, named by its content, with its own state directory beside it)."""

    def __init__(self, source: Any, spec: TableSpec, root: Path, answers: Answers) -> None:
        self.rows = _Rows(TableSource.of(source), spec)
        self.root = root
        self.answers = answers

    def pending(self) -> tuple[Path | None, _Counts]:
        return _pending(self.rows, self.answers, self.root / "runs")

    def settle(self, pending: Path, *, journal: str | None = None, job: str | None = None) -> None:
        """Keep what the run of `pending` answered (its journal in its state directory, or named `job` in the shared
        `journal`)."""
        _merge(self.answers, pending, run_dir(pending), journal, job)

    def write(self, where: str | None, prices: PriceTable, result: TableResult) -> None:
        result.table, result.out = _write(self.rows, self.answers, prices, where, result), where

    def close(self) -> None:
        self.answers.close()


def run_dir(pending: Path) -> Path:
    return pending.with_suffix(".gatekeeper")


def run_name(pending: Path, job: str | None, config: ApiConfig) -> str:
    """A run's name in a shared journal: the table job's name and the run's content, or, unnamed, the name a JSONL
    job of the same requests gets (the run's file is named by the digest that name starts with)."""
    from ..run.job._opening import job_name_of  # (the run's modules: not imported by `plan_table`, a second of a 1M-row plan)

    return f"{job}.{pending.stem}" if job else job_name_of(str(pending), config)


async def submit_table(source: Any, spec: TableSpec, *, config: ApiConfig, settings: SubmitSettings | None = None,
                       out: str | os.PathLike[str] | None = None, prices: PriceTable | None = None,
                       **submit_options: Any) -> TableResult:
    """Send the table's unanswered rows as one job (any option of `submit` applies), keep their answers, and
    return the result table, one row per input row in input order (or write it to `out`: Parquet, CSV or Arrow
    IPC, local or object storage, whole or not at all)."""
    from ..run._submit import submit  # (as `run_name`'s)

    settings = settings or SubmitSettings()
    src = TableSource.of(source)
    root = Path(settings.state_dir) if settings.state_dir is not None else default_state_dir(src)
    name = settings.job or table_job_name(src.where or str(root.resolve()), spec, config) if settings.journal else None
    job = TableJob(src, spec, root, open_answers(root, settings.journal, name))
    prices = prices or load_prices()
    try:
        pending, counts = job.pending()
        result = TableResult(rows=counts.rows, state_dir=str(root))
        if pending is not None:
            runs = run_name(pending, settings.job, config) if settings.journal else None
            run = replace(settings, state_dir=run_dir(pending), out=None, job=runs)  # (the run's results in its own state)
            result.summary = await submit(pending, config=config, settings=run, prices=prices, **submit_options)
            result.sent = result.summary.requests
            job.settle(pending, journal=settings.journal, job=runs)
        job.write(None if out is None else os.fspath(out), prices, result)
        return result
    finally:
        job.close()


def _merge(answers: Answers, pending: Path, run_dir: Path, journal: str | None, job: str | None) -> None:
    """Keep the run's results (and its lines refused before sending) under their requests' keys (memory: a chunk)."""
    from ..run.job._results import export  # (as `run_name`'s)

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
        self._kept: list[tuple[str, dict[str, Any]]] = []

    def write(self, line: bytes) -> int:
        found = orjson.loads(line)
        cid = found.get("custom_id")
        for at, key in self._lines:
            if at == cid:
                self._kept.append((key, found["result"]))
                break
        else:  # (a result out of the requests' order would leave every later one unkept: never silently)
            raise JournalError(f"the run's result for {cid!r} is not in its requests' order: nothing after it was kept")
        if len(self._kept) >= self.CHUNK:
            self.flush()
        return len(line)

    def flush(self) -> None:
        self.answers.keep(self._kept)
        self._kept = []


def _write(rows: _Rows, answers: Answers, prices: PriceTable, where: str | None, result: TableResult) -> pa.Table | None:
    writer: TableWriter | None = None
    kept: list[pa.RecordBatch] = []
    for batch, judged in rows.judged():
        got = answers.results_of([j.key for j in judged if j.key is not None])
        cols = [result_columns(j, got.get(j.key) if j.key else None, prices) for j in judged]
        for c in cols:
            result.by_status[c["status"]] = result.by_status.get(c["status"], 0) + 1
        extra = [pa.array([c[name] for c in cols], type=RESULT_TYPES[name]) for name in RESULT_COLUMNS]
        out = pa.RecordBatch.from_arrays(batch.columns + extra, names=batch.schema.names + list(RESULT_COLUMNS))
        if where is None:
            kept.append(out)
            continue
        writer = writer or TableWriter(where, out.schema)
        writer.write(out)
    if where is None:
        return pa.Table.from_batches(kept) if kept else None
    if writer is not None:
        writer.commit()
    return None


def submit_table_sync(source: Any, spec: TableSpec, *, config: ApiConfig, settings: SubmitSettings | None = None,
                      out: str | os.PathLike[str] | None = None, prices: PriceTable | None = None,
                      **submit_options: Any) -> TableResult:
    """`submit_table` for code that is not async. Example::

        spec = gatekeeper.TableSpec.of("Classify this ticket: {body}", "claude-haiku-4-5", 50, id_column="ticket")
        result = gatekeeper.submit_table_sync(df, spec, config=gatekeeper.ApiConfig.from_env(os.environ),
                                              settings=gatekeeper.SubmitSettings(state_dir="tickets.gatekeeper"))
        result.table  # a pyarrow.Table: df's columns, then custom_id, status, text, ... cost_usd, error
    """
    import anyio

    return anyio.run(lambda: submit_table(source, spec, config=config, settings=settings, out=out, prices=prices,
                                          **submit_options))
