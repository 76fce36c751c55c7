"""Async client for the Message Batches API and the rate-limits Admin API.

One `httpx.AsyncClient` (see `open_http`) is shared by every `ApiClient`; each
`ApiClient` holds one key. Reads and cancels are retried by `retry.RetryPolicy`.
A create is never retried here: once its body may have reached the server its
outcome is unknown (`CreateOutcomeUnknown`) and only the caller, who journals
intents, can reconcile. The key is sent only to the configured base URL's
origin; redirects are followed by hand for that reason (httpx would forward
`x-api-key` across origins).
"""

from __future__ import annotations

import functools
import random
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import anyio
import httpx
import orjson

from .._errors import (
    ApiError,
    AuthenticationError,
    BadRequest,
    CreateOutcomeUnknown,
    GatekeeperError,
    NotFoundError,
    QueueFull,
    RateLimited,
    RequestTooLarge,
    ServerError,
    SpendLimitReached,
    TransportError,
    Unreachable,
    UsageError,
)
from .._wire import API_VERSION
from ._config import Secret, origin
from ._retry import CallBudget, RetryPolicy, is_per_minute_limit, next_delay, parse_retry_after, status_is_retryable

# Upload of a 256 MB body on a slow link: httpx's write timeout applies per
# socket write, not to the whole body, so it is not a total deadline. The read
# timeout is per read: a stream that keeps arriving is never cut off. No read waits
# over a minute in silence (each retry is announced); a create's answer, which may
# follow a long upload, waits longer, and the caller says so before it sends.
DEFAULT_TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=120.0, pool=60.0)
CREATE_ANSWER_WAIT = 600.0
NOTICE_AFTER = 5.0  # seconds a failed try and the wait after it take before the retry is announced
CREATE_TIMEOUT = httpx.Timeout(connect=15.0, read=CREATE_ANSWER_WAIT, write=120.0, pool=60.0)
# Endpoints only the Batches API serves: an answer there that is not the API's means the base URL is wrong.
_BATCH_READS = frozenset({"list", "retrieve", "cancel"})
MAX_REDIRECTS = 5
# The Models API and token counting inform a job but never block it: a short retry, then the job goes on without.
# They are not batch endpoints either: their own limits apply, not the batch call budget.
PREFLIGHT_RETRY = RetryPolicy(max_attempts=2, max_total=10.0)

Sleep = Callable[[float], Awaitable[None]]
RetryNotice = Callable[[dict[str, Any]], None]  # told of every retry: endpoint, url, attempt, reason, retry_in


def looks_like_api(response: httpx.Response) -> bool:
    """Whether an answer has the API's shape: a JSON object, and on an error status the error envelope. Pure."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(body, dict):
        return False
    err = body.get("error")
    return response.status_code < 300 or (isinstance(err, dict) and bool(err.get("type")))


def not_the_api(response: httpx.Response, endpoint: str) -> bool:
    """An answer no Anthropic API gives on a batch endpoint (a 404 on the listing, HTML, no envelope), seen
    before the API ever answered: the base URL points elsewhere. 429s and 5xx are ridden out first. Pure."""
    if endpoint not in _BATCH_READS or response.status_code == 429 or response.status_code >= 500:
        return False
    return not looks_like_api(response) or (endpoint == "list" and response.status_code == 404)


@asynccontextmanager
async def open_http(timeout: httpx.Timeout | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The shared HTTP client: no redirects followed automatically; proxies from HTTPS_PROXY, HTTP_PROXY, ALL_PROXY
    and NO_PROXY as httpx reads them (NO_PROXY=* turns them off); TLS verified against certifi's bundle alone."""
    async with httpx.AsyncClient(timeout=timeout or DEFAULT_TIMEOUT, follow_redirects=False, trust_env=True,
                                 verify=tls_context()) as http:
        yield http


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's own verification (certifi's CA bundle, no environment), made once a process: loading the bundle costs
    about 30 ms, which every client would pay again (a library caller running job after job in one process)."""
    return httpx.create_ssl_context(trust_env=False)


def _error_fields(response: httpx.Response) -> tuple[str | None, str, dict[str, Any]]:
    """(error.type, message, details) from any body: the envelope, the bare 413 body, HTML, nothing."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        text = response.text.strip().replace("\n", " ")
        return None, (text[:160] or response.reason_phrase or "no body"), {}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        raw = err.get("details")
        details: dict[str, Any] = raw if isinstance(raw, dict) else {}
        return (str(err["type"]) if err.get("type") else None), str(err.get("message") or ""), details
    return None, str(body)[:160], {}


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


