"""The reader on two cores: worker processes validate 8 MB pieces, the parent dedupes in order.

A worker returns, for its piece, flat arrays (relative line, offset, length, the
custom_id's fingerprint), its per-model counts and its rejections. The parent runs
the fingerprints through the same kind of duplicate index as the one-process reader,
in input order, and hands the planner one `Segment` of arrays a piece, which
`Packer.add_many` cuts without a Python step a request; a test holds the report
equal to the one-process reader's. Workers are forked, so they share the
parent's hash seed; an equal fingerprint is confirmed by re-reading the earlier
line, so a duplicate report is exact.
"""

from __future__ import annotations

import gc
import marshal
import mmap
import os
import select
import signal
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from itertools import compress, repeat
from operator import rshift
from typing import TYPE_CHECKING, Any

import msgspec

from .._arrays import packed
from .._errors import InputError
from .._wire import API_VERSION
from ._caching import CacheScan
from ._duplicates import duplicate_check
from ._idindex import FP_SHIFT
from ._reader import CHUNK_BYTES, Columns, LineReader, Rejection, ScanStats, expected_ids, request_reader
from ._reasons import duplicate
from ._schema import decoder

if TYPE_CHECKING:
    from ._reader import ModelRules

PIECE_BYTES = 8 << 20  # measured: 4 MB pieces cost more per piece; 16 MB was a little faster but holds more memory
MIN_PARALLEL_BYTES = 8 << 20  # below this, workers save little (4 MB: 0.13 s to 0.12); at 11 MB, 0.24 s to 0.17

# What a worker sends, in types `marshal` writes (no pickle: its import is 4 ms of every start): (lines, then the
# columns' machine bytes: 'I' lines, 'q' offsets, 'I' lengths, 'i' fingerprints; model names, their requests and
# bytes, rejections as (line, custom_id, reason), max_tokens peaks, the caching facts, the largest request's bytes
# and its index: a pass the worker makes rather than the parent).
Piece = tuple[int, bytes, bytes, bytes, bytes, list[str], list[int], list[int], list[tuple[int, str | None, str]],
              dict[str, int], tuple[object, ...], tuple[int, int]]


@contextmanager
def _range_chunks(path: str, start: int, end: int) -> Iterator[tuple[Iterator[bytes], int]]:
    """The whole lines of [start, end) in chunks of about `CHUNK_BYTES`, read from a read-only mapping of just that
    range (a UTF-8 BOM at the file's start peeled off); and the first line's offset. (Measured on 1.4 KB lines: a
    mapping costs 0.3 us a line against 0.9 for readline on the default 8 KB buffer, and no copy of the piece is held.)
    """
    base = start - start % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        try:
            mapped = mmap.mmap(f.fileno(), end - base, access=mmap.ACCESS_READ, offset=base)
        except ValueError:  # the range is past the end: the file shrank since it was cut into pieces
            raise InputError(f"cannot read {path}: it changed while being read") from None
        with mapped:
            at = start - base
            if start == 0 and mapped[:3] == b"\xef\xbb\xbf":
                at = 3
            yield _cut(mapped, at, end - base), base + at


def _cut(mapped: mmap.mmap, at: int, end: int) -> Iterator[bytes]:
    while at < end:
        cut = mapped.find(b"\n", min(at + CHUNK_BYTES, end) - 1, end) + 1 or end
        yield mapped[at:cut]
        at = cut


def scan_piece(path: str, start: int, end: int, item_limit: int, rules: ModelRules | None = None,
               api_version: str = API_VERSION) -> Piece:
    """Worker: judge lines [start, end) of `path`; line numbers relative to the range (first = 1)."""
    cols = Columns()
    rejections: list[Rejection] = []
    peaks: dict[str, int] | None = {} if rules is not None else None  # only a preflight needs them
    cache = CacheScan()
    fps: list[int] = []
    counts: dict[str, int] = {}
    sums: dict[str, int] = {}
    with _range_chunks(path, start, end) as (chunks, offset):
        reader = LineReader(rejections.append, item_limit=item_limit, api_version=api_version, models=rules,
                            peaks=peaks, cache=cache, offset=offset)
        for chunk in chunks:
            before = len(cols.sizes)
            reader.read(chunk, cols)
            # (each chunk's ids and models summed up at once, by C loops, then let go)
            fps += map(rshift, map(hash, cols.cids), repeat(FP_SHIFT))
            _count_models(cols.models, cols.sizes[before:], counts, sums)
            cols.cids.clear()
            cols.models.clear()
    return (reader.line, packed("I", cols.lines), packed("q", cols.offsets), packed("I", cols.sizes),
            packed("i", fps), list(counts), list(counts.values()), [sums[m] for m in counts],
            [(r.line, r.custom_id, r.reason) for r in rejections], peaks or {}, cache.to_marshal(),
            _largest(cols.sizes))


