"""Room kept on the journal's disk for what a run must record once that disk is full: a ballast file.

A real-time call that is out when the disk fills is paid for whatever happens next; its answer is worth keeping only
if the journal can record it (`received`), and a full disk leaves no room to. So while real-time calls may be out, a
run keeps a file of zeros in its state folder, as large as recording the answers of every call allowed out needs
(`room_for`); on the first write that finds the disk full it deletes it, and the calls out settle into the room
freed. The file's blocks are allocated (`posix_fallocate`), not a sparse file's promise, and the file is deleted at
the run's end (a run killed leaves it; the next run takes it over under the same name).

Best effort: on a copy-on-write file system (btrfs, ZFS) or a disk another process fills in the same moment, the
room freed may not be all there; a call whose answer still cannot be recorded is counted as a possible double
charge on the rerun, as before.
"""

from __future__ import annotations

import errno
import os
from contextlib import suppress
from pathlib import Path

PAGE_ROOM = 4 * 4120  # bytes of the journal's log one answer's record takes besides the answer: 4 pages with headers
BYTES_PER_TOKEN = 4  # bytes of an answer for each output token (English text; JSON adds little, a CJK character 3)
ENVELOPE = 2048  # bytes of an answer's JSON besides its text (ids, usage, the line's own fields)


def room_for(calls: int, max_tokens: int) -> int:
    """Bytes the journal needs to record the answers of `calls` calls of at most `max_tokens` output tokens each."""
    return calls * (PAGE_ROOM + ENVELOPE + BYTES_PER_TOKEN * max(1, max_tokens))


class Ballast:
    """A file of zeros in `folder` (None: no local journal, nothing kept) that frees its room when asked."""

    NAME = "ballast"

    def __init__(self, folder: Path | None) -> None:
        self.path = None if folder is None else folder / self.NAME
        self.size = 0  # bytes it holds now
        self.released = False  # freed for a full disk: never made again by this run

    def hold(self, size: int) -> bool:
        """Keep at least `size` bytes; whether they are kept (False: the disk has no room for them, or the file
        system cannot allocate them ahead; what it held before is kept)."""
        if self.path is None or self.released or size <= self.size:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            _allocate(fd, size)
            os.fsync(fd)
        except OSError:
            with suppress(OSError):
                os.ftruncate(fd, self.size)  # (a part allocated is given back: the disk stays as it was)
            return False
        finally:
            os.close(fd)
        self.size = size
        return True

    def release(self) -> int:
        """Free the room (the disk is full): the bytes freed."""
        freed, self.size, self.released = self.size, 0, True
        self._remove()
        return freed

    def drop(self) -> None:
        """The run is over: the file goes (a later run keeps its own)."""
        self.size = 0
        self._remove()

    def _remove(self) -> None:
        if self.path is not None:
            with suppress(OSError):
                os.unlink(self.path)


def _allocate(fd: int, size: int) -> None:
    """`size` bytes of `fd` allocated on the disk: by the file system at once where it can, else written out."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    block = b"\0" * (1 << 16)
    os.lseek(fd, 0, os.SEEK_SET)
    left = size
    while left > 0:
        left -= os.write(fd, block[:left])
