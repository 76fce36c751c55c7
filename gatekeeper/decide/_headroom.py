"""Headroom: the queue ceiling, the live depth, and what they mean. Pure, except `read_headroom`.

A request counts against `enqueued_batch_requests` until the model has processed
it, which is exactly `request_counts.processing`; and `processing` stays at a
batch's total until the whole batch ends. So the depth is the sum of
`processing` over live batches (`in_progress`, `canceling`), and it comes back
in steps of whole batches. Batches are listed per workspace while the ceiling is
organization-wide: with fewer than all workspaces' keys the depth is a lower bound.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

LIVE_STATES = ("in_progress", "canceling")
PER_BATCH_REQUESTS = 100_000
PER_BATCH_MB = 256
FINDINGS = ("queue-exhausted", "queue-near-limit", "queue-limit-unknown")


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch of an API timestamp (any RFC 3339 form); None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def format_time(at: float) -> str:
    """Wall seconds as the ISO 8601 time people and `parse_time` read (UTC, to the second)."""
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")


def total_requests(batch: dict[str, Any]) -> int:
    """A batch's size: the sum of its request_counts (constant over its life)."""
    counts = batch.get("request_counts") or {}
    return sum(v for v in counts.values() if isinstance(v, int) and not isinstance(v, bool))


class ModelLimits(NamedTuple):
    """One model's real-time limits a minute, and whether its input limit counts cache reads (the
    `input_tokens_per_minute` type does; `input_tokens_per_minute_cache_aware`, current models' usual type, does
    not)."""

    rpm: int
    itpm: int
    otpm: int
    reads_count: bool = False


def model_limits(entries: list[dict[str, Any]]) -> dict[str, ModelLimits]:
    """model -> its limits, from the Admin API's `model_group` entries that give all three (the group's type read
    from `group_type` or the newer `group.type`; input tokens as `input_tokens_per_minute` (cache reads counted) or,
    for current models, `input_tokens_per_minute_cache_aware` (not counted))."""
    out: dict[str, ModelLimits] = {}
    for e in entries:
        g = e.get("group")
        group: dict[str, Any] = g if isinstance(g, dict) else {}
        if (e.get("group_type") or group.get("type")) != "model_group" or not isinstance(e.get("models"), list):
            continue
        limits = {str(x.get("type")): x.get("value") for x in e.get("limits") or [] if isinstance(x, dict)}
        # (current models give their input limit as the cache-aware type: cache reads not counted)
        itpm = limits.get("input_tokens_per_minute") or limits.get("input_tokens_per_minute_cache_aware")
        values = [limits.get("requests_per_minute"), itpm, limits.get("output_tokens_per_minute")]
        if all(isinstance(v, int) and v > 0 for v in values):
            reads = bool(limits.get("input_tokens_per_minute"))
            for m in e["models"]:
                out[str(m)] = ModelLimits(int(values[0]), int(values[1]), int(values[2]), reads)  # type: ignore[arg-type]
    return out


def enqueued_ceiling(entries: Iterable[Any]) -> int | None:
    """The batch group's enqueued_batch_requests, or None when absent (never 0: that would read as a full queue)."""
    for entry in entries or ():
        if not isinstance(entry, dict):
            continue
        group = entry.get("group")
        kind = entry.get("group_type") or (group.get("type") if isinstance(group, dict) else None)
        if kind != "batch":
            continue
        for limit in entry.get("limits") or ():
            if isinstance(limit, dict) and limit.get("type") == "enqueued_batch_requests":
                raw = limit.get("value")
                if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                    return None
                try:
                    value = int(raw)
                except ValueError:
                    return None
                return value if value > 0 else None
    return None


@dataclass(frozen=True, slots=True)
class QueuedBatch:
    """A live batch in the organization's queue, anyone's, as a reading lists it (this job's own, projected by the
    deadline keeper, are `JobBatch`es)."""

    id: str
    status: str
    processing: int
    workspace: str  # "ws1", "ws2": the key's position, never the key

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "processing": self.processing, "workspace": self.workspace}


def live_batches(batches: Iterable[dict[str, Any]], workspace: str) -> list[QueuedBatch]:
    """The batches that hold queue space, and how much each holds."""
    out = []
    for b in batches:
        status = str(b.get("processing_status") or "")
        if status not in LIVE_STATES:
            continue
        counts = b.get("request_counts") or {}
        try:
            processing = int(counts.get("processing") or 0)
        except (TypeError, ValueError):
            processing = 0
        out.append(QueuedBatch(str(b.get("id")), status, processing, workspace))
    return out


