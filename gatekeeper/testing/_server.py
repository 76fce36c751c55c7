"""The fake API's HTTP side: a threaded stdlib server on loopback.

The wire follows ../shared/api.md section 11: the error envelope with a
request id (the 413 without one), `request-id` on every response, x-api-key
or Bearer auth, Admin keys only on the Admin endpoints, results as JSONL with a
newline after every line and no blank line, in shuffled order.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from .._errors import UsageError
from ._model import FakeBatch, FakeConfig, Organization, Outcome, new_id

_CID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BATCH_PATH = re.compile(r"^/v1/messages/batches/([^/]+)(/results|/cancel)?$")
_SIGNED_PATH = re.compile(r"^/signed/([^/]+)$")
_BATCH_ENDPOINTS = frozenset({"create", "retrieve", "list", "results", "cancel", "delete"})
_WS_LIMITS = re.compile(r"^/v1/organizations/workspaces/([^/]+)/rate_limits$")


@dataclass
class Fault:
    """One injected fault. `endpoint`: create, retrieve, list, results, cancel, delete, rate_limits or "*".

    kind: "status" (answer `status` with an error body and optional retry-after /
    x-should-retry), "drop_after_commit" (create only: the batch is created, the
    connection closed without an answer), "drop" (close without doing anything),
    "delay" (sleep `delay` real seconds, then serve normally), "delay_after_commit"
    (create only: the batch is created, the answer held back `delay` seconds).
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


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          409: "conflict_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          504: "timeout_error", 529: "overloaded_error"}


