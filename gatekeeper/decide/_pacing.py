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
- traffic ramps in whole requests, as an acceleration rule counts them: in any window of `WINDOW` seconds, a lane
  with nothing in the window before sends at most `COLD_SHARE` of a window's worth of the request limit (rounded
  up), and otherwise at most `GROWTH` times the window before (rounded down; one more than it where that is
  more). A judgement: the API's acceleration limits are real and their size unknown; this never crosses a rule of
  "twice the window before, past half the limit", counted in whole requests, even at 2 or 3 requests a window
  (a continuous ramp crossed it there, every few seconds, at 50-90 requests a minute). The windows are counted on
  our own sends, their common edge moved by `EDGE` each way: a call reaches the API some time after we count it,
  and not always the same (up to 0.2 s apart on a loaded machine: at 0.1 s, issue 58's F3 met acceleration 429s);
  a call refused with a 429 is taken out (it was not let through). Full pace comes in the third window: about
  half a window lost, whatever the job's size (docs/performance.md);
- for the same reason the request bucket keeps a reserve of the whole calls of `EDGE`'s worth (none under 300 a
  minute): calls sent evenly may reach the API that much bunched, its bucket then that much lower than ours. A
  wait of `EDGE` once; the rate is the limit's all the same;
- a 429 halves the share of the request limit in use, which then grows back by `RAMP_STEP` every `RAMP_EVERY`
  seconds; once for a burst: the 429s of calls sent before that cut (out at once, at a high limit) do not halve it
  again;
- a 429's `retry-after` is obeyed whatever its length; 5xx and dropped connections back off exponentially, a
  529 (load across all users) four times harder.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

