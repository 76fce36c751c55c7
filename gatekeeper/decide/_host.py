"""Whether a run that holds a job (a lease) or a place in the ledger has certainly ended, so that a rerun or
another job on the same machine need not wait out a TTL. Pure: this machine's identity and the process probe come
in (`state._host` reads them).

Only a run on this very machine can be known to have ended: same boot and same pid namespace (a container on the
same host has its own), its pid no longer in use, or in use by a process started since (a reused pid, told apart
by the start time recorded with it). Anything else (another machine, a holder that recorded no identity, a pid in
use by a process the record cannot tell from it) waits for the TTL, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_ended(holder: dict[str, Any], here: str | None, started: Callable[[int], str | None]) -> bool:
    """Whether the run a record names (`holder`: its machine, pid and, when known, start time) has certainly ended:
    it ran on this machine (`here`, from `machine_id`) and its process is gone (`started(pid)` is None), or the pid
    now belongs to a process started at another time than the one recorded (`started(pid)` differs; "" is a start
    the system does not tell)."""
    pid = holder.get("pid")
    if here is None or holder.get("machine") != here or type(pid) is not int or pid <= 0:
        return False
    now = started(pid)
    if now is None:
        return True
    then = holder.get("started")
    return bool(then) and bool(now) and now != then
