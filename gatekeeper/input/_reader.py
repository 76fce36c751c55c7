"""Read a JSONL of batch requests in one pass and judge every line.

A line is decoded by the schema (`_schema`: its shape and the API version's rules, checked in compiled code while
it parses). What types cannot say is a short pass over the decoded values here: the custom_id's characters, UTF-8 in
the parts the decoder skips, the batch's byte limit, the cache markers (`_markers`, noted for the caching report in
`_caching`) and the Models API's verdicts. Uniqueness is the caller's (`scan` here, the parent in `_parallel`).

A valid line's body is its own bytes (only surrounding whitespace, the CR of CRLF and a leading BOM removed): it is
sent exactly as given, never re-serialized. Each bad line becomes a `Rejection` naming its 1-based line number, its
custom_id when it has a valid one, and why (`_reasons`).
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, compress, islice
from operator import add, itemgetter, sub
from typing import Any, BinaryIO, TypeAlias

import msgspec

from .._errors import InputError, os_error
from .._wire import API_VERSION, STRICT_VERSION
from ._caching import UNMARKED_MIN_BYTES, CacheScan, note_unmarked
from ._duplicates import duplicate_check
from ._markers import Memo, Point, chunk_walks, holds_marker, marker_walk, system_walk
from ._reasons import (
    custom_id_reason,
    duplicate,
    json_reason,
    refused_by_version,
    shape_reason,
    too_large,
    utf8_reason,
)
from ._schema import Params, Request, decoder, markers_decoded

Source: TypeAlias = str | os.PathLike[str] | Iterable[dict[str, Any] | bytes | str]
"""What `plan`/`submit` accept as input: a path ("-" for stdin), or requests as dicts / lines."""

_ID_CHARS = bytes(range(256)).replace(b"-", b"a").replace(b"_", b"a")  # for bytes.translate
_BOM = b"\xef\xbb\xbf"
_SECOND_LAST = itemgetter(-2)  # (a line's byte before its LF: 13 for CR LF)
READ_BUFFER = 1 << 20

ModelRules = dict[str, tuple[str | None, int | None]]
"""model name as written -> (why every line naming it is rejected, or None; its max_tokens limit, or None)."""

class ScanStats(msgspec.Struct):
    """What a scan read."""

    lines: int = 0  # lines read, blank ones included
    end_offset: int = 0  # bytes read
    repeats: dict[int, int] = {}  # line -> first line of the repeated ids told only at the end (spilled)


class Columns(msgspec.Struct):
    """The valid requests of a chunk or a piece, in input order, as columns; `bodies` (each request's line, its
    body `line.strip()`) only when asked for."""

    lines: list[int] = []
    offsets: list[int] = []  # -1 for an iterable's
    sizes: list[int] = []
    cids: list[str] = []
    models: list[str] = []
    bodies: list[bytes] | None = None

    def add(self, line: int, offset: int, cid: str, model: str, size: int, raw: bytes) -> None:
        self.lines.append(line)
        self.offsets.append(offset)
        self.sizes.append(size)
        self.cids.append(cid)
        self.models.append(model)
        if self.bodies is not None:
            self.bodies.append(raw)

    def clear(self) -> None:
        for column in (self.lines, self.offsets, self.sizes, self.cids, self.models, self.bodies or []):
            column.clear()


class Rejection(msgspec.Struct, frozen=True):
    """A line refused before anything is sent: its number (from 1), its custom_id when it has one, and why."""

    line: int
    custom_id: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "custom_id": self.custom_id, "reason": self.reason}


class LineReader:
    """Judges the lines of one input in order, a chunk of whole lines at a time, numbering them from 1.

    A chunk whose lines are all valid requests is judged at once (`_at_once`): decoded by one call, and checked by
    passes over whole columns (C loops), with a step in Python only for a line that names `cache_control` or is
    long enough to hold a part worth caching. A chunk with a line that needs words (refused, or blank) is read a
    line at a time (`_each`), to the same verdicts.

    `item_limit` is the largest request (bytes) a batch can hold: a larger one is rejected rather than breaking the
    splitter. `api_version` picks the decoder (`_schema`). `models` (from the Models API preflight) rejects a line
    whose model is refused or whose max_tokens is over the model's limit; `peaks` receives the largest max_tokens
    seen per model (so a second pass is needed only when some line can be over a limit). Given `cache`, a marked
    line's prefixes and a long unmarked system prompt or tool list are noted there (`_caching`). `offset` is the
    first line's byte offset in its file; an iterable's lines (`from_file` False) have none (-1).
    """

    def __init__(self, reject: Callable[[Rejection], None], *, item_limit: int, api_version: str = API_VERSION,
                 models: ModelRules | None = None, peaks: dict[str, int] | None = None, cache: CacheScan | None = None,
                 offset: int = 0, from_file: bool = True) -> None:
        self.reject, self.item_limit = reject, item_limit
        self.strict = api_version == STRICT_VERSION
        self.decoder = decoder(api_version)
        self.models, self.peaks, self.cache = models, peaks, cache
        self.line = 0  # lines read so far
        self.offset = offset if from_file else -1  # where the next line starts
        self.memos: dict[str, Memo] = {}  # one a model: files interleave models, and a prefix is per model

    def read(self, chunk: bytes, into: Columns) -> None:
        """Judge the next lines of the input, `chunk` (whole lines; the input's last may lack its newline): each
        valid request into `into` (its body `raw.strip()`), each bad line to `reject`."""
        raws = io.BytesIO(chunk).readlines()  # (found with memchr: bytes.split steps through every byte)
        if raws and not self._at_once(chunk, raws, into):
            self._each(raws, into)
        self.line += len(raws)
        if self.offset >= 0:
            self.offset += len(chunk)

    def _at_once(self, chunk: bytes, raws: list[bytes], into: Columns) -> bool:
        """Judge a chunk whose every line is a valid request by passes over whole columns; False, with nothing
        done, when a line needs the reading of `_each` (its words: a refused line; a blank one)."""
        markers = markers_decoded()
        try:
            requests = self.decoder.decode_lines(chunk)
        except msgspec.DecodeError:
            return False
        marked = markers_decoded() != markers  # (a chunk without a marker is not searched for one)
        sizes = list(map(len, map(bytes.strip, raws)))
        # decode_lines skips a blank line and gives two values for a line that holds two: with no blank line,
        # one request a line is proven by their counts.
        if len(requests) != len(raws) or min(sizes) == 0 or max(sizes) > self.item_limit:
            return False
        cids = [r.custom_id for r in requests]
        # '-' joins valid ids into a valid string: one pass checks them all (their lengths are the schema's), and
        # bytes.isalnum is ASCII-only, so with '-' and '_' mapped to 'a' it is the custom_id pattern. A chunk with
        # other than ASCII is decoded whole once: the decoder does not read the parts it skips.
        if not ("-".join(cids).encode().translate(_ID_CHARS).isalnum() and (chunk.isascii() or _utf8(chunk))):
            return False
        offsets = self._offsets(chunk, raws, sizes)
        models = [r.params.model for r in requests]
        refused = self._prompts(marked, requests, offsets, sizes, cids, models)
        lines = range(self.line + 1, self.line + 1 + len(raws))
        if refused:
            keep = [k not in refused for k in range(len(raws))]
            lines, offsets, sizes = compress(lines, keep), compress(offsets, keep), compress(sizes, keep)  # type: ignore[assignment]
            cids, models, raws = list(compress(cids, keep)), list(compress(models, keep)), list(compress(raws, keep))
        into.lines.extend(lines)
        into.offsets.extend(offsets)
        into.sizes.extend(sizes)
        into.cids += cids
        into.models += models
        if into.bodies is not None:
            into.bodies += raws
        return True

    def _offsets(self, chunk: bytes, raws: list[bytes], sizes: list[int]) -> list[int]:
        """Where each line's body starts: the line's start, past any whitespace before the body (-1 for an
        iterable's lines)."""
        if self.offset < 0:
            return [-1] * len(raws)
        starts = list(accumulate(map(len, raws), initial=self.offset))[:-1]
        stripped, n = len(chunk) - sum(sizes), len(raws)
        if stripped == n - (not chunk.endswith(b"\n")):  # (no line but its newline stripped)
            return starts
        # CR LF endings: with every line's second-last byte a CR, 2n bytes stripped leave none before a body (one C
        # pass over those bytes: a third of the three `lstrip` passes below, 1.2 K instructions a line fewer)
        if stripped == 2 * n and chunk.endswith(b"\n") and list(map(_SECOND_LAST, raws)).count(13) == n:
            return starts
        lead = map(sub, map(len, raws), map(len, map(bytes.lstrip, raws)))
        return list(map(add, starts, lead))

    def _prompts(self, any_marked: bool, requests: list[Request], offsets: list[int], sizes: list[int], cids: list[str],
                 models: list[str]) -> set[int]:
        """The steps a chunk's lines need one by one: the lines that hold a cache marker (`any_marked`: the chunk
        does; their markers checked, their prefixes noted in `cache` as columns), those long enough to hold a part
        worth caching, and, with the Models API's rules, every line. The indices of the lines refused, each told to
        `reject`."""
        cache = self.cache
        reasons: dict[int, str] = {}
        noted: list[int] = []
        if any_marked:
            reasons, noted, points = chunk_walks(requests, self.memos)
            if noted and cache is not None:
                first = self.line + 1
                if len(noted) == len(requests):  # (every line: the chunk's columns as they are)
                    cache.note(range(first, first + len(noted)), offsets, sizes, cids, models, points)
                else:
                    cache.note([first + k for k in noted], [offsets[k] for k in noted], [sizes[k] for k in noted],
                               [cids[k] for k in noted], [models[k] for k in noted], points)
        if cache is not None and max(sizes) >= UNMARKED_MIN_BYTES:
            walked = set(noted).union(reasons)
            for k, size in enumerate(sizes):
                if size >= UNMARKED_MIN_BYTES and k not in walked:
                    params = requests[k].params
                    if params.system is not None or params.tools is not None:
                        note_unmarked(cache, params.model, params.system, params.tools)
        if self.models is not None or self.peaks is not None:
            for k, r in enumerate(requests):
                if k not in reasons and (reason := self._model_reason(r.params)) is not None:
                    reasons[k] = reason
        for k in sorted(reasons):
            self.reject(Rejection(self.line + 1 + k, requests[k].custom_id, reasons[k]))
        return set(reasons)

    def _each(self, raws: list[bytes], into: Columns) -> None:
        """Judge a chunk's lines one at a time (a chunk that holds a line to refuse, or a blank one)."""
        decode, item_limit = self.decoder.decode, self.item_limit
        later = self.models is not None or self.peaks is not None
        offset = self.offset
        for line, raw in enumerate(raws, self.line + 1):
            start = offset
            if offset >= 0:
                offset += len(raw)
            try:
                request = decode(raw)
            except msgspec.DecodeError as exc:  # (its subclass ValidationError too; a blank line too)
                self._refused(raw, exc, line, start)
                continue
            cid = request.custom_id
            size, start = _stripped(raw, start)
            if not (cid.encode().translate(_ID_CHARS).isalnum() and size <= item_limit and _utf8(raw)):
                self.reject(Rejection(line, *self._why(raw, cid, size)))
                continue
            params = request.params
            marked = holds_marker(params)
            if (marked or size >= UNMARKED_MIN_BYTES) and (
                    reason := self._prompt(params, marked, line, start, size, cid)) is not None:
                self.reject(Rejection(line, cid, reason))
                continue
            if later and (reason := self._model_reason(params)) is not None:
                self.reject(Rejection(line, cid, reason))
                continue
            into.add(line, start, cid, params.model, size, raw)

    def _refused(self, raw: bytes, exc: Exception, line: int, start: int) -> None:
        """A line the decoder refused: blank (skipped: no request, no rejection), not JSON, of the wrong shape, or
        refused by the API version only, which is said after the rest of its checks (as a line that passes them)."""
        body = raw.strip()
        if not body:
            return
        if not isinstance(exc, msgspec.ValidationError):  # (a DecodeError that is not also a ValidationError)
            self.reject(Rejection(line, None, json_reason(body, exc)))
            return
        if self.strict:
            try:
                request = decoder(API_VERSION).decode(raw)
            except msgspec.ValidationError as base:
                exc = base
            else:  # the base rules take it: its own checks first, then the version's refusal
                self._refused_by_version(raw, request, line, start, refused_by_version(exc))
                return
        cid, reason = shape_reason(body, exc)
        self.reject(Rejection(line, cid, reason))

    def _refused_by_version(self, raw: bytes, request: Request, line: int, start: int, version: str) -> None:
        """A line the version alone refuses: rejected for the first of its other checks that fails, else `version`."""
        cid = request.custom_id
        size, start = _stripped(raw, start)
        if not (cid.encode().translate(_ID_CHARS).isalnum() and size <= self.item_limit and _utf8(raw)):
            self.reject(Rejection(line, *self._why(raw, cid, size)))
            return
        marked = holds_marker(request.params)
        self.reject(Rejection(line, cid, self._prompt(request.params, marked, line, start, size, cid) or version))

    def _why(self, raw: bytes, cid: str, size: int) -> tuple[str | None, str]:
        """(custom_id, reason) of the first check after decoding that a line fails, in the reader's order: its
        UTF-8 (a rejected line's custom_id is given only once its bytes and its id are valid), the custom_id's
        characters, its size."""
        reason = utf8_reason(raw.strip())
        if reason is not None:
            return None, reason
        if not cid.encode().translate(_ID_CHARS).isalnum():
            return None, custom_id_reason(cid)
        return cid, too_large(size, self.item_limit)

    def _prompt(self, params: Params, marked: bool, line: int, offset: int, size: int, cid: str) -> str | None:
        """Why the API would refuse the line's cache markers, or None, its marked prefixes or its long unmarked
        system prompt or tool list noted in `cache`. Only a `marked` line (`holds_marker`) is walked; one whose only
        blocks are its system's, over those alone."""
        model, system, messages = params.model, params.system, params.messages
        reason: str | None = None
        points: tuple[Point, ...] = ()
        if marked:
            memo = self.memos.get(model) or self.memos.setdefault(model, Memo())
            if (system.__class__ is list and params.tools is None and params.cache_control is None
                    and len(messages) == 1 and messages[0].content.__class__ is str):
                reason, points = system_walk(system, model, memo)
            else:
                reason, points = marker_walk(params, model, memo)  # (one walk: the check and the prefixes)
        cache = self.cache
        if reason is not None or cache is None:
            return reason
        if points:
            cache.note((line,), (offset,), (size,), (cid,), (model,), (points,))
        elif (system is not None or params.tools is not None) and size >= UNMARKED_MIN_BYTES:
            note_unmarked(cache, model, system, params.tools)  # (a shorter line holds no part that long)
        return None
    def _model_reason(self, params: Params) -> str | None:
        """The Models API's verdict on the line's model and max_tokens, or None; `peaks` takes its max_tokens."""
        model, max_tokens, peaks = params.model, params.max_tokens, self.peaks
        if peaks is not None and max_tokens > peaks.get(model, 0):
            peaks[model] = max_tokens
        rule = self.models.get(model) if self.models is not None else None
        if rule is None:
            return None
        refused, limit = rule
        if refused is not None:
            return refused
        if limit is not None and max_tokens > limit:
            return f"model {model!r}: params.max_tokens {max_tokens:,} is above the model's limit of {limit:,}"
        return None


def _utf8(data: bytes) -> bool:
    return data.isascii() or utf8_reason(data) is None


def _stripped(raw: bytes, start: int) -> tuple[int, int]:
    """The size of the line's body (`raw.strip()`), and its offset (-1 stays -1)."""
    body = raw.strip()
    if start >= 0 and body[:1] != raw[:1]:
        start += len(raw) - len(raw.lstrip())
    return len(body), start


ValidRow = tuple[int, int, str, str, int, bytes]
"""A valid request: (line, offset, custom_id, model, size, raw); its body is `raw.strip()` (`size` bytes)."""

CHUNK_BYTES = 1 << 18  # lines judged at once: about as many bytes (a longer line whole); a chunk's objects stay in the
# cache and their memory is reused (1 MB chunks took a third more page faults, and more time)


def read_chunks(chunks: Iterable[bytes], reject: Callable[[Rejection], None], *, item_limit: int,
                stats: ScanStats | None = None, **rules: Any) -> Iterator[ValidRow]:
    """Judge the input's lines, given as chunks of whole lines (`LineReader`, given `rules`); yield each valid
    request. Rejections reach `reject` in line order with the rows (a caller's own rejection of a row, a duplicate,
    comes after those of the lines before it). `stats` receives the line count and end offset. Uniqueness is not
    checked here."""
    refused: list[Rejection] = []
    reader = LineReader(refused.append, item_limit=item_limit, **rules)
    cols = Columns(bodies=[])
    for chunk in chunks:
        reader.read(chunk, cols)
        told = 0
        for row in zip(cols.lines, cols.offsets, cols.cids, cols.models, cols.sizes, cols.bodies or ()):
            while told < len(refused) and refused[told].line < row[0]:
                reject(refused[told])
                told += 1
            yield row
        for rejection in refused[told:]:
            reject(rejection)
        refused.clear()
        cols.clear()
    if stats is not None:
        stats.lines, stats.end_offset = reader.line, max(reader.offset, 0)


def validate(lines: Iterable[bytes], reject: Callable[[Rejection], None], *, item_limit: int,
             **rules: Any) -> Iterator[ValidRow]:
    """`read_chunks` of lines as a file gives them (each with its newline, the last perhaps without)."""
    it = iter(lines)
    chunks = (b"".join(part) for part in iter(lambda: list(islice(it, 4096)), []))
    return read_chunks(chunks, reject, item_limit=item_limit, **rules)


def file_chunks(stream: BinaryIO, hasher: Any = None) -> tuple[Iterator[bytes], int]:
    """A binary stream's whole lines in chunks of about `CHUNK_BYTES` (a longer line whole), a UTF-8 BOM at its
    start peeled off (`hasher`, if given, sees every byte, the BOM included); and the first line's offset."""
    first = stream.read(CHUNK_BYTES)
    bom = first.startswith(_BOM)
    return _chunks(stream, first, hasher, 3 if bom else 0), 3 if bom else 0


def _chunks(stream: BinaryIO, block: bytes, hasher: Any, skip: int) -> Iterator[bytes]:
    carried: list[bytes] = []
    while block:
        if hasher is not None:
            hasher.update(block)
        cut = block.rfind(b"\n") + 1
        if cut:
            yield b"".join([*carried, block[skip:cut] if not carried else block[:cut]])
            carried = [block[cut:]]
        else:
            carried.append(block[skip:] if not carried else block)
        skip = 0
        block = stream.read(CHUNK_BYTES)
    tail = b"".join(carried)
    if tail:
        yield tail


def item_chunks(items: Iterable[dict[str, Any] | bytes | str]) -> Iterator[bytes]:
    """An iterable's requests as chunks of lines (`encode_items`), a BOM on the first one peeled off."""
    lines = encode_items(items)
    first = next(lines, None)
    if first is None:
        return
    if first.startswith(_BOM):
        first = first[3:]
    group = [first]
    for line in lines:
        group.append(line)
        if len(group) >= 4096:
            yield b"\n".join(group) + b"\n"
            group = []
    if group:
        yield b"\n".join(group) + b"\n"


def version_reason(params: dict[str, Any]) -> str | None:
    """Why API version 2026-10-21 refuses these params (given as values), or None: they are judged as a line of
    them is, by the strict decoder (`_schema.Params2026`), when the base rules take them."""
    line = msgspec.json.encode({"custom_id": "x", "params": params})
    try:
        decoder(STRICT_VERSION).decode(line)
    except msgspec.ValidationError as exc:
        try:
            decoder(API_VERSION).decode(line)
        except msgspec.ValidationError:
            return None  # (refused by the base rules: not the version's doing)
        return refused_by_version(exc)
    return None


def encode_items(items: Iterable[dict[str, Any] | bytes | str]) -> Iterator[bytes]:
    """Each request of an iterable as one line of bytes: the one encoding `plan()` and `submit()` share.

    A dict is serialized compactly (msgspec); a str is encoded keeping lone surrogates (so the
    line is rejected as invalid UTF-8, not raised); bytes are taken as given. A line
    break inside an item would split it in the spooled file: a parsable item is
    re-serialized without it, an unparsable one has it replaced by a control byte so
    it stays one rejected line. Anything else is a `TypeError`: a bug in the caller.
    """
    for item in items:
        if isinstance(item, dict):
            try:
                line = msgspec.json.encode(item)
            except (msgspec.EncodeError, UnicodeEncodeError, TypeError):
                # Lone surrogates and unknown types: the stdlib keeps them, so the line is rejected for its bytes.
                import json

                line = json.dumps(item, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass")
        elif isinstance(item, str):
            line = item.encode("utf-8", "surrogatepass")
        elif isinstance(item, (bytes, bytearray, memoryview)):
            line = bytes(item)
        else:
            raise InputError(f"requests must be dicts, bytes or str, got {type(item).__name__}")
        line = line.rstrip(b"\r\n")
        if b"\n" in line or b"\r" in line:
            line = _one_line(line)
        yield line


def _one_line(line: bytes) -> bytes:
    try:
        return msgspec.json.encode(msgspec.json.decode(line))
    except msgspec.DecodeError:
        return line.replace(b"\r", b"\x01").replace(b"\n", b"\x01")


def open_source(source: Source) -> tuple[BinaryIO | None, Iterable[Any] | None, int]:
    """Resolve a source to (binary stream, None, size) or (None, iterable, 0)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path == "-":
            return sys.stdin.buffer, None, 0
        try:
            # A 1 MB buffer: on the default 8 KB, reading lines cost about 0.6 us a line more (measured).
            stream = open(path, "rb", buffering=READ_BUFFER)  # noqa: SIM115 - closed by the caller's `scan`
        except OSError as exc:
            raise InputError(os_error(exc, f"cannot read {path}")) from exc
        try:
            size = os.fstat(stream.fileno()).st_size
        except OSError:
            size = 0
        return stream, None, size
    return None, source, 0


def _line_at(fd: int, offset: int) -> bytes:
    """The line starting at `offset`, read without moving the main stream."""
    parts = []
    while True:
        piece = os.pread(fd, 1 << 16, offset)
        if not piece:
            break
        cut = piece.find(b"\n")
        if cut >= 0:
            parts.append(piece[:cut])
            break
        parts.append(piece)
        offset += len(piece)
    return b"".join(parts)


SAMPLE_FROM = 1 << 20  # a smaller file's index grows as it fills: a few rehashes of at most 10,000 ids
SAMPLES = 256  # windows read to estimate a file's lines
SAMPLE_BYTES = 1 << 12  # each window's bytes: 1 MB read in all


def estimate_lines(fd: int, size: int, samples: int = SAMPLES) -> int:
    """About how many lines the first `size` bytes of file `fd` hold: the newlines in windows at evenly spaced
    offsets, scaled from the bytes read to the file's.

    Windows spread over the whole file see a file sorted by length (short lines first) as well as a uniform
    one, where its first lines alone had the duplicate index sized for 40 times the ids it held. Reads with
    pread, so the stream's position does not move: about 1 ms."""
    span = max(size - SAMPLE_BYTES, 0)  # where a window may start
    newlines = read = 0
    for k in range(samples):
        window = os.pread(fd, SAMPLE_BYTES, span * k // samples)
        newlines += window.count(b"\n")
        read += len(window)
    return int(size * newlines / read) + 1 if read else 0


def expected_ids(source: BinaryIO | int | None, size: int) -> int:
    """What to size a duplicate index for: the lines of a regular file (a stream or a descriptor of `size`
    bytes), and a tenth more; 0 (grow as it fills) for a pipe, an iterable, a file under 1 MB, or one that
    cannot be sampled (reading it will say why)."""
    if source is None or size < SAMPLE_FROM:
        return 0
    try:
        return int(estimate_lines(source if isinstance(source, int) else source.fileno(), size) * 1.1)
    except (OSError, ValueError):  # (io.UnsupportedOperation is both)
        return 0


class _Ids(msgspec.Struct):
    """What `request_reader` reads back of a line: its custom_id and model (the rest is skipped)."""

    class _Model(msgspec.Struct):
        model: str

    custom_id: str
    params: _Model


_ids = msgspec.json.Decoder(_Ids)


def request_reader(fd: int) -> Callable[[int], tuple[str, str]]:
    """Reads back (custom_id, model) of the valid request at an offset: for the rare line whose fields are needed again."""
    def request_at(offset: int) -> tuple[str, str]:
        try:
            ids = _ids.decode(_line_at(fd, offset))
        except (msgspec.DecodeError, OSError):
            return "", ""  # (the file changed under us: an empty id matches nothing)
        return ids.custom_id, ids.params.model

    return request_at


def scan(
    source: Source,
    reject: Callable[[Rejection], None],
    *,
    item_limit: int,
    stats: ScanStats | None = None,
    hasher: Any = None,
    ids_in_memory: int | None = None,
    repeats: dict[int, int] | None = None,
    **rules: Any,
) -> Iterator[ValidRow]:
    """Yield every valid, unique request, in order (as `read_chunks`, given the `LineReader`'s `rules`).

    Every bad line goes to `reject`. `stats` receives the line count and end offset; `hasher` (a hashlib object)
    sees every byte of a file source. A file of more than `ids_in_memory` ids may yield a repeated id: `stats.repeats`
    then names it, for a second reading told the `repeats` (see `_duplicates`).
    """
    stream, items, size = open_source(source)
    check = None
    try:
        from_file = stream is not None
        if stream is not None:
            chunks, offset = file_chunks(stream, hasher)
        else:
            chunks, offset = item_chunks(items or ()), 0
        check = duplicate_check(expected_ids(stream, size), _confirmer(stream) if from_file else None,
                                rereadable=stats is not None and _rereadable(source), limit=ids_in_memory,
                                known=repeats)
        add = check.add
        for row in read_chunks(chunks, reject, item_limit=item_limit, from_file=from_file, offset=offset,
                               stats=stats, **rules):
            line, start, cid = row[0], row[1], row[2]
            first = add(cid, line, start)
            if first:
                reject(Rejection(line, cid, duplicate(cid, first)))
                continue
            yield row
        if stats is not None:
            stats.repeats = check.late()
    finally:
        if check is not None:
            check.close()
        if stream is not None and stream is not sys.stdin.buffer:
            stream.close()


def _rereadable(source: Source) -> bool:
    """A path that can be opened again (not standard input, even redirected from a file)."""
    return isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-"


def _confirmer(stream: BinaryIO | None) -> Callable[[int], str | None] | None:
    """Reads a custom_id back from a seekable file; None for a pipe (the 64-bit hash alone decides)."""
    if stream is None:
        return None
    try:
        fd = stream.fileno()
        os.lseek(fd, 0, os.SEEK_CUR)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    request_at = request_reader(fd)
    return lambda offset: request_at(offset)[0]
