"""The HTTP under every call: the shared client (timeouts, proxies, TLS), one key's headers and call budget,
retries with their notices, redirects followed by hand (the key only to its origin), and every httpx failure and
error answer mapped to the library's errors, once. `ApiClient` (in `_client`) adds the endpoints."""

from __future__ import annotations

import functools
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urljoin

import anyio
import httpx
import orjson

from .._errors import (
    AccountRefused,
    ApiError,
    AuthenticationError,
    BadRequest,
    GatekeeperError,
    NotFoundError,
    QueueFull,
    RateLimited,
    RequestTooLarge,
    ServerError,
    SpendLimitReached,
    TokenExpired,
    TransportError,
    Unreachable,
    UsageError,
)
from .._wire import API_VERSION
from ._codes import LIFTED, SHED, SPEND, STOPS, WAIT, code_of, stop_line
from ._config import Secret, origin
from ._platform import Platform
from ._retry import CallBudget, RetryPolicy, is_per_minute_limit, next_delay, parse_retry_after, status_is_retryable
from ._tokens import Auth, KeyAuth, Outgoing, TokenAuth

FIRST_PARTY = Platform()  # how a client without a platform reads answers: the first-party API's wire

# Upload of a 256 MB body on a slow link: httpx's write timeout applies per
# socket write, not to the whole body, so it is not a total deadline. The read
# timeout is per read: a stream that keeps arriving is never cut off. No read waits
# over a minute in silence (each retry is announced); a create's answer, which may
# follow a long upload, waits longer, and the caller says so before it sends.
DEFAULT_TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=120.0, pool=60.0)
CREATE_ANSWER_WAIT = 600.0
NOTICE_AFTER = 5.0  # seconds a call has been failing (its tries and waits so far, the next wait) before a retry is announced
CREATE_TIMEOUT = httpx.Timeout(connect=15.0, read=CREATE_ANSWER_WAIT, write=120.0, pool=60.0)
# Endpoints only the Batches API serves: an answer there that is not the API's means the base URL is wrong.
_BATCH_READS = frozenset({"list", "retrieve", "cancel"})
MAX_REDIRECTS = 5
# The Models API and token counting inform a job but never block it: a short retry, then the job goes on without.
# They are not batch endpoints either: their own limits apply, not the batch call budget.
PREFLIGHT_RETRY = RetryPolicy(max_attempts=2, max_total=10.0)

Sleep = Callable[[float], Awaitable[None]]
Redact = Callable[[str], str]  # a text with any secret a body may echo cut out
RetryNotice = Callable[[dict[str, Any]], None]
"""`on_retry(fields)`: told of every retried call before its wait, `fields` its `endpoint`, `url`, `attempt`,
`reason` and `retry_in` (seconds)."""


