"""Claude Models on Google Cloud (Anthropic managed): the Batches API run by Anthropic behind Google's gateway, read
from the environment as the SDK's `AnthropicGoogleCloud` reads it (`anthropic.lib.google_cloud`, SDK 2.17).

Routes are path-style: a workspace's at `https://claude.googleapis.com/v1/projects/{project}/locations/{location}/
workspaces/{workspace_id}/invoke` followed by the usual `/v1/...` (the workspace is in the path, not a header), and
the organization's (`/v1/organizations/*`) at `.../locations/{location}/claudeOrganization/invoke/v1/...`.
`ANTHROPIC_GOOGLE_CLOUD_BASE_URL`, when set, is the URL of every route, the organization's included, as in the SDK;
`GATEKEEPER_GOOGLE_CLOUD_ORIGIN` (this tool's own) moves both derived routes, their paths kept, to another origin.
Settings: `ANTHROPIC_GOOGLE_CLOUD_PROJECT` (else `GOOGLE_CLOUD_PROJECT`, else the project Application Default
Credentials name), `ANTHROPIC_GOOGLE_CLOUD_LOCATION` (default `global`), `ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID`; never
`ANTHROPIC_API_KEY`, `ANTHROPIC_AUTH_TOKEN` or `ANTHROPIC_BASE_URL`.

Every call carries `Authorization: Bearer` and a Google access token: from `GATEKEEPER_GOOGLE_TOKEN_COMMAND` (this
tool's own: a command that prints a token, or `{"access_token", "expires_in"}`; as the SDK's `token_provider`), else
from Application Default Credentials through google-auth (a service-account file in `GOOGLE_APPLICATION_CREDENTIALS`,
gcloud's login, workload identity on GKE or Cloud Run, the metadata server; the `google` extra). Tokens are kept by
`TokenCache`'s rules (refreshed ahead of expiry, dropped once on a 401). Every route needs one IAM permission of the
`claude.googleapis.com` service (`resource.verb`): a refusal is one line naming it. Whether the organization route
answers the queue's ceiling with Google credentials is not documented: it is tried, and when it does not answer the
ceiling is given (`--ceiling`) or learned from queue-full answers.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from .._clock import WALL, Clock
from .._errors import AuthenticationError, CredentialsError, Interrupted, TransportError, UsageError
from ._config import ApiConfig, Secret, origin
from ._platform import Platform
from ._tokens import MAX_SHOWN, Minted, Outgoing, TokenCache, redacted

if TYPE_CHECKING:
    import httpx

    from ._tokens import Auth, Spawn

ORIGIN = "https://claude.googleapis.com"
LOCATION_PATH = "/v1/projects/{project}/locations/{location}"
WORKSPACE_PATH = LOCATION_PATH + "/workspaces/{workspace_id}/invoke"
ORGANIZATION_PATH = LOCATION_PATH + "/claudeOrganization/invoke"
DEFAULT_LOCATION = "global"
SERVICE = "claude.googleapis.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"  # the scope ADC is asked for, as the SDK asks
TIER1_RPM = 50.0  # a new organization, made by the marketplace subscription, starts at Tier 1
BARE_TOKEN_LIFE = 300.0  # seconds a token given without its expiry is kept before it is asked for again
COMMAND_TIMEOUT = 60.0
TOKEN_COMMAND = "GATEKEEPER_GOOGLE_TOKEN_COMMAND"  # noqa: S105 (a variable's name)
# Where the derived routes point, both shapes kept (this tool's own; the SDK has no such setting): a Private Service
# Connect endpoint, or the fake, whose organization route can then be rehearsed. ANTHROPIC_GOOGLE_CLOUD_BASE_URL, the
# URL of every route, wins over it.
ORIGIN_VARIABLE = "GATEKEEPER_GOOGLE_CLOUD_ORIGIN"
_PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a project, location or workspace: one segment of a path
SETTINGS = ("ANTHROPIC_GOOGLE_CLOUD_PROJECT, ANTHROPIC_GOOGLE_CLOUD_LOCATION and ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID "
            "(or ANTHROPIC_GOOGLE_CLOUD_BASE_URL)")
# The permission each call needs (`resource.verb` of claude.googleapis.com). Only `messages.create` is named in
# Google's pages; the others follow its pattern. A refusal names the permission its answer names, when it names one.
PERMISSIONS = {"create": "batches.create", "retrieve": "batches.get", "results": "batches.get", "list": "batches.list",
               "cancel": "batches.cancel", "delete": "batches.delete", "models": "models.get",
               "count_tokens": "messages.countTokens", "messages": "messages.create", "rate_limits": "rateLimits.list"}
_NAMED = re.compile(r"[Pp]ermission '?([A-Za-z0-9_./-]+?)'? (?:is )?denied")
T = TypeVar("T")
TokenProvider = Callable[[], "str | Awaitable[str]"]
"""`GooglePlatform(token_provider=...)`: called (in a worker thread, or awaited when async) for each new Google
access token; returns the token alone, kept five minutes before it is asked for again, as the SDK's
`token_provider`."""


@dataclass(frozen=True)
class GooglePlatform(Platform):
    """Where a job goes on Claude Models on Google Cloud and how its tokens are had (none is held here). `base_url`,
    as the SDK's argument: the URL of every route (then `project` and `workspace_id` may be left out); `origin`: where
    the derived URLs point (a Private Service Connect endpoint, a test's fake). Tokens: `token_provider` (called for
    each token; may be async), else `token_command`, else the service-account key file `credentials_file`, else
    Application Default Credentials."""

    name: ClassVar[str] = "google"
    title: ClassVar[str] = "Claude on Google Cloud"
    where: ClassVar[str] = ("ANTHROPIC_GOOGLE_CLOUD_PROJECT, ANTHROPIC_GOOGLE_CLOUD_LOCATION and "
                            "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID (or ANTHROPIC_GOOGLE_CLOUD_BASE_URL)")
    default_rpm: ClassVar[float] = TIER1_RPM
    ceiling_source: ClassVar[str] = "google-organization-route"  # (the Rate Limits API, on the claudeOrganization route)

    project: str | None = None
    workspace_id: str | None = None
    location: str = DEFAULT_LOCATION
    base_url: str | None = None
    origin: str = ORIGIN
    token_command: tuple[str, ...] | None = None
    credentials_file: Path | None = None
    token_provider: TokenProvider | None = None

    def __post_init__(self) -> None:
        if self.base_url is not None:
            object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
            return
        if not self.project:
            raise UsageError("Claude on Google Cloud needs the project: set ANTHROPIC_GOOGLE_CLOUD_PROJECT (or "
                             "GOOGLE_CLOUD_PROJECT, or Application Default Credentials that name one), or "
                             "ANTHROPIC_GOOGLE_CLOUD_BASE_URL", setting="google_project")
        if not self.workspace_id:
            raise UsageError("Claude on Google Cloud needs the workspace: set ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID (the "
                             "workspace is in every route's path)", setting="google_workspace")
        if not self.location:
            raise UsageError("Claude on Google Cloud: ANTHROPIC_GOOGLE_CLOUD_LOCATION is empty (default global)",
                             setting="google_location")
        for value, name in ((self.project, "project"), (self.location, "location"), (self.workspace_id, "workspace")):
            if not _PATH_NAME.fullmatch(str(value)):  # (each is one segment of every route's path, sent as given)
                variable = f"ANTHROPIC_GOOGLE_CLOUD_{'WORKSPACE_ID' if name == 'workspace' else name.upper()}"
                raise UsageError(f"Claude on Google Cloud: {variable}={value!r} is not a name (letters, digits, '.', "
                                 "'_' and '-' only: it is a segment of every route's path)", setting=f"google_{name}")

    @property
    def url(self) -> str:
        """The workspace's routes (`base_url` when given)."""
        if self.base_url is not None:
            return self.base_url
        return self.origin.rstrip("/") + WORKSPACE_PATH.format(project=self.project, location=self.location,
                                                               workspace_id=self.workspace_id)

    @property
    def organization_url(self) -> str:
        """The organization's routes (`/v1/organizations/*`): `base_url` when given, as the SDK sends them."""
        if self.base_url is not None:
            return self.base_url
        return self.origin.rstrip("/") + ORGANIZATION_PATH.format(project=self.project, location=self.location)

    def route_names(self) -> tuple[str | None, str, str | None]:
        """The project, location and workspace the routes name (read from `base_url`'s path when it has them)."""
        m = re.search(r"/projects/([^/]+)/locations/([^/]+)/workspaces/([^/]+)/", (self.base_url or "") + "/")
        if self.base_url is not None and m:
            project, location, workspace = m.groups()
            return project, location, workspace
        return self.project, self.location, self.workspace_id

    @property
    def scope(self) -> str:
        """The project, location and workspace (read from `base_url`'s path when it has them)."""
        project, location, workspace = self.route_names()
        if not (project and workspace):
            _, host, port = origin(self.url)
            return "google_" + re.sub(r"[^a-z0-9]+", "_", f"{host}_{port}_{self.url.split('//', 1)[-1]}".lower())
        return "google_" + re.sub(r"[^a-z0-9]+", "_", f"{project}_{location}_{workspace}".lower())

    @property
    def resource(self) -> str:
        """The workspace as IAM names it."""
        return f"projects/{self.project}/locations/{self.location}/workspaces/{self.workspace_id}"

    def auths(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              clock: Clock = WALL) -> list[tuple[Auth, str]]:
        auth = GoogleAuth(self, spawn=spawn, clock=clock)
        return [(auth, auth.label)]

    def admin(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              auths: list[tuple[Auth, str]]) -> tuple[str, Auth, str] | None:
        """The organization route, with the workspace's tokens (one token serves both); only tried for the ceiling."""
        return self.organization_url, auths[0][0], f"{self.source()} on the organization route"

    def source(self) -> str:
        """How messages name the credentials (never a token)."""
        if self.token_provider is not None:
            return "Google Cloud credentials (the token provider)"
        if self.token_command is not None:
            return f"Google Cloud credentials ({TOKEN_COMMAND})"
        if self.credentials_file is not None:
            return f"Google Cloud credentials (the service-account key {self.credentials_file})"
        return "Google Cloud credentials (Application Default Credentials)"

    # -- how its answers read -------------------------------------------------

    def error_type(self, error: dict[str, Any]) -> str | None:
        """Anthropic's envelope (`type`), or Google's (`status`, such as PERMISSION_DENIED: the gateway's own)."""
        kind = error.get("type") or error.get("status")
        return str(kind) if kind else None

    def route_refused(self, error: dict[str, Any] | None) -> bool:
        """Google's envelope (`status`, no `type`): its gateway's own answer, not Anthropic's behind it."""
        return error is not None and not error.get("type") and bool(error.get("status"))

    def refusal(self, status: int, message: str, error: dict[str, Any] | None, endpoint: str, label: str,
                fields: dict[str, Any]) -> AuthenticationError | None:
        """Google's refusals, one line each: a project it does not know or that has not enabled the service (the
        project named), a permission missing (named, with the resource), a token refused, a location or workspace
        that is not there."""
        gateway = self.route_refused(error)
        project = self._project_refusal(error, message, label, fields) if gateway else None
        if project is not None:
            return project
        if status == 404 and gateway:
            names = "project {!r}, location {!r}, workspace {!r}".format(*self.route_names())
            err = AuthenticationError(f"{self.title} has no route for {names} (Google said: {message or 'not found'}): "
                                      f"check {SETTINGS}", **fields)
            err.setting = "google_workspace"
            return err
        if status == 401:
            err = AuthenticationError(f"the {label} were refused ({message or 'no reason given'}): check "
                                      f"{TOKEN_COMMAND} or Application Default Credentials", **fields)
            err.setting = "google_credentials"
            return err
        if status != 403:
            return None
        named = named_permission(error, message) or self.permission(endpoint)
        grant = ("grant it on the project (the organization's route, where the queue's ceiling is read), or give the "
                 "ceiling with --ceiling" if endpoint == "rate_limits" else
                 "grant it on the workspace, a role such as roles/claude.user has the batch job's")
        err = AuthenticationError(f"the {label} lack the IAM permission {named} of {SERVICE} (for {endpoint}; "
                                  f"{message or 'no reason given'}): {grant}, or check {SETTINGS}", **fields)
        err.setting = "google_permission"
        return err

    def permission(self, endpoint: str) -> str:
        return f"{PERMISSIONS.get(endpoint, endpoint)} ({SERVICE})"

    def _project_refusal(self, error: dict[str, Any] | None, message: str, label: str,
                         fields: dict[str, Any]) -> AuthenticationError | None:
        """Google's refusal of the project itself (its ErrorInfo's reason): one it does not know, or one that has not
        enabled the service; None: another refusal."""
        reason, meta = error_info(error)
        project = self.route_names()[0] or str(meta.get("consumer", "")).removeprefix("projects/") or "?"
        said = message or reason
        if reason == "CONSUMER_INVALID":
            text = (f"Google Cloud refused project {project!r} (Google said: {said}): check ANTHROPIC_GOOGLE_CLOUD_PROJECT "
                    f"(the project must exist, be one the {label} may use, and be subscribed to Claude)")
        elif reason == "SERVICE_DISABLED":
            service = meta.get("service") or SERVICE
            text = (f"project {project!r} has not enabled {service} (Google said: {said}): enable it there (gcloud "
                    f"services enable {service} --project {project}), or check ANTHROPIC_GOOGLE_CLOUD_PROJECT")
        else:
            return None
        err = AuthenticationError(text, **fields)
        err.setting = "google_project"
        return err

    def repair(self, state: str) -> list[str] | None:
        if state != "queue-limit-unknown":
            return None
        return [
            "the organization route (GET .../locations/LOCATION/claudeOrganization/invoke/v1/organizations/rate_limits) "
            "did not answer the ceiling (the reason is above): pass --ceiling N from the organization's limits page; "
            "gatekeeper submit also learns a bound from queue-full answers.",
            "without the ceiling this is a raw count: it cannot say whether the next submission will be accepted.",
        ]

    def results_location(self, results_url: str, base_url: str, batch_id: str) -> str:
        """Always the workspace's own results route, on the platform's origin: the body the gateway passes on names
        Anthropic's host, and a Google token goes nowhere but Google's gateway."""
        from urllib.parse import urljoin

        own = f"{base_url.rstrip('/')}/v1/messages/batches/{batch_id}/results"
        given = urlsplit(urljoin(base_url + "/", results_url))
        same = origin(given.geturl()) == origin(base_url) and given.path == urlsplit(own).path
        return own + (f"?{given.query}" if same and given.query else "")

    def legacy_identity(self, config: ApiConfig) -> str:
        return f"google:{self.scope}"


