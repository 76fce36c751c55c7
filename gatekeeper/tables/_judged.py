"""One table's rows judged, pass after pass: the id column's duplicates found first, then each record batch's rows
judged (`judge_batch`). The first pass fixes how many rows the job has; every later pass reads those rows and no
more, so rows appended while the job runs wait for the next run, and no row is counted twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from .._errors import UsageError
from ._batch import Judgements, is_text, judge_batch
from ._io import TableSource
from ._rows import RESULT_COLUMNS, TableSpec, hashable, no_id
from ._seen import SeenIds
from ._template import check_columns


class TableRows:
    """A table's rows for one spec: its columns checked at once (a template naming a column the table lacks, an id
    column it lacks, a result column it has already: one line each); `count`, the rows the first pass read."""

    def __init__(self, source: TableSource, spec: TableSpec) -> None:
        self.source, self.spec = source, spec
        self.count: int | None = None
        schema = source.schema()
        self.columns = list(schema.names)
        _check_unique(source.name, self.columns)
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

    def _batches(self, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        """A pass over the table: the first counts its rows, the later ones read that many."""
        if self.count is not None:
            yield from self.source.batches(columns, self.count)
            return
        count = 0
        for batch in self.source.batches(columns):
            count += batch.num_rows
            yield batch
        self.count = count

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
            return _grouped((n, hashable(v)) for n, v in self._ids(col) if not no_id(v))  # index may hide one)
        return _grouped(sorted(values.items()))

    def _candidates(self, col: str) -> dict[int, int]:
        """Each row whose id looks seen before (by hash), with the row it looks seen on (a null or NaN id is no id:
        its row is rejected for it)."""
        seen, number = SeenIds(self.source.rows_hint), 0
        candidates: dict[int, int] = {}
        for batch in self._batches([col]):
            column = batch.column(col)
            values, rows = column.to_pylist(), range(number + 1, number + len(column) + 1)
            if column.null_count or not is_text(column.type):  # (else each value as it is: no step a row)
                present = [(n, hashable(v)) for n, v in zip(rows, values) if not no_id(v)]
                values, rows = [v for _, v in present], [n for n, _ in present]  # type: ignore[assignment]
            candidates.update(seen.add_many(values, rows))
            number += len(column)
        return candidates

    def _ids(self, col: str) -> Iterator[tuple[int, Any]]:
        number = 0
        for batch in self._batches([col]):
            for value in batch.column(col).to_pylist():
                number += 1
                yield number, value

    def judged(self, every_column: bool = True, keyed: bool = True) -> Iterator[tuple[pa.RecordBatch, Judgements]]:
        """Each record batch (of every column, or of the spec's alone) and its rows judged (`judge_batch`)."""
        number = 0
        spec, duplicated = self.spec, self.duplicated
        for batch in self._batches(None if every_column else list(spec.columns)):
            yield batch, judge_batch(spec, batch, number, duplicated, keyed=keyed)
            number += batch.num_rows


def _check_unique(table: str, columns: list[str]) -> None:
    """A column name twice is refused before anything is sent: a template's field, the id and the result's columns
    would each be ambiguous (pyarrow selects neither). Renaming it keeps the rows' requests, so the answers kept
    already, an earlier version's paid run's included, are used again."""
    counts = Counter(columns)
    twice = [n for n in counts if counts[n] > 1]
    if twice:
        name = twice[0]
        raise UsageError(f"{table} has the column {name!r} {counts[name]} times: rename or drop all but "
                         "one (answers kept already are used again, nothing is bought twice)", setting="source")


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
