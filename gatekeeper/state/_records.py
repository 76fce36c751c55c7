"""The journal's records: the states a batch moves through and the rows the journal hands out. Values only."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

RESULTS_SQL_COLUMNS = ("line, custom_id, type, error_type, attempts, out_offset, out_len, model, input_tokens, output_tokens, "
                  "cache_creation_tokens, cache_read_tokens, batch, cache_write_1h_tokens, stop_reason")
TIMELINE_ROWS = 4000  # readings kept: a 24-hour run polled every 30 s takes 2,880


class BatchState(str, enum.Enum):
    PLANNED = "planned"  # cut, not yet sent
    INTENT = "intent"  # about to be (or being) created; outcome unknown until answered or reconciled
    CREATED = "created"  # the API gave it an id; processing
    ENDED = "ended"  # the API says it ended; results not yet committed
    COLLECTED = "collected"  # its results are in the output and the journal
    # a create whose wait the deadline cut: its requests moved to the real-time lane, its outcome still reconciled (a
    # batch it made is adopted and collected, each answer joined only where the lane has not answered)
    CUT = "cut"


@dataclass
class BatchRow:
    idx: int
    kind: str
    requests: int
    bytes: int
    first_line: int
    last_line: int
    start_offset: int
    end_offset: int
    first_custom_id: str
    last_custom_id: str
    state: BatchState
    batch_id: str | None
    intent_at: float | None
    created_at: str | None
    ended_at: str | None
    counts: str | None
    body_complete: bool = False
    worst_usd: float | None = None
    cache_round: int | None = None  # a primer's or a rest's round of priming (None: any other batch)
    cut: bool = False  # its create's wait was cut by the deadline, its requests moved to the real-time lane


BATCH_COLUMNS = tuple(f.name for f in fields(BatchRow))  # the batches table's columns, read by name
BATCH_SELECT = ", ".join(BATCH_COLUMNS)


class PendingRow(NamedTuple):
    """A request waiting for another attempt: where it is in the input, and which attempt comes next."""

    line: int
    offset: int
    length: int
    custom_id: str
    attempt: int


Group = tuple[str, int | None, list[PendingRow]]  # a member-listed batch to be: (kind, round, its requests)


@dataclass(frozen=True)
class JobPlan:
    """What a new job records before anything is sent."""

    input: dict[str, Any]
    settings: dict[str, Any]
    report: dict[str, Any]
    output: str
    batches: list[tuple[Any, ...]]  # (idx, requests, bytes, first_line, last_line, start, end, first_cid, last_cid)
    rejections: list[tuple[int, str | None, str]]
    # member-listed batches of priming: (kind "primer" or "rest", round, members); their lines leave the ranges
    groups: list[Group] = field(default_factory=list)


@dataclass(frozen=True)
class Totals:
    types: dict[str, int]
    errors: dict[str, int]
    usage: tuple[int, ...]  # input, output, cache creation (both lives), cache read, 1h cache creation tokens
    usage_by_model: list[tuple[Any, ...]]
    batches: int
    resubmitted: int
    succeeded_after_retry: int
    final: int
    stop_reasons: dict[str, int]  # succeeded results by their message's stop_reason
