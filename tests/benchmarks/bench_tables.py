"""Benchmark a table job's planning against the floor: `plan_table` on an N-row Parquet table (ids like
`JIRA:SUP-1234`, texts of varied length) against a bare loop that reads the same table with pyarrow by record batches
and formats the template per row. Each runs in a process of its own; prints wall time, the ratio, and each one's
peak RSS (ru_maxrss).

Usage: python tests/benchmarks/bench_tables.py [--rows 1000000] [--id-column] [--nulls] [--repeat 3] [--write PATH]

`--nulls`: every row's templated column null, so the plan rejects every row (its memory must not grow with them: a
count and the first 100 reasons are kept). `--write PATH`: only write the table there (to time a command on it).

The two run in turns --repeat times; the ratio printed is the median of each back-to-back pair's (on a shared, noisy
machine the steadier figure), beside the ratio of the best times.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEMPLATE = "Classify this support ticket in one word: {body}"

BARE = """
import sys, pyarrow.parquet as pq
n = 0
for batch in pq.ParquetFile(sys.argv[1]).iter_batches(batch_size=65536):
    for row in batch.select(["id", "body"]).to_pylist():
        text = "Classify this support ticket in one word: {body}".format(**row)
        n += len(text)
print(n)
"""

OURS = """
import sys, gatekeeper
spec = gatekeeper.TableSpec.of("Classify this support ticket in one word: {body}", "claude-haiku-4-5", 50,
                               id_column="id" if sys.argv[3] == "1" else None)
plan = gatekeeper.plan_table(sys.argv[1], spec, state_dir=sys.argv[2])
print(plan.rows, plan.report.requests if plan.report else 0, plan.rejected_count)
"""


def make(path: Path, rows: int, nulls: bool = False) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = ["printer", "login", "invoice", "the VPN", "my laptop", "payroll", "a refund", "the portal"]
    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("body", pa.string()), ("n", pa.int64())])) as w:
        for start in range(0, rows, 100_000):
            idx = range(start, min(rows, start + 100_000))
            w.write_table(pa.table({
                "id": [f"JIRA:SUP-{i}" for i in idx],
                "body": pa.array([None] * len(idx), pa.string()) if nulls else
                [f"Ticket {i}: {words[i % 8]} does not work. " + "It worked yesterday. " * (i % 13) for i in idx],
                "n": list(idx)}))


def timed(code: str, *args: str) -> tuple[float, float, str]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # (the largest child so far, MB)
    return wall, rss, out.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--id-column", action="store_true")
    ap.add_argument("--nulls", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", default=None, metavar="PATH")
    a = ap.parse_args()
    if a.write:
        make(Path(a.write), a.rows, a.nulls)
        return
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "tickets.parquet"
        make(table, a.rows, a.nulls)
        print(f"table: {a.rows:,} rows, {table.stat().st_size / 1e6:,.1f} MB of Parquet")
        bare, ours, said = [], [], ""
        for k in range(a.repeat):
            bare.append(timed(BARE, str(table))[0])
            bare_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            took, ours_rss, said = timed(OURS, str(table), str(Path(tmp) / f"state{k}"), "1" if a.id_column else "0")
            ours.append(took)
        ratios = sorted(o / b for b, o in zip(bare, ours))
        print(f"bare loop (pyarrow, template per row)   best {min(bare):6.2f} s   peak RSS {bare_rss:,.0f} MB")
        print(f"plan_table{' --id-column' if a.id_column else ''}                  best {min(ours):6.2f} s   "
              f"peak RSS (largest so far) {ours_rss:,.0f} MB   ({said})")
        print(f"ratio: median of pairs {ratios[len(ratios) // 2]:.2f}x, of the best times {min(ours) / min(bare):.2f}x")


if __name__ == "__main__":
    main()
