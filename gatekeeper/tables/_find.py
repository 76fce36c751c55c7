"""A table job's runs found from its table (or its state folder), for the commands that read or stop a run
(`results`, `report`, `cancel`): a user names the table, never `runs/HASH.gatekeeper`. Reads no table (no pyarrow).
"""

from __future__ import annotations

from pathlib import Path

from .._errors import UsageError
from ..state._answers import Answers
from ._runs import run_dir, unfinished_runs


def is_table_folder(folder: Path) -> bool:
    """Whether a state folder is a table job's (its runs under `runs/`), not a run's own (a journal in it)."""
    return (folder / "runs").is_dir() and not (folder / "journal.sqlite3").exists()


def table_runs(folder: Path, *, live: bool = False) -> list[Path]:
    """The state directories of the table job's runs that sent something (a journal): the current one, the newest
    run that did not finish, else the newest of all; `live`: every run that did not finish (none: the newest).
    None sent: a usage error naming the folder."""
    files = sorted((folder / "runs").glob("*.jsonl"), key=lambda p: (p.stat().st_mtime_ns, p.name)) \
        if (folder / "runs").is_dir() else []
    sent = [p for p in files if (run_dir(p) / "journal.sqlite3").exists()]
    if not sent:
        raise UsageError(f"the table job in {folder} has no run that sent anything yet (submit the table first)",
                         setting="state_dir")
    unfinished = [p for p in _unfinished(folder) if p in sent]
    chosen = (unfinished or sent[-1:]) if live else [(unfinished or sent)[-1]]
    return [run_dir(p) for p in chosen]


def _unfinished(folder: Path) -> list[Path]:
    if not (folder / "answers.sqlite3").exists():
        return unfinished_runs(folder, _NoAnswers())  # type: ignore[arg-type]
    answers = Answers.local(folder / "answers.sqlite3")
    try:
        return unfinished_runs(folder, answers)
    finally:
        answers.close()


class _NoAnswers:
    """No answers kept yet: no run settled."""

    def settled(self, runs: list[str]) -> set[str]:
        return set()
