"""Pacing the real-time lane against one model's rate limits. Pure: time comes in as `now` (seconds).

The Messages API limits each model on three axes a minute (requests, input tokens, output tokens), as token
buckets that refill continuously; a request's output is charged at its `max_tokens` when it starts and corrected
when it ends, and cache reads do not count against input tokens. `Pace` mirrors those buckets on our side:

- a request may go when every bucket holds its cost (requests: 1; input: an estimate from its size; output: its
  `max_tokens`), and no wait the server asked for is running;
- each answer's `anthropic-ratelimit-*` headers correct the buckets (the limit is taken as said; the level is
  never raised above what the header says remains, rounding included), and its usage gives back what was
  over-charged (output under `max_tokens`, input read from the cache);
- the requests bucket holds one second's worth: a 60 RPM limit may be enforced as one a second, so sending is
  spread evenly and never bursts;
- traffic ramps: the share of the request limit in use starts at `RAMP_START` and grows continuously, by
  `RAMP_STEP` every `RAMP_EVERY` seconds, without a 429; a 429 halves it. A judgement (the API's acceleration
  limits are real and their size unknown): a cold start at under half the limit, and never more in any window
  than 1.9 times the window before, so a rule of "twice the window before, past half the limit" is never
  crossed (stepped growth crossed it at each step, and each 429 halved the ramp). Full pace comes about 13 s
  after the first request: about 5 s lost to the ramp, whatever the job's size (docs/performance.md);
- a 429's `retry-after` is obeyed whatever its length; 5xx and dropped connections back off exponentially, a
  529 (load across all users) four times harder.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

FIRST_RPM, FIRST_ITPM, FIRST_OTPM = 50, 30_000, 8_000  # the lowest tier's, until a header says otherwise
RAMP_START, RAMP_STEP, RAMP_EVERY = 0.3, 1.6, 5.0
ROUNDING = 500  # token `remaining` values are rounded to the nearest thousand: take the low side
BACKOFF_BASE, BACKOFF_CAP, OVERLOADED_FACTOR = 0.5, 30.0, 4.0
# The SDKs refuse a non-streaming call they expect to run past ten minutes: 60 minutes for 128,000 output tokens.
STREAM_ABOVE_TOKENS = 600 * 128_000 // 3600
SLOW_STREAM_ABOVE = 8_192  # the SDK's MODEL_NONSTREAMING_TOKENS for Opus 4 and 4.1
SLOW_FAMILIES = ("claude-opus-4-0", "claude-opus-4-2025", "claude-4-opus", "claude-opus-4@", "claude-opus-4-1")
_AXES = ("requests", "input-tokens", "output-tokens")


@dataclass
class Bucket:
    """`limit` a minute, refilled continuously up to `capacity`."""

    limit: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(0.0, now - self.at) * self.limit / 60.0)
        self.at = max(self.at, now)

    def wait(self, cost: float, now: float) -> float:
        """Seconds until this bucket holds `cost` (at most its capacity: a cost above it waits for a full bucket)."""
        self.refill(now)
        need = min(cost, self.capacity) - self.level
        return 0.0 if need <= 0 else need * 60.0 / self.limit

    def observe(self, limit: float, remaining: float, now: float, *, per_second: bool) -> None:
        """A header's limit and remaining: the limit as said, the level never above what remains."""
        self.refill(now)
        self.limit = max(1.0, limit)
        self.capacity = max(1.0, limit / 60.0) if per_second else self.limit
        self.level = min(self.level, remaining, self.capacity)


def _bucket(limit: float, now: float, *, per_second: bool = False) -> Bucket:
    cap = max(1.0, limit / 60.0) if per_second else limit
    return Bucket(limit, cap, cap, now)


@dataclass(frozen=True)
class Cost:
    """What a request is charged when it starts: one request, its estimated input tokens, its `max_tokens`."""

    input: int
    output: int


