"""A download's own work on result lines, before and after they became types: the stream cut into lines, each line
decoded, and what a job reads of it (custom_id, the result's type, model, stop reason, usage), in one process, in
turns, with no HTTP and no disk.

Usage: python tests/benchmarks/bench_result_lines.py [--lines 100000] [--answer-bytes 10000] [--repeat 5]

"before" is the path as it was (commit 8ca5fa8): `bytes.split` on each 64 KB chunk, then `orjson.loads` of the whole
line and `dict.get`s; "after" is the path the download takes now (`api._client._lines`' way of cutting, by `find`,
and `decide._settle.read_line`, which skips the answer's text). Prints MB/s of each and their ratio (best of
--repeat, and the median of the pairs run back to back); and "floor", the same cutting with each line decoded into a
struct of no fields (msgspec reads every byte to find where the line's values end, and keeps nothing): the most
that "after" could gain through this decoder with no other work a line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator

import msgspec
import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gatekeeper.decide._settle import read_line, stop_of, usage_of

CHUNK = 65_536  # as httpx's aiter_bytes hands a streamed body over


def results(n: int, answer: int) -> bytes:
    text = ("All good here. " * (answer // 15 + 1))[:answer]
    lines = [orjson.dumps({"custom_id": f"r-{i:07d}", "result": {"type": "succeeded", "message": {
        "id": f"msg_{i:024d}", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 812, "output_tokens": 2_480, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0}}}}) for i in range(n)]
    return b"\n".join(lines) + b"\n"


def chunks(body: bytes) -> Iterator[bytes]:
    for at in range(0, len(body), CHUNK):
        yield body[at:at + CHUNK]


def before(body: bytes) -> int:
    """main at 8ca5fa8: split each chunk, `orjson.loads` every line, read the fields from dicts."""
    seen, tail = 0, b""
    for chunk in chunks(body):
        if tail:
            chunk = tail + chunk
        lines = chunk.split(b"\n")
        tail = lines.pop()
        for line in lines:
            line = line.strip()
            if line:
                obj = orjson.loads(line)
                result = obj.get("result")
                message = result.get("message") if isinstance(result, dict) else None
                usage = message.get("usage") if isinstance(message, dict) else None
                seen += bool(obj.get("custom_id")) + (result.get("type") == "succeeded") + bool(usage)
                seen += bool(message.get("stop_reason")) + bool(message.get("model"))
    return seen


def after(body: bytes) -> int:
    """Now: newlines found by `find`, each line copied once, decoded by `read_line` into types."""
    seen, held = 0, []
    for chunk in chunks(body):
        start, end = 0, chunk.find(b"\n")
        if end >= 0 and held:
            seen += _one(b"".join([*held, chunk[:end]]).strip())
            held = []
            start, end = end + 1, chunk.find(b"\n", end + 1)
        while end >= 0:
            line = chunk[start:end].strip()
            if line:
                seen += _one(line)
            start, end = end + 1, chunk.find(b"\n", end + 1)
        if start < len(chunk):
            held.append(chunk[start:])
    return seen


class _Nothing(msgspec.Struct):
    pass


_nothing = msgspec.json.Decoder(_Nothing)


def floor(body: bytes) -> int:
    """As `after`, each line decoded into a struct of no fields."""
    seen, held, decode = 0, [], _nothing.decode
    for chunk in chunks(body):
        start, end = 0, chunk.find(b"\n")
        if end >= 0 and held:
            decode(b"".join([*held, chunk[:end]]).strip())
            seen += 5
            held = []
            start, end = end + 1, chunk.find(b"\n", end + 1)
        while end >= 0:
            line = chunk[start:end].strip()
            if line:
                decode(line)
                seen += 5
            start, end = end + 1, chunk.find(b"\n", end + 1)
        if start < len(chunk):
            held.append(chunk[start:])
    return seen


def _one(line: bytes) -> int:
    cid, result = read_line(line)
    usage = usage_of(result)
    return bool(cid) + (result.type == "succeeded") + bool(usage[1]) + bool(stop_of(result)) + bool(usage[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--answer-bytes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    body = results(a.lines, a.answer_bytes)
    assert before(body) == after(body) == floor(body) == 5 * a.lines
    mb = len(body) / 1e6
    times: dict[str, list[float]] = {"before": [], "after": [], "floor": []}
    for _ in range(a.repeat):
        for name, fn in (("before", before), ("after", after), ("floor", floor)):
            t = time.perf_counter()
            fn(body)
            times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        print(f"{name:6s} {a.lines:,} lines, {mb:,.0f} MB: best {min(ts):.3f} s = {mb / min(ts):,.0f} MB/s")
    pairs = [b / f for b, f in zip(times["before"], times["after"], strict=True)]
    print(f"after is {min(times['before']) / min(times['after']):.2f}x as fast (best times); "
          f"median of pairs {statistics.median(pairs):.2f}x")
    print(f"floor: at most {min(times['before']) / min(times['floor']):.2f}x (best times) through this decoder; "
          f"median {statistics.median(b / f for b, f in zip(times['before'], times['floor'])):.2f}x")


if __name__ == "__main__":
    main()
