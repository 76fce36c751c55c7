"""Shared multi-submitter scenario: used by tests/test_ledger.py and tests/benchmarks/bench_ledger.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from gatekeeper.testing import FakeAPI, FakeConfig
from tests.forkserver import spawn

KEYS = ["ledger-ws1", "ledger-ws2", "ledger-ws3"]


@dataclass
class Outcome:
    refusals: int
    max_depth: int
    ceiling: int
    succeeded_twice: int
    codes: list[int]
    summaries: list[dict]


def write_job(path: Path, prefix: str, n: int) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"custom_id": f"{prefix}-{i}", "params": {
                "model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": f"item {i}"}]}}) + b"\n")
    return path


def three_submitters(tmp: Path, *, ledger: str | None, ceiling: int = 300, per_job: int = 300, rate: float = 600.0,
                     hold_until_refused: bool = False) -> Outcome:
    """Three submitters, one workspace each (none sees the others' batches), one organization ceiling.

    `hold_until_refused`: nothing is processed until the first refusal, so that submitters started a little
    apart still meet a full queue (what a test of refusals needs, whatever the machine's speed).
    """
    cfg = FakeConfig(ceiling=ceiling, rate=0.0 if hold_until_refused else rate,
                     workspaces={k: f"wrkspc_{i}" for i, k in enumerate(KEYS)}, queue_retry_after=1)
    with FakeAPI(cfg) as fake:
        procs = []
        for i, key in enumerate(KEYS):
            job = write_job(tmp / f"job{i}.jsonl", f"j{i}", per_job)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_")) or k == "GATEKEEPER_HOME"}
            env.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": key})
            args = ["submit", str(job), "--json", "--poll", "0.05", "--max-rpm", "60000",
                    "--ceiling", str(ceiling), "--reconcile-grace", "2", "--no-preflight"]
            if ledger:
                args += ["--ledger", ledger]
            procs.append(spawn(args, env))  # three real processes (forked from the fork server)
        if hold_until_refused:
            fake.org.wait_for(lambda r: bool(r.refusals), "a refusal", 60)
            fake.org.config.rate = rate
        results = [p.communicate(timeout=300) for p in procs]
        r = fake.org.records
        return Outcome(
            refusals=len(r.refusals), max_depth=r.max_depth, ceiling=ceiling, succeeded_twice=r.succeeded_twice,
            codes=[p.returncode for p in procs],
            summaries=[orjson.loads(out) if out.strip() else {"stderr": err[-500:]} for out, err in results],
        )
