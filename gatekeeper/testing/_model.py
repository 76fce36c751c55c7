"""The fake organization: batches, the processing queue, outcomes. No HTTP here.

Processing model: one organization-wide processing capacity of `rate` requests
per simulated second. By default it is shared among the live batches side by
side (its batches are not documented to be served first-in first-out), and a
batch shows no progress until it ends: `processing` stays at its total, as the
real API shows it. `drain="request"` moves each processed request to its
result type at once instead (a kinder API than the real one, for tests that
want progress); `fifo=True` serves one batch at a time. The clock is compressible (`speed` simulated seconds
per real second) and can be jumped (`advance`), which is how 24-hour expiry and
the 29-day archive are tested in seconds.

Every roughness of the real API that a client must survive is a `FakeConfig`
setting, off by default unless the real API always behaves so.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._aws import FakeAws
from ._cache import CachePoint, PromptCache, Usage, billed_as

if TYPE_CHECKING:
    from ._google import FakeGoogle
    from ._oauth import FakeFederation

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
DAY = 86_400.0
OUTPUT_TOKENS = 12  # every succeeded message's output, unless its max_tokens is less


def output_of(max_tokens: Any) -> int:
    """A succeeded message's output tokens: `OUTPUT_TOKENS`, cut at the request's max_tokens as the API cuts an
    answer (never more; its stop_reason is then "max_tokens")."""
    return min(OUTPUT_TOKENS, max_tokens) if isinstance(max_tokens, int) and max_tokens >= 1 else OUTPUT_TOKENS


def new_id(prefix: str, rng: random.Random) -> str:
    return prefix + "".join(rng.choice(_B58) for _ in range(24))


@dataclass(frozen=True)
class Outcome:
    """How one request ends: "succeeded", "errored" (with an error type), "expired" or "canceled"."""

    type: str = "succeeded"
    error_type: str = "api_error"
    message: str = ""
    flat: bool = False  # errored in the flattened shape some proxies use
    stop_reason: str = "end_turn"  # a succeeded answer's: "max_tokens" (truncated), "refusal" (billed, no answer), ...


@dataclass(frozen=True)
class FakeModel:
    """One model the fake's Models API lists: its id, aliases, limits and batch support."""

    id: str
    aliases: tuple[str, ...] = ()
    display_name: str = ""
    max_tokens: int = 64_000
    max_input_tokens: int = 200_000
    batch: bool = True
    created_at: str = "2026-01-01T00:00:00Z"
    cache_min: int = 1024  # the shortest marked prefix it caches, in tokens (a shorter one is silently not cached)

    def to_json(self) -> dict[str, Any]:
        return {"type": "model", "id": self.id, "display_name": self.display_name or self.id,
                "created_at": self.created_at, "max_input_tokens": self.max_input_tokens, "max_tokens": self.max_tokens,
                "capabilities": {"batch": {"supported": self.batch}}}


# A catalogue shaped like the real one (ids, aliases and limits as the public model pages give them).
DEFAULT_MODELS: tuple[FakeModel, ...] = (
    FakeModel("claude-opus-5-5", (), "Claude Opus 5.5", 128_000, 1_000_000, created_at="2026-09-01T00:00:00Z", cache_min=512),
    FakeModel("claude-sonnet-5-5", (), "Claude Sonnet 5.5", 128_000, 1_000_000, created_at="2026-09-01T00:00:00Z"),
    FakeModel("claude-opus-5", (), "Claude Opus 5", 128_000, 1_000_000, created_at="2026-07-24T00:00:00Z", cache_min=512),
    FakeModel("claude-sonnet-5", (), "Claude Sonnet 5", 128_000, 1_000_000, created_at="2026-06-30T00:00:00Z"),
    FakeModel("claude-opus-4-6", (), "Claude Opus 4.6", 128_000, 1_000_000, created_at="2026-02-01T00:00:00Z",
              cache_min=4096),
    FakeModel("claude-sonnet-4-5-20250929", ("claude-sonnet-4-5",), "Claude Sonnet 4.5", 64_000, 200_000,
              created_at="2025-09-29T00:00:00Z"),
    FakeModel("claude-haiku-4-5-20251001", ("claude-haiku-4-5",), "Claude Haiku 4.5", 64_000, 200_000,
              created_at="2025-10-01T00:00:00Z", cache_min=4096),
)