def error_info(error: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """The reason and metadata of a Google refusal's ErrorInfo (None, {}: it has none). Pure."""
    for detail in (error or {}).get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            meta = detail.get("metadata")
            return (str(detail["reason"]) if detail.get("reason") else None), (meta if isinstance(meta, dict) else {})
    return None, {}


def named_permission(error: dict[str, Any] | None, message: str) -> str | None:
    """The permission a Google refusal names: its ErrorInfo's `metadata.permission`, else "Permission 'x' denied" in
    its message. Pure."""
    for detail in (error or {}).get("details") or []:
        meta = detail.get("metadata") if isinstance(detail, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("permission"), str) and meta["permission"]:
            return str(meta["permission"])
    m = _NAMED.search(message)
    return m.group(1) if m else None


class GoogleAuth(TokenCache):
    """A Google access token, sent as `Authorization: Bearer` (nothing else: no beta flag, no workspace header), had
    from the platform's source and kept by `TokenCache`'s rules."""

    def __init__(self, platform: GooglePlatform, *, spawn: Spawn | None = None, clock: Clock = WALL) -> None:
        super().__init__(spawn=spawn, clock=clock.monotonic, wall=clock.now)
        self.platform = platform
        self.label = platform.source()
        self._credentials: Any = None  # google-auth's, loaded at the first token (blocking: in a worker thread)

    def sign(self, request: Outgoing) -> dict[str, str]:
        return {**request.headers, "authorization": f"Bearer {self.token.reveal()}"}

    async def _mint(self) -> Minted:
        p = self.platform
        if p.token_provider is not None:
            return await self._provided(p.token_provider)
        if p.token_command is not None:
            return await self._command(p.token_command)
        return await _left_on_stop(self._refresh_google)

    async def _provided(self, provider: TokenProvider) -> Minted:
        import inspect

        token = await provider() if inspect.iscoroutinefunction(provider) else await _left_on_stop(provider)
        if inspect.isawaitable(token):
            token = await token
        if not isinstance(token, str) or not token.strip():
            raise CredentialsError("the Google token provider gave no token", setting="google_credentials")
        return Minted(Secret(token.strip()), BARE_TOKEN_LIFE)

    async def _command(self, argv: tuple[str, ...]) -> Minted:
        """The command's token (its output: a token, or a JSON object with `access_token` and `expires_in`)."""
        import subprocess

        import anyio

        try:
            with anyio.fail_after(COMMAND_TIMEOUT):
                returncode, stdout, stderr = await _run(argv)
        except (OSError, TimeoutError) as exc:
            raise CredentialsError(f"{TOKEN_COMMAND} ({argv[0]}) could not run: {getattr(exc, 'strerror', None) or exc}",
                                   setting="google_credentials") from None
        except subprocess.SubprocessError as exc:
            raise CredentialsError(f"{TOKEN_COMMAND} ({argv[0]}) failed: {type(exc).__name__}",
                                   setting="google_credentials") from None
        if interrupted(returncode):  # (Ctrl-C reaches the whole process group: we are being stopped too)
            raise Interrupted(f"interrupted ({TOKEN_COMMAND} ({argv[0]}) was stopped, exit {returncode})")
        if returncode != 0:
            said = redacted(stderr.decode(errors="replace").strip().replace("\n", " "), {})[:MAX_SHOWN]
            raise CredentialsError(f"{TOKEN_COMMAND} ({argv[0]}) failed with exit {returncode}: {said or 'no output'}",
                                   setting="google_credentials")
        return _printed(stdout.decode(errors="replace"), argv[0])

    def _refresh_google(self) -> Minted:
        """A new token from google-auth (blocking): the credentials loaded once (ADC, or the key file), refreshed."""
        try:
            import google.auth
            import google.auth.exceptions
            from google.auth.transport.requests import Request
        except ImportError:
            raise UsageError("Claude on Google Cloud takes its tokens from google-auth: pip install "
                             "'gatekeeper-batches[google]' (or set GATEKEEPER_GOOGLE_TOKEN_COMMAND)",
                             setting="platform") from None
        request = _Recorded(Request())
        try:
            if self._credentials is None:
                self._credentials = self._load()
            self._credentials.refresh(request)
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise CredentialsError(f"no Google Cloud credentials found ({_cut(exc)}): set GOOGLE_APPLICATION_CREDENTIALS "
                                   "to a service-account key file, run gcloud auth application-default login, run where "
                                   f"workload identity provides them, or set {TOKEN_COMMAND}",
                                   setting="google_credentials") from None
        except google.auth.exceptions.TransportError as exc:
            if not self.reached:
                raise CredentialsError(f"the {self.label} cannot reach their token endpoint ({_said(exc)})",
                                       setting="google_credentials") from None
            raise TransportError(f"Google token refresh: {_said(exc)}", endpoint="token") from None
        except google.auth.exceptions.GoogleAuthError as exc:
            if token_outage(request.status, bool(getattr(exc, "retryable", False))):
                raise TransportError(f"Google token refresh: HTTP {request.status or '?'} ({_said(exc)})",
                                     endpoint="token") from None
            raise CredentialsError(f"the {self.label} were refused a token ({_said(exc)})",
                                   setting="google_credentials") from None
        return _from_google(self._credentials, self._wall())

    def _load(self) -> Any:
        import google.auth

        path = self.platform.credentials_file
        if path is None:
            credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
            return credentials
        from google.oauth2 import service_account

        try:
            return service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(path), scopes=[CLOUD_PLATFORM])
        except (OSError, ValueError) as exc:
            raise CredentialsError(f"the service-account key {path} cannot be read: {type(exc).__name__}",
                                   setting="google_credentials") from None


