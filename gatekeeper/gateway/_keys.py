"""The gateway's keys: one tenant each, issued by `gatekeeper serve keys add TENANT`, which prints the key once.

The file (`STATE/keys.json`, 0600) keeps only each key's sha256, as a password file keeps hashes: a key is 256
random bits, so a fast hash is as good as a slow one against guessing, and a stolen file grants nothing. A key
presented is hashed and compared against every stored hash in constant time (`hmac.compare_digest`, no early
exit), so the answer's timing says nothing of which key came close. The file is read again when it changes: a key
added or removed on one replica (or by the command) holds on every replica sharing the state folder.

A tenant carries its priority and share on a shared ledger (docs/shared.md): its jobs admit with them.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .._errors import UsageError, os_error
from ..state._output import replacing

FILE = "keys.json"
PREFIX = "sk-gk-"  # a gateway key, told apart at a glance from the API's own (sk-ant-)
_TENANT = re.compile(r"[A-Za-z0-9_.-]{1,64}")
PRIORITIES = ("high", "normal", "low")


@dataclass(frozen=True)
class Tenant:
    """Who a key speaks for, and how its jobs share the queue with the others'."""

    name: str
    priority: str = "normal"
    share: float = 1.0


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyFile:
    """The keys file of one state folder: adding, removing and listing keys, and telling whose a key is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) of the file as last read
        self._data: dict[str, Any] = {"tenants": {}, "keys": []}

    def _load(self) -> dict[str, Any]:
        """The file's content, read again only when it changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._data = None, {"tenants": {}, "keys": []}
            return self._data
        except OSError as exc:
            raise UsageError(os_error(exc, "cannot read the gateway's keys"), setting="state_dir") from exc
        if self._seen != (st.st_ino, st.st_mtime_ns, st.st_size):  # (each save is a new file: a new inode)
            try:
                data = orjson.loads(self.path.read_bytes())
            except (OSError, orjson.JSONDecodeError) as exc:
                raise UsageError(f"the gateway's keys file {self.path} cannot be read: {exc}", setting="state_dir") from exc
            self._data = {"tenants": dict(data.get("tenants") or {}), "keys": list(data.get("keys") or [])}
            self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        return self._data

    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """The file's content, read under an exclusive lock held until the change is saved: two `keys add` at once
        (two shells, two replicas' operators) both land, neither overwrites the other's key."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise UsageError(os_error(exc, "cannot change the gateway's keys"), setting="state_dir") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._seen = None  # (read afresh under the lock)
            yield self._load()
        finally:
            os.close(fd)  # (releases the lock)

    def _save(self, data: dict[str, Any]) -> None:
        with replacing(str(self.path), "the gateway's keys", UsageError) as f:
            f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        self._seen = None

    def add(self, tenant: str, *, priority: str | None = None, share: float | None = None) -> str:
        """A new key for `tenant` (created with `priority` and `share`, or changed to them); the key, to print once."""
        if not _TENANT.fullmatch(tenant):
            raise UsageError(f"tenant {tenant!r}: use 1-64 letters, digits, '_', '-' or '.'", setting="tenant")
        if priority is not None and priority not in PRIORITIES:
            raise UsageError(f"priority {priority!r}: use high, normal or low", setting="priority")
        with self._changing() as data:
            settings = dict(data["tenants"].get(tenant) or {"priority": "normal", "share": 1.0})
            settings.update({k: v for k, v in (("priority", priority), ("share", share)) if v is not None})
            key = PREFIX + secrets.token_urlsafe(32)
            entry = {"id": "key_" + secrets.token_hex(6), "tenant": tenant, "sha256": _digest(key), "hint":
                     key[:len(PREFIX) + 4] + "...", "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._save({"tenants": {**data["tenants"], tenant: settings}, "keys": [*data["keys"], entry]})
        return key

    def remove(self, ref: str) -> int:
        """Remove the keys a reference names (a key id, or a tenant: all its keys); how many."""
        with self._changing() as data:
            kept = [k for k in data["keys"] if ref not in (k.get("id"), k.get("tenant"))]
            removed = len(data["keys"]) - len(kept)
            if removed:
                self._save({"tenants": data["tenants"], "keys": kept})
        return removed

    def listing(self) -> list[dict[str, Any]]:
        """Each key's id, tenant, hint (its first characters) and creation time, with its tenant's settings; never
        a hash."""
        data = self._load()
        return [{"id": k.get("id"), "tenant": k.get("tenant"), "hint": k.get("hint"), "created_at": k.get("created_at"),
                 **(data["tenants"].get(k.get("tenant")) or {})} for k in data["keys"]]

    def tenant_of(self, presented: str | None) -> Tenant | None:
        """Whose key this is; None for no key or a wrong one. Every stored hash is compared, in constant time."""
        data = self._load()
        if not presented:
            return None
        digest = _digest(presented.strip())
        found = None
        for entry in data["keys"]:
            if hmac.compare_digest(digest, str(entry.get("sha256") or "")):
                found = entry
        return None if found is None else self.tenant_named(str(found.get("tenant")))

    def tenant_named(self, name: str) -> Tenant:
        """A tenant with its settings as the file has them now (the defaults for one it no longer lists)."""
        settings = self._load()["tenants"].get(name) or {}
        return Tenant(name, str(settings.get("priority") or "normal"), float(settings.get("share") or 1.0))

    def empty(self) -> bool:
        return not self._load()["keys"]
