"""Pipelines sharing one queue ceiling through one ledger: priorities and shares, against the fake as a process.

Usage: python tests/benchmarks/bench_shares.py [--ledger sqlite:///PATH | redis://... | postgresql://...]
                                               [--scenario alone|precedence|shares|night|all] [--speed N]

The fake's ceiling is 20,000 requests, its queue processed at 2,000 requests a second; batches of at most 5,000;
each pipeline in a workspace of its own (so none sees another's batches: only the ledger does). Prints each job's
span and the figures the issue asks for:
- alone: a 20,000-request job on its own (its "span alone");
- precedence: a 120,000-request backfill (--priority low) and, 6 s later, a 20,000-request nightly job
  (--priority high): the nightly's span against its span alone, and both against the ideal (all requests at the
  queue's rate);
- shares: two jobs of 60,000 started together with --share 3 and --share 1: the first's span over the second's;
- night: 40 minutes of a full queue (`tests/scenarios.py`, `two_jobs_a_night`): a low backfill of 3,000 and a minute
  later a high job of 9,000, a queue of 2,000 processed at 5 a second, one SQLite ledger, the whole world's clock (the
  fake's, the ledger's, the jobs') run `--speed` times faster (30): the span against the ideal, and the longest stretch
  with room for a waiting batch and no create. (Its own fake and ledger; `--ledger` does not apply.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.benchmarks.fake_process import start_fake
from tests.benchmarks.make_requests import write

CEILING, RATE, BATCH = 20_000, 2_000, 5_000
KEYS = ["bench-ws1", "bench-ws2"]
ADMIN = "bench-admin"


def fake() -> tuple[subprocess.Popen[str], str]:
    return start_fake("--simulated-ceiling", str(CEILING), "--rate", str(RATE), "--admin-key", ADMIN,
                      *[a for k in KEYS for a in ("--workspace-key", k)])


def job(tmp: Path, name: str, n: int, url: str, key: str, ledger: str, *extra: str) -> subprocess.Popen[str]:
    path = tmp / f"{name}.jsonl"
    write(str(path), n, seed=hash(name) % 1000, approx_bytes=400)
    env = {**os.environ, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "ANTHROPIC_ADMIN_KEY": ADMIN}
    args = [sys.executable, "-m", "gatekeeper", "submit", str(path), "--ledger", ledger, "--max-requests", str(BATCH),
            "--interval", "0.5", "--no-preflight", "--token-sample", "0", "--max-rpm", "60000", "--json", *extra]
    with open(tmp / f"{name}.log", "w") as log:  # (its events, for a job that fails)
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=log, text=True)


def span(proc: subprocess.Popen[str], started: float) -> tuple[float, dict]:
    out, _ = proc.communicate()
    took = time.monotonic() - started
    summary = json.loads(out) if out.strip() else {}
    if proc.returncode != 0:
        log = Path(str(proc.args[4]).replace(".jsonl", ".log")).read_text()  # type: ignore[index]
        sys.exit(f"a job exited {proc.returncode}: {out[-2000:]}\n{log[-3000:]}")
    return took, summary


def alone(tmp: Path, url: str, ledger: str) -> float:
    t0 = time.monotonic()
    took, _ = span(job(tmp, "nightly-alone", 20_000, url, KEYS[0], ledger, "--priority", "high"), t0)
    print(f"alone: a 20,000-request job ends in {took:.1f} s (ideal {20_000 / RATE:.0f} s)")
    return took


def precedence(tmp: Path, url: str, ledger: str, alone_s: float) -> None:
    t0 = time.monotonic()
    backfill = job(tmp, "backfill", 120_000, url, KEYS[0], ledger, "--priority", "low")
    time.sleep(6)
    t1 = time.monotonic()
    nightly = job(tmp, "nightly", 20_000, url, KEYS[1], ledger, "--priority", "high")
    n_took, n_sum = span(nightly, t1)
    b_took, b_sum = span(backfill, t0)
    ideal = 140_000 / RATE
    print(f"precedence: nightly (high, 6 s after) {n_took:.1f} s = {n_took / alone_s:.2f}x its span alone; "
          f"backfill (low) {b_took:.1f} s; both done at {max(b_took, n_took + 6):.1f} s = "
          f"{max(b_took, n_took + 6) / ideal:.2f}x the ideal {ideal:.0f} s; nightly waited "
          f"{(n_sum.get('shares') or {}).get('waited_s')} s for others, backfill "
          f"{(b_sum.get('shares') or {}).get('waited_s')} s")


def shares(tmp: Path, url: str, ledger: str) -> None:
    t0 = time.monotonic()
    three = job(tmp, "share3", 60_000, url, KEYS[0], ledger, "--share", "3")
    one = job(tmp, "share1", 60_000, url, KEYS[1], ledger, "--share", "1")
    t3, _ = span(three, t0)
    t1, _ = span(one, t0)
    print(f"shares: --share 3 ends in {t3:.1f} s, --share 1 in {t1:.1f} s: {t3 / t1:.2f}x (ideal of both "
          f"{120_000 / RATE:.0f} s)")


def night(tmp: Path, speed: float) -> None:
    import anyio

    from tests.scenarios import two_jobs_a_night

    t0 = time.monotonic()
    n = anyio.run(lambda: two_jobs_a_night(tmp, speed=speed, low=3000, high=9000))
    done = "both finished" if len(n.summaries) == 2 else "stopped at 3x the ideal, unfinished"
    print(f"night: {done} in {n.span / 60:.1f} simulated min = {n.span / n.ideal:.2f}x the ideal {n.ideal / 60:.0f} min; "
          f"longest stretch with room for a waiting batch and no create {n.stall / 60:.1f} min ({n.stall:.1f} s) "
          f"(at minute {n.stall_at / 60:.0f}); {time.monotonic() - t0:.0f} s of wall time at {speed:g}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledger", default=None)
    ap.add_argument("--scenario", default="all", choices=["alone", "precedence", "shares", "night", "all"])
    ap.add_argument("--speed", type=float, default=30.0, help="night: how much faster the world's clock runs")
    a = ap.parse_args()
    if a.scenario == "night":
        with tempfile.TemporaryDirectory() as tmp_s:
            night(Path(tmp_s), a.speed)
        return
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        ledger = a.ledger or f"sqlite:///{tmp / 'ledger.db'}"
        proc, url = fake()
        try:
            alone_s = alone(tmp, url, ledger) if a.scenario in ("alone", "precedence", "all") else 0.0
            if a.scenario in ("precedence", "all"):
                precedence(tmp, url, ledger, alone_s)
            if a.scenario in ("shares", "all"):
                shares(tmp, url, ledger)
        finally:
            proc.terminate()
        if a.scenario == "all":
            night(tmp, a.speed)


if __name__ == "__main__":
    main()
