"""Authenticating each call: a workspace key as it is, or an access token minted from a credential (`_credentials`)
and kept fresh for as long as the job runs.

When to exchange again (`refresh_due`, pure) follows the SDK's token cache: 120 s before expiry a new token is
asked for and a failure keeps the old one (advisory); 30 s before, it must be had (mandatory). A token that lives
less than four minutes is asked for again at half and a quarter of its life instead, so a token of seconds is not
exchanged before every call and still never goes out expired. How the exchange is made follows the SDK's
`TokenCache` too (`TokenAuth.ready`): one at a time, in the advisory window without holding any call up, a failure
there backed off. A 401 drops the token that was sent, once: the call is made again with a fresh one, and a 401 for
that one too is a refusal. Tokens are `Secret`s, held in memory only; what a token endpoint says is redacted before
it is shown (`redacted`).

Every scheme is one object with the same face (`Auth`: `ready`, `sign`, `rejected`, `accepted`, `redact`,
`generation`, and `requires_request_body` for a scheme that signs the body, as httpx's `Auth` has it), so a scheme
is added (SigV4, a platform's own tokens: `_aws`, `_google`) without touching the calls that use it. `TokenCache`
holds the SDK's refresh rules for any scheme whose credential is a token that expires: a scheme says only how a
token is minted and sent.
"""

from __future__ import annotations

import base64
import copy
import enum
import os
import re
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
import orjson

from .._errors import CredentialsError, TransportError
from ._config import Secret, origin
from ._credentials import IDENTITY_TOKEN, IDENTITY_TOKEN_FILE, BearerToken, Credential, Federation, ProfileLogin

OAUTH_BETA = "oauth-2025-04-20"  # on every call made with an OAuth or federation token
FEDERATION_BETA = "oidc-federation-2026-04-01"  # on jwt-bearer exchanges only
TOKEN_PATH = "/v1/oauth/token"  # noqa: S105 (a path)
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ADVISORY, MANDATORY = 120.0, 30.0
ADVISORY_BACKOFF = 5.0  # seconds without an advisory exchange after one failed (the SDK's, fixed, no jitter)
EXCHANGE_TIMEOUT = httpx.Timeout(30.0)
MAX_ASSERTION = 16 * 1024  # a JWT from a real issuer is under 4 KiB: more is a key or a certificate named by mistake
MAX_SHOWN = 256  # characters of a token endpoint's error kept: its bodies can echo what was sent


class Due(enum.Enum):
    KEEP = "keep"
    ADVISORY = "advisory"  # ask for a new one; on failure keep this one
    MANDATORY = "mandatory"  # a new one or nothing


def refresh_due(now: float, expires_at: float | None, life: float | None) -> Due:
    """Whether a token expiring at `expires_at` (None: never), which lived `life` seconds, must be exchanged. Pure."""
    if expires_at is None:
        return Due.KEEP
    span = life if life and life > 0 else ADVISORY * 2
    left = expires_at - now
    if left > min(ADVISORY, span / 2):
        return Due.KEEP
    return Due.ADVISORY if left > min(MANDATORY, span / 4) else Due.MANDATORY


def jwt_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT (unix seconds), read without verifying anything; None when it has none. Pure."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        return float(claims["exp"])
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None


Spawn = Callable[[Callable[[Any], Coroutine[Any, Any, None]], Any], object]  # a task group's start_soon, one argument
"""What a `Platform`'s `auths` and `admin` hooks are given to start background work with (a token's refresh ahead
of its expiry): a task group's `start_soon`, or None where nothing runs in the background (a one-shot command)."""


