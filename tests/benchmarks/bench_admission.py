"""How well submit keeps the queue full: span from first create to last batch end, against N/R.

Usage: python tests/benchmarks/bench_admission.py [--quick]

The fake processes `rate` requests per simulated second organization-wide and its
clock runs `speed` times real time, so hours of queue run in seconds. The client is
the real CLI in a subprocess (`--interval` in real seconds). Three scenarios: a ceiling
four times the batch size and more; a 60,000 ceiling with 200,000 requests; no
ceiling known (no Admin key), above and below one batch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from make_requests import write  # noqa: E402

from gatekeeper.testing import FakeAPI, FakeConfig  # noqa: E402


def scenario(name: str, n: int, ceiling: int, rate: float, speed: float, *, admin: bool, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.jsonl")
        write(path, n, approx_bytes=300)
        cfg = FakeConfig(ceiling=ceiling, rate=rate, speed=speed, workspaces={"bench-key": "wrkspc_1"},
                         admin_keys={"bench-admin"}, answer_bytes=20)
        with FakeAPI(cfg) as fake:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
            env.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "bench-key"})
            if admin:
                env["ANTHROPIC_ADMIN_KEY"] = "bench-admin"
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "gatekeeper", "submit", path, "--json", "--interval", "0.05",
                                   "--reconcile-grace", "2", "--max-rpm", "60000", "--no-preflight", *extra],
                                  env=env, capture_output=True, text=True)
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                print(proc.stderr[-2000:])
                raise SystemExit(f"{name}: submit exited {proc.returncode}")
            r = fake.org.records
            span = (r.last_end_at or 0) - (r.first_create_at or 0)
            ideal = n / rate
            print(f"{name}: {n:,} requests, ceiling {ceiling:,}, rate {rate:,.0f}/s: span {span:,.0f} s simulated vs "
                  f"N/R {ideal:,.0f} s = {span / ideal:.3f}x; refusals {len(r.refusals)}; deepest queue "
                  f"{r.max_depth:,} (ceiling {ceiling:,}); batches {r.creates}; succeeded twice {r.succeeded_twice}; "
                  f"wall {wall:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller inputs")
    ap.add_argument("--only-unknown", action="store_true", help="just the no-ceiling scenario")
    a = ap.parse_args()
    k = 4 if a.quick else 1
    # Speeds are chosen so a batch takes seconds of real time to process: a create
    # (upload and parse of up to 30 MB) must not look slow on the compressed clock.
    if not a.only_unknown:
        scenario("known ceiling", 1_000_000 // k, 200_000, 1_000, 20, admin=True, extra=[])
        scenario("60k ceiling", 200_000 // k, 60_000, 500, 20, admin=True, extra=[])
    scenario("unknown ceiling", 400_000 // k, 200_000, 1_000, 20, admin=False, extra=[])
    # No ceiling known and the organization's below one batch: batches of 100,000 are re-cut until they fit.
    scenario("unknown ceiling below one batch", 200_000 // k, 60_000, 500, 20, admin=False, extra=[])


if __name__ == "__main__":
    main()