FIRST_RPM, FIRST_ITPM, FIRST_OTPM = 50, 30_000, 8_000  # the lowest tier's, until a header says otherwise
WINDOW = 5.0  # seconds: the span an acceleration rule is taken to compare with the span before it
COLD_SHARE = 0.5  # of a window's worth of the request limit, at most, in a window with nothing before it
GROWTH = 1.9  # times the window before, at most, in any later window
EDGE = 0.2  # seconds calls may reach the API unevenly late: the windows' common edge moves by it each way
RAMP_STEP, RAMP_EVERY = 1.6, 5.0  # after a 429 halved it, the share in use grows back by 1.6 every 5 s
RAMP_FLOOR = 0.075  # the least share a run of 429s leaves
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
    ramp: float = 1.0  # the share of the request limit in use: halved by a 429, grown back after
    ramp_from: float = 1.0  # the ramp at `ramp_at`, from which it grows
    ramp_at: float = field(init=False)
    cut_at: float = float("-inf")  # when a 429 last halved the share: the calls sent before it do not halve it again
    sends: list[float] = field(default_factory=list)  # when the calls of the last two windows went, in order
    paused_until: float = 0.0
    failures: int = 0  # failed calls in a row (5xx, 529, dropped): the exponent of the backoff
    limited: int = 0  # 429s seen
    learned: bool = False  # a header has told the limits
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
        # (whole calls only: under one, each answer's header, a whole number, would take the reserve back every call)
        reserve = math.floor(self.requests.limit / 60.0 * EDGE)
        pace = self.requests.wait((1 / self.ramp if self.ramp < 1 else 1) + reserve, now)
        return max(self.paused_until - now, pace, self.input.wait(cost.input, now), self.output.wait(cost.output, now),
                   self.window_wait(now), 0.0)

    def window_wait(self, now: float) -> float:
        """Seconds before the ramp's windows let one more request go (0: now): the first moment the window ending
        then holds fewer than `window_allows` the window before it."""
        per_window = self.requests.limit * WINDOW / 60.0
        at = now
        for _ in range(64):  # (each step moves one call from the recent window into the one before: few are needed)
            recent, before, first = self._windows(at)
            if recent < window_allows(before, per_window):
                return at - now
            if first is None:
                break
            at = first + WINDOW + EDGE + 1e-6  # (when the oldest call of the recent window leaves it)
        return max(at - now, 1e-3)

    def _windows(self, at: float) -> tuple[int, int, float | None]:
        """Our calls in the window ending at `at` (its edge moved back by EDGE: a call we count as older may reach the
        API later than one we count as newer), in the window before it (narrowed by EDGE at both ends), and the
        oldest call in the recent one."""
        edge = bisect.bisect_right(self.sends, at - WINDOW - EDGE)
        start = bisect.bisect_right(self.sends, at - 2 * WINDOW + EDGE)
        return len(self.sends) - edge, edge - start, self.sends[edge] if edge < len(self.sends) else None

    def sent(self, cost: Cost, now: float) -> float:
        """A request went: its cost taken (at a share under 1, a request takes more of the request bucket), and it
        counts in the ramp's windows. The moment it counts from (to take it out again if a 429 refuses it)."""
        self.requests.refill(now)
        self.requests.level -= 1 / self.ramp if self.ramp < 1 else 1
        self.input.refill(now)
        self.input.level -= cost.input
        self.output.refill(now)
        self.output.level -= cost.output
        at = max(now, self.sends[-1]) if self.sends else now
        del self.sends[:bisect.bisect_left(self.sends, at - 2 * WINDOW - 1.0)]
        self.sends.append(at)
        return at

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

    def refused(self, headers: Mapping[str, str], retry_after: float | None, now: float,
                sent_at: float | None = None) -> None:
        """A 429: wait what it says (whatever its length; a missing one waits for the reset it names, else a
        second), and halve the share in use. The call (sent at `sent_at`) was not let through: it leaves the
        ramp's windows."""
        self.limited += 1
        self.observe(headers, now)
        if sent_at is not None and (i := bisect.bisect_left(self.sends, sent_at)) < len(self.sends) \
                and self.sends[i] == sent_at:
            del self.sends[i]
        wait = retry_after if retry_after is not None else _until_reset(headers, now)
        self.paused_until = max(self.paused_until, now + (wait if wait is not None else 1.0))
        self._grow(now)
        if sent_at is not None and sent_at < self.cut_at:
            return  # (sent before the last cut: the same burst's 429, already answered by it; four at once left 1/16)
        self.ramp = self.ramp_from = max(RAMP_FLOOR, self.ramp / 2)
        self.ramp_at = self.cut_at = now

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
        if self.ramp < 1:
            self.ramp = min(1.0, self.ramp_from * RAMP_STEP ** (max(0.0, now - self.ramp_at) / RAMP_EVERY))


def window_allows(before: int, per_window: float) -> int:
    """Requests a window of `WINDOW` seconds may hold when the window before it held `before`, at a request limit
    of `per_window` a window: `COLD_SHARE` of it from cold (rounded up: a cold lane sends at least one), else
    `GROWTH` times the window before (rounded down), or one more than it where that is more."""
    cold = max(1, math.ceil(COLD_SHARE * per_window))
    return max(cold, math.floor(GROWTH * before), before + 1 if before else 0)


def lane_seconds(n: float, per_second: float, sent: float = 0) -> float:
    """Seconds to send `n` more requests at `per_second` (what the limits sustain) by a lane that has sent `sent`
    since it was last cold: the ramp's windows (`window_allows`: half a window's worth, then 1.9 times the one
    before, up to full pace), each sending at `per_second` from its start, a window `EDGE` later than the one
    before it ends (the first call leaves the ramp's recent window only then)."""
    return max(0.0, _send_time(sent + max(0.0, n), per_second) - _send_time(sent, per_second))


def _send_time(m: float, per_second: float) -> float:
    """When a cold lane has sent `m` requests."""
    rate = max(per_second, 1e-9)
    full = rate * WINDOW
    count, start, done = min(full, window_allows(0, full)), 0.0, 0.0
    while count < full and m > done + count:
        done, start = done + count, start + WINDOW + EDGE
        count = min(full, window_allows(int(count), full))
    return start + (m - done) / rate


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