@dataclass
class Pace:
    """One model's pace in the real-time lane (see the module docstring)."""

    now: float
    requests: Bucket = field(init=False)
    input: Bucket = field(init=False)
    output: Bucket = field(init=False)
    ramp: float = RAMP_START
    ramp_from: float = RAMP_START  # the ramp at `ramp_at`, from which it grows
    ramp_at: float = field(init=False)
    paused_until: float = 0.0
    failures: int = 0  # failed calls in a row (5xx, 529, dropped): the exponent of the backoff
    limited: int = 0  # 429s seen
    learned: bool = False  # a header has told the limits
    sending: bool = False  # a request has gone: the ramp grows from the first one, not from when the pace was made
    reads_count: bool = False  # the input limit counts cache reads (else, the cache-aware type, it does not)

    def __post_init__(self) -> None:
        self.requests = _bucket(FIRST_RPM, self.now, per_second=True)
        self.input = _bucket(FIRST_ITPM, self.now)
        self.output = _bucket(FIRST_OTPM, self.now)
        self.ramp_at = self.now

    def seed(self, rpm: int, itpm: int, otpm: int, reads_count: bool = False) -> None:
        """Limits read before any call (the Admin API's): the buckets take them, full. Other traffic may be using
        them: the first answers' headers lower the levels to what remains (a burst before them is bounded by the
        request ramp, and a 429 it draws is obeyed). `reads_count`: the input limit counts cache reads (the
        `input_tokens_per_minute` type; the cache-aware type does not)."""
        self.reads_count = reads_count
        self.requests = _bucket(rpm, self.now, per_second=True)
        self.input, self.output = _bucket(itpm, self.now), _bucket(otpm, self.now)

    def wait(self, cost: Cost, now: float) -> float:
        """Seconds before a request of this cost may go (0: now)."""
        self._grow(now)
        pace = self.requests.wait(1 / self.ramp, now) if self.ramp < 1 else self.requests.wait(1, now)
        return max(self.paused_until - now, pace, self.input.wait(cost.input, now), self.output.wait(cost.output, now), 0.0)

    def sent(self, cost: Cost, now: float) -> None:
        """A request went: its cost taken (at the ramp's share, a request takes more of the request bucket)."""
        if not self.sending:
            self.sending, self.ramp_at, self.ramp_from = True, now, self.ramp
        self.requests.refill(now)
        self.requests.level -= 1 / self.ramp if self.ramp < 1 else 1
        self.input.refill(now)
        self.input.level -= cost.input
        self.output.refill(now)
        self.output.level -= cost.output

    def answered(self, headers: Mapping[str, str], cost: Cost, billed: tuple[int, int] | None, now: float) -> None:
        """An answer: the headers correct the buckets; `billed` (input tokens counted by the limit, output tokens)
        gives back what the start over-charged."""
        self.failures = 0
        self.observe(headers, now)
        if billed is not None:
            self.input.level = min(self.input.capacity, self.input.level + max(0, cost.input - billed[0]))
            self.output.level = min(self.output.capacity, self.output.level + max(0, cost.output - billed[1]))

    def observe(self, headers: Mapping[str, str], now: float) -> None:
        for axis, bucket in zip(_AXES, (self.requests, self.input, self.output), strict=True):
            limit = _number(headers.get(f"anthropic-ratelimit-{axis}-limit"))
            remaining = _number(headers.get(f"anthropic-ratelimit-{axis}-remaining"))
            if limit is None or remaining is None:
                continue
            slack = 0 if axis == "requests" else ROUNDING
            bucket.observe(limit, max(0.0, remaining - slack), now, per_second=axis == "requests")
            self.learned = True

    def refused(self, headers: Mapping[str, str], retry_after: float | None, now: float) -> None:
        """A 429: wait what it says (whatever its length; a missing one waits for the reset it names, else a
        second), and halve the ramp."""
        self.limited += 1
        self.observe(headers, now)
        wait = retry_after if retry_after is not None else _until_reset(headers, now)
        self.paused_until = max(self.paused_until, now + (wait if wait is not None else 1.0))
        self._grow(now)
        self.ramp = self.ramp_from = max(RAMP_START / 4, self.ramp / 2)
        self.ramp_at = now

    def failed(self, now: float, rand: float, *, overloaded: bool = False) -> float:
        """A 5xx, a 529 (`overloaded`) or a dropped connection: the wait before this model's next call."""
        delay = min(BACKOFF_BASE * 2.0 ** min(self.failures, 16), BACKOFF_CAP) * (1 - 0.25 * rand)
        delay *= OVERLOADED_FACTOR if overloaded else 1.0
        self.failures += 1
        self.paused_until = max(self.paused_until, now + delay)
        return delay

    def per_second(self, cost: Cost) -> float:
        """Requests a second these limits sustain for requests like `cost` (for projecting the lane's time)."""
        rates = [self.requests.limit / 60.0]
        if cost.input > 0:
            rates.append(self.input.limit / 60.0 / cost.input)
        if cost.output > 0:
            rates.append(self.output.limit / 60.0 / cost.output)
        return float(min(rates))

    def _grow(self, now: float) -> None:
        if self.sending and self.ramp < 1:
            self.ramp = min(1.0, self.ramp_from * RAMP_STEP ** (max(0.0, now - self.ramp_at) / RAMP_EVERY))


def lane_seconds(n: float, per_second: float, ramp: float = RAMP_START) -> float:
    """Seconds to send `n` requests at `per_second` (what the limits sustain) when the ramp stands at `ramp` and
    grows continuously (a cold lane reaches full pace in about 13 s)."""
    rate = max(per_second, 1e-9)
    if ramp >= 1:
        return max(0.0, n) / rate
    k = math.log(RAMP_STEP) / RAMP_EVERY  # the ramp is ramp * e^(k t)
    full = math.log(1 / ramp) / k  # when it reaches 1
    sent_by_full = rate * ramp * (math.exp(k * full) - 1) / k
    if n <= sent_by_full:
        return math.log(1 + n * k / (rate * ramp)) / k
    return full + (n - sent_by_full) / rate


def _number(raw: str | None) -> float | None:
    try:
        return None if raw is None else float(raw)
    except ValueError:
        return None


def _until_reset(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds until the latest `*-reset` time the headers name (RFC 3339), or None."""
    waits = []
    for axis in _AXES:
        raw = headers.get(f"anthropic-ratelimit-{axis}-reset")
        if raw:
            try:
                waits.append(dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() - now)
            except ValueError:
                continue
    return max(waits) if waits else None


def must_stream(max_tokens: int, model: str = "") -> bool:
    """Whether the SDKs would refuse this request without streaming (it may run past ten minutes): above 21,333
    `max_tokens`, or above 8,192 for the slower Opus 4 and 4.1 (the SDK's per-model list, read by family here, so a
    dated or platform id of them streams too; streaming costs nothing more)."""
    limit = SLOW_STREAM_ABOVE if any(f in model for f in SLOW_FAMILIES) else STREAM_ABOVE_TOKENS
    return max_tokens > limit
