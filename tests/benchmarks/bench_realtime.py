"""Benchmark the real-time lane: a job whose batch lane stalls, finished through the Messages API by its deadline.

Usage: python tests/benchmarks/bench_realtime.py [--requests 10000] [--rpm 6000] [--itpm N] [--otpm N]
       [--max-tokens 64] [--deadline 6m] [--deadline-slack 60] [--turnaround 3600] [--latency 0.02]

The fake's batch lane processes nothing; its real-time lane allows `--rpm` requests a minute per model (token
limits wide unless `--itpm`/`--otpm` are given, so requests are the binding limit), with its acceleration limit on
(whole requests: a 5 s window holding half a window's worth of the limit, or twice the window before, refuses the
next), each answer taking `--latency` seconds, and the Admin API gives those limits. `gatekeeper submit --deadline`
runs as a subprocess against it: its batches are created, wait with nothing done, and are canceled at their last
chance. Prints when the batches were canceled, the real-time lane's time from the first move to the last answer
against the ideal and against what the deadline keeper projected when it moved them, the same from the first call
the fake let through to the last (the pace alone, without the lane's start and its last commit), the whole run's
time, and the share of real-time calls answered 429. The ideal is the time a client would need that spent every bucket's capacity
at once and then every limit to the full: for each limit, what the job was charged on it less the bucket's
capacity, at the limit's rate; the longest of the three.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from gatekeeper.testing import FakeAPI, FakeConfig, FakeRealtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rpm", type=int, default=6_000)
    ap.add_argument("--deadline", default="6m")
    ap.add_argument("--deadline-slack", default="60")
    ap.add_argument("--turnaround", default="3600")
    ap.add_argument("--itpm", type=int, default=0)
    ap.add_argument("--otpm", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.02)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.jsonl"
        with open(path, "wb") as f:
            for i in range(args.requests):
                f.write(orjson.dumps({"custom_id": f"r-{i}", "params": {
                    "model": "claude-haiku-4-5-20251001", "max_tokens": args.max_tokens,
                    "messages": [{"role": "user", "content": f"Question {i}: what changed this quarter?"}]}}) + b"\n")
        lane = FakeRealtime(rpm=args.rpm, itpm=args.itpm or 100 * args.rpm * 100,
                            otpm=args.otpm or 100 * args.rpm * args.max_tokens, latency=args.latency)
        with FakeAPI(FakeConfig(rate=0.0, realtime=lane)) as fake:
            admitted = _timed(fake)
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
                   "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key-ws1",
                   "ANTHROPIC_ADMIN_KEY": "test-admin-key"}
            t0 = time.time()
            run = subprocess.run([sys.executable, "-m", "gatekeeper", "submit", str(path), "--deadline", args.deadline,
                                  "--deadline-slack", args.deadline_slack, "--turnaround", args.turnaround,
                                  "--interval", "1", "--json"], env=env, capture_output=True, text=True, check=False)
            total = time.time() - t0
            events = [orjson.loads(x) for x in run.stderr.splitlines() if x.startswith("{")]
            summary = orjson.loads(run.stdout)
            r = fake.realtime.records
            billed = fake.org.records.billed.values()
            tokens_in = sum(c[0] + c[2] + c[3] for c in billed)  # (input and cache writes: what the input limit counts)
            tokens_out = sum(c[1] for c in billed)
    report(args, lane, events, summary, r, tokens_in, tokens_out, total, run.returncode)
    if len(admitted) > 1:
        ideal = (args.requests - lane.rpm / 60) / lane.rpm * 60
        took = admitted[-1] - admitted[0]
        print(f"the fake let the first call through to the last in {took:.1f} s: {took / ideal:.2f}x the ideal")


def _timed(fake: FakeAPI) -> list[float]:
    """When the fake's real-time lane let each call through (its own clock)."""
    times: list[float] = []
    admit = fake.realtime.admit

    def timed(model: str, tokens: int, max_tokens: int) -> tuple[str | None, float, dict[str, str]]:
        why, wait, headers = admit(model, tokens, max_tokens)
        if why is None:
            times.append(time.monotonic())
        return why, wait, headers

    fake.realtime.admit = timed  # type: ignore[method-assign]
    return times


def report(args: argparse.Namespace, lane: FakeRealtime, events: list[dict], summary: dict, r: object, tokens_in: int,
           tokens_out: int, total: float, code: int) -> None:
    moves = [e for e in events if e["event"] == "to_realtime"]
    moved = [e["t"] for e in moves]
    answered = [e["t"] for e in events if e["event"] == "realtime_answered"]
    canceled = [e["t"] for e in events if e["event"] == "deadline_cancel"]
    ideal = max((args.requests - lane.rpm / 60) / lane.rpm * 60, (tokens_in - lane.itpm) / lane.itpm * 60,
                (tokens_out - lane.otpm) / lane.otpm * 60)
    lane_time = answered[-1] - moved[0] if moved and answered else float("nan")
    refused = r.limited + r.accelerated  # type: ignore[attr-defined]
    print(f"exit {code}; {summary['succeeded']:,} of {args.requests:,} succeeded; deadline met: "
          f"{summary['deadline']['met']}; lanes: {summary['lanes']['batch']['requests']:,} batch, "
          f"{summary['lanes'].get('realtime', {}).get('requests', 0):,} real time")
    print(f"batches canceled at {canceled[0]:.1f} s; first move to real time at {moved[0]:.1f} s" if canceled and moved
          else f"first move to real time at {moved[0]:.1f} s (no batch created)" if moved else "nothing moved")
    print(f"real-time lane: {lane_time:.1f} s for {args.requests:,} requests against an ideal of {ideal:.1f} s "
          f"({args.requests:,} requests, {tokens_in:,} input and {tokens_out:,} output tokens at {lane.rpm:,} RPM, "
          f"{lane.itpm:,} ITPM, {lane.otpm:,} OTPM): {lane_time / ideal:.2f}x")
    if moves and "lane_needs_s" in moves[-1]:
        print(f"projected by the deadline keeper at the last move: {moves[-1]['lane_needs_s']:.1f} s for the lane's "
              f"{sum(e['requests'] for e in moves):,} (took {answered[-1] - moved[-1]:.1f} s from then)")
    print(f"whole run: {total:.1f} s; real-time calls {r.calls:,}, answered 429: {refused:,} "  # type: ignore[attr-defined]
          f"({refused / max(1, r.calls):.2%}; {r.accelerated:,} for acceleration)")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
