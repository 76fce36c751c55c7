"""The journal on PostgreSQL against SQLite, and rebuilding an output from the API.

Usage:
    eval "$(.ci/postgres start)"     # or give --pg postgresql://USER@HOST:PORT/DB (password in PGPASSWORD)
    python tests/benchmarks/bench_journal.py [--batches 300] [--rows 200000] [--rebuild 1000000]

1. Per batch: one batch's whole life in the journal (intent, body complete, created, ended, an empty
   settlement): five transactions, each committed durably.
2. Per result row: one settlement of --rows final results (the rows of one batch's download).
3. Rebuild: a submit of --rebuild requests through the fake over HTTP with a PostgreSQL journal; the output is
   then deleted and the job resumed from another folder: the time from the start of the rebuild to its end
   (every batch downloaded again, verified, written in order), beside the first collection's time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from make_requests import write  # noqa: E402

from gatekeeper.state._journal import JobPlan, Journal  # noqa: E402
from gatekeeper.testing import FakeAPI, FakeConfig  # noqa: E402


def _plan(n: int) -> JobPlan:
    return JobPlan(input={"sha256": "bench"}, settings={}, report={"requests": n * 10}, output="/dev/null", rejections=[],
                   batches=[(i, 10, 1000, i * 10, i * 10 + 9, i * 1000, i * 1000 + 1000, "a", "b") for i in range(n)])


def per_batch(journal: Journal, n: int) -> float:
    journal.start_job(_plan(n))
    t0 = time.perf_counter()
    for i in range(n):
        journal.mark_intent(i, at=time.time(), worst_usd=1.0)
        journal.mark_body_complete(i)
        journal.mark_created(i, f"msgbatch_{i}", "2026-12-03T00:00:00Z")
        journal.mark_ended(i, "2026-12-03T01:00:00Z", {"succeeded": 10})
        with journal.settling(i) as s:
            s.committed = 0
    return (time.perf_counter() - t0) / n


def per_row(journal: Journal, rows: int, batch: int) -> float:
    t0 = time.perf_counter()
    with journal.settling(batch) as s:
        for k in range(rows):
            s.final(10_000_000 + k, f"r{k}", "succeeded", None, 1, k * 400, 400, ("claude-haiku-4-5", 25, 12, 0, 0, 0))
        s.committed = rows * 400
    return (time.perf_counter() - t0) / rows


def journals(pg: str | None, tmp: str) -> dict[str, Callable[[], Journal]]:
    out: dict[str, Callable[[], Journal]] = {"sqlite": lambda: Journal.open(Path(tmp) / f"s-{uuid.uuid4().hex}")}
    if pg:
        out["postgresql"] = lambda: Journal.open_shared(pg, f"bench-{uuid.uuid4().hex}", Path(tmp) / "pg")
    return out


def overhead(pg: str | None, batches: int, rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        figures = {}
        for name, make in journals(pg, tmp).items():
            j = make()
            b = per_batch(j, batches)
            r = per_row(j, rows, 0)
            j.close()
            figures[name] = (b, r)
            print(f"{name:>10}: {b * 1e3:6.2f} ms per batch (5 transactions), {r * 1e6:5.1f} us per result row")
        if "postgresql" in figures:
            (sb, sr), (pb, pr) = figures["sqlite"], figures["postgresql"]
            print(f"postgresql / sqlite: {pb / sb:.2f}x per batch, {pr / sr:.2f}x per row")


def rebuild(pg: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        first = os.path.join(tmp, "a", "in.jsonl")
        os.makedirs(os.path.dirname(first))
        write(first, n, approx_bytes=150)
        cfg = FakeConfig(ceiling=10_000_000, rate=1e9, workspaces={"bench-key": "wrkspc_1"}, answer_bytes=100)
        job = f"bench-rebuild-{uuid.uuid4().hex[:8]}"
        with FakeAPI(cfg) as fake:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
            env.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "bench-key", "GATEKEEPER_JOURNAL": pg})
            args = ["--job", job, "--json", "--interval", "0.05", "--ceiling", "10000000", "--max-rpm", "60000"]
            t0 = time.perf_counter()
            done = _submit(first, args, env)
            took = time.perf_counter() - t0
            size = os.path.getsize(first + ".gatekeeper/results.jsonl")
            collect = _span(done, "ended", "collected")
            shutil.rmtree(os.path.dirname(first))  # the host, its disk and its output are gone
            second = os.path.join(tmp, "b", "copy.jsonl")
            os.makedirs(os.path.dirname(second))
            write(second, n, approx_bytes=150)
            again = _submit(second, args, env)
            rebuilt = _span(again, "output_rebuilding", "output_rebuilt")
            assert os.path.getsize(second + ".gatekeeper/results.jsonl") == size
        summary = orjson.loads(again.stdout)
        print(f"submit of {n:,} requests (PostgreSQL journal): {took:.1f} s; first collection {collect:.1f} s")
        print(f"rebuild of {summary['rebuilt']['results']:,} results ({size / 1e6:,.0f} MB, {summary['rebuilt']['batches']} "
              f"batches) on another host: {rebuilt:.1f} s = {size / 1e6 / rebuilt:,.0f} MB/s, "
              f"{summary['rebuilt']['results'] / rebuilt:,.0f} results/s; creates sent again: 0")


def _submit(path: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "submit", path, *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return proc


def _span(proc: subprocess.CompletedProcess[str], start: str, end: str) -> float:
    evs = [orjson.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    return max(e["t"] for e in evs if e["event"] == end) - min(e["t"] for e in evs if e["event"] == start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default=os.environ.get("PG_TEST_URL"), help="a PostgreSQL URL (default PG_TEST_URL)")
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rebuild", type=int, default=1_000_000, help="requests of the rebuild run (0: skip it)")
    a = ap.parse_args()
    overhead(a.pg, a.batches, a.rows)
    if a.pg and a.rebuild:
        rebuild(a.pg, a.rebuild)


if __name__ == "__main__":
    main()
