"""What the reader notes about prompt caching, line by line, for `plan`'s caching report and for priming.

The reader appends a marked line's prefixes (`_markers.marker_points`) to `CacheScan.marked`, and counts long
unmarked system prompts and tool lists that lines share in `CacheScan.unmarked`; a line with neither costs the
reader one attribute check. Everything here is plain data, sent by the parallel reader's workers with `marshal`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: `plan` never imports typing, see gatekeeper/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._markers import Point

UNMARKED_MIN_BYTES = 2048  # a shorter unmarked prefix is below every model's minimum (512 tokens at ~4 bytes each)
UNMARKED_KEYS = 100_000  # distinct unmarked prefixes remembered at most (the report's suggestion, not a count of all)


class CacheScan:
    """The caching facts of a file's valid lines (duplicates included: the report drops rejected lines)."""

    __slots__ = ("marked", "unmarked")

    def __init__(self) -> None:
        # (line, offset, bytes, custom_id, model, prefixes shortest first)
        self.marked: list[tuple[int, int, int, str, str, tuple[Point, ...]]] = []
        # (model, what, size, key) -> lines that share it unmarked; `what` is "system" or "tools"
        self.unmarked: dict[tuple[str, str, int, Any], int] = {}

    def merge(self, other: CacheScan, base: int) -> None:
        """Add a piece's facts, its line numbers counted from `base` (the lines before the piece)."""
        self.marked += [(base + line, *rest) for line, *rest in other.marked]  # type: ignore[misc]
        for key, n in other.unmarked.items():
            if key in self.unmarked or len(self.unmarked) < UNMARKED_KEYS:
                self.unmarked[key] = self.unmarked.get(key, 0) + n

    def to_marshal(self) -> tuple[list[Any], list[Any]]:
        return self.marked, list(self.unmarked.items())

    @classmethod
    def from_marshal(cls, data: tuple[list[Any], list[Any]]) -> CacheScan:
        scan = cls()
        scan.marked = [tuple(m) for m in data[0]]
        scan.unmarked = {tuple(k): n for k, n in data[1]}
        return scan


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