OutcomeRule = Callable[[str, str, int], "Outcome | None"]
"""(custom_id, model, attempt) -> Outcome, or None for the default. attempt counts from 1."""


@dataclass
class FakeRealtime:
    """The real-time lane's limits (the same for every model) and roughness."""

    rpm: int = 4_000
    itpm: int = 2_000_000
    otpm: int = 400_000
    accel_window: float = 5.0  # real seconds
    accel_factor: float = 2.0
    accel_floor: float = 0.5  # share of a window's request limit a cold start may send at once
    overloaded: float = 0.0  # share of calls answered 529
    lost: float = 0.0  # share of calls processed and billed whose answer is dropped
    latency: float = 0.02  # real seconds an answer takes
    # the input limit's type, as the Admin API reports it: cache-aware (cache reads not counted), current models'
    # usual type; False: input_tokens_per_minute, which counts them
    cache_aware: bool = True


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
    fifo: bool = False  # one batch at a time, in creation order (else side by side, sharing the rate)
    drain: str = "batch"  # "batch": processing stays at the total until the end, as the API shows it; "request": falls
    not_found_after_create: float = 0.0  # real seconds a new batch answers 404 to retrieve/results
    listing_lag: float = 0.0  # real seconds a new batch is missing from the listing
    results_not_found_after_end: float = 0.0  # real seconds results (and retrieve) answer 404 after the end
    null_results_url_after_end: float = 0.0  # real seconds an ended batch shows results_url: null
    results_origin: str = "self"  # "self"; "gateway": results_url on the API's own host, unreachable behind a
    # gateway (any call there is a bypass); "signed": a signed link on another origin (a key there is a leak)
    results_redirect: bool = False  # results on our origin answer 307 to the signed origin
    damaged_downloads: int = 0  # the first N downloads of each batch's results are damaged
    damage: tuple[str, ...] = ("short", "half_line", "reset")  # how, in turn: ends early, a torn last line, a reset
    results_chunk_delay: float = 0.0  # real seconds between result chunks
    rpm: int | None = None  # requests per `rpm_window` over the batch endpoints; more get 429 with retry-after
    rpm_window: float = 60.0  # real seconds
    answer_bytes: int = 40  # text length of each succeeded message
    retention_days: float = 29.0
    cancel_delay: float = 1.0  # simulated seconds a canceling batch takes to end
    cancel_ended: str = "error"  # cancel on an ended batch: "error" (400) or "ok" (200, unchanged)
    sync_disallowed: bool = True  # stream/speed/max_tokens<1 refused at create (else errored at the end)
    rate_limit_page_size: int | None = None  # split the Admin API answer into pages of this many entries
    rate_limit_empty_first_page: bool = False
    outcome: OutcomeRule | None = None
    models: tuple[FakeModel, ...] = DEFAULT_MODELS  # what the Models API lists
    check_models: bool = True  # at processing, error requests for unknown or batch-less models, or max_tokens too high
    models_api: str = "ok"  # "ok"; "404" or "500": every Models API and count_tokens path answers so (a proxy without it)
    cache_wave: int | None = None  # requests of a batch processed concurrently (None: the whole batch at once)
    federation: FakeFederation | None = None  # the token endpoint, bearer calls, keys refused when asked (`_oauth`)
    aws: FakeAws | None = None  # Claude Platform on AWS: SigV4 (or short-term keys) and a workspace header, no Admin API
    google: FakeGoogle | None = None  # Claude on Google Cloud: path-style routes, Google tokens, IAM per route (`_google`)
    realtime: FakeRealtime = field(default_factory=FakeRealtime)  # POST /v1/messages: its limits and roughness
    usage: str = "count"  # what a succeeded request is billed and reports against count_tokens (`billed_as`):
    # "count", "count-K", "scale:F", "const:N", "noisy:P" (count x (1 ± P) per prompt) or "none" (no usage
    # reported); count_tokens is an estimate
    seed: int = 1
    lost_creates: float = 0.0  # the share of creates whose answer is lost once the batch exists (drawn per create)
    ids_seed: int | None = None  # batch ids drawn from this seed (a simulation replays them); None: unique across fakes
    # simulated seconds a new batch waits before it is processed, drawn for each batch from the fake's seeded
    # generator (the real API's turnaround, minutes to 24 hours: past its expiry a batch ends expired); None: at once
    turnaround: Callable[[random.Random], float] | None = None

    def model(self, name: str) -> FakeModel | None:
        """A model of the catalogue, by id or alias."""
        for m in self.models:
            if name == m.id or name in m.aliases:
                return m
        return None


