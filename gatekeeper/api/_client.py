"""Async client for the Message Batches API.

One `httpx.AsyncClient` (see `open_http`) is shared by every `ApiClient`; each
`ApiClient` holds one key. Reads and cancels are retried by `retry.RetryPolicy`.
A create is never retried here: once its body may have reached the server its
outcome is unknown (`CreateOutcomeUnknown`) and only the caller, who journals
intents, can reconcile. The key is sent only to the configured base URL's
origin; redirects are followed by hand for that reason (httpx would forward
`x-api-key` across origins).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx
import orjson

from .._errors import ApiError, CreateOutcomeUnknown, NotFoundError, QueueFull
from ._codes import create_not_made
from ._config import Secret
from ._http import (
    _CONNECT_FAILURES,
    CREATE_TIMEOUT,
    HttpCalls,
    error_from_response,
    map_transport_error,
)
from ._platform import results_location as results_location  # (the first-party rule, named here as before)
from ._tokens import Auth


class ApiClient:
    """The batch endpoints as one key sees them, over its `HttpCalls` (`calls`: headers, budget, retries, errors);
    the reads beside them, models, token counting and the Admin API's rate limits, are `_reads`'s functions of a
    client. Example::

        async with open_http() as http:
            batch = await ApiClient(http, base_url, Secret(key)).retrieve_batch("msgbatch_...")
    """

    def __init__(self, http: httpx.AsyncClient, base_url: str, key: Secret | Auth, **options: Any) -> None:
        """`options`: `HttpCalls`'s (label, retry, sleep, clock, budget, on_retry, platform, api_version)."""
        self.calls = HttpCalls(http, base_url, key, **options)

    @property
    def label(self) -> str:
        return self.calls.label  # (how messages name this key; never the key)

    async def create_batch(self, body: bytes | AsyncIterable[bytes], size: int | None = None,
                           body_sha256: str | None = None) -> dict[str, Any]:
        """POST one create, exactly once.

        Raises the mapped ApiError when the server definitely refused (4xx,
        QueueFull included: nothing was created; a `ServerError` only for a 5xx
        whose typed code proves nothing was made, `_codes.NOT_MADE`),
        TransportError when the connection never opened (nothing sent), and
        CreateOutcomeUnknown when the body may have arrived (timeouts, resets,
        any other 5xx, a dropped answer).
        """
        url = self.calls.url_of("/v1/messages/batches")
        await self.calls.spend()  # (first: the token and the signature are made after any wait, never before it)
        generation = await self.calls.authenticated()  # (a token endpoint out of reach: TransportError, nothing sent)
        whole = body if isinstance(body, bytes) else None  # (a streamed body is signed by its digest: `body_sha256`)
        headers = self.calls.request_headers(url, {"content-type": "application/json"}, method="POST", body=whole,
                                body_sha256=body_sha256)
        if size is not None:
            headers["content-length"] = str(size)
        try:
            response = await self.calls.http.post(url, content=body, headers=headers, timeout=CREATE_TIMEOUT)
        except (*_CONNECT_FAILURES, httpx.PoolTimeout) as exc:  # no byte of the body left us
            raise map_transport_error(exc, "create", self.calls.base_url, reached=self.calls.reached) from exc
        except httpx.TransportError as exc:
            raise CreateOutcomeUnknown(f"create: {type(exc).__name__} after the body was sent: the batch may exist") from exc
        self.calls.reached = True
        if response.status_code < 300:
            self.calls.auth.accepted(generation)
        if response.status_code >= 500:
            err = error_from_response(response, "create", creating=True, platform=self.calls.platform,
                                      redact=self.calls.auth.redact)
            if create_not_made(response.status_code, err.code):  # (a typed refusal: `ServerError`, nothing made)
                raise err
            raise CreateOutcomeUnknown(f"{err}: the batch may exist") from err
        if response.status_code >= 300:
            error = self.calls.error_of(response, "create", generation, creating=True)  # (TokenExpired: nothing made)
            if not isinstance(error, QueueFull):
                self.calls.slow_down(error)  # a queue-full wait is the caller's: it does not slow reads
            raise error
        try:
            batch = orjson.loads(response.content)
            batch_id = str(batch["id"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CreateOutcomeUnknown("create: the answer carried no batch id: the batch may exist") from exc
        self.calls.created(batch_id)
        return dict(batch)

    def note_created(self, batch_id: str) -> None:
        """Treat 404s on this batch as transient for a while (an id adopted by reconciliation)."""
        self.calls.created(batch_id, adopted=True)

    async def retrieve_batch(self, batch_id: str, *, wait_if_new: bool = True) -> dict[str, Any]:
        """A batch. A 404 on one we created moments ago is retried (the API is eventually consistent) unless not
        `wait_if_new`: a caller that asks again at its next reading takes the 404 at once."""
        return dict(await self.calls.call("GET", f"/v1/messages/batches/{batch_id}", "retrieve",
                                          batch_id=batch_id if wait_if_new else None))

    async def list_page(self, *, limit: int = 1000, after_id: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after_id:
            params["after_id"] = after_id
        return dict(await self.calls.call("GET", "/v1/messages/batches", "list", params=params))

    async def list_batches(self, *, limit: int = 1000, max_pages: int = 10_000) -> AsyncIterator[dict[str, Any]]:
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
        return dict(await self.calls.call("POST", f"/v1/messages/batches/{batch_id}/cancel", "cancel", batch_id=batch_id))

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

    async def iter_results(self, batch: dict[str, Any], within: float | None = None) -> AsyncIterator[bytes]:
        """The raw JSONL lines of an ended batch's results, one at a time (`iter_result_chunks`, line by line)."""
        async with aclosing(self.iter_result_chunks(batch, within)) as chunks:  # (a reader that stops closes the stream)
            async for lines in chunks:
                for line in lines:
                    yield line

    async def iter_result_chunks(self, batch: dict[str, Any], within: float | None = None) -> AsyncGenerator[list[bytes], None]:
        """The raw JSONL lines of an ended batch's results, the lines each received chunk ends at a time (memory: a
        chunk's lines; handing them over a chunk at a time saves the caller a step through the generators a line).

        Opening is retried like any read (the one retry loop), for `within` seconds at most when given (a deadline's
        reading is due: the caller puts the download off rather than wait out a 429 here). A failure once the stream is open is raised
        as it is (the caller's download failed: it starts over). A null
        `results_url` is a `NotFoundError`: the caller decides how long to wait for it.
        """
        batch_id = str(batch.get("id"))
        if not batch.get("results_url"):
            raise NotFoundError("the batch has no results_url yet", endpoint="results", status=404)
        url = self.calls.platform.results_location(str(batch["results_url"]), self.calls.base_url, batch_id)
        response = await self.calls.retried(lambda: self.calls.answer("GET", url, "results", batch_id=batch_id, stream=True,
                                                            accept="application/binary"), "results", url,
                                           self.calls.retry if within is None else
                                           dataclasses.replace(self.calls.retry, max_total=min(self.calls.retry.max_total, within)))
        try:
            async for lines in _line_chunks(response):
                yield lines
        except httpx.TransportError as exc:  # (a signed link's query is a credential: never in a message)
            raise map_transport_error(exc, "results", url.split("?", 1)[0], reached=True) from exc
        finally:
            await response.aclose()


async def _line_chunks(response: httpx.Response) -> AsyncIterator[list[bytes]]:
    """Non-blank lines of a streamed body, a list for each chunk that ends one; a last line without its newline
    comes too (the caller verifies it).

    Each newline is found with `find` (memchr) and each line copied once: `bytes.split` steps through every byte in
    Python's own loop, four instructions a byte, about as long as reading the lines' JSON."""
    held: list[bytes] = []  # the start of a line the chunks so far have not ended
    async for chunk in response.aiter_bytes():
        lines = []
        start, end = 0, chunk.find(b"\n")
        if end >= 0 and held:
            line = b"".join([*held, chunk[:end]]).strip()
            held = []
            if line:
                lines.append(line)
            start, end = end + 1, chunk.find(b"\n", end + 1)
        while end >= 0:
            line = chunk[start:end].strip()
            if line:
                lines.append(line)
            start, end = end + 1, chunk.find(b"\n", end + 1)
        if start < len(chunk):
            held.append(chunk[start:])
        if lines:
            yield lines
    line = b"".join(held).strip()
    if line:
        yield [line]


async def _lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """`_line_chunks`, a line at a time."""
    async for lines in _line_chunks(response):
        for line in lines:
            yield line
