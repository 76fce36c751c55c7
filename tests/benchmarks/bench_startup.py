"""Start-up and small-file cost of the CLI, against bare Python and a bare orjson loop.

Usage: python tests/benchmarks/bench_startup.py [--requests 100000] [--repeat 15]

Each figure is the median of `--repeat` runs of a fresh process, interleaved (A B A B ...) so that a noisy
machine slows all of them alike; the ratios are what to compare across machines. `plan` reads with two worker
processes, so the script also times two bare loops started at once against one: on a shared machine whose two
cores are not always whole (another tenant on a sibling hardware thread), that figure says how much of a second
core this run had.

The package's bytecode is compiled first, as `pip install` does: on a machine that sets PYTHONDONTWRITEBYTECODE
(this project's CI machines do) an editable checkout would otherwise compile every module from source on every
start, some 25 ms that no installed copy pays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TWO_AT_ONCE = "two bare loops at once"
BARE_LOOP = "import orjson, sys\nwith open(sys.argv[1], 'rb') as f:\n    for line in f:\n        orjson.loads(line)\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--file", default="/tmp/gk-bench-startup.jsonl")
    a = ap.parse_args()
    if not os.path.exists(a.file) or _lines(a.file) != a.requests:  # (another benchmark's file of that name is remade)
        subprocess.run([sys.executable, os.path.join(HERE, "make_requests.py"), a.file, str(a.requests)], check=True)
    py = sys.executable
    import gatekeeper

    subprocess.run([py, "-m", "compileall", "-q", os.path.dirname(gatekeeper.__file__)], check=True)
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "gatekeeper --version": [py, "-m", "gatekeeper", "--version"],
        "gatekeeper --help": [py, "-m", "gatekeeper", "--help"],
        "bare orjson loop": [py, "-c", BARE_LOOP, a.file],
        "gatekeeper plan": [py, "-m", "gatekeeper", "plan", a.file, "--json"],
    }
    times: dict[str, list[float]] = {k: [] for k in [*commands, TWO_AT_ONCE]}
    for _ in range(a.repeat):
        for name, cmd in commands.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            times[name].append(time.perf_counter() - t)
        times[TWO_AT_ONCE].append(_together(commands["bare orjson loop"], 2))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, value in med.items():
        print(f"{name:<22} {value * 1000:8.1f} ms (median of {a.repeat})")
    print(f"--version / python -c pass: {med['gatekeeper --version'] / med['python -c pass']:.2f}x "
          f"(--help {med['gatekeeper --help'] / med['python -c pass']:.2f}x)")
    size = os.path.getsize(a.file)
    print(f"plan / bare loop on {a.requests:,} requests ({size / 1e6:,.0f} MB), start-up included: "
          f"{med['gatekeeper plan'] / med['bare orjson loop']:.2f}x the time")
    ratios = sorted(p / b for p, b in zip(times["gatekeeper plan"], times["bare orjson loop"]))
    print(f"  round by round: {ratios[0]:.2f}x to {ratios[-1]:.2f}x, {sum(r <= 1 for r in ratios)} of {len(ratios)} at most 1.0x")
    together = sorted(t / b for t, b in zip(times[TWO_AT_ONCE], times["bare orjson loop"]))
    print(f"two bare loops at once / one alone: {med[TWO_AT_ONCE] / med['bare orjson loop']:.2f}x the time, round by "
          f"round {together[0]:.2f}x to {together[-1]:.2f}x (1.0 when the machine gives two whole cores, 2.0 when it "
          "gives one; plan's workers need the two)")


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _together(cmd: list[str], n: int) -> float:
    """Seconds for `n` copies of `cmd` started at once to all end."""
    t = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    for p in procs:
        p.wait()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
