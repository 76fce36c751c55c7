"""What a result line means for the job. Pure.

Resent (another try can succeed): `expired`; `canceled` when the user did not
cancel; errored with a transient type. Final: `succeeded`, and errors that will
not change however often they are sent (invalid_request_error, authentication,
permission, not_found, billing, and any type we do not know: resending the
unknown only burns queue space).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

TRANSIENT_ERRORS = frozenset({"api_error", "overloaded_error", "timeout_error", "rate_limit_error"})
# Every error type a result line can carry that we know of: the API's, and the ones gatekeeper writes itself.
KNOWN_ERRORS = TRANSIENT_ERRORS | {
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error", "billing_error",
    "request_too_large", "conflict_error", "gatekeeper_missing_result", "gatekeeper_results_unavailable",
}


class Verdict(NamedTuple):
    type: str  # succeeded, errored, canceled, expired (or unknown)
    error_type: str | None
    retry: bool  # worth another attempt


def error_type_of(result: dict[str, Any]) -> str | None:
    """result.error.error.type (documented), or result.error.type (the flattened shape some proxies send)."""
    err = result.get("error")
    if not isinstance(err, dict):
        return None
    inner = err.get("error")
    if isinstance(inner, dict) and inner.get("type"):
        return str(inner["type"])
    kind = err.get("type")
    return str(kind) if kind and kind != "error" else None


def classify(result: Any, *, user_canceled: bool = False) -> Verdict:
    if not isinstance(result, dict):
        return Verdict("unknown", None, False)
    kind = str(result.get("type") or "unknown")
    if kind == "succeeded":
        return Verdict(kind, None, False)
    if kind == "errored":
        et = error_type_of(result)
        return Verdict(kind, et, et in TRANSIENT_ERRORS)
    if kind == "expired":
        return Verdict(kind, None, True)
    if kind == "canceled":
        return Verdict(kind, None, not user_canceled)
    return Verdict(kind, None, False)


def settle(result: Any, *, attempt: int, max_attempts: int, user_canceled: bool = False) -> Verdict:
    """The verdict on one result: `retry` only when another try can succeed and attempts are left."""
    v = classify(result, user_canceled=user_canceled)
    return v._replace(retry=v.retry and attempt < max_attempts)


def errored_line(custom_id: str, error_type: str, message: str) -> bytes:
    """A final result line gatekeeper writes itself, in the API's errored shape, for a request the API gave none."""
    return orjson.dumps({"custom_id": custom_id, "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": error_type, "message": message}, "request_id": None}}})


STOPPED_EARLY = {"refused": ("refusal",), "truncated": ("max_tokens", "model_context_window_exceeded")}
"""`results --only` names for succeeded answers that stopped early (billed, but not a whole answer)."""


def stop_of(result: dict[str, Any]) -> str | None:
    """The stop_reason of a succeeded result's message (end_turn, max_tokens, refusal, ...), or None."""
    msg = result.get("message") if isinstance(result, dict) else None
    reason = msg.get("stop_reason") if isinstance(msg, dict) else None
    return reason if isinstance(reason, str) else None


def usage_of(result: dict[str, Any]) -> tuple[str | None, int, int, int, int, int]:
    """(model, input, output, cache creation, cache read, the cache creation with a 1h life) tokens of a succeeded
    result. A usage without the `cache_creation` breakdown (older answers, some proxies) counts every write at the
    default 5-minute life."""
    msg = result.get("message") if isinstance(result, dict) else None
    if not isinstance(msg, dict):
        return None, 0, 0, 0, 0, 0
    usage = msg.get("usage")
    u: dict[str, Any] = usage if isinstance(usage, dict) else {}

    def n(key: str) -> int:
        v = u.get(key)
        return v if isinstance(v, int) else 0

    lives = u.get("cache_creation")
    hour = lives.get("ephemeral_1h_input_tokens") if isinstance(lives, dict) else None
    created = n("cache_creation_input_tokens")
    hour = min(hour, created) if isinstance(hour, int) and hour > 0 else 0
    return msg.get("model"), n("input_tokens"), n("output_tokens"), created, n("cache_read_input_tokens"), hour
