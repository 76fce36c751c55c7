"""How the real-time lane stops on an error of its own, and the room it keeps to record its calls out on a full disk.

Any stop settles the lane (issue 58): a write of the lane's own that fails (the journal or the results file full, a
journal gone) halts it as an error of the batch lane does. Nothing new is sent, nothing more is committed, and the
run stops on the error once the calls out have answered (`RealtimeLane.settle`). A full disk, met by either lane,
frees the ballast (`state._ballast`): each answer of a call out is then journaled as received in the room it held,
and the rerun commits it without buying it again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio

from ..._errors import GatekeeperError, disk_full
from ...state._ballast import Ballast, room_for
from ..shared._settings import EventSink


class Halt:
    """The lane's stop on an error of its own or a full disk, and the ballast it keeps until then (`folder`: the
    journal's, None for a shared journal, whose records go to its server). `woken`: the lane's waits look again."""

    def __init__(self, emit: EventSink, folder: Path | None, woken: Callable[[], None]) -> None:
        self.emit, self.woken = emit, woken
        self.failure: GatekeeperError | None = None  # a write of the lane's own failed: the run stops on it
        self.failing = anyio.Event()  # set with `failure` (the batch loop's wait ends on it)
        # answers are only journaled as received, no more committed (the disk is full, or a commit failed): a commit
        # would take the room their records need, and the rerun commits them
        self.recording_only = False
        self.said = False  # `realtime_stopping` said (once, however many of the run's parts wait)
        self.ballast = Ballast(folder)
        self.room_tokens = 0  # the max_tokens the ballast is sized for (the largest of any call sent)

    def on(self, exc: BaseException) -> None:
        """The run stops on `exc`. On a full disk, the ballast's room is freed for the answers of the calls out, each
        journaled as received as it comes and left for the rerun to commit."""
        if not disk_full(exc):
            return
        self.recording_only = True
        if not self.ballast.released and (freed := self.ballast.release()):
            self.emit("ballast_freed", {"bytes": freed, "where": str(self.ballast.path),
                                        "why": "the disk is full: room to journal the answers of the calls out"})

    def fail(self, exc: GatekeeperError) -> None:
        """A write of the lane's own failed: nothing new is sent, nothing more committed, and the run stops on the
        first such error once the calls out have answered."""
        self.recording_only = True
        self.on(exc)
        if self.failure is None:
            self.failure = exc
            self.failing.set()
            self.woken()

    def wrote(self, write: Callable[[], object], *, paid: bool = False) -> bool:
        """`write`, a journal write of the lane's; whether it was made (one that says False made nothing: a call
        not to go). One that fails stops the lane (`fail`); a `paid` one (an answer's record) that found the disk full
        is tried once more, in the room the ballast freed."""
        try:
            return write() is not False
        except GatekeeperError as exc:
            self.fail(exc)
            if not (paid and disk_full(exc)):
                return False
        try:
            return write() is not False
        except GatekeeperError:
            return False

    def keep_room(self, calls: int, max_tokens: int) -> None:
        """The ballast as large as recording `calls` calls out at `max_tokens` needs (said once when the disk has no
        room for it: the calls still go)."""
        if max_tokens <= self.room_tokens:
            return
        self.room_tokens = max_tokens
        size = room_for(calls, max_tokens)
        if not self.ballast.hold(size) and self.ballast.path is not None:
            self.room_tokens = 1 << 62  # (tried once a run)
            self.emit("ballast_short", {"bytes": size, "where": str(self.ballast.path), "policy": "calls go out; on a "
                                        "full disk, an answer that cannot be journaled is sent again by the rerun, "
                                        "counted as a possible double charge"})

    def say_stopping(self, calls: int, grace: float, reason: str | None) -> None:
        """`realtime_stopping`, once a run, when calls are out."""
        if calls and not self.said:
            self.said = True
            self.emit("realtime_stopping", {"calls_out": calls, "wait_at_most": grace, **({"reason": reason} if reason else {}),
                                            "why": "each call cut off may be billed twice; Ctrl-C again abandons them"})