def looks_like_api(response: httpx.Response, platform: Platform = FIRST_PARTY) -> bool:
    """Whether an answer has the API's shape: a JSON object, and on an error status the platform's error envelope.
    Pure."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(body, dict):
        return False
    err = body.get("error")
    return response.status_code < 300 or (isinstance(err, dict) and bool(platform.error_type(err)))


def not_the_api(response: httpx.Response, endpoint: str, platform: Platform = FIRST_PARTY) -> bool:
    """An answer no Anthropic API gives on a batch endpoint (a 404 on the listing, HTML, no envelope), seen
    before the API ever answered: the base URL points elsewhere. 429s and 5xx are ridden out first. Pure."""
    if endpoint not in _BATCH_READS or response.status_code == 429 or response.status_code >= 500:
        return False
    if not looks_like_api(response, platform):
        return True  # (a platform's gateway refusing the route itself names that platform's settings instead)
    return endpoint == "list" and response.status_code == 404 and not platform.route_refused(_error_fields(response)[2])


@asynccontextmanager
async def open_http(timeout: httpx.Timeout | None = None, *,
                    transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The shared HTTP client: no redirects followed automatically; proxies from HTTPS_PROXY, HTTP_PROXY, ALL_PROXY
    and NO_PROXY as httpx reads them (NO_PROXY=* turns them off); TLS verified against certifi's bundle alone.
    `transport` replaces the network (a simulation's world in process: no proxies, no TLS then)."""
    if transport is not None:
        async with httpx.AsyncClient(timeout=timeout or DEFAULT_TIMEOUT, follow_redirects=False, trust_env=False,
                                     transport=transport) as http:
            yield http
        return
    async with httpx.AsyncClient(timeout=timeout or DEFAULT_TIMEOUT, follow_redirects=False, trust_env=True,
                                 verify=tls_context()) as http:
        yield http


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's own verification (certifi's CA bundle, no environment), made once a process: loading the bundle costs
    about 30 ms, which every client would pay again (a library caller running job after job in one process)."""
    return httpx.create_ssl_context(trust_env=False)


def _error_fields(response: httpx.Response, redact: Redact = str,
                  platform: Platform = FIRST_PARTY) -> tuple[str | None, str, dict[str, Any] | None]:
    """(error type, message, the error object) from any body: the envelope (the platform's), the bare 413 body, HTML,
    nothing. What the body says passes through `redact` (a body may echo what was sent)."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        text = redact(response.text.strip().replace("\n", " "))
        return None, (text[:160] or response.reason_phrase or "no body"), None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return platform.error_type(err), redact(str(err.get("message") or "")), err
    return None, redact(str(body))[:160], None


def map_transport_error(exc: httpx.TransportError, endpoint: str, url: str, *, reached: bool) -> GatekeeperError:
    """The one place an httpx transport failure becomes ours (the key is never in `url`: it travels in a header).

    Before the API has answered anything, a connection that cannot be opened is a
    configuration error (`Unreachable`, naming the URL); after, it is a `TransportError`
    that the caller rides out. Never a create: `create_batch` decides that case itself.
    """
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if not reached and isinstance(exc, _CONNECT_FAILURES):
        return Unreachable(f"cannot reach the API at {url}: {reason}")
    return TransportError(f"{endpoint} ({url}): {reason}", endpoint=endpoint)


_CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)
_SPEND_WORDS = ("usage limit", "spend limit", "spend cap")


def error_from_response(response: httpx.Response, endpoint: str, *, creating: bool = False, label: str = "key",
                        platform: Platform = FIRST_PARTY, redact: Redact = str, now: float | None = None) -> ApiError:
    """Map an error response to the exception hierarchy: the typed code first (`_codes`), then a refusal of the
    credentials as the platform reads it (`Platform.refusal`), then the status; text only to split 429/400 kinds the
    API gives no code for. `now` (wall seconds, the caller's clock) reads a retry-after given as a date."""
    status = response.status_code
    error_type, message, raw = _error_fields(response, redact, platform)
    code = code_of(status, raw)
    details: dict[str, Any] = raw["details"] if raw is not None and isinstance(raw.get("details"), dict) else {}
    kw: dict[str, Any] = {
        "endpoint": endpoint, "status": status, "error_type": error_type, "request_id": response.headers.get("request-id"),
        "retry_after": parse_retry_after(response.headers, time.time() if now is None else now), "code": None if code == SHED else code,
    }
    if code in STOPS:
        stop = (SpendLimitReached if code in SPEND else AccountRefused)(stop_line(code, message, details), **kw)
        stop.said, stop.details = message, details  # (the API's own words: the gateway passes them on)
        return stop
    if code in WAIT:  # (a ramp limit, or load shedding: a wait, never a full queue)
        return RateLimited(message or "rate limited", **kw)
    lowered = message.lower()
    if status == 402 or (status in (400, 429) and any(w in lowered for w in _SPEND_WORDS)):
        return SpendLimitReached(f"{message or 'billing refused'}; {LIFTED}", **kw)
    refused = platform.refusal(status, message, raw, endpoint, label, kw)
    if refused is not None:
        return refused
    if status == 404:
        return NotFoundError(message, **kw)
    if status == 413:
        return RequestTooLarge(message or "Request exceeds the maximum size", **kw)
    if status == 429:
        if creating and not is_per_minute_limit(response.headers):
            return QueueFull(message, **kw)  # not shown to be per-minute: the longer, queue-full wait loses nothing
        return RateLimited(message, **kw)
    if status >= 500:
        return ServerError(message, **kw)
    return BadRequest(message, **kw)


