"""A record batch of rows judged at once: the same `Judged` as `_rows.judge_row` row by row, with the prompts rendered
and escaped by C-level maps over the batch's columns (no Python step a row). Rows the batch path cannot vouch for (a
null templated column, a null or duplicated id) and templates over columns that are not strings go row by row,
through `judge_row` itself: one definition of a row's request, two speeds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import add, itemgetter, methodcaller
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ._rows import (
    KEY_HEX,
    LINE_FRAME,
    Judged,
    TableSpec,
    custom_id_of,
    framed,
    hashable,
    judge_row,
    kept_id,
    key_of,
    no_id,
)
from ._template import Template

_hex, _key_part = methodcaller("hexdigest"), itemgetter(slice(0, KEY_HEX))


class Judgements:
    """A record batch's rows judged, as columns (a million rows in objects of their own were a third of a plan):
    row `first + 1 + i` has `bodies[i]`, `keys[i]` and `cids[i]`, unless it was rejected for `rejected[i]`. Iterated,
    the rows as `Judged`, as `_rows.judge_row` gives them. Judged without keys (`judge_batch`'s `keyed`), `keys` is
    None, and so is `cids` without an id column: a custom_id is then made only where asked for (`_KeyIds`)."""

    __slots__ = ("first", "keys", "cids", "bodies", "rejected")

    def __init__(self, first: int, keys: list[str | None] | None, cids: list[str | None] | None, bodies: list[bytes],
                 rejected: dict[int, str]) -> None:
        self.first, self.keys, self.cids, self.bodies, self.rejected = first, keys, cids, bodies, rejected

    @classmethod
    def of_rows(cls, first: int, rows: list[Judged]) -> Judgements:
        keys, cids, bodies = ([j.key for j in rows], [j.custom_id for j in rows], [j.body for j in rows])
        return cls(first, keys, cids, bodies, {i: j.rejected for i, j in enumerate(rows) if j.rejected is not None})

    def __len__(self) -> int:
        return len(self.bodies)

    def __iter__(self) -> Iterator[Judged]:
        assert self.keys is not None and self.cids is not None, "judged without keys"
        for i, (key, cid, body) in enumerate(zip(self.keys, self.cids, self.bodies)):
            yield Judged(self.first + 1 + i, key, cid, body, self.rejected.get(i))

    def put(self, i: int, row: Judged) -> None:
        self.bodies[i] = row.body
        if self.keys is not None:
            self.keys[i] = row.key
        if self.cids is not None:
            self.cids[i] = row.custom_id
        if row.rejected is not None:
            self.rejected[i] = row.rejected

    def kept(self, keep: list[bool] | None = None) -> tuple[Sequence[str], list[bytes]]:
        """The custom_ids and bodies of the rows `keep` says (default: every row not rejected)."""
        if keep is None and not self.rejected:
            cids, bodies = self.cids, self.bodies
        else:
            keep = keep if keep is not None else [i not in self.rejected for i in range(len(self))]
            cids = None if self.cids is None else list(compress(self.cids, keep))
            bodies = list(compress(self.bodies, keep))
        return (_KeyIds(bodies) if cids is None else cids), bodies  # type: ignore[return-value]  # (kept: an id each)

    def row_numbers(self, keep: list[bool] | None = None) -> np.ndarray:
        """The numbers of the rows `kept` gives (rows count from 1), as 32-bit words."""
        rows = np.arange(self.first + 1, self.first + 1 + len(self), dtype="<u4")
        if keep is None and not self.rejected:
            return rows
        keep = keep if keep is not None else [i not in self.rejected for i in range(len(self))]
        return rows[np.array(keep, bool)]  # type: ignore[no-any-return]

    def lines(self, keep: list[bool] | None = None) -> bytes:
        """The rows `keep` says as lines of a JSONL job (`Judged.line` each), joined at once."""
        cids, bodies = self.kept(keep)
        return b"".join(framed(list(map(str.encode, cids)), bodies))

    def sizes(self, keep: list[bool] | None = None) -> tuple[list[int], Sequence[str]]:
        """What `lines` would write, sized without writing it: each request's bytes (its line less the newline: a
        custom_id is ASCII) and custom_id."""
        cids, bodies = self.kept(keep)
        lengths = repeat(_KeyIds.LENGTH) if isinstance(cids, _KeyIds) else map(len, cids)
        return list(map(LINE_FRAME.__add__, map(add, lengths, map(len, bodies)))), cids


class _KeyIds(Sequence[str]):
    """The custom_ids of rows without an id column ("r-" and the key), each made when asked for: a plan asks for
    its batches' edges and its largest request alone."""

    LENGTH = len(custom_id_of(None, "")) + KEY_HEX

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies

    def __len__(self) -> int:
        return len(self.bodies)

    def __getitem__(self, k: Any) -> Any:  # (an index: a plan asks for no slice)
        return custom_id_of(None, key_of(self.bodies[k]))


