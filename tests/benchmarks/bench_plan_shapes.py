"""`gatekeeper plan` against a bare orjson loop on several input shapes, each a whole process (start-up included).

Usage: python tests/benchmarks/bench_plan_shapes.py [--requests 100000] [--repeat 3] [--shapes rough,plain,...]

Shapes (each --requests lines of about 1.5 KB):
- rough: every line carries a cache_control marker on a short system block (below every model's minimum cacheable
  length), compact and spaced JSON mixed, CRLF endings, a blank line every 1,000, 5% of lines with non-ASCII text,
  14 defective lines;
- plain: compact JSON, LF, ASCII, no markers (make_requests.py);
- marked: a long shared system prompt marked for caching (above the minimum), as a caching job writes it;
- spaced: every line as `json.dumps` writes it (", " and ": "), LF;
- example: the bundled examples/requests.jsonl, repeated with fresh custom_ids.

The bare loop is `python -c` reading the file line by line with `orjson.loads`; `plan` is `python -m gatekeeper plan
FILE --json` with its default workers, run in turns --repeat times, with gatekeeper's bytecode compiled first (as
`pip install` compiles it: where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, a module edited since
a test last ran was compiled from source on every run, 3-6 ms a module). Prints each shape's best times, their ratio, and
the median of the ratios of the pairs run back to back (on a shared, noisy machine the steadier figure).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_requests import request  # noqa: E402

BARE = """
import orjson, sys
with open(sys.argv[1], "rb") as f:
    for line in f:
        if line.strip():
            try:
                orjson.loads(line)
            except orjson.JSONDecodeError:
                pass
"""
NON_ASCII = "Überprüfe die Rechnung für Größe und Maß; 請求書を確認してください; проверьте счёт "
LONG_SYSTEM = "You are a careful assistant for back-office document processing. " * 60


def _rough(i: int, rng: random.Random) -> bytes:
    obj = orjson.loads(request(i, rng))
    obj["params"]["system"] = [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}]
    if i % 20 == 7:
        obj["params"]["messages"][0]["content"] = NON_ASCII + obj["params"]["messages"][0]["content"]
    line = json.dumps(obj, ensure_ascii=False).encode() if i % 2 else orjson.dumps(obj)
    if i % 7142 == 11:  # (14 at 100,000)
        line = line[: len(line) // 2]
    return line + b"\r\n" + (b"\r\n" if i % 1000 == 999 else b"")


def _marked(i: int, rng: random.Random) -> bytes:
    obj = orjson.loads(request(i, rng))
    obj["params"]["system"] = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    return orjson.dumps(obj) + b"\n"


def _spaced(i: int, rng: random.Random) -> bytes:
    return json.dumps(orjson.loads(request(i, rng))).encode() + b"\n"


def _example_lines() -> list[dict]:
    with open(os.path.join(ROOT, "examples", "requests.jsonl"), "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]


def write(shape: str, path: str, n: int) -> None:
    rng = random.Random(7)
    examples = _example_lines() if shape == "example" else []
    with open(path, "wb") as f:
        for i in range(n):
            if shape == "rough":
                f.write(_rough(i, rng))
            elif shape == "marked":
                f.write(_marked(i, rng))
            elif shape == "spaced":
                f.write(_spaced(i, rng))
            elif shape == "example":
                f.write(orjson.dumps({**examples[i % len(examples)], "custom_id": f"ex-{i:09d}"}) + b"\n")
            else:
                f.write(request(i, rng) + b"\n")


def timed(args: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")})
    if done.returncode not in (0, 1):  # (1: findings, as defective lines are)
        sys.exit(f"{args[:4]} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shapes", default="rough,plain,marked,spaced,example")
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    import gatekeeper

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(gatekeeper.__file__)], check=True)
    for shape in a.shapes.split(","):
        path = os.path.join(a.dir, f"gk-shape-{shape}-{a.requests}.jsonl")
        if not os.path.exists(path):
            write(shape, path, a.requests)
        bare, plan = [], []
        for _ in range(a.repeat):
            bare.append(timed([sys.executable, "-c", BARE, path]))
            plan.append(timed([sys.executable, "-m", "gatekeeper", "plan", path, "--json"]))
        mb = os.path.getsize(path) / 1e6
        ratios = sorted(p / b for b, p in zip(bare, plan))  # each pair run back to back: the machine's load shared
        print(f"{shape:>8}: {mb:6.0f} MB, bare {min(bare):5.2f} s, plan {min(plan):5.2f} s: best {min(plan) / min(bare):4.2f}x, "
              f"median of pairs {ratios[len(ratios) // 2]:4.2f}x", flush=True)


if __name__ == "__main__":
    main()
