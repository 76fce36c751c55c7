"""Duplicate custom_ids, told with memory that does not grow with the file.

Up to `IDS_IN_MEMORY` ids are checked as they are read, in an `IdIndex` (22-28 bytes an id). Past that, a file
that can be read again spills: the ids seen so far and every later one go to disk as (fingerprint, line, offset),
into part files by the fingerprint's top bits (`parts_for`: about 131,072 ids a part), and at the end each part is
checked alone (an id and its repeats share a part, in input order, so the first line is known). A repeat found only
then was planned as a request, so the planner reads the file once more, told which lines repeat (`KnownRepeats`).
A file with no repeat past the limit (nearly every file) is read once.

A pipe, standard input or an iterable cannot be read again: its index stays in memory.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .._errors import UsageError
from ._idindex import FP_SHIFT, IdIndex

if TYPE_CHECKING:
    from tempfile import TemporaryDirectory

IDS_IN_MEMORY = 1 << 20  # ids checked in memory before a re-readable file spills them (28 MB at most)
PART_IDS = 1 << 17  # ids a part is sized for: 3-4 MB to check, in an index of 2**18 slots (bits 0-17)
MIN_PARTS, MAX_PARTS = 64, 1 << 12  # (a part is the fingerprint's top bits, 18-29 at most: above the home slots)
FLUSH = 1 << 18  # entries buffered across the parts before they are written (5 MB)

Confirm = Callable[[int], "str | None"]


class DuplicateCheck:
    """Tells a repeated custom_id as it is read, until `limit` ids; then sets them aside for `late`."""

    __slots__ = ("index", "limit", "confirm", "spill", "told", "expected")

    def __init__(self, expected: int, confirm: Confirm | None, *, rereadable: bool, limit: int | None = None) -> None:
        """`confirm(offset)` reads back the custom_id at an offset; without one, or for a file that cannot be read
        again (`rereadable`), there is no limit."""
        self.limit = (IDS_IN_MEMORY if limit is None else limit) if confirm is not None and rereadable else 1 << 62
        self.index: IdIndex | None = IdIndex(min(expected, self.limit), confirm)
        self.confirm = confirm
        self.spill: _Spill | None = None
        self.told: set[int] = set()  # lines of the repeats told as they were read
        self.expected = expected  # the file's ids, as estimated: how many parts a spill cuts

    def add(self, custom_id: str, line: int, offset: int) -> int:
        """The earlier line of a repeated id, else 0 (also for every id once spilled: `late` tells those)."""
        index = self.index
        if index is not None:
            first = index.add(custom_id, line, offset)
            if first:
                self.told.add(line)
            if index.count >= self.limit:
                self._start_spill()
            return first
        assert self.spill is not None
        self.spill.put_one(hash(custom_id) >> FP_SHIFT, line, offset)
        return 0

    def add_many(self, lines: array[int], offsets: array[int], fps: array[int], base: int) -> list[tuple[int, int]]:
        """`IdIndex.add_many` while under the limit: (position in the run, first line) of each repeat."""
        index = self.index
        if index is not None and index.count + len(fps) <= self.limit:
            dups = index.add_many(lines, offsets, fps, base)
            self.told.update(base + lines[k] for k, _ in dups)
            return dups
        if index is not None:
            self._start_spill()
        assert self.spill is not None
        self.spill.put(fps, array("I", [base + line for line in lines]), offsets)
        return []

    def reserve(self, expected: int) -> None:
        self.expected = expected
        if self.index is not None:
            self.index.reserve(min(expected, self.limit))

    def _start_spill(self) -> None:
        index, self.index = self.index, None
        assert index is not None
        self.spill = _Spill(parts_for(self.expected))
        lines = index.absolute_lines()
        for k in range(0, index.count, FLUSH):  # (a flush at a time: no second copy of the index in buffers)
            end = min(k + FLUSH, index.count)
            self.spill.put(index.fps[k + 1:end + 1], lines[k:end], index.proofs[k:end])

    def late(self) -> dict[int, int]:
        """Line -> first line of every repeat in the file (the spilled entries are all of its ids), when some was
        not told as it was read; else {}."""
        if self.spill is None:
            return {}
        found: dict[int, int] = {}
        try:
            for fps, lines, offsets in self.spill.each_part():
                index = IdIndex(len(fps), self.confirm)
                for k, first in index.add_many(lines, offsets, fps):
                    found[lines[k]] = first
        finally:
            self.spill.close()
        return found if found.keys() - self.told else {}

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


class KnownRepeats:
    """The second reading of a spilled file: the repeats are known (line -> first line), nothing is indexed."""

    __slots__ = ("first_of", "ordered")

    def __init__(self, first_of: dict[int, int]) -> None:
        self.first_of = first_of
        self.ordered = sorted(first_of)

    def add(self, custom_id: str, line: int, offset: int) -> int:
        return self.first_of.get(line, 0)

    def add_many(self, lines: array[int], offsets: array[int], fps: array[int], base: int) -> list[tuple[int, int]]:
        if not lines:
            return []
        ordered, found = self.ordered, []
        k = bisect_left(ordered, base + lines[0])
        while k < len(ordered) and ordered[k] <= base + lines[-1]:
            at = bisect_left(lines, ordered[k] - base)
            if at < len(lines) and lines[at] == ordered[k] - base:
                found.append((at, self.first_of[ordered[k]]))
            k += 1
        return found

    def reserve(self, expected: int) -> None:
        pass

    def late(self) -> dict[int, int]:
        return {}

    def close(self) -> None:
        pass


def duplicate_check(expected: int, confirm: Confirm | None, *, rereadable: bool, limit: int | None,
                    known: dict[int, int] | None) -> DuplicateCheck | KnownRepeats:
    return KnownRepeats(known) if known is not None else DuplicateCheck(expected, confirm, rereadable=rereadable,
                                                                         limit=limit)


def parts_for(expected: int) -> int:
    """A power of two, so that a part holds about `PART_IDS` of the `expected` ids (past 537 million ids, more)."""
    parts = MIN_PARTS
    while parts * PART_IDS < expected and parts < MAX_PARTS:
        parts *= 2
    return parts


class _Spill:
    """(fingerprint, line, offset) entries in `parts` files of a temporary folder, by the fingerprint's top bits
    (below its sign: a 31-bit fingerprint is signed), above any home slot a part's index uses."""

    __slots__ = ("folder", "parts", "shift", "buffers", "buffered")

    def __init__(self, parts: int) -> None:
        import tempfile  # (only a file of over a million ids spills: plan starts without it)

        try:
            self.folder: TemporaryDirectory[str] | None = tempfile.TemporaryDirectory(prefix="gatekeeper-ids-")
        except OSError as exc:
            raise _no_room(tempfile.gettempdir(), exc) from exc
        self.parts, self.shift = parts, 30 - (parts.bit_length() - 1)
        self.buffers = [(array("i"), array("I"), array("q")) for _ in range(parts)]
        self.buffered = 0

    def put(self, fps: array[int], lines: array[int], offsets: array[int]) -> None:
        buffers, shift, mask = self.buffers, self.shift, self.parts - 1
        for fp, line, offset in zip(fps, lines, offsets):
            part = buffers[(fp >> shift) & mask]
            part[0].append(fp)
            part[1].append(line)
            part[2].append(offset)
        self.buffered += len(fps)
        if self.buffered >= FLUSH:
            self._flush()

    def put_one(self, fp: int, line: int, offset: int) -> None:
        """`put` of one entry, for the one-process reader: half the cost of `put` over one-item tuples (343 ns
        against 635 an id), paid on every id past the limit."""
        part = self.buffers[(fp >> self.shift) & (self.parts - 1)]
        part[0].append(fp)
        part[1].append(line)
        part[2].append(offset)
        self.buffered += 1
        if self.buffered >= FLUSH:
            self._flush()

    def _flush(self) -> None:
        assert self.folder is not None
        try:
            for k, columns in enumerate(self.buffers):
                if columns[0]:
                    with open(os.path.join(self.folder.name, str(k)), "ab") as f:
                        array("q", [len(columns[0])]).tofile(f)
                        for column in columns:
                            column.tofile(f)
        except OSError as exc:
            raise _no_room(self.folder.name, exc) from exc
        self.buffers = [(array("i"), array("I"), array("q")) for _ in range(self.parts)]
        self.buffered = 0

    def each_part(self) -> Iterator[tuple[array[int], array[int], array[int]]]:
        """Each part's entries in the order they were put."""
        self._flush()
        assert self.folder is not None
        for k in range(self.parts):
            path = os.path.join(self.folder.name, str(k))
            if os.path.exists(path):
                yield _read_part(path)

    def close(self) -> None:
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None


def _read_part(path: str) -> tuple[array[int], array[int], array[int]]:
    fps, lines, offsets = array("i"), array("I"), array("q")
    end = os.path.getsize(path)
    with open(path, "rb") as f:
        while f.tell() < end:
            count = array("q")
            count.fromfile(f, 1)
            for column in (fps, lines, offsets):
                column.fromfile(f, count[0])
    return fps, lines, offsets


def _no_room(folder: str, exc: OSError) -> UsageError:
    return UsageError(f"cannot set custom_ids aside in {folder} to check them for repeats ({exc.strerror or exc}): "
                      "free space there, or point TMPDIR at a folder with room", setting="TMPDIR")