class HttpCalls:
    """One key's calls: headers, the call budget, a read retried per its policy (each retry told), the API's
    errors mapped. The endpoints are `ApiClient`'s, which holds one of these."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        key: Secret | Auth,
        *,
        label: str = "key",
        retry: RetryPolicy | None = None,
        sleep: Sleep = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        budget: CallBudget | None = None,
        on_retry: RetryNotice | None = None,
        platform: Platform = FIRST_PARTY,
        api_version: str = API_VERSION,
    ) -> None:
        self.http = http
        self.api_version = api_version  # sent on every call as anthropic-version
        self.platform = platform  # how its answers read, where results may be fetched from
        self.on_retry = on_retry
        self.base_url = base_url.rstrip("/")
        self._origin = origin(self.base_url)
        self.auth: Auth = KeyAuth(key) if isinstance(key, Secret) else key  # a key, or a credential's tokens
        self.label = label  # how messages name this key ("workspace key 2"); never the key itself
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._clock = clock
        self._wall = wall  # (wall seconds: a retry-after given as a date, the API's times)
        self._rand = rand
        self.budget = budget or CallBudget()  # shared by every client of one connection
        self._created: dict[str, float] = {}  # batch id -> when we created it, for the 404 grace (`created`)
        self.reached = False  # has anything answered this client at all (any status)?
        self.spoke = False  # has an answer of the API's shape come back (so the base URL is the API)?

    # -- plumbing ---------------------------------------------------------

    @property
    def signs_body(self) -> bool:
        """Whether a request's body must be known before it is sent (a scheme that signs its digest: SigV4)."""
        return self.auth.requires_request_body

    def request_headers(self, url: str, extra: dict[str, str] | None = None, *, method: str = "GET", body: bytes | None = None,
                 body_sha256: str | None = None) -> dict[str, str]:
        """A request's headers: authenticated by the scheme (`Auth.sign`: a key, a token, a signature over method,
        URL, headers and body), only to our own origin."""
        headers = {"anthropic-version": self.api_version, "accept": "application/json"}
        if extra:
            headers.update(extra)
        if origin(url) != self._origin:
            return headers
        return self.auth.sign(Outgoing(method, url, headers, body, body_sha256))

    def now(self) -> float:
        """Wall seconds on this client's clock (the connection's: a simulation's, or the real one)."""
        return self._wall()

    def url_of(self, path: str) -> str:
        return self.base_url + path

    def created(self, batch_id: str, *, adopted: bool = False) -> None:
        """A batch this client created (or, `adopted`, one reconciliation found ours): 404s on it are taken as the
        API not showing it yet, for a while."""
        if adopted:
            self._created.setdefault(batch_id, self._clock())
        else:
            self._created[batch_id] = self._clock()

    async def spend(self) -> None:
        """Wait for the call budget (the batch endpoints' RPM limit, shared by everything we call)."""
        wait = self.budget.delay(self._clock())
        if wait > 0:
            await self._sleep(wait)

    def slow_down(self, error: ApiError) -> None:
        """A 429 with retry-after on any call pauses every call until then."""
        if error.status == 429 and error.retry_after:
            self.budget.pause(self._clock() + min(error.retry_after, self.retry.max_retry_after))

    async def _open(self, method: str, url: str, *, params: dict[str, Any] | None = None, json: Any = None,
                    accept: str | None = None, stream: bool = False) -> httpx.Response:
        """One request with redirects followed by hand (the key goes only to our origin); a stream is left open."""
        for _ in range(MAX_REDIRECTS + 1):
            content = orjson.dumps(json) if json is not None else None
            extra = {"content-type": "application/json"} if content is not None else {}
            if accept:
                extra["accept"] = accept
            if params:  # (in the URL before signing: the signature covers the query string)
                url, params = str(httpx.URL(url, params=params)), None
            request = self.http.build_request(method, url, content=content,
                                              headers=self.request_headers(url, extra, method=method, body=content))
            response = await self.http.send(request, stream=stream)
            if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                await response.aclose()
                url = urljoin(url, response.headers["location"])
                params = None
                continue
            return response
        raise TransportError(f"{method} {url.split('?', 1)[0]}: more than {MAX_REDIRECTS} redirects", endpoint=url)

    async def authenticated(self) -> int:
        """Ready to send: a credential's token fresh (exchanged now if due; a token endpoint out of reach mid-job
        is a `TransportError`, ridden out as any). Returns the token's generation, which a 401 names."""
        await self.auth.ready()
        return self.auth.generation

    async def answer(self, method: str, url: str, endpoint: str, *, batch_id: str | None = None, budgeted: bool = True,
                      stream: bool = False, **kw: Any) -> httpx.Response:
        """One try: a success (a stream left open for the caller), `_Retry` when another try may succeed, or the
        error to raise."""
        if budgeted:
            await self.spend()
        try:
            generation = await self.authenticated()
        except TransportError as exc:
            raise _Retry(exc) from exc
        try:
            response = await self._open(method, url, stream=stream, **kw)
        except httpx.TransportError as exc:
            raise _Retry(map_transport_error(exc, endpoint, self.base_url, reached=self.reached)) from exc
        self.reached = True
        if stream and response.status_code >= 300:
            await response.aread()
            await response.aclose()
        if not stream:
            if not self.spoke and not_the_api(response, endpoint, self.platform):
                raise not_the_api_error(self.base_url, response, endpoint, self.platform)
            self.spoke = self.spoke or looks_like_api(response, self.platform)
        if response.status_code < 300:
            self.auth.accepted(generation)
            return response
        error = self.error_of(response, endpoint, generation)
        if isinstance(error, TokenExpired):
            raise _Retry(error, 0.0, told=True)  # (once more, with a fresh token)
        self.slow_down(error)
        created = self._created.get(batch_id) if batch_id is not None else None
        if not retryable(error, response, created, self._clock(), self.retry.not_found_grace):
            raise error
        raise _Retry(error, error.retry_after, response.status_code == 529,
                     told=isinstance(error, RateLimited) and bool(error.retry_after))

    def error_of(self, response: httpx.Response, endpoint: str, generation: int, *, creating: bool = False) -> ApiError:
        """An error answer mapped (`error_from_response`, then `as_credential_error`)."""
        error = error_from_response(response, endpoint, creating=creating, label=self.label, platform=self.platform,
                                    redact=self.auth.redact, now=self._wall())
        return as_credential_error(self.auth, error, generation)

    async def retried(self, attempt_once: Callable[[], Awaitable[httpx.Response]], endpoint: str, url: str,
                       policy: RetryPolicy) -> httpx.Response:
        """The one retry loop: `attempt_once` until it answers, per the policy, each retry told (`_notify`)."""
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await attempt_once()
            except _Retry as retry:
                failure, wait, overloaded = retry.error, retry.wait, retry.overloaded
                if not self.reached and attempt >= 2:  # nothing ever answered: the URL or the network is wrong
                    raise given_up(self.base_url, self.spoke, failure, self.platform) from None
                if retry.told:
                    attempt -= 1  # a told wait is not a failure: only max_total bounds it
            delay = next_delay(policy, max(0, attempt - 1), self._rand(), server_wait=wait, overloaded=overloaded)
            if attempt >= policy.max_attempts or self._clock() - started + delay > policy.max_total:
                raise given_up(self.base_url, self.spoke, failure, self.platform)
            if self._clock() - started + delay >= NOTICE_AFTER:  # (short tries that add up are a wait too)
                self._notify(endpoint, url, attempt, failure, delay)
            await self._sleep(delay)

    async def call(
        self, method: str, path: str, endpoint: str, *, params: dict[str, Any] | None = None, batch_id: str | None = None,
        json: Any = None, retry: RetryPolicy | None = None, budgeted: bool = True
    ) -> Any:
        """A read or cancel, retried per the policy (`retry`, else the client's); returns the parsed JSON body."""
        url = self.url_of(path)
        response = await self.retried(lambda: self.answer(method, url, endpoint, batch_id=batch_id, budgeted=budgeted,
                                                            params=params, json=json), endpoint, url, retry or self.retry)
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise ApiError("the response was not JSON", endpoint=endpoint, status=response.status_code) from None

    def _notify(self, endpoint: str, url: str, attempt: int, failure: Exception, delay: float) -> None:
        if self.on_retry is not None:
            self.on_retry({"endpoint": endpoint, "url": url.split("?", 1)[0], "attempt": attempt,
                           "reason": str(failure), "retry_in": round(delay, 1)})

