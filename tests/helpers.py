"""Small builders shared by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def req(cid: str, model: str = "claude-haiku-4-5-20251001", text: str = "Hello", **params: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **params},
    }


def write_jsonl(path: Path, items: list[dict[str, Any] | bytes]) -> Path:
    with open(path, "wb") as f:
        for item in items:
            f.write((item if isinstance(item, bytes) else orjson.dumps(item)) + b"\n")
    return path
