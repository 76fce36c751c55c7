"""A table job's default result file in its state folder. Jobs of different specs over one table share that folder
(their answers are kept by request, so each finds its own): `result.parquet` stays the result of the spec that
wrote it first, which a user's pipeline reads; a job of another spec (template, system, model, max_tokens, params,
id column) writes `result-<its spec's digest>.parquet` beside it, never over another spec's answers. Which spec
owns `result.parquet` is recorded beside it (`result.parquet.spec`), claimed atomically when it is first written:
of two jobs claiming at once, one wins and the other writes its own file."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import orjson

from ._rows import TableSpec

NAME = "result.parquet"
OWNER = "result.parquet.spec"
SHORT = 16  # hex digits of a spec's digest in its own result's name


def spec_digest(spec: TableSpec) -> str:
    """The digest of everything that decides a job's result table, given the table: its spec as plain data."""
    return hashlib.sha256(orjson.dumps(spec.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()


def default_result(root: Path, spec: TableSpec) -> Path:
    """Where the job of `spec` writes its result by default: `result.parquet`, unless another spec owns it (one
    written by a version that kept no record is the first spec's to write it after the upgrade)."""
    owner, digest = _owner(root), spec_digest(spec)
    return root / NAME if owner in (None, digest) else root / f"result-{digest[:SHORT]}.parquet"


def claim_default(root: Path, spec: TableSpec) -> Path:
    """`default_result`, with `result.parquet` claimed for `spec` when no spec owns it yet (the record is linked
    into place whole: never a half-written record, never two owners)."""
    if _owner(root) is None:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".result-spec-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps({"spec": spec_digest(spec), **spec.to_json()}, option=orjson.OPT_SORT_KEYS))
            os.link(tmp, root / OWNER)
        except FileExistsError:
            pass  # (another job claimed it first: its own file for this one)
        finally:
            os.unlink(tmp)
    return default_result(root, spec)


def _owner(root: Path) -> str | None:
    """The digest of the spec that owns `result.parquet`; None when none is recorded, "" when the record cannot
    be read (owned, by a spec unknown: every job then writes its own file, none over it)."""
    try:
        owner = orjson.loads((root / OWNER).read_bytes())["spec"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return owner if isinstance(owner, str) else ""
