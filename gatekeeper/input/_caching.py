"""What the reader notes about prompt caching, line by line, for `plan`'s caching report and for priming.

The reader adds a marked line's prefixes (`_markers.marker_walk`) to `CacheScan`, in flat arrays (`Marks`, in bytes
here: the request's and each prefix's), and counts long unmarked system prompts and tool lists that lines share in
`CacheScan.unmarked`; a line with neither costs the reader one attribute check. The parallel reader's workers send
it with `marshal`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from itertools import chain
from operator import sub
from typing import TYPE_CHECKING, Any

import msgspec

from .._arrays import extend
from ..decide._priming import Marks

if TYPE_CHECKING:
    from ._markers import Point

UNMARKED_MIN_BYTES = 2048  # a shorter unmarked prefix is below every model's minimum (512 tokens at ~4 bytes each)
UNMARKED_KEYS = 100_000  # distinct unmarked prefixes remembered at most (the report's suggestion, not a count of all)


SETTLE_ROWS = 4096  # pending lines at most: a line's objects are about 250 bytes, its share of the arrays about 50
_HOUR = {"5m": 0, "1h": 1}


class CacheScan:
    """The caching facts of a file's valid lines (duplicates included: the report drops rejected lines). Marked line
    k is `lines[k]` at byte `offsets[k]`, its custom_id `cids[k]`; `marks` holds its model, size and prefixes.

    The reader notes a chunk's marked lines as columns (`note`: a list extended a column, no step a line), kept
    pending (`pending`: lines, offsets, sizes, custom_ids, models, points) until `SETTLE_ROWS` are; `settle()` moves
    them into the arrays in whole-column passes, and every reader of the arrays (the properties) settles first.

    Exported to be named (the type of `PlanReport.cache_scan`); read it through `PlanReport.caching`: its members
    are the reader's own and may change."""

    __slots__ = ("pending", "_marks", "_lines", "_later", "_pieces", "_offsets", "_cids", "read_ids", "unmarked",
                 "_model_index")

    def __init__(self) -> None:
        self.pending: tuple[list[int], list[int], list[int], list[str], list[str], list[tuple[Point, ...]]] = (
            [], [], [], [], [], [])
        self._marks = Marks("bytes")  # (the reader's sizes; `_cachereport` sizes them in tokens)
        self._lines = array("q")
        self._later: list[tuple[int, array[int]]] = []  # merged pieces' lines, numbered from their base when asked for
        self._pieces: list[tuple[int, CacheScan]] = []  # merged pieces not yet joined (`merge`)
        self._offsets = array("q")
        self._cids: list[str] | None = []  # None: not kept, `read_ids` reads them back (the parallel reader's)
        self.read_ids: Callable[[array[int]], list[str]] | None = None
        # (model, what, size, key) -> lines that share it unmarked; `what` is "system" or "tools"
        self.unmarked: dict[tuple[str, str, int, Any], int] = {}
        self._model_index: dict[str, int] = {}

    @property
    def marks(self) -> Marks:
        self.settle()
        return self._marks

    @property
    def lines(self) -> array[int]:
        self.settle()
        if self._later:
            self._number()
        return self._lines

    def any_line_in(self, lines: set[int]) -> bool:
        """Whether a marked line is one of `lines`, told without numbering the merged pieces' lines (`_number`)."""
        self.settle()
        if not lines:
            return False
        for base, piece in self._later:  # (the few lines asked about shifted to the piece's numbering, not its lines)
            if not {line - base for line in lines}.isdisjoint(piece):
                return True
        return not lines.isdisjoint(self._lines)

    def _number(self) -> None:
        """The merged pieces' line numbers counted from their bases (a pass `plan` skips: only a report with
        rejected lines, and priming, read them)."""
        for base, lines in self._later:
            extend(self._lines, map(base.__add__, lines))
        self._later.clear()

    @property
    def offsets(self) -> array[int]:
        self.settle()
        return self._offsets

    @property
    def cids(self) -> list[str]:
        """The marked lines' custom_ids. The parallel reader's workers send none (the parent would receive, hold and
        free 100,000 strings that only priming reads, and `submit` reads in one process): they are read back from
        the file by offset, once, if ever asked for."""
        self.settle()
        if self._cids is None:
            assert self.read_ids is not None, "custom_ids not kept, and nothing to read them back with"
            self._cids = self.read_ids(self._offsets)
        return self._cids

    def _index(self, model: str) -> int:
        m = self._model_index.get(model)
        if m is None:
            m = self._model_index[model] = len(self._marks.models)
            self._marks.models.append(model)
        return m

    def add(self, line: int, offset: int, size: int, cid: str, model: str, points: tuple[Point, ...]) -> None:
        """One marked line."""
        self.note((line,), (offset,), (size,), (cid,), (model,), (points,))
        self.settle()

    def note(self, lines: Iterable[int], offsets: Iterable[int], sizes: Iterable[int], cids: Iterable[str],
             models: Iterable[str], points: Iterable[tuple[Point, ...]]) -> None:
        """Marked lines as columns, in line order after those noted before; settled once `SETTLE_ROWS` are pending."""
        pending = self.pending
        for column, values in zip(pending, (lines, offsets, sizes, cids, models, points)):
            column.extend(values)  # type: ignore[attr-defined]
        if len(pending[0]) >= SETTLE_ROWS:
            self.settle()

    def settle(self) -> None:
        """Bring the arrays up to date: the merged pieces joined first (`_join`), then the pending lines moved in, a
        column at a time (C loops, no Python step a line)."""
        if self._pieces:
            self._join()
        if not self.pending[0]:
            return
        if self._later:
            self._number()
        lines, offsets, sizes, cids, models, points = self.pending
        self.pending = ([], [], [], [], [], [])
        extend(self._lines, lines)
        extend(self._offsets, offsets)
        if self._cids is not None:  # (else they are read back by offset)
            self._cids.extend(cids)
        names = set(models)
        for name in names:
            self._index(name)
        m, n, index = self._marks, len(models), self._model_index
        # (the common case made without a step an item: one model, one point a line (every row has one at least),
        # every life 5m)
        extend(m.model, (index[models[0]],) * n if len(names) == 1 else tuple(map(index.__getitem__, models)))
        extend(m.size, sizes)
        flat = list(chain.from_iterable(points))
        m.counted(n, None if len(flat) == n else map(len, points))
        if flat:
            psize, digest, life = zip(*flat)
            extend(m.psize, psize)
            extend(m.digest, digest)
            m.hour.extend(bytes(len(life)) if life.count("5m") == len(life) else map(_HOUR.__getitem__, life))

    def __len__(self) -> int:
        return len(self.marks.model)

    def merge(self, other: CacheScan, base: int) -> None:
        """Add a piece's facts, its line numbers counted from `base` (the lines before the piece). Its arrays are
        joined to ours when first read (`_join`): extended piece by piece, the growing arrays were reallocated and
        copied each time, half of the parent's merging."""
        other.settle()
        for name in other._marks.models:
            self._index(name)
        self._pieces.append((base, other))
        if other._cids is None or self._cids is None:
            self._cids = None  # (the workers' pieces: read back when asked for)
        else:
            self._cids.extend(other._cids)
        for key, n in other.unmarked.items():
            if key in self.unmarked or len(self.unmarked) < UNMARKED_KEYS:
                self.unmarked[key] = self.unmarked.get(key, 0) + n

    def _join(self) -> None:
        """The merged pieces' arrays after ours, in order: each piece's model numbers remapped to ours where they
        differ and its points counted on from ours; each column then joined in one copy."""
        pieces, self._pieces = self._pieces, []
        m = self._marks
        for base, o in pieces:
            om, n = o._marks, len(o._marks.model)
            remap = [self._model_index[name] for name in om.models]
            extend(m.model, om.model if remap == list(range(len(remap))) else map(remap.__getitem__, om.model))
            m.counted(n, None if len(om.digest) == n else map(sub, om.first[1:], om.first[:-1]))
            if base == 0 and not self._later:
                self._lines.extend(o._lines)
            else:
                self._later.append((base, o._lines))
        for column in ("size", "psize", "digest"):
            getattr(m, column).frombytes(b"".join(getattr(o._marks, column) for _, o in pieces))  # (arrays are buffers)
        m.hour.extend(b"".join(o._marks.hour for _, o in pieces))
        self._offsets.frombytes(b"".join(o._offsets for _, o in pieces))

    def to_marshal(self) -> tuple[Any, ...]:
        m = self.marks
        first = m.first.tobytes() if isinstance(m.first, array) else None  # (None: a range, one point each)
        return (m.models, m.model.tobytes(), m.size.tobytes(), first, m.psize.tobytes(),
                m.digest.tobytes(), bytes(m.hour), self.lines.tobytes(), self.offsets.tobytes(),
                list(self.unmarked.items()))

    @classmethod
    def from_marshal(cls, data: tuple[Any, ...]) -> CacheScan:
        scan = cls()
        m = scan._marks
        m.models = list(data[0])
        for target, raw in ((m.model, data[1]), (m.size, data[2]), (m.psize, data[4]), (m.digest, data[5]),
                            (scan._lines, data[7]), (scan._offsets, data[8])):
            target.frombytes(raw)
        if data[3] is None:
            m.first = range(len(m.model) + 1)
        else:
            m.first = array("q")
            m.first.frombytes(data[3])
        m.hour = bytearray(data[6])
        scan._cids = None  # (not sent: see `cids`)
        scan.unmarked = {tuple(k): n for k, n in data[9]}
        scan._model_index = {name: i for i, name in enumerate(m.models)}
        return scan


def note_unmarked(scan: CacheScan, model: str, system: Any, tools: Any) -> None:
    """Count a line's long system prompt and tool list (no marker on the line): shared ones could be cached."""
    for what, part in (("tools", tools), ("system", system)):
        if part is None:
            continue
        if part.__class__ is str:  # (length and both ends: cheap, and near enough for a suggestion)
            key: tuple[str, str, int, Any] = (model, what, len(part.encode()), (part[:64], part[-64:]))
        else:
            data = msgspec.json.encode(part)
            key = (model, what, len(data), hash(data))
        if key[2] >= UNMARKED_MIN_BYTES and (key in scan.unmarked or len(scan.unmarked) < UNMARKED_KEYS):
            scan.unmarked[key] = scan.unmarked.get(key, 0) + 1