def error_from_response(response: httpx.Response, endpoint: str, *, creating: bool = False, label: str = "key") -> ApiError:
    """Map an error response to the exception hierarchy. Status decides first; text only to split 429/400 kinds."""
    status = response.status_code
    error_type, message, details = _error_fields(response)
    request_id = response.headers.get("request-id")
    retry_after = parse_retry_after(response.headers, time.time())
    kw: dict[str, Any] = {
        "endpoint": endpoint, "status": status, "error_type": error_type, "request_id": request_id, "retry_after": retry_after,
    }
    lowered = message.lower()
    if details.get("error_code") == "enforced_spend_limit_reached" or (
        status in (400, 429) and any(w in lowered for w in _SPEND_WORDS)
    ):
        return SpendLimitReached(message, **kw)
    if status in (401, 403):
        err = AuthenticationError(f"the {label} was refused ({message or 'no reason given'})", **kw)
        err.setting = "admin_key" if label == "admin key" else "api_key"
        return err
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


class ApiClient:
    """The API as one key sees it. Example::

        async with open_http() as http:
            api = ApiClient(http, base_url, Secret(key))
            batch = await api.retrieve_batch("msgbatch_...")
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        key: Secret,
        *,
        label: str = "key",
        retry: RetryPolicy | None = None,
        sleep: Sleep = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        budget: CallBudget | None = None,
        on_retry: RetryNotice | None = None,
    ) -> None:
        self.http = http
        self.on_retry = on_retry
        self.base_url = base_url.rstrip("/")
        self._origin = origin(self.base_url)
        self._key = key
        self.label = label  # how messages name this key ("workspace key 2"); never the key itself
        self.key_fingerprint = key.fingerprint()
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self.budget = budget or CallBudget()  # shared by every client of one connection
        self._created: dict[str, float] = {}  # batch id -> when we created it, for the 404 grace
        self.reached = False  # has anything answered this client at all (any status)?
        self.spoke = False  # has an answer of the API's shape come back (so the base URL is the API)?

    # -- plumbing ---------------------------------------------------------

    def _headers(self, url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION, "accept": "application/json"}
        if origin(url) == self._origin:
            headers["x-api-key"] = self._key.reveal()
        if extra:
            headers.update(extra)
        return headers

    def _url(self, path: str) -> str:
        return self.base_url + path

    async def _spend(self) -> None:
        """Wait for the call budget (the batch endpoints' RPM limit, shared by everything we call)."""
        wait = self.budget.delay(self._clock())
        if wait > 0:
            await self._sleep(wait)

    def _slow_down(self, error: ApiError) -> None:
        """A 429 with retry-after on any call pauses every call until then."""
        if error.status == 429 and error.retry_after:
            self.budget.pause(self._clock() + min(error.retry_after, self.retry.max_retry_after))

    async def _send_once(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                         json: Any = None, budgeted: bool = True) -> httpx.Response:
        """One request with redirects followed by hand; the key goes only to our origin."""
        if budgeted:
            await self._spend()
        for _ in range(MAX_REDIRECTS + 1):
            content = orjson.dumps(json) if json is not None else None
            extra = {"content-type": "application/json"} if content is not None else None
            response = await self.http.request(method, url, params=params, content=content, headers=self._headers(url, extra))
            if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                url = urljoin(url, response.headers["location"])
                params = None
                continue
            return response
        raise TransportError(f"{method} {url}: more than {MAX_REDIRECTS} redirects", endpoint=url)

    async def _call(
        self, method: str, path: str, endpoint: str, *, params: dict[str, Any] | None = None, batch_id: str | None = None,
        json: Any = None, retry: RetryPolicy | None = None, budgeted: bool = True
    ) -> Any:
        """A read or cancel, retried per the policy (`retry`, else the client's); returns the parsed JSON body."""
        url = self._url(path)
        policy = retry or self.retry
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            wait: float | None = None
            tried_at = self._clock()
            try:
                response = await self._send_once(method, url, params=params, json=json, budgeted=budgeted)
            except httpx.TransportError as exc:
                failure: Exception = map_transport_error(exc, endpoint, self.base_url, reached=self.reached)
                if not self.reached and attempt >= 2:  # nothing ever answered: the URL or the network is wrong
                    raise self._given_up(failure) from exc
                overloaded = False
            else:
                self.reached = True
                if not self.spoke and not_the_api(response, endpoint):
                    raise self._not_the_api(response, endpoint)
                self.spoke = self.spoke or looks_like_api(response)
                if response.status_code < 300:
                    try:
                        return orjson.loads(response.content)
                    except orjson.JSONDecodeError:
                        raise ApiError("the response was not JSON", endpoint=endpoint, status=response.status_code) from None
                error = error_from_response(response, endpoint, label=self.label)
                self._slow_down(error)
                if not self._retryable(error, response, batch_id):
                    raise error
                failure = error
                wait = error.retry_after
                overloaded = response.status_code == 529
                if isinstance(error, RateLimited) and wait:
                    attempt -= 1  # a told wait is not a failure: only max_total bounds it
            elapsed = self._clock() - started
            delay = next_delay(policy, max(0, attempt - 1), self._rand(), server_wait=wait, overloaded=overloaded)
            if attempt >= policy.max_attempts or elapsed + delay > policy.max_total:
                raise self._given_up(failure)
            if self._clock() - tried_at + delay >= NOTICE_AFTER:
                self._notify(endpoint, url, attempt, failure, delay)
            await self._sleep(delay)

    def _notify(self, endpoint: str, url: str, attempt: int, failure: Exception, delay: float) -> None:
        if self.on_retry is not None:
            self.on_retry({"endpoint": endpoint, "url": url.split("?", 1)[0], "attempt": attempt,
                           "reason": str(failure), "retry_in": round(delay, 1)})

    def _given_up(self, failure: Exception) -> Exception:
        """The error to raise when the retries are spent: before the API ever answered, the base URL is named."""
        if self.spoke or not isinstance(failure, (TransportError, ServerError)):
            return failure
        return Unreachable(f"no answer from the API at {self.base_url} ({failure}); check ANTHROPIC_BASE_URL and "
                           "the network (a proxy is taken from HTTPS_PROXY)", setting="base_url")

    def _not_the_api(self, response: httpx.Response, endpoint: str) -> UsageError:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        snippet = response.text.strip().replace("\n", " ")[:80]
        return UsageError(f"{self.base_url} does not answer like the Anthropic API (HTTP {response.status_code} on "
                          f"{endpoint}, {kind}: {snippet!r}); check ANTHROPIC_BASE_URL", setting="base_url")

    def _retryable(self, error: ApiError, response: httpx.Response, batch_id: str | None) -> bool:
        if isinstance(error, SpendLimitReached):
            return False
        if isinstance(error, NotFoundError) and batch_id is not None:
            created = self._created.get(batch_id)
            return created is not None and self._clock() - created < self.retry.not_found_grace
        return status_is_retryable(response.status_code, response.headers)

    # -- batches ----------------------------------------------------------

    async def create_batch(self, body: bytes | AsyncIterable[bytes], size: int | None = None) -> dict[str, Any]:
        """POST one create, exactly once.

        Raises the mapped ApiError when the server definitely refused (4xx,
        QueueFull included: nothing was created), TransportError when the
        connection never opened (nothing sent), and CreateOutcomeUnknown when
        the body may have arrived (timeouts, resets, 5xx, a dropped answer).
        """
        url = self._url("/v1/messages/batches")
        headers = self._headers(url, {"content-type": "application/json"})
        if size is not None:
            headers["content-length"] = str(size)
        await self._spend()
        try:
            response = await self.http.post(url, content=body, headers=headers, timeout=CREATE_TIMEOUT)
        except (*_CONNECT_FAILURES, httpx.PoolTimeout) as exc:  # no byte of the body left us
            raise map_transport_error(exc, "create", self.base_url, reached=self.reached) from exc
        except httpx.TransportError as exc:
            raise CreateOutcomeUnknown(f"create: {type(exc).__name__} after the body was sent: the batch may exist") from exc
        self.reached = True
        if response.status_code >= 500:
            err = error_from_response(response, "create", creating=True)
            raise CreateOutcomeUnknown(f"{err}: the batch may exist") from err
        if response.status_code >= 300:
            error = error_from_response(response, "create", creating=True, label=self.label)
            if not isinstance(error, QueueFull):
                self._slow_down(error)  # a queue-full wait is the caller's: it does not slow reads
            raise error
        try:
            batch = orjson.loads(response.content)
            batch_id = str(batch["id"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CreateOutcomeUnknown("create: the answer carried no batch id: the batch may exist") from exc
        self._created[batch_id] = self._clock()
        return dict(batch)

    def note_created(self, batch_id: str) -> None:
        """Treat 404s on this batch as transient for a while (an id adopted by reconciliation)."""
        self._created.setdefault(batch_id, self._clock())

    async def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/messages/batches/{batch_id}", "retrieve", batch_id=batch_id))

    async def list_page(self, *, limit: int = 1000, after_id: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after_id:
            params["after_id"] = after_id
        return dict(await self._call("GET", "/v1/messages/batches", "list", params=params))

    async def iter_batches(self, *, limit: int = 1000, max_pages: int = 10_000) -> AsyncIterator[dict[str, Any]]:
        """Every batch this key can see, newest first, across every page."""
        after: str | None = None
        for _ in range(max_pages):
            page = await self.list_page(limit=limit, after_id=after)
            data = page.get("data") or []
            for item in data:
                if isinstance(item, dict):
                    yield item
            if not page.get("has_more") or not data:
                return
            after = page.get("last_id") or data[-1].get("id")
            if not after:
                return

    async def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._call("POST", f"/v1/messages/batches/{batch_id}/cancel", "cancel", batch_id=batch_id))

    # -- models -----------------------------------------------------------

    async def get_model(self, name: str) -> dict[str, Any]:
        """GET /v1/models/{name}: the model's info (an alias resolves to its id); NotFoundError when unknown."""
        return dict(await self._call("GET", f"/v1/models/{quote(name, safe='')}", "models", retry=PREFLIGHT_RETRY, budgeted=False))

    async def iter_models(self, *, max_pages: int = 100) -> AsyncIterator[dict[str, Any]]:
        """Every model GET /v1/models lists, following its pages."""
        params: dict[str, Any] = {"limit": 1000}
        for _ in range(max_pages):
            page = await self._call("GET", "/v1/models", "models", params=dict(params), retry=PREFLIGHT_RETRY,
                                    budgeted=False)
            data = [m for m in page.get("data") or [] if isinstance(m, dict)]
            for m in data:
                yield m
            if not page.get("has_more") or not data:
                return
            params["after_id"] = page.get("last_id") or data[-1].get("id")

    async def count_tokens(self, body: dict[str, Any]) -> int:
        """POST /v1/messages/count_tokens: the input tokens of a Messages body (not billed)."""
        answer = await self._call("POST", "/v1/messages/count_tokens", "count_tokens", json=body, retry=PREFLIGHT_RETRY,
                                  budgeted=False)
        return int(answer["input_tokens"])

    async def cancel_if_running(self, batch_id: str) -> str:
        """Cancel a batch; its status after, or "ended" when the API says it is not running (400, 404 or 409:
        the answer for an ended batch is not documented, so any of them means there is nothing left to cancel)."""
        try:
            batch = await self.cancel_batch(batch_id)
        except ApiError as exc:
            if exc.status in (400, 404, 409):
                return "ended"
            raise
        return str(batch.get("processing_status"))

    async def iter_results(self, batch: dict[str, Any]) -> AsyncIterator[bytes]:
        """The raw JSONL lines of an ended batch's results, one at a time (memory: one line).

        Opening is retried like any read. A failure once lines have been yielded is
        raised as it is (the caller's download failed: it starts over). A null
        `results_url` is a `NotFoundError`: the caller decides how long to wait for it.
        """
        batch_id = str(batch.get("id"))
        if not batch.get("results_url"):
            raise NotFoundError("the batch has no results_url yet", endpoint="results", status=404)
        url = results_location(str(batch["results_url"]), self.base_url, batch_id)
        attempt = 0
        started = self._clock()
        while True:
            attempt += 1
            yielded = False
            try:
                async for line in self._stream_lines(url, batch_id):
                    yielded = True
                    yield line
                return
            except _RetryableOpen as exc:
                if yielded:
                    raise exc.error from exc  # lines already went to the caller: a restart here would repeat them
                failure = exc.error
                wait, overloaded = exc.wait, exc.overloaded
            delay = next_delay(self.retry, attempt - 1, self._rand(), server_wait=wait, overloaded=overloaded)
            if attempt >= self.retry.max_attempts or self._clock() - started + delay > self.retry.max_total:
                raise failure
            if delay >= NOTICE_AFTER:
                self._notify("results", url, attempt, failure, delay)
            await self._sleep(delay)

    async def _stream_lines(self, url: str, batch_id: str) -> AsyncIterator[bytes]:
        await self._spend()
        for _ in range(MAX_REDIRECTS + 1):
            headers = self._headers(url, {"accept": "application/binary"})
            try:
                async with self.http.stream("GET", url, headers=headers) as response:
                    if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    self.reached = True
                    if response.status_code >= 300:
                        await response.aread()
                        error = error_from_response(response, "results", label=self.label)
                        self._slow_down(error)
                        if self._retryable(error, response, batch_id):
                            raise _RetryableOpen(error, error.retry_after, response.status_code == 529)
                        raise error
                    async for line in _lines(response):
                        yield line
                    return
            except httpx.TransportError as exc:
                where = url.split("?", 1)[0]  # a signed link's query is a credential: never in a message
                raise _RetryableOpen(map_transport_error(exc, "results", where, reached=True), None, False) from exc
        raise TransportError(f"results: more than {MAX_REDIRECTS} redirects", endpoint="results")

    # -- admin ------------------------------------------------------------

    async def rate_limits(self, group_type: str | None = "batch", max_pages: int = 20) -> list[dict[str, Any]]:
        """Every entry of GET /v1/organizations/rate_limits (an Admin key), following next_page."""
        entries: list[dict[str, Any]] = []
        params: dict[str, Any] = {"group_type": group_type} if group_type else {}
        for _ in range(max_pages):
            page = await self._call("GET", "/v1/organizations/rate_limits", "rate_limits", params=dict(params))
            entries.extend(e for e in (page.get("data") or []) if isinstance(e, dict))
            nxt = page.get("next_page")
            if not nxt:
                break
            params["page"] = nxt
        return entries


def results_location(results_url: str, base_url: str, batch_id: str) -> str:
    """Where to fetch a batch's results. Pure.

    A `results_url` with the API's own results path is fetched from that path on the
    configured base URL, so a gateway or proxy set as the base URL serves it (the JSON
    names the API's own host, which the client may not reach, or reach without the
    gateway's key). Any other URL (a signed object-store link) is fetched as given; the
    key is still sent only to the base URL's origin.
    """
    parts = urlsplit(urljoin(base_url + "/", results_url))
    if parts.path.rstrip("/") == f"/v1/messages/batches/{batch_id}/results":
        return base_url.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")
    return parts.geturl()


async def _lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """Non-blank lines of a streamed body; a last line without its newline is yielded too (the caller verifies it)."""
    tail = b""
    async for chunk in response.aiter_bytes():
        if tail:
            chunk = tail + chunk
        lines = chunk.split(b"\n")
        tail = lines.pop()
        for line in lines:
            line = line.strip()
            if line:
                yield line
    tail = tail.strip()
    if tail:
        yield tail


class _RetryableOpen(Exception):
    def __init__(self, error: Exception, wait: float | None, overloaded: bool) -> None:
        self.error = error
        self.wait = wait
        self.overloaded = overloaded
