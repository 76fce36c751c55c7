"""What a result line means for the job. Pure.

Resent (another try can succeed): `expired`; `canceled` when the user did not
cancel; errored with a transient type. Final: `succeeded`, and errors that will
not change however often they are sent (invalid_request_error, authentication,
permission, not_found, billing, and any type we do not know: resending the
unknown only burns queue space).
"""

from __future__ import annotations

from typing import Any, NamedTuple

TRANSIENT_ERRORS = frozenset({"api_error", "overloaded_error", "timeout_error", "rate_limit_error"})


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


def usage_of(result: dict[str, Any]) -> tuple[str | None, int, int, int, int]:
    """(model, input, output, cache creation, cache read) tokens of a succeeded result."""
    msg = result.get("message") if isinstance(result, dict) else None
    if not isinstance(msg, dict):
        return None, 0, 0, 0, 0
    usage = msg.get("usage")
    u: dict[str, Any] = usage if isinstance(usage, dict) else {}

    def n(key: str) -> int:
        v = u.get(key)
        return v if isinstance(v, int) else 0

    return msg.get("model"), n("input_tokens"), n("output_tokens"), n("cache_creation_input_tokens"), n("cache_read_input_tokens")
