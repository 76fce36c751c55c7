"""The results file: checked before a job starts, appended to, made durable, cut back on resume.

The journal records the file's committed length in the same transaction as the
rows that point into it. Whatever lies past that length was written by a run
that died before its commit, so a resume cuts it off (`truncate_to`) and the
batch is written again: no line appears twice, and none half.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from .._errors import GatekeeperError, OutputError, os_error


def check_writable(path: str, what: str = "results") -> str:
    """The absolute path of a file (`what`: the results, a report) we can create or append to; `OutputError`
    naming why not.

    Called before anything is journaled, so a bad path never becomes part of a job.
    """
    full = _target(path, what)
    try:
        os.close(os.open(full, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    except OSError as exc:
        raise OutputError(os_error(exc, f"cannot write {what} to {path}")) from exc
    return full


def _target(path: str, what: str) -> str:
    """The absolute path of a file to write, in a folder that exists and not itself a folder; `OutputError` if not."""
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        why = "is a file, not a folder" if os.path.exists(parent) else "does not exist"
        raise OutputError(f"cannot write {what} to {path}: folder {parent} {why}")
    if os.path.isdir(full):
        raise OutputError(f"cannot write {what} to {path}: it is a folder")
    return full


@contextmanager
def replacing(path: str, what: str, error: type[GatekeeperError] = OutputError) -> Iterator[BinaryIO]:
    """A file written whole or not at all (an export, a report, a spooled input): into a temporary file beside `path`,
    moved over it once complete. On any failure the temporary is removed and `path` is as it was: a reader never
    finds half a file, and a disk that filled keeps nothing of the attempt. A file error is an `error` (the caller's
    kind: `OutputError` for what the user asked written) naming the file."""
    full = _target(path, what)
    tmp = f"{full}.{os.getpid()}.tmp"
    try:
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb", buffering=1 << 20) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, full)
        except OSError as exc:
            raise error(os_error(exc, f"cannot write {what} to {path}")) from exc
    finally:
        with suppress(FileNotFoundError):
            os.unlink(tmp)  # (gone once moved)


class OutputFile:
    """The job's results file. Every write goes through here."""

    def __init__(self, path: str) -> None:
        self.path = path

    def size(self) -> int:
        """The file's length now (0 when it does not exist: a job resumed on another host)."""
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise OutputError(os_error(exc, f"cannot read the results file {self.path}")) from exc

    def truncate_to(self, committed: int) -> None:
        """Drop whatever a crashed run wrote past the committed length."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size != committed:
                    os.ftruncate(fd, committed)
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise OutputError(os_error(exc, f"cannot prepare the results file {self.path}")) from exc

    @contextmanager
    def appending(self, committed: int) -> Iterator[BinaryIO]:
        """Append, then flush and fsync before the caller commits; on any failure cut back to `committed`."""
        done = False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "ab", buffering=1 << 20) as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
            done = True
        except OSError as exc:
            raise OutputError(os_error(exc, f"cannot write the results file {self.path}")) from exc
        finally:
            if not done:
                self.truncate_to(committed)

    def lines(self, start: int, end: int) -> Iterator[bytes]:
        """The committed lines between two offsets, read back one at a time (bounded memory)."""
        with open(self.path, "rb") as f:
            f.seek(start)
            while f.tell() < end:
                yield f.readline()

    def spans(self, spans: Iterator[tuple[int, int]], committed: int) -> Iterator[bytes]:
        """The bytes of each (offset, length) inside the committed part, in the order given."""
        with open(self.path, "rb") as f:
            for offset, length in spans:
                if offset + length <= committed:
                    f.seek(offset)
                    yield f.read(length)

    def head(self, committed: int) -> Iterator[bytes]:
        """The committed part, in 1 MB pieces."""
        with open(self.path, "rb") as f:
            left = committed
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk
