"""A record batch of rows judged at once: the same `Judged` as `_rows.judge` row by row, with the prompts rendered by
Arrow's string kernels and JSON-escaped by one `orjson.dumps` of the batch's texts. Rows the batch path cannot
vouch for (a null templated column, a null or duplicated id) and templates over columns that are not strings go
row by row, through `judge` itself: one definition of a row's request, two speeds.

Why one dump splits exactly: in orjson's encoding of a list of strings, a `"` inside an element is always written
`\\"`, so the three bytes `","` occur only between elements.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from itertools import compress
from operator import add, itemgetter, methodcaller
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ._rows import KEY_HEX, LINE_FRAME, Judged, TableSpec, custom_id_of, frame_lines, hashable, judge
from ._template import Template

_hex, _key_part = methodcaller("hexdigest"), itemgetter(slice(0, KEY_HEX))
_SEP = b'","'  # between two texts in orjson's encoding of a list of strings (see the module's docstring)


class Judgements:
    """A record batch's rows judged, as columns (a million rows in objects of their own were a third of a plan):
    row `first + 1 + i` has `keys[i]`, `cids[i]` and `bodies[i]`, or, when `keys[i]` is None, was rejected for
    `rejected[i]`. Iterated, the rows as `Judged`, as `_rows.judge` gives them."""

    __slots__ = ("first", "keys", "cids", "bodies", "rejected")

    def __init__(self, first: int, keys: list[str | None], cids: list[str | None], bodies: list[bytes],
                 rejected: dict[int, str]) -> None:
        self.first, self.keys, self.cids, self.bodies, self.rejected = first, keys, cids, bodies, rejected

    @classmethod
    def of_rows(cls, first: int, rows: list[Judged]) -> Judgements:
        keys, cids, bodies = ([j.key for j in rows], [j.custom_id for j in rows], [j.body for j in rows])
        return cls(first, keys, cids, bodies, {i: j.rejected for i, j in enumerate(rows) if j.rejected is not None})

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[Judged]:
        for i, (key, cid, body) in enumerate(zip(self.keys, self.cids, self.bodies)):
            yield Judged(self.first + 1 + i, key, cid, body, self.rejected.get(i))

    def put(self, i: int, row: Judged) -> None:
        self.keys[i], self.cids[i], self.bodies[i] = row.key, row.custom_id, row.body
        if row.rejected is not None:
            self.rejected[i] = row.rejected

    def lines(self, keep: list[bool] | None = None) -> tuple[bytes, list[int], list[str]]:
        """The rows `keep` says (default: every row not rejected) as lines of a JSONL job (`Judged.line` each),
        joined at once; each one's request bytes (its line without the newline) and custom_id."""
        cids: list[str]
        if keep is None and not self.rejected:
            cids, bodies = self.cids, self.bodies  # type: ignore[assignment]  # (no row rejected: every one has an id)
        else:
            keep = keep if keep is not None else [k is not None for k in self.keys]
            cids, bodies = list(compress(self.cids, keep)), list(compress(self.bodies, keep))  # type: ignore[arg-type]
        encoded = list(map(str.encode, cids))
        sizes = list(map(LINE_FRAME.__add__, map(add, map(len, encoded), map(len, bodies))))
        return frame_lines(encoded, bodies), sizes, cids


def judge_batch(spec: TableSpec, batch: pa.RecordBatch, first: int, duplicated: Mapping[Any, list[int]]) -> Judgements:
    """The rows of `batch` judged; `first` is the number of the row before it (rows count from 1)."""
    sub = batch.select(list(spec.columns))
    templates = [t for t in (spec.template, spec.system) if t is not None]
    if not all(_strings(sub, t) for t in templates):
        return Judgements.of_rows(first, [judge(spec, row, first + i, duplicated) for i, row in enumerate(sub.to_pylist(), 1)])
    user = _escaped(spec.template, sub)
    system = _escaped(spec.system, sub) if spec.system is not None else None
    vouched = _vouched(spec, sub, templates, duplicated)
    ids = sub.column(spec.id_column).to_pylist() if spec.id_column else None
    bodies = _bodies(spec.pieces, user, system) if sub.num_rows else []
    keys: list[str | None] = list(map(_key_part, map(_hex, map(hashlib.sha256, bodies))))  # (`key_of`, in C loops)
    cids: list[str | None] = list(map("r-".__add__, keys) if ids is None else map(custom_id_of, ids, keys))  # type: ignore[arg-type]
    out = Judgements(first, keys, cids, bodies, {})
    for i in (i for i, ok in enumerate(vouched) if not ok):
        out.put(i, judge(spec, sub.slice(i, 1).to_pylist()[0], first + i + 1, duplicated))
    return out


def _bodies(pieces: tuple[bytes, ...], user: bytes, system: bytes | None) -> list[bytes]:
    """Each row's request body: its escaped prompts (`_escaped`) between the spec's pieces. With the user prompt
    alone, every row's is made at once: the separators replaced by one body's end, a newline and the next one's
    start (an escaped text holds no newline), then split."""
    if system is None:
        head, tail = pieces[0] + b'"', b'"' + pieces[1]
        return (head + user.replace(_SEP, tail + b"\n" + head) + tail).split(b"\n")
    join = b"".join
    head, mid, tail = pieces[0] + b'"', b'"' + pieces[1] + b'"', b'"' + pieces[2]
    users, systems = user.split(_SEP), system.split(_SEP)
    pairs = zip(users, systems) if pieces[3] == b"user-first" else zip(systems, users)
    return [join((head, a, mid, b, tail)) for a, b in pairs]


def _strings(sub: pa.RecordBatch, template: Template) -> bool:
    return all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in (sub.schema.field(c).type for c in template.columns))


def _escaped(template: Template, sub: pa.RecordBatch) -> bytes:
    """The rows' rendered texts, JSON-escaped, without their quotes, between `_SEP`s (a null row's is empty: it
    goes row by row); no rows, none."""
    n = sub.num_rows
    if n == 0:
        return b""
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
    return orjson.dumps(texts)[2:-2]


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
