"""A create's body, `{"requests": [...]}`, read as it arrives: the requests cut out of the stream as soon as they are
whole, whatever the body's size, so a 2 GB create never sits in memory.

Only the envelope is parsed here (the object, its one key, the array, the commas between requests); each request's
own JSON is judged afterwards, line by line, by `plan` (gatekeeper.input), as any input file's. The requests come
out as JSONL: one line a request, its bytes as the client sent them (a request written across lines is compacted).

Two ways to find where requests end, one fast and one exact. The fast one guesses a boundary near the end of what
has arrived (the last `},{"custom_id"`, as SDKs write requests) and has msgspec decode everything before it as a
list of raw values, in C: when that decodes, each value is a whole request, since a JSON value cannot close inside
a string or a nested object. A guess that does not decode (a boundary inside a prompt, a request written otherwise)
hands that stretch to the exact way: brackets counted outside strings, one C-level regex match a token. Memory holds
the last incomplete request and the chunk it arrived in, never the body. Errors are the API's 400 text
(`requests.3: ...`).
"""

from __future__ import annotations

import re

import msgspec
import orjson

from .._errors import GatewayRefusal

# A whole JSON string (escapes skipped), a bracket, or a quote that opens a string not yet complete in the buffer.
_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[{}\[\]]|"')  # (possessive: an open string fails in one pass)
_SPACE = b" \t\r\n"
_SPACING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[ \t\r\n]+')  # a string (kept whole) or spacing between tokens
_HEAD = re.compile(rb'\s*\{\s*"requests"\s*:\s*\[')
_KEY = re.compile(rb'\s*\{\s*"((?:[^"\\]|\\.)*)"\s*:')
_EMPTY = re.compile(rb"\s*\{\s*\}\s*$")
_NEXT_KEY = re.compile(rb',\s*"((?:[^"\\]|\\.)*)"')
_GUESS = b'},{"custom_id"'  # a boundary between two requests as the SDKs serialize them
_LAST = re.compile(rb"\}\s*\]\s*\}\s*$")  # the last request's brace, then the body's end
_LOOSE_GUESS = re.compile(rb'\}\s*,\s*\{')  # any other boundary, looked for in the last stretch only
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
HEAD_WAIT = 1 << 16  # bytes of a body read before its head must show whether it is {"requests": [
GUESS_WINDOW = 1 << 20  # bytes at the end of the buffer searched for a loose boundary
EXACT_AFTER = 64 << 20  # bytes of requests without a guessable boundary before the exact way cuts them (its regex
# reads about 100 MB/s inside strings; the guess, 500 MB/s or more)


