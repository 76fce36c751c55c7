"""Results streaming end to end: fake API -> HTTP -> gatekeeper -> results file.

Usage: python tests/benchmarks/bench_results.py [--requests 100000] [--answer-bytes 10000]

One batch of N requests whose answers are --answer-bytes long (about 1 GB of
results by default). Reports the collection throughput (result bytes divided by
the time from the batch's end to its results being committed), the client's
peak RSS (the submit subprocess's ru_maxrss) and its CPU time (user and system, the whole job).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from make_requests import write  # noqa: E402

from gatekeeper.testing import FakeAPI, FakeConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--answer-bytes", type=int, default=10_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.jsonl")
        write(path, a.requests, approx_bytes=300)
        cfg = FakeConfig(ceiling=10_000_000, rate=1e9, workspaces={"bench-key": "wrkspc_1"}, answer_bytes=a.answer_bytes)
        with FakeAPI(cfg) as fake:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
            env.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "bench-key"})
            proc = subprocess.run([sys.executable, "-m", "gatekeeper", "submit", path, "--json", "--interval", "0.05",
                                   "--ceiling", "10000000"], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss, cpu = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
        evs = [orjson.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
        ended = min(e["t"] for e in evs if e["event"] == "ended")
        collected = max(e["t"] for e in evs if e["event"] == "collected")
        size = os.path.getsize(os.path.join(tmp, "in.jsonl.gatekeeper", "results.jsonl"))
        secs = collected - ended
        print(f"results: {a.requests:,} lines, {size / 1e6:,.0f} MB in {secs:.1f} s = {size / 1e6 / secs:,.0f} MB/s end to end")
        print(f"client peak RSS: {rss / 2**20:,.0f} MiB")
        print(f"client CPU: {cpu:.1f} s for the whole job ({size / 1e6 / cpu:,.0f} MB of results a CPU second; on a "
              "loaded machine the steadier figure: the fake's time and the waits are not in it)")


if __name__ == "__main__":
    main()