def _count_models(models: list[str], sizes: list[int], counts: dict[str, int], sums: dict[str, int]) -> None:
    """Add the requests and bytes of each model."""
    if not models:
        return
    first, n = models[0], len(models)
    # (one model: a compare a line, no hash; tried only where four lines, two of them neighbours, agree)
    if first == models[-1] == models[n // 2] == models[n // 2 - 1] and models.count(first) == n:
        counts[first] = counts.get(first, 0) + n
        sums[first] = sums.get(first, 0) + sum(sizes)
        return
    for model, n in Counter(models).items():  # (a C loop)
        counts[model] = counts.get(model, 0) + n
    get = sums.get
    for model, size in zip(models, sizes):
        sums[model] = get(model, 0) + size


def _largest(sizes: list[int] | array[int]) -> tuple[int, int]:
    """The largest size and where it first is; (0, -1) for none."""
    top = max(sizes, default=0)
    return (top, sizes.index(top)) if sizes else (0, -1)


def piece_bounds(path: str, size: int, piece: int, workers: int = 2) -> list[tuple[int, int]]:
    """Cut [0, size) into ranges of about `piece` bytes that start at line starts.

    The last ones shrink, to a quarter of what is left a worker (at least an eighth of `piece`), so that the
    workers run out of work together: with equal pieces one core idled for half a piece at the end, 20-30 ms
    of a 0.45 s plan."""
    bounds = []
    with open(path, "rb") as f:
        start = 0
        while start < size:
            cut = min(size, start + min(piece, max(piece // 8, (size - start) // (2 * workers))))
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
    """What the CLI asks for: two workers on a machine with two cores or more, for files over 8 MB."""
    if not isinstance(source, (str, os.PathLike)) or os.fspath(source) == "-":
        return None
    try:
        big = os.path.getsize(source) >= MIN_PARALLEL_BYTES
    except OSError:
        return None
    return 2 if big and (os.cpu_count() or 1) >= 2 else None


def _merge_models(models: dict[str, int], model_bytes: dict[str, int], names: list[str], counts: list[int],
                  sizes: list[int]) -> None:
    """Add a piece's requests and bytes per model."""
    for name, c, b in zip(names, counts, sizes):
        models[name] = models.get(name, 0) + c
        model_bytes[name] = model_bytes.get(name, 0) + b


def _merge_peaks(peaks: dict[str, int] | None, piece: dict[str, int]) -> None:
    """The largest max_tokens per model over every piece so far."""
    if peaks is not None:
        for name, top in piece.items():
            peaks[name] = max(top, peaks.get(name, 0))


def _widen(fd: int) -> None:
    """A 1 MB pipe where the system allows it (Linux), so that a worker sends a piece without waiting for the parent
    to finish the one before; elsewhere the default buffer only makes it wait that long."""
    with suppress(ImportError, AttributeError, OSError):
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)


def _work(task: Callable[[int], Piece], claims: int, out: int) -> None:
    """A forked worker: claims the next piece index from the shared pipe until it is empty, and sends each piece,
    index first, as soon as it is made. Claiming rather than taking every other piece keeps both cores busy to
    the end when the machine slows one worker down."""
    while claim := os.read(claims, 4):  # 4 bytes: a pipe read that small is atomic between the workers
        i = int.from_bytes(claim, "little")
        try:
            message: Any = ("ok", task(i))
        except InputError as exc:
            message = ("error", str(exc))
        except OSError as exc:
            message = ("error", exc.strerror or str(exc))
        data = marshal.dumps(message)
        view = memoryview(i.to_bytes(4, "little") + len(data).to_bytes(8, "little") + data)
        while view:
            view = view[os.write(out, view):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


MAX_CLAIMS = 4096  # piece indices written up front, 16 KB: within the smallest pipe buffer (pieces grow past 32 GB)
MAX_AHEAD = 8  # pieces held out of order before the parent listens only for the one it needs


def forked_map(task: Callable[[int], Piece], count: int, workers: int, path: str) -> Iterator[Piece]:
    """`task(0)`, `task(1)`, ... `task(count - 1)` in forked workers, yielded in order; a worker's failure as one
    InputError (the mapping of worker errors, in one place).

    Plain fork and pipes, not a process pool: `plan` is timed with its start-up, and the pool's imports and
    start cost about 50 ms. Forked workers inherit the loaded code (spawn would re-run a caller's unguarded
    script); forking is unsafe in a process running threads, which is why only the CLI asks for workers by
    default: `plan` runs before it starts any."""
    if count > MAX_CLAIMS:
        raise ValueError(f"{count} pieces: at most {MAX_CLAIMS}")
    claims, fill = os.pipe()
    os.write(fill, b"".join(i.to_bytes(4, "little") for i in range(count)))
    os.close(fill)
    pipes, pids = [], []
    try:
        for _ in range(workers):
            r, w = os.pipe()
            _widen(w)
            pid = os.fork()
            if pid == 0:  # the worker: never returns into the parent's code
                code = 0
                try:
                    os.close(r)
                    gc.disable()  # decoded requests are trees, never cycles: nothing for the collector to find
                    _work(task, claims, w)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            pipes.append(r)
            pids.append(pid)
        yield from _in_order(pipes, count, path)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # a worker still running when the parent stops early
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        for r in pipes + [claims]:
            os.close(r)


def _in_order(pipes: list[int], count: int, path: str) -> Iterator[Piece]:
    """Pieces from whichever worker has one ready, yielded in index order.

    A worker claims indices in increasing order and sends them in that order, so the piece the parent waits
    for is always with a worker that has nothing held ahead: when MAX_AHEAD pieces are held, the parent
    listens to those workers only, and the others wait on their full pipes (bounded memory)."""
    ahead: dict[int, tuple[int, Piece]] = {}
    open_pipes = set(pipes)
    for i in range(count):
        while i not in ahead:
            holding = {fd for fd, _ in ahead.values()} if len(ahead) >= MAX_AHEAD else set()
            listen = [fd for fd in open_pipes if fd not in holding]
            if not listen:
                raise InputError(f"cannot read {path}: a reader process died (did the file change?)")
            for fd in select.select(listen, [], [])[0]:
                got = _receive(fd, path)
                if got is None:
                    open_pipes.discard(fd)  # this worker is done (or died: the missing piece says which)
                else:
                    ahead[got[0]] = (fd, got[1])
        yield ahead.pop(i)[1]


def _receive(fd: int, path: str) -> tuple[int, Piece] | None:
    """(index, piece) from a worker's pipe, or None at its end."""
    head = _read_exactly(fd, 12)
    if head is None:
        return None
    body = _read_exactly(fd, int.from_bytes(head[4:], "little"))
    if body is None:  # e.g. SIGBUS: the file shrank under a worker's mapping
        raise InputError(f"cannot read {path}: a reader process died (did the file change?)")
    kind, value = marshal.loads(body)  # noqa: S302 -- written by our own forked worker, over a private pipe
    if kind == "error":
        raise InputError(value if value.startswith("cannot read") else f"cannot read {path}: {value}")
    return int.from_bytes(head[:4], "little"), value


def _id_reader(path: str) -> Callable[[array[int]], list[str]]:
    """Reads the custom_ids at these offsets of the file back (what `CacheScan.cids` asks of a parallel scan)."""
    def read(offsets: array[int]) -> list[str]:
        fd = os.open(path, os.O_RDONLY)
        try:
            request_at = request_reader(fd)
            return [request_at(offset)[0] for offset in offsets]
        finally:
            os.close(fd)

    return read


def _drop_duplicates(dups: list[tuple[int, int]], base: int, columns: tuple[array[int], array[int], array[int]],
                     names: list[str], counts: list[int], sizes: list[int],
                     request_at: Callable[[int], tuple[str, str]]) -> tuple[list[Rejection], tuple[array[int], ...]]:
    """A piece's duplicates as rejections, and its columns (lines, offsets, lengths) without them; the per-model
    counts and sizes are corrected in place. Duplicates are rare: this reads each one's fields back from the file."""
    if not dups:
        return [], columns
    rel, offs, lens = columns
    keep = [True] * len(rel)
    index_of = {name: k for k, name in enumerate(names)}
    named = []
    for k, first in dups:
        cid, model = request_at(offs[k])
        named.append(Rejection(base + rel[k], cid, duplicate(cid, first)))
        keep[k] = False
        counts[index_of[model]] -= 1
        sizes[index_of[model]] -= lens[k]
    return named, tuple(array(a.typecode, compress(a, keep)) for a in columns)


class Segment(msgspec.Struct):
    """The valid, unique requests of one piece, in input order, as flat arrays."""

    base: int  # lines before the piece: a request's line number is base + lines[k]
    lines: array[int]  # 'I', line numbers relative to the piece (first = 1)
    offsets: array[int]  # 'q', byte offsets of the requests
    lengths: array[int]  # 'I', the requests' bytes
    total: int  # their sum
    largest: tuple[int, int]  # the largest request's bytes and its index, (0, -1) for none


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
    rules: ModelRules | None = None,
    peaks: dict[str, int] | None = None,
    cache: CacheScan | None = None,
    api_version: str = API_VERSION,
    ids_in_memory: int | None = None,
    repeats: dict[int, int] | None = None,
) -> Iterator[Segment]:
    """Yield a `Segment` per piece of the file, in input order; rejections go to `reject` in line order.

    Requests per model and their bytes are added to `models` and `model_bytes` (duplicates excluded).
    The parent does no Python step per request beyond the duplicate probe: everything else is array work.
    Past `ids_in_memory` ids, repeats are told at the end, in `stats.repeats` (see `scan`).
    """
    size = os.path.getsize(path)
    bounds = piece_bounds(path, size, max(piece_bytes or PIECE_BYTES, -(-size // MAX_CLAIMS)), workers)
    fd = os.open(path, os.O_RDONLY)
    request_at = request_reader(fd)
    check = duplicate_check(0, lambda offset: request_at(offset)[0], rereadable=True, limit=ids_in_memory,
                            known=repeats)
    base = 0  # lines before the current piece
    if cache is not None:
        cache.read_ids = _id_reader(path)
    decoder(api_version)  # (built once, here: each forked worker had built its own, 3 M instructions)
    try:
        for piece in forked_map(lambda i: scan_piece(path, *bounds[i], item_limit, rules, api_version), len(bounds), workers, path):
            if not base:  # sized once the workers run: they need not map the parent's index, nor wait for the estimate
                check.reserve(expected_ids(fd, size))
            count, rel_b, offs_b, lens_b, fps_b, names, counts, sizes, rejected, piece_peaks, facts, largest = piece
            if cache is not None:
                cache.merge(CacheScan.from_marshal(facts), base)
            rel, offs, lens, fps = array("I", rel_b), array("q", offs_b), array("I", lens_b), array("i", fps_b)
            _merge_peaks(peaks, piece_peaks)
            dups = check.add_many(rel, offs, fps, base)
            named, (rel, offs, lens) = _drop_duplicates(dups, base, (rel, offs, lens), names, counts, sizes, request_at)
            _merge_models(models, model_bytes, names, counts, sizes)
            yield Segment(base, rel, offs, lens, sum(sizes), _largest(lens) if dups else (largest[0], largest[1]))
            for rej in sorted([Rejection(base + line, cid, reason) for line, cid, reason in rejected] + named,
                              key=lambda e: e.line):
                reject(rej)
            base += count
        stats.repeats = check.late()
    finally:
        check.close()
        os.close(fd)
    stats.lines = base
    stats.end_offset = size
