"""Time `gatekeeper report` (HTML and --json) on the journal of a finished run of a million requests.

Usage: python tests/benchmarks/bench_report.py [--requests 1000000] [--batches 10]

The journal is built directly (a plan, every batch created and collected with its results rows, a queue reading
every 30 s over 24 hours), so the figure is the report's own cost, not a run's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gatekeeper.state._journal import JobPlan, Journal


def build(state: Path, requests: int, batches: int) -> None:
    j = Journal.open(state)
    per = requests // batches
    j.start_job(JobPlan(
        input={"path": "/data/night.jsonl", "size": requests * 1400, "mtime_ns": 0, "sha256": "0" * 64},
        settings={"batch_size": per, "max_bytes": 256_000_000, "max_attempts": 3},
        report={"requests": requests, "invalid": 0, "lines": requests, "models": {"claude-sonnet-5": requests}},
        output=str(state / "results.jsonl"),
        batches=[(b, per, per * 1400, b * per + 1, (b + 1) * per, 0, 0, "a", "b") for b in range(batches)],
        rejections=[]))
    t0 = time.time() - 86_400
    for k in range(2880):
        j.outcomes.record_reading(t0 + 30 * k, (k * 7919) % 400_000, 500_000, (k * 104_729) % 300_000)
    pos = 0
    for b in range(batches):
        j.mark_intent(b, t0 + b * 8000)
        j.mark_created(b, f"msgbatch_{b:024d}", None)
        j.mark_ended(b, None, {"succeeded": per})
        with j.settling(b) as s:
            for i in range(b * per, (b + 1) * per):
                s.final(i + 1, f"r{i}", "succeeded", None, 1, pos, 100, ("claude-sonnet-5", 25, 12, 0, 0, 0))
                pos += 100
            s.committed = pos
    j.close()
    (state / "results.jsonl").write_bytes(b"")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=10)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        t = time.perf_counter()
        build(state, a.requests, a.batches)
        print(f"journal of {a.requests:,} results built in {time.perf_counter() - t:.1f} s")
        for extra in ([], ["--json"]):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gatekeeper", "report", "--state", str(state), *extra],
                           check=True, capture_output=True)
            print(f"gatekeeper report {' '.join(extra) or '(HTML)'}: {time.perf_counter() - t:.2f} s")
        print(f"report.html: {(state / 'report.html').stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
