"""Read a JSONL of batch requests in one pass and validate every line.

A valid line's body is its own bytes (only surrounding whitespace, the CR of
CRLF and a leading BOM removed): it is sent exactly as given, never
re-serialized. Each bad line becomes a `Rejection`
naming its 1-based line number.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, compress

import orjson

from .._errors import InputError, os_error
from .._record import Record
from .._typing import TYPE_CHECKING
from .._wire import STRICT_VERSION
from ._caching import SETTLE_ROWS, UNMARKED_MIN_BYTES, CacheScan, note_unmarked
from ._duplicates import duplicate_check
from ._idindex import FP_SHIFT
from ._markers import Memo, marker_walk, system_walk

if TYPE_CHECKING:
    from typing import Any, BinaryIO, TypeAlias

CUSTOM_ID_PATTERN = "[A-Za-z0-9_-]{1,64}"
_custom_id_ok = re.compile(CUSTOM_ID_PATTERN).fullmatch  # fullmatch: a trailing "\n" must not pass

_ID_CHARS = bytes(range(256)).replace(b"-", b"a").replace(b"_", b"a")  # for bytes.translate
_BOM = b"\xef\xbb\xbf"
READ_BUFFER = 1 << 20


class ScanStats:
    """What a scan read. (A plain class: a dataclass costs 2-4 M instructions, about 1 ms, of every start.)"""

    __slots__ = ("lines", "end_offset", "repeats")

    def __init__(self) -> None:
        self.lines = 0  # lines read, blank ones included
        self.end_offset = 0  # bytes read
        self.repeats: dict[int, int] = {}  # line -> first line of the repeated ids told only at the end (spilled)


class Columns:
    """The valid requests of a piece, as the parallel reader keeps them: what `validate(into=...)` appends each to
    instead of yielding it. (In a worker, the generator's yield and its caller's unpacking and appends were 1,300
    instructions of the 25,400 a request.) A request's line number is not stored as it is read, but the lines that
    hold none (`skipped`, rare), and `lines` derives the rest: the append was 3.5% of a worker's time."""

    __slots__ = ("skipped", "offsets", "sizes", "fps", "by_model")

    def __init__(self) -> None:
        self.skipped: list[int] = []  # the lines that hold no request (blank or rejected), in order
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.fps: list[int] = []  # the custom_ids' fingerprints, `hash >> FP_SHIFT`, for the duplicate index
        self.by_model: defaultdict[str, list[int]] = defaultdict(list)  # model -> its requests' sizes

    def lines(self, count: int) -> list[int]:
        """The requests' line numbers, of the `count` lines read from line 1: every line not skipped."""
        keep = bytearray(b"\x01") * count
        for line in self.skipped:
            keep[line - 1] = 0
        lines = list(compress(range(1, count + 1), keep))
        if len(lines) != len(self.sizes):  # (each line is a request or skipped: else a bug, raised, never a wrong join)
            raise RuntimeError(f"{len(lines)} request lines for {len(self.sizes)} requests")
        return lines


if TYPE_CHECKING:  # what `plan`/`submit` accept as input: a path ("-" for stdin), or requests as dicts / lines
    Source: TypeAlias = str | os.PathLike[str] | Iterable[dict[str, Any] | bytes | str]


