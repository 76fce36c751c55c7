"""The fake organization: batches, the processing queue, outcomes. No HTTP here.

Processing model: one organization-wide processing capacity of `rate` requests
per simulated second serves live batches first-in first-out, so batches end one
by one and `processing` stays at a batch's total until it ends, as on the real
API. The clock is compressible (`speed` simulated seconds per real second) and
can be jumped (`advance`), which is how 24-hour expiry is tested in seconds.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
DAY = 86_400.0


def new_id(prefix: str, rng: random.Random) -> str:
    return prefix + "".join(rng.choice(_B58) for _ in range(24))


@dataclass(frozen=True)
class Outcome:
    """How one request ends: "succeeded", "errored" (with an error type), "expired" or "canceled"."""

    type: str = "succeeded"
    error_type: str = "api_error"
    message: str = ""
    flat: bool = False  # errored in the flattened shape some proxies use


OutcomeRule = Callable[[str, str, int], "Outcome | None"]
"""(custom_id, model, attempt) -> Outcome, or None for the default. attempt counts from 1."""


@dataclass
class FakeConfig:
    ceiling: int | None = 300_000  # enqueued_batch_requests; None: the Admin API has no batch group
    enforce_ceiling: int | None = None  # the ceiling creates are refused against (default: `ceiling`)
    rate: float = 10_000.0  # requests processed per simulated second, organization-wide
    speed: float = 1.0  # simulated seconds per real second
    max_requests: int = 100_000
    max_body_bytes: int = 256_000_000
    workspaces: dict[str, str] = field(default_factory=lambda: {"test-key-ws1": "wrkspc_1"})  # key -> workspace id
    admin_keys: set[str] = field(default_factory=lambda: {"test-admin-key"})
    queue_retry_after: float | None = 60.0  # simulated seconds
    queue_message: str = "Number of batch requests in the processing queue would exceed your organization's limit of {limit}"
    not_found_after_create: float = 0.0  # real seconds a new batch answers 404 to retrieve/results
    results_on_other_origin: bool = False
    results_redirect: bool = False  # results on our origin answer 307 to another origin (needs results_on_other_origin)
    results_chunk_delay: float = 0.0  # real seconds between result chunks
    answer_bytes: int = 40  # text length of each succeeded message
    retention_days: float = 29.0
    cancel_delay: float = 1.0  # simulated seconds a canceling batch takes to end
    cancel_ended: str = "error"  # cancel on an ended batch: "error" (400) or "ok" (200, unchanged)
    sync_disallowed: bool = True  # stream/speed/max_tokens<1 refused at create (else errored at the end)
    rate_limit_page_size: int | None = None  # split the Admin API answer into pages of this many entries
    rate_limit_empty_first_page: bool = False
    outcome: OutcomeRule | None = None
    seed: int = 1


@dataclass
class FakeBatch:
    id: str
    workspace: str
    seq: int
    created_at: float  # simulated
    expires_at: float
    requests: list[tuple[str, str]]  # (custom_id, model)
    bad: frozenset[int] = frozenset()  # indexes errored for disallowed params (per-request mode)
    created_wall: float = 0.0
    processed: float = 0.0
    status: str = "in_progress"
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    results: list[tuple[str, Outcome]] | None = None

    @property
    def total(self) -> int:
        return len(self.requests)


@dataclass
class Records:
    """What a test needs to judge a client."""

    creates: int = 0
    refusals: list[dict[str, Any]] = field(default_factory=list)  # queue-full refusals
    max_depth: int = 0
    succeeded: dict[str, int] = field(default_factory=dict)  # custom_id -> times it succeeded
    attempts: dict[str, int] = field(default_factory=dict)  # custom_id -> times it was processed
    wrong_origin_keys: int = 0  # requests that reached the results origin carrying a key
    requests_seen: dict[str, int] = field(default_factory=dict)  # endpoint -> count
    first_create_at: float | None = None
    last_end_at: float | None = None

    @property
    def succeeded_twice(self) -> int:
        return sum(1 for n in self.succeeded.values() if n > 1)


class Organization:
    """The fake's state. Every method takes the lock; HTTP handlers call these."""

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.rng = random.Random(config.seed)
        self.batches: dict[str, FakeBatch] = {}
        self.deleted: set[str] = set()
        self.records = Records()
        self._seq = 0
        self._epoch = time.time()
        self._mono0 = time.monotonic()
        self._offset = 0.0
        self._tick = 0.0  # simulated time processing has reached

    # -- clock --------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the fake started."""
        return (time.monotonic() - self._mono0) * self.config.speed + self._offset

    def advance(self, seconds: float) -> None:
        """Jump the simulated clock forward."""
        with self.lock:
            self._offset += seconds
            self._process()

    def stamp(self, t: float | None) -> str | None:
        if t is None:
            return None
        when = dt.datetime.fromtimestamp(self._epoch + t, dt.UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # -- processing ---------------------------------------------------------

    def _live(self) -> list[FakeBatch]:
        return [b for b in self.batches.values() if b.status != "ended"]

    def depth(self) -> int:
        return sum(b.total for b in self._live())

    def _process(self) -> None:
        now = self.now()
        t = self._tick
        rate = self.config.rate
        for b in sorted(self._live(), key=lambda b: b.seq):
            if b.status == "canceling":
                at = (b.cancel_initiated_at or 0.0) + self.config.cancel_delay
                if at <= now:
                    self._end(b, max(t, at), leftover="canceled")
                continue
            if b.expires_at <= t:
                self._end(b, b.expires_at, leftover="expired")
                continue
            if t >= now:
                break
            stop = min(now, b.expires_at)
            if rate <= 0:
                break
            need = (b.total - b.processed) / rate
            if t + need <= stop:
                t += need
                b.processed = b.total
                self._end(b, t, leftover="expired")
                continue
            b.processed += (stop - t) * rate
            t = stop
            if stop >= b.expires_at:
                self._end(b, b.expires_at, leftover="expired")
                continue
            break
        self._tick = max(t, now) if not self._live() else t

    def _end(self, b: FakeBatch, at: float, leftover: str) -> None:
        done = min(b.total, int(b.processed + 1e-9))
        rule = self.config.outcome
        out: list[tuple[str, Outcome]] = []
        for i, (cid, model) in enumerate(b.requests):
            if i >= done:
                out.append((cid, Outcome(type=leftover)))
                continue
            attempt = self.records.attempts.get(cid, 0) + 1
            self.records.attempts[cid] = attempt
            if i in b.bad:
                outcome: Outcome | None = Outcome("errored", "invalid_request_error", "this parameter is not supported in a batch")
            else:
                outcome = rule(cid, model, attempt) if rule else None
            outcome = outcome or Outcome()
            if outcome.type == "succeeded":
                self.records.succeeded[cid] = self.records.succeeded.get(cid, 0) + 1
            out.append((cid, outcome))
        b.results = out
        b.status = "ended"
        b.ended_at = at
        self.records.last_end_at = max(self.records.last_end_at or 0.0, at)

    def sync(self) -> None:
        with self.lock:
            self._process()

    # -- what the endpoints do ----------------------------------------------

    def create(self, workspace: str, requests: list[tuple[str, str]], bad: frozenset[int]) -> FakeBatch | dict[str, Any]:
        """A new batch, or a refusal dict when the queue cannot take it whole."""
        with self.lock:
            self._process()
            limit = self.config.enforce_ceiling if self.config.enforce_ceiling is not None else self.config.ceiling
            depth = self.depth()
            if limit is not None and depth + len(requests) > limit:
                refusal = {"at": self.now(), "requests": len(requests), "depth": depth, "workspace": workspace}
                self.records.refusals.append(refusal)
                return {"limit": limit, **refusal}
            now = self.now()
            if self._tick < now and not self._live():
                self._tick = now  # an idle queue does not bank capacity
            self._seq += 1
            b = FakeBatch(
                id=new_id("msgbatch_", self.rng), workspace=workspace, seq=self._seq, created_at=now,
                expires_at=now + DAY, requests=requests, bad=bad, created_wall=time.monotonic(),
            )
            self.batches[b.id] = b
            self.records.creates += 1
            if self.records.first_create_at is None:
                self.records.first_create_at = now
            self.records.max_depth = max(self.records.max_depth, depth + b.total)
            return b

    def add_batch(self, workspace: str, n: int, *, status: str = "in_progress", prefix: str = "seed") -> FakeBatch:
        """Put a batch straight into the queue (test set-up: any size, no HTTP, no ceiling check)."""
        with self.lock:
            self._process()
            now = self.now()
            self._seq += 1
            b = FakeBatch(
                id=new_id("msgbatch_", self.rng), workspace=workspace, seq=self._seq, created_at=now, expires_at=now + DAY,
                requests=[(f"{prefix}-{self._seq}-{i}", "claude-x") for i in range(n)], created_wall=time.monotonic(),
            )
            self.batches[b.id] = b
            if status == "canceling":
                b.status, b.cancel_initiated_at = "canceling", now
            elif status == "ended":
                b.processed = n
                self._end(b, now, leftover="expired")
            return b

    def get(self, workspace: str, batch_id: str) -> FakeBatch | None:
        with self.lock:
            self._process()
            b = self.batches.get(batch_id)
            return b if b is not None and b.workspace == workspace else None

    def listing(self, workspace: str) -> list[FakeBatch]:
        with self.lock:
            self._process()
            return sorted((b for b in self.batches.values() if b.workspace == workspace), key=lambda b: -b.seq)

    def cancel(self, b: FakeBatch) -> bool:
        """False when the batch has already ended."""
        with self.lock:
            self._process()
            if b.status == "ended":
                return False
            if b.status == "in_progress":
                b.status = "canceling"
                b.cancel_initiated_at = self.now()
            return True

    def delete(self, b: FakeBatch) -> bool:
        with self.lock:
            self._process()
            if b.status != "ended":
                return False
            del self.batches[b.id]
            self.deleted.add(b.id)
            return True

    def archived(self, b: FakeBatch) -> bool:
        return self.now() >= b.created_at + self.config.retention_days * DAY

    def batch_json(self, b: FakeBatch, results_base: str) -> dict[str, Any]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if b.status == "ended" and b.results is not None:
            for _, o in b.results:
                counts[o.type if o.type in counts else "errored"] += 1
        else:
            counts["processing"] = b.total
        archived = self.archived(b)
        return {
            "id": b.id,
            "type": "message_batch",
            "processing_status": b.status,
            "request_counts": counts,
            "ended_at": self.stamp(b.ended_at),
            "created_at": self.stamp(b.created_at),
            "expires_at": self.stamp(b.expires_at),
            "cancel_initiated_at": self.stamp(b.cancel_initiated_at),
            "archived_at": self.stamp(b.created_at + self.config.retention_days * DAY) if archived else None,
            "results_url": f"{results_base}/v1/messages/batches/{b.id}/results" if b.status == "ended" else None,
        }
