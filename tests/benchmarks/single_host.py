"""One job on one machine, as most users run it, through the lost create answers of issue 58: judged and timed.

Usage: python tests/benchmarks/single_host.py [--scenario lost|gateway|const3|noisy|all] [--runs N]
                                              [--requests N] [--kills N] [--lose P] [--ledger host|none|URL]
                                              [--seed S]

`gatekeeper submit` runs as a process of its own (rerun after each kill, as a user reruns the same command)
against the project's fake over HTTP, in a state folder of its own (GATEKEEPER_HOME: its own host ledger). The
scenarios, at the issue's sizes by default (batches of 5,000; new batches reach the listing a second late):

- lost:    120,000 requests, a quarter of create answers lost, kill -9 at staggered moments (6 a run), the same
           command rerun until it ends; 12 runs;
- gateway: the same behind a gateway whose usage is a constant (`const:10`);
- const3:  40,000 requests, constant usage, 3 create answers lost, no kill; 3 runs;
- noisy:   30,000 requests, usage = count x (1 +- 4%) drawn per prompt, a quarter of create answers lost; 3 runs.

A run passes when its last command exits 0 and every request has its own succeeded answer in the output, once
(none kept apart as unproven), none answered twice and none created in two batches (the fake's records).
`--ledger none` runs the same without a ledger (ownership after a lost answer then rests on usage alone).
Prints one line a run and one a scenario; exits 1 when a run fails.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import orjson

from gatekeeper.testing import FakeAPI, FakeConfig, Fault, prompt_of

SCENARIOS = {  # name: (requests, share of create answers lost, lost answers by count, usage, kills a run, runs)
    "lost": (120_000, 0.25, 0, "count", 6, 12),
    "gateway": (120_000, 0.25, 0, "const:10", 6, 12),
    "const3": (40_000, 0.0, 3, "const:10", 0, 3),
    "noisy": (30_000, 0.25, 0, "noisy:0.04", 0, 3),
}
BATCH = 5_000
FLAGS = ["--json", "--interval", "1", "--max-requests", str(BATCH), "--reconcile-grace", "30", "--token-sample", "2"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    ap.add_argument("--runs", type=int, default=None, help="runs a scenario (default: the issue's)")
    ap.add_argument("--requests", type=int, default=None, help="requests a job (default: the issue's)")
    ap.add_argument("--kills", type=int, default=None, help="kills a run (default: the issue's)")
    ap.add_argument("--lose", type=float, default=None, help="the share of create answers lost (default: the issue's)")
    ap.add_argument("--ledger", default=None, help="submit's --ledger (default: none given, the host's)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    failed = 0
    for name in SCENARIOS if a.scenario == "all" else [a.scenario]:
        n, share, count, usage, kills, runs = SCENARIOS[name]
        n, kills, runs = a.requests or n, kills if a.kills is None else a.kills, a.runs or runs
        share = share if a.lose is None else a.lose
        results = [run(name, n, share, count, usage, kills, a.seed + k, a.ledger) for k in range(runs)]
        good = [r for r in results if r["ok"]]
        failed += len(results) - len(good)
        spans = [r["seconds"] for r in results]
        print(f"{name}: {len(good)} of {runs} runs exit 0 with every answer in place and nothing twice "
              f"({n:,} requests, usage {usage}, {share:.0%} of create answers lost, {kills} kills a run, ledger "
              f"{a.ledger or 'host (default)'}); "
              f"wall time median {statistics.median(spans):.1f} s, max {max(spans):.1f} s; lost create answers "
              f"{sum(r['lost'] for r in results)}, answers kept apart {sum(r['apart'] for r in results):,}", flush=True)
    sys.exit(1 if failed else 0)


def _write(path: str, n: int, rng: random.Random) -> dict[str, str]:
    """n requests with prompts of widely spread length (5 to 400 characters); each id's prompt digest."""
    digests = {}
    with open(path, "wb") as f:
        for i in range(n):
            params = {"model": "claude-haiku-4-5-20251001", "max_tokens": 16,
                      "messages": [{"role": "user", "content": f"row {i}: " + "x" * rng.randint(5, 400)}]}
            digests[f"r{i}"] = prompt_of(params)[1]
            f.write(orjson.dumps({"custom_id": f"r{i}", "params": params}) + b"\n")
    return digests


