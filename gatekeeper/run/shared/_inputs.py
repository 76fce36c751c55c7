"""Re-reading the input on the submit path: a batch's lines by byte range, and the file's identity.

The journal stores each batch as a byte range of the input plus the rejected
line numbers inside it, not the requests themselves: the input is the one copy
of the data, and a changed input is detected (size, mtime, sha256) rather than
silently sent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..._errors import InputError, os_error

if TYPE_CHECKING:
    from ...state._journal import BatchRow, Journal

_BOM = b"\xef\xbb\xbf"


def stat_identity(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(os_error(exc, f"cannot read {path}")) from None
    return st.st_size, st.st_mtime_ns


def hash_file(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    except OSError as exc:
        raise InputError(os_error(exc, f"cannot read {path}")) from None
    return h.hexdigest()


def iter_range(path: str, start: int, end: int, first_line: int, skip: set[int]) -> Iterator[tuple[int, int, bytes]]:
    """(line, offset, request bytes) for each non-blank, non-rejected line in [start, end)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed in finally (generator)
    except OSError as exc:
        raise InputError(os_error(exc, f"cannot read {path}")) from None
    try:
        f.seek(start)
        offset = start
        line = first_line
        while offset < end:
            raw = f.readline()
            if not raw:
                break
            here = offset
            offset += len(raw)
            if here == 0 and raw.startswith(_BOM):
                raw = raw[3:]
                here = 3
            body = raw.strip()
            if body and line not in skip:
                yield line, here + (len(raw) - len(raw.lstrip())), body
            line += 1
    finally:
        f.close()


def read_at(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise InputError(f"{path} changed: a request at byte {offset} is gone")
    return data


def batch_requests(path: str, journal: Journal, row: BatchRow) -> Iterator[tuple[int, int, bytes, int]]:
    """(line, offset, bytes, attempt) of every request of a batch, in order, one at a time: a plan batch is a byte
    range of the input less its rejected lines; another batch lists its members."""
    if row.kind == "plan":
        skip = journal.groups.skipped_lines(row.first_line, row.last_line)
        for line, off, body in iter_range(path, row.start_offset, row.end_offset, row.first_line, skip):
            yield line, off, body, 1
        return
    for line, off, length, _, attempt in journal.groups.members(row.idx):
        yield line, off, read_at(path, off, length), attempt
