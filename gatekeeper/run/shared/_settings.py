"""The settings of a submit run, every one with its documented default."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ...decide._deadline import PRIOR_TURNAROUND
from ...input._sizing import Limits

EventSink = Callable[[str, dict[str, Any]], None]
"""What a run tells as it goes, `on_event(event, fields)`: the event's name ("admitted", "refused", "waiting", ...)
and its fields, the one shape every part of a run emits in (the CLI's `--json` prints each as a JSON line)."""

INTERVAL = 30.0  # seconds between queue readings, by default


@dataclass(frozen=True)
class SubmitSettings:
    """Settings of one submit run. Every field has a documented default.

    `interval` is the CLI's `--interval`; `poll`, its old name, is still taken (a `DeprecationWarning`), as
    `--poll` is on the command line."""

    state_dir: Path | None = None  # default: INPUT.gatekeeper/ beside the input
    out: Path | None = None  # default: STATE_DIR/results.jsonl
    ceiling: int | None = None  # the organization's enqueued_batch_requests; default: read with the admin key
    margin: int = 0  # requests of headroom left for others
    interval: float = INTERVAL  # seconds between queue readings
    max_in_flight: int | None = None  # batches of ours live at once, at most
    max_attempts: int = 3  # attempts per request, the first included
    limits: Limits = field(default_factory=Limits)
    reconcile_grace: float = 180.0  # seconds an unknown create may take to show in the listing
    clock_skew: float = 300.0  # tolerance between our clock and created_at
    min_backoff: float = 5.0  # shortest wait after a queue-full refusal
    max_backoff: float = 600.0
    # the admission ledger creates go through: None, the default: GATEKEEPER_LEDGER in the environment `submit` is
    # given, else "host" (this user's on this machine, in the state folder); "none" (no ledger: ownership after a
    # lost create rests on usage alone); or a URL to share: "sqlite:///path", "redis://host:port/db", "postgresql://..."
    ledger: str | None = None
    ledger_ttl: float = 900.0  # seconds a dead submitter of another machine outlives its last heartbeat in the ledger
    # on a shared ledger: while a job of higher priority waits for room, lower ones admit nothing new; jobs of one
    # priority share freed room in proportion to `share` (see decide._shares)
    priority: str = "normal"  # "high", "normal" or "low"
    share: float = 1.0
    results_grace: float = 3600.0  # seconds after a batch's end that 404s or a null results_url are waited out
    retention: float = 29 * 86_400.0  # seconds the API keeps results after a batch is created
    # calls a minute to the batch endpoints, at most (the organization's limit is shared); None: the platform's
    # default (`ApiConfig.default_rpm`: 300, or 50 on Claude Platform on AWS)
    max_rpm: float | None = None
    allow_duplicate: bool = False  # run even while a job with the same input and workspace is live elsewhere
    resume_canceled: bool = False  # a job stopped by `cancel` sends what it never sent (else it only collects)
    preflight: bool = True  # judge the input's models against the Models API before the first create
    budget: float | None = None  # USD at most, at batch prices, worst case counted (see _budget)
    token_sample: int = 50  # requests per model counted with count_tokens for the estimate (0: bytes / 4)
    prime: bool = True  # send one request per shared cache prefix first, the rest once it is cached (see _priming)
    journal: str | None = None  # None: SQLite in the state directory; "postgresql://...": a shared journal
    job: str | None = None  # the job's name in a shared journal; default: from the input's sha256 and the key
    # how other jobs on the ledger name this one (`status`, `ahead`); default: its job's name, else its input's file
    # name (a table job: its table's)
    label: str | None = None
    lease_ttl: float = 60.0  # seconds a job's lease outlives its holder's last heartbeat (shared journal only)
    # finish by then, the real-time lane taking what the batch lane is projected to miss (see _deadline): a duration
    # ("90m", "6h"), an ISO 8601 time, a datetime or wall seconds; None: the batch lane only, no real-time call
    deadline: str | float | datetime | None = None
    turnaround: float = PRIOR_TURNAROUND  # seconds a batch is expected to take until this job has seen one end
    # seconds kept in hand before the deadline; None: a minute, at most a quarter of the job's window (`kept_slack`)
    deadline_slack: float | None = None
    # send nothing new: collect what is in flight, then end (a table job's earlier run that did not finish, whose
    # unsent requests are planned again from the table as it is now)
    collect_only: bool = False
    poll: InitVar[float | None] = None  # deprecated: `interval`'s old name

    def __post_init__(self, poll: float | None) -> None:
        if poll is None:
            return
        warnings.warn("SubmitSettings(poll=...) is deprecated: use interval=... (the CLI's --interval)",
                      DeprecationWarning, stacklevel=3)
        if self.interval not in (INTERVAL, poll):
            raise ValueError(f"SubmitSettings: interval={self.interval} and poll={poll} (its old name): give interval only")
        object.__setattr__(self, "interval", poll)


def _poll(self: SubmitSettings) -> float | None:
    caller = sys._getframe(1)
    if caller.f_globals.get("__name__") == "dataclasses" and caller.f_code.co_name in ("replace", "_replace"):
        return None  # (`dataclasses.replace` reads every init field, InitVars too: a copy passes no old name on)
    warnings.warn("SubmitSettings.poll is deprecated: read interval", DeprecationWarning, stacklevel=2)
    return self.interval


# (read by its old name too; set after the class is made, which took `poll` as an InitVar with its default)
SubmitSettings.poll = property(_poll, doc="Deprecated: `interval`.")  # type: ignore[attr-defined]


def default_state_dir(input_path: str) -> Path:
    return Path(input_path + ".gatekeeper")


def default_job_name(sha256: str, key_fingerprint: str) -> str:
    """A job's name when none is given: the same input (by content, any path) sent with the same key."""
    return f"{sha256[:16]}-{key_fingerprint[:8]}"
