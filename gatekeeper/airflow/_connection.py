"""The Anthropic connection, read as the Anthropic provider reads it, made an `ApiConfig`. Pure.

password: the workspace key; host: an optional base URL (a gateway); extra: `admin_key` (to read the queue's ceiling)
and `extra_workspace_keys` (a list, or a comma-separated string: the other workspaces whose queued requests count).
Workload identity federation instead of a key: extra `identity_token_file`, `federation_rule_id`, `organization_id`
(optionally `service_account_id`, `workspace_id`, `extra_workspace_ids`). The keys become `Secret`s here and go
nowhere else: the trigger is handed the connection id, never a key or a token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._errors import UsageError
from ..api._config import DEFAULT_BASE_URL, ApiConfig, Secret, workspace_keys


def api_config(conn_id: str, password: str | None, host: str | None, extra: dict[str, Any], *, login: str | None = None,
               conn_type: str | None = None) -> ApiConfig:
    """The ApiConfig of connection `conn_id` (its fields as given); a usage error naming the connection when it has
    no key. Claude Platform on AWS: an `aws` connection (login the access key id, password the secret, extra
    `region_name` and `workspace_id`), or an `anthropic` one whose extra says `"platform": "aws"` (password an
    optional short-term key; else the AWS credential chain, extra `profile`). Claude on Google Cloud: extra
    `"platform": "google"` with `project`, `workspace_id`, optionally `location`, `key_path` (a service-account key
    file; else Application Default Credentials on the worker and the triggerer), `token_command` and `origin` (as
    GATEKEEPER_GOOGLE_CLOUD_ORIGIN); host, when set, is the URL of every route (as ANTHROPIC_GOOGLE_CLOUD_BASE_URL).
    `"platform": "foundry"` is refused (no batches). A connection is the whole configuration: no setting of the
    platform is read from the worker's environment."""
    if extra.get("platform") == "google":
        return _google_config(conn_id, host, extra)
    if extra.get("platform") == "foundry":
        from ..api._foundry import FoundryPlatform

        return ApiConfig(platform=FoundryPlatform())
    if conn_type == "aws" or extra.get("platform") == "aws":
        return _aws_config(conn_id, password, host, extra, login, conn_type == "aws")
    if not (password or "").strip() and extra.get("federation_rule_id"):
        return _federation_config(conn_id, host, extra)
    if not (password or "").strip():
        raise UsageError(f"Airflow connection {conn_id!r} has no API key (its password field) and no federation "
                         "(extra identity_token_file, federation_rule_id, organization_id)", setting="conn_id")
    others = extra.get("extra_workspace_keys") or ""
    if isinstance(others, (list, tuple)):
        others = ",".join(str(k) for k in others)
    admin = str(extra.get("admin_key") or "").strip()
    return ApiConfig(workspace_keys=workspace_keys(password, str(others)), admin_key=Secret(admin) if admin else None,
                     base_url=_base(host))


def _base(host: str | None) -> str:
    base = (host or "").strip() or DEFAULT_BASE_URL
    if "://" not in base:
        base = "https://" + base  # (the Anthropic provider's Base URL field may hold a bare host)
    return base.rstrip("/")


def _federation_config(conn_id: str, host: str | None, extra: dict[str, Any]) -> ApiConfig:
    """Workload identity federation named in the extra: the identity token's file (read by the worker and the
    triggerer at every exchange: it must be there on both), the rule, the organization; optionally the service
    account, the workspace and the other workspaces to read."""
    from ..api._credentials import Federation

    def text(key: str) -> str | None:
        return str(extra.get(key) or "").strip() or None

    path, rule, org = text("identity_token_file"), text("federation_rule_id"), text("organization_id")
    if not (path and rule and org):
        raise UsageError(f"Airflow connection {conn_id!r}: federation needs identity_token_file, federation_rule_id "
                         "and organization_id in its extra", setting="conn_id")
    others = extra.get("extra_workspace_ids") or ""
    ids = others if isinstance(others, (list, tuple)) else str(others).split(",")
    admin = text("admin_key")
    return ApiConfig(credential=Federation(rule, org, identity_file=Path(path), service_account_id=text(
                         "service_account_id"), workspace_id=text("workspace_id"), source=f"connection {conn_id!r}"),
                     workspace_ids=tuple(dict.fromkeys(str(w).strip() for w in ids if str(w).strip())),
                     admin_key=Secret(admin) if admin else None, base_url=_base(host))


def _google_config(conn_id: str, host: str | None, extra: dict[str, Any]) -> ApiConfig:
    """Claude on Google Cloud named in the extra (the SDK's settings, by the same names less their prefix)."""
    import shlex

    from ..api._google import DEFAULT_LOCATION, ORIGIN, GooglePlatform, checked_origin

    def text(key: str) -> str | None:
        return str(extra.get(key) or "").strip() or None

    base = (host or "").strip() or None
    command, key_path = text("token_command"), text("key_path")
    try:
        return ApiConfig(platform=GooglePlatform(
            text("project"), text("workspace_id"), location=text("location") or DEFAULT_LOCATION,
            base_url=_base(base) if base else None, token_command=tuple(shlex.split(command)) if command else None,
            credentials_file=Path(key_path) if key_path else None, origin=checked_origin(text("origin"), "origin") or ORIGIN))
    except UsageError as exc:
        raise UsageError(f"Airflow connection {conn_id!r} is for Claude on Google Cloud: {exc}", setting="conn_id") from None


def _aws_config(conn_id: str, password: str | None, host: str | None, extra: dict[str, Any], login: str | None,
                aws_type: bool) -> ApiConfig:
    from ..api._aws import URL_TEMPLATE, AwsPlatform

    region = str(extra.get("region_name") or extra.get("region") or "").strip()
    workspace = str(extra.get("workspace_id") or "").strip()
    for value, name in ((region, "region_name"), (workspace, "workspace_id")):
        if not value:
            raise UsageError(f"Airflow connection {conn_id!r} is for Claude Platform on AWS: its extra needs {name}",
                             setting="conn_id")
    base = ((host or "").strip() or str(extra.get("base_url") or "") or URL_TEMPLATE.format(region=region)).rstrip("/")
    secret = (password or "").strip()
    keys = {"access_key": Secret(login.strip()), "secret_key": Secret(secret)} if aws_type and login and secret else {}
    token = str(extra.get("aws_session_token") or "").strip()
    aws = AwsPlatform(region, workspace, base, api_key=Secret(secret) if secret and not aws_type else None,
                      profile=str(extra.get("profile") or extra.get("profile_name") or "") or None,
                      session_token=Secret(token) if token and keys else None, **keys)
    return ApiConfig(platform=aws)


def connection_url(conn: Any) -> str:
    """A database or ledger given as an Airflow connection (Postgres, Redis): its URL, password included (it goes
    to the driver only; gatekeeper masks it in every message)."""
    url = str(conn.get_uri())
    return "postgresql" + url[len("postgres"):] if url.startswith("postgres://") else url
