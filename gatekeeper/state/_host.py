"""This machine and its processes, as a shared journal's lease and the ledger record them (the I/O that
`decide._host.run_ended` weighs): this boot and pid namespace, whether a pid is in use, and since when."""

from __future__ import annotations

import os
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


def process_started(pid: int) -> str | None:
    """When the process numbered `pid` started (Linux: its start time in clock ticks since boot, from
    /proc/PID/stat), so that a pid reused by a later process is not taken for the one recorded; "" when it is
    alive and the system does not say since when; None when there is no such process, or only its zombie (it has
    ended: it holds nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None if os.path.exists("/proc/self/stat") else ("" if pid_alive(pid) else None)
    except OSError:
        return "" if pid_alive(pid) else None
    rest = stat[stat.rfind(b")") + 2:].split()  # (the command's name, in parentheses, may hold spaces)
    if len(rest) < 20 or rest[0] in (b"Z", b"X", b"x"):
        return None if rest[:1] in ([b"Z"], [b"X"], [b"x"]) else ""
    return rest[19].decode()


def this_process() -> dict[str, Any]:
    """This process as a lease or the ledger records it: its machine, pid and start time."""
    pid = os.getpid()
    return {"machine": machine_id(), "pid": pid, "started": process_started(pid) or ""}
