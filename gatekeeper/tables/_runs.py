"""A table job's runs: each `submit` over a JSONL of the requests not answered when it was planned, under `runs/`,
named by its content, with its own state directory beside its file (the job is the table's; a run is one pass of it).

A run whose answers were kept is *settled* (`Answers.settled`). One that is not did not finish (a kill -9, a stop)
or finished without its answers kept. Before a new run is planned, every such run is finished first: collected,
sending nothing new (what it had created is downloaded; what it never sent is planned afresh from the table as it
is now), and its answers kept. So a row in flight when a run was killed is paid for once, whatever changed in the
table before the next run."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import GatekeeperError
from ..state._answers import Answers
from ..state._journal import BatchState, open_job
from ._rows import NEVER_AGAIN, id_and_key

if TYPE_CHECKING:
    from ..api._config import ApiConfig


def run_dir(pending: Path) -> Path:
    return pending.with_suffix(".gatekeeper")


def run_name(pending: Path, job: str | None, config: ApiConfig) -> str:
    """A run's name in a shared journal: the table job's name and the run's content, or, unnamed, the name a JSONL
    job of the same requests gets (the run's file is named by the digest that name starts with)."""
    from ..run.shared._opening import job_name_of  # (the run's modules: not imported by `plan_table`, a second of a 1M-row plan)

    return f"{job}.{pending.stem}" if job else job_name_of(str(pending), config)


def recorded_run(pending: Path, journal: str, jobs: tuple[str | None, ...], config: ApiConfig) -> str:
    """A run's name in a shared journal, under the first of the table job's names (its own, then those it had
    before) that has it recorded (none: its own)."""
    from ..run.shared._opening import recorded_in  # (as `run_name`'s)

    names = [run_name(pending, job, config) for job in dict.fromkeys(jobs)]
    recorded = recorded_in(journal)
    return next((n for n in names[1:] if not recorded(names[0]) and recorded(n)), names[0])


def unfinished_runs(root: Path, answers: Answers) -> list[Path]:
    """The runs under `root` whose answers were not kept, oldest first."""
    folder = root / "runs"
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    done = answers.settled([p.stem for p in files])
    return [p for p in files if p.stem not in done]


def taken_keys(pending: Path, journal: str | None, job: str | None) -> set[str]:
    """The keys of a run's requests that its collection answers (created, or answered for good), which the next run
    does not send again; none when it has no journal (nothing of it was sent). `job`: its name in a shared journal."""
    try:
        j = open_job(run_dir(pending), journal=journal, job=job)
    except GatekeeperError:
        return set()
    try:
        lines = j.outcomes.taken_lines(NEVER_AGAIN) if j.initialized else set()
    except GatekeeperError:
        return set()
    finally:
        j.close()
    if not lines:
        return set()
    with open(pending, "rb") as f:
        return {id_and_key(line)[1] for n, line in enumerate(f, 1) if n in lines}


def fresh_name(pending: Path, answers: Answers) -> Path:
    """Where a new run of these requests goes: its content's name, or, when a settled run had the same requests
    (all of them errored, say), the next name free of one (that run's journal would only say it had finished)."""
    stem, k = pending.stem, 1
    while answers.settled([stem]):
        k += 1
        stem = f"{pending.stem}-{k}"
    return pending.with_name(stem + pending.suffix)


def quiet(pending: Path, journal: str | None, job: str | None) -> bool | None:
    """Whether a run has nothing in flight (no batch created and not yet collected, no create to reconcile, no
    real-time call out): its answers can be kept from its journal alone. None: no job was recorded for it (nothing
    was sent). A journal that cannot be read here says False: the run is continued, which reads it properly."""
    try:
        j = open_job(run_dir(pending), journal=journal, job=job)
    except GatekeeperError:
        return None if journal is None and not (run_dir(pending) / "journal.sqlite3").exists() else False
    try:
        if not j.initialized:
            return None
        return not j.count(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED) and not j.lane.out()
    except GatekeeperError:
        return False
    finally:
        j.close()


def hold(pending: Path) -> int | None:
    """This process's hold on a run (a lock on `runs/STEM.lock`, released with its descriptor): whoever holds it
    plans, runs or collects that run. None: another process holds it (the run is live there, and left to it)."""
    fd = os.open(pending.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def held_elsewhere(pending: Path) -> bool:
    """Whether another process holds the run now (a submit is running it: a second one is refused until it ends)."""
    if not pending.with_suffix(".lock").exists():
        return False
    fd = hold(pending)
    if fd is None:
        return True
    let_go(fd)
    return False


def let_go(fd: int) -> None:
    os.close(fd)


def discard(pending: Path) -> None:
    """A run for which no job was recorded: nothing of it was sent; its file goes (its rows are planned afresh)."""
    pending.unlink(missing_ok=True)
