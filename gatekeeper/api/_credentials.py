"""Which credential the environment gives, read in the order the SDK (`anthropic` 2.x, `lib/credentials/_chain.py`)
reads it, first match wins:

1. `ANTHROPIC_API_KEY`: a workspace key (with `ANTHROPIC_EXTRA_WORKSPACE_KEYS`, this tool's own, for the others);
2. `ANTHROPIC_AUTH_TOKEN`: a bearer token;
3. `ANTHROPIC_PROFILE`: the profile it names, under `ANTHROPIC_CONFIG_DIR` (default `~/.config/anthropic`);
4. workload identity federation: `ANTHROPIC_IDENTITY_TOKEN_FILE` (or `ANTHROPIC_IDENTITY_TOKEN`),
   `ANTHROPIC_FEDERATION_RULE_ID`, `ANTHROPIC_ORGANIZATION_ID` (optionally `ANTHROPIC_SERVICE_ACCOUNT_ID`,
   `ANTHROPIC_WORKSPACE_ID`);
5. the active profile on disk (`active_config`, else `default`), when its config file is there.

What this module returns says where a token comes from, never a token: access tokens are minted when a call needs
one (`_tokens`). Reading is pure but for the profile's config file; a broken profile the user chose is a one-line
`CredentialsError` naming the file and what to fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._errors import CredentialsError
from ._config import Secret

API_KEY = "ANTHROPIC_API_KEY"
AUTH_TOKEN = "ANTHROPIC_AUTH_TOKEN"  # noqa: S105 (names of variables, not secrets)
PROFILE = "ANTHROPIC_PROFILE"
CONFIG_DIR = "ANTHROPIC_CONFIG_DIR"
IDENTITY_TOKEN = "ANTHROPIC_IDENTITY_TOKEN"  # noqa: S105
IDENTITY_TOKEN_FILE = "ANTHROPIC_IDENTITY_TOKEN_FILE"  # noqa: S105
RULE = "ANTHROPIC_FEDERATION_RULE_ID"
ORGANIZATION = "ANTHROPIC_ORGANIZATION_ID"
SERVICE_ACCOUNT = "ANTHROPIC_SERVICE_ACCOUNT_ID"
WORKSPACE = "ANTHROPIC_WORKSPACE_ID"
EXTRA_WORKSPACES = "ANTHROPIC_EXTRA_WORKSPACE_IDS"  # this tool's own: the other workspaces a credential acts on


@dataclass(frozen=True)
class BearerToken:
    """A token sent as it is (`ANTHROPIC_AUTH_TOKEN`): no expiry known, nothing to exchange."""

    token: Secret
    source: str = AUTH_TOKEN

    def legacy_identity(self) -> str:
        return "bearer:" + self.token.fingerprint()


@dataclass(frozen=True)
class Federation:
    """Workload identity federation: an identity token (read again at every exchange: projected tokens rotate)
    exchanged at `/v1/oauth/token` for an access token of one workspace."""

    rule_id: str
    organization_id: str
    identity_file: Path | None = None  # read at every exchange
    identity_token: Secret | None = None  # ANTHROPIC_IDENTITY_TOKEN, when no file is named
    service_account_id: str | None = None
    workspace_id: str | None = None  # None: the one the server picks (the rule's only workspace, else the default)
    source: str = "the environment"

    def legacy_identity(self) -> str:
        return f"federation:{self.organization_id}:{self.rule_id}:{self.service_account_id or ''}"


@dataclass(frozen=True)
class ProfileLogin:
    """A profile written by the command-line login (`user_oauth`): the access token read from its credentials file
    at every use (a daemon may rotate it); with a `client_id`, refreshed by its refresh token when it has expired
    and written back, as the SDK does (the refresh token may rotate)."""

    profile: str
    credentials_file: Path
    client_id: str | None = None
    workspace_id: str | None = None  # sent as anthropic-workspace-id
    organization_id: str | None = None

    @property
    def source(self) -> str:
        return f"profile {self.profile!r}"

    def legacy_identity(self) -> str:
        return f"profile:{self.organization_id or ''}:{self.profile}"


Credential = BearerToken | Federation | ProfileLogin
"""`ApiConfig(credential=...)`: a workspace credential other than an API key, one of the SDK's chain."""


@dataclass(frozen=True)
class Found:
    """What the chain found: workspace keys, or one credential; and the base URL a profile names, if any."""

    keys: tuple[str, ...] = ()
    credential: Credential | None = None
    base_url: str | None = None


def find_credentials(environ: Mapping[str, str]) -> Found:
    """The first credential of the SDK's order the environment gives (keys are returned unparsed: `ApiConfig` splits
    them). Nothing found: an empty `Found`."""
    if (environ.get(API_KEY) or "").strip():
        return Found(keys=(environ[API_KEY],))
    token = (environ.get(AUTH_TOKEN) or "").strip()
    if token:
        return Found(credential=BearerToken(Secret(token)))
    if environ.get(PROFILE):
        return _profile(environ, environ[PROFILE], PROFILE)
    federation = _federation(environ)
    if federation is not None:
        return Found(credential=federation)
    return _active_profile(environ)


