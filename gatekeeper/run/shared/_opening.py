"""Opening a job's journal: SQLite in its state directory under a folder lock, or a named job in a shared
PostgreSQL journal under a lease; the job's name; where its results go."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..._errors import JournalError, UsageError
from ...api._config import ApiConfig
from ...decide._host import run_ended
from ...state._db import require_postgres
from ...state._host import process_started, this_process
from ...state._journal import Journal, private_dir
from ...state._output import check_writable
from ...state.ledger._base import new_owner
from ._inputs import hash_file
from ._settings import SubmitSettings, default_job_name
from ._spool import spool

if TYPE_CHECKING:
    from ...input._reader import Source


def out_path(settings: SubmitSettings, journal: Journal) -> str:
    """The results file: as given, else as recorded by the job, else STATE_DIR/results.jsonl; checked writable.

    A shared journal's job may resume on another host, where the recorded path means nothing: there the
    default is always this host's STATE_DIR/results.jsonl."""
    if settings.out is not None:
        return check_writable(os.fspath(settings.out))
    recorded = None if journal.job else journal.get_meta("output")
    return check_writable(str(recorded or journal.state_dir / "results.jsonl"))


@asynccontextmanager
async def locked_journal(state_dir: Path, clock: Callable[[], float] = time.time) -> AsyncIterator[Journal]:
    """The state directory's journal, locked for this run. A directory this run created is removed again when the
    run ends before any job was recorded in it (a missing or empty input, an unreachable API or ledger, a stop
    while planning): errors leave nothing behind. Its stamps are on `clock` (wall seconds)."""
    created = not state_dir.exists()
    journal = Journal.open(state_dir, clock=clock)
    lock = os.open(state_dir / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(f"another gatekeeper is running with state directory {state_dir}") from None
        yield journal
    finally:
        unused = created and not journal.initialized
        os.close(lock)
        journal.close()
        if unused:
            shutil.rmtree(state_dir, ignore_errors=True)


def job_name_of(path: str, config: ApiConfig, *, recorded: Callable[[str], bool] | None = None) -> str:
    """A job's default name: the input's content (any path) and the account it goes to (`ApiConfig.fingerprint`,
    never a secret). With `recorded` (does a job of that name exist where jobs are kept), a job started under the
    name it had before names stopped following the credential's secret is found under that one."""
    config.require_workspace_key()
    digest = hash_file(path)
    return chosen_name(default_job_name(digest, config.fingerprint()),
                       default_job_name(digest, config.legacy_fingerprint()), recorded)


def chosen_name(name: str, legacy: str, recorded: Callable[[str], bool] | None) -> str:
    """`name`, unless only `legacy` names a job already recorded (one started before names stopped following a
    secret: it goes on under its own name, never started again under the new one)."""
    if recorded is None or legacy == name or recorded(name) or not recorded(legacy):
        return name
    return legacy


def recorded_in(journal: str | None, state_base: Path | None = None) -> Callable[[str], bool]:
    """Whether a job of a name is recorded: in the shared journal `journal`, else (`state_base`) in a state folder
    of that name under it."""
    if journal:
        return lambda name: Journal.recorded(journal, name)
    assert state_base is not None
    return lambda name: (state_base / name / Journal.FILE).is_file()


@asynccontextmanager
async def leased_journal(settings: SubmitSettings, state_dir: Path, name: str, created: bool,
                         clock: Callable[[], float] = time.time) -> AsyncIterator[Journal]:
    """The named job in a shared journal, held by this run's lease for as long as it runs (the local state
    directory, when this run `created` it and no job was recorded, removed again as `locked_journal` does)."""
    assert settings.journal is not None
    try:
        journal = Journal.open_shared(settings.journal, name, state_dir, clock=clock)
    except JournalError:
        if created:
            shutil.rmtree(state_dir, ignore_errors=True)
        raise
    me = this_process()
    here = me["machine"]
    info = {"host": socket.gethostname(), **me, "state_dir": os.path.abspath(state_dir)}
    try:
        # A run that died on this machine (a crash, kill -9) leaves its lease to expire: a rerun here need not wait.
        journal.lease.take(new_owner(), info, settings.lease_ttl, ended=lambda holder: run_ended(holder, here, process_started))
        yield journal
    finally:
        with contextlib.suppress(JournalError):  # unreachable now: the lease expires on its own after lease_ttl
            journal.lease.release()
        unused = created and not _initialized(journal)
        journal.close()
        if unused:
            shutil.rmtree(state_dir, ignore_errors=True)


def _initialized(journal: Journal) -> bool:
    """Whether a job was recorded (an unreachable shared journal counts as yes: never remove what may be used)."""
    try:
        return journal.initialized
    except JournalError:
        return True


def job_journal(source: Source, path: str, spooled: bool, state_dir: Path, settings: SubmitSettings,
                 config: ApiConfig, clock: Callable[[], float] = time.time) -> AbstractAsyncContextManager[Journal]:
    """The job's journal: SQLite in the state directory (locked), or the named job in a shared journal (leased);
    its stamps on `clock`."""
    if not settings.journal:
        if settings.job:
            raise UsageError("a job name needs a postgresql:// journal; a local job is named by "
                             "its state directory", setting="job")
        return locked_journal(state_dir, clock)
    require_postgres(settings.journal)
    created = not state_dir.exists()
    if spooled:  # beside, not over, the input: a live run of the job may be reading it (see adopt_spool)
        private_dir(state_dir)
        spool(source, path + ".incoming")  # type: ignore[arg-type]
    name = settings.job or job_name_of(path + ".incoming" if spooled else path, config,
                                       recorded=recorded_in(settings.journal))
    return leased_journal(settings, state_dir, name, created, clock)
