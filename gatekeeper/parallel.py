"""The reader on two cores: worker processes validate byte ranges, the parent dedupes and packs in order.

A worker returns, for its range, flat arrays (relative line, offset, length, the
custom_id's `hash()`, model index), its per-model counts and its rejections; the
parent walks the arrays in input order through the same duplicate index as the
one-process reader, so the report is identical (a test holds them equal).
Workers are forked, so they share the parent's hash seed; equal hashes are
still confirmed by re-reading the earlier line, so a duplicate report is exact.
"""

from __future__ import annotations

import multiprocessing
import os
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from .idindex import IdIndex
from .reader import Rejection, ScanStats, custom_id_reader, duplicate, validate

PIECE_BYTES = 16 << 20
MIN_PARALLEL_BYTES = 64 << 20  # below this, starting workers costs more than it saves

Piece = tuple[int, int, array, array, array, array, array, list[str], list[int], list[int], list[Rejection]]


def _range_lines(path: str, start: int, end: int) -> Iterator[bytes]:
    # readline beats one big read + split here (measured): no 16 MB copy, no list of every line.
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        readline = f.readline
        while pos < end:
            raw = readline()
            if not raw:
                return
            pos += len(raw)
            yield raw


def scan_piece(path: str, start: int, end: int, item_limit: int) -> Piece:
    """Worker: validate lines [start, end) of `path`; line numbers relative to the range (first = 1)."""
    rel, offs, lens, hashes = array("I"), array("q"), array("I"), array("q")
    model_idx = array("I")
    models: dict[str, int] = {}
    counts: list[int] = []
    nbytes: list[int] = []
    rejections: list[Rejection] = []
    stats = ScanStats()
    rel_add, off_add, len_add, hash_add, model_add = rel.append, offs.append, lens.append, hashes.append, model_idx.append
    last_model, mi = None, 0
    for line, off, cid, model, body in validate(
        _range_lines(path, start, end), rejections.append, item_limit=item_limit, offset=start, stats=stats
    ):
        n = len(body)
        rel_add(line)
        off_add(off)
        len_add(n)
        hash_add(hash(cid))
        if model is not last_model:  # runs of one model are the common case
            found = models.get(model)
            if found is None:
                found = models[model] = len(models)
                counts.append(0)
                nbytes.append(0)
            last_model, mi = model, found
        model_add(mi)
        counts[mi] += 1
        nbytes[mi] += n
    return (stats.lines, end - start, rel, offs, lens, hashes, model_idx, list(models), counts, nbytes, rejections)


def piece_bounds(path: str, size: int, piece: int) -> list[tuple[int, int]]:
    """Cut [0, size) into ranges of about `piece` bytes that start at line starts."""
    bounds = []
    with open(path, "rb") as f:
        start = 0
        while start < size:
            cut = min(size, start + piece)
            if cut < size:
                f.seek(cut)
                f.readline()
                cut = f.tell()
            bounds.append((start, cut))
            start = cut
    return bounds


def use_parallel(source: Any, hash_content: bool, workers: int | None) -> bool:
    """Only when asked for (`workers`), for a regular file, and not while hashing (a hash is sequential)."""
    if not workers or hash_content or not isinstance(source, (str, os.PathLike)) or os.fspath(source) == "-":
        return False
    return os.path.isfile(source)


def auto_workers(source: Any) -> int | None:
    """What the CLI asks for: two workers on a machine with two cores or more, for files over 64 MB."""
    if not isinstance(source, (str, os.PathLike)) or os.fspath(source) == "-":
        return None
    try:
        big = os.path.getsize(source) >= MIN_PARALLEL_BYTES
    except OSError:
        return None
    return 2 if big and (os.cpu_count() or 1) >= 2 else None


def parallel_scan(
    path: str,
    reject: Callable[[Rejection], None],
    *,
    item_limit: int,
    stats: ScanStats,
    models: dict[str, int],
    model_bytes: dict[str, int],
    workers: int = 2,
    piece_bytes: int | None = None,
) -> Iterator[tuple[int, int, None, None, int]]:
    """Yield (line, offset, None, None, length) for every valid, unique request, in input order.

    Requests per model and their bytes are added to `models` and `model_bytes` (duplicates excluded).
    """
    size = os.path.getsize(path)
    bounds = piece_bounds(path, size, piece_bytes or PIECE_BYTES)
    fd = os.open(path, os.O_RDONLY)
    cid_at = custom_id_reader(fd)
    index = IdIndex()
    sized = False
    base = 0  # lines before the current piece
    pending: deque[Future[Piece]] = deque()
    # fork: workers inherit the loaded code instead of re-importing the caller's __main__ (spawn would re-run an
    # unguarded script). Forking is unsafe in a process running threads, which is why only the CLI asks for
    # workers by default: `plan` runs before it starts any.
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        try:
            todo = iter(bounds)
            for start, end in todo:
                pending.append(pool.submit(scan_piece, path, start, end, item_limit))
                if len(pending) >= 2 * workers:
                    break
            while pending:
                count, nbytes, rel, offs, lens, hashes, model_idx, names, counts, sizes, rejected = pending.popleft().result()
                for name, c, b in zip(names, counts, sizes):
                    models[name] = models.get(name, 0) + c
                    model_bytes[name] = model_bytes.get(name, 0) + b
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(scan_piece, path, nxt[0], nxt[1], item_limit))
                if not sized and count:
                    index.reserve(int(size / (nbytes / count) * 1.1))
                    sized = True
                mask, slot_lines, slot_hashes, slot_offsets, limit = index.views()
                used = index.used
                dups: list[Rejection] = []
                for r, off, n, h, mi in zip(rel, offs, lens, hashes, model_idx):
                    line = base + r
                    i = h & mask
                    if slot_lines[i] or used >= limit:
                        first = index.add_slow(h, partial(cid_at, off), line, off, cid_at, used)
                        used = index.used
                        if index.mask != mask:
                            mask, slot_lines, slot_hashes, slot_offsets, limit = index.views()
                        if first:
                            cid = cid_at(off) or ""
                            dups.append(Rejection(line, cid, duplicate(cid, first)))
                            models[names[mi]] -= 1
                            model_bytes[names[mi]] -= n
                            continue
                    else:  # an empty home slot, inlined
                        slot_hashes[i] = h
                        slot_lines[i] = line
                        slot_offsets[i] = off
                        used += 1
                    yield line, off, None, None, n
                index.used = used
                for rej in sorted([Rejection(base + e.line, e.custom_id, e.reason) for e in rejected] + dups,
                                  key=lambda e: e.line):
                    reject(rej)
                base += count
        finally:
            for f in pending:
                f.cancel()
            os.close(fd)
    stats.lines = base
    stats.end_offset = size
