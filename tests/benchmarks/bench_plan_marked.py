"""Benchmark `gatekeeper plan --json` on marked input against a bare orjson loop, start-up included in both.

Usage: python tests/benchmarks/bench_plan_marked.py [--requests 100000] [--file /tmp/gk-bench-marked.jsonl] [--repeat 7]
       [--shuffled]

The input: every request's system block carries `cache_control` (a document shared by six requests, about 1.5 KB
a line: 148 MB for 100,000), the case where `plan` walks each line's blocks for markers and prefixes. Each run is a
fresh process (`python -m gatekeeper plan FILE --json` against `python -c` of a bare loop that parses every line),
the two taking turns `--repeat` times, with gatekeeper's bytecode compiled first; prints each one's median and their
ratio, and how long two bare loops started at once take against one (how much of a second core the machine gave:
`plan`'s two workers need it). A document's six requests are
consecutive (the usual order); `--shuffled` writes them in a random order (seed 7) to /tmp/gk-bench-shuffled.jsonl,
where the reader's memory of the last line's walk never helps.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

import orjson

BARE = """
import orjson, sys
with open(sys.argv[1], "rb") as f:
    for line in f:
        orjson.loads(line)
"""


def write(path: str, n: int, shuffled: bool = False) -> None:
    order = list(range(n))
    if shuffled:
        random.Random(7).shuffle(order)
    with open(path, "wb") as f:
        for i in order:
            doc = f"document {i // 6}: " + "The quarterly filing states revenue, costs and risks. " * 24
            f.write(orjson.dumps({"custom_id": f"m-{i}", "params": {
                "model": "claude-sonnet-5", "max_tokens": 256,
                "system": [{"type": "text", "text": doc, "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": f"Question {i % 6} about this filing: what changed?"}]}}) + b"\n")


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--file", default="/tmp/gk-bench-marked.jsonl")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--shuffled", action="store_true")
    a = ap.parse_args()
    if a.shuffled and a.file == ap.get_default("file"):
        a.file = "/tmp/gk-bench-shuffled.jsonl"
    if not os.path.exists(a.file) or _lines(a.file) != a.requests:
        write(a.file, a.requests, a.shuffled)
    size = os.path.getsize(a.file) / 1e6
    import gatekeeper  # compiled as `pip install` compiles it (this machine may set PYTHONDONTWRITEBYTECODE)

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(gatekeeper.__file__)], check=True)
    bare, plan, pairs = [], [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    for _ in range(a.repeat):
        bare.append(timed([sys.executable, "-c", BARE, a.file], env))
        plan.append(timed([sys.executable, "-m", "gatekeeper", "plan", a.file, "--json"], env))
        pairs.append(together([sys.executable, "-c", BARE, a.file], 2, env))
    b, p, t = statistics.median(bare), statistics.median(plan), statistics.median(pairs)
    print(f"{a.requests:,} marked requests{' (shuffled)' if a.shuffled else ''} ({size:,.0f} MB): bare orjson loop "
          f"{b:.2f} s, plan --json {p:.2f} s (medians of {a.repeat}, start-up included): {p / b:.2f}x")
    print(f"two bare loops at once / one alone: {t / b:.2f}x the time (1.0 when the machine gives two whole cores, "
          "2.0 when it gives one; plan's workers need the two)")


def together(argv: list[str], n: int, env: dict[str, str]) -> float:
    """Seconds for `n` copies of a command started at once to all end."""
    t = time.perf_counter()
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env) for _ in range(n)]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - t

if __name__ == "__main__":
    main()
