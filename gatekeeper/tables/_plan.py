"""`plan` of a table: a sizing report of what `submit` would do, nothing sent. Every row judged; the requests not
answered yet planned as a JSONL job's are, cut as `submit` cuts them at the known queue ceiling (a quarter of it a
batch), with the rounds of creates that takes, the cost estimate at batch prices, and each rejected row by number
and reason (a count and the first `KEPT`: memory stays flat whatever is rejected)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._prices import PriceTable, load_prices
from ..decide._admission import batch_size_for, waves
from ..input._parallel import auto_workers
from ..input._planner import PlanReport, SizedPlan, plain_request, plan
from ..input._sizing import Limits
from ..state._answers import Answers
from ._io import TableSource
from ._judged import TableRows
from ._pending import KEPT, Counts, pending_file, refused_shares, sized
from ._rows import Judged, TableSpec, body_of
from ._runs import held_elsewhere, taken_keys, unfinished_runs
from ._where import default_state_dir

TableJudge = Callable[[Path, PlanReport, Limits], PlanReport]
"""`plan_table(judge=...)`: given the file of the requests to send, its first pass's report and the limits, the
report judged (the Models API's verdicts, count_tokens), whose refusals become rejected rows."""


@dataclass
class TablePlan:
    """What `plan_table` found: rows judged, rejected (`rejected_count`: rows judged bad and rows whose requests
    plan's rules refuse, as `submit` rejects them; the first `KEPT` as records with their row number), answered
    already; the requests to send planned (`report`, None when there are none) at `batch_size` a batch, in `waves`
    rounds at the ceiling (None: unknown); the runs that did not finish, which `submit` finishes first."""

    rows: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    rejected_count: int = 0
    answered: int = 0
    in_flight: int = 0  # rows an unfinished run has out or answered: its collection answers them, not this plan's sends
    report: PlanReport | None = None
    batches: list[dict[str, Any]] = field(default_factory=list)  # `report`'s, by the rows each runs from and to
    errors: list[dict[str, Any]] = field(default_factory=list)  # requests `plan`'s rules refuse, with their rows
    ceiling: int | None = None
    batch_size: int = 0
    waves: int | None = None
    estimate: dict[str, Any] | None = None
    unfinished: list[dict[str, Any]] = field(default_factory=list)
    shared: int = 0  # rows to send whose request is an earlier row's: one request (paid once) answers them all
    largest: dict[str, Any] | None = None  # `report`'s largest request, by its row

    @property
    def to_send(self) -> int:
        return 0 if self.report is None else self.report.requests

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {"rows": self.rows, "answered": self.answered, "in_flight": self.in_flight, "rejected": self.rejected,
                "rejected_count": self.rejected_count, "requests": self.to_send, "to_send": self.to_send,
                "invalid": 0 if r is None else r.invalid, "errors": self.errors,
                "batches": self.batches, "batch_size": self.batch_size,
                "waves": self.waves, "ceiling": self.ceiling, "estimate": self.estimate,
                "largest_request": self.largest,
                "models": {} if r is None else r.to_json()["models"], "request_bytes": 0 if r is None else r.request_bytes,
                "limits": None if r is None else r.to_json()["limits"], "unfinished": self.unfinished, "shared": self.shared,
                "preflight": None if r is None else r.preflight}


def plan_table(source: Any, spec: TableSpec, *, limits: Limits | None = None,
               state_dir: str | os.PathLike[str] | None = None, ceiling: int | None = None, margin: int = 0,
               journal: str | None = None, job: str | None = None, prices: PriceTable | None = None,
               encoding: str | None = None, infer_types: bool = False,
               environ: Mapping[str, str] | None = None, judge: TableJudge | None = None) -> TablePlan:
    """Judge every row and plan the requests still to send, as `plan` plans a JSONL file, at the batch size `submit`
    uses under `ceiling` (with `margin` left free); nothing is sent or written. The answers read are those kept in
    the job's state (`state_dir`, default the table's folder in the user's state folder, `environ` naming it), or,
    with a PostgreSQL `journal`, those kept there under the job's name `job`. `judge` judges the requests to send as
    `plan` of a JSONL file does with a key (the Models API's verdicts, count_tokens): given their file, its first
    pass's report and the limits, it returns the report judged, whose refusals are rejected rows (the CLI's, which
    has the key: this module sends nothing)."""
    src = TableSource.of(source, encoding=encoding, infer_types=infer_types)
    rows = TableRows(src, spec)
    root = Path(state_dir) if state_dir is not None else default_state_dir(src.where, environ or os.environ, create=False)
    answers = _answers(root, journal, job)
    limits = limits or Limits()
    size = batch_size_for(ceiling, margin, limits.max_requests)
    cut = Limits(max_requests=size, max_bytes=limits.max_bytes, api_version=limits.api_version)
    try:
        unfinished = unfinished_runs(root, answers) if answers is not None else []
        taken = {p: taken_keys(p, journal, f"{job}.{p.stem}" if journal else None) for p in unfinished}
        out_taken = set().union(*taken.values())
        counts, report, (batches, largest), errors, refused = _planned(rows, answers, cut, spec, judge, out_taken)
        shares, shared = refused_shares(rows, answers, refused, {e["row"]: e["reason"] for e in errors},
                                        keyed=answers is not None or bool(out_taken), taken=out_taken) \
            if len(refused) and counts.shared else (0, [])  # (rows sharing a refused request: submit rejects them too)
    finally:
        if answers is not None:
            answers.close()
    out = TablePlan(counts.rows, _first(counts.first_rejected, errors + shared),
                    counts.rejected + len(refused) + shares, counts.answered,
                    counts.in_flight, report, batches, errors, ceiling, size,
                    unfinished=[{"run": p.stem, "requests": _lines(p), "taken": len(taken[p]),
                                 "running": held_elsewhere(p)} for p in unfinished], shared=counts.shared,
                    largest=largest)
    if report is not None:
        out.estimate = report.estimate(prices or load_prices())
        if ceiling is not None:
            out.waves = waves([b.requests for b in report.batches], ceiling, margin)
    return out


def _first(judged: list[dict[str, Any]], refused: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first `KEPT` rejected rows, in row order: those judged bad, and those whose requests plan refused (each
    list the first `KEPT` of its kind, so the first `KEPT` of both are among them)."""
    return sorted(judged + refused, key=lambda r: r["row"])[:KEPT]


def _answers(root: Path, journal: str | None, job: str | None) -> Answers | None:
    if journal:
        assert job is not None, "a table job's answers in a journal are found by its name"
        return Answers.shared(journal, job)
    return Answers.local(root / "answers.sqlite3") if (root / "answers.sqlite3").exists() else None


def _planned(rows: TableRows, answers: Answers | None, limits: Limits, spec: TableSpec, judge: TableJudge | None = None,
             taken: set[str] | None = None
             ) -> tuple[Counts, PlanReport | None, tuple[list[dict[str, Any]], dict[str, Any] | None],
                        list[dict[str, Any]], np.ndarray]:
    """The counts, the report, its batches and largest request and the requests it refused, by rows (the first `KEPT` as records; the
    first rows of all, sorted): planned from the requests' sizes when the spec is plain, else through `plan` over
    the run's file, written to a temporary folder. Each request's row is written beside them (4 bytes a request),
    for the lines a report names."""
    with tempfile.TemporaryDirectory() as tmp:
        numbers = Path(tmp) / "rows.u32"
        if judge is None and _plain(spec, limits):
            with open(numbers, "wb") as f:
                counts = sized(rows, answers, planned := SizedPlan(limits, spec.model, KEPT), f, taken)
            report = planned.finish() if counts.unsent else None
        else:
            pending, counts = pending_file(rows, answers, Path(tmp), numbers, setting=None, taken=taken)  # (TMPDIR's)
            report = None if pending is None else plan(pending, limits=limits, workers=auto_workers(pending),
                                                       models=None if judge is None else {},  # (peaks, to judge)
                                                       errors_kept=KEPT)
            if pending is not None and report is not None and judge is not None:
                report = judge(pending, report, limits)
        if report is None:
            return counts, None, ([], None), [], np.zeros(0, "<u4")
        with open(numbers, "rb") as f:
            return counts, report, (_batches(report, f), _largest(report, f)), _refusals(report, f), \
                _refused_rows(numbers, report)


def _refused_rows(numbers: Path, report: PlanReport) -> np.ndarray:
    """The first rows of the requests `plan` refused, sorted (4 bytes each)."""
    if not report.invalid:
        return np.zeros(0, "<u4")
    lines = np.fromiter((e.line for e in report.errors), np.int64, len(report.errors))
    lines = np.concatenate((lines, np.array(report.dropped, np.int64)))
    return np.sort(np.memmap(numbers, "<u4", mode="r")[lines - 1])


def _batches(report: PlanReport, f: Any) -> list[dict[str, Any]]:
    """The report's batches as `plan` gives a JSONL file's, each by the rows it runs from and to."""
    out = []
    for b in report.batches:
        j = b.to_json()
        first, last = j.pop("first_line"), j.pop("last_line")
        out.append({**j, "first_row": _row_at(f, first), "last_row": _row_at(f, last)})
    return out


def _largest(report: PlanReport, f: Any) -> dict[str, Any] | None:
    """The report's largest request as `plan` gives a JSONL file's, by its row (not the run's line)."""
    if not report.requests:
        return None
    return {"bytes": report.largest_bytes, "row": _row_at(f, report.largest_line),
            "custom_id": report.largest_custom_id}


def _refusals(report: PlanReport, f: Any) -> list[dict[str, Any]]:
    """The first `KEPT` requests `plan` refused, as records naming their rows."""
    return [{"row": _row_at(f, e.line), "custom_id": e.custom_id, "reason": e.reason} for e in report.errors[:KEPT]]


def _row_at(f: Any, line: int) -> int:
    f.seek((line - 1) * 4)
    return int.from_bytes(f.read(4), "little")


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _plain(spec: TableSpec, limits: Limits) -> bool:
    """Whether the spec's requests can be planned from their sizes, nothing written (`SizedPlan`): its request with a
    stand-in prompt (and system, when that has no fields) is one `plan` takes with nothing to note. A system
    rendered per row may be long, which the caching report notes: those go through `plan`."""
    if spec.system is not None and spec.system.columns:
        return False
    body = body_of(spec, dict.fromkeys(spec.template.columns, "x"))
    return plain_request(Judged(1, "", "r-probe", body).line().rstrip(b"\n"), limits)
