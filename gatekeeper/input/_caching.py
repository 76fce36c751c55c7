"""What the reader notes about prompt caching, line by line, for `plan`'s caching report and for priming.

The reader adds a marked line's prefixes (`_markers.marker_points`) to `CacheScan`, in flat arrays (`Marks`, in bytes
here: the request's and each prefix's), and counts long unmarked system prompts and tool lists that lines share in
`CacheScan.unmarked`; a line with neither costs the reader one attribute check. The parallel reader's workers send
it with `marshal`.
"""

from __future__ import annotations

from array import array

from .._typing import TYPE_CHECKING
from ..decide._priming import Marks
from ._markers import marker_points

if TYPE_CHECKING:
    from typing import Any

    from ._markers import Point

UNMARKED_MIN_BYTES = 2048  # a shorter unmarked prefix is below every model's minimum (512 tokens at ~4 bytes each)
UNMARKED_KEYS = 100_000  # distinct unmarked prefixes remembered at most (the report's suggestion, not a count of all)


class CacheScan:
    """The caching facts of a file's valid lines (duplicates included: the report drops rejected lines). Marked line
    k is `lines[k]` at byte `offsets[k]`, its custom_id `cids[k]`; `marks` holds its model, size and prefixes."""

    __slots__ = ("marks", "lines", "offsets", "cids", "unmarked", "_model_index")

    def __init__(self) -> None:
        self.marks = Marks("bytes")  # (the reader's sizes; `_cachereport` sizes them in tokens)
        self.lines = array("q")
        self.offsets = array("q")
        self.cids: list[str] = []
        # (model, what, size, key) -> lines that share it unmarked; `what` is "system" or "tools"
        self.unmarked: dict[tuple[str, str, int, Any], int] = {}
        self._model_index: dict[str, int] = {}

    def _index(self, model: str) -> int:
        m = self._model_index.get(model)
        if m is None:
            m = self._model_index[model] = len(self.marks.models)
            self.marks.models.append(model)
        return m

    def add(self, line: int, offset: int, size: int, cid: str, model: str, points: tuple[Point, ...]) -> None:
        m = self._model_index.get(model)
        if m is None:
            m = self._index(model)
        self.lines.append(line)
        self.offsets.append(offset)
        self.cids.append(cid)
        marks = self.marks  # (appended here, not through Marks.add's generator: this runs once a marked line)
        marks.model.append(m)
        marks.size.append(size)
        for size_, digest, life in points:
            marks.psize.append(size_)
            marks.digest.append(digest)
            marks.hour.append(life == "1h")
        marks.first.append(len(marks.digest))

    def __len__(self) -> int:
        return len(self.lines)

    def merge(self, other: CacheScan, base: int) -> None:
        """Add a piece's facts, its line numbers counted from `base` (the lines before the piece)."""
        o, m = other.marks, self.marks
        remap = array("H", (self._index(name) for name in o.models))
        points = len(m.digest)
        # (whole arrays where the piece's numbering is ours already: a C loop, not a Python step a line)
        same = list(remap) == list(range(len(remap)))
        m.model.extend(o.model if same else array("H", (remap[i] for i in o.model)))
        m.size.extend(o.size)
        m.first.extend(o.first[1:] if points == 0 else array("q", map(points.__add__, o.first[1:])))
        m.psize.extend(o.psize)
        m.digest.extend(o.digest)
        m.hour.extend(o.hour)
        self.lines.extend(other.lines if base == 0 else array("q", map(base.__add__, other.lines)))
        self.offsets.extend(other.offsets)
        self.cids.extend(other.cids)
        for key, n in other.unmarked.items():
            if key in self.unmarked or len(self.unmarked) < UNMARKED_KEYS:
                self.unmarked[key] = self.unmarked.get(key, 0) + n

    def to_marshal(self) -> tuple[Any, ...]:
        m = self.marks
        return (m.models, m.model.tobytes(), m.size.tobytes(), m.first.tobytes(), m.psize.tobytes(),
                m.digest.tobytes(), bytes(m.hour), self.lines.tobytes(), self.offsets.tobytes(), self.cids,
                list(self.unmarked.items()))

    @classmethod
    def from_marshal(cls, data: tuple[Any, ...]) -> CacheScan:
        scan = cls()
        m = scan.marks
        m.models = list(data[0])
        for target, raw in ((m.model, data[1]), (m.size, data[2]), (m.psize, data[4]), (m.digest, data[5]),
                            (scan.lines, data[7]), (scan.offsets, data[8])):
            target.frombytes(raw)
        m.first = array("q")
        m.first.frombytes(data[3])
        m.hour = bytearray(data[6])
        scan.cids = list(data[9])
        scan.unmarked = {tuple(k): n for k, n in data[10]}
        scan._model_index = {name: i for i, name in enumerate(m.models)}
        return scan


def note_marked(scan: CacheScan, line: int, offset: int, size: int, cid: str, model: str, params: dict[str, Any],
                points: tuple[Point, ...] | None = None) -> None:
    """Note a line that names `cache_control`: its marked prefixes (`points`, when the caller walked them already),
    or, when it has none, its long unmarked parts."""
    if points is None:
        points = marker_points(params, model)
    if points:
        scan.add(line, offset, size, cid, model, points)
    else:
        note_unmarked(scan, model, params.get("system"), params.get("tools"))


def note_unmarked(scan: CacheScan, model: str, system: Any, tools: Any) -> None:
    """Count a line's long system prompt and tool list (no marker on the line): shared ones could be cached."""
    import orjson

    for what, part in (("tools", tools), ("system", system)):
        if part is None:
            continue
        if part.__class__ is str:  # (length and both ends: cheap, and near enough for a suggestion)
            key: tuple[str, str, int, Any] = (model, what, len(part.encode()), (part[:64], part[-64:]))
        else:
            data = orjson.dumps(part)
            key = (model, what, len(data), hash(data))
        if key[2] >= UNMARKED_MIN_BYTES and (key in scan.unmarked or len(scan.unmarked) < UNMARKED_KEYS):
            scan.unmarked[key] = scan.unmarked.get(key, 0) + 1