def judge_batch(spec: TableSpec, batch: pa.RecordBatch, first: int, duplicated: Mapping[Any, list[int]], *,
                keyed: bool = True) -> Judgements:
    """The rows of `batch` judged; `first` is the number of the row before it (rows count from 1). Not `keyed`: no
    row's key is computed (a sha256 each, most of a batch's time), for a plan with no answers to look them up in."""
    sub = batch.select(list(spec.columns))
    templates = [t for t in (spec.template, spec.system) if t is not None]
    if not all(_strings(sub, t) for t in templates):
        return Judgements.of_rows(first, [judge_row(spec, row, first + i, duplicated) for i, row in enumerate(sub.to_pylist(), 1)])
    user = _rendered(spec.template, sub)
    system = _rendered(spec.system, sub) if spec.system is not None else None
    ids = sub.column(spec.id_column).to_pylist() if spec.id_column else None
    floats = spec.id_column is not None and pa.types.is_floating(sub.schema.field(spec.id_column).type)
    unvouched = _unvouched(sub, templates, ids, duplicated, floats)
    bodies = _bodies(spec.pieces, user, system)
    keys: list[str | None] | None = list(map(_key_part, map(_hex, map(hashlib.sha256, bodies)))) if keyed else None
    out = Judgements(first, keys, _custom_ids(ids, keys), bodies, {})
    nulls = _nulls(sub, templates, unvouched)
    for i, column in nulls.items():  # (what `judge_row` says of them, without a row's values made a dict each)
        cid = kept_id(ids[i], duplicated) if ids is not None else None
        out.put(i, Judged(first + i + 1, custom_id=cid, rejected=f"row {first + i + 1}: column {column!r} is null"))
    rest = [i for i in unvouched if i not in nulls]
    if rest:  # (their values taken at once: a slice a row was most of a plan of a sparse column)
        for i, row in zip(rest, _taken(sub, rest)):
            out.put(i, judge_row(spec, row, first + i + 1, duplicated))
    return out


def _taken(sub: pa.RecordBatch, rows: list[int]) -> list[dict[str, Any]]:
    """The values of `rows` (no kernel takes from a view column: those are read as plain strings for it)."""
    at = pa.array(rows, pa.int64())
    try:
        return sub.take(at).to_pylist()  # type: ignore[no-any-return]
    except pa.ArrowNotImplementedError:
        plain = [c.cast(pa.string()) if pa.types.is_string_view(c.type) else
                 c.cast(pa.binary()) if pa.types.is_binary_view(c.type) else c for c in sub.columns]
        return pa.record_batch(plain, names=sub.schema.names).take(at).to_pylist()  # type: ignore[no-any-return]


def _nulls(sub: pa.RecordBatch, templates: list[Template], rows: list[int]) -> dict[int, str]:
    """Of `rows`, those null in a templated column (strings: never NaN nor bytes), each with its first such column
    in the order `judge_row` looks at them."""
    if not rows:
        return {}
    out: dict[int, str] = {}
    for col in dict.fromkeys(c for t in templates for c in t.columns):
        column = sub.column(col)
        if column.null_count:
            for i in compress(range(sub.num_rows), column.is_null().to_pylist()):
                out.setdefault(i, col)
    return out


def _custom_ids(ids: list[Any] | None, keys: list[str | None] | None) -> list[str | None] | None:
    """The rows' custom_ids (`custom_id_of`): from the id column, else from the keys (None: no keys, none yet)."""
    if ids is not None:  # (a null id, the one that needs a key, goes row by row)
        return list(map(custom_id_of, ids, repeat("") if keys is None else keys))  # type: ignore[arg-type]
    return None if keys is None else list(map("r-".__add__, keys))  # type: ignore[arg-type]


def _bodies(pieces: tuple[bytes, ...], user: list[str], system: list[str] | None) -> list[bytes]:
    """Each row's request body (`_rows.body_of`): its prompts, JSON-encoded, between the spec's pieces. (One join a
    row: the batch's texts encoded at once and split, or joined whole and split, took twice as long.)"""
    dumps, n = orjson.dumps, len(user)
    if system is None:
        return list(map(b"".join, zip(repeat(pieces[0], n), map(dumps, user), repeat(pieces[1], n))))
    a, b = (user, system) if pieces[3] == b"user-first" else (system, user)
    return list(map(b"".join, zip(repeat(pieces[0], n), map(dumps, a), repeat(pieces[1], n), map(dumps, b),
                                  repeat(pieces[2], n))))


def is_text(t: pa.DataType) -> bool:
    """A string type the batch path takes: string, large_string, or string_view (polars' strings)."""
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _strings(sub: pa.RecordBatch, template: Template) -> bool:
    return all(is_text(sub.schema.field(c).type) for c in template.columns)


def _rendered(template: Template, sub: pa.RecordBatch) -> list[str]:
    """Each row's rendered text (a null field renders empty: that row goes row by row)."""
    n = sub.num_rows
    values = {c: _texts(sub.column(c)) for c in template.columns}
    parts: list[Any] = []
    for lit, col in template.parts:
        if lit:
            parts.append(repeat(lit, n))
        if col is not None:
            parts.append(values[col])
    if len(parts) <= 1:
        return list(parts[0]) if parts else [""] * n
    return list(map(str.__add__, *parts) if len(parts) == 2 else map("".join, zip(*parts)))


def _texts(column: pa.Array) -> list[str]:
    """A string column's values, a null as empty (filled only where there is one: a copy of the column)."""
    if column.null_count and pa.types.is_string_view(column.type):
        column = column.cast(pa.string())  # (no kernel fills a string_view's nulls)
    return (pc.fill_null(column, "") if column.null_count else column).to_pylist()  # type: ignore[no-any-return]


def _unvouched(sub: pa.RecordBatch, templates: list[Template], ids: list[Any] | None,
               duplicated: Mapping[Any, list[int]], floats: bool = False) -> list[int]:
    """The rows, in order, with a templated column or the id (`ids`: the id column's values) null or NaN, or the id
    duplicated (none: a batch of sound rows, told from the columns' null counts; `floats`: the ids are floats, which
    may be NaN)."""
    bad: set[int] = set()
    for col in {c for t in templates for c in t.columns}:
        if sub.column(col).null_count:
            bad.update(compress(range(sub.num_rows), sub.column(col).is_null().to_pylist()))
    if ids is not None and (duplicated or None in ids or (floats and any(map(no_id, ids)))):
        bad.update(i for i, value in enumerate(ids) if no_id(value) or hashable(value) in duplicated)
    return sorted(bad)