class RequestCutter:
    """Feed the body's chunks in order (`feed`), then `finish()`: each returns the requests completed since, as JSONL
    (one line a request, each ending in a newline; b"" when none). `count` is how many so far. A 400
    `GatewayRefusal` at the first fault of the envelope."""

    def __init__(self) -> None:
        self._buf = bytearray()  # (appended in place: a request of 30 MB arriving in 64 KB chunks is not copied each time)
        self._pos = 0  # where reading resumes in `_buf`
        self._state = "head"  # head, item (a request or "]" next), sep ("," or "]"), tail, done
        self._item_start = -1  # where the request the exact way is reading starts (-1: none open)
        self._depth = 0
        self._scan = 0  # where the exact way's bracket count resumes
        self._wait_for = 0  # a string still open: the buffer length to reach before scanning again
        self._exact_until = 0  # the exact way reads up to here (a guess that did not decode)
        self.count = 0  # requests cut so far

    def feed(self, chunk: bytes | bytearray) -> bytes:
        """Take `chunk`, then cut what is whole (`append` then `cut`)."""
        self.append(chunk)
        return self.cut()

    def append(self, chunk: bytes | bytearray) -> None:
        """Take `chunk` without cutting (cheap: the server's event loop appends, a worker thread cuts)."""
        self._buf += chunk

    def pending(self) -> int:
        """Bytes taken and not yet cut."""
        return len(self._buf) - self._pos

    def cut(self) -> bytes:
        """The requests whole in what was taken so far."""
        shift = self._pos
        if shift > 1:  # (one byte kept before the next request: `_decoded` writes its "[" there)
            del self._buf[:shift - 1]
            shift -= 1
            self._pos = 1
            self._item_start = self._item_start - shift if self._item_start >= 0 else -1
            self._scan, self._wait_for, self._exact_until = self._scan - shift, self._wait_for - shift, self._exact_until - shift
        if len(self._buf) < self._wait_for:
            return b""
        return self._run(final=False)

    def finish(self) -> bytes:
        out = self._run(final=True)
        if self._state == "head":
            raise _refused(_head_error(self._buf))
        if self._state != "done":
            raise _refused("request body is not valid JSON: the body ended before its closing brackets")
        return out

    def _run(self, final: bool) -> bytes:
        out: list[bytes] = []
        while True:
            step = getattr(self, "_" + self._state)(final)
            if step is None:
                return b"".join(out)
            if step:
                out.append(step)

    # -- the envelope --------------------------------------------------------

    def _head(self, final: bool) -> bytes | None:
        m = _HEAD.match(self._buf)
        if m is None:
            if final or len(self._buf) >= HEAD_WAIT:
                raise _refused(_head_error(self._buf))
            return None
        self._pos, self._state = m.end(), "item"
        return b""

    def _skip_space(self) -> int:
        """The position of the next byte that is not whitespace (len when none is in yet)."""
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _SPACE:
            i += 1
        return i

    def _item(self, final: bool) -> bytes | None:
        if self._item_start >= 0:
            return self._close_item()
        i = self._skip_space()
        self._pos = i
        if i >= len(self._buf):
            return None
        c = self._buf[i:i + 1]
        if c == b"]" and self.count == 0:
            self._pos, self._state = i + 1, "tail"
            return b""
        if c != b"{":
            raise _refused(f"requests.{self.count}: Input should be a valid dictionary" if c not in b",]" else
                            "request body is not valid JSON: a request is missing between commas")
        if i >= self._exact_until:
            end = self._guess(i, final)
            if end < 0 and not final and len(self._buf) - i < EXACT_AFTER:
                self._wait_for = i + 2 * (len(self._buf) - i)  # (no boundary yet: look again once twice as much is in)
                return None
            lines = self._decoded(i, end) if end >= 0 else None
            if lines is not None:
                return lines
        self._item_start, self._depth, self._scan = i, 0, i
        return self._close_item()

    def _guess(self, i: int, final: bool) -> int:
        """Where a request after `i` may close (its closing brace), near the end of what has arrived; -1: nowhere.
        At the end of the body: the last request's brace, before the closing `]}`."""
        buf = self._buf
        last = _LAST.search(buf, max(i, len(buf) - 256)) if final else None
        if last is not None:
            return last.start()
        end = buf.rfind(_GUESS, i)
        if end >= 0:
            return end
        starts = [m.start() for m in _LOOSE_GUESS.finditer(buf, max(i, len(buf) - GUESS_WINDOW))]
        return starts[-1] if starts else -1

    def _decoded(self, i: int, end: int) -> bytes | None:
        """The requests from `i` to the guessed boundary `end`, decoded at once; None when the guess was wrong (the
        exact way then reads up to it). Decoded in place: the bytes just before and after the stretch become "["
        and "]" for the decode and are put back, so the stretch is never copied (a copy is a third of the time)."""
        buf = self._buf
        if i == 0 or end + 1 >= len(buf):
            return self._decoded_copy(i, end)
        before, after = buf[i - 1], buf[end + 1]
        buf[i - 1], buf[end + 1] = 0x5B, 0x5D
        view = memoryview(buf)[i - 1:end + 2]
        try:
            raws = _RAWS.decode(view)
        except msgspec.DecodeError:
            view.release()
            buf[i - 1], buf[end + 1] = before, after
            self._exact_until = end + 1
            return None
        across = buf.find(b"\n", i, end + 1) >= 0 or buf.find(b"\r", i, end + 1) >= 0
        lines = self._lines(raws, across)  # (a refusal here ends the body: the buffer is not used again)
        del raws  # (the raw values point into the buffer: gone before it is released, and resized later)
        view.release()
        buf[i - 1], buf[end + 1] = before, after
        self._pos, self._state = end + 1, "sep"
        return lines

    def _decoded_copy(self, i: int, end: int) -> bytes | None:
        """`_decoded` where the stretch has no byte free on either side (it starts the buffer)."""
        block = bytes(self._buf[i:end + 1])
        try:
            raws = _RAWS.decode(b"[" + block + b"]")
        except msgspec.DecodeError:
            self._exact_until = end + 1
            return None
        lines = self._lines(raws, b"\n" in block or b"\r" in block)
        self._pos, self._state = end + 1, "sep"
        return lines

    def _lines(self, raws: list[msgspec.Raw], across: bool) -> bytes:
        """The decoded requests as JSONL (each compacted to one line when any was written across lines)."""
        first = self.count
        self.count += len(raws)
        if across:
            return b"".join(_one_line(bytes(r), first + k) + b"\n" for k, r in enumerate(raws))
        return b"\n".join([*raws, b""])

    def _close_item(self) -> bytes | None:
        """The exact way: brackets counted from `_scan` to the request's closing brace; the request once whole."""
        depth = self._depth
        for m in _TOKEN.finditer(self._buf, self._scan):
            c = self._buf[m.start()]
            if c == 0x22:  # a string: skipped whole, or still open (wait until the carried part has doubled)
                if m.end() - m.start() == 1:
                    self._depth, self._scan = depth, m.start()
                    self._wait_for = 2 * len(self._buf) - self._item_start
                    return None
                continue
            depth += 1 if c in b"{[" else -1
            if depth == 0:
                item = bytes(self._buf[self._item_start:m.end()])
                self._item_start, self._pos, self._state = -1, m.end(), "sep"
                self.count += 1
                return _one_line(item, self.count - 1) + b"\n"
        self._depth, self._scan = depth, len(self._buf)
        return None

    def _sep(self, final: bool) -> bytes | None:
        i = self._skip_space()
        self._pos = i
        if i >= len(self._buf):
            return None
        c = self._buf[i:i + 1]
        if c in b",]" and c:
            self._pos, self._state = i + 1, "item" if c == b"," else "tail"
            return b""
        raise _refused(f"request body is not valid JSON: expected ',' or ']' after requests.{self.count - 1}")

    def _tail(self, final: bool) -> bytes | None:
        i = self._skip_space()
        self._pos = i
        if i >= len(self._buf):
            return None
        if self._buf[i:i + 1] == b"}":
            self._pos, self._state = i + 1, "done"
            return b""
        m = _NEXT_KEY.match(self._buf, i)
        if m is not None:
            raise _refused(f"{m.group(1).decode(errors='replace')}: Extra inputs are not permitted")
        if not final and len(self._buf) - i < 256:
            return None
        raise _refused("request body is not valid JSON: expected '}' after the requests")

    def _done(self, final: bool) -> bytes | None:
        i = self._skip_space()
        if i < len(self._buf):
            raise _refused("request body is not valid JSON: trailing data after the closing brace")
        self._pos = i
        return None


