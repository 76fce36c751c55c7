"""Results downloads: when one can be trusted, and what to do while results are missing. Pure.

A results download is a stream like any other: it can end short, carry a torn
last line, or be cut off, and nothing in the protocol but the batch's
`request_counts` tells a complete one. So a download is used only when every
line parses, belongs to the batch, appears once, and their number is the batch's
total. Anything else means the *download* failed, not the requests: it is tried
again later and nothing is resent because of it.

Results can also be missing: a 404 or a null `results_url` for a while after a
batch ends (the API is eventually consistent), or for good once they are
archived (29 days after creation). The first is waited out for a grace period
from the batch's end; the second ends those requests with a final errored line
of type `gatekeeper_results_unavailable`. They are never resent: they were
processed and may have been billed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

RESULTS_UNAVAILABLE = "gatekeeper_results_unavailable"
MISSING_RESULT = "gatekeeper_missing_result"
UNPROVEN_ERROR = "gatekeeper_unproven"  # an answer from a batch that could not be proven ours: kept apart, never joined
# a real-time answer lost twice (on the wire, or to crashes): paid for up to twice already, never sent a third time
ANSWER_LOST = "gatekeeper_answer_lost"
BATCH_LIFETIME = 86_400.0  # a batch ends (expires) at most 24 hours after it was created


class Missing(str, enum.Enum):
    WAIT = "wait"  # try again later
    UNAVAILABLE = "unavailable"  # gone: final errored lines, never resent


@dataclass(frozen=True)
class MissingVerdict:
    action: Missing
    reason: str


def when_results_missing(*, archived: bool, ended_at: float | None, created_at: float | None, now: float,
                         grace: float, retention: float) -> MissingVerdict:
    """What to do about a batch whose results answer 404 (or whose results_url is null)."""
    if archived:
        return MissingVerdict(Missing.UNAVAILABLE, "the API archived this batch's results (archived_at is set)")
    if created_at is not None and now - created_at > retention:
        return MissingVerdict(Missing.UNAVAILABLE, f"the batch is older than the results' retention ({retention / 86_400:g} days)")
    end = ended_at if ended_at is not None else (created_at + BATCH_LIFETIME if created_at is not None else None)
    if end is None or now - end < grace:
        return MissingVerdict(Missing.WAIT, "results not available yet")
    return MissingVerdict(Missing.UNAVAILABLE, f"no results {grace:.0f} s after the batch ended")


def download_wait(failures: int, min_wait: float, max_wait: float, urgent: float | None = None) -> float:
    """Seconds before trying a failed download again: doubling from `min_wait`, at most `max_wait`, or at most
    `urgent` (never under `min_wait`) for a batch canceled for a deadline: its requests reach the real-time lane only
    once its results are read, so they are asked for at an even pace, not at a wait of minutes."""
    wait = float(min(min_wait * 2 ** max(0, failures - 1), max_wait))
    return wait if urgent is None else min(wait, max(min_wait, urgent))


def incomplete_reason(lines: int, expected: int | None, left: int) -> str | None:
    """Why a download whose lines all parsed and belonged is still not complete; None when it is.

    `expected`: the batch's total by request_counts (None or 0 when unknown); `left`: our requests not seen.
    """
    if expected:
        return None if lines == expected else f"{lines:,} result lines of {expected:,}"
    return None if left == 0 else f"{left:,} requests missing and the batch's counts are unknown"
