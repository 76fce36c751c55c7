"""The fake API's wire: faults to inject, the prompt's tokens and digest, and the handler's helpers (answers,
errors, the envelope, keys, routes) that every endpoint uses.

The wire follows the real API's as its SDK and docs show it: the error envelope with a
request id (the 413 without one), `request-id` on every response, x-api-key
or Bearer auth, Admin keys only on the Admin endpoints, results as JSONL with a
newline after every line and no blank line, in shuffled order.
"""

from __future__ import annotations

import hashlib
import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from ._cache import CachePoint, Usage, cache_points
from ._model import OUTPUT_TOKENS, Outcome, new_id

if TYPE_CHECKING:
    from ._server import _Server

_CID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BATCH_PATH = re.compile(r"^/v1/messages/batches/([^/]+)(/results|/cancel)?$")
_SIGNED_PATH = re.compile(r"^/signed/([^/]+)$")
BATCH_ENDPOINTS = frozenset({"create", "retrieve", "list", "results", "cancel", "delete"})
_WS_LIMITS = re.compile(r"^/v1/organizations/workspaces/([^/]+)/rate_limits$")


@dataclass
class Fault:
    """One injected fault. `endpoint`: create, retrieve, list, results, cancel, delete, rate_limits or "*".

    kind: "status" (answer `status` with an error body and optional retry-after /
    x-should-retry, after `delay` real seconds when given: a slow failure), "drop_after_commit" (create only: the
    batch is created, the connection closed without an answer), "drop" (close without doing anything),
    "delay" (sleep `delay` real seconds, then serve normally), "delay_after_commit"
    (create only: the batch is created, the answer held back `delay` seconds), "echo" (answer `status` with a
    plain-text body that repeats the request, headers and body, as a misconfigured proxy does: what was sent).

    `code`: one of the API's typed error codes (`CODED`), answered as the API answers it (its status, type,
    message and `error.details`); what else is given (a status, a message, a retry-after) overrides the code's.
    """

    endpoint: str
    kind: str = "status"
    status: int = 500
    retry_after: str | None = None
    should_retry: str | None = None
    error_type: str | None = None
    message: str | None = None
    details: dict[str, Any] | None = None
    delay: float = 0.0
    times: int = 1
    after: int = 0  # calls to this endpoint that pass before it strikes (1: the second create's answer is lost)
    code: str | None = None

    def __post_init__(self) -> None:
        if self.code is None:
            return
        if self.code not in CODED:
            raise ValueError(f"no error code {self.code!r}: use one of {', '.join(sorted(CODED))}")
        status, error_type, message, details, retry_after = CODED[self.code]
        self.status = status if self.status == 500 else self.status  # (500: Fault's default, not a choice)
        self.error_type = self.error_type or error_type
        self.message = self.message or message
        self.details = self.details if self.details is not None else details
        self.retry_after = self.retry_after if self.retry_after is not None else retry_after


