"""API configuration: the platform, keys, base URL. Read from the environment only by the CLI (`from_env`).

Keys travel as `Secret`, whose repr and str hide the value, so a key cannot leak
through a log line, an exception message or a debugging print by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .._errors import UsageError
from .._wire import API_VERSION, API_VERSION_VARIABLE, API_VERSIONS

if TYPE_CHECKING:
    from ._credentials import Credential
    from ._platform import Platform

DEFAULT_BASE_URL = "https://api.anthropic.com"
MIN_REDACTED = 8  # characters a secret has before `Secret.redact` cuts it out of a text


class Secret:
    """An API key. `reveal()` is the one way to the value; it is called only where a header is built."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def fingerprint(self) -> str:
        """A short one-way digest: tells two keys apart (the same workspace) without keeping either."""
        import hashlib

        return hashlib.sha256(b"gatekeeper-key:" + self._value.encode()).hexdigest()[:16]

    def redact(self, text: str) -> str:
        """`text` with this secret cut out (an answer's body may echo what was sent). A value too short to be a
        secret (a test's "k") is left alone: replacing it would garble every message."""
        return text.replace(self._value, "***") if len(self._value) >= MIN_REDACTED else text

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret cannot be pickled")


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL, with the default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def workspace_keys(primary: str | None, extra: str | None) -> list[Secret]:
    """Workspace keys in order, deduplicated: the same key twice would double the measured depth."""
    out: list[Secret] = []
    seen: set[str] = set()
    for candidate in [primary or ""] + (extra or "").split(","):
        key = candidate.strip()
        if key and key not in seen:
            seen.add(key)
            out.append(Secret(key))
    return out


def _first_party() -> Platform:
    from ._anthropic import ANTHROPIC

    return ANTHROPIC