def extra_workspaces(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The other workspaces a credential acts on (ANTHROPIC_EXTRA_WORKSPACE_IDS, comma-separated), deduplicated."""
    out: list[str] = []
    for part in (environ.get(EXTRA_WORKSPACES) or "").split(","):
        if part.strip() and part.strip() not in out:
            out.append(part.strip())
    return tuple(out)


def legacy_fingerprint(credential: Credential, workspace: str | None) -> str:
    """What named a job's credential before names stopped following secrets (a bearer token's value, a rule, a
    workspace set or not): only to find jobs started under those names (`ApiConfig.legacy_fingerprint`)."""
    text = f"gatekeeper-credential:{credential.legacy_identity()}:{workspace or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _federation(environ: Mapping[str, str]) -> Federation | None:
    rule, org = (environ.get(RULE) or "").strip(), (environ.get(ORGANIZATION) or "").strip()
    path = (environ.get(IDENTITY_TOKEN_FILE) or "").strip()
    literal = (environ.get(IDENTITY_TOKEN) or "").strip()
    if not rule or not org or not (path or literal):
        return None
    return Federation(rule, org, identity_file=Path(path) if path else None,
                      identity_token=None if path else Secret(literal),
                      service_account_id=(environ.get(SERVICE_ACCOUNT) or "").strip() or None,
                      workspace_id=(environ.get(WORKSPACE) or "").strip() or None)


def config_dir(environ: Mapping[str, str]) -> Path:
    if environ.get(CONFIG_DIR):
        return Path(environ[CONFIG_DIR])
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".config" / "anthropic"


def _active_profile(environ: Mapping[str, str]) -> Found:
    """Step 5: the profile `active_config` names, else `default`, when its config file exists (or the user said
    where profiles are: then a missing one is an error, as in the SDK)."""
    base = config_dir(environ)
    try:
        pointer = (base / "active_config").read_text(encoding="utf-8").strip()
    except OSError:
        pointer = ""
    name = pointer or "default"
    chosen = bool(pointer) or bool(environ.get(CONFIG_DIR))
    if not chosen and not (base / "configs" / f"{name}.json").is_file():
        return Found()
    return _profile(environ, name, f"{base / 'active_config'}" if pointer else CONFIG_DIR if chosen else "default")


def _profile(environ: Mapping[str, str], name: str, named_by: str) -> Found:
    """A profile's config (`configs/NAME.json`) made a credential, empty fields filled from the environment."""
    import orjson

    if not name or name != name.strip() or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise CredentialsError(f"profile name {name!r} (from {named_by}) is not a file name under the config "
                               "directory", setting="profile")
    path = config_dir(environ) / "configs" / f"{name}.json"
    try:
        config = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise CredentialsError(f"profile {name!r} (from {named_by}): no config file at {path}; set {PROFILE} to "
                               f"another profile or {CONFIG_DIR} to where profiles are", setting="profile") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CredentialsError(f"profile {name!r}: {path} cannot be read as JSON ({exc})", setting="profile") from exc
    auth = config.get("authentication") if isinstance(config, dict) else None
    if not isinstance(auth, dict):
        raise CredentialsError(f"profile {name!r}: {path} has no 'authentication' object (type oidc_federation or "
                               "user_oauth)", setting="profile")

    def field(d: dict[str, object], key: str, variable: str) -> str | None:
        return str(d.get(key) or environ.get(variable) or "").strip() or None  # (the file first, as the SDK)

    base_url = field(config, "base_url", "ANTHROPIC_BASE_URL")
    workspace, org = field(config, "workspace_id", WORKSPACE), field(config, "organization_id", ORGANIZATION)
    kind = auth.get("type")
    if kind == "oidc_federation":
        rule = field(auth, "federation_rule_id", RULE)
        token = auth.get("identity_token")
        file = str(token.get("path") or "") if isinstance(token, dict) else environ.get(IDENTITY_TOKEN_FILE) or ""
        if not rule or not org or not file:
            raise CredentialsError(f"profile {name!r}: {path} needs authentication.federation_rule_id, "
                                   "organization_id and an identity_token file", setting="profile")
        return Found(credential=Federation(rule, org, identity_file=Path(file).expanduser(),
                                           service_account_id=field(auth, "service_account_id", SERVICE_ACCOUNT),
                                           workspace_id=workspace, source=f"profile {name!r}"), base_url=base_url)
    if kind == "user_oauth":
        creds = auth.get("credentials_path") or config_dir(environ) / "credentials" / f"{name}.json"
        return Found(credential=ProfileLogin(name, Path(str(creds)).expanduser(),
                                             client_id=str(auth.get("client_id") or "") or None,
                                             workspace_id=workspace, organization_id=org), base_url=base_url)
    raise CredentialsError(f"profile {name!r}: authentication.type {kind!r} in {path}: use oidc_federation or "
                           "user_oauth", setting="profile")


def describe(credential: Credential) -> str:
    """How messages name a credential (never its token): its kind and where it was read from."""
    if isinstance(credential, BearerToken):
        return f"the bearer token in {credential.source}"
    if isinstance(credential, Federation):
        where = str(credential.identity_file) if credential.identity_file else IDENTITY_TOKEN
        return f"workload identity federation (rule {credential.rule_id}, identity token {where}, {credential.source})"
    return f"the login of profile {credential.profile!r} ({credential.credentials_file})"


__all__ = ["BearerToken", "Credential", "Federation", "Found", "ProfileLogin", "config_dir", "describe",
           "extra_workspaces", "find_credentials", "legacy_fingerprint"]
