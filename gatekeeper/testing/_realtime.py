"""The fake's real-time lane: `POST /v1/messages`, paced per model as the real API's rate limits are.

Per model, three token buckets refilled continuously: requests (holding one second's worth: a 60 RPM limit may
be enforced as one a second), input tokens and output tokens (holding a minute's worth). A request is charged
its whole prompt as input (the fake never counts what the cache will read before it has read it: never kinder
than the API) and its `max_tokens` as output when it starts; after it, what was not used is given back, and a
cache read is not counted. Over a limit: 429 `rate_limit_error` naming the limit, with `retry-after`.
Every answer carries the `anthropic-ratelimit-*` headers, token `remaining` rounded to the nearest thousand as
the API rounds them. A sharp ramp (more requests in the last `accel_window` seconds than `accel_factor` times
the window before, past a floor) draws an acceleration 429 below the limits. Faults: a share of calls answered
529, and a share processed (and billed) whose answer is lost on the wire. `stream: true` answers as
server-sent events.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ._cache import Usage, billed_as
from ._model import OUTPUT_TOKENS, FakeRealtime, new_id, output_of
from ._wire import prompt_points, version_refusal

if TYPE_CHECKING:
    from ._wire import Wire


@dataclass
class _Bucket:
    limit: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.limit / 60.0)
        self.at = now

    def short(self, cost: float) -> float:
        """Seconds until `cost` fits (0: it fits now)."""
        need = min(cost, self.capacity) - self.level
        return 0.0 if need <= 0 else need * 60.0 / self.limit

    def full_in(self) -> float:
        return max(0.0, (self.capacity - self.level) * 60.0 / self.limit)


@dataclass
class _ModelLane:
    requests: _Bucket
    input: _Bucket
    output: _Bucket
    sent: deque[float] = field(default_factory=deque)  # when calls were let through (acceleration)


@dataclass
class LaneRecords:
    calls: int = 0
    limited: int = 0  # 429s for a limit
    accelerated: int = 0  # 429s for a sharp ramp
    overloaded: int = 0
    lost: int = 0
    answered: int = 0
    streamed: int = 0

    def summary(self) -> dict[str, int]:
        return dict(self.__dict__)


class Lane:
    """The real-time lane's state, shared by the handler threads."""

    def __init__(self, config: FakeRealtime, clock: Any = time.monotonic, wall: Any = time.time) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall  # the wall time its headers' resets are told in (the fake's)
        self.lock = threading.Lock()
        self.models: dict[str, _ModelLane] = {}
        self.records = LaneRecords()
        self._rolls: dict[str, int] = {}

    def _lane(self, model: str, now: float) -> _ModelLane:
        c = self.config
        if model not in self.models:
            self.models[model] = _ModelLane(_Bucket(c.rpm, max(1.0, c.rpm / 60), max(1.0, c.rpm / 60), now),
                                            _Bucket(c.itpm, c.itpm, c.itpm, now), _Bucket(c.otpm, c.otpm, c.otpm, now))
        lane = self.models[model]
        for b in (lane.requests, lane.input, lane.output):
            b.refill(now)
        return lane

    def admit(self, model: str, tokens: int, max_tokens: int) -> tuple[str | None, float, dict[str, str]]:
        """(refusal message or None, retry-after seconds, headers) for a call; its cost is taken when admitted."""
        now = self.clock()
        c = self.config
        with self.lock:
            self.records.calls += 1
            lane = self._lane(model, now)
            why, wait = self._over(lane, now, tokens, max_tokens)
            if why is None:
                lane.requests.level -= 1
                lane.input.level -= tokens
                lane.output.level -= max_tokens
                lane.sent.append(now)
            elif why.startswith("acceleration"):
                self.records.accelerated += 1
            else:
                self.records.limited += 1
            return why, wait if why else 0.0, self.headers(lane, c, self.wall())

    def _over(self, lane: _ModelLane, now: float, tokens: int, max_tokens: int) -> tuple[str | None, float]:
        c = self.config
        for bucket, cost, what in ((lane.requests, 1, f"{c.rpm:,} requests"), (lane.input, tokens, f"{c.itpm:,} input tokens"),
                                   (lane.output, max_tokens, f"{c.otpm:,} output tokens")):
            wait = bucket.short(cost)
            if wait > 0:
                return (f"This request would exceed your organization's rate limit of {what} per minute. For details, "
                        "refer to: https://docs.claude.com/en/api/rate-limits."), wait
        w = c.accel_window
        while lane.sent and lane.sent[0] <= now - 2 * w:
            lane.sent.popleft()
        recent = sum(1 for t in lane.sent if t > now - w)
        before = len(lane.sent) - recent
        if recent >= max(c.accel_floor * c.rpm * w / 60.0, c.accel_factor * before):
            return ("acceleration limit: your organization's usage increased too sharply; ramp up your traffic "
                    "gradually"), w / 2
        return None, 0.0

    def settle(self, model: str, max_tokens: int, charged: int, billed_input: int, output: int) -> dict[str, str]:
        """After a call: give back what its start over-charged; the answer's headers."""
        with self.lock:
            lane = self._lane(model, self.clock())
            lane.input.level = min(lane.input.capacity, lane.input.level + max(0, charged - billed_input))
            lane.output.level = min(lane.output.capacity, lane.output.level + max(0, max_tokens - output))
            return self.headers(lane, self.config, self.wall())

    def roll(self, kind: str, share: float) -> bool:
        """Every 1/share-th call of this kind of fault (deterministic, counted apart for each kind: tests count on
        the share)."""
        if share <= 0:
            return False
        with self.lock:
            n = self._rolls[kind] = self._rolls.get(kind, 0) + 1
            return (n * share) % 1.0 < share

    @staticmethod
    def headers(lane: _ModelLane, c: FakeRealtime, wall: float) -> dict[str, str]:
        out: dict[str, str] = {}
        for axis, bucket, limit in (("requests", lane.requests, c.rpm), ("input-tokens", lane.input, c.itpm),
                                    ("output-tokens", lane.output, c.otpm)):
            level = max(0.0, bucket.level)
            remaining = int(level) if axis == "requests" else int(round(level / 1000.0) * 1000)
            reset = dt.datetime.fromtimestamp(wall + bucket.full_in(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out |= {f"anthropic-ratelimit-{axis}-limit": str(limit), f"anthropic-ratelimit-{axis}-remaining": str(remaining),
                    f"anthropic-ratelimit-{axis}-reset": reset}
        tight = min((lane.input, c.itpm), (lane.output, c.otpm), key=lambda p: p[0].level / p[1])
        out |= {"anthropic-ratelimit-tokens-limit": str(tight[1]),
                "anthropic-ratelimit-tokens-remaining": str(int(round(max(0.0, tight[0].level) / 1000.0) * 1000))}
        return out


def serve_message(h: Wire, workspace: str) -> None:
    """POST /v1/messages."""
    fake = h.server.fake
    lane = fake.realtime
    raw = h.read_body() or b""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return h.send_api_error(400, "request body is not valid JSON")
    model, max_tokens = str(body.get("model") or ""), body.get("max_tokens") if isinstance(body, dict) else None
    if fake.config.model(model) is None:
        return h.send_api_error(404, f"model: {model}", "not_found_error")
    if not isinstance(max_tokens, int) or max_tokens < 1 or not body.get("messages"):
        return h.send_api_error(400, "max_tokens: must be at least 1; messages: required")
    refused = version_refusal(h.headers.get("anthropic-version"), body)
    if refused:
        return h.send_api_error(400, refused)
    (tokens, digest), points = prompt_points(body)
    why, wait, headers = lane.admit(model, tokens, max_tokens)
    if why is not None:
        return h.send_api_error(429, why, "rate_limit_error", {**headers, "retry-after": str(max(1, math.ceil(wait)))})
    if lane.roll("overloaded", lane.config.overloaded):
        lane.records.overloaded += 1
        lane.settle(model, max_tokens, tokens, 0, 0)  # (not processed: nothing charged stays)
        return h.send_api_error(529, "Overloaded", "overloaded_error")
    usage, out_tokens = _process(fake, workspace, model, tokens, digest, points, max_tokens)
    counted = usage.input + usage.write_5m + usage.write_1h + (0 if lane.config.cache_aware else usage.read)
    headers = lane.settle(model, max_tokens, tokens, counted, out_tokens)
    h.pause(lane.config.latency)
    if lane.roll("lost", lane.config.lost):
        lane.records.lost += 1
        with fake.org.lock:
            fake.org.records.realtime_lost[digest] = fake.org.records.realtime_lost.get(digest, 0) + 1
        return h.drop()  # processed and billed; the answer never arrives
    lane.records.answered += 1
    message = _message(model, digest, usage, out_tokens, fake.config.answer_bytes)
    if fake.config.usage == "none":  # (billed, but no usage reported, as a gateway may answer)
        del message["usage"]
    if body.get("stream") is True:
        lane.records.streamed += 1
        return _stream(h, message, headers)
    h.send_json(200, message, headers)


def _process(fake: Any, workspace: str, model: str, tokens: int, digest: str, points: Any, max_tokens: int) -> tuple[Usage, int]:
    """Answer the request as the organization would: bill it (through the prompt cache), count the answer."""
    org = fake.org
    with org.lock:
        m = fake.config.model(model)
        # (a call of its own: it reads what calls before it wrote, never what one processed at the same moment wrote)
        org.realtime_calls += 1
        usage = org.cache.serve(workspace, points, tokens, m.cache_min if m else 1024, org.now(),
                                f"realtime-{org.realtime_calls}", 0) if points else Usage(tokens, 0, 0, 0)
        usage = billed_as(usage, fake.config.usage, digest)
        out = output_of(max_tokens)
        org.records.bill(model, usage, output=out, realtime=True)
        org.records.realtime[digest] = org.records.realtime.get(digest, 0) + 1  # (by prompt: the lane has no custom_id)
    return usage, out


def _message(model: str, digest: str, u: Usage, out: int, answer_bytes: int) -> dict[str, Any]:
    return {"id": "msg_" + digest, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "x" * answer_bytes}],
            "stop_reason": "max_tokens" if out < OUTPUT_TOKENS else "end_turn", "stop_sequence": None,  # (cut short)
            "usage": {"input_tokens": u.input, "output_tokens": out,
                      "cache_creation_input_tokens": u.write_5m + u.write_1h, "cache_read_input_tokens": u.read,
                      "cache_creation": {"ephemeral_5m_input_tokens": u.write_5m, "ephemeral_1h_input_tokens": u.write_1h},
                      "service_tier": "standard"}}


def _stream(h: Wire, message: dict[str, Any], headers: dict[str, str]) -> None:
    """The message as server-sent events, its text in pieces."""
    usage = message.get("usage")  # (absent where the fake reports no usage)
    start = {**message, "content": [], "stop_reason": None, **({"usage": {**usage, "output_tokens": 1}} if usage else {})}
    text = message["content"][0]["text"]
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start}),
                                                 ("content_block_start", {"type": "content_block_start", "index": 0,
                                                                          "content_block": {"type": "text", "text": ""}})]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": text[i:i + 16]}}) for i in range(0, len(text), 16)]
    events += [("ping", {"type": "ping"}), ("content_block_stop", {"type": "content_block_stop", "index": 0}),
               ("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                  **({"usage": {"output_tokens": usage["output_tokens"]}} if usage else {})}),
               ("message_stop", {"type": "message_stop"})]
    data = b"".join(b"event: " + n.encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for n, e in events)
    h.send_response(200)
    h.send_header("request-id", new_id("req_", h.server.fake.id_rng))
    h.send_header("content-type", "text/event-stream")
    h.send_header("content-length", str(len(data)))
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)
