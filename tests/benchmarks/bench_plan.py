"""Benchmark `plan` against a bare orjson loop, and its peak memory.

Usage: python tests/benchmarks/bench_plan.py [--requests 1000000] [--file /tmp/gk-bench-plan.jsonl] [--repeat 3]

Each measurement runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own. The bare loop, `plan` and
the one-process `plan` take turns, `--repeat` times, and the best time of each is compared.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BARE = """
import orjson, resource, sys, time
t = time.perf_counter()
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        orjson.loads(line)
        n += 1
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, n)
"""

PLAN = """
import resource, sys, time
import gatekeeper
from gatekeeper.input._parallel import auto_workers
t = time.perf_counter()
r = gatekeeper.plan(sys.argv[1], workers=auto_workers(sys.argv[1]))  # what `gatekeeper plan` does
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, r.requests,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""

SEQUENTIAL = PLAN.replace("workers=auto_workers(sys.argv[1])", "workers=None")


def run(code: str, path: str) -> tuple[float, int, int, int]:
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1]), int(out[2]), int(out[3]) if len(out) > 3 else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--file", default="/tmp/gk-bench-plan.jsonl")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from make_requests import write

    sizes = {}
    for n in (a.requests, a.requests * 2):
        path = f"{a.file}.{n}"
        if not os.path.exists(path):
            write(path, n)
        sizes[n] = (path, os.path.getsize(path))
    path, size = sizes[a.requests]
    # Interleaved, so that a slow spell of a shared machine hits both loops alike; the best of each is kept.
    bares, plans, seqs = [], [], []
    for _ in range(a.repeat):
        bares.append(run(BARE, path)[0])
        plans.append(run(PLAN, path))
        seqs.append(run(SEQUENTIAL, path)[0])
    bare, seq = min(bares), min(seqs)
    best = min(p[0] for p in plans)
    rss1 = max(p[1] for p in plans)
    worker_rss = max(p[3] for p in plans)
    rss2 = run(PLAN, sizes[a.requests * 2][0])[1]
    mb = size / 1e6
    print(f"file: {a.requests:,} requests, {mb:,.0f} MB")
    print(f"bare orjson loop: {bare:.2f} s  {mb / bare:,.0f} MB/s  {a.requests / bare:,.0f} lines/s")
    print(f"gatekeeper plan:  {best:.2f} s  {mb / best:,.0f} MB/s  {a.requests / best:,.0f} lines/s")
    print(f"plan / bare throughput: {bare / best:.0%} (one process: {mb / seq:,.0f} MB/s, {bare / seq:.0%});"
          f" pairwise: {' '.join(f'{b / p[0]:.0%}' for b, p in zip(bares, plans))}")
    print(f"plan peak RSS: {rss1 / 2**20:,.0f} MiB at {a.requests:,} requests, {rss2 / 2**20:,.0f} MiB at {2 * a.requests:,}"
          f" (each worker process: {worker_rss / 2**20:,.0f} MiB at most; parent + 2 workers:"
          f" {(rss1 + 2 * worker_rss) / 2**20:,.0f} MiB)")
    print(f"growth: {(rss2 - rss1) / a.requests:.1f} bytes per extra request")


if __name__ == "__main__":
    main()
