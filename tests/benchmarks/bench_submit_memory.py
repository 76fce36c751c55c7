"""`submit`'s peak memory against the job's size: the fake as a process of its own, `submit` as another, its peak RSS
read from the kernel (ru_maxrss of the child) at each size.

Usage: python tests/benchmarks/bench_submit_memory.py [--sizes 120000,1000000,10000000] [--bytes 300] [--table]

Requests are small (about --bytes each) so that what is measured is what grows with the count of requests, not
their text; batches are the API's largest (100,000 requests); the fake's ceiling is 2,000,000 and it processes
1,000,000 requests a simulated second, so the job is bound by gatekeeper's own work. Prints, for each size: wall
time, CPU time, the peak of the summed RSS of `submit` and its worker processes (sampled every 0.2 s), and the
state folder's size a request. With `--table`, the job is a table job instead: a Parquet table of tickets (the one
tests/benchmarks/bench_tables.py plans), one request a row, its result written as Parquet.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.benchmarks.bench_tables import TEMPLATE
from tests.benchmarks.bench_tables import make as make_table
from tests.benchmarks.fake_process import start_fake
from tests.benchmarks.make_requests import write

KEY, ADMIN = "bench-ws1", "bench-admin"


def fake() -> tuple[subprocess.Popen[str], str]:
    return start_fake("--simulated-ceiling", "2000000", "--rate", "1000000", "--admin-key", ADMIN,
                      "--workspace-key", KEY)


def measure(tmp: Path, n: int, approx_bytes: int, url: str, table: bool) -> dict[str, float]:
    if table:
        path, out = tmp / f"in-{n}.parquet", tmp / f"out-{n}.parquet"
        make_table(path, n)
        job = ["--template", TEMPLATE, "--model", "claude-haiku-4-5", "--max-tokens", "50"]
    else:
        path, out = tmp / f"in-{n}.jsonl", tmp / f"out-{n}.jsonl"
        write(str(path), n, approx_bytes=approx_bytes)
        job = []
    env = {**os.environ, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_ADMIN_KEY": ADMIN}
    args = [sys.executable, "-m", "gatekeeper", "submit", str(path), *job, "--out", str(out),
            "--state", str(path) + ".gatekeeper",  # (a table's default is in the user's state folder: measured here)
            "--interval", "0.5", "--interval", "0.5", "--max-rpm", "60000",
            "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(tmp / "log", "w+") as log:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        peak = 0
        while proc.poll() is None:  # (the tree's RSS, summed: the planner's workers are processes too)
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.2)
        said = proc.stdout.read() if proc.stdout else ""
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            log.seek(0)
            sys.exit(f"submit exited {proc.returncode}: {log.read()[-3000:]}")
    summary = json.loads(said)
    assert (summary["by_status"].get("succeeded") if table else summary["succeeded"]) == n, summary
    state = Path(str(path) + ".gatekeeper")
    size = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
    for p in (path, out):
        p.unlink()
    return {"wall": wall, "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "rss": peak / 2**20, "state": size / n}


def tree_rss(pid: int) -> int:
    """The resident bytes of a process and its descendants now (0 once it is gone)."""
    total = 0
    try:
        total = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += tree_rss(int(child))
    except (OSError, ValueError):
        pass
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="120000,1000000,10000000")
    p.add_argument("--bytes", type=int, default=300)
    p.add_argument("--table", action="store_true", help="a table job (Parquet in and out) instead of JSONL")
    a = p.parse_args()
    proc, url = fake()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in (int(s) for s in a.sizes.split(",")):
                m = measure(Path(tmp), n, a.bytes, url, a.table)
                print(f"{n:>11,} requests: {m['wall']:7.1f} s wall, {m['cpu']:7.1f} s CPU, peak RSS {m['rss']:6.0f} MB,"
                      f" state {m['state']:.0f} B a request", flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