async def _left_on_stop(fn: Callable[[], T]) -> T:
    """`fn()` (blocking: google-auth's refresh, a provider) in a daemon thread, watched until it ends; a stop leaves it
    behind. (An anyio worker thread is joined as the process exits: a Ctrl-C waited out google-auth's retries and its
    120 s timeout. The thread only fills a credentials object nobody reads any more.)"""
    import threading

    import anyio

    out: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # (handed to the waiting task as it is)
            out.append((False, exc))

    thread = threading.Thread(target=work, name="gatekeeper-google-token", daemon=True)
    thread.start()
    wait = 0.002
    while thread.is_alive():
        await anyio.sleep(wait)
        wait = min(wait * 2, 0.05)
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


async def _run(argv: tuple[str, ...]) -> tuple[int, bytes, bytes]:
    """A command's exit and output; the command killed the moment the wait for it is cancelled (a Ctrl-C, SIGTERM,
    the timeout). (anyio's `run_process` let a Ctrl-C's one cancellation pass and waited the command out.)"""
    import anyio

    process = await anyio.open_process(list(argv))
    out, err = bytearray(), bytearray()

    async def drain(stream: Any, into: bytearray) -> None:
        async for chunk in stream:
            into.extend(chunk)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, process.stdout, out)
            tg.start_soon(drain, process.stderr, err)
            await process.wait()
    except BaseException:
        process.kill()
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()
    return process.returncode or 0, bytes(out), bytes(err)


