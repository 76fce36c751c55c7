"""This machine and its processes, as a shared journal's lease records them: whether a run that holds a job has
certainly ended, so that a rerun on the same machine after a crash need not wait out the lease's TTL.

Only a run on this very machine can be known to have ended: same boot and same pid namespace (a container on the
same host has its own), its pid no longer in use. Anything else (another machine, a lease that recorded no
identity, a pid in use, even by another program) waits for the TTL, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def machine_id() -> str | None:
    """This boot of this machine and this process's pid namespace (Linux); None where the system does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}/{namespace}" if boot else None


def pid_alive(pid: int) -> bool:
    """Whether a process numbered `pid` exists here (another user's too; an unreaped zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def run_ended(holder: dict[str, Any], here: str | None, alive: Callable[[int], bool]) -> bool:
    """Whether the run a lease names (`holder`: the info it recorded) has certainly ended: it ran on this machine
    (`here`, from `machine_id`) and its process is gone."""
    pid = holder.get("pid")
    if here is None or holder.get("machine") != here or type(pid) is not int or pid <= 0:
        return False
    return not alive(pid)
