"""One call to the real-time Messages API (`POST /v1/messages`), never retried here: the lane that sends it
paces and retries (`decide._pacing`), and journals it first.

The Messages API has no idempotency key, so how a call failed matters: a connection that never opened sent
nothing (`UNSENT`); one that broke after the body left may have been processed and billed (`LOST`). A request
the SDKs would refuse to send without streaming (it may run past ten minutes) is streamed, and its events are
assembled into the same Message a plain call returns.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from .._errors import AccountRefused, ApiError, AuthenticationError, CredentialsError, TokenExpired, TransportError
from ._client import ApiClient
from ._http import _CONNECT_FAILURES
from ._retry import parse_retry_after

MESSAGE_TIMEOUT = httpx.Timeout(connect=15.0, read=600.0, write=120.0, pool=600.0)


class Kind(str, enum.Enum):
    ANSWERED = "answered"  # a Message
    LIMITED = "limited"  # 429: wait `retry_after`
    OVERLOADED = "overloaded"  # 529
    SERVER = "server"  # another 5xx
    REFUSED = "refused"  # another 4xx: the request itself is refused (final)
    ACCOUNT = "account"  # 401, 403, 402, a usage limit, a spend cap, an account on hold...: never tried
    UNSENT = "unsent"  # the connection never opened: nothing left us
    LOST = "lost"  # the body left us and no whole answer came back: it may have been processed


@dataclass(frozen=True)
class Call:
    kind: Kind
    headers: dict[str, str]
    message: dict[str, Any] | None = None
    error: ApiError | None = None
    retry_after: float | None = None
    detail: str = ""


async def send_message(api: ApiClient, body: bytes, *, stream: bool) -> Call:
    """One call with `body` (a Messages request's params, `stream` already set when it streams)."""
    url = api.calls.url_of("/v1/messages")
    try:
        generation = await api.calls.authenticated()
    except TransportError as exc:
        return Call(Kind.UNSENT, {}, detail=str(exc))
    except CredentialsError as exc:  # (the account's: every call would be refused alike)
        return Call(Kind.ACCOUNT, {}, error=AuthenticationError(str(exc), endpoint="messages", status=401),
                    detail=str(exc))
    sent = {"content-type": "application/json", **({"accept": "text/event-stream"} if stream else {})}
    headers = api.calls.request_headers(url, sent, method="POST", body=body)  # (signed as sent: `accept` among them)
    try:
        async with api.calls.http.stream("POST", url, content=body, headers=headers, timeout=MESSAGE_TIMEOUT) as response:
            api.calls.reached = True
            got = {k.lower(): v for k, v in response.headers.items()}
            if response.status_code >= 300:
                await response.aread()
                return _failure(response, got, api, generation)
            api.calls.auth.accepted(generation)
            message = await (_assemble(response.aiter_lines()) if stream else _whole(response))
    except _CONNECT_FAILURES as exc:
        return Call(Kind.UNSENT, {}, detail=type(exc).__name__)
    except (httpx.TransportError, ValueError, KeyError) as exc:
        return Call(Kind.LOST, {}, detail=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return Call(Kind.ANSWERED, got, message)


def probe_params(model: str) -> dict[str, Any]:
    """The smallest call there is for `model` (one output token): sent only to read its rate limits' headers."""
    return {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}


def _failure(response: httpx.Response, headers: dict[str, str], api: ApiClient, generation: int) -> Call:
    error = api.calls.error_of(response, "messages", generation)
    if isinstance(error, TokenExpired):  # refused before it was read: as if unsent, and a fresh token is coming
        return Call(Kind.UNSENT, headers, detail=str(error))
    return Call(kind_of(error), headers, error=error, retry_after=parse_retry_after(headers, api.calls.now()),
                detail=str(error))


def kind_of(error: ApiError) -> Kind:
    """What an error answer is to the lane: the account's refusal (a stop), a wait, a failure, or the request's
    refusal. Pure."""
    if isinstance(error, AuthenticationError | AccountRefused):
        return Kind.ACCOUNT
    status = error.status
    return Kind.LIMITED if status == 429 else Kind.OVERLOADED if status == 529 else Kind.SERVER if status >= 500 \
        else Kind.REFUSED


async def _whole(response: httpx.Response) -> dict[str, Any]:
    message = orjson.loads(await response.aread())
    if not isinstance(message, dict) or message.get("type") != "message":
        raise ValueError("the answer is not a Message")
    return message


async def _assemble(lines: AsyncIterator[str]) -> dict[str, Any]:
    """A Message from its server-sent events: `message_start`, each content block's start, deltas and stop, the
    `message_delta` (stop reason, final usage) and `message_stop`. An error event, or a stream that ends before
    `message_stop`, is a lost answer (ValueError)."""
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}  # index -> a tool_use block's input JSON, as its pieces come
    async for line in lines:
        if not line.startswith("data:"):
            continue
        event = orjson.loads(line[5:].strip())
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event["message"])
        elif kind == "content_block_start":
            blocks[int(event["index"])] = dict(event["content_block"])
        elif kind == "content_block_delta":
            _apply(blocks[int(event["index"])], event["delta"], partial, int(event["index"]))
        elif kind == "content_block_stop" and int(event["index"]) in partial:
            blocks[int(event["index"])]["input"] = orjson.loads(partial.pop(int(event["index"])) or "{}")
        elif kind == "message_delta" and message is not None:
            message.update({k: v for k, v in event.get("delta", {}).items()})
            if "usage" in event:  # (the final output count; an answer without usage keeps none)
                message["usage"] = {**message.get("usage", {}), **event["usage"]}
        elif kind == "message_stop" and message is not None:
            message["content"] = [blocks[i] for i in sorted(blocks)]
            return message
        elif kind == "error":
            raise ValueError(f"the stream ended with an error: {event.get('error')}")
    raise ValueError("the stream ended before message_stop")


def _apply(block: dict[str, Any], delta: dict[str, Any], partial: dict[int, str], index: int) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "input_json_delta":
        partial[index] = partial.get(index, "") + delta.get("partial_json", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))
