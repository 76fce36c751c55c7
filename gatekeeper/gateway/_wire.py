"""The API's wire as the gateway speaks it, byte for byte where a client could notice: ids, times, the error
envelope and its types, the MessageBatch object a book record becomes. Pure."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import orjson

from ..state._gateway import BatchRecord

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
BATCH_LIFETIME = 86_400.0  # seconds from created_at to expires_at, as the API reports them
# The API's error types by status (the SDK dispatches on the status, then reads error.type).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "api_error", 504: "timeout_error",
               529: "overloaded_error"}
NOT_FOUND = "The requested resource could not be found."
COUNT_KEYS = ("processing", "succeeded", "errored", "canceled", "expired")


def new_id(prefix: str) -> str:
    """An id as the API makes them: the prefix and 24 base58 characters (random: 140 bits)."""
    return prefix + "".join(secrets.choice(_B58) for _ in range(24))


def stamp(seconds: float | None) -> str | None:
    """RFC 3339 with microseconds and Z, as the API writes times."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def error_body(status: int, message: str, request_id: str, error_type: str | None = None,
               code: str | None = None, details: dict[str, Any] | None = None) -> bytes:
    """The API's error envelope (a 413 as the API's edge sends it: no top-level type, no request id), with its typed
    code in `details` when there is one (the API's whole `details`, an appeal URL with it, when passing one on)."""
    kind = error_type or ERROR_TYPES.get(status, "api_error")
    if status == 413:
        return orjson.dumps({"error": {"type": kind, "message": message}})
    error: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        error["details"] = {**(details or {}), "error_code": code}
    return orjson.dumps({"type": "error", "error": error, "request_id": request_id})


def counts_of(record: BatchRecord) -> dict[str, int]:
    """request_counts as the API shows them: everything `processing` until the whole batch has ended."""
    if record.status == "ended" and record.counts is not None:
        return {k: int(record.counts.get(k, 0)) for k in COUNT_KEYS}
    return {"processing": record.requests, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}


def batch_json(record: BatchRecord, base_url: str) -> dict[str, Any]:
    """The MessageBatch object of a book record; `results_url` on the gateway (`base_url`) once it has ended."""
    ended = record.status == "ended"
    return {
        "id": record.id,
        "type": "message_batch",
        "processing_status": record.status,
        "request_counts": counts_of(record),
        "ended_at": stamp(record.ended_at) if ended else None,
        "created_at": stamp(record.created_at),
        "expires_at": stamp(record.created_at + BATCH_LIFETIME),
        "cancel_initiated_at": stamp(record.cancel_at),
        "archived_at": None,
        "results_url": f"{base_url.rstrip('/')}/v1/messages/batches/{record.id}/results" if ended else None,
    }


def page_json(records: list[BatchRecord], has_more: bool, base_url: str) -> dict[str, Any]:
    """A listing page: data, has_more, first_id and last_id (null on an empty page)."""
    data = [batch_json(r, base_url) for r in records]
    return {"data": data, "has_more": has_more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}
