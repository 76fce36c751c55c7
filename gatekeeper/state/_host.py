"""This machine and its processes, as a shared journal's lease records them (the I/O that `decide._host.run_ended`
weighs): this boot and pid namespace, and whether a pid is in use."""

from __future__ import annotations

import os


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