class Rejection(Record):
    """A line refused before anything is sent: its number (from 1), its custom_id when it has one, and why."""

    __slots__ = ("line", "custom_id", "reason")

    def __init__(self, line: int, custom_id: str | None, reason: str) -> None:
        self.line, self.custom_id, self.reason = line, custom_id, reason

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "custom_id": self.custom_id, "reason": self.reason}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_request(obj: Any) -> tuple[str | None, str | None, str | None]:
    """Validate one parsed line. Returns (custom_id, model, reason); reason is None when valid."""
    if type(obj) is not dict:
        return None, None, "not a JSON object"
    cid = obj.get("custom_id")
    if cid is None and "custom_id" not in obj:
        return None, None, "missing key 'custom_id'"
    if type(cid) is not str:
        return None, None, f"custom_id must be a string, got {_short(cid)}"
    if not _custom_id_ok(cid):
        return None, None, f"custom_id {_short(cid)} does not match {CUSTOM_ID_PATTERN}"
    if len(obj) != 2 or "params" not in obj:
        extra = sorted(k for k in obj if k not in ("custom_id", "params"))
        if extra:
            return cid, None, f"unexpected key {_short(extra[0])}: a request has exactly 'custom_id' and 'params'"
        return cid, None, "missing key 'params'"
    params = obj["params"]
    if type(params) is not dict:
        return cid, None, "params must be an object"
    model = params.get("model")
    if type(model) is not str or not model:
        return cid, None, "params.model must be a non-empty string"
    max_tokens = params.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        return cid, model, f"params.max_tokens must be an integer >= 1, got {_short(max_tokens)}"
    messages = params.get("messages")
    if type(messages) is not list or not messages:
        return cid, model, "params.messages must be a non-empty list"
    if params.get("stream", False) is not False:
        return cid, model, "params.stream must be absent or false: batch requests do not stream"
    if params.get("speed", "standard") != "standard":  # (fast mode; the SDK's own "standard" is not)
        return cid, model, f"params.speed {_short(params['speed'])} is not allowed in a batch (fast mode is not offered there)"
    return cid, model, None


VERSION_REFUSES = ("temperature", "top_p", "top_k")  # refused by 2026-10-21 "even if the value is the default"


