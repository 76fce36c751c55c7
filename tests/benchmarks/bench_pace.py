"""Benchmark the real-time lane's pace alone, in simulated time, against the fake's real-time lane: its buckets and
its acceleration rule (whole requests: a 5 s window holding half a window's worth of the limit, or twice the window
before, refuses the next call) on an injected clock, calls reaching it up to `--jitter` seconds unevenly late.

Usage: python tests/benchmarks/bench_pace.py [--jitter 0.02] [--latency 0.02] [--rpm N --requests N] [--seeds 1]

For each rate and size (or the one given), the time from the first call let through to the last against the ideal (the first second's
worth at once, then the limit to the full), what `lane_seconds` projects, and the fake's 429s; with `--seeds N`, over N draws of
the calls' lateness (the slowest, and every 429 of them). No machine's load
moves these figures (the lane's own costs are what `bench_realtime.py` measures over real HTTP).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from gatekeeper.decide._pacing import lane_seconds  # noqa: E402
from tests.pacing import against_the_fake  # noqa: E402

CASES = [(50, 30), (50, 100), (90, 40), (90, 200), (600, 1000), (4000, 1500), (4000, 2500), (6000, 10000)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jitter", type=float, default=0.02)
    ap.add_argument("--latency", type=float, default=0.02)
    ap.add_argument("--rpm", type=int, default=0)
    ap.add_argument("--requests", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    cases = [(args.rpm, args.requests)] if args.rpm and args.requests else CASES
    print(f"calls reach the fake up to {args.jitter * 1000:.0f} ms unevenly late; answers take {args.latency:g} s"
          + (f"; the slowest of {args.seeds} draws, and every 429 of them" if args.seeds > 1 else ""))
    for rpm, n in cases:
        took, limited, accelerated = 0.0, 0, 0
        for seed in range(1, args.seeds + 1):
            admitted, records = against_the_fake(rpm, n, jitter=args.jitter, latency=args.latency, seed=seed)
            took = max(took, admitted[-1] - admitted[0])
            limited, accelerated = limited + records.limited, accelerated + records.accelerated
        ideal = (n - rpm / 60) / (rpm / 60)
        print(f"{n:>6,} requests at {rpm:>5,} a minute: {took:7.1f} s against the ideal {ideal:7.1f} s: "
              f"{took / ideal:.2f}x; projected {lane_seconds(n, rpm / 60):7.1f} s; 429s {limited} for a limit, "
              f"{accelerated} for acceleration")


if __name__ == "__main__":
    main()
