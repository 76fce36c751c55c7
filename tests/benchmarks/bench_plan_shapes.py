"""`gatekeeper plan` against a bare orjson loop on several input shapes, each a whole process (start-up included).

Usage: python tests/benchmarks/bench_plan_shapes.py [--requests 100000] [--repeat 9] [--shapes example,marked,...]
       [--baseline DIR]

Shapes (--requests lines each; the first five by default, the issue's):
- example: the bundled examples/requests.jsonl (short lines, some with a system prompt), repeated with fresh
  custom_ids;
- marked: a short system block marked for caching on every line (below every model's minimum cacheable length),
  compact and spaced JSON alternating, CRLF endings (about 1.5 KB);
- agent: two tools, and turns of text, tool_use and tool_result blocks (about 1.9 KB);
- media: an image (base64) and a document (a text source) beside a question (about 1.4 KB);
- oneline: one-line prompts, nothing else (about 140 bytes);
- rough: as marked, with a blank line every 1,000, 5% of lines with non-ASCII text, and 14 defective lines;
- plain: compact JSON, LF, ASCII, no markers (make_requests.py);
- cached: a long shared system prompt marked for caching (above the minimum), as a caching job writes it;
- spaced: every line as `json.dumps` writes it (", " and ": "), LF.

The bare loop is `python -c` reading the file line by line with `orjson.loads`; `plan` is `python -m gatekeeper plan
FILE --json` with its default workers (two, for a file over 8 MB on two cores); both are whole processes, start-up
included, run in turns --repeat times, with gatekeeper's bytecode compiled first (as `pip install` compiles it: where
PYTHONDONTWRITEBYTECODE is set, as on this project's machines, a module edited since a test last ran was compiled from
source on every run, 3-6 ms a module). Prints each shape's best times, their ratio, and the median of the ratios of
the pairs run back to back (on a shared, noisy machine the steadier figure), and the medians of their CPU times
(`plan`'s readers included): where other work holds a core, the wall time follows the CPU. With `--baseline DIR` (the
root of another checkout, e.g. `git archive COMMIT | tar -x -C DIR`), that tree's `plan` runs third in each turn,
and its figures are printed beside: a before and after in one run.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_requests import MODELS, WORDS, request  # noqa: E402

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


def _cached(i: int, rng: random.Random) -> bytes:
    obj = orjson.loads(request(i, rng))
    obj["params"]["system"] = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    return orjson.dumps(obj) + b"\n"


def _marked(i: int, rng: random.Random) -> bytes:
    obj = orjson.loads(request(i, rng))
    obj["params"]["system"] = [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}]
    return (json.dumps(obj, ensure_ascii=False).encode() if i % 2 else orjson.dumps(obj)) + b"\r\n"


TOOLS = [
    {"name": "get_order", "description": "Look up an order by its number and return its status, items and totals.",
     "input_schema": {"type": "object", "properties": {"order_id": {"type": "string", "description": "The order"}},
                      "required": ["order_id"]}},
    {"name": "refund", "description": "Refund an order in whole or in part.",
     "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
                      "required": ["order_id", "amount"]}},
]
IMAGE = base64.b64encode(bytes(range(256)) * 2).decode()


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _agent(i: int, rng: random.Random) -> bytes:
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Customer writes: " + _words(rng, 25)}]
    for t in range(2):
        tool = f"toolu_{i:08d}{t}"
        turns.append({"role": "assistant", "content": [
            {"type": "text", "text": "Let me check " + _words(rng, 6)},
            {"type": "tool_use", "id": tool, "name": "get_order", "input": {"order_id": f"A{i}-{t}"}}]})
        turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool, "content": _words(rng, 30)}]})
    return orjson.dumps({"custom_id": f"agent-{i:09d}", "params": {
        "model": MODELS[i % 3], "max_tokens": 1024, "tools": TOOLS, "tool_choice": {"type": "auto"}, "messages": turns}}) + b"\n"


def _media(i: int, rng: random.Random) -> bytes:
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}},
               {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": _words(rng, 40)},
                "title": f"Doc {i}"},
               {"type": "text", "text": "Compare the image with the document: " + _words(rng, 8)}]
    return orjson.dumps({"custom_id": f"media-{i:09d}", "params": {
        "model": MODELS[i % 3], "max_tokens": 512, "messages": [{"role": "user", "content": content}]}}) + b"\n"


def _oneline(i: int, rng: random.Random) -> bytes:
    return orjson.dumps({"custom_id": f"q{i}", "params": {
        "model": MODELS[i % 3], "max_tokens": 64, "messages": [{"role": "user", "content": "Name a " + rng.choice(WORDS)}]}}) + b"\n"


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
            if shape == "example":
                f.write(orjson.dumps({**examples[i % len(examples)], "custom_id": f"ex-{i:09d}"}) + b"\n")
            else:
                f.write(SHAPES[shape](i, rng))


SHAPES = {"marked": _marked, "agent": _agent, "media": _media, "oneline": _oneline, "rough": _rough,
          "plain": lambda i, rng: request(i, rng) + b"\n", "cached": _cached, "spaced": _spaced}


def timed(args: list[str], cpu: list[float], cwd: str = ROOT) -> float:
    """The wall time of a whole process; its CPU (its own and its waited children's: `plan`'s readers) to `cpu`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
                          env={k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")})
    if done.returncode not in (0, 1):  # (1: findings, as defective lines are)
        sys.exit(f"{args[:4]} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--shapes", default="example,marked,agent,media,oneline")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--baseline", help="another checkout's root, whose `plan` runs in turn beside (before and after)")
    a = ap.parse_args()
    import gatekeeper

    trees = [os.path.dirname(gatekeeper.__file__)] + ([os.path.join(a.baseline, "gatekeeper")] if a.baseline else [])
    subprocess.run([sys.executable, "-m", "compileall", "-q", *trees], check=True)
    for shape in a.shapes.split(","):
        path = os.path.join(a.dir, f"gk-plan-shape-{shape}-{a.requests}.jsonl")
        if not os.path.exists(path):
            write(shape, path, a.requests)
        bare: list[float] = []
        plan: list[float] = []
        bare_cpu: list[float] = []
        plan_cpu: list[float] = []
        base: list[float] = []
        base_cpu: list[float] = []
        for _ in range(a.repeat):
            bare.append(timed([sys.executable, "-c", BARE, path], bare_cpu))
            plan.append(timed([sys.executable, "-m", "gatekeeper", "plan", path, "--json"], plan_cpu))
            if a.baseline:  # (run from its root: `-m` imports the package found there first)
                base.append(timed([sys.executable, "-m", "gatekeeper", "plan", path, "--json"], base_cpu, a.baseline))
        mb = os.path.getsize(path) / 1e6
        ratios = sorted(p / b for b, p in zip(bare, plan))  # each pair run back to back: the machine's load shared
        print(f"{shape:>8}: {mb:6.0f} MB, bare {min(bare):5.2f} s, plan {min(plan):5.2f} s: best {min(plan) / min(bare):4.2f}x, "
              f"median of pairs {ratios[len(ratios) // 2]:4.2f}x; CPU {_median(plan_cpu) / _median(bare_cpu):4.2f}x "
              f"(medians {_median(plan_cpu):4.2f} s, {_median(bare_cpu):4.2f} s); load {os.getloadavg()[0]:.1f}", flush=True)
        if base:
            pairs = sorted(p / b for b, p in zip(bare, base))
            print(f"{'baseline':>8}: plan {min(base):5.2f} s: best {min(base) / min(bare):4.2f}x, median of pairs "
                  f"{pairs[len(pairs) // 2]:4.2f}x; CPU {_median(base_cpu) / _median(bare_cpu):4.2f}x (median "
                  f"{_median(base_cpu):4.2f} s)", flush=True)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    main()
