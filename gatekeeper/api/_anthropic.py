"""Anthropic's own API (the first-party platform, and any gateway that speaks it): workspace keys sent as `x-api-key`,
or a credential of the SDK's chain (a bearer token, a profile, federation: `_credentials`, `_tokens`); the queue's
ceiling read with an Admin key from the Admin API. Its settings are `ApiConfig`'s own fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .._clock import WALL, Clock
from .._wire import EXTRA_KEYS_VARIABLE
from ._config import DEFAULT_BASE_URL, ApiConfig, Secret, workspace_keys
from ._platform import Platform

if TYPE_CHECKING:
    import httpx

    from ._tokens import Auth, Spawn


class Anthropic(Platform):
    """The first-party API: what `ApiConfig` holds (keys, a credential, an Admin key, the base URL) is its setting."""

    name: ClassVar[str] = "anthropic"
    title: ClassVar[str] = "Anthropic's API"

    def has_credentials(self, config: ApiConfig) -> bool:
        return bool(config.workspace_keys) or config.credential is not None

    def reads(self, config: ApiConfig) -> int:
        return len(config.workspace_keys) + len(config.workspaces())

    def auths(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              clock: Clock = WALL) -> list[tuple[Auth, str]]:
        """Each workspace key (labelled by position), then a credential's tokens for each workspace it is read for
        (a federation token is one workspace's: one exchange each)."""
        from ._tokens import KeyAuth, TokenAuth

        keys: list[tuple[Auth, str]] = [(KeyAuth(k), f"workspace key {i + 1}") for i, k in enumerate(config.workspace_keys)]
        cred = config.credential
        if cred is None:
            return keys
        return keys + [(TokenAuth(cred, ws, http=http, base_url=config.base_url, spawn=spawn,
                                          clock=clock.monotonic, wall=clock.now), label)
                       for ws, label in config.workspaces()]

    def admin(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              auths: list[tuple[Auth, str]]) -> tuple[str, Auth, str] | None:
        from ._tokens import KeyAuth

        return None if config.admin_key is None else (config.base_url, KeyAuth(config.admin_key), "admin key")

    def legacy_identity(self, config: ApiConfig) -> str | None:
        return None

    def repair(self, state: str) -> list[str] | None:
        if state != "queue-limit-unknown":
            return None
        return [
            "read the ceiling with an Admin key: set ANTHROPIC_ADMIN_KEY (GET /v1/organizations/rate_limits?group_type=batch "
            "returns enqueued_batch_requests), or pass --ceiling N from your organization's limits page.",
            "without the ceiling this is a raw count: it cannot say whether the next submission will be accepted.",
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Anthropic)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return "Anthropic()"


ANTHROPIC = Anthropic()


def configure(environ: Mapping[str, str], api_version: str | None) -> ApiConfig:
    """The first-party API's keys and URL, read in the SDK's order (a key, a bearer token, a profile, federation)."""
    from ._credentials import extra_workspaces, find_credentials

    admin = (environ.get("ANTHROPIC_ADMIN_KEY") or "").strip()
    found = find_credentials(environ)
    keys = workspace_keys(found.keys[0] if found.keys else None, environ.get(EXTRA_KEYS_VARIABLE))
    options: dict[str, Any] = {"api_version": api_version, "credential": found.credential}
    return ApiConfig(
        workspace_keys=keys if found.credential is None else [],
        admin_key=Secret(admin) if admin else None,
        base_url=(environ.get("ANTHROPIC_BASE_URL") or found.base_url or DEFAULT_BASE_URL).rstrip("/"),
        workspace_ids=extra_workspaces(environ) if found.credential is not None else (), **options,
    )
