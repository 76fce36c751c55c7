"""What varies between the places the Batches API runs: one `Platform` object, chosen by name, as anyio chooses a
backend (`PLATFORMS` and `import_module`: one module a platform, `_anthropic`, `_aws`, `_google`, `_foundry`).

A platform owns where its routes are (the workspace's base URL; the organization's routes, when it has them), how a
call authenticates (`auths`: one `Auth` per workspace read, from `_tokens`' interface), whose queue a ledger keys
(`scope`), the call rate it starts at (`default_rpm`), how its refusals read (`refusal`, `error_type`,
`permission`), what a verdict tells the user to do there (`repair`), and where a batch's results may be fetched
from (`results_location`). Nothing above `api/` asks which platform runs; it asks the platform.

This base class is what a platform without an opinion answers; each platform's module overrides what differs. Its
module gives `configure(environ, api_version) -> ApiConfig` (the settings as that platform's SDK client reads them).
Adding a platform: docs/architecture.md, "Adding a platform".
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from .._errors import AuthenticationError, UsageError

if TYPE_CHECKING:
    from typing import Any, ClassVar

    import httpx

    from .._clock import Clock
    from ._config import ApiConfig
    from ._tokens import Auth, Spawn

PLATFORMS = ("anthropic", "aws", "google", "foundry")  # as --platform and GATEKEEPER_PLATFORM name them
PLATFORM_VARIABLE = "GATEKEEPER_PLATFORM"
DEFAULT_RPM = 300.0  # calls a minute to the batch endpoints, all keys together (the first-party API)


class Platform:
    """Where a job's calls go and how they authenticate; the defaults are the first-party API's wire. Subclasses are
    frozen dataclasses (their fields: the platform's settings), or, for the first-party API, settings held by
    `ApiConfig` itself."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # how messages name it ("Claude Platform on AWS")
    default_rpm: ClassVar[float] = DEFAULT_RPM
    batches: ClassVar[str | None] = None  # None: it serves Message Batches; else why it does not (one line)
    # the settings that say where its routes are, as a message about a wrong address names them
    where: ClassVar[str] = "ANTHROPIC_BASE_URL"
    # how a reading names where the ceiling came from when its organization's routes (`admin`) gave it
    ceiling_source: ClassVar[str] = "admin-api"

    @property
    def url(self) -> str | None:
        """Where the workspace's routes are (`/v1/messages/batches` is appended); None: `ApiConfig.base_url`, as
        given (the first-party API's, or a gateway's)."""
        return None

    @property
    def scope(self) -> str:
        """Whose queue a shared ledger keeps, and part of a job's name: "" for the first-party organization's."""
        return ""

    def has_credentials(self, config: ApiConfig) -> bool:
        """Whether a call can be tried (a platform whose credentials are found at `connect` says yes here)."""
        return True

    def reads(self, config: ApiConfig) -> int:
        """How many workspaces the queue's depth is read over (each reading costs that many listings)."""
        return 1

    def auths(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              clock: Clock) -> list[tuple[Auth, str]]:
        """How each workspace read is authenticated, with how messages name it (never the secret). Raised here, before
        any call: credentials that cannot be found."""
        raise NotImplementedError

    def admin(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              auths: list[tuple[Auth, str]]) -> tuple[str, Auth, str] | None:
        """The organization's routes (the Admin API's rate limits, where the queue's ceiling is read): their base URL,
        auth and label; None where there are none to try. `auths`: the workspaces' (a platform whose workspace
        token also serves the organization's routes shares it)."""
        return None

    def legacy_identity(self, config: ApiConfig) -> str | None:
        """What named a job's credential before names stopped following secrets (`ApiConfig.legacy_fingerprint`);
        None: the first-party rule (a key's, a credential's)."""
        return f"{self.name}:{self.scope}"

    # -- how its answers read -------------------------------------------------

    def error_type(self, error: dict[str, Any]) -> str | None:
        """The kind an error object names, when it has this platform's envelope (None: not the platform's)."""
        kind = error.get("type")
        return str(kind) if kind else None

    def route_refused(self, error: dict[str, Any] | None) -> bool:
        """Whether an error object is the platform's own gateway refusing the route (a project, location or workspace
        it does not serve), which `refusal` names; False: the API's answer (a 404 on the listing then says the base
        URL points elsewhere)."""
        return False

    def refusal(self, status: int, message: str, error: dict[str, Any] | None, endpoint: str, label: str,
                fields: dict[str, Any]) -> AuthenticationError | None:
        """A refusal of the credentials (or of where they point), said in one line naming what to fix; None: not one
        (the status decides). `fields`: the `ApiError` keywords."""
        if status not in (401, 403):
            return None
        err = AuthenticationError(f"the {label} was refused ({message or 'no reason given'})", **fields)
        err.setting = "admin_key" if label == "admin key" else "api_key"
        return err

    def permission(self, endpoint: str) -> str:
        """What the credentials need for `endpoint` ("create", "messages", "cancel", ...), as a message names it."""
        return {"messages": "access to the Messages API", "cancel": "the right to cancel batches"}.get(
            endpoint, f"access to {endpoint}")

    def repair(self, state: str) -> list[str] | None:
        """What a queue verdict tells the user to do on this platform (None: the generic lines, `repair_lines`)."""
        return None

    def results_location(self, results_url: str, base_url: str, batch_id: str) -> str:
        """Where to fetch a batch's results (`results_location`). Pure."""
        return results_location(results_url, base_url, batch_id)


def results_location(results_url: str, base_url: str, batch_id: str) -> str:
    """Where to fetch a batch's results from the first-party API or a gateway. Pure.

    A `results_url` with the API's own results path is fetched from that path on the configured base URL, so a
    gateway or proxy set as the base URL serves it (the JSON names the API's own host, which the client may not
    reach, or reach without the gateway's key). Any other URL (a signed object-store link) is fetched as given;
    credentials are still sent only to the base URL's origin.
    """
    parts = urlsplit(urljoin(base_url + "/", results_url))
    if parts.path.rstrip("/") == f"/v1/messages/batches/{batch_id}/results":
        return base_url.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")
    return parts.geturl()


def configure(name: str | None, environ: Mapping[str, str], api_version: str | None) -> ApiConfig:
    """The configuration of platform `name` (None: GATEKEEPER_PLATFORM, else the first-party API), read from
    `environ` as that platform's SDK client reads it."""
    name = name or environ.get(PLATFORM_VARIABLE) or "anthropic"
    if name not in PLATFORMS:
        raise UsageError(f"platform {name!r}: use {', '.join(PLATFORMS[:-1])} or {PLATFORMS[-1]}", setting="platform")
    module = import_module(f"{__package__}._{name}")
    config: ApiConfig = module.configure(environ, api_version)
    return config