def interrupted(returncode: int) -> bool:
    """Whether a token command's exit is a stop (killed by SIGINT, SIGTERM or SIGHUP, as a terminal's Ctrl-C or a
    supervisor's stop reaches it with us), not a credential's failure. Pure."""
    import signal

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    return returncode in (*(-s for s in stops), *(128 + s for s in stops))  # (128 + n: a shell's way of saying it)


class _Recorded:
    """google-auth's transport, the status of its last answer kept: its RefreshError does not say it."""

    def __init__(self, request: Callable[..., Any]) -> None:
        self._request = request
        self.status: int | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        response = self._request(*args, **kwargs)
        self.status = getattr(response, "status", None)
        return response


def token_outage(status: int | None, retryable: bool) -> bool:
    """Whether a token google-auth could not have is the token endpoint out of service (429, a 5xx, or what google-auth
    itself calls retryable): ridden out as the API's own 5xx, where a refusal (400 invalid_grant) stops. Pure."""
    return retryable or status in (408, 429) or (status is not None and status >= 500)


def _said(exc: Exception) -> str:
    """What a google-auth error says, without the answer's data it carries as a second argument (a RefreshError is
    `(message, response_data)`: printed whole, a Python tuple), nor an empty description."""
    first = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    return _cut(Exception(first.removesuffix(": None")))