# The API's typed error codes (api.md §25) as the fake answers them: status, error.type, message (the API's where it
# was seen, else the SDK's description of the code), details (None: `"details": null`), retry-after.
_ON = "You will regain access on 2027-01-01 at 00:00 UTC."
CODED: dict[str, tuple[int, str, str, dict[str, Any] | None, str | None]] = {
    "ramp_limit_exceeded": (429, "rate_limit_error", "This request would exceed a ramp limit, which caps how fast "
                            "usage can grow. Retry after the time in the retry-after header.",
                            {"error_code": "ramp_limit_exceeded"}, "1"),
    "load_shedding": (429, "rate_limit_error", "Server is temporarily limiting requests (not your usage limit)",
                      None, "1"),
    "enforced_spend_limit_reached": (429, "rate_limit_error", "You have reached your API usage limits: your "
                                     "organization has crossed its monthly API usage threshold, set based on your "
                                     f"organization's API tier. {_ON}",
                                     {"error_code": "enforced_spend_limit_reached"}, None),
    "contract_spend_limit_reached": (429, "rate_limit_error", f"Your organization has reached its contract's spend "
                                     f"limit. {_ON}", {"error_code": "contract_spend_limit_reached"}, None),
    "linked_organization_spend_limit_reached": (402, "billing_error", "The organization linked to your user profile "
                                                "has reached a spend limit it set, or lacks credit for the request.",
                                                {"error_code": "linked_organization_spend_limit_reached"}, None),
    "linked_organization_billing_unavailable": (402, "billing_error", "The organization linked to your user profile "
                                                "cannot be billed at this time.",
                                                {"error_code": "linked_organization_billing_unavailable"}, None),
    "organization_on_hold": (400, "invalid_request_error", "This organization has been disabled.",
                             {"error_code": "organization_on_hold",
                              "appeal_url": "https://appeals.example.test/organization"}, None),
    "workspace_human_review_disabled": (400, "invalid_request_error", "Human Review is turned off for this "
                                        "workspace.", {"error_code": "workspace_human_review_disabled"}, None),
    "cmek_key_disabled": (400, "invalid_request_error", "The workspace's encryption key is disabled.",
                          {"error_code": "cmek_key_disabled"}, None),
    "claude_code_key_creator_not_member": (400, "invalid_request_error", "The creator of this API key is no longer a "
                                           "member of this organization.",
                                           {"error_code": "claude_code_key_creator_not_member"}, None),
    "cmek_key_unreachable": (503, "api_error", "The workspace's encryption key could not be reached.",
                             {"error_code": "cmek_key_unreachable"}, None),
}


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
          404: "not_found_error",
          409: "conflict_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          504: "timeout_error", 529: "overloaded_error"}


@dataclass
class Faults:
    items: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, endpoint: str) -> Fault | None:
        with self.lock:
            for f in self.items:
                if f.times > 0 and f.endpoint in (endpoint, "*"):
                    if f.after > 0:
                        f.after -= 1
                        continue
                    f.times -= 1
                    return f
        return None


STRICT_VERSION = "2026-10-21"


def version_refusal(version: str | None, params: dict[str, Any]) -> str | None:
    """What API version 2026-10-21 answers a request it refuses (the fake's own reading of the migration guide, apart
    from gatekeeper's check): temperature, top_p, top_k at any value, a document block in an assistant message,
    citations on a user text block. None under 2023-06-01, or for a request it takes."""
    if version != STRICT_VERSION:
        return None
    for key in ("temperature", "top_p", "top_k"):
        if key in params:
            return f"{key}: Extra inputs are not permitted"
    for i, m in enumerate(params.get("messages") or []):
        content = m.get("content") if isinstance(m, dict) else None
        for j, b in enumerate(content if isinstance(content, list) else []):
            if not isinstance(b, dict):
                continue
            if m.get("role") == "assistant" and b.get("type") == "document":
                return f"messages.{i}.content.{j}: document blocks are not permitted in assistant messages"
            if m.get("role") == "user" and b.get("type") == "text" and b.get("citations"):
                return f"messages.{i}.content.{j}.citations: Extra inputs are not permitted"
    return None


def _prompt(body: dict[str, Any]) -> bytes:
    return orjson.dumps([body.get("system"), body.get("messages"), body.get("tools")])


def fake_token_count(body: dict[str, Any]) -> int:
    """The fake's tokenizer: deterministic, about 3.3 bytes a token of the prompt's JSON plus 7 (not bytes/4)."""
    return 7 + math.ceil(len(_prompt(body)) / 3.3)


def prompt_of(params: dict[str, Any]) -> tuple[int, str]:
    """(input tokens, digest) of a request's prompt: what its usage reports, and what its answer's message id
    carries (`msg_<digest>`), so a test can tell which prompt a result line answers."""
    prompt = _prompt(params)
    return 7 + math.ceil(len(prompt) / 3.3), hashlib.blake2b(prompt, digest_size=10).hexdigest()


