"""Seeds run and told: the world drawn, each job's figures, the promises broken; the command's exit code."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ._invariants import check, check_more, contention, figures, table_figures
from ._sim import run_world
from ._world import draw

# the worlds' files in memory where the system has a memory file system: every commit of a journal and a ledger is
# an fsync, which on a disk costs more than the rest of a night put together
SHM = "/dev/shm"  # noqa: S108 (a private folder is made inside it, as in any temporary folder)
SCRATCH = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None


@dataclass
class SeedReport:
    seed: int
    lines: list[str]  # the world drawn and each job's figures: the same for the same seed, everywhere
    broken: dict[str, list[str]] = field(default_factory=dict)  # promise -> what broke it
    log: list[str] = field(default_factory=list)  # the night's moments (kills, stops, faults, runs' ends)

    @property
    def ok(self) -> bool:
        return not self.broken

    def text(self, verbose: bool = False) -> str:
        out = list(self.lines) + ([f"  log {x}" for x in self.log] if verbose else [])
        out += [f"  BROKEN {name}: {x}" for name, what in self.broken.items() for x in what[:10]]
        out.append(f"  => {'ok' if self.ok else 'BROKEN ' + ', '.join(sorted(self.broken))}")
        return "\n".join(out)


def run_seed(seed: int, hours: float = 8.0, jobs: int | None = None, *, rough: bool = True) -> SeedReport:
    """One world, run and checked (`rough`: with the roughness drawn later, `_world._rough`)."""
    world = draw(seed, hours, jobs, rough=rough)
    with tempfile.TemporaryDirectory(prefix=f"swarm-{seed}-", dir=SCRATCH) as root:
        w = run_world(world, root)
        all_books, broken = check(w)
        tables, more = check_more(w, all_books)
        for name, what in more.items():
            broken.setdefault(name, []).extend(what)
        lines = world.describe() + ["  " + figures(b, w) for b in all_books] + ["  " + table_figures(b) for b in tables]
        records = w.fake.org.records
        if shares := contention(w):
            lines.append("  " + shares)
        lines.append(f"  fake: {records.creates} creates, deepest queue {records.max_depth}, {len(records.refusals)} "
                     f"refusals, {sum(records.realtime.values())} real-time answers")
    return SeedReport(seed, lines, broken, w.log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gatekeeper.testing.swarm", description=__doc__)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (worlds) to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--hours", type=float, default=8.0, help="the night's length, before its healthy days")
    parser.add_argument("--jobs", type=int, default=None, help="jobs a world (default: drawn, 1 to 4)")
    parser.add_argument("--verbose", action="store_true", help="print each night's moments too")
    args = parser.parse_args(argv)
    failed = []
    started = time.monotonic()
    for seed in range(args.first, args.first + args.seeds):
        report = run_seed(seed, args.hours, args.jobs)
        print(report.text(args.verbose), flush=True)
        if not report.ok:
            failed.append(seed)
    took = time.monotonic() - started
    print(f"{args.seeds} seeds in {took:.1f} s ({took / max(1, args.seeds) * 1000:.0f} ms a seed): "
          + (f"{len(failed)} broke a promise: {' '.join(map(str, failed))}" if failed else "every promise kept"),
          file=sys.stderr)
    return 1 if failed else 0