def retryable(error: ApiError, response: httpx.Response, created: float | None, now: float, grace: float) -> bool:
    """Whether a read's error may pass with another try: never the account's refusal; a 404 only within `grace` of
    our create (`created`: when it was made, for a read of a batch); else as the status and headers say. Pure."""
    if isinstance(error, AccountRefused):
        return False
    if isinstance(error, NotFoundError) and created is not None:
        return now - created < grace
    return status_is_retryable(response.status_code, response.headers)


def as_credential_error(auth: Auth, error: ApiError, generation: int) -> ApiError:
    """A 401 for a credential's token that a fresh one may mend is `TokenExpired` (the token dropped); any other
    refusal of a credential names the credentials to fix."""
    if isinstance(auth, KeyAuth) or not isinstance(error, AuthenticationError):
        return error
    if error.status == 401 and auth.rejected(generation):
        return TokenExpired(error.api_message, endpoint=error.endpoint, status=401, error_type=error.error_type,
                            request_id=error.request_id)
    if isinstance(auth, TokenAuth):
        error.setting = "credentials"  # (an Anthropic credential: a platform's refusal names its own setting)
    return error


def given_up(base_url: str, spoke: bool, failure: Exception, platform: Platform = FIRST_PARTY) -> Exception:
    """The error to raise when the retries are spent: before the API ever answered, the base URL is named, and the
    settings that make it on its platform (not when it was a token endpoint that failed: the API was not asked)."""
    if spoke or not isinstance(failure, (TransportError, ServerError)):
        return failure
    if isinstance(failure, TransportError) and failure.endpoint == "token":
        return failure  # (the token endpoint failed, the API was never asked: its URL is not the fault)
    return Unreachable(f"no answer from the API at {base_url} ({failure}); check {platform.where} and "
                       "the network (a proxy is taken from HTTPS_PROXY)", setting=_address(platform))


def not_the_api_error(base_url: str, response: httpx.Response, endpoint: str,
                      platform: Platform = FIRST_PARTY) -> UsageError:
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    snippet = response.text.strip().replace("\n", " ")[:80]
    return UsageError(f"{base_url} does not answer like the Anthropic API (HTTP {response.status_code} on "
                      f"{endpoint}, {kind}: {snippet!r}); check {platform.where}", setting=_address(platform))


def _address(platform: Platform) -> str:
    """The setting a wrong address is laid to: the first-party base URL, or a platform's own (its message names them)."""
    return "base_url" if platform.where == FIRST_PARTY.where else "platform_address"


class _Retry(Exception):  # (control flow between one try and the retry loop, never raised past it)
    """One failed try that another may mend: the error, the wait the server asked for, whether it was a 529."""

    def __init__(self, error: Exception, wait: float | None = None, overloaded: bool = False, told: bool = False) -> None:
        super().__init__(str(error))
        self.error, self.wait, self.overloaded, self.told = error, wait, overloaded, told
