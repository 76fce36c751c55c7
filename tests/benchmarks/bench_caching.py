"""Prompt caching: a shuffled document-question job submitted primed (the default) and plain (--no-prime), each
against a fresh fake whose cache behaves as api.md section 15 says (a batch's requests never see each other's
writes), with a queue ceiling below the job.

Usage: python tests/benchmarks/bench_caching.py [--docs 400] [--questions 6] [--ceiling 1000] [--rate 25]
                                                [--speed 60] [--seed 3]

Each filing (about 1,900 of the fake's tokens) is asked `--questions` questions in a system block marked
`cache_control`, odd filings with the 1h life; 100 more requests mark a prefix below the minimum and 15 mark one the
API refuses (5 markers, or 1h after 5m). Prints, for each way: the reads as a share of the ideal (one write a shared
prefix, every other use a read), the bill the fake recorded and the summary's cost (they must agree), and the time
from the first create to the last result in the fake's simulated seconds. The ratio of the two bills, and the
time priming adds, close the report.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from gatekeeper import load_prices
from gatekeeper.testing import FakeAPI, FakeConfig

WORDS = ["revenue", "risk", "margin", "lease", "audit", "segment", "cash", "debt", "goodwill", "tax", "hedge", "accrual"]


def corpus(path: Path, docs: int, questions: int, seed: int) -> int:
    rng = random.Random(seed)
    rows = []
    for d in range(docs):
        doc = f"Filing {d}: " + " ".join(rng.choice(WORDS) for _ in range(900))
        marker = {"type": "ephemeral", "ttl": "1h" if d % 2 else "5m"}
        rows += [{"custom_id": f"d{d}-q{k}", "params": {
            "model": "claude-sonnet-5", "max_tokens": 64, "system": [{"type": "text", "text": doc, "cache_control": marker}],
            "messages": [{"role": "user", "content": f"Question {k} about filing {d}?"}]}} for k in range(questions)]
    short = {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    rows += [{"custom_id": f"short-{i}", "params": {"model": "claude-sonnet-5", "max_tokens": 64, "system": [short],
                                                    "messages": [{"role": "user", "content": f"q {i}"}]}} for i in range(100)]
    for i in range(15):
        lives = ["5m"] * 5 if i % 2 else ["5m", "1h"]
        blocks = [{"type": "text", "text": f"part {k}", "cache_control": {"type": "ephemeral", "ttl": t}} for k, t in enumerate(lives)]
        rows.append({"custom_id": f"doomed-{i}", "params": {"model": "claude-sonnet-5", "max_tokens": 64,
                                                            "messages": [{"role": "user", "content": blocks}]}})
    rng.shuffle(rows)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return len(rows)


def run(path: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    config = FakeConfig(ceiling=args.ceiling, rate=args.rate, speed=args.speed, workspaces={"bench-key": "wrkspc_b"},
                        admin_keys={"bench-admin"})
    with FakeAPI(config) as fake:
        env = {**os.environ, "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "bench-key",
               "ANTHROPIC_ADMIN_KEY": "bench-admin"}
        proc = subprocess.run([sys.executable, "-m", "gatekeeper", "submit", str(path), "--json", "--interval", "0.2",
                               "--max-rpm", "60000", *extra], env=env, capture_output=True, text=True, check=False)
        if proc.returncode not in (0, 1):
            sys.exit(f"submit failed ({proc.returncode}): {proc.stderr[-2000:]}")
        s = orjson.loads(proc.stdout)
        r = fake.org.records
        prices = load_prices()
        billed = sum(prices.cost(m, tin, tout, w5 + w1h, rd, w1h) or 0.0 for m, (tin, tout, w5, w1h, rd) in r.billed.items())
        span = (r.last_end_at or 0.0) - (r.first_create_at or 0.0)
        twice = sum(1 for n in r.answered.values() if n > 1)
    return {"summary": s, "billed": billed, "span": span, "creates": r.creates, "twice": twice}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--ceiling", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=25.0, help="requests the fake processes per simulated second")
    ap.add_argument("--speed", type=float, default=60.0, help="simulated seconds per real second")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lines = corpus(Path(tmp) / "primed.jsonl", args.docs, args.questions, args.seed)
        corpus(Path(tmp) / "plain.jsonl", args.docs, args.questions, args.seed)
        print(f"job: {lines:,} lines ({args.docs} filings x {args.questions} questions, 100 short prefixes, "
              f"15 refused markers), ceiling {args.ceiling:,}, rate {args.rate:g}/s")
        results = {"primed": run(Path(tmp) / "primed.jsonl", args, []),
                   "plain": run(Path(tmp) / "plain.jsonl", args, ["--no-prime"])}
    for name, r in results.items():
        s, c = r["summary"], r["summary"]["caching"]
        share = "n/a" if c["read_share_of_ideal"] is None else f"{c['read_share_of_ideal']:.1%}"
        print(f"{name:<7} reads {share} of the ideal · read {c['read_tokens']:,} · written 5m {c['write_5m_tokens']:,}, "
              f"1h {c['write_1h_tokens']:,} · billed ${r['billed']:.4f} (summary ${s['cost_usd']:.4f}) · "
              f"{s['succeeded']:,} succeeded, {s['invalid']} rejected · {r['creates']} batches · answered twice "
              f"{r['twice']} · {r['span']:,.0f} simulated s")
    p, q = results["primed"], results["plain"]
    print(f"primed bill / plain bill: {p['billed'] / q['billed']:.3f} ({1 - p['billed'] / q['billed']:.0%} less); "
          f"priming adds {p['span'] - q['span']:,.0f} simulated s ({p['span'] / q['span']:.2f}x)")


if __name__ == "__main__":
    main()
