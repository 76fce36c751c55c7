"""Compact sets for a table's passes, 22-28 bytes an entry where a Python set of strings takes about 100: the
planner's `IdIndex`, fed bits the caller already has.

`SeenKeys`: request keys (sha256 hex digests), told apart by 94 bits of their digest: a false match needs two
different requests among ten million to agree on 94 bits of sha256 (about 1e-15).
`SeenIds`: an id column's values by their hash; an id that looks seen before is only a *candidate* duplicate,
settled exactly by the caller (`_job._Rows._duplicates`).
"""

from __future__ import annotations

from array import array
from typing import Any

from ..input._idindex import FP_SHIFT, IdIndex

_PROOF = (1 << 63) - 1
_FP = (1 << 31) - 1


class SeenKeys:
    def __init__(self) -> None:
        self.index = IdIndex()

    def add(self, key: str) -> bool:
        """Whether `key` is new (and now seen)."""
        return not self.add_many([key])

    def add_many(self, keys: list[str]) -> set[int]:
        """Note `keys` in order; the positions of those seen before (earlier in `keys` included)."""
        proofs, fps = array("q"), array("i")
        for key in keys:
            k = int(key[:24], 16)
            proofs.append(k & _PROOF)
            fps.append((k >> 64) & _FP)
        lines = array("I", [1]) * len(keys)  # (line 1 for all: a line of 0 would read as new)
        return {at for at, _ in self.index.add_many(lines, proofs, fps)}

    def __len__(self) -> int:
        return len(self.index)


class SeenIds:
    def __init__(self) -> None:
        self.index = IdIndex()

    def add_many(self, values: list[Any], rows: list[int]) -> list[tuple[int, int]]:
        """Note each of `values`, on its row of `rows`; (row, the row it looked seen on) for each that looks seen
        before."""
        hashes = [hash((v,)) for v in values]  # (a tuple's hash mixes an int's bits: small ints would share a slot)
        fps = array("i", [h >> FP_SHIFT for h in hashes])
        found = self.index.add_many(array("I", rows), array("q", hashes), fps)
        return [(rows[at], first) for at, first in found]