def version_reason(params: dict[str, Any]) -> str | None:
    """Why API version 2026-10-21 refuses these params (api.md §20), or None: temperature, top_p or top_k at any
    value, a document block in an assistant message, citations on a user message's text block."""
    for key in VERSION_REFUSES:
        if key in params:
            return f"params.{key} is refused by API version {STRICT_VERSION} (even at its default): remove it, or use 2023-06-01"
    for i, message in enumerate(params.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        role = message.get("role")
        for block in content:
            if not isinstance(block, dict):
                continue
            if role == "assistant" and block.get("type") == "document":
                return f"params.messages[{i}]: a document block in an assistant message is refused by API version {STRICT_VERSION}"
            if role == "user" and block.get("type") == "text" and block.get("citations"):
                return f"params.messages[{i}]: citations on a user text block are refused by API version {STRICT_VERSION}"
    return None


def _json_reason(raw: bytes, exc: Exception) -> str:
    """The reason for a line that failed to parse; `raw` stripped, so positions do not depend on the line ending."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not valid UTF-8 (byte {err.start + 1})"
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as stripped:
        exc = stripped
    return f"not valid JSON: {exc}"


def encode_items(items: Iterable[dict[str, Any] | bytes | str]) -> Iterator[bytes]:
    """Each request of an iterable as one line of bytes: the one encoding `plan()` and `submit()` share.

    A dict is serialized by orjson; a str is encoded keeping lone surrogates (so the
    line is rejected as invalid UTF-8, not raised); bytes are taken as given. A line
    break inside an item would split it in the spooled file: a parsable item is
    re-serialized without it, an unparsable one has it replaced by a control byte so
    it stays one rejected line. Anything else is a `TypeError`: a bug in the caller.
    """
    for item in items:
        if isinstance(item, dict):
            try:
                line = orjson.dumps(item)
            except orjson.JSONEncodeError:
                # orjson refuses lone surrogates; the stdlib keeps them, so the line is rejected for its bytes.
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
        return orjson.dumps(orjson.loads(line))
    except orjson.JSONDecodeError:
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


def request_reader(fd: int) -> Callable[[int], tuple[str, str]]:
    """Reads back (custom_id, model) of the valid request at an offset: for the rare line whose fields are needed again."""
    def request_at(offset: int) -> tuple[str, str]:
        try:
            obj = orjson.loads(_line_at(fd, offset))
            return obj["custom_id"], obj["params"]["model"]
        except (orjson.JSONDecodeError, OSError, KeyError, TypeError):
            return "", ""  # (the file changed under us: an empty id matches nothing)

    return request_at


def validate(
    lines: Iterable[bytes],
    reject: Callable[[Rejection], None],
    *,
    item_limit: int,
    first_line: int = 1,
    offset: int = 0,
    from_file: bool = True,
    hasher: Any = None,
    stats: ScanStats | None = None,
    models: ModelRules | None = None,
    peaks: dict[str, int] | None = None,
    into: Columns | None = None,
    cache: CacheScan | None = None,
    strict: bool = False,
) -> Iterator[tuple[int, int, str, str, int, bytes]]:
    """Check every line; yield (line, offset, custom_id, model, size, raw) for the valid ones, where the request's
    body is `raw.strip()` (`size` bytes; made only by a caller that sends it), or, given `into`, append them to
    those columns and yield nothing. Uniqueness is not checked here.

    `models` (from the Models API preflight) rejects a line whose model is refused or whose max_tokens is over
    the model's limit; `peaks` receives the largest max_tokens seen per model (so a second pass is needed only
    when some line can be over a limit).

    `strict`: the requests go under API version 2026-10-21, whose refusals (`version_reason`) reject a line too.

    A line whose prompt has blocks is also checked for markers the API refuses (`_blocks`, `_markers`); a plain
    line is told apart by its shape, without a search or a call. Given `cache`, a marked line's prefixes and a long
    unmarked system prompt or tool list are noted there (`_caching`).

    This loop is the hot path of `plan`, and it stays one function over 60 lines on purpose: each Python call
    added a line costs about 35 ns (timeit) of the 2.5-3.7 us a line takes here, 1-1.5% per call, and splitting the
    checks out would add three (docs/performance.md). Only the lines that need more pay a call: a line with blocks
    (`_blocks`, about 1,000 instructions of a marked line's 39,243), one orjson refused (`_unparsed`), and every
    line when a preflight or API version 2026-10-21 adds its rules (`_later_reason`).
    """
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    lines, offset = _opened(lines, first_line == 1 and (offset == 0 or not from_file), offset, hasher)
    later = strict or models is not None or peaks is not None  # (the checks a plain `plan` skips)
    memos: dict[str, Memo] = {}  # one a model: files interleave models, and a prefix is per model
    cols = into or Columns()
    col_offsets, col_sizes, col_fps, by_model = cols.offsets, cols.sizes, cols.fps, cols.by_model
    if into is not None:
        if first_line != 1:
            raise ValueError("validate(into=...) numbers a piece's lines from 1")
        reject = _noting(reject, into.skipped)
    line_no = first_line - 1
    for raw in lines:
        line_no += 1
        start = offset
        if from_file:
            offset += len(raw)
        else:
            start = -1
        try:
            obj = loads(raw)
        except decode_error as exc:
            _unparsed(raw, exc, line_no, reject, into)
            continue
        # The common shape, read by subscript (cheaper than .get; a missing key or a non-object raises, at no
        # cost when nothing is raised) and checked with as few operations as possible; anything else goes to
        # check_request, which names the reason.
        try:
            cid = obj["custom_id"]
            params = obj["params"]
            model = params["model"]
            max_tokens = params["max_tokens"]
            messages = params["messages"]
            # (params is a dict: orjson gives no other type that a str subscripts. A custom_id of another type
            # fails len() or has no encode(): TypeError or AttributeError.)
            common = (
                len(obj) == 2  # (both keys found: exactly these two)
                and len(cid) <= 64  # (an empty one fails the next test: b''.isalnum() is False)
                # bytes.isalnum is ASCII-only, so with '-' and '_' mapped to 'a' this is the custom_id pattern,
                # at half the cost of a regex or str.strip(chars). (orjson never gives a lone surrogate.)
                and cid.encode().translate(_ID_CHARS).isalnum()
                and "stream" not in params
                and "speed" not in params
                and model.__class__ is str
                and model
                and max_tokens.__class__ is int
                and max_tokens >= 1
                and messages.__class__ is list
                and messages
            )
        except (KeyError, TypeError, AttributeError):
            common = False
        if not common:
            cid, model, reason = check_request(obj)
            if reason is not None:
                reject(Rejection(line_no, cid, reason))
                continue
            params = obj["params"]  # (what the shortcut read may be partial: read again, off the common path)
            messages = params["messages"]
        size = len(raw) - 1
        if raw[0] != 123 or raw[size] != 10 or raw[size - 1] != 125:  # not b'{...}\n': measure what strip() keeps
            body = raw.strip()  # (a copy: 2.5% of a worker's instructions, paid only here)
            size = len(body)
            if start >= 0 and body[0] != raw[0]:
                start += len(raw) - len(raw.lstrip())
        if size > item_limit:
            reject(Rejection(line_no, cid, too_large(size, item_limit)))
            continue
        # Markers only stand in blocks (list system, tools, block content) or at the top: a plain line is not searched.
        system = params.get("system")
        if (system.__class__ is list or "tools" in params or "cache_control" in params or len(messages) != 1
                or messages[0].__class__ is not dict or messages[0].get("content").__class__ is not str):
            memo = memos.get(model) or memos.setdefault(model, Memo())
            reason = _blocks(raw, params, system, model, memo, cache, line_no, start, size, cid)
            if reason is not None:
                reject(Rejection(line_no, cid, reason))
                continue
        elif cache is not None and system.__class__ is str and len(system) >= UNMARKED_MIN_BYTES:
            note_unmarked(cache, model, system, None)
        if later:
            reason = _later_reason(params, strict, models, peaks)
            if reason is not None:
                reject(Rejection(line_no, cid, reason))
                continue
        # cid and model are set: check_request gave no reason (no runtime check here: the hot path).
        if into is None:
            yield line_no, start, cid, model, size, raw
            continue
        col_offsets.append(start)
        col_sizes.append(size)
        col_fps.append(hash(cid) >> FP_SHIFT)
        by_model[model].append(size)
    if stats is not None:
        stats.lines = line_no
        stats.end_offset = offset


def _unparsed(raw: bytes, exc: Exception, line: int, reject: Callable[[Rejection], None], into: Columns | None) -> None:
    """A line orjson refused: rejected, or skipped when blank (no request, no rejection)."""
    if raw.strip():
        reject(Rejection(line, None, _json_reason(raw.strip(), exc)))
    elif into is not None:
        into.skipped.append(line)


def _later_reason(params: dict[str, Any], strict: bool, models: ModelRules | None, peaks: dict[str, int] | None
                  ) -> str | None:
    """Why API version 2026-10-21 (`strict`) or the Models API's rules refuse a line that passed the rest, or None;
    `peaks` takes its max_tokens."""
    reason = version_reason(params) if strict else None
    if reason is None and (models is not None or peaks is not None):
        reason = _model_reason(params, models, peaks)
    return reason


def _noting(reject: Callable[[Rejection], None], skipped: list[int]) -> Callable[[Rejection], None]:
    """`reject`, noting each rejected line in `skipped` first (for `Columns.lines`)."""
    def note(rejection: Rejection) -> None:
        skipped.append(rejection.line)
        reject(rejection)

    return note


def too_large(size: int, item_limit: int) -> str:
    return f"request is {size} bytes: no batch can hold it (at most {item_limit} bytes a request)"


def _blocks(raw: bytes, params: dict[str, Any], system: Any, model: str, memo: Memo, cache: CacheScan | None,
            line: int, offset: int, size: int, cid: str) -> str | None:
    """A line with blocks (or a top-level marker): why the API would refuse its markers, or None, its prefixes or
    its long unmarked parts noted in `cache`. A line whose only blocks are its system's is walked over them with
    no search; another only if its bytes name `cache_control`.
    (Out of `validate`'s loop: a plain line never pays this call.)"""
    messages = params["messages"]
    if (system.__class__ is list and "tools" not in params and "cache_control" not in params and len(messages) == 1
            and messages[0].__class__ is dict and messages[0].get("content").__class__ is str):
        reason, points = system_walk(system, model, memo)
    elif b"cache_control" in raw:
        reason, points = marker_walk(params, model, memo)  # (one walk: the check and the prefixes)
    else:
        reason, points = None, ()
    if reason is not None or cache is None:
        return reason
    if points:
        rows = cache.rows
        rows.append((line, offset, size, cid, model, points))
        if len(rows) >= SETTLE_ROWS:
            cache.settle()
    elif system is not None or "tools" in params:
        note_unmarked(cache, model, system, params.get("tools"))
    return None


def _opened(lines: Iterable[bytes], at_start: bool, offset: int, hasher: Any) -> tuple[Iterator[bytes], int]:
    """The lines with a BOM peeled off the first (when `at_start`: the file's or the iterable's first line), each
    fed to `hasher` if given; and the offset of the first line's first byte after the BOM."""
    lines = iter(lines)
    if at_start:
        head = next(lines, None)
        if head is not None and head.startswith(_BOM):
            if hasher is not None:
                hasher.update(_BOM)
            head, offset = head[3:], offset + 3
        lines = chain(() if head is None else (head,), lines)
    if hasher is not None:
        lines = _hashed(lines, hasher.update)
    return lines, offset


def _hashed(lines: Iterator[bytes], update: Callable[[bytes], object]) -> Iterator[bytes]:
    """The lines, each fed to the hash on its way (only a submit hashes: `plan`'s loop skips this step)."""
    for raw in lines:
        update(raw)
        yield raw


ModelRules = dict[str, tuple[str | None, int | None]]
"""model name as written -> (why every line naming it is rejected, or None; its max_tokens limit, or None)."""


def _model_reason(params: dict[str, Any], models: ModelRules | None, peaks: dict[str, int] | None) -> str | None:
    model, max_tokens = params["model"], params["max_tokens"]
    if peaks is not None and max_tokens > peaks.get(model, 0):
        peaks[model] = max_tokens
    rule = models.get(model) if models is not None else None
    if rule is None:
        return None
    refused, limit = rule
    if refused is not None:
        return refused
    if limit is not None and max_tokens > limit:
        return f"model {model!r}: params.max_tokens {max_tokens:,} is above the model's limit of {limit:,}"
    return None


def duplicate(cid: str, first: int) -> str:
    return f"duplicate custom_id {cid!r} (first on line {first})"


def scan(
    source: Source,
    reject: Callable[[Rejection], None],
    *,
    item_limit: int,
    stats: ScanStats | None = None,
    hasher: Any = None,
    models: ModelRules | None = None,
    peaks: dict[str, int] | None = None,
    cache: CacheScan | None = None,
    strict: bool = False,
    ids_in_memory: int | None = None,
    repeats: dict[int, int] | None = None,
) -> Iterator[tuple[int, int, str, str, int, bytes]]:
    """Yield (line, offset, custom_id, model, size, raw) for every valid, unique request, in order (as `validate`).

    Every bad line goes to `reject`. `item_limit` is the largest request (bytes) a
    batch can hold: a larger one is rejected rather than breaking the splitter.
    `stats` receives the line count and end offset; `hasher` (a hashlib object)
    sees every byte of a file source. A file of more than `ids_in_memory` ids may
    yield a repeated id: `stats.repeats` then names it, for a second reading told
    the `repeats` (see `_duplicates`).
    """
    stream, items, size = open_source(source)
    check = None
    try:
        from_file = stream is not None
        lines: Iterable[Any] = stream if stream is not None else encode_items(items or ())
        check = duplicate_check(expected_ids(stream, size), _confirmer(stream) if from_file else None,
                                rereadable=stats is not None and _rereadable(source), limit=ids_in_memory,
                                known=repeats)
        add = check.add
        for line_no, start, cid, model, n, raw in validate(
            lines, reject, item_limit=item_limit, from_file=from_file, hasher=hasher, stats=stats, models=models, peaks=peaks,
            cache=cache, strict=strict
        ):
            first = add(cid, line_no, start)
            if first:
                reject(Rejection(line_no, cid, duplicate(cid, first)))
                continue
            yield line_no, start, cid, model, n, raw
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
