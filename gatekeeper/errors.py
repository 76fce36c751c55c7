"""Every error gatekeeper raises, under one base class.

    GatekeeperError
    ├── UsageError              bad flag, setting or environment (exit 2)
    ├── InputError              input file unreadable or changed under us (exit 2)
    ├── JournalError            state directory belongs to another job or is damaged (exit 2)
    ├── TransportError          no HTTP answer after the retries allowed
    ├── ApiError                the API answered with an error status
    │   ├── AuthenticationError 401/403: the key is wrong or lacks permission
    │   ├── NotFoundError       404
    │   ├── RequestTooLarge     413 from the edge
    │   ├── SpendLimitReached   spend cap 429 / spend limit 400: retrying cannot help
    │   ├── RateLimited         429 of the per-minute kind: wait retry-after
    │   │   └── QueueFull       429 on create: the batch queue cannot take this batch
    │   ├── ServerError         5xx and 529
    │   └── BadRequest          other 4xx
    └── CreateOutcomeUnknown    a create body may have reached the server; reconcile first

The CLI catches GatekeeperError, prints one line and exits with `exit_code`.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # all good
    FINDINGS = 1  # finished, with findings (rejected lines, failed requests, a queue verdict)
    USAGE = 2  # usage or configuration error
    INTERRUPTED = 130  # stopped by the user; resumable


class GatekeeperError(Exception):
    """Base class of every error gatekeeper raises on purpose."""

    exit_code: ExitCode = ExitCode.USAGE


class UsageError(GatekeeperError):
    """A flag, setting or environment variable is missing or wrong."""


class InputError(GatekeeperError):
    """The input cannot be read, or changed while a job depends on it."""


class JournalError(GatekeeperError):
    """The state directory cannot be used for this job."""


class TransportError(GatekeeperError):
    """No HTTP answer (connection refused, reset, timed out) after the retries allowed."""

    exit_code = ExitCode.FINDINGS

    def __init__(self, message: str, *, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint


class ApiError(GatekeeperError):
    """The API answered with an error status; carries what it said."""

    exit_code = ExitCode.FINDINGS

    def __init__(
        self,
        message: str,
        *,
        endpoint: str,
        status: int,
        error_type: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.status = status
        self.error_type = error_type
        self.api_message = message
        self.request_id = request_id
        self.retry_after = retry_after
        detail = f"{endpoint}: HTTP {status}"
        if error_type:
            detail += f" {error_type}"
        if message:
            detail += f": {message}"
        if request_id:
            detail += f" (request-id {request_id})"
        super().__init__(detail)


class AuthenticationError(ApiError):
    """401 or 403: the key is missing, invalid, or lacks permission."""

    exit_code = ExitCode.USAGE


class NotFoundError(ApiError):
    """404: no such batch (or results not available)."""


class RequestTooLarge(ApiError):
    """413: the body exceeded the endpoint's size limit."""


class SpendLimitReached(ApiError):
    """A spend cap or spend limit: no retry can succeed until it is lifted."""


class RateLimited(ApiError):
    """429 that a wait of retry-after can cure."""


class QueueFull(RateLimited):
    """429 on create: the organization's batch queue cannot take this batch now."""


class ServerError(ApiError):
    """5xx or 529 (overloaded)."""


class BadRequest(ApiError):
    """Any other 4xx: the request itself is wrong."""


class CreateOutcomeUnknown(GatekeeperError):
    """A create's body may have reached the server but no answer says what happened.

    The batch may or may not exist. Resending blindly could pay for the same
    requests twice, so the caller must reconcile against the listing first.
    """

    exit_code = ExitCode.FINDINGS
