"""Small builders shared by the tests."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson


def req(cid: str, model: str = "claude-haiku-4-5-20251001", text: str | None = None, **params: Any) -> dict[str, Any]:
    """A request; its prompt by default "Hello" and a tail whose length follows the custom_id (0 to 399 characters),
    as real prompts differ in length: a batch found by listing after a lost create can then be proven ours by its
    usage (identical prompts prove nothing, and their answers would be kept apart)."""
    if text is None:
        text = "Hello" + " " * bool(tail := _tail(cid)) + "x" * tail
    return {
        "custom_id": cid,
        "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **params},
    }


def _tail(cid: str) -> int:
    return int.from_bytes(hashlib.blake2b(cid.encode(), digest_size=4).digest(), "big") % 400


def write_jsonl(path: Path, items: list[dict[str, Any] | bytes]) -> Path:
    with open(path, "wb") as f:
        for item in items:
            f.write((item if isinstance(item, bytes) else orjson.dumps(item)) + b"\n")
    return path
