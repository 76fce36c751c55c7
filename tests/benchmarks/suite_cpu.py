"""Where the suite's CPU goes: a pytest plugin that records each test's CPU (the worker's and every process under it:
the fork server's runs, a Dag's, a browser's) and wall seconds, and a summary by file and by test.

    mkdir -p /tmp/cpu && PYTHONPATH=tests/benchmarks SUITE_CPU_DIR=/tmp/cpu python -m pytest -q -p suite_cpu
    python tests/benchmarks/suite_cpu.py /tmp/cpu

A process that ends within a test is counted once it is reaped (by the worker or the fork server, which reap their
own), from /proc: Linux only. On two cores the suite's wall time cannot go below half its CPU.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
RECORDS: dict[str, tuple[float, float]] = {}


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return found


def _cpu(pid: int) -> float:
    """utime, stime, and the reaped children's cutime and cstime, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICK


def tree_cpu() -> float:
    total, stack = 0.0, [os.getpid()]
    while stack:
        pid = stack.pop()
        total += _cpu(pid)
        stack += _children(pid)
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = tree_cpu(), time.monotonic()
    yield
    RECORDS[item.nodeid] = (tree_cpu() - cpu, time.monotonic() - wall)


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get("SUITE_CPU_DIR")
    if folder and RECORDS:
        with open(os.path.join(folder, f"cpu-{os.getpid()}.json"), "w") as f:
            json.dump(RECORDS, f)


def summary(folder: str, top: int = 25) -> str:
    records: dict[str, Any] = {}
    for path in glob.glob(os.path.join(folder, "cpu-*.json")):
        with open(path) as f:
            records.update(json.load(f))
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, (cpu, wall) in records.items():
        row = files[nodeid.split("::")[0]]
        row[0] += cpu
        row[1] += wall
        row[2] += 1
    lines = [f"{len(records)} tests, {sum(c for c, _ in records.values()):.0f} s of CPU; by file (CPU s, wall s, tests):"]
    lines += [f"{c:7.1f} {w:8.1f} {n:5.0f}  {name}" for name, (c, w, n) in sorted(files.items(), key=lambda x: -x[1][0])[:top]]
    lines.append("by test (CPU s, wall s):")
    lines += [f"{c:7.1f} {w:8.1f}  {nodeid}" for nodeid, (c, w) in sorted(records.items(), key=lambda x: -x[1][0])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