@dataclass(frozen=True)
class Headroom:
    """One reading of the queue."""

    ceiling: int | None  # None: unknown
    depth: int
    batches: Sequence[QueuedBatch] = field(default_factory=tuple)  # largest first
    workspaces: int = 1
    ceiling_source: str | None = None  # "admin-api", "google-organization-route", "--ceiling", or None
    ceiling_error: str | None = None  # why the Admin API reading failed, when it did
    read: tuple[str, ...] = ()  # what each workspace was read through ("workspace key 1", a credential's workspace)

    @property
    def remaining(self) -> int | None:
        return None if self.ceiling is None else max(0, self.ceiling - self.depth)

    @property
    def occupancy(self) -> float | None:
        return None if self.ceiling is None else self.depth / self.ceiling


def build_headroom(
    ceiling: int | None, rows: Iterable[QueuedBatch], workspaces: int, *, ceiling_source: str | None = None,
    ceiling_error: str | None = None, read: Sequence[str] = (),
) -> Headroom:
    ordered = sorted(rows, key=lambda r: (-r.processing, r.id))
    return Headroom(ceiling, sum(r.processing for r in ordered), tuple(ordered), workspaces, ceiling_source, ceiling_error,
                    tuple(read))


def verdict(h: Headroom, threshold: int) -> tuple[str, str]:
    """(state, one-line detail) for a reading at `threshold` percent."""
    if h.ceiling is None:
        return (
            "queue-limit-unknown",
            f"{h.depth:,} batch requests are in the processing queue across {h.workspaces} workspace(s), but the "
            "enqueued_batch_requests ceiling is unknown, so there is no headroom to report",
        )
    percent = round(100 * h.depth / h.ceiling)
    if h.depth >= h.ceiling:
        return (
            "queue-exhausted",
            f"{h.depth:,} of {h.ceiling:,} enqueued batch requests are in the processing queue: the whole ceiling. "
            "New submissions are refused",
        )
    if percent >= threshold:
        return (
            "queue-near-limit",
            f"{h.depth:,} of {h.ceiling:,} enqueued batch requests are in the processing queue, {percent}% of the "
            f"ceiling; {h.remaining:,} remain",
        )
    return (
        "queue-clear",
        f"{h.depth:,} of {h.ceiling:,} enqueued batch requests are in the processing queue ({percent}%), leaving "
        f"{h.remaining:,} of headroom across {len(h.batches)} live batch(es)",
    )


class Repairs(Protocol):
    """What a platform says to do about a verdict there (`api._platform.Platform.repair`); None: the generic lines."""

    def repair(self, state: str) -> list[str] | None: ...


def repair_lines(state: str, h: Headroom, platform: Repairs | None = None) -> list[str]:
    """What to do about a verdict. Printed, never performed. The platform is asked first: where the ceiling can be
    read from, and how, is its own (an Admin key, no Admin API, an organization route)."""
    said = None if platform is None else platform.repair(state)
    if said is not None:
        return said
    if state == "queue-clear":
        return ["nothing to change; check again during the batch window: this queue drains and fills."]
    if state == "queue-limit-unknown":
        return [
            "pass --ceiling N from the limits page: without it, gatekeeper submit learns a bound from queue-full answers.",
            "without the ceiling this is a raw count: it cannot say whether the next submission will be accepted.",
        ]
    lines = [
        "hold a few batches in flight and wait for one to end before creating the next: requests leave the queue "
        "only when their whole batch ends (gatekeeper submit does this).",
    ]
    if h.batches and h.ceiling:
        big = h.batches[0]
        lines.append(
            f"{big.id} ({big.workspace}) alone holds {big.processing:,} of the {h.ceiling:,}: while it waits, little else "
            f"fits. gatekeeper sizes its own batches to the ceiling; a tool that sends batches this big (the API takes up "
            f"to {PER_BATCH_REQUESTS:,} requests or {PER_BATCH_MB} MB) fills the queue alone, and smaller ones drain sooner."
        )
    lines.append(
        "a queue held at the ceiling slows what is already in it, and slowed batches are the ones that expire at "
        "24 hours; draining fixes both."
    )
    return lines


SCOPE_CAVEAT = (
    "the ceiling is organization-wide and batches are listed per workspace: this depth is a lower bound unless "
    "every workspace is read (ANTHROPIC_EXTRA_WORKSPACE_KEYS, or with a credential ANTHROPIC_EXTRA_WORKSPACE_IDS)"
)
