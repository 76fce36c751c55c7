"""A record batch of rows judged at once: the same `Judged` as `_rows.judge` row by row, with the prompts rendered by
Arrow's string kernels and JSON-escaped by one `orjson.dumps` of the batch's texts. Rows the batch path cannot
vouch for (a null templated column, a null or duplicated id) and templates over columns that are not strings go
row by row, through `judge` itself: one definition of a row's request, two speeds.

Why one dump splits exactly: in orjson's encoding of a list of strings, a `"` inside an element is always written
`\\"`, so the three bytes `","` occur only between elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ._rows import Judged, TableSpec, custom_id_of, hashable, judge, key_of
from ._template import Template


def judge_batch(spec: TableSpec, batch: pa.RecordBatch, first: int, duplicated: Mapping[Any, list[int]]) -> list[Judged]:
    """The rows of `batch` judged; `first` is the number of the row before it (rows count from 1)."""
    sub = batch.select(list(spec.columns))
    templates = [t for t in (spec.template, spec.system) if t is not None]
    if not all(_strings(sub, t) for t in templates):
        return [judge(spec, row, first + i, duplicated) for i, row in enumerate(sub.to_pylist(), 1)]
    user = _escaped(spec.template, sub)
    system = _escaped(spec.system, sub) if spec.system is not None else None
    vouched = _vouched(spec, sub, templates, duplicated)
    ids = sub.column(spec.id_column).to_pylist() if spec.id_column else None
    keys, bodies = _keyed(spec.pieces, user, system)
    cids = list(map(custom_id_of, repeat(None) if ids is None else ids, keys))
    n = sub.num_rows
    # (columns zipped into tuples: a NamedTuple's own constructor is a Python call, a third of the batch's time)
    out = list(map(Judged._make, zip(range(first + 1, first + n + 1), keys, cids, bodies, repeat(None, n))))
    for i in (i for i, ok in enumerate(vouched) if not ok):
        out[i] = judge(spec, sub.slice(i, 1).to_pylist()[0], first + i + 1, duplicated)
    return out


def _keyed(pieces: tuple[bytes, ...], user: list[bytes], system: list[bytes] | None) -> tuple[list[str], list[bytes]]:
    """Each row's request body (its escaped prompts between the spec's pieces) and its key."""
    join = b"".join
    if system is None:
        head, tail = pieces[0] + b'"', b'"' + pieces[1]
        bodies = [join((head, u, tail)) for u in user]
    else:
        head, mid, tail = pieces[0] + b'"', b'"' + pieces[1] + b'"', b'"' + pieces[2]
        pairs = zip(user, system) if pieces[3] == b"user-first" else zip(system, user)
        bodies = [join((head, a, mid, b, tail)) for a, b in pairs]
    return list(map(key_of, bodies)), bodies


def _strings(sub: pa.RecordBatch, template: Template) -> bool:
    return all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in (sub.schema.field(c).type for c in template.columns))


def _escaped(template: Template, sub: pa.RecordBatch) -> list[bytes]:
    """Each row's rendered text, JSON-escaped, without its quotes (a null row's is empty: it goes row by row)."""
    n = sub.num_rows
    if n == 0:
        return []
    args: list[Any] = []
    for lit, col in template.parts:
        if lit:
            args.append(pa.scalar(lit, pa.string()))
        if col is not None:
            args.append(sub.column(col).cast(pa.string()))
    if not any(isinstance(a, pa.Array) for a in args):
        texts = ["".join(lit for lit, _ in template.parts)] * n
    else:
        args.append(pa.scalar("", pa.string()))  # (the separator: none)
        texts = pc.fill_null(pc.binary_join_element_wise(*args), "").to_pylist()
    return orjson.dumps(texts)[2:-2].split(b'","')


def _vouched(spec: TableSpec, sub: pa.RecordBatch, templates: list[Template], duplicated: Mapping[Any, list[int]]) -> list[bool]:
    """Rows with every templated column and the id present, and the id not duplicated."""
    ok = [True] * sub.num_rows
    for col in {c for t in templates for c in t.columns} | ({spec.id_column} if spec.id_column else set()):
        if sub.column(col).null_count:
            for i, null in enumerate(sub.column(col).is_null().to_pylist()):
                if null:
                    ok[i] = False
    if spec.id_column and duplicated:
        for i, value in enumerate(sub.column(spec.id_column).to_pylist()):
            if value is not None and hashable(value) in duplicated:
                ok[i] = False
    return ok