def prompt_points(params: dict[str, Any]) -> tuple[tuple[int, str], tuple[CachePoint, ...]]:
    """`prompt_of` and the request's marked prefixes (`cache_points`), the prompt serialized once."""
    prompt = _prompt(params)
    tokens = 7 + math.ceil(len(prompt) / 3.3)
    marked = b'"cache_control"' in prompt or "cache_control" in params
    return (tokens, hashlib.blake2b(prompt, digest_size=10).hexdigest()), cache_points(params, tokens) if marked else ()


def _result_json(o: Outcome, cid: str, model: str, answer: str, prompt: tuple[int, str] | None = None,
                 usage: Usage | None = None, output: int = OUTPUT_TOKENS) -> dict[str, Any]:
    """A result line's `result`; a succeeded one's `output` tokens (fewer than `OUTPUT_TOKENS`: cut at its
    max_tokens, its stop_reason "max_tokens" unless an injected one says otherwise)."""
    if o.type == "succeeded":
        tokens, digest = prompt or (25, cid[-20:].rjust(20, "0"))
        u = usage or Usage(tokens, 0, 0, 0)
        stop = "max_tokens" if output < OUTPUT_TOKENS and o.stop_reason == "end_turn" else o.stop_reason
        return {"type": "succeeded", "message": {
            "id": "msg_" + digest, "type": "message", "role": "assistant", "model": model or "claude-x",
            "content": [{"type": "text", "text": answer}], "stop_reason": stop, "stop_sequence": None,
            "stop_details": {"type": "refusal", "category": "cyber"} if stop == "refusal" else None, "container": None,
            "usage": {"input_tokens": u.input, "output_tokens": output,
                      "cache_creation_input_tokens": u.write_5m + u.write_1h, "cache_read_input_tokens": u.read,
                      "cache_creation": {"ephemeral_5m_input_tokens": u.write_5m, "ephemeral_1h_input_tokens": u.write_1h},
                      "service_tier": "batch"}}}
    if o.type == "errored":
        inner = {"type": o.error_type, "message": o.message or f"injected {o.error_type}"}
        if o.flat:
            return {"type": "errored", "error": inner}
        return {"type": "errored", "error": {"type": "error", "error": inner, "request_id": None}}
    return {"type": o.type}


