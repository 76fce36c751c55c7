"""The routes the gateway passes through to the upstream API: the Models API and token counting (a client that
checks a model or counts a prompt before it creates a batch gets the upstream's answer).

The request goes out with the gateway's own credentials, as the library sends every call (a key, a token, or
SigV4 on Claude Platform on AWS): the client's key is never forwarded, and of the answer's headers only those a
client reads are passed back (the content type, request-id, retry-after, x-should-retry, the rate-limit headers),
none that could carry the upstream's credentials. One try: the client's SDK retries as it would against the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from .._errors import GatewayRefusal
from ..api._queue import Connection

MAX_BODY = 32_000_000  # bytes: the Messages API's own limit, which count_tokens shares
_PASSED = ("content-type", "request-id", "retry-after", "retry-after-ms", "x-should-retry")
_FROM_CLIENT = ("anthropic-version", "anthropic-beta", "content-type")


async def read_body(chunks: AsyncIterator[bytes]) -> bytes:
    """A pass-through body, whole (at most `MAX_BODY`: beyond it, the API's 413)."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_BODY:
            raise GatewayRefusal(413, "Request exceeds the maximum size")
        parts.append(chunk)
    return b"".join(parts)


async def forward(conn: Connection, method: str, path: str, query: str, body: bytes | None,
                  client_headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the upstream's answer to the same call, sent with the gateway's credentials."""
    calls = conn.primary.calls
    await calls.authenticated()
    url = calls.url_of(path) + (f"?{query}" if query else "")
    extra = {k: v for k, v in client_headers.items() if k in _FROM_CLIENT}
    headers = calls.request_headers(url, extra, method=method, body=body)
    try:
        response = await calls.http.request(method, url, content=body, headers=headers)
    except httpx.TransportError as exc:
        raise GatewayRefusal(502, f"the upstream API could not be reached ({type(exc).__name__})") from exc
    passed = {k: v for k, v in response.headers.items()
              if k.lower() in _PASSED or k.lower().startswith("anthropic-ratelimit-")}
    return response.status_code, passed, response.content
