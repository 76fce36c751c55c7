"""Measured input tokens: `count_tokens` on a small, reproducible sample of requests per model.

Bytes / 4 is a rough rule (within about +-30% for English prose, far off for code,
JSON or other scripts). A few dozen requests per model, counted by
`POST /v1/messages/count_tokens` (free, with its own rate limit), give each model's
tokens per byte of request JSON; the estimate is that ratio of sums times the
model's bytes, reported with the sample size and the spread of the per-request
ratios. The sample is read at seeded random byte offsets of the file (no extra
pass over millions of lines), so the same file always gives the same sample; a
file of at most 4 MB is read whole instead.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from .._clock import run_sync
from .._errors import AccountRefused, ApiError, TransportError, Unreachable, first_of_group
from ..api._client import ApiClient
from ..api._reads import count_tokens

SAMPLE_PER_MODEL = 50
MAX_SAMPLE_LINES = 20_000  # random lines read at most, all models together
MAX_SAMPLE_BYTES = 64 << 20  # bytes those sampled lines read at most: a file of few, huge lines cannot stall sampling
WHOLE_FILE_BYTES = 4 << 20  # a file this small is read whole (a few ms) rather than probed
CONCURRENCY = 8  # count_tokens calls in flight at once
# What count_tokens takes of a batch request's params: the prompt, not the sampling settings or max_tokens.
COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking")


def count_body(params: dict[str, Any]) -> dict[str, Any]:
    """The count_tokens body of a request's params. Pure."""
    return {k: params[k] for k in COUNTED if k in params}


def pick_samples(path: str, models: Iterable[str], per_model: int = SAMPLE_PER_MODEL, seed: int = 0,
                 max_lines: int = MAX_SAMPLE_LINES, max_bytes: int = MAX_SAMPLE_BYTES) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Up to `per_model` requests of each model, as (bytes, params), from lines at seeded random offsets; at most
    `max_lines` lines, and never more bytes than `max_bytes` or one read of the file (a line sampled inside a
    multi-megabyte line reads to its end)."""
    wanted = set(models)
    picked: dict[str, list[tuple[int, dict[str, Any]]]] = {m: [] for m in wanted}
    size = os.path.getsize(path)
    rng = random.Random(seed)
    if size <= WHOLE_FILE_BYTES:
        return _reservoirs(path, picked, per_model, rng)
    seen: set[int] = set()
    read = 0
    with open(path, "rb") as f:
        for _ in range(max_lines if size else 0):
            if all(len(v) >= per_model for v in picked.values()) or read > min(max_bytes, size):  # at most one read
                break
            at = rng.randrange(size)
            f.seek(at)
            f.readline()  # to the next line start
            start = f.tell()
            if start >= size:  # past the last line: the first comes next (else no probe could ever pick it)
                start = 0
                f.seek(0)
            line = f.readline().strip()
            read += f.tell() - at if f.tell() > at else f.tell()
            if not line or start in seen:
                continue
            seen.add(start)
            params = _params(line)
            model = params.get("model") if params else None
            if params and model in wanted and len(picked[model]) < per_model:
                picked[model].append((len(line), params))
    return picked


def _reservoirs(path: str, picked: dict[str, list[tuple[int, dict[str, Any]]]], per_model: int,
                rng: random.Random) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """A small file read whole: each model's sample drawn uniformly from all its lines (reservoir sampling).

    Random offsets would keep landing on lines already taken, up to `max_lines` times, for any model with fewer
    lines than the sample (every model of a small file)."""
    seen = dict.fromkeys(picked, 0)
    with open(path, "rb") as f:
        for raw in f:
            line = raw.strip()
            params = _params(line) if line else None
            model = params.get("model") if params else None
            if params is None or model not in seen:
                continue
            seen[model] += 1
            rows = picked[model]
            if len(rows) < per_model:
                rows.append((len(line), params))
            elif (k := rng.randrange(seen[model])) < per_model:
                rows[k] = (len(line), params)
    return picked


def _params(line: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    params = obj.get("params") if isinstance(obj, dict) else None
    return params if isinstance(params, dict) else None


@dataclass(frozen=True)
class ModelTokens:
    sample: int  # requests counted
    tokens_per_byte: float  # ratio of sums over the sample
    spread: tuple[float, float]  # the lowest and highest per-request ratio

    def to_json(self) -> dict[str, Any]:
        return {"sample": self.sample, "tokens_per_byte": round(self.tokens_per_byte, 5),
                "spread": [round(self.spread[0], 5), round(self.spread[1], 5)]}


def measured_tokens(counted: list[tuple[int, int]]) -> ModelTokens | None:
    """(bytes, tokens) pairs -> the model's ratio. Pure."""
    counted = [(b, t) for b, t in counted if b > 0]
    if not counted:
        return None
    ratios = [t / b for b, t in counted]
    return ModelTokens(len(counted), sum(t for _, t in counted) / sum(b for b, _ in counted), (min(ratios), max(ratios)))


async def calibrate(api: ApiClient, path: str, models: Iterable[str], per_model: int = SAMPLE_PER_MODEL) -> dict[str, Any]:
    """Tokens per byte per model, measured; {"measured": False, "reason": ...} when count_tokens cannot be used."""
    out: dict[str, Any] = {}
    try:
        # (off the event loop: reading the probes takes a while, and signals and heartbeats must go on meanwhile)
        picked = await run_sync(lambda: pick_samples(path, models, per_model), abandon_on_cancel=True)
        for model, rows in picked.items():
            result = measured_tokens(await _count_all(api, rows))
            if result is not None:
                out[model] = result.to_json()
    except AccountRefused:
        raise  # (the account's state: `plan` stops on it as every command does)
    except (ApiError, TransportError, Unreachable) as exc:
        return {"measured": False, "reason": f"count_tokens could not be used ({exc})"}
    return {"measured": True, "per_model": per_model, "models": out}


async def _count_all(api: ApiClient, rows: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, int]]:
    """(bytes, tokens) of each sampled request, CONCURRENCY calls at a time; the first failure is raised."""
    counted: list[tuple[int, int]] = []
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def one(nbytes: int, params: dict[str, Any]) -> None:
        async with limiter:
            counted.append((nbytes, await count_tokens(api, count_body(params))))

    with first_of_group():
        async with anyio.create_task_group() as tg:
            for nbytes, params in rows:
                tg.start_soon(one, nbytes, params)
    return counted
