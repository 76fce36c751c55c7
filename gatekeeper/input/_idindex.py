"""A compact set of custom_ids that remembers where each was first seen.

A Python set of ten million strings costs about 90 bytes an id. This index is
an open-addressing table of 32-bit ordinals (0 marks an empty slot) and three
arrays in order of arrival: the fingerprint (the top 31 bits of the id's
SipHash), the line, and a proof. Sized up front at a load of at most 0.7, an
id costs 22 to 28 bytes.

A slot holds only the ordinal, so the common probe (an empty home slot) reads
and writes one-digit Python ints and allocates nothing (a table of
`fingerprint << 32 | ordinal` words allocated a 64-bit int on every read and
write). A taken slot costs a second read, of its fingerprint. The fingerprint also gives the home slot, so the table can
grow without the full hash, and it is 31 bits so that it too is a one-digit
int. An equal fingerprint is settled by the proof.
For a file the proof is the byte offset of the earlier line, whose custom_id is
read back and compared exactly (`confirm`); without a file it is the full
64-bit hash, and a false duplicate has probability about n^2/2^65 (3e-6 for ten
million ids), reported loudly, never a silent drop.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable

MAX_LOAD = 0.7
FP_SHIFT = 33  # a fingerprint is hash >> 33: the top 31 bits, signed
_NO_BASE = 1 << 64  # sorts after any base in a bisect


def capacity_for(expected: int) -> int:
    cap = 1024
    while cap * MAX_LOAD < expected:
        cap *= 2
    return cap


class IdIndex:
    __slots__ = ("slots", "mask", "limit", "used", "count", "room", "fps", "lines", "proofs", "bases", "confirm")

    def __init__(self, expected: int = 0, confirm: Callable[[int], str | None] | None = None) -> None:
        """`confirm(offset)` reads back the custom_id of the line at `offset`; without it proofs are full hashes."""
        self.confirm = confirm
        # The entries in order of arrival, in arrays allocated ahead of them (`_room`) and filled in place: grown
        # by appends, three arrays reallocated in turn left the heap fragmented, and the parallel reader's peak
        # RSS grew by 40 bytes a request where the index holds 22-28.
        self.count = 0  # entries recorded
        self.room = 0  # entries the arrays hold: len(self.lines), kept so that `record` (one an id) makes no call
        self.fps = array("i", [0])  # by ordinal (1-based; index 0 is never read): fingerprints
        self.lines = array("I")  # by ordinal - 1: line numbers (1-based)
        self.proofs = array("q")  # by ordinal - 1: byte offsets (with confirm) or full hashes
        self.bases: list[tuple[int, int]] = []  # (first ordinal - 1, base): lines recorded relative to a base
        self._alloc(capacity_for(expected))
        self.used = 0  # ids in the table
        self._room(expected)

    def _alloc(self, cap: int) -> None:
        self.slots = array("I", [0]) * cap  # (no temporary: see `_grown`)
        self.mask = cap - 1
        self.limit = int(cap * MAX_LOAD)

    def __len__(self) -> int:
        return self.used

    def reserve(self, expected: int) -> None:
        """Grow once to hold `expected` ids, instead of rehashing as it fills."""
        cap = capacity_for(expected)
        if cap > self.mask + 1:
            self._rehash(cap)
        self._room(expected - self.count)

    def _room(self, more: int) -> None:
        """Make the entry arrays long enough for `more` entries beyond those recorded (by a quarter at least)."""
        short = self.count + more - self.room
        if short > 0:
            size = self.room + max(short, self.room // 4)
            self.fps = _grown(self.fps, size + 1)
            self.lines = _grown(self.lines, size)
            self.proofs = _grown(self.proofs, size)
            self.room = size

    def record(self, line: int, proof: int, fp: int) -> int:
        """Note where a candidate id was seen; returns its ordinal, for `insert`."""
        k = self.count
        if k == self.room:
            self._room(1)
        self.lines[k] = line
        self.proofs[k] = proof
        k += 1
        self.fps[k] = fp
        self.count = k
        return k

    def add_many(self, lines: array[int], proofs: array[int], fps: array[int], base: int = 0) -> list[tuple[int, int]]:
        """Record and insert a run of ids (their fingerprints, `hash >> FP_SHIFT`) in order; (position in the
        run, first line) for each duplicate.

        The hot path of a parallel `plan`: the common probe (a free slot, or a taken slot with another
        fingerprint) is inlined; an equal fingerprint goes to `insert`, which settles it exactly.
        """
        n = len(fps)
        self._room(n)  # (first: the arrays then grow once, where `reserve` would size them for fewer)
        if self.used + n > self.limit:
            self.reserve(self.used + n)  # room for all n: `insert` never grows the table under this loop
        before = self.count
        self.bases.append((before, base))  # (rather than base + each line: the arrays stay a memcpy)
        self.fps[before + 1:before + n + 1] = fps
        self.lines[before:before + n] = lines
        self.proofs[before:before + n] = proofs
        self.count = before + n
        mask, slots, known = self.mask, self.slots, self.fps
        dups = []
        settled = 0  # ids that went to `insert`, which counts the ones it stores
        ordinal = before
        for fp in fps:
            ordinal += 1
            i = fp & mask
            while taken := slots[i]:  # linear probing: a quarter of ids meet a taken home slot
                if known[taken] == fp:
                    break
                i = (i + 1) & mask
            else:
                slots[i] = ordinal
                continue
            settled += 1
            first = self.insert(ordinal)
            if first:
                dups.append((ordinal - before - 1, first))
        self.used += n - settled
        return dups

    def line_of(self, k: int) -> int:
        """The line of entry k (0-based ordinal)."""
        chunk = bisect_right(self.bases, (k, _NO_BASE)) - 1
        return self.lines[k] + (self.bases[chunk][1] if chunk >= 0 else 0)

    def absolute_lines(self) -> array[int]:
        """Every entry's line, in order of arrival."""
        lines = self.lines[:self.count]
        for k, (start, base) in enumerate(self.bases):
            end = self.bases[k + 1][0] if k + 1 < len(self.bases) else self.count
            lines[start:end] = array("I", [line + base for line in lines[start:end]])
        return lines

    def add(self, custom_id: str, line: int, offset: int = -1) -> int:
        """Record and insert one id; 0, or the earlier line when seen before."""
        h = hash(custom_id)
        return self.insert(self.record(line, offset if self.confirm is not None else h, h >> FP_SHIFT), custom_id)

    def insert(self, ordinal: int, custom_id: str | None = None) -> int:
        """Probe for recorded entry `ordinal` from its home slot; insert it and return 0, or return the earlier line.

        An equal fingerprint is compared by proof: the full hashes (recorded as proofs) without a file, else
        the custom_ids read back, `custom_id` from the entry's own proof when None.
        """
        mask, slots, known, proofs = self.mask, self.slots, self.fps, self.proofs
        fp = known[ordinal]
        i = fp & mask
        while taken := slots[i]:
            if known[taken] == fp:
                proof = proofs[taken - 1]
                if self.confirm is None:
                    if proof == proofs[ordinal - 1]:
                        return self.line_of(taken - 1)
                else:
                    if custom_id is None:
                        custom_id = self.confirm(proofs[ordinal - 1]) or ""
                    if self.confirm(proof) == custom_id:
                        return self.line_of(taken - 1)
            i = (i + 1) & mask
        slots[i] = ordinal
        self.used += 1
        if self.used > self.limit:
            self._rehash((mask + 1) * 2)
        return 0

    def _rehash(self, cap: int) -> None:
        old = self.slots
        self._alloc(cap)
        mask, slots, known = self.mask, self.slots, self.fps
        for ordinal in old:
            if ordinal:
                i = known[ordinal] & mask
                while slots[i]:
                    i = (i + 1) & mask
                slots[i] = ordinal


def _grown(values: array[int], size: int) -> array[int]:
    """`values` in a new array of `size` items, zeros after them: allocated once at its full size, with no
    temporary as big as itself (freeing one would raise glibc's mmap threshold above the arrays, and put the
    next of them on the heap)."""
    grown = array(values.typecode, [0]) * size
    grown[:len(values)] = values
    return grown
