"""The Anthropic connection, read as the Anthropic provider reads it, made an `ApiConfig`. Pure.

password: the workspace key; host: an optional base URL (a gateway); extra: `admin_key` (to read the queue's ceiling)
and `extra_workspace_keys` (a list, or a comma-separated string: the other workspaces whose queued requests count).
The keys become `Secret`s here and go nowhere else: the trigger is handed the connection id, never a key.
"""

from __future__ import annotations

from typing import Any

from .._errors import UsageError
from ..api._config import DEFAULT_BASE_URL, ApiConfig, Secret, workspace_keys


def api_config(conn_id: str, password: str | None, host: str | None, extra: dict[str, Any]) -> ApiConfig:
    """The ApiConfig of connection `conn_id` (its fields as given); a usage error naming the connection when it has
    no key."""
    if not (password or "").strip():
        raise UsageError(f"Airflow connection {conn_id!r} has no API key (its password field)", setting="conn_id")
    others = extra.get("extra_workspace_keys") or ""
    if isinstance(others, (list, tuple)):
        others = ",".join(str(k) for k in others)
    admin = str(extra.get("admin_key") or "").strip()
    base = (host or "").strip() or DEFAULT_BASE_URL
    if "://" not in base:
        base = "https://" + base  # (the Anthropic provider's Base URL field may hold a bare host)
    return ApiConfig(workspace_keys=workspace_keys(password, str(others)), admin_key=Secret(admin) if admin else None,
                     base_url=base.rstrip("/"))


def connection_url(conn: Any) -> str:
    """A database or ledger given as an Airflow connection (Postgres, Redis): its URL, password included (it goes
    to the driver only; gatekeeper masks it in every message)."""
    url = str(conn.get_uri())
    return "postgresql" + url[len("postgres"):] if url.startswith("postgres://") else url
