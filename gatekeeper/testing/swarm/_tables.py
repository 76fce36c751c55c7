"""Table jobs in a world: a job's input a Parquet or CSV table run through the library's table jobs
(`gatekeeper.tables`), changed between its runs as tables are overnight: rows appended, or an int64 column drifted
to double by a NaN (as pandas writes it once a value is missing). The rows' ids are the job's own (`j2-r0`, ...):
what the fake billed for an id is that job's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...api._config import ApiConfig
from ...run.shared._settings import SubmitSettings
from ...tables._job import submit_table
from ...tables._rows import TableSpec
from .._wire import prompt_of
from ._world import DrawnJob

MAX_TOKENS = 16


def table_path(job: DrawnJob, here: Path) -> Path:
    return here / f"{job.name}.{job.table}"


def out_path(here: Path) -> Path:
    return here / "out.parquet"


def spec_of(job: DrawnJob) -> TableSpec:
    return TableSpec.of(f"{job.name} asks about {{topic}}, number {{q}}", job.model, MAX_TOKENS, id_column="id")


def text_of(job: DrawnJob, k: int) -> str:
    """Row k's prompt as the template renders it (an integral double renders as the integer)."""
    return f"{job.name} asks about topic {k % 5}, number {k}"


def digest_of(job: DrawnJob, k: int) -> str:
    """The digest of row k's prompt, as the fake keys what it bills (`prompt_of`)."""
    return prompt_of({"messages": [{"content": text_of(job, k), "role": "user"}]})[1]


def _table(job: DrawnJob, qs: list[float | None], drifted: bool) -> pa.Table:
    n = len(qs)
    q = pa.array(qs, pa.float64()) if drifted else pa.array(qs, pa.int64())
    return pa.table({"id": [f"{job.name}-r{k}" for k in range(n)], "topic": [f"topic {k % 5}" for k in range(n)],
                     "q": q})


def write_table(job: DrawnJob, path: Path, qs: list[float | None], drifted: bool) -> None:
    """The table as a Parquet file, or a CSV as pandas writes one (a drifted column's values `3.0`, a NaN empty)."""
    table = _table(job, qs, drifted)
    if job.table == "parquet":
        pq.write_table(table, path)
        return
    head = "id,topic,q\n"
    rows = [f"{i},{t},{_csv(q, drifted)}\n" for i, t, q in zip(table["id"].to_pylist(), table["topic"].to_pylist(),
                                                               qs, strict=True)]
    path.write_text(head + "".join(rows))


def _csv(q: float | None, drifted: bool) -> str:
    if q is None or (isinstance(q, float) and math.isnan(q)):
        return ""
    return f"{float(q)!r}" if drifted else str(int(q))


class TableInput:
    """A table job's input as the world holds it: its rows' `q` values (NaN: the drift's missing value)."""

    def __init__(self, job: DrawnJob, here: Path) -> None:
        self.job, self.path = job, table_path(job, here)
        self.qs: list[float | None] = list(range(job.requests))
        self.drifted = False
        write_table(job, self.path, self.qs, self.drifted)

    def change(self, how: str) -> None:
        """Rows appended (a tenth more, at least two), or one with a missing value (and the column drifted)."""
        n = len(self.qs)
        if how == "drift":
            self.drifted = True
            self.qs.append(math.nan)
        else:
            self.qs += list(range(n, n + max(2, n // 10)))
        write_table(self.job, self.path, self.qs, self.drifted)

    @property
    def infer_types(self) -> bool:
        """A CSV is read with its types inferred where its column drifts (as text, `3.0` would be a new value)."""
        return self.job.table == "csv" and "drift" in self.job.changes


def sound(qs: list[float | None]) -> list[bool]:
    return [not (q is None or (isinstance(q, float) and math.isnan(q))) for q in qs]


async def run_table(job: DrawnJob, source: TableInput, here: Path, settings: SubmitSettings, config: ApiConfig,
                    **options: Any) -> tuple[str, dict[str, Any] | None]:
    """One run of a table job: (how it ended, its result's figures). Unfinished: a sound row left unsent."""
    result = await submit_table(str(source.path), spec_of(job), config=config, settings=settings, out=out_path(here),
                                infer_types=source.infer_types, **options)
    figures = result.to_json()
    if result.by_status.get("unsent", 0):
        return "unfinished", figures
    return "finished", figures

