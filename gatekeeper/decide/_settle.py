"""What a result line means for the job. Pure.

Resent (another try can succeed): `expired`; `canceled` when the user did not
cancel; errored with a transient type. Final: `succeeded`, and errors that will
not change however often they are sent (invalid_request_error, authentication,
permission, not_found, billing, and any type we do not know: resending the
unknown only burns queue space).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

TRANSIENT_ERRORS = frozenset({"api_error", "overloaded_error", "timeout_error", "rate_limit_error"})
# Every error type a result line can carry that we know of: the API's, and the ones gatekeeper writes itself.
KNOWN_ERRORS = TRANSIENT_ERRORS | {
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error", "billing_error",
    "request_too_large", "conflict_error", "gatekeeper_missing_result", "gatekeeper_results_unavailable",
}


class Usage(msgspec.Struct, gc=False):
    """What a succeeded answer was billed (any value a gateway puts there is taken, and read as `usage_of` reads
    it: a count that is not an int counts 0)."""

    input_tokens: Any = 0
    output_tokens: Any = 0
    cache_creation_input_tokens: Any = 0
    cache_read_input_tokens: Any = 0
    cache_creation: Any = None


class Message(msgspec.Struct, gc=False):
    """Of an answer, what a job reads: its model, why it stopped, its usage (the content is skipped, not decoded)."""

    model: Any = None
    stop_reason: Any = None
    usage: Usage | None = None


class Result(msgspec.Struct, gc=False):
    """A result line's `result`: its type, and the answer's message or the error envelope."""

    type: Any = None
    message: Message | None = None
    error: Any = None


class ResultLine(msgspec.Struct, gc=False):
    custom_id: Any = None
    result: Result | None = None


_line = msgspec.json.Decoder(ResultLine)


def read_line(raw: bytes) -> tuple[Any, Result]:
    """(custom_id, result) of a result line, decoding no more than a job reads (the answer's text is skipped). A
    shape the types do not take (a result or message that is not an object) is read as values (`result_of`).
    `msgspec.DecodeError` for a line that is not JSON."""
    try:
        line = _line.decode(raw)
    except msgspec.ValidationError:
        obj = msgspec.json.decode(raw)
        return (obj.get("custom_id"), result_of(obj.get("result"))) if isinstance(obj, dict) else (None, Result())
    return line.custom_id, line.result or Result()


def result_of(result: Any) -> Result:
    """Any value given as a result (a line's, or a real-time answer's as plain values) as a `Result`: a shape the
    types do not take keeps its type and error, and has no message."""
    if result.__class__ is Result:
        return result
    if not isinstance(result, dict):
        return Result()
    try:
        return msgspec.convert(result, Result)
    except msgspec.ValidationError:
        return Result(type=result.get("type"), error=result.get("error"))


class Verdict(NamedTuple):
    type: str  # succeeded, errored, canceled, expired (or unknown)
    error_type: str | None
    retry: bool  # worth another attempt


def error_type_of(result: Result | dict[str, Any]) -> str | None:
    """result.error.error.type (documented), or result.error.type (the flattened shape some proxies send)."""
    err = result_of(result).error
    if not isinstance(err, dict):
        return None
    inner = err.get("error")
    if isinstance(inner, dict) and inner.get("type"):
        return str(inner["type"])
    kind = err.get("type")
    return str(kind) if kind and kind != "error" else None


def classify(result: Any, *, user_canceled: bool = False) -> Verdict:
    result = result_of(result)
    kind = str(result.type or "unknown")
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
    # (a final verdict as it is: `_replace` costs a line more than the rest of the verdict)
    return v._replace(retry=attempt < max_attempts) if v.retry else v


def errored_line(custom_id: str, error_type: str, message: str) -> bytes:
    """A final result line gatekeeper writes itself, in the API's errored shape, for a request the API gave none."""
    return msgspec.json.encode({"custom_id": custom_id, "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": error_type, "message": message}, "request_id": None}}})


STOPPED_EARLY = {"refused": ("refusal",), "truncated": ("max_tokens", "model_context_window_exceeded")}
"""`results --only` names for succeeded answers that stopped early (billed, but not a whole answer)."""


def stop_of(result: Result | dict[str, Any]) -> str | None:
    """The stop_reason of a succeeded result's message (end_turn, max_tokens, refusal, ...), or None."""
    msg = result_of(result).message
    reason = msg.stop_reason if msg is not None else None
    return reason if isinstance(reason, str) else None


def usage_of(result: Result | dict[str, Any]) -> tuple[str | None, int, int, int, int, int]:
    """(model, input, output, cache creation, cache read, the cache creation with a 1h life) tokens of a succeeded
    result. A usage without the `cache_creation` breakdown (older answers, some proxies) counts every write at the
    default 5-minute life."""
    msg = result_of(result).message
    if msg is None:
        return None, 0, 0, 0, 0, 0
    u = msg.usage or _NO_USAGE
    lives = u.cache_creation
    hour = lives.get("ephemeral_1h_input_tokens") if isinstance(lives, dict) else None
    created = _count(u.cache_creation_input_tokens)
    hour = min(hour, created) if isinstance(hour, int) and hour > 0 else 0
    given, output, read = u.input_tokens, u.output_tokens, u.cache_read_input_tokens  # (`_count`'s rule, inline: a line each)
    return (msg.model, given if isinstance(given, int) else 0, output if isinstance(output, int) else 0, created,
            read if isinstance(read, int) else 0, hour)


_NO_USAGE = Usage()


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


class CutAnswer(NamedTuple):
    """What a cut create's batch's answer to one request does (`cut_answer`)."""

    join: bool  # it is the request's final result (the real-time lane had not answered it)
    charged: bool  # the batch processed the request (and may have billed it)


def cut_answer(result: Any, lane_state: str | None) -> CutAnswer:
    """A batch found after the deadline cut its create's wait, its requests moved to the real-time lane
    (`lane_state`: the request's row there): an answer the batch did not process (expired, canceled, a transient
    error) is never joined, and not counted a charge; any other is joined unless the lane answered first
    (`received` or `answered`), and is then a double charge, kept aside."""
    if classify(result).retry:
        return CutAnswer(join=False, charged=False)
    return CutAnswer(join=lane_state not in ("received", "answered", None), charged=True)
