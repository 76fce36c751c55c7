"""Re-export a run's final results at any time, also while it runs (what is committed so far).

Reads the journal through a read-only connection, so it never blocks or
disturbs a running submit; only lines covered by the committed output length
are read, never a batch that is half written.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import orjson

from .errors import UsageError
from .journal import Journal

RESULT_TYPES = ("succeeded", "errored", "expired", "canceled")


def _connect(state_dir: Path) -> sqlite3.Connection:
    path = state_dir / Journal.FILE
    if not path.exists():
        raise UsageError(f"no gatekeeper journal in {state_dir}")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)


def _filter(only: Iterable[str] | None) -> tuple[str, list[str]]:
    """SQL for --only: result types (succeeded, errored, ...) and/or error types (invalid_request_error, ...)."""
    if not only:
        return "", []
    types = [t for t in only if t in RESULT_TYPES]
    errors = [t for t in only if t not in RESULT_TYPES]
    parts, args = [], []
    if types:
        parts.append(f"type IN ({','.join('?' * len(types))})")
        args += types
    if errors:
        parts.append(f"error_type IN ({','.join('?' * len(errors))})")
        args += errors
    return " WHERE " + " OR ".join(parts), args


def export(state_dir: str | os.PathLike[str], dest: BinaryIO, *, in_order: bool = False, only: Iterable[str] | None = None) -> int:
    """Write the run's final result lines to `dest`; return how many. Memory stays bounded either way."""
    state = Path(state_dir)
    db = _connect(state)
    try:
        db.execute("BEGIN")  # one snapshot: the committed length and the rows agree
        meta = dict(db.execute("SELECT key, value FROM meta"))
        output = orjson.loads(meta["output"]) if "output" in meta else str(state / "results.jsonl")
        committed = int(orjson.loads(meta.get("output_committed", "0")))
        where, args = _filter(list(only) if only else None)
        with open(output, "rb") as src:
            if not where and not in_order:
                left = committed  # the output file is already the results, in arrival order
                count = 0
                while left > 0:
                    chunk = src.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    dest.write(chunk)
                    count += chunk.count(b"\n")
                    left -= len(chunk)
                return count
            order = "line" if in_order else "out_offset"
            count = 0
            for offset, length in db.execute(f"SELECT out_offset, out_len FROM results{where} ORDER BY {order}", args):
                if offset + length > committed:
                    continue
                src.seek(offset)
                dest.write(src.read(length))
                count += 1
            return count
    except FileNotFoundError as exc:
        raise UsageError(f"the run's results file is missing: {exc.filename}") from None
    finally:
        db.close()
