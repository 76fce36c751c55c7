"""The fake's prompt cache, as the Message Batches documentation on prompt caching describes it, never kinder.

Entries are kept per (workspace, prefix), the prefix digest covering the model and every block up to a marker
(tools, system, messages, in that order). A request processed at simulated time t reads the longest of its marked
prefixes that is live and visible to it (renewing that entry's life), and writes every longer one that reaches the
model's minimum. A write is visible only to requests processed after it: to another batch's requests processed
later, and to the same batch's requests of a later wave (by default a batch is one wave: its requests run
concurrently and never see each other's writes, which is what users measured on cold batches). A marked prefix below
the model's minimum is silently not cached.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

LIVES = {"5m": 300.0, "1h": 3600.0}  # simulated seconds


class CachePoint(NamedTuple):
    """One marked prefix of a request: its length in the fake's tokens, its digest and its life."""

    tokens: int
    digest: str
    life: str  # "5m" or "1h"


class Usage(NamedTuple):
    """What one processed request is billed for its prompt, by kind."""

    input: int
    write_5m: int
    write_1h: int
    read: int


def billed_as(usage: Usage, mode: str, prompt: str = "") -> Usage:
    """What the API bills for a prompt the fake's tokenizer counts at `usage` (its parts summing to the count), as
    `mode` says (`FakeConfig.usage`): "count" (as counted), "count-K" (K tokens fewer: tokens the API adds and does
    not bill), "scale:F" (F times the count), "const:N" (N for every request, as a gateway reporting usage of its own
    would), "noisy:P" (count x (1 ± P), drawn for each prompt: `count_tokens` is an estimate, off by a few percent
    with images, documents and tools; `prompt` is the prompt's digest) or "none" (as counted, but no usage is
    reported). Cache reads and writes keep their share."""
    total = usage.input + usage.write_5m + usage.write_1h + usage.read
    if mode in ("count", "none") or total == 0:
        return usage
    kind, _, arg = mode.replace("count-", "count:", 1).partition(":")
    billed = {"count": lambda: total - int(arg), "scale": lambda: round(total * float(arg)), "const": lambda: int(arg),
              "noisy": lambda: round(total * (1 + float(arg) * _draw(prompt)))}[kind]()
    billed = max(0, billed)
    share = billed / total
    w5, w1, read = int(usage.write_5m * share), int(usage.write_1h * share), int(usage.read * share)
    return Usage(billed - w5 - w1 - read, w5, w1, read)


def _draw(prompt: str) -> float:
    """A number in [-1, 1], the same for the same prompt (the estimate's error is the prompt's, not the call's)."""
    h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big")
    return h / (2**64 - 1) * 2 - 1


@dataclass
class Entry:
    expires: float
    at: float  # when it was written
    batch: str
    wave: int
    life: str


def cache_points(params: dict[str, Any], total: int) -> tuple[CachePoint, ...]:
    """The request's marked prefixes, shortest first (a request without markers has none).

    A block-level `cache_control` marks the prefix up to its block; the top-level one marks the whole prompt (its
    last block). Lengths follow the fake's tokenizer (`count_tokens`), capped at the prompt's total."""
    blocks = _blocks(params)
    h = hashlib.blake2b(str(params.get("model") or "").encode(), digest_size=10)
    points = []
    size = 0
    for block in blocks:
        data = orjson.dumps(block)
        h.update(data)
        size += len(data)
        marker = block.get("cache_control") if isinstance(block, dict) else None
        if isinstance(marker, dict):
            points.append(CachePoint(min(total, 7 + math.ceil(size / 3.3)), h.copy().hexdigest(), _life(marker)))
    top = params.get("cache_control")
    if isinstance(top, dict) and blocks and (not points or points[-1].tokens < total):
        points.append(CachePoint(total, h.hexdigest(), _life(top)))
    return tuple(points)


def _life(marker: dict[str, Any]) -> str:
    life = marker.get("ttl", "5m")
    return life if life in LIVES else "5m"


def _blocks(params: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    tools, system = params.get("tools"), params.get("system")
    out += tools if isinstance(tools, list) else []
    out += system if isinstance(system, list) else ([{"type": "text", "text": system}] if system else [])
    for m in params.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        out += content if isinstance(content, list) else [{"type": "text", "text": content, "role": m.get("role")}
                                                           if isinstance(m, dict) else m]
    return out


class PromptCache:
    """Every workspace's entries. Not thread-safe: the organization's lock guards it."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], Entry] = {}

    def serve(self, workspace: str, points: tuple[CachePoint, ...], total: int, minimum: int, t: float, batch: str,
              wave: int) -> Usage:
        """Read the longest visible live prefix, write the longer eligible ones; what the request is billed."""
        eligible = [p for p in points if p.tokens >= minimum]
        read = 0
        for p in reversed(eligible):
            e = self.entries.get((workspace, p.digest))
            if e is not None and e.expires > t and (e.at < t if e.batch != batch else e.wave < wave):
                e.expires = max(e.expires, t + LIVES[e.life])  # a hit renews the entry's life
                read = p.tokens
                break
        written = {"5m": 0, "1h": 0}
        edge = read
        for p in eligible:
            if p.tokens <= edge:
                continue
            written[p.life] += p.tokens - edge
            edge = p.tokens
            key = (workspace, p.digest)
            e = self.entries.get(key)
            if e is None or e.expires <= t:
                self.entries[key] = Entry(t + LIVES[p.life], t, batch, wave, p.life)
            else:  # written concurrently by another request: the earlier write stands, its life goes on
                e.expires = max(e.expires, t + LIVES[p.life])
        return Usage(total - read - written["5m"] - written["1h"], written["5m"], written["1h"], read)
