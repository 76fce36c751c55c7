"""Whether a run that holds a job has certainly ended, so that a rerun on the same machine after a crash need not
wait out the lease's TTL. Pure: this machine's identity and the pid probe come in (`state._host` reads them).

Only a run on this very machine can be known to have ended: same boot and same pid namespace (a container on the
same host has its own), its pid no longer in use. Anything else (another machine, a lease that recorded no
identity, a pid in use, even by another program) waits for the TTL, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_ended(holder: dict[str, Any], here: str | None, alive: Callable[[int], bool]) -> bool:
    """Whether the run a lease names (`holder`: the info it recorded) has certainly ended: it ran on this machine
    (`here`, from `machine_id`) and its process is gone."""
    pid = holder.get("pid")
    if here is None or holder.get("machine") != here or type(pid) is not int or pid <= 0:
        return False
    return not alive(pid)