class Seeded(Sequence[tuple[str, str]]):
    """A seeded batch's requests, each made when read: a test's queue of 280,000 seeded requests costs nothing
    to set up (as a list of tuples it was a quarter of a second, in every test that seeds one)."""

    __slots__ = ("prefix", "n")

    def __init__(self, prefix: str, n: int) -> None:
        self.prefix, self.n = prefix, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        k = i + self.n if i < 0 else i
        if not 0 <= k < self.n:
            raise IndexError(i)
        return f"{self.prefix}-{k}", "claude-x"


@dataclass
class FakeBatch:
    id: str
    workspace: str
    seq: int
    created_at: float  # simulated
    expires_at: float
    requests: Sequence[tuple[str, str]]  # (custom_id, model)
    # (input tokens, prompt digest) per request, from its prompt: usage follows the prompt, and a test can tell
    # whose request a result answers when two jobs share custom_ids (None: a seeded batch, 25 tokens each)
    prompts: Sequence[tuple[int, str]] | None = None
    points: Sequence[tuple[CachePoint, ...]] | None = None  # each request's marked prefixes (the fake's prompt cache)
    outputs: Sequence[int] | None = None  # each request's output tokens if it succeeds (`output_of` its max_tokens)
    usage: dict[int, Usage] = field(default_factory=dict)  # index -> what its prompt was billed, once succeeded
    bad: frozenset[int] = frozenset()  # indexes errored for disallowed params (per-request mode)
    doomed: dict[int, str] = field(default_factory=dict)  # index -> why the model refuses it (errored at processing)
    created_wall: float = 0.0
    ready_at: float = 0.0  # simulated time its processing may start (`FakeConfig.turnaround`)
    processed: float = 0.0
    status: str = "in_progress"
    ended_at: float | None = None
    ended_wall: float = 0.0
    cancel_initiated_at: float | None = None
    outcomes: list[Outcome] = field(default_factory=list)  # of the requests processed so far, in order
    results: list[tuple[str, Outcome]] | None = None  # every request's, once ended
    results_lost: bool = False  # its results answer 404 for good (a test sets it: results the API cannot find)

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
    versions: dict[str, str] = field(default_factory=dict)  # batch id -> the anthropic-version of its create
    # (custom_id, prompt digest) -> times it succeeded: two jobs may share custom_ids, never a prompt and an id
    answered: dict[tuple[str, str], int] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)  # custom_id -> times it was processed
    tries: dict[tuple[str, str], int] = field(default_factory=dict)  # (custom_id, prompt digest) -> times processed
    realtime: dict[str, int] = field(default_factory=dict)  # prompt digest -> times answered by POST /v1/messages
    realtime_lost: dict[str, int] = field(default_factory=dict)  # prompt digest -> of those, answers lost on the wire
    wrong_origin_keys: int = 0  # requests that reached the signed results origin carrying a key
    bypass_calls: int = 0  # requests that went around the gateway to the API's own host
    rpm_refusals: int = 0  # 429s for the RPM limit
    downloads: dict[str, int] = field(default_factory=dict)  # batch id -> results downloads started
    doomed: dict[str, str] = field(default_factory=dict)  # custom_id -> why the model refused it at processing
    requests_seen: dict[str, int] = field(default_factory=dict)  # endpoint -> count
    # model -> tokens billed for the requests that succeeded: [input, output, 5m cache write, 1h cache write, read]
    billed: dict[str, list[int]] = field(default_factory=dict)
    billed_realtime: dict[str, list[int]] = field(default_factory=dict)  # the part of `billed` the real-time lane's
    first_create_at: float | None = None
    last_end_at: float | None = None
    lost_answers: int = 0  # creates committed whose answer was dropped (`lost_creates`, a `drop_after_commit` fault)

    def bill(self, model: str, usage: Usage, *, output: int = OUTPUT_TOKENS, realtime: bool = False) -> None:
        """Add one succeeded request's tokens (`output` its output's) to what its model was billed (`realtime`: at
        standard prices)."""
        for billed in (self.billed, self.billed_realtime) if realtime else (self.billed,):
            row = billed.setdefault(model, [0, 0, 0, 0, 0])
            for k, v in enumerate((usage.input, output, usage.write_5m, usage.write_1h, usage.read)):
                row[k] += v

    def summary(self) -> dict[str, Any]:
        """What the fake received and answered, as `gatekeeper fake-api` prints it on exit."""
        return {"creates": self.creates, "requests": sum(self.tries.values()),
                "succeeded": sum(self.answered.values()), "answered_twice": sum(1 for n in self.answered.values() if n > 1),
                "refusals": len(self.refusals), "deepest_queue": self.max_depth, "lost_create_answers": self.lost_answers,
                "realtime_answered": sum(self.realtime.values()),
                "answered_in_both_lanes": len({d for _, d in self.answered} & set(self.realtime))}

    @property
    def succeeded_twice(self) -> int:
        return sum(1 for n in self.succeeded.values() if n > 1)


