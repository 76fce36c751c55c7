"""When to retry a read, and how long to wait. Pure.

Delay before retry n (0-based) is `min(base * 2**n, cap) * (1 - jitter * random())`,
times `overloaded_factor` for a 529. A server's `retry-after-ms` or `retry-after`
(seconds or an HTTP date) wins over the formula, capped at `max_retry_after`
(not at 60 s as the SDK does: queue waits are long). `x-should-retry` overrides
the status rule either way. The whole retry sequence is bounded by
`max_attempts` and `max_total` seconds.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from dataclasses import dataclass

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 6  # attempts in all, the first included
    base: float = 0.5  # seconds before the first retry, before jitter
    cap: float = 30.0  # longest computed backoff
    jitter: float = 0.25  # the delay is scaled by a factor in (1 - jitter, 1]
    overloaded_factor: float = 4.0  # 529: back off harder
    max_retry_after: float = 900.0  # longest server-given wait we honour
    max_total: float = 600.0  # seconds spent retrying one call at most
    not_found_grace: float = 300.0  # a batch we just created may 404 for this long


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the server asks us to wait, or None. `now` is wall-clock time (for HTTP dates)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value = float(ms) / 1000.0
            if value >= 0:
                return value
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        value = float(raw)
        return value if value >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def status_is_retryable(status: int, headers: Mapping[str, str]) -> bool:
    """The status rule, overridden by the server's x-should-retry."""
    should = (headers.get("x-should-retry") or "").strip().lower()
    if should == "true":
        return True
    if should == "false":
        return False
    return status in RETRYABLE_STATUSES or status >= 500


def backoff_delay(policy: RetryPolicy, retry_index: int, rand: float, *, overloaded: bool = False) -> float:
    """Computed delay before retry `retry_index` (0-based); `rand` in [0, 1)."""
    delay = float(min(policy.base * (2**retry_index), policy.cap)) * (1.0 - policy.jitter * rand)
    return delay * policy.overloaded_factor if overloaded else delay


def next_delay(
    policy: RetryPolicy, retry_index: int, rand: float, *, server_wait: float | None, overloaded: bool = False
) -> float:
    """The wait before the next attempt: the server's, when it gave one, else the formula."""
    if server_wait is not None:
        return min(server_wait, policy.max_retry_after)
    return backoff_delay(policy, retry_index, rand, overloaded=overloaded)


def is_per_minute_limit(headers: Mapping[str, str]) -> bool:
    """A 429 its headers show to be a per-minute limit: the request counter says none remain.

    The text of a queue-full refusal is not documented, so wording decides nothing:
    a 429 on create that is not shown to be per-minute is taken as queue-full, whose longer
    wait loses nothing.
    """
    remaining = headers.get("anthropic-ratelimit-requests-remaining")
    return remaining is not None and remaining.strip() == "0"


@dataclass
class CallBudget:
    """A token bucket over every call to the batch endpoints: `per_minute` a minute, in bursts of at most `burst`.

    The organization's batch RPM limit covers polling, listing, retrieving, downloading
    and creating together, and other pipelines share it: the default takes 300 of the
    smallest tier's 1,000. A 429 with retry-after pauses every call (`pause`). Pure:
    `delay(now)` says how long to wait before the next call and takes its token.
    """

    per_minute: float = 300.0
    burst: float = 20.0
    tokens: float = 20.0
    stamp: float | None = None
    paused_until: float = 0.0

    def delay(self, now: float) -> float:
        rate = self.per_minute / 60.0
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        self.tokens -= 1.0
        need = 0.0 if self.tokens >= 0 else -self.tokens / rate
        return max(need, self.paused_until - now, 0.0)

    def pause(self, until: float) -> None:
        """No call before `until` (a server's retry-after), and no burst right after it."""
        self.paused_until = max(self.paused_until, until)
        self.tokens = min(self.tokens, 0.0)