@dataclass(frozen=True)
class Outgoing:
    """One request as a scheme sees it before it leaves: method, URL, the headers so far, and the body (None: none,
    or streamed later and stood for by `body_sha256`, its digest)."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None = None
    body_sha256: str | None = None


@dataclass(frozen=True)
class Minted:
    token: Secret
    expires_in: float | None  # seconds from when it was asked for; None: no expiry known


class Auth(Protocol):
    """How one scheme authenticates a call (as httpx's `Auth` does, minus the flow): what a call awaits before it
    leaves, the headers it leaves with (`sign`: given the request, its body too when `requires_request_body`), what a
    401 or an acceptance says of the credential sent, and how a text is rid of the secret. `generation` names the
    credential a call was sent with."""

    refreshable: bool
    requires_request_body: bool
    generation: int

    async def ready(self) -> None: ...

    def sign(self, request: Outgoing) -> dict[str, str]: ...

    def rejected(self, generation: int) -> bool: ...

    def accepted(self, generation: int) -> None: ...

    def redact(self, text: str) -> str: ...


class KeyAuth:
    """A workspace key, sent as `x-api-key`: nothing to exchange, nothing to refresh."""

    refreshable = False
    requires_request_body = False

    def __init__(self, key: Secret) -> None:
        self.key = key
        self.generation = 0

    async def ready(self) -> None:
        return None

    def sign(self, request: Outgoing) -> dict[str, str]:
        return {**request.headers, "x-api-key": self.key.reveal()}

    def rejected(self, generation: int) -> bool:
        return False

    def accepted(self, generation: int) -> None:
        return None

    def redact(self, text: str) -> str:
        return self.key.redact(text)


@dataclass
class _Refresh:
    """One exchange in flight: callers that must have a new token wait on `done`, then read `failure`."""

    done: anyio.Event = field(default_factory=anyio.Event)
    failure: Exception | None = None


class TokenCache:
    """An access token kept as the SDK's `TokenCache` keeps it: minted when first needed; in the advisory window
    exchanged again by one caller while every call goes on with the valid token (in the background when `spawn` is
    given: then no call waits), a failure there backed off `ADVISORY_BACKOFF` seconds; past the mandatory window, one
    exchange that every caller waits for and whose failure each is told; dropped once on a 401. `clock` measures
    expiry; `wall` reads an expiry written as a time. A scheme gives `_mint` (how a token is had) and `sign` (how it
    is sent)."""

    requires_request_body = False

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 spawn: Spawn | None = None) -> None:
        self.refreshable = True
        self._clock, self._wall, self._spawn = clock, wall, spawn
        self._token: Secret | None = None
        self._expires_at: float | None = None
        self._life: float | None = None
        self._stale = False  # dropped after a 401: the next call waits for a new one
        self._after_rejection = False  # the current token was minted because a 401 dropped the last
        self._refresh: _Refresh | None = None  # the exchange in flight
        self._failed_at = -ADVISORY_BACKOFF  # when an advisory exchange last failed (`clock`)
        self.generation = 0  # which token a call was sent with (a 401 names it)
        self.exchanges = 0
        self.reached = False  # has the token endpoint (or the credential's file) ever given a token

    async def _mint(self) -> Minted:
        raise NotImplementedError

    def sign(self, request: Outgoing) -> dict[str, str]:
        raise NotImplementedError

    @property
    def refreshing(self) -> bool:
        """Whether an exchange is in flight."""
        return self._refresh is not None

    def _due(self) -> Due:
        if self._token is None or self._stale:
            return Due.MANDATORY
        return refresh_due(self._clock(), self._expires_at, self._life)

    async def ready(self) -> None:
        """A token fit to send. Only a caller whose token is missing, dropped or past the mandatory window waits."""
        while True:
            due = self._due()
            if due is Due.KEEP:
                return
            refresh = self._refresh
            if refresh is not None:  # (one exchange at a time)
                if due is Due.ADVISORY:
                    return
                await refresh.done.wait()
                if refresh.failure is not None:
                    raise copy.copy(refresh.failure)  # (each waiter is told; none exchanges again on its own)
                continue
            if due is Due.ADVISORY and self._clock() - self._failed_at < ADVISORY_BACKOFF:
                return
            refresh = self._refresh = _Refresh()
            if due is Due.ADVISORY and self._spawn is not None:
                self._spawn(self._exchange_now, refresh)
                return
            await self._exchange_now(refresh)
            if refresh.failure is not None and due is Due.MANDATORY:
                raise refresh.failure

    async def _exchange_now(self, refresh: _Refresh) -> None:
        """The exchange of `refresh`: a new token kept, or its failure recorded (in the advisory window, the valid
        token goes on serving, and no exchange is tried for `ADVISORY_BACKOFF` seconds)."""
        asked = self._clock()
        try:
            minted = await self._mint()
        except (CredentialsError, TransportError) as exc:
            refresh.failure = exc
            if self._due() is Due.ADVISORY:
                self._failed_at = self._clock()
        except Exception as exc:  # (a background exchange must not take the run down: waiters are told)
            refresh.failure = exc
        else:
            self._keep(minted, asked)
        finally:  # (a cancelled exchange tells waiters nothing: the next of them exchanges)
            self._refresh = None
            refresh.done.set()

    def _keep(self, minted: Minted, asked: float) -> None:
        self._after_rejection = self._stale
        self._token, self._stale = minted.token, False
        self._life = minted.expires_in
        self._expires_at = None if minted.expires_in is None else asked + minted.expires_in
        self.generation += 1
        self.exchanges += 1
        self.reached = True

    @property
    def token(self) -> Secret:
        assert self._token is not None, "ready() first"
        return self._token

    def rejected(self, generation: int) -> bool:
        """A 401 for the token of `generation`: True when a call may be made again with a fresh token (the token is
        dropped, once); False when the fresh one was refused too, or nothing fresh can be had."""
        if not self.refreshable:
            return False
        if generation != self.generation:
            return True  # already replaced since that call left
        if self._after_rejection:
            return False  # (a token minted after a 401, refused before any call with it was accepted)
        self._stale = True
        return True

    def accepted(self, generation: int) -> None:
        """A call with the token of `generation` was accepted: a later 401 for it is an expiry again, not a refusal."""
        if generation == self.generation:
            self._after_rejection = False

    def redact(self, text: str) -> str:
        return text if self._token is None else self._token.redact(text)


class TokenAuth(TokenCache):
    """One Anthropic credential's access token for one workspace (`_credentials`: a bearer token, a profile's login,
    federation), kept by `TokenCache`'s rules."""

    def __init__(self, credential: Credential, workspace: str | None, *, http: httpx.AsyncClient, base_url: str,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 spawn: Spawn | None = None) -> None:
        super().__init__(clock=clock, wall=wall, spawn=spawn)
        self.credential, self.workspace = credential, workspace
        self.refreshable = not isinstance(credential, BearerToken)
        self._http, self._base = http, base_url.rstrip("/")

    def sign(self, request: Outgoing) -> dict[str, str]:
        """The token as the SDK sends it: `ANTHROPIC_AUTH_TOKEN` as a plain Bearer (its `_bearer_auth`); a minted
        token (a profile's login, federation) with the oauth beta added (its `AccessTokenAuth`)."""
        out = {**request.headers, "authorization": f"Bearer {self.token.reveal()}"}
        flags = [f.strip() for f in (request.headers.get("anthropic-beta") or "").split(",") if f.strip()]
        if self.refreshable and OAUTH_BETA not in flags:
            flags.append(OAUTH_BETA)
        if flags:
            out["anthropic-beta"] = ",".join(flags)
        if self.workspace is not None and not isinstance(self.credential, Federation):
            out["anthropic-workspace-id"] = self.workspace  # (a federation token is its workspace's: no header)
        return out

    async def _mint(self) -> Minted:
        c = self.credential
        if isinstance(c, BearerToken):
            return Minted(c.token, None)
        if isinstance(c, Federation):
            return await self._exchange(c)
        return await self._login(c)

    # -- federation ------------------------------------------------------------

    async def _exchange(self, c: Federation) -> Minted:
        assertion = self._assertion(c)
        body: dict[str, Any] = {"grant_type": JWT_BEARER, "assertion": assertion.reveal(),
                                "federation_rule_id": c.rule_id, "organization_id": c.organization_id}
        if c.service_account_id:
            body["service_account_id"] = c.service_account_id
        workspace = self.workspace or c.workspace_id
        if workspace:
            body["workspace_id"] = workspace
        answer = await self._post(body, f"{OAUTH_BETA},{FEDERATION_BETA}", hint=_rule_hint(c, workspace))
        return _minted(answer, self._url)

    def _assertion(self, c: Federation) -> Secret:
        """The identity token, read now (a projected token rotates); one line when it is missing or expired."""
        where = f"{IDENTITY_TOKEN_FILE} ({c.identity_file})" if c.identity_file else IDENTITY_TOKEN
        if c.identity_file is not None:
            try:
                text = c.identity_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CredentialsError(f"the identity token cannot be read: {where}: {exc.strerror or exc}",
                                       setting="identity_token") from None
        else:
            assert c.identity_token is not None
            text = c.identity_token.reveal().strip()
        if not text:
            raise CredentialsError(f"the identity token is empty: {where}", setting="identity_token")
        if len(text.encode()) > MAX_ASSERTION:
            raise CredentialsError(f"the identity token in {where} is over {MAX_ASSERTION:,} bytes: not a JWT (a key "
                                   "or a certificate?)", setting="identity_token")
        exp = jwt_expiry(text)
        if exp is not None and exp <= self._wall():
            raise CredentialsError(f"the identity token in {where} expired {self._wall() - exp:,.0f} s ago: whatever "
                                   "writes it (a projected service account token, a CI runner's OIDC token) has not "
                                   "renewed it", setting="identity_token")
        return Secret(text)

    @property
    def _url(self) -> str:
        return self._base + TOKEN_PATH

    async def _post(self, body: dict[str, Any], beta: str, *, hint: str) -> dict[str, Any]:
        """One POST to the token endpoint: its answer, or one line (never an echo of what was sent)."""
        scheme, host, _ = origin(self._url)
        if scheme != "https" and host not in ("localhost", "127.0.0.1", "::1"):
            raise CredentialsError(f"the token endpoint {self._url} is not https: the identity token would travel in "
                                   "the clear", setting="base_url")
        from .._version import __version__

        headers = {"content-type": "application/json", "anthropic-beta": beta,
                   "user-agent": f"gatekeeper/{__version__}"}
        try:
            response = await self._http.post(self._url, content=orjson.dumps(body), headers=headers,
                                             timeout=EXCHANGE_TIMEOUT)
        except httpx.TransportError as exc:
            reason = type(exc).__name__
            if not self.reached:
                raise CredentialsError(f"cannot reach the token endpoint at {self._url}: {reason}; check "
                                       "ANTHROPIC_BASE_URL and the network", setting="base_url") from None
            raise TransportError(f"token exchange ({self._url}): {reason}", endpoint="token") from None
        if response.status_code == 429 or response.status_code >= 500:
            raise TransportError(f"token exchange ({self._url}): HTTP {response.status_code}", endpoint="token")
        if response.status_code >= 300:
            raise CredentialsError(f"the token endpoint refused the exchange (HTTP {response.status_code}: "
                                   f"{_shown(response, body)}){hint}", setting="identity_token")
        try:
            answer = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise CredentialsError(f"the token endpoint at {self._url} answered without a JSON object",
                                   setting="base_url")
        return answer

    # -- a profile's login -----------------------------------------------------

    async def _login(self, c: ProfileLogin) -> Minted:
        """The login's access token, read from its file now; refreshed (and written back) when it has expired and
        the profile has a client id, as the SDK does."""
        creds = _read_login(c)
        expires_at = _number(creds.get("expires_at"))
        left = None if expires_at is None else expires_at - self._wall()
        token = str(creds.get("access_token") or "")
        unexpired = left is None or left > 0
        if token and unexpired and (not c.client_id or ((left is None or left > MANDATORY) and not self._stale)):
            return Minted(Secret(token), left)  # (without a client id, whatever a daemon last wrote there)
        if not c.client_id or not creds.get("refresh_token"):
            raise CredentialsError(f"the login of {c.source} has expired ({c.credentials_file}): log in again",
                                   setting="profile")
        body = {"grant_type": "refresh_token", "refresh_token": str(creds["refresh_token"]), "client_id": c.client_id}
        answer = await self._post(body, OAUTH_BETA, hint=f": log in again to {c.source}")
        minted = _minted(answer, self._url)
        creds.update(access_token=minted.token.reveal(), refresh_token=answer.get("refresh_token") or body["refresh_token"],
                     expires_at=int(self._wall() + (minted.expires_in or 3600)))
        _write_login(c.credentials_file, creds)  # (a refresh token may rotate: keeping the old one would lose it)
        return minted