def _refused(message: str) -> GatewayRefusal:
    """The body is not a create's: the API's 400, in its words."""
    return GatewayRefusal(400, message)


def _one_line(item: bytes, index: int) -> bytes:
    """A request as one line of JSONL: as sent, or, written across lines, with the spacing between its tokens taken
    out (never re-encoded: a number or an escape stays as the client wrote it). A raw newline left inside a string
    is invalid JSON, which the API refuses."""
    if b"\n" not in item and b"\r" not in item:
        return item
    line = _SPACING.sub(lambda m: m.group(0) if m.group(0)[:1] == b'"' else b"", item)
    if b"\n" in line or b"\r" in line:
        raise _refused(f"requests.{index}: Invalid JSON: a control character inside a string")
    return line


def _head_error(buf: bytes | bytearray) -> str:
    """Why a body does not open as {"requests": [ (the API's words where a client could tell them apart)."""
    head = bytes(buf[:HEAD_WAIT]).strip()
    if not head:
        return "request body is not valid JSON: the body is empty"
    if _EMPTY.match(head):
        return "requests: Field required"
    key = _KEY.match(head)
    if key is not None:
        name = key.group(1).decode(errors="replace")
        return "requests: Input should be a valid list" if name == "requests" else f"{name}: Extra inputs are not permitted"
    if head[:1] != b"{" and len(buf) < HEAD_WAIT:
        try:
            orjson.loads(head)
            return "requests: Field required"  # (JSON, but not an object)
        except orjson.JSONDecodeError:
            pass
    return "request body is not valid JSON"
