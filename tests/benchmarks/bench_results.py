"""Results streaming end to end: fake API -> HTTP -> gatekeeper -> results file.

Usage: python tests/benchmarks/bench_results.py [--requests 100000] [--answer-bytes 10000] [--repeat 1]
       [--baseline DIR]

One batch of N requests whose answers are --answer-bytes long (about 1 GB of
results by default). Reports the collection throughput (result bytes divided by
the time from the batch's end to its results being committed), the client's
peak RSS (the submit subprocess's VmHWM when it has collected), its CPU time (user and system, the whole job), and its CPU over the
collection alone (read from /proc when it says the batch `ended` and then `collected`: what the download, its
verification, the joins, the writes and the journal cost, whatever pace the fake, serving from this process, sets).
With `--baseline DIR` (another checkout's root, e.g. `git archive HEAD~1 | tar -x -C DIR`), its `submit` runs in turn
beside this one on the same input and the ratios of their collection CPU are printed (median of the pairs).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from make_requests import write  # noqa: E402

from gatekeeper.testing import FakeAPI, FakeConfig  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """A live process's user and system CPU seconds (/proc/PID/stat, after the command's name)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _peak_rss(pid: int) -> int:
    """A live process's peak resident bytes (VmHWM): `ru_maxrss` of the children would count, for a child forked
    from this process, the fake's answers held here."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def run(tree: str, path: str, answer_bytes: int) -> dict[str, float]:
    """One `submit` of `tree`'s gatekeeper against a fake of its own: the collection's wall and CPU seconds, the
    whole job's CPU and peak RSS, the results' size."""
    cfg = FakeConfig(ceiling=10_000_000, rate=1e9, workspaces={"bench-key": "wrkspc_1"}, answer_bytes=answer_bytes)
    state = path + ".gatekeeper"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with FakeAPI(cfg) as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        # (a home of its own: the user's ledger is not touched, and a baseline from before a ledger migration does
        # not meet the other tree's columns: "table processes has 6 columns but 5 values were supplied")
        env.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "bench-key", "GATEKEEPER_HOME": state + ".home"})
        proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "submit", path, "--json", "--interval", "0.05",
                                 "--ceiling", "10000000", "--state", state], env=env, cwd=tree,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        at: dict[str, tuple[float, float]] = {}  # event -> (its time, the client's CPU then)
        tail = []
        for line in proc.stderr:
            tail = [*tail[-20:], line]
            if line.startswith(b"{"):
                ev = orjson.loads(line)
                if ev["event"] in ("ended", "collected") and ev["event"] not in at:
                    at[ev["event"]] = (ev["t"], _cpu(proc.pid))
                    rss = _peak_rss(proc.pid)  # (at `collected`: past the download, its peak)
        if proc.wait() != 0 or len(at) != 2:
            raise SystemExit(b"".join(tail).decode(errors="replace")[-2000:])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    size = os.path.getsize(os.path.join(state, "results.jsonl"))
    shutil.rmtree(state)
    shutil.rmtree(state + ".home", ignore_errors=True)
    return {"wall": at["collected"][0] - at["ended"][0], "cpu": at["collected"][1] - at["ended"][1], "size": size,
            "job_cpu": usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime,
            "rss": rss}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--answer-bytes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline", help="another checkout's root, whose `submit` runs in turn beside this one")
    a = ap.parse_args()
    trees = {"this": ROOT, **({"baseline": a.baseline} if a.baseline else {})}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.jsonl")
        write(path, a.requests, approx_bytes=300)
        for _ in range(a.repeat):
            for name, tree in trees.items():
                runs[name].append(run(tree, path, a.answer_bytes))
    for name, rs in runs.items():
        mb = rs[0]["size"] / 1e6
        wall, cpu = min(r["wall"] for r in rs), min(r["cpu"] for r in rs)
        print(f"{name}: results: {a.requests:,} lines, {mb:,.0f} MB in {wall:.1f} s = {mb / wall:,.0f} MB/s end to end "
              f"(best of {len(rs)}); the collection's CPU {cpu:.2f} s = {mb / cpu:,.0f} MB a CPU second")
        print(f"{name}: client peak RSS: {max(r['rss'] for r in rs) / 2**20:,.0f} MiB; client CPU: "
              f"{min(r['job_cpu'] for r in rs):.1f} s for the whole job (on a loaded machine the steadier figure: the "
              "fake's time and the waits are not in it)")
    if a.baseline:
        pairs = [b["cpu"] / t["cpu"] for t, b in zip(runs["this"], runs["baseline"], strict=True)]
        print(f"the collection's CPU: this is {statistics.median(pairs):.2f}x as fast as the baseline (median of "
              f"{len(pairs)} pairs; {', '.join(f'{p:.2f}' for p in pairs)})")


if __name__ == "__main__":
    main()
