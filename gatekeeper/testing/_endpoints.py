"""The fake's batch endpoints, one function each of the handler (`Wire`), the caller's workspace and the path's
argument: create, retrieve, list, cancel, delete, and results (streamed, damaged on request, from a gateway's or a
signed origin)."""

from __future__ import annotations

import math
import random
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from .._wire import BOTH_CURSORS
from ._cache import CachePoint
from ._model import OUTPUT_TOKENS, FakeBatch, batch_json, output_of
from ._wire import _CID, _SIGNED_PATH, Wire, _result_json, prompt_points, version_refusal


def create(h: Wire, workspace: str, _: str | None) -> None:
    fake = h.server.fake
    cfg = fake.config
    version = h.headers.get("anthropic-version")
    requests = _envelope(h, cfg.max_body_bytes, cfg.max_requests)
    if requests is None:
        return None
    seen: set[str] = set()
    items: list[tuple[str, str]] = []
    prompts: list[tuple[int, str]] = []
    points: list[tuple[CachePoint, ...]] = []
    outputs: list[int] = []
    bad: set[int] = set()
    doomed: dict[int, str] = {}
    for i, item in enumerate(requests):
        if not isinstance(item, dict) or set(item) != {"custom_id", "params"}:
            return h.send_api_error(400, f"requests.{i}: must have exactly custom_id and params")
        cid, params = item["custom_id"], item["params"]
        if not isinstance(cid, str) or not _CID.fullmatch(cid):
            return h.send_api_error(400, f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
        if cid in seen:
            return h.send_api_error(400, f"requests.{i}.custom_id: duplicate custom_id {cid!r} in this batch")
        seen.add(cid)
        if not isinstance(params, dict):
            return h.send_api_error(400, f"requests.{i}.params: Input should be a valid dictionary")
        mt = params.get("max_tokens")
        # (fast mode is refused in a batch; "standard", the SDK's default, is not fast mode)
        if params.get("stream") is True or params.get("speed", "standard") != "standard" or (isinstance(mt, int) and mt < 1):
            if cfg.sync_disallowed:
                return h.send_api_error(400, f"requests.{i}.params: stream, speed and max_tokens < 1 are not supported in batches")
            bad.add(i)
        items.append((cid, str(params.get("model") or "")))
        outputs.append(output_of(mt))
        prompt, marked = prompt_points(params)
        prompts.append(prompt)
        points.append(marked)
        # (checked at processing, as the API checks params: the version is the create's header)
        why = fake.org.doom(str(params.get("model") or ""), mt) or _refused_markers(params) \
            or version_refusal(version, params)
        if why:
            doomed[i] = why
    result = fake.org.create(workspace, items, frozenset(bad), doomed, prompts, points, outputs)
    if isinstance(result, dict):
        return _queue_full(h, result["limit"])
    fake.org.records.versions[result.id] = version or ""
    if fake.org.answer_lost(dropped=h.pending_drop):
        return h.drop()  # committed, but the answer is lost
    if h.pending_delay:
        h.pause(h.pending_delay)  # committed; the answer is late (a client may die waiting)
    h.send_json(200, batch_json(fake.org, result, fake.results_base))


def _envelope(h: Wire, max_body: int, max_requests: int) -> list[Any] | None:
    """The create body's requests, checked as the API checks the envelope at once; None once refused."""
    raw = h.read_body(max_body)
    if raw is None:
        h.send_body(413, b'{"error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}')
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        h.send_api_error(400, f"request body is not valid JSON: {exc}")
        return None
    if not isinstance(body, dict) or set(body) - {"requests"}:
        h.send_api_error(400, "requests: Field required" if not isinstance(body, dict) or "requests" not in body
                         else f"{sorted(set(body) - {'requests'})[0]}: Extra inputs are not permitted")
        return None
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        h.send_api_error(400, "requests: List should have at least 1 item after validation")
        return None
    if len(requests) > max_requests:
        h.send_api_error(400, f"requests: List should have at most {max_requests} items after validation")
        return None
    return requests


def _queue_full(h: Wire, limit: int) -> None:
    """The 429 of a full queue (its retry-after in simulated seconds, sent as the real seconds a client waits)."""
    cfg = h.server.fake.config
    headers = {}
    if cfg.queue_retry_after is not None:
        real = cfg.queue_retry_after / cfg.speed if cfg.speed > 0 else cfg.queue_retry_after
        headers["retry-after"] = str(max(1, math.ceil(real)))
    h.send_api_error(429, cfg.queue_message.format(limit=limit), headers=headers)


def _visible(h: Wire, workspace: str, batch_id: str | None) -> FakeBatch | None:
    """The batch, or None after answering 404: unknown, or inside a window where the real API was seen to 404 (after a create, after an end)."""
    fake = h.server.fake
    cfg = fake.config
    b = fake.org.get(workspace, batch_id or "")
    lagging = b is not None and (fake.org.clock() - b.created_wall < cfg.not_found_after_create
                                 or fake.org.since_end(b) < cfg.results_not_found_after_end)
    if b is None or lagging:
        h.send_api_error(404, "The requested resource could not be found.")
        return None
    return b


def retrieve(h: Wire, workspace: str, batch_id: str | None) -> None:
    b = _visible(h, workspace, batch_id)
    if b is not None:
        h.send_json(200, batch_json(h.server.fake.org, b, h.server.fake.results_base))


def list_batches(h: Wire, workspace: str, _: str | None) -> None:
    fake = h.server.fake
    q = parse_qs(urlsplit(h.path).query)
    try:
        limit = int((q.get("limit") or ["20"])[0])
    except ValueError:
        return h.send_api_error(400, "limit: Input should be a valid integer")
    if not 1 <= limit <= 1000:
        return h.send_api_error(400, "limit: Input should be between 1 and 1000")
    lag = fake.config.listing_lag
    batches = [b for b in fake.org.listing(workspace) if fake.org.clock() - b.created_wall >= lag]
    after, before = (q.get("after_id") or [""])[0], (q.get("before_id") or [""])[0]
    if after and before:  # (a page runs one way from one cursor: the API refuses both)
        return h.send_api_error(400, BOTH_CURSORS)
    ids = [b.id for b in batches]
    if after:
        if after not in ids:
            return h.send_api_error(400, f"after_id: unknown batch {after}")
        start = ids.index(after) + 1
        page = batches[start:start + limit]
        has_more = start + limit < len(batches)
    elif before:
        if before not in ids:
            return h.send_api_error(400, f"before_id: unknown batch {before}")
        end = ids.index(before)
        page = batches[max(0, end - limit):end]
        has_more = end - limit > 0
    else:
        page = batches[:limit]
        has_more = limit < len(batches)
    data = [batch_json(fake.org, b, fake.results_base) for b in page]
    h.send_json(200, {"data": data, "has_more": has_more, "first_id": data[0]["id"] if data else None,
                     "last_id": data[-1]["id"] if data else None})


def cancel(h: Wire, workspace: str, batch_id: str | None) -> None:
    h.read_body()
    b = _visible(h, workspace, batch_id)
    if b is None:
        return
    fake = h.server.fake
    if not fake.org.cancel(b) and fake.config.cancel_ended == "error":
        return h.send_api_error(400, "Message batch has already ended and cannot be canceled.")
    h.send_json(200, batch_json(fake.org, b, fake.results_base))


def delete(h: Wire, workspace: str, batch_id: str | None) -> None:
    b = _visible(h, workspace, batch_id)
    if b is None:
        return
    if not h.server.fake.org.delete(b):
        return h.send_api_error(400, "Message batches can only be deleted once they have finished processing.")
    h.send_json(200, {"id": b.id, "type": "message_batch_deleted"})


def results(h: Wire, workspace: str, batch_id: str | None) -> None:
    b = _visible(h, workspace, batch_id)
    if b is None:
        return
    fake = h.server.fake
    if fake.config.results_redirect and fake._other is not None:
        host, port = fake._other.server_address[:2]
        return h.send_body(307, b"", {"location": f"http://localhost:{port}/signed/{b.id}?sig=fake-signature"})
    _stream_results(h, b)


def results_other_origin(h: Wire, endpoint: str, batch_id: str | None) -> None:
    """The other origin: the API's own host behind a gateway (any call is a bypass) or a signed-link store."""
    fake = h.server.fake
    if fake.config.results_origin == "gateway" or fake.config.google is not None:
        with fake.org.lock:
            fake.org.records.bypass_calls += 1
        return h.send_api_error(401, "invalid x-api-key")  # the real host does not know the gateway's key
    if h.api_key():
        with fake.org.lock:
            fake.org.records.wrong_origin_keys += 1
    signed = _SIGNED_PATH.match(urlsplit(h.path).path)
    b = fake.org.batches.get(batch_id or "") if signed else None
    if b is None:
        return h.send_api_error(404, "The requested resource could not be found.")
    _stream_results(h, b)


def _stream_results(h: Wire, b: FakeBatch) -> None:
    fake = h.server.fake
    if b.status != "ended" or b.results is None:
        return h.send_api_error(404, "results are not available until the batch has ended")
    if fake.org.archived(b) or b.results_lost:
        return h.send_api_error(404, "results are no longer available for this batch")
    if h.injected("results_stream"):
        return
    with fake.org.lock:
        n = fake.org.records.downloads.get(b.id, 0)
        fake.org.records.downloads[b.id] = n + 1
    cfg = fake.config
    damage = cfg.damage[n % len(cfg.damage)] if n < cfg.damaged_downloads and cfg.damage else None
    if fake.cut_results_after is not None:
        damage, fake.cut_results_after = "reset", None
    h.send_response(200)
    h.send_header("request-id", h.request_id())
    h.send_header("content-type", "application/x-jsonl")
    h.send_header("transfer-encoding", "chunked")
    h.end_headers()
    lines = _result_lines(h, b)
    if damage == "short":
        lines = lines[: max(0, len(lines) - max(1, len(lines) // 10))]  # a clean end, lines missing
    elif damage == "half_line":
        lines[-1] = lines[-1][: len(lines[-1]) // 2]  # the last line torn, then a clean end
    elif damage == "reset":
        _chunk(h, b"".join(lines[: len(lines) // 2]))
        return h.drop()  # the connection dies midway
    _send_lines(h, lines)


def _result_lines(h: Wire, b: FakeBatch) -> list[bytes]:
    """Every result line, in a shuffled order (the API does not keep request order)."""
    assert b.results is not None
    fake = h.server.fake
    answer = ("All done. " * (fake.config.answer_bytes // 10 + 1))[: fake.config.answer_bytes]
    order = list(range(len(b.results)))
    random.Random(b.id).shuffle(order)
    out = []
    for i in order:
        cid, outcome = b.results[i]
        prompt = b.prompts[i] if b.prompts else None
        result = _result_json(outcome, cid, b.requests[i][1], answer, prompt, b.usage.get(i),
                              b.outputs[i] if b.outputs else OUTPUT_TOKENS)
        if fake.config.usage == "none" and "message" in result:
            del result["message"]["usage"]
        out.append(orjson.dumps({"custom_id": cid, "result": result}) + b"\n")
    return out


def _send_lines(h: Wire, lines: list[bytes]) -> None:
    buf: list[bytes] = []
    size = 0
    for line in lines:
        buf.append(line)
        size += len(line)
        if size >= 1 << 18:
            _chunk(h, b"".join(buf))
            buf, size = [], 0
            if h.server.fake.config.results_chunk_delay:
                h.pause(h.server.fake.config.results_chunk_delay)
    if buf:
        _chunk(h, b"".join(buf))
    h.wfile.write(b"0\r\n\r\n")


def _chunk(h: Wire, data: bytes) -> None:
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _refused_markers(params: dict[str, Any]) -> str | None:
    """The API's refusal of a request's cache markers, as an errored line at processing (the fake's own reading
    of the docs, apart from gatekeeper's check): more than 4, or a 1h one after a 5m one."""
    lives = []
    system = params.get("system")
    blocks: list[Any] = [*(params.get("tools") or []), *(system if isinstance(system, list) else [])]
    for m in params.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            blocks += m["content"]
    for b in blocks:
        if isinstance(b, dict) and isinstance(b.get("cache_control"), dict):
            lives.append(b["cache_control"].get("ttl", "5m"))
    if len(lives) > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {len(lives)}."
    if "5m" in lives and "1h" in lives[lives.index("5m"):]:
        return "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
    return None

