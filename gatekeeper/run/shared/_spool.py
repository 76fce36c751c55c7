"""An input given as an iterable (dicts, bytes or str), spooled to a file in the job's state directory: the
journal records byte ranges of a file, so the requests are written once and read back from there."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import JournalError, UsageError
from ...input._reader import encode_items
from ...state._journal import Journal
from ...state._output import replacing
from ._inputs import hash_file
from ._settings import SubmitSettings, default_state_dir

if TYPE_CHECKING:
    from ...input._reader import Source


def resolve_source(source: Source, settings: SubmitSettings) -> tuple[str, Path, bool]:
    """(input path, state dir, spooled?) for a path or an iterable of requests."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path == "-":
            raise UsageError("submit needs a file it can read again on resume, not standard input: save it first")
        return path, Path(settings.state_dir or default_state_dir(path)), False
    if settings.state_dir is None:
        raise UsageError("state_dir is required when the requests are an iterable (they are spooled there)")
    return str(Path(settings.state_dir) / "input.jsonl"), Path(settings.state_dir), True


def spool(items: Iterable[dict[str, Any] | bytes | str], path: str) -> None:
    """Write an iterable's requests to the state directory (the encoding `plan()` uses), so the job can resume; whole
    or not at all."""
    with replacing(path, "the spooled requests", JournalError) as f:
        for line in encode_items(items):
            f.write(line)
            f.write(b"\n")


def check_respool(items: Iterable[dict[str, Any] | bytes | str], path: str, journal: Journal) -> None:
    """Resuming from an iterable: its requests must be the ones the job was started with."""
    fresh = path + ".resume"
    spool(items, fresh)
    try:
        if hash_file(fresh) != (journal.get_meta("input") or {}).get("sha256"):
            raise JournalError(f"state directory {journal.state_dir} holds a job started with other requests; "
                               "use another state_dir to start a new job")
    finally:
        os.unlink(fresh)


def adopt_spool(path: str, journal: Journal) -> None:
    """Once the lease is ours: the freshly spooled requests become the job's input, if they are the job's."""
    known = (journal.get_meta("input") or {}).get("sha256")
    if known is not None and hash_file(path + ".incoming") != known:
        os.unlink(path + ".incoming")
        raise JournalError(f"job {journal.job!r} was started with other requests; name another job to start a new one")
    os.replace(path + ".incoming", path)
