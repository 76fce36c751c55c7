"""Where a table job keeps its state, and a table's name as it may be shown.

A table job's state (its answers, its runs, its default result) follows the table, not the shell: it is kept in the
user's state folder (`state._home`), in a folder keyed by the table's *identity*: a local path made absolute, an
object-storage URI without its credentials or its query (every query parameter pyarrow takes is a connection's
setting, a region or an endpoint, never part of the object's name). So the CLI run from any directory, the library
and the Airflow operator on one host find one table's answers. A folder an earlier version kept (`TABLE.gatekeeper/`
beside a local table, `table-HASH.gatekeeper/` in the current directory for a URI or a table in memory, and the
folder keyed by a URI with its query) is used where it exists: users have answers there.

A URI may carry a secret (`s3://KEY:SECRET@bucket/...`, a signature in its query): `shown` is the only form of it
printed or kept (errors, `result ...`, `TableResult.out`); the identity is hashed, never written out.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode

from ..state._home import ensure_home, state_home
from ._names import SCHEMES

IN_MEMORY = "the table given"  # the name of a table given in memory (it has no identity)
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@]*)@")
_SECRET_PARAM = re.compile(r"key|secret|token|passw|credential|sig", re.I)
_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def is_uri(where: str) -> bool:
    return where.startswith(SCHEMES)


def _split(where: str) -> tuple[str, str, str, str]:
    """(scheme://, userinfo, the rest before the query, the query) of a URI."""
    m = _USERINFO.match(where)
    head, user = (m.group(1), m.group(2)) if m else (where[:where.index("://") + 3], "")
    rest = where[m.end():] if m else where[len(head):]
    path, _, query = rest.partition("?")
    return head, user, path, query


def has_secret(where: str) -> bool:
    """Whether a URI carries a credential: a password, or a secret query parameter with a value."""
    if not is_uri(where):
        return False
    _, user, _, query = _split(where)
    return ":" in user or any(_SECRET_PARAM.search(k) and v for k, v in parse_qsl(query))


def identity(where: str) -> str:
    """What names a table across callers: a local path made absolute; a URI's scheme, bucket and key, without its
    user, password or query (`?region=`, `?endpoint_override=`: how to reach the object, not which it is)."""
    if not is_uri(where):
        return os.path.abspath(where)
    head, _, path, _ = _split(where)
    return head + path


def label(where: str | None) -> str:
    """How other jobs on the ledger name a table job (`status`, `ahead`): its table's file name, from its identity
    (no user, password or query); "a table in memory" for a DataFrame or a stream."""
    return "a table in memory" if where is None else os.path.basename(identity(where).rstrip("/")) or identity(where)


def former_identity(where: str) -> str | None:
    """The identity an earlier version gave a URI with a query: its query's parameters kept but the secret ones,
    sorted (None: the same as `identity`). Its state is found under it still."""
    if not is_uri(where):
        return None
    head, _, path, query = _split(where)
    kept = sorted((k, v) for k, v in parse_qsl(query, keep_blank_values=True) if not _SECRET_PARAM.search(k))
    return head + path + f"?{urlencode(kept)}" if kept else None


def shown(where: str) -> str:
    """A path or URI as it may be printed or kept: a URI's credentials and secret query values as `***`."""
    if not is_uri(where):
        return where
    head, user, path, query = _split(where)
    query = "&".join(part.partition("=")[0] + "=***" if _SECRET_PARAM.search(part.partition("=")[0]) else part
                     for part in query.split("&")) if query else ""
    return head + ("***@" if user else "") + path + (f"?{query}" if query else "")


def scrub(text: str, where: str) -> str:
    """`text` (a library's error message, say) with every secret of `where` masked, wherever it is quoted."""
    if not is_uri(where):
        return text
    text = text.replace(where, shown(where))
    head, user, _, query = _split(where)
    secrets = [p for p in user.split(":") if p] + [v for k, v in parse_qsl(query) if _SECRET_PARAM.search(k) and v]
    secrets += [unquote(s) for s in secrets]  # (as a URI parser decodes them, in its messages)
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def folder_name(where: str | None) -> str:
    """A table job's folder in the state folder: its table's file name, for people, and its identity's digest."""
    if where is None:
        return "in-memory"
    return _folder(identity(where))


def _folder(ident: str) -> str:
    name = _LABEL.sub("_", ident.split("?", 1)[0].rstrip("/").rpartition("/")[2])[:48] or "table"
    return f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def legacy_dir(where: str | None) -> Path:
    """Where an earlier version kept this table job's state by default."""
    if where is not None and not is_uri(where):
        return Path(where + ".gatekeeper")
    digest = hashlib.sha256((where or IN_MEMORY).encode()).hexdigest()[:12]
    return Path.cwd() / f"table-{digest}.gatekeeper"


def default_state_dir(where: str | None, environ: Mapping[str, str], *, create: bool = True) -> Path:
    """A table job's state folder: the one an earlier version kept, where it exists, else the table's folder in the
    user's state folder (created, unless not `create`: a plan writes nothing). A URI with a query whose folder an
    earlier version keyed by it keeps using that folder, while the table has none of its own: its answers are there."""
    legacy = legacy_dir(where)
    if legacy.is_dir():
        return legacy
    former = None if where is None else former_identity(where)
    if former is not None:
        tables = state_home(environ) / "tables"
        if not (tables / folder_name(where)).is_dir() and (tables / _folder(former)).is_dir():
            return tables / _folder(former)
    if not create:
        return state_home(environ) / "tables" / folder_name(where)
    return ensure_home(environ, "tables", folder_name(where))
