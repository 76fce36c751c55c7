"""Every error gatekeeper raises, under one base class.

    GatekeeperError
    ├── UsageError              bad setting or environment (exit 2); JobMissing: a job to continue is not there
    │   ├── Unreachable         the API could not be reached before anything was sent (exit 2)
    │   ├── CredentialsError    no credential, or one the token endpoint refuses (exit 2)
    │   ├── LedgerError         the shared ledger cannot be opened or reached (exit 2)
    │   ├── DuplicateJob        the same input is live in another job (exit 2)
    │   └── JobLive             the named job is held by another host's unexpired lease (exit 2)
    ├── InputError              input file unreadable, empty, or changed under us (exit 2)
    ├── OutputError             the results file cannot be written (exit 2)
    ├── JournalError            the journal belongs to another job, is damaged, or cannot be reached (exit 2)
    ├── Interrupted             stopped on request; the journal is consistent (exit 130)
    ├── TransportError          no HTTP answer after the retries allowed
    ├── IncompleteDownload      a results download failed verification; retried, nothing used
    ├── ApiError                the API answered with an error status (`code`: its typed error code, if any)
    │   ├── AuthenticationError 401/403: the key is wrong or lacks permission
    │   │   └── TokenExpired    401 for an access token now dropped: sent again with a fresh one, nothing was made
    │   ├── NotFoundError       404
    │   ├── RequestTooLarge     413 from the edge
    │   ├── AccountRefused      the account's state refuses every request (on hold, CMEK key disabled, ...) (exit 2)
    │   │   └── SpendLimitReached   402, spend caps, usage limit 400: retrying cannot help until it is lifted
    │   ├── RateLimited         429 a wait of retry-after cures: per-minute, ramp limit, load shedding
    │   │   └── QueueFull       429 on create: the batch queue cannot take this batch
    │   ├── ServerError         5xx and 529
    │   └── BadRequest          other 4xx
    ├── CreateOutcomeUnknown    a create body may have reached the server; reconcile first
    └── GatewayRefusal          the gateway refuses a client's request as the API would (its status and type)

Foreign exceptions are mapped once, where their kind of I/O happens, with the
cause chained: httpx in `api/_http`, sqlite3 and psycopg in `_db` (for the journal and the
shared ledgers), redis in `state/ledger/_redis`, file OSErrors through `os_error` below, sockets of
the fake in `testing`. The CLI catches GatekeeperError, prints one line and
exits with `exit_code`; anything else is a bug and shows its traceback.

Messages name library settings (`out`, `state_dir`); an error raised about one
carries it in `setting`, which the CLI turns into its flag.
"""

from __future__ import annotations

import contextlib
import enum
import errno
from collections.abc import Iterator
from typing import Any


class ExitCode(enum.IntEnum):
    """What a command's exit status means, the same in every command."""

    OK = 0  # all good
    FINDINGS = 1  # finished, with findings (rejected lines, failed requests, a queue verdict)
    USAGE = 2  # usage or configuration error
    INTERRUPTED = 130  # stopped by the user; resumable


class GatekeeperError(Exception):
    """Base class of every error gatekeeper raises on purpose."""

    exit_code: ExitCode = ExitCode.USAGE
    disk_full: bool = False  # a write found no room where SQLite cannot say it as an OSError (`_db` sets it)


class UsageError(GatekeeperError):
    """A setting or environment variable is missing or wrong; `setting` names it when there is one."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class Unreachable(UsageError):
    """No answer from the API's URL before anything was sent: the URL or the network is wrong."""


class CredentialsError(UsageError):
    """No credential could be read, or the token endpoint refused the one given: one line naming what to fix."""


class LedgerError(UsageError):
    """The shared admission ledger cannot be opened or reached."""


class InputError(GatekeeperError):
    """The input cannot be read, or changed while a job depends on it."""


class OutputError(GatekeeperError):
    """The results file cannot be created or written."""

    def __init__(self, message: str, *, setting: str | None = "out") -> None:
        super().__init__(message)
        self.setting = setting


