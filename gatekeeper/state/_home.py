"""The user's state folder: where gatekeeper keeps what belongs to this user on this machine rather than to one
input (the host's ledger, a table job's state keyed by its input's identity).

`GATEKEEPER_HOME` names it outright; otherwise the platform's per-user state folder: `$XDG_STATE_HOME/gatekeeper`
(default `~/.local/state/gatekeeper`) on Linux and the BSDs, `~/Library/Application Support/gatekeeper` on macOS,
`%LOCALAPPDATA%\\gatekeeper` on Windows. The environment is passed in, never read here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .._errors import UsageError, os_error

HOME_VARIABLE = "GATEKEEPER_HOME"


def state_home(environ: Mapping[str, str], *, platform: str = sys.platform) -> Path:
    """The user's state folder as the environment and the platform name it (not created here)."""
    named = environ.get(HOME_VARIABLE)
    if named:
        return Path(named).expanduser()
    if platform == "darwin":
        return Path(environ.get("HOME") or Path.home()) / "Library" / "Application Support" / "gatekeeper"
    if platform.startswith("win"):
        return Path(environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "gatekeeper"
    xdg = environ.get("XDG_STATE_HOME") or ""
    state = Path(xdg) if os.path.isabs(xdg) else Path(environ.get("HOME") or Path.home()) / ".local" / "state"
    return state / "gatekeeper"


def check_home(environ: Mapping[str, str], *sub: str) -> Path:
    """The state folder (or a folder under it) as a reading finds it, never created: one line naming it when it could
    not be (a file where a folder should be, or a nearest existing folder this user may not write)."""
    folder = state_home(environ).joinpath(*sub)
    there = folder
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir() or not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"the state folder {folder} cannot be written: {_why_not(there)} (set {HOME_VARIABLE} to "
                         "another)", setting=HOME_VARIABLE)
    return folder


def _why_not(there: Path) -> str:
    """Why an existing path cannot take a folder, as the OS would say it (what `submit`'s line says, `os_error`)."""
    if not there.is_dir():
        return f"{there} is not a folder"
    if os.statvfs(there).f_flag & os.ST_RDONLY:
        return "Read-only file system"
    return "Permission denied"


def ensure_home(environ: Mapping[str, str], *sub: str) -> Path:
    """The state folder (or a folder under it), created for this user only; one line naming it when it cannot be."""
    folder = state_home(environ).joinpath(*sub)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # One probe per process: two jobs starting at once on one host must not remove each other's.
        probe = folder / f".gatekeeper-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(os_error(exc, f"the state folder {folder} cannot be written (set {HOME_VARIABLE} to another)"),
                         setting=HOME_VARIABLE) from exc
    return folder