def _from_google(credentials: Any, now: float) -> Minted:
    token = getattr(credentials, "token", None)
    if not isinstance(token, str) or not token:
        raise CredentialsError("the Google credentials gave no access token", setting="google_credentials")
    expiry = getattr(credentials, "expiry", None)  # (naive UTC, as google-auth keeps it)
    if expiry is None:
        return Minted(Secret(token), BARE_TOKEN_LIFE)
    import datetime as dt

    return Minted(Secret(token), max(1.0, expiry.replace(tzinfo=dt.UTC).timestamp() - now))


def _printed(out: str, command: str) -> Minted:
    """A token command's output: a bare token, or a JSON object with `access_token` (and `expires_in`). Pure."""
    text = out.strip()
    if text.startswith("{"):
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        token = answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise CredentialsError(f"{TOKEN_COMMAND} ({command}) printed JSON without an access_token",
                                   setting="google_credentials")
        life = answer.get("expires_in") if isinstance(answer, dict) else None
        return Minted(Secret(token), float(life) if isinstance(life, int | float) and life > 0 else BARE_TOKEN_LIFE)
    if not text or len(text.split()) != 1:
        raise CredentialsError(f"{TOKEN_COMMAND} ({command}) printed no token (one line with the token, or a JSON "
                               "object with access_token)", setting="google_credentials")
    return Minted(Secret(text), BARE_TOKEN_LIFE)