def _minted(answer: dict[str, Any], url: str) -> Minted:
    token, expires = answer.get("access_token"), _number(answer.get("expires_in"))
    kind = str(answer.get("token_type") or "bearer").lower()
    if not isinstance(token, str) or not token or kind != "bearer":
        raise CredentialsError(f"the token endpoint at {url} answered without a bearer access_token",
                               setting="base_url")
    return Minted(Secret(token), expires)


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


_SECRET_FIELD = re.compile(r"""(?i)((?:refresh_token|access_token|id_token|assertion|client_secret|password)["']?"""
                           r"""\s*[:=]\s*["']?)[^\s"'&,;}<]+""")
_JWT = re.compile(r"[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
SENT_SECRETS = ("assertion", "refresh_token")  # the fields of a grant that are credentials


def redacted(text: str, sent: dict[str, Any]) -> str:
    """`text` with every credential of the grant `sent` cut out, and anything that looks like one (a secret field's
    value, a JWT): a token endpoint, or a proxy before it, may echo the grant. Pure."""
    for key in SENT_SECRETS:
        value = sent.get(key)
        if isinstance(value, str) and value:
            text = text.replace(value, "***")
    return _JWT.sub("***", _SECRET_FIELD.sub(r"\1***", text))


def _shown(response: httpx.Response, sent: dict[str, Any]) -> str:
    """What a refusal says, redacted (`redacted`), then cut: of a JSON body only OAuth's error fields."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return redacted(response.text.strip().replace("\n", " "), sent)[:MAX_SHOWN] or "no body"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):  # (the API's envelope)
        body = {"error": body["error"].get("type"), "error_description": body["error"].get("message")}
    if not isinstance(body, dict):
        return "an answer that is not an object"
    said = " ".join(str(body[k]) for k in ("error", "error_description") if body.get(k))
    return redacted(said, sent)[:MAX_SHOWN] or "no reason given"


def _rule_hint(c: Federation, workspace: str | None) -> str:
    hint = (f": check that federation rule {c.rule_id} of organization {c.organization_id} matches the identity "
            "token's issuer and subject")
    if workspace is None:
        hint += " (a rule that enables several workspaces needs ANTHROPIC_WORKSPACE_ID)"
    return hint


def _read_login(c: ProfileLogin) -> dict[str, Any]:
    path = c.credentials_file
    try:
        mode = os.stat(path, follow_symlinks=False).st_mode
        if os.name == "posix" and mode & 0o077:
            raise CredentialsError(f"the credentials file of {c.source} ({path}) can be read by others (mode "
                                   f"{mode & 0o777:#o}): run chmod 600 {path}", setting="profile")
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise CredentialsError(f"the credentials file of {c.source} cannot be read: {path}: {exc.strerror or exc}",
                               setting="profile") from None
    except orjson.JSONDecodeError:
        raise CredentialsError(f"the credentials file of {c.source} ({path}) is not JSON", setting="profile") from None
    if not isinstance(data, dict):
        raise CredentialsError(f"the credentials file of {c.source} ({path}) is not a JSON object", setting="profile")
    return data


def _write_login(path: Path, data: dict[str, Any]) -> None:
    """Replace a login's credentials file whole (0600), as the SDK does after a refresh."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise CredentialsError(f"the refreshed login cannot be written back to {path}: {exc.strerror or exc}",
                               setting="profile") from None

