"""What a CSV that is not UTF-8 looks like, for the one line that refuses it: a byte-order mark's encoding, the
UTF-16 or UTF-32 its first bytes' NULs say without one, or its first line that is not UTF-8 as Windows-1252 (Latin-1's
superset, the usual culprit) reads it."""

from __future__ import annotations

import codecs
from typing import Any

_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))
# which of each 4 bytes are mostly NUL, for text without a byte-order mark (ASCII and Latin-1 characters' high bytes)
_NULS = (((False, True, True, True), "UTF-32-LE"), ((True, True, True, False), "UTF-32-BE"),
         ((False, True, False, True), "UTF-16-LE"), ((True, False, True, False), "UTF-16-BE"))
HEAD = 64  # bytes a file's start is judged by
CHUNK = 1 << 20
_FIX = "name its encoding{}, or convert it to UTF-8"


def bom_of(head: bytes) -> str | None:
    """The encoding a file's first bytes name by their byte-order mark (UTF-16 or UTF-32), if any."""
    return next((name for bom, name in _BOMS if head.startswith(bom)), None)


def unmarked_of(head: bytes) -> str | None:
    """The UTF-16 or UTF-32 (with its byte order) that a file's first bytes look like without a byte-order mark:
    NULs in alternate places, as its ASCII characters' high bytes are (UTF-8 text holds no NUL)."""
    n = min(len(head), HEAD) // 4 * 4
    if n < 8 or b"\0" not in head[:n]:
        return None
    per = n // 4
    mostly = tuple(2 * sum(1 for b in head[k:n:4] if b == 0) >= per for k in range(4))
    return next((name for pattern, name in _NULS if mostly == pattern), None)


def wide_of(head: bytes) -> str | None:
    """Why a file's first bytes are UTF-16 or UTF-32, not UTF-8 (its byte-order mark, or its NULs), if they are."""
    name = bom_of(head)
    if name is not None:
        return f"it starts with a {name} byte-order mark; {_FIX.format(f' ({name.lower()})')}"
    name = unmarked_of(head)
    if name is not None:
        return f"its first bytes hold NULs as {name} without a byte-order mark does; " + \
            _FIX.format(f" ({name.lower()}, if that is it)")
    return None


def not_utf8(f: Any) -> str:
    """"is not UTF-8: ..." for the file `f` (read from its start, a chunk at a time, up to its first byte that is
    not UTF-8)."""
    wide = wide_of(f.read(HEAD))
    if wide is not None:
        return f"is not UTF-8: {wide}"
    f.seek(0)
    carry, lines = b"", 0
    while True:
        chunk = f.read(CHUNK)
        data = carry + chunk
        if not data:
            return f"is not UTF-8; {_FIX.format('')}"
        try:
            data.decode("utf-8")
            carry = b""
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data" or not chunk:
                return _first_bad(data, exc.start, lines)
            carry = data[exc.start:]  # (a character cut by the chunk's end: decoded with the next)
        lines += data.count(b"\n", 0, len(data) - len(carry))


def _first_bad(data: bytes, at: int, lines: int) -> str:
    start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
    line = data[start:end if end >= 0 else len(data)].rstrip(b"\r")
    number = lines + data.count(b"\n", 0, at) + 1
    shown = line if len(line) <= 60 else line[max(0, at - start - 30):at - start + 30]
    try:
        guess, text = "Windows-1252 (Latin-1)", shown.decode("cp1252")
    except UnicodeDecodeError:
        guess, text = "Latin-1", shown.decode("latin-1")
    name = "cp1252" if guess.startswith("Windows") else "latin-1"
    return f"is not UTF-8: line {number} has the byte {data[at]:#04x}, which reads as {guess} {text!r}; " + \
        _FIX.format(f" ({name}, if that is it)")


def not_in(f: Any, encoding: str) -> str:
    """"is not <encoding>: ..." for the file `f`, read from its start through an incremental decoder up to its
    first line the encoding cannot read (a CSV named in the wrong encoding: refused, never a traceback)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    lines = 0
    while True:
        chunk = f.read(CHUNK)
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            at, newline = max(0, exc.start), b"\n"
            return f"is not {encoding}: line {lines + chunk.count(newline, 0, at) + 1} has the byte {exc.object[at]:#04x}, " \
                   f"which {encoding} cannot read; name the table's encoding (utf-8, cp1252, latin-1, utf-16, ...)"
        except UnicodeError as exc:
            return f"is not {encoding}: {exc}; name the table's encoding (utf-8, cp1252, latin-1, utf-16, ...)"
        if not chunk:
            return f"cannot be read as {encoding}; name the table's encoding (utf-8, cp1252, latin-1, utf-16, ...)"
        lines += text.count("\n")
