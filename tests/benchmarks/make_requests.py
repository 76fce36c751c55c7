"""Write a JSONL of realistic batch requests (about 1.5 KB each).

Usage: python tests/benchmarks/make_requests.py OUT N [--seed S]
"""

from __future__ import annotations

import argparse
import random

import orjson

MODELS = ["claude-opus-4-6", "claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001"]
WORDS = ["invoice", "customer", "order", "shipment", "refund", "policy", "account", "address", "review", "product", "summary",
         "translate", "classify", "extract", "sentiment", "contract", "clause", "payment", "date", "total", "region", "category"]


def request(i: int, rng: random.Random, approx_bytes: int = 1500) -> bytes:
    text_len = max(20, approx_bytes - 330 + rng.randint(-200, 200))
    words: list[str] = []
    n = 0
    while n < text_len:
        w = rng.choice(WORDS)
        words.append(w)
        n += len(w) + 1
    return orjson.dumps(
        {
            "custom_id": f"req-{i:09d}",
            "params": {
                "model": MODELS[i % len(MODELS)],
                "max_tokens": 1024,
                "system": "You are a careful assistant for back-office document processing.",
                "temperature": 0.2,
                "messages": [{"role": "user", "content": "Summarize the following record: " + " ".join(words)}],
            },
        }
    )


def write(path: str, n: int, seed: int = 1, approx_bytes: int = 1500) -> int:
    rng = random.Random(seed)
    total = 0
    with open(path, "wb") as f:
        buf = []
        for i in range(n):
            line = request(i, rng, approx_bytes) + b"\n"
            total += len(line)
            buf.append(line)
            if len(buf) >= 10000:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))
    return total


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bytes", type=int, default=1500, help="approximate bytes per request")
    a = ap.parse_args()
    print(write(a.out, a.n, a.seed, a.bytes), "bytes written")
