"""A compact set of custom_ids that remembers where each was first seen.

A Python set of ten million strings costs about 90 bytes an id. This table is
three flat arrays (a 64-bit SipHash, the first line number, the first byte
offset): 20 bytes a slot at a load of at most 0.7, so 29 to 40 bytes an id when
sized up front. The reader inlines the common case (an empty home slot) and
calls `insert_slow` for the rest, which keeps the hot path short.

Equal hashes are confirmed exactly through `confirm(offset)` (the reader
re-reads the earlier line) when the source is a file; for an iterable source the
64-bit hash alone decides, a false duplicate having probability about n^2/2^65
(3e-6 for ten million ids), reported loudly, never a silent drop.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

MAX_LOAD = 0.7


def capacity_for(expected: int) -> int:
    cap = 1024
    while cap * MAX_LOAD < expected:
        cap *= 2
    return cap


class IdIndex:
    __slots__ = ("hashes", "lines", "offsets", "mask", "used", "limit")

    def __init__(self, expected: int = 0) -> None:
        self._alloc(capacity_for(expected))
        self.used = 0

    def _alloc(self, cap: int) -> None:
        self.hashes = array("q", bytes(8 * cap))
        self.lines = array("I", bytes(4 * cap))  # 0 marks an empty slot: lines are 1-based
        self.offsets = array("q", bytes(8 * cap))
        self.mask = cap - 1
        self.limit = int(cap * MAX_LOAD)

    def __len__(self) -> int:
        return self.used

    def views(self) -> tuple[int, array, array, array, int]:
        """(mask, lines, hashes, offsets, limit): what an inlined probe loop holds, refreshed after growth."""
        return self.mask, self.lines, self.hashes, self.offsets, self.limit

    def reserve(self, expected: int) -> None:
        """Grow once to hold `expected` ids, instead of rehashing as it fills."""
        cap = capacity_for(expected)
        if cap > self.mask + 1:
            self._rehash(cap)

    def add(self, custom_id: str, line: int, offset: int = -1, confirm: Callable[[int], str | None] | None = None) -> int:
        """Record `custom_id` (first seen on `line`); return 0, or the earlier line when seen before."""
        h = hash(custom_id)
        i = h & self.mask
        if not self.lines[i]:
            self.hashes[i] = h
            self.lines[i] = line
            self.offsets[i] = offset
            self.used += 1
            if self.used > self.limit:
                self._rehash((self.mask + 1) * 2)
            return 0
        return self.insert_slow(h, custom_id, line, offset, confirm)

    def add_slow(
        self, h: int, custom_id: str | Callable[[], str | None], line: int, offset: int,
        confirm: Callable[[int], str | None] | None, used: int,
    ) -> int:
        """The rest of an inlined add, for a taken home slot or a full table: `used` is the caller's count.

        Returns 0 or the earlier line; the caller reloads `used` and, if `mask` changed, its `views()`.
        """
        self.used = used
        return self.insert_slow(h, custom_id, line, offset, confirm)

    def insert_slow(
        self, h: int, custom_id: str | Callable[[], str | None], line: int, offset: int,
        confirm: Callable[[int], str | None] | None,
    ) -> int:
        """Probe past a taken home slot. `custom_id` may be a callable (read only when a hash matches)."""
        mask, lines, hashes = self.mask, self.lines, self.hashes
        i = h & mask
        while lines[i]:
            if hashes[i] == h:
                earlier = self.offsets[i]
                if confirm is None or earlier < 0:
                    return lines[i]
                mine = custom_id() if callable(custom_id) else custom_id
                if confirm(earlier) == mine:
                    return lines[i]
            i = (i + 1) & mask
        hashes[i] = h
        lines[i] = line
        self.offsets[i] = offset
        self.used += 1
        if self.used > self.limit:
            self._rehash((mask + 1) * 2)
        return 0

    def _rehash(self, cap: int) -> None:
        old = zip(self.hashes, self.lines, self.offsets)
        self._alloc(cap)
        mask, hashes, lines, offsets = self.mask, self.hashes, self.lines, self.offsets
        for h, line, offset in old:
            if not line:
                continue
            i = h & mask
            while lines[i]:
                i = (i + 1) & mask
            hashes[i] = h
            lines[i] = line
            offsets[i] = offset