class Wire(BaseHTTPRequestHandler):
    """What every endpoint of the fake answers with."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits for the client's
    # delayed ACK, 40 ms an answer on loopback. The real API answers in one go.
    disable_nagle_algorithm = True
    server: _Server
    early_body: bytes | None = None  # a request body read ahead (the AWS mode checks its signature first)
    google_scope: str = "workspace"  # Claude on Google Cloud: the route prefix a call came by ("organization")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # -- helpers ------------------------------------------------------------

    def request_id(self) -> str:
        return new_id("req_", self.server.fake.id_rng)

    def send_body(self, status: int, body: bytes, headers: dict[str, str] | None = None, rid: str | None = None) -> None:
        self.send_response(status)
        self.send_header("request-id", rid or self.request_id())
        if "content-type" not in (headers or {}):
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.send_body(status, orjson.dumps(obj), headers)

    def send_api_error(self, status: int, message: str, error_type: str | None = None, headers: dict[str, str] | None = None,
               details: dict[str, Any] | None = None, details_null: bool = False) -> None:
        rid = self.request_id()
        err: dict[str, Any] = {"type": error_type or _TYPES.get(status, "api_error"), "message": message}
        if details:
            err["details"] = details
        elif details_null:
            err["details"] = None
        self.send_body(status, orjson.dumps({"type": "error", "error": err, "request_id": rid}), headers, rid)

    def read_body(self, limit: int | None = None) -> bytes | None:
        """The request body; None (after draining it) when over `limit`. (In the AWS mode it was read already, to
        check its signature: `_body`.)"""
        early = self.early_body
        if early is not None:
            self.early_body = None
            return early if limit is None or len(early) <= limit else None
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            parts, total = [], 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunk = self.rfile.read(size)
                self.rfile.readline()
                total += size
                if limit is None or total <= limit:
                    parts.append(chunk)
            return b"".join(parts) if limit is None or total <= limit else None
        length = int(self.headers.get("content-length") or 0)
        if limit is not None and length > limit:
            remaining = length
            while remaining > 0:
                got = self.rfile.read(min(remaining, 1 << 20))
                if not got:
                    break
                remaining -= len(got)
            return None
        return self.rfile.read(length) if length else b""

    def api_key(self) -> str | None:
        key = self.headers.get("x-api-key")
        if key:
            return key.strip()
        auth = self.headers.get("authorization") or ""
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def pause(self, seconds: float) -> None:
        """The fake taking its time over an answer (served in process, the wait is on the simulation's clock)."""
        time.sleep(seconds)

    def drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def injected(self, endpoint: str) -> bool:
        """Apply an injected fault; True when it answered (or dropped) the request."""
        fake = self.server.fake
        fault = fake.faults.take(endpoint)
        if fault is None:
            return False
        if fault.kind == "delay":
            self.pause(fault.delay)
            return False
        if fault.kind == "drop_after_commit":
            self.pending_drop = True
            return False
        if fault.kind == "delay_after_commit":
            self.pending_delay = fault.delay
            return False
        if fault.kind == "drop":
            if self.command in ("POST", "PUT"):
                self.read_body()
            self.drop()
            return True
        if fault.kind == "echo":
            sent = self.read_body() or b"" if self.command in ("POST", "PUT") else b""
            head = f"{self.requestline}\n{self.headers}".encode()
            self.send_body(fault.status, b"upstream refused the request: " + sent + b"\n" + head, {"content-type": "text/plain"})
            return True
        headers = {}
        if fault.retry_after is not None:
            headers["retry-after"] = fault.retry_after
        if fault.should_retry is not None:
            headers["x-should-retry"] = fault.should_retry
        if self.command in ("POST", "PUT"):
            self.read_body()
        if fault.delay:
            self.pause(fault.delay)  # (a slow failure)
        self.send_api_error(fault.status, fault.message or "injected fault", fault.error_type, headers, fault.details,
                            details_null=fault.code is not None and fault.details is None)
        return True

    def rpm_refused(self) -> bool:
        """The batch endpoints' RPM limit: a sliding window of real seconds; over it, 429 with the API's headers."""
        fake = self.server.fake
        cfg = fake.config
        if cfg.rpm is None:
            return False
        now = fake.org.clock()
        with fake.org.lock:
            calls = fake.rpm_calls
            while calls and calls[0] <= now - cfg.rpm_window:
                calls.popleft()
            if len(calls) < cfg.rpm:
                calls.append(now)
                return False
            fake.org.records.rpm_refusals += 1
            wait = calls[0] + cfg.rpm_window - now
        if self.command in ("POST", "PUT"):
            self.read_body()
        reset = fake.org.stamp(fake.org.now() + wait * cfg.speed)
        self.send_api_error(429, "Number of request tokens has exceeded your per-minute rate limit", headers={
            "retry-after": str(max(1, math.ceil(wait))), "anthropic-ratelimit-requests-limit": str(cfg.rpm),
            "anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": reset or ""})
        return True

    def route(self) -> tuple[str, str | None]:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/v1/messages/batches":
            return ("create" if self.command == "POST" else "list"), None
        m = _BATCH_PATH.match(path)
        if m:
            tail = m.group(2)
            if tail == "/results":
                return "results", m.group(1)
            if tail == "/cancel":
                return "cancel", m.group(1)
            return ("delete" if self.command == "DELETE" else "retrieve"), m.group(1)
        m = _SIGNED_PATH.match(path)
        if m:
            return "results", m.group(1)
        if path == "/v1/organizations/rate_limits":
            return "rate_limits", None
        if path == "/v1/models":
            return "models", None
        if path.startswith("/v1/models/"):
            return "model", path.removeprefix("/v1/models/")
        if path == "/v1/messages/count_tokens":
            return "count_tokens", None
        if path == "/v1/messages" and self.command == "POST":
            return "messages", None
        if path == "/v1/oauth/token" and self.command == "POST":
            return "token", None
        m = _WS_LIMITS.match(path)
        if m:
            return "workspace_rate_limits", m.group(1)
        return "unknown", None