class JournalError(GatekeeperError):
    """The journal (a state directory, or a job in a shared database) cannot be used for this job."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class Interrupted(GatekeeperError):
    """The run was stopped on request; the journal is consistent and the run resumable."""

    exit_code = ExitCode.INTERRUPTED


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
        code: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.status = status
        self.error_type = error_type
        self.api_message = message
        self.request_id = request_id
        self.retry_after = retry_after
        self.code = code  # the API's typed error code (`error.details.error_code`), when it gave one
        detail = f"{endpoint}: HTTP {status}"
        if code or error_type:
            detail += f" {code or error_type}"  # (the code says more than the type, which the status implies)
        if message:
            detail += f": {message}"
        if request_id:
            detail += f" (request-id {request_id})"
        super().__init__(detail)


class AuthenticationError(ApiError):
    """401 or 403: the key is missing, invalid, or lacks permission. `setting` says which key."""

    setting: str | None = None

    exit_code = ExitCode.USAGE


class TokenExpired(AuthenticationError):
    """A 401 for an access token that expired on the way (the server refused the call: nothing was made). The token
    is dropped and a fresh one exchanged; what was refused may be sent again, once."""


class NotFoundError(ApiError):
    """404: no such batch (or results not available)."""


class RequestTooLarge(ApiError):
    """413: the body exceeded the endpoint's size limit."""


class AccountRefused(ApiError):
    """The account's state, not the request's: every request would get the same answer until it is lifted (an
    organization on hold, a workspace's encryption key disabled, Human Review off, a key whose creator left). The
    run stops with its requests still to send, its line naming the code; the same command continues it. `said` and
    `details`: the API's own message and `error.details` (an appeal URL), which the gateway passes on as they came."""

    exit_code = ExitCode.USAGE
    said: str | None = None
    details: dict[str, Any] | None = None


class SpendLimitReached(AccountRefused):
    """A spend cap, a usage limit or a 402: no retry can succeed until it is lifted (the API's message says when)."""


class RateLimited(ApiError):
    """429 that a wait of retry-after can cure."""


class QueueFull(RateLimited):
    """429 on create: the organization's batch queue cannot take this batch now."""


class ServerError(ApiError):
    """5xx or 529 (overloaded)."""


class BadRequest(ApiError):
    """Any other 4xx: the request itself is wrong."""


class IncompleteDownload(GatekeeperError):
    """A results download that cannot be trusted (ended short, a damaged or foreign line, a count mismatch).

    Nothing from it is used: the download is tried again later. Requests are never resent because of it.
    """

    exit_code = ExitCode.FINDINGS


class DuplicateJob(UsageError):
    """The same input is already being submitted to the same workspace by another live job."""


class JobMissing(UsageError):
    """Asked only to continue a job (an orchestrator's second step), none is recorded where it should be."""

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(f"{message}: nothing was sent. The job is prepared where `execute` ran; continue it on a "
                         "machine that sees the same journal: a state folder shared by workers and triggerers, or "
                         "journal= a PostgreSQL database", setting="state_dir")
        self.where = where


class JobLive(UsageError):
    """The named job is running elsewhere (its lease has not expired), or this run lost its lease to another."""


class CreateOutcomeUnknown(GatekeeperError):
    """A create's body may have reached the server but no answer says what happened.

    The batch may or may not exist. Resending blindly could pay for the same
    requests twice, so the caller must reconcile against the listing first.
    """

    exit_code = ExitCode.FINDINGS


class GatewayRefusal(GatekeeperError):
    """A request to `gatekeeper serve` refused as the API refuses it: the status, the error type and the message
    become the API's error envelope (a 400 naming `requests.3`, a 401, a 404)."""

    def __init__(self, status: int, message: str, *, error_type: str | None = None, code: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.code = code  # the API's typed error code, passed on as `error.details.error_code`
        self.details = details  # the API's whole `error.details`, when passing on its refusal (an appeal URL)


def os_error(exc: OSError, what: str) -> str:
    """One line for a file error: what we were doing, and the system's reason (never a traceback)."""
    reason = exc.strerror or type(exc).__name__
    name = exc.filename if exc.filename is not None else ""
    return f"{what}: {reason}" + (f": {name}" if name and str(name) not in what else "")


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) is a write that found no room: a disk or a quota full, in the journal or a
    file."""
    while exc is not None:
        if getattr(exc, "disk_full", False) or getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" \
                or (isinstance(exc, OSError) and exc.errno in _NO_ROOM):
            return True
        exc = exc.__cause__
    return False


@contextlib.contextmanager
def first_of_group() -> Iterator[None]:
    """A task group's gathered errors raised as the first of them, unwrapped: its one line, with its exit code, is
    what the CLI, the library and Airflow show (the one place a task group's wrapper is taken off)."""
    try:
        yield
    except BaseExceptionGroup as group:
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
