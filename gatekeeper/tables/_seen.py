"""Compact sets for a table's passes: an open-addressing table of numpy arrays (a 64-bit hash and a 32-bit word a
slot, 12 bytes; at a load of at most 0.7, about 17 bytes an entry where a Python set of strings takes about 100),
probed a record batch at a time by array operations instead of a Python step a row.

`SeenRequests`: requests by their bodies, told apart by 95 bits (63 of Python's keyed hash, siphash, and a crc32 as the
word): a false match needs two different requests among ten million to agree on both (about 1e-15). (Their keys,
sha256, would do as well at seven times the cost: a plan of a table that has no answers yet computes none.)
`SeenIds`: an id column's values by their hash (the word is the row first seen on); an id that looks seen before is
only a *candidate* duplicate, settled exactly by the caller (`_job._Rows._duplicates`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_LOAD = 0.7


class _Slots:
    """The table: `h` (0 marks a free slot) and `w` by slot; grown by reinserting when a batch would pass the load."""

    def __init__(self, expected: int) -> None:
        self.used = 0
        self._alloc(max(1 << 12, int(expected / MAX_LOAD) + 1))

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        self.h = np.zeros(cap, np.uint64)
        self.w = np.zeros(cap, np.uint32)

    def put(self, h: np.ndarray, w: np.ndarray, *, match_word: bool) -> tuple[np.ndarray, np.ndarray]:
        """Insert the distinct `h` (nonzero) with their words; for each, whether it was there already (its `h`, and
        its word too if `match_word`) and the word found there."""
        if self.used + len(h) > self.cap * MAX_LOAD:
            self._grow(self.used + len(h))
        return self._probe(h, w, match_word)

    def _grow(self, need: int) -> None:
        taken = self.h != 0
        h, w = self.h[taken], self.w[taken]
        self._alloc(max(2 * self.cap, int(need / MAX_LOAD) + 1))
        self.used = 0
        self._probe(h, w, True)

    def _probe(self, h: np.ndarray, w: np.ndarray, match_word: bool) -> tuple[np.ndarray, np.ndarray]:
        """Linear probing, every entry of the batch one step a round: an entry ends on its own slot (found) or on a
        free one it claims; entries claiming one free slot are told apart by reading it back (one wins, the rest
        step on)."""
        th, tw, cap = self.h, self.w, self.cap
        pos = (h % np.uint64(cap)).astype(np.int64)
        found = np.zeros(len(h), bool)
        word = np.zeros(len(h), np.uint32)
        todo = np.arange(len(h))
        while todo.size:
            p = pos[todo]
            at = th[p]
            hit = at == h[todo]
            if match_word:
                hit &= tw[p] == w[todo]
            found[todo[hit]], word[todo[hit]] = True, tw[p[hit]]
            free = at == 0
            claim, slot = todo[free], p[free]
            th[slot], tw[slot] = h[claim], w[claim]
            won = (th[slot] == h[claim]) & (tw[slot] == w[claim])
            self.used += int(won.sum())
            todo = np.concatenate((todo[~hit & ~free], claim[~won]))
            pos[todo] = (pos[todo] + 1) % cap
        return found, word


def _firsts(values: list[Any]) -> tuple[list[int], dict[int, int]]:
    """The positions of the distinct values in order, and each later repeat's position with its first's."""
    if len(set(values)) == len(values):
        return list(range(len(values))), {}
    first: dict[Any, int] = {}
    again: dict[int, int] = {}
    for at, v in enumerate(values):
        if v in first:
            again[at] = first[v]
        else:
            first[v] = at
    return list(first.values()), again


class SeenRequests:
    def __init__(self, expected: int = 0) -> None:
        self._slots = _Slots(expected)

    def add_many(self, bodies: list[bytes]) -> set[int]:
        """Note the requests' `bodies` in order; the positions of those seen before (earlier in `bodies` included)."""
        distinct, again = _firsts(bodies)
        if not distinct:
            return set()
        h, w = fingerprints(bodies if len(distinct) == len(bodies) else [bodies[at] for at in distinct])
        found, _ = self._slots.put(h, w, match_word=True)
        return set(again) | {distinct[i] for i in np.flatnonzero(found)}

    def __len__(self) -> int:
        return self._slots.used


def fingerprints(bodies: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Each body's hash, nonzero (0 marks a free slot: it keeps 63 bits), and its crc32 as the word."""
    h = np.array(list(map(hash, bodies)), np.int64).view(np.uint64) | np.uint64(1)
    return h, np.array(list(map(zlib.crc32, bodies)), np.uint32)


class SeenIds:
    def __init__(self, expected: int = 0) -> None:
        self._slots = _Slots(expected)

    def add_many(self, values: list[Any], rows: Sequence[int]) -> list[tuple[int, int]]:
        """Note each of `values`, on its row of `rows`; (row, the row it looked seen on) for each that looks seen
        before."""
        # (a tuple's hash mixes an int's bits: small ints would share a slot; values equal in Python repeat here.
        # `zip` of one list makes the 1-tuples without a Python step a value)
        hashes = list(map(hash, zip(values)))
        distinct, again = _firsts(hashes)
        out = [(rows[at], rows[first]) for at, first in again.items()]
        if distinct:
            every = len(distinct) == len(hashes)
            h = np.array(hashes if every else [hashes[at] for at in distinct], np.int64).view(np.uint64) | np.uint64(1)
            words = np.array(rows if every else [rows[at] for at in distinct], np.uint32)
            found, word = self._slots.put(h, words, match_word=False)
            out += [(rows[distinct[i]], int(word[i])) for i in np.flatnonzero(found)]
        return sorted(out)