@dataclass
class _Faults:
    items: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, endpoint: str) -> Fault | None:
        with self.lock:
            for f in self.items:
                if f.times > 0 and f.endpoint in (endpoint, "*"):
                    f.times -= 1
                    return f
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits for the client's
    # delayed ACK, 40 ms an answer on loopback. The real API answers in one go.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # -- helpers ------------------------------------------------------------

    def _rid(self) -> str:
        return new_id("req_", self.server.fake.id_rng)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, rid: str | None = None) -> None:
        self.send_response(status)
        self.send_header("request-id", rid or self._rid())
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, orjson.dumps(obj), headers)

    def _error(self, status: int, message: str, error_type: str | None = None, headers: dict[str, str] | None = None,
               details: dict[str, Any] | None = None) -> None:
        rid = self._rid()
        err: dict[str, Any] = {"type": error_type or _TYPES.get(status, "api_error"), "message": message}
        if details:
            err["details"] = details
        self._send(status, orjson.dumps({"type": "error", "error": err, "request_id": rid}), headers, rid)

    def _read_body(self, limit: int | None = None) -> bytes | None:
        """The request body; None (after draining it) when over `limit`."""
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

    def _key(self) -> str | None:
        key = self.headers.get("x-api-key")
        if key:
            return key.strip()
        auth = self.headers.get("authorization") or ""
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _fault(self, endpoint: str) -> bool:
        """Apply an injected fault; True when it answered (or dropped) the request."""
        fake = self.server.fake
        fault = fake.faults.take(endpoint)
        if fault is None:
            return False
        if fault.kind == "delay":
            time.sleep(fault.delay)
            return False
        if fault.kind == "drop_after_commit":
            self._pending_drop = True
            return False
        if fault.kind == "delay_after_commit":
            self._pending_delay = fault.delay
            return False
        if fault.kind == "drop":
            if self.command in ("POST", "PUT"):
                self._read_body()
            self._drop()
            return True
        headers = {}
        if fault.retry_after is not None:
            headers["retry-after"] = fault.retry_after
        if fault.should_retry is not None:
            headers["x-should-retry"] = fault.should_retry
        if self.command in ("POST", "PUT"):
            self._read_body()
        self._error(fault.status, fault.message or "injected fault", fault.error_type, headers, fault.details)
        return True

    def _rpm_refused(self) -> bool:
        """The batch endpoints' RPM limit: a sliding window of real seconds; over it, 429 with the API's headers."""
        fake = self.server.fake
        cfg = fake.config
        if cfg.rpm is None:
            return False
        now = time.monotonic()
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
            self._read_body()
        reset = fake.org.stamp(fake.org.now() + wait * cfg.speed)
        self._error(429, "Number of request tokens has exceeded your per-minute rate limit", headers={
            "retry-after": str(max(1, math.ceil(wait))), "anthropic-ratelimit-requests-limit": str(cfg.rpm),
            "anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": reset or ""})
        return True

    def _route(self) -> tuple[str, str | None]:
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
        m = _WS_LIMITS.match(path)
        if m:
            return "workspace_rate_limits", m.group(1)
        return "unknown", None

    # -- dispatch -----------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        fake = self.server.fake
        self._pending_drop = False
        self._pending_delay = 0.0
        endpoint, arg = self._route()
        with fake.org.lock:
            fake.org.records.requests_seen[endpoint] = fake.org.records.requests_seen.get(endpoint, 0) + 1
        if self.server.results_only:
            return self._results_other_origin(endpoint, arg)
        if endpoint in _BATCH_ENDPOINTS and self._rpm_refused():
            return
        if endpoint == "unknown":
            if self.command == "POST":
                self._read_body()
            return self._error(404, f"no route for {self.command} {urlsplit(self.path).path}")
        if self._fault(endpoint):
            return
        key = self._key()
        if not self.headers.get("anthropic-version"):
            if self.command == "POST":
                self._read_body()
            return self._error(400, "anthropic-version: header is required")
        admin = endpoint in ("rate_limits", "workspace_rate_limits")
        cfg = fake.config
        if admin:
            if key not in cfg.admin_keys:
                return self._error(401, "invalid x-api-key")
            return self._rate_limits(arg) if endpoint == "workspace_rate_limits" else self._org_rate_limits()
        workspace = cfg.workspaces.get(key or "")
        if workspace is None:
            if self.command == "POST":
                self._read_body()
            return self._error(401, "invalid x-api-key")
        handler = getattr(self, "_" + endpoint)
        handler(workspace, arg)

    # -- batches ------------------------------------------------------------

    def _create(self, workspace: str, _: str | None) -> None:
        fake = self.server.fake
        cfg = fake.config
        raw = self._read_body(cfg.max_body_bytes)
        if raw is None:
            return self._send(413, b'{"error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}')
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict) or set(body) - {"requests"}:
            return self._error(400, "requests: Field required" if not isinstance(body, dict) or "requests" not in body
                               else f"{sorted(set(body) - {'requests'})[0]}: Extra inputs are not permitted")
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            return self._error(400, "requests: List should have at least 1 item after validation")
        if len(requests) > cfg.max_requests:
            return self._error(400, f"requests: List should have at most {cfg.max_requests} items after validation")
        seen: set[str] = set()
        items: list[tuple[str, str]] = []
        prompts: list[tuple[int, str]] = []
        bad: set[int] = set()
        doomed: dict[int, str] = {}
        for i, item in enumerate(requests):
            if not isinstance(item, dict) or set(item) != {"custom_id", "params"}:
                return self._error(400, f"requests.{i}: must have exactly custom_id and params")
            cid, params = item["custom_id"], item["params"]
            if not isinstance(cid, str) or not _CID.fullmatch(cid):
                return self._error(400, f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            if cid in seen:
                return self._error(400, f"requests.{i}.custom_id: duplicate custom_id {cid!r} in this batch")
            seen.add(cid)
            if not isinstance(params, dict):
                return self._error(400, f"requests.{i}.params: Input should be a valid dictionary")
            mt = params.get("max_tokens")
            if params.get("stream") is True or "speed" in params or (isinstance(mt, int) and mt < 1):
                if cfg.sync_disallowed:
                    return self._error(400, f"requests.{i}.params: stream, speed and max_tokens < 1 are not supported in batches")
                bad.add(i)
            items.append((cid, str(params.get("model") or "")))
            prompts.append(prompt_of(params))
            why = fake.org.doom(str(params.get("model") or ""), mt)
            if why:
                doomed[i] = why
        result = fake.org.create(workspace, items, frozenset(bad), doomed, prompts)
        if isinstance(result, dict):
            headers = {}
            if cfg.queue_retry_after is not None:
                # Simulated seconds, like all of the fake's timing, sent as the real seconds a client waits.
                real = cfg.queue_retry_after / cfg.speed if cfg.speed > 0 else cfg.queue_retry_after
                headers["retry-after"] = str(max(1, math.ceil(real)))
            return self._error(429, cfg.queue_message.format(limit=result["limit"]), headers=headers)
        if self._pending_drop:
            return self._drop()  # committed, but the answer is lost
        if self._pending_delay:
            time.sleep(self._pending_delay)  # committed; the answer is late (a client may die waiting)
        self._json(200, fake.org.batch_json(result, fake.results_base))

    def _visible(self, workspace: str, batch_id: str | None) -> FakeBatch | None:
        """The batch, or None after answering 404: unknown, or inside a window where the real API 404s (api.md 7, 14)."""
        fake = self.server.fake
        cfg = fake.config
        b = fake.org.get(workspace, batch_id or "")
        lagging = b is not None and (time.monotonic() - b.created_wall < cfg.not_found_after_create
                                     or fake.org.since_end(b) < cfg.results_not_found_after_end)
        if b is None or lagging:
            self._error(404, "The requested resource could not be found.")
            return None
        return b

    def _retrieve(self, workspace: str, batch_id: str | None) -> None:
        b = self._visible(workspace, batch_id)
        if b is not None:
            self._json(200, self.server.fake.org.batch_json(b, self.server.fake.results_base))

    def _list(self, workspace: str, _: str | None) -> None:
        fake = self.server.fake
        q = parse_qs(urlsplit(self.path).query)
        try:
            limit = int((q.get("limit") or ["20"])[0])
        except ValueError:
            return self._error(400, "limit: Input should be a valid integer")
        if not 1 <= limit <= 1000:
            return self._error(400, "limit: Input should be between 1 and 1000")
        lag = fake.config.listing_lag
        batches = [b for b in fake.org.listing(workspace) if time.monotonic() - b.created_wall >= lag]
        after, before = (q.get("after_id") or [""])[0], (q.get("before_id") or [""])[0]
        ids = [b.id for b in batches]
        if after:
            if after not in ids:
                return self._error(400, f"after_id: unknown batch {after}")
            start = ids.index(after) + 1
            page = batches[start:start + limit]
            has_more = start + limit < len(batches)
        elif before:
            if before not in ids:
                return self._error(400, f"before_id: unknown batch {before}")
            end = ids.index(before)
            page = batches[max(0, end - limit):end]
            has_more = end - limit > 0
        else:
            page = batches[:limit]
            has_more = limit < len(batches)
        data = [fake.org.batch_json(b, fake.results_base) for b in page]
        self._json(200, {"data": data, "has_more": has_more, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})

    def _cancel(self, workspace: str, batch_id: str | None) -> None:
        self._read_body()
        b = self._visible(workspace, batch_id)
        if b is None:
            return
        fake = self.server.fake
        if not fake.org.cancel(b) and fake.config.cancel_ended == "error":
            return self._error(400, "Message batch has already ended and cannot be canceled.")
        self._json(200, fake.org.batch_json(b, fake.results_base))

    def _delete(self, workspace: str, batch_id: str | None) -> None:
        b = self._visible(workspace, batch_id)
        if b is None:
            return
        if not self.server.fake.org.delete(b):
            return self._error(400, "Message batches can only be deleted once they have finished processing.")
        self._json(200, {"id": b.id, "type": "message_batch_deleted"})

    def _results(self, workspace: str, batch_id: str | None) -> None:
        b = self._visible(workspace, batch_id)
        if b is None:
            return
        fake = self.server.fake
        if fake.config.results_redirect and fake._other is not None:
            host, port = fake._other.server_address[:2]
            return self._send(307, b"", {"location": f"http://localhost:{port}/signed/{b.id}?sig=fake-signature"})
        self._stream_results(b)

    def _results_other_origin(self, endpoint: str, batch_id: str | None) -> None:
        """The other origin: the API's own host behind a gateway (any call is a bypass) or a signed-link store."""
        fake = self.server.fake
        if fake.config.results_origin == "gateway":
            with fake.org.lock:
                fake.org.records.bypass_calls += 1
            return self._error(401, "invalid x-api-key")  # the real host does not know the gateway's key
        if self._key():
            with fake.org.lock:
                fake.org.records.wrong_origin_keys += 1
        signed = _SIGNED_PATH.match(urlsplit(self.path).path)
        b = fake.org.batches.get(batch_id or "") if signed else None
        if b is None:
            return self._error(404, "The requested resource could not be found.")
        self._stream_results(b)

    def _stream_results(self, b: FakeBatch) -> None:
        fake = self.server.fake
        if b.status != "ended" or b.results is None:
            return self._error(404, "results are not available until the batch has ended")
        if fake.org.archived(b):
            return self._error(404, "results are no longer available for this batch")
        if self._fault("results_stream"):
            return
        with fake.org.lock:
            n = fake.org.records.downloads.get(b.id, 0)
            fake.org.records.downloads[b.id] = n + 1
        cfg = fake.config
        damage = cfg.damage[n % len(cfg.damage)] if n < cfg.damaged_downloads and cfg.damage else None
        if fake.cut_results_after is not None:
            damage, fake.cut_results_after = "reset", None
        self.send_response(200)
        self.send_header("request-id", self._rid())
        self.send_header("content-type", "application/x-jsonl")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        lines = self._result_lines(b)
        if damage == "short":
            lines = lines[: max(0, len(lines) - max(1, len(lines) // 10))]  # a clean end, lines missing
        elif damage == "half_line":
            lines[-1] = lines[-1][: len(lines[-1]) // 2]  # the last line torn, then a clean end
        elif damage == "reset":
            self._chunk(b"".join(lines[: len(lines) // 2]))
            return self._drop()  # the connection dies midway
        self._send_lines(lines)

    def _result_lines(self, b: FakeBatch) -> list[bytes]:
        """Every result line, in a shuffled order (the API does not keep request order)."""
        assert b.results is not None
        fake = self.server.fake
        answer = ("All done. " * (fake.config.answer_bytes // 10 + 1))[: fake.config.answer_bytes]
        order = list(range(len(b.results)))
        random.Random(b.id).shuffle(order)
        out = []
        for i in order:
            cid, outcome = b.results[i]
            prompt = b.prompts[i] if b.prompts else None
            out.append(orjson.dumps({"custom_id": cid, "result": _result_json(outcome, cid, b.requests[i][1], answer, prompt)}) + b"\n")
        return out

    def _send_lines(self, lines: list[bytes]) -> None:
        buf: list[bytes] = []
        size = 0
        for line in lines:
            buf.append(line)
            size += len(line)
            if size >= 1 << 18:
                self._chunk(b"".join(buf))
                buf, size = [], 0
                if self.server.fake.config.results_chunk_delay:
                    time.sleep(self.server.fake.config.results_chunk_delay)
        if buf:
            self._chunk(b"".join(buf))
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    # -- models and token counting ------------------------------------------

    def _models_down(self) -> bool:
        mode = self.server.fake.config.models_api
        if mode == "ok":
            return False
        if self.command == "POST":
            self._read_body()
        self._error(int(mode), "Not Found" if mode == "404" else "Internal server error")
        return True

    def _model(self, workspace: str, name: str | None) -> None:
        if self._models_down():
            return
        m = self.server.fake.org.model(name or "")
        if m is None:
            return self._error(404, f"model: {name}")
        self._json(200, m.to_json())

    def _models(self, workspace: str, _: str | None) -> None:
        if self._models_down():
            return
        q = parse_qs(urlsplit(self.path).query)
        limit = int((q.get("limit") or ["20"])[0])
        if not 1 <= limit <= 1000:
            return self._error(400, "limit: Input should be between 1 and 1000")
        models = sorted(self.server.fake.config.models, key=lambda m: m.created_at, reverse=True)  # newest first
        after = (q.get("after_id") or [""])[0]
        ids = [m.id for m in models]
        start = ids.index(after) + 1 if after in ids else 0
        page = [m.to_json() for m in models[start:start + limit]]
        self._json(200, {"data": page, "has_more": start + limit < len(models),
                         "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None})

    def _count_tokens(self, workspace: str, _: str | None) -> None:
        if self._models_down():
            return
        raw = self._read_body() or b""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or self.server.fake.org.model(str(body.get("model") or "")) is None:
            return self._error(404 if isinstance(body, dict) else 400, f"model: {body.get('model') if isinstance(body, dict) else ''}")
        self._json(200, {"input_tokens": count_tokens(body)})

    # -- admin --------------------------------------------------------------

    def _org_rate_limits(self) -> None:
        cfg = self.server.fake.config
        entries: list[dict[str, Any]] = [{
            "type": "rate_limit", "id": "rl_01ModelGroupOpus0000000", "group_type": "model_group",
            "group": {"id": "rlg_01ModelGroupOpus000000", "type": "model_group", "display_name": "Claude Opus"},
            "models": ["claude-opus-4-6"],
            "limits": [{"type": "requests_per_minute", "value": 4000}, {"type": "input_tokens_per_minute", "value": 2000000}],
        }]
        if cfg.ceiling is not None:
            entries.append({
                "type": "rate_limit", "id": "rl_01BatchGroup00000000000", "group_type": "batch",
                "group": {"id": "rlg_01BatchGroup0000000000", "type": "batch"}, "models": None,
                "limits": [{"type": "requests_per_minute", "value": 4000},
                           {"type": "enqueued_batch_requests", "value": cfg.ceiling}],
            })
        q = parse_qs(urlsplit(self.path).query)
        group_type = (q.get("group_type") or [""])[0]
        if group_type:
            entries = [e for e in entries if e["group_type"] == group_type]
        size = cfg.rate_limit_page_size
        if size:
            token = (q.get("page") or [""])[0]
            if not token and cfg.rate_limit_empty_first_page:
                return self._json(200, {"data": [], "next_page": "p0"})  # clients must follow next_page
            start = int(token.removeprefix("p")) if token else 0
            nxt = f"p{start + size}" if start + size < len(entries) else None
            return self._json(200, {"data": entries[start:start + size], "next_page": nxt})
        self._json(200, {"data": entries, "next_page": None})

    def _rate_limits(self, workspace_id: str | None) -> None:
        self._json(200, {"data": [], "next_page": None})


def _prompt(body: dict[str, Any]) -> bytes:
    return orjson.dumps([body.get("system"), body.get("messages"), body.get("tools")])


def count_tokens(body: dict[str, Any]) -> int:
    """The fake's tokenizer: deterministic, about 3.3 bytes a token of the prompt's JSON plus 7 (not bytes/4)."""
    return 7 + math.ceil(len(_prompt(body)) / 3.3)


def prompt_of(params: dict[str, Any]) -> tuple[int, str]:
    """(input tokens, digest) of a request's prompt: what its usage reports, and what its answer's message id
    carries (`msg_<digest>`), so a test can tell which prompt a result line answers."""
    prompt = _prompt(params)
    return 7 + math.ceil(len(prompt) / 3.3), hashlib.blake2b(prompt, digest_size=10).hexdigest()


def _result_json(o: Outcome, cid: str, model: str, answer: str, prompt: tuple[int, str] | None = None) -> dict[str, Any]:
    if o.type == "succeeded":
        tokens, digest = prompt or (25, cid[-20:].rjust(20, "0"))
        return {"type": "succeeded", "message": {
            "id": "msg_" + digest, "type": "message", "role": "assistant", "model": model or "claude-x",
            "content": [{"type": "text", "text": answer}], "stop_reason": "end_turn", "stop_sequence": None,
            "stop_details": None, "container": None,
            "usage": {"input_tokens": tokens, "output_tokens": 12, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "service_tier": "batch"}}}
    if o.type == "errored":
        inner = {"type": o.error_type, "message": o.message or f"injected {o.error_type}"}
        if o.flat:
            return {"type": "errored", "error": inner}
        return {"type": "errored", "error": {"type": "error", "error": inner, "request_id": None}}
    return {"type": o.type}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client that died mid-answer (the crash tests kill them on purpose)
        super().handle_error(request, client_address)

    def __init__(self, addr: tuple[str, int], fake: FakeAPI, results_only: bool = False) -> None:
        super().__init__(addr, _Handler)
        self.fake = fake
        self.results_only = results_only


def _listen(host: str, port: int, fake: FakeAPI, results_only: bool = False) -> _Server:
    """A bound server; the socket's errors (a port in use, out of range, no such address) as one `UsageError`."""
    try:
        return _Server((host, port), fake, results_only)
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"the fake API cannot listen on {host}:{port}: {reason}", setting="port") from exc


class FakeAPI:
    """A fake Message Batches + rate-limits API on loopback. Use as a context manager::

        with FakeAPI(FakeConfig(ceiling=300_000)) as fake:
            client = anthropic.Anthropic(base_url=fake.url, api_key="test-key-ws1")

    `fake.org.records` holds what a test judges a client by; `fake.faults`
    takes `Fault`s; `fake.org.advance(seconds)` jumps the clock.
    """

    def __init__(self, config: FakeConfig | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or FakeConfig()
        self.org = Organization(self.config)
        self.faults = _Faults()
        self.id_rng = random.Random(self.config.seed + 1)
        self.cut_results_after: int | None = None  # reset the next results stream midway (any value)
        self.rpm_calls: deque[float] = deque()
        self._server = _listen(host, port, self)
        self._other: _Server | None = None
        if self.config.results_origin != "self" or self.config.results_redirect:
            self._other = _listen(host, 0, self, results_only=True)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def results_base(self) -> str:
        if self._other is None or self.config.results_redirect:
            return self.url
        host, port = self._other.server_address[:2]
        return f"http://localhost:{port}"  # another origin: a different host name and port

    def inject(self, *faults: Fault) -> None:
        with self.faults.lock:
            self.faults.items.extend(faults)

    def start(self) -> FakeAPI:
        for srv in (self._server, self._other):
            if srv is not None:
                t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._server, self._other):
            if srv is not None:
                srv.shutdown()
                srv.server_close()

    def __enter__(self) -> FakeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