@dataclass(frozen=True)
class ApiConfig:
    """Where the API is and which credentials to use. Built explicitly, or by `from_env` in the CLI. `platform`
    says where the Batches API runs (the first-party API by default; `AwsPlatform`, `GooglePlatform`): its own
    settings are the platform object's, and the base URL is then the platform's."""

    workspace_keys: list[Secret] = field(default_factory=list)
    admin_key: Secret | None = None
    base_url: str = DEFAULT_BASE_URL
    platform: Platform = field(default_factory=_first_party)
    # the anthropic-version sent on every call; None: the one the job started with, else 2023-06-01 (`version`)
    api_version: str | None = None
    # without keys: a credential that mints access tokens (`_credentials`: a bearer token, a profile, federation),
    # for its own workspace and for each of `workspace_ids` (the others it acts on, read for the queue's depth)
    credential: Credential | None = None
    workspace_ids: tuple[str, ...] = ()

    @property
    def default_rpm(self) -> float:
        """Calls a minute to the batch endpoints when none is asked for (the platform's): 300 on the first-party API,
        the organization's limit being shared with its other pipelines; 50 where a workspace starts at Tier 1."""
        return self.platform.default_rpm

    @property
    def version(self) -> str:
        """The anthropic-version this configuration sends."""
        return self.api_version or API_VERSION

    @property
    def scope(self) -> str:
        """Whose queue a shared ledger keeps: the first-party organization's (""), or the platform's workspace
        (never the same ceiling by mistake)."""
        return self.platform.scope

    def __post_init__(self) -> None:
        own = self.platform.url
        if own is not None:
            if self.base_url not in (DEFAULT_BASE_URL, own):
                raise UsageError(f"the base URL is the platform's ({own}): give it to the {self.platform.title} "
                                 "settings, not to ApiConfig", setting="base_url")
            object.__setattr__(self, "base_url", own)
        scheme, host, _ = origin(self.base_url)
        if scheme not in ("http", "https") or not host:
            raise UsageError(f"the base URL must be an http(s) URL, got {self.base_url!r}", setting="base_url")
        if self.api_version is not None and self.api_version not in API_VERSIONS:
            raise UsageError(f"API version {self.api_version!r}: use {' or '.join(API_VERSIONS)}",
                             setting="api_version")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], platform: str | None = None,
                 api_version: str | None = None) -> ApiConfig:
        """The configuration of `platform` (else GATEKEEPER_PLATFORM, else the first-party API), read from `environ`
        as that platform's SDK client reads it: "anthropic" (keys, a bearer token, a profile, federation), "aws"
        (as `AnthropicAWS`), "google" (as `AnthropicGoogleCloud`) or "foundry" (which serves no batches); the API
        version `api_version`, else GATEKEEPER_API_VERSION, else none asked (a job's own, or 2023-06-01)."""
        from ._platform import configure

        version = api_version or (environ.get(API_VERSION_VARIABLE) or "").strip() or None
        return configure(platform, environ, version)

    @property
    def has_credentials(self) -> bool:
        return self.platform.has_credentials(self)

    def require_workspace_key(self) -> None:
        """Before anything is opened or sent: a platform that serves no batches is refused (one line, why), then
        a configuration without credentials."""
        if self.platform.batches is not None:
            raise UsageError(self.platform.batches, setting="platform")
        if not self.has_credentials:
            raise UsageError("no workspace key: ApiConfig.workspace_keys is empty and no credential is given")

    def workspaces(self) -> list[tuple[str | None, str]]:
        """(workspace id, how messages name it) of each workspace a credential is read for; its own first (None:
        the one the server picks for it)."""
        if self.credential is None:
            return []
        from ._credentials import describe

        own = getattr(self.credential, "workspace_id", None)
        ids = [own] + [w for w in self.workspace_ids if w != own]
        return [(w, f"{describe(self.credential)} for {'workspace ' + w if w else 'its workspace'}") for w in ids]

    def account(self) -> str:
        """Whose queue and batches a job's requests go to, named without any secret: the platform and its scope (an
        AWS workspace in its region), the base URL, and the organization when the credential names one. Keys, bearer
        tokens and federation rules rotate; none of these does. A workspace a credential leaves implicit (a key's, a
        rule's only one) is not named either, so naming it later changes nothing."""
        scheme, host, port = origin(self.base_url)
        path = urlsplit(self.base_url).path.rstrip("/")
        org = getattr(self.credential, "organization_id", None) or ""
        return f"{self.platform.name}|{self.scope}|{scheme}://{host}:{port}{path}|{org}"

    def fingerprint(self) -> str:
        """A short digest of `account()`: a job's default name and its duplicate-job guard carry it, so rotating a
        key, a token or a rule resumes the same job."""
        import hashlib

        return hashlib.sha256(b"gatekeeper-account:" + self.account().encode()).hexdigest()[:16]

    def workspace_print(self) -> str | None:
        """A short digest naming the workspace whose batches this configuration's listing shows (its first key's,
        or the one its platform or credential names), so that two submitters on one ledger can tell they list the
        same batches (`decide._orphans`); None where the workspace is left to the server (a bearer token's, a
        federation rule's): nothing is then judged by it. Keeps no secret: a key enters only as its own digest."""
        import hashlib

        named = getattr(self.credential, "workspace_id", None)
        if self.workspace_keys:
            which = "key:" + self.workspace_keys[0].fingerprint()
        elif self.scope or named:
            which = f"named:{named or ''}"
        else:
            return None
        return hashlib.sha256(f"gatekeeper-workspace:{self.account()}|{which}".encode()).hexdigest()[:16]

    def legacy_fingerprint(self) -> str:
        """What named a job before names stopped following secrets: the first key's digest, or the credential's
        (with a bearer token's own). Kept only to find the jobs started under those names (`job_name_of`)."""
        legacy = self.platform.legacy_identity(self)
        if legacy is not None:
            return Secret(legacy).fingerprint()
        if self.workspace_keys:
            return self.workspace_keys[0].fingerprint()
        from ._credentials import legacy_fingerprint

        assert self.credential is not None, "no credential"
        return legacy_fingerprint(self.credential, getattr(self.credential, "workspace_id", None))

    @property
    def reads(self) -> int:
        """How many workspaces the queue's depth is read over."""
        return self.platform.reads(self)