def run(name: str, n: int, share: float, count: int, usage: str, kills: int, seed: int, ledger: str | None) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "in.jsonl")
        digests = _write(path, n, rng)
        config = FakeConfig(usage=usage, lost_creates=share, seed=seed, listing_lag=1.0, not_found_after_create=0.5)
        with FakeAPI(config) as fake:
            if count:  # (spread over the job: the 2nd, 5th, 8th... create's answer lost)
                fake.inject(*[Fault("create", "drop_after_commit", after=2 * k + 1) for k in range(count)])
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_"))}
            env.update(ANTHROPIC_BASE_URL=fake.url, ANTHROPIC_API_KEY="test-key-ws1",
                       ANTHROPIC_ADMIN_KEY="test-admin-key", GATEKEEPER_HOME=os.path.join(work, "home"))
            flags = [*FLAGS, *(["--ledger", ledger] if ledger else [])]
            started = time.monotonic()
            code, killed, summary = _until_done(path, flags, env, kills, rng)
            seconds = time.monotonic() - started
            records = fake.org.records
            twice = sum(1 for k in records.answered.values() if k > 1) + records.succeeded_twice
            created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
            lost = records.lost_answers + count
        verdict = _judged(code, summary, digests, twice, len(created) - len(set(created)))
    print(f"  {name} run {seed}: exit {code} after {killed} kills, {seconds:.1f} s; {verdict['text']}; creates "
          f"{records.creates} ({lost} answers lost); adoptions {summary.get('adoptions')}", flush=True)
    return {**verdict, "seconds": seconds, "lost": lost}


def _judged(code: int, summary: dict, digests: dict[str, str], twice: int, created_twice: int) -> dict:
    """Every request its own succeeded answer, once; none kept apart; nothing answered or created twice."""
    if "output" not in summary:
        return {"ok": False, "apart": 0, "text": f"no summary: {summary.get('stderr', '')[-500:]}"}
    with open(summary["output"], "rb") as f:
        lines = [orjson.loads(x) for x in f]
    finals = collections.Counter(x["custom_id"] for x in lines)
    mine = sum(1 for x in lines if x["result"]["type"] == "succeeded"
               and x["result"]["message"]["id"] == "msg_" + digests.get(x["custom_id"], ""))
    apart = sum(1 for x in lines if x["result"]["type"] == "errored"
                and x["result"]["error"]["error"]["type"] == "gatekeeper_unproven")
    once = len(finals) == len(digests) and set(finals.values()) == {1}
    ok = code == 0 and once and mine == len(digests) and not (apart or twice or created_twice)
    return {"ok": ok, "apart": apart, "text": f"answers in place {mine:,} of {len(digests):,}, kept apart {apart:,}, "
                                               f"answered twice {twice}, created twice {created_twice}"}


def _until_done(path: str, flags: list[str], env: dict[str, str], kills: int,
                rng: random.Random) -> tuple[int, int, dict]:
    """The same command until it ends, SIGKILLed `kills` times first at staggered moments (0.5-8 s into a run)."""
    killed = 0
    while True:
        proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "submit", path, *flags], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if killed < kills:
            try:
                proc.wait(timeout=rng.uniform(0.5, 8.0))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                killed += 1
                continue
        out, err = proc.communicate(timeout=3600)
        try:
            return proc.returncode, killed, orjson.loads(out)
        except orjson.JSONDecodeError:
            return proc.returncode, killed, {"stderr": err.decode()[-2000:]}


if __name__ == "__main__":
    main()