class Organization:
    """The fake's state. Every method takes the lock; HTTP handlers call these."""

    def __init__(self, config: FakeConfig, clock: Callable[[], float] = time.monotonic, *, epoch: float | None = None) -> None:
        self.config = config
        self.clock = clock  # the fake's real seconds: every wall reading goes through it (a test may drive it)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified whenever a request reaches the fake or it changes
        self.rng = random.Random(config.seed)
        # batch ids are unique across fakes, as the API's are (a shared ledger outlives one), unless a seed is given
        self.id_rng = random.Random() if config.ids_seed is None else random.Random(config.ids_seed)
        self.loss_rng = random.Random(f"{config.seed}:lost-creates")  # (its own draws: the others' stay as they were)
        self.batches: dict[str, FakeBatch] = {}
        self.deleted: set[str] = set()
        self.records = Records()
        self.cache = PromptCache()
        self._seq = 0
        self.realtime_calls = 0  # calls processed by POST /v1/messages (each its own writer in the prompt cache)
        self._epoch = time.time() if epoch is None else epoch  # the wall time the fake's clock started at
        self._mono0 = clock()
        self._offset = 0.0
        self._tick = 0.0  # simulated time processing has reached

    def answer_lost(self, *, dropped: bool = False) -> bool:
        """Whether this committed create's answer is lost, counted when it is: `dropped` by a fault, else drawn
        (`FakeConfig.lost_creates`; no draw for a dropped one, so a seed's draws stay as they were)."""
        with self.lock:
            lost = dropped or (self.config.lost_creates > 0 and self.loss_rng.random() < self.config.lost_creates)
            self.records.lost_answers += lost
            return lost

    # -- clock --------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the fake started."""
        return (self.clock() - self._mono0) * self.config.speed + self._offset

    def wall(self) -> float:
        """The wall time the fake shows the world now (`stamp`'s clock, as a number)."""
        return self._epoch + (self.clock() - self._mono0) + self._offset

    def wait_for(self, holds: Callable[[Records], bool], what: str, timeout: float = 20.0) -> None:
        """Block until `holds(records)`: it is asked again whenever a request reaches the fake (and every 0.1 s, for
        conditions beyond the fake). AssertionError naming `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not holds(self.records):
                left = deadline - time.monotonic()
                assert left > 0, f"timed out after {timeout} s waiting for {what}"
                self.changed.wait(min(0.1, left))

    def _changed(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def advance(self, seconds: float) -> None:
        """Jump the simulated clock forward."""
        with self.lock:
            self._offset += seconds
            self._process()

    def stamp(self, t: float | None) -> str | None:
        """The time the fake reports for simulated time `t`, on the one clock it shows the world: real time. At
        `speed` 20 a batch that takes 20 simulated minutes ends one real minute after it began, as the client's
        own readings see it; a jump of `advance` shows as a jump of the clock."""
        if t is None:
            return None
        speed = self.config.speed
        flowed = (t - self._offset) / speed if speed > 0 else 0.0  # (a frozen clock, speed 0, shows its start)
        when = dt.datetime.fromtimestamp(self._epoch + flowed + self._offset, dt.UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # -- processing ---------------------------------------------------------

    def _live(self) -> list[FakeBatch]:
        return [b for b in self.batches.values() if b.status != "ended"]

    def depth(self) -> int:
        """Requests in the processing queue: those not yet processed (the ceiling is enforced against this)."""
        return sum(b.total - len(b.outcomes) for b in self._live())

    def _process(self) -> None:
        """Advance processing to now: share the rate among the served batches, event by event."""
        now = self.now()
        t = self._tick
        while True:
            self._end_canceled(now)
            active = sorted((b for b in self._live() if b.status == "in_progress"), key=lambda b: b.seq)
            for b in [b for b in active if b.expires_at <= t]:
                self._end(b, b.expires_at, leftover="expired")
            active = [b for b in active if b.status == "in_progress"]
            if not active or t >= now or self.config.rate <= 0:
                break
            ready = [b for b in active if b.ready_at <= t]
            served = ready[:1] if self.config.fifo else ready
            share = self.config.rate / max(1, len(served))
            step = min(now - t, min(b.expires_at for b in active) - t,
                       min(((b.total - b.processed) / share for b in served), default=float("inf")),
                       min((b.ready_at - t for b in active if b.ready_at > t), default=float("inf")))
            for b in served:
                b.processed = min(float(b.total), b.processed + share * step)
                self._settle_processed(b, t + step)
            t += step
            for b in served:
                if b.processed >= b.total - 1e-9:
                    self._end(b, t, leftover="expired")
        self._tick = t if self._live() else max(t, now)

    def _end_canceled(self, now: float) -> None:
        for b in self._live():
            if b.status == "canceling":
                at = (b.cancel_initiated_at or 0.0) + self.config.cancel_delay
                if at <= now:
                    self._end(b, at, leftover="canceled")

    def _settle_processed(self, b: FakeBatch, t: float) -> None:
        """Decide the outcome of each request as it is processed at simulated time `t` (so live counts add up to
        the total), and bill what succeeded through the prompt cache."""
        done = min(b.total, int(b.processed + 1e-9))
        rule = self.config.outcome
        for i in range(len(b.outcomes), done):
            cid, model = b.requests[i]
            key = (cid, b.prompts[i][1] if b.prompts else "")
            self.records.attempts[cid] = self.records.attempts.get(cid, 0) + 1
            # (two jobs may share a custom_id: a request is its id and its prompt)
            attempt = self.records.tries[key] = self.records.tries.get(key, 0) + 1
            if i in b.bad:
                outcome: Outcome | None = Outcome("errored", "invalid_request_error", "this parameter is not supported in a batch")
            elif i in b.doomed:
                outcome = Outcome("errored", "invalid_request_error", b.doomed[i])
                self.records.doomed[cid] = b.doomed[i]
            else:
                outcome = rule(cid, model, attempt) if rule else None
            outcome = outcome or Outcome()
            if outcome.type == "succeeded":
                self.records.succeeded[cid] = self.records.succeeded.get(cid, 0) + 1
                self.records.answered[key] = self.records.answered.get(key, 0) + 1
                self._bill(b, i, model, t)
            b.outcomes.append(outcome)

    def _bill(self, b: FakeBatch, i: int, model: str, t: float) -> None:
        total = b.prompts[i][0] if b.prompts else 25
        points = b.points[i] if b.points else ()
        if points:
            m = self.config.model(model)
            wave = i // self.config.cache_wave if self.config.cache_wave else 0
            usage = self.cache.serve(b.workspace, points, total, m.cache_min if m else 1024, t, b.id, wave)
        else:
            usage = Usage(total, 0, 0, 0)
        usage = billed_as(usage, self.config.usage, b.prompts[i][1] if b.prompts else "")
        b.usage[i] = usage
        self.records.bill(model, usage, output=b.outputs[i] if b.outputs else OUTPUT_TOKENS)

    def _end(self, b: FakeBatch, at: float, leftover: str) -> None:
        self._settle_processed(b, at)
        rest = [Outcome(type=leftover) for _ in range(b.total - len(b.outcomes))]
        b.results = [(cid, o) for (cid, _), o in zip(b.requests, b.outcomes + rest, strict=True)]
        b.status = "ended"
        b.ended_at = at
        b.ended_wall = self._clock_at(at)
        self.records.last_end_at = max(self.records.last_end_at or 0.0, at)

    def _clock_at(self, t: float) -> float:
        """The clock's reading when simulated time reached `t` (processing is caught up lazily, at the next request:
        a batch that ended an hour before anyone asked ended an hour ago). After a jump (`advance`), now."""
        now = self.clock()
        if self._offset or self.config.speed <= 0:
            return now
        return min(now, self._mono0 + t / self.config.speed)

    def sync(self) -> None:
        with self.lock:
            self._process()

    # -- what the endpoints do ----------------------------------------------

    def doom(self, model: str, max_tokens: Any) -> str | None:
        """Why a request would error at processing for its model, as the real API decides it, or None."""
        return doomed_by(self.config.model(model), model, max_tokens) if self.config.check_models else None

    def create(self, workspace: str, requests: list[tuple[str, str]], bad: frozenset[int],
               doomed: dict[int, str] | None = None,
               prompts: list[tuple[int, str]] | None = None,
               points: list[tuple[CachePoint, ...]] | None = None,
               outputs: list[int] | None = None) -> FakeBatch | dict[str, Any]:
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
            turnaround = self.config.turnaround
            b = FakeBatch(
                id=new_id("msgbatch_", self.id_rng), workspace=workspace, seq=self._seq, created_at=now,
                expires_at=now + DAY, requests=requests, bad=bad, created_wall=self.clock(), doomed=doomed or {},
                prompts=prompts, points=points if points and any(points) else None, outputs=outputs,
                ready_at=now + turnaround(self.rng) if turnaround is not None else 0.0,
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
                id=new_id("msgbatch_", self.id_rng), workspace=workspace, seq=self._seq, created_at=now, expires_at=now + DAY,
                requests=Seeded(f"{prefix}-{self._seq}", n), created_wall=self.clock(),
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

    def results_url(self, b: FakeBatch, base: str) -> str | None:
        if b.status != "ended" or self.since_end(b) < self.config.null_results_url_after_end:
            return None
        if self.config.results_origin == "signed" and not self.config.results_redirect:
            return f"{base}/signed/{b.id}?sig=fake-signature"
        return f"{base}/v1/messages/batches/{b.id}/results"

    def since_end(self, b: FakeBatch) -> float:
        """Real seconds since the batch ended (infinite while it is live: no end-based delay applies)."""
        return self.clock() - b.ended_wall if b.status == "ended" else float("inf")

    def archived(self, b: FakeBatch) -> bool:
        return self.now() >= b.created_at + self.config.retention_days * DAY


def doomed_by(m: FakeModel | None, model: str, max_tokens: Any) -> str | None:
    """Why the model `m` (None: unknown) refuses a request at processing, or None."""
    if m is None:
        return f"model: {model}"
    if not m.batch:
        return f"model {model} does not support the Message Batches API"
    if isinstance(max_tokens, int) and max_tokens > m.max_tokens:
        return f"max_tokens: {max_tokens} > {m.max_tokens}, which is the maximum allowed number of output tokens for {m.id}"
    return None


def batch_json(org: Organization, b: FakeBatch, results_base: str) -> dict[str, Any]:
    """A batch as the API shows it: its counts, its times on the fake's one clock, and where its results are."""
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if b.status == "ended" and b.results is not None:
        for _, o in b.results:
            counts[o.type if o.type in counts else "errored"] += 1
    elif org.config.drain == "batch":
        counts["processing"] = b.total
    else:
        for o in b.outcomes:
            counts[o.type if o.type in counts else "errored"] += 1
        counts["processing"] = b.total - len(b.outcomes)
    archived = org.archived(b)
    return {
        "id": b.id,
        "type": "message_batch",
        "processing_status": b.status,
        "request_counts": counts,
        "ended_at": org.stamp(b.ended_at),
        "created_at": org.stamp(b.created_at),
        "expires_at": org.stamp(b.expires_at),
        "cancel_initiated_at": org.stamp(b.cancel_initiated_at),
        "archived_at": org.stamp(b.created_at + org.config.retention_days * DAY) if archived else None,
        "results_url": org.results_url(b, results_base),
    }