def _cut(exc: Exception) -> str:
    """An exception of google-auth's said without what a token endpoint may have echoed, and cut."""
    return redacted(str(exc).replace("\n", " "), {})[:MAX_SHOWN] or type(exc).__name__


def checked_origin(moved: str | None, named: str) -> str | None:
    """An origin the derived routes move to (`named`: the setting that gave it), refused in one line unless it is
    an origin alone."""
    if moved is not None and (not moved.startswith(("https://", "http://")) or urlsplit(moved).path.strip("/")):
        raise UsageError(f"{named}={moved!r}: give an origin alone, such as https://claude.googleapis.com "
                         "(the routes' paths are derived from the project, location and workspace)", setting="platform")
    return moved


def from_env(environ: Mapping[str, str]) -> GooglePlatform:
    """As `AnthropicGoogleCloud` reads the environment; a missing project or workspace named before any call."""
    def get(name: str) -> str | None:
        return (environ.get(name) or "").strip() or None

    base = get("ANTHROPIC_GOOGLE_CLOUD_BASE_URL")
    moved = checked_origin(get(ORIGIN_VARIABLE), ORIGIN_VARIABLE)
    command = get(TOKEN_COMMAND)
    project = get("ANTHROPIC_GOOGLE_CLOUD_PROJECT") or get("GOOGLE_CLOUD_PROJECT")
    if project is None and base is None and command is None:
        project = _adc_project()  # (the SDK back-fills it from the credentials)
    try:
        argv = tuple(shlex.split(command)) if command else None
    except ValueError as exc:
        raise UsageError(f"{TOKEN_COMMAND}: {exc}", setting="google_credentials") from None
    return GooglePlatform(project, get("ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID"),
                          location=get("ANTHROPIC_GOOGLE_CLOUD_LOCATION") or DEFAULT_LOCATION, base_url=base,
                          origin=moved or ORIGIN, token_command=argv or None)


def _adc_project() -> str | None:
    """The project Application Default Credentials name (a service-account file's, GOOGLE_CLOUD_PROJECT's, the
    metadata server's); None when there are none, or no google-auth to ask."""
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        return None
    try:
        _, project = google.auth.default(scopes=[CLOUD_PLATFORM])
    except google.auth.exceptions.GoogleAuthError:
        return None
    return str(project) if project else None


def configure(environ: Mapping[str, str], api_version: str | None) -> ApiConfig:
    """Claude on Google Cloud as the SDK reads the environment (no Admin key: the organization route takes the
    workspace's Google token)."""
    return ApiConfig(platform=from_env(environ), api_version=api_version)
