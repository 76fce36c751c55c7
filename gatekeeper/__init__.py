"""gatekeeper: get very large Message Batches jobs through the API without tripping its limits.

Example::

    import gatekeeper
    report = gatekeeper.plan("requests.jsonl")
    summary = gatekeeper.submit_sync("requests.jsonl", config=gatekeeper.ApiConfig.from_env(os.environ))

Names are loaded on first use, so `import gatekeeper` (and `gatekeeper --version`)
costs no more than the names a program touches: `plan` never imports httpx or anyio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

# public name -> private module that defines it
_EXPORTS: dict[str, str] = {
    # plan: reading, validating and sizing
    "plan": "input._planner", "PlanReport": "input._planner", "BatchPlan": "input._planner",
    "iter_batches": "input._batches", "Batch": "input._batches",
    "Rejection": "input._reader", "Request": "input._batches", "Limits": "input._sizing", "CacheScan": "input._caching",
    # submit and friends
    "submit": "run._submit", "submit_sync": "run._submit", "dry_run": "run._submit", "cancel": "run._submit", "job_summary": "run._submit",
    "preflight": "run._submit", "forecast_deadline": "checks._forecast",
    "SubmitSettings": "run.shared._settings", "Summary": "run.shared._summary", "DryRun": "run.shared._summary", "Canceled": "run.shared._summary",
    "CanceledBatch": "run.shared._summary", "ApiConfig": "api._config", "Secret": "api._config", "AwsPlatform": "api._aws",
    "Platform": "api._platform", "GooglePlatform": "api._google", "status": "checks._status", "Status": "checks._status",
    "Auth": "api._tokens", "Outgoing": "api._tokens",  # (what a `Platform` subclass's hooks give and take)
    "Headroom": "decide._headroom", "QueuedBatch": "decide._headroom", "LedgerReading": "state.ledger._base",
    "BearerToken": "api._credentials", "Federation": "api._credentials", "ProfileLogin": "api._credentials",
    "RetryPolicy": "api._retry", "PriceTable": "_prices", "Rates": "_prices", "load_prices": "_prices",
    "Ledger": "state.ledger._base", "Liveness": "state.ledger._base", "open_ledger": "state.ledger._open",
    "Reservation": "state.ledger._base", "Claim": "state._claims", "ClaimPost": "state._claims", "Board": "state._claims",
    "export": "run.shared._results", "Clock": "_clock", "WallClock": "_clock",
    # the type aliases public functions take (what a caller may name in its own annotations)
    "Source": "input._reader", "ModelRules": "input._reader", "EventSink": "run.shared._settings",
    "ResultSink": "run._loop", "Credential": "api._credentials", "TokenProvider": "api._google",
    "RetryNotice": "api._http", "TableJudge": "tables._plan", "Spawn": "api._tokens",
    # table jobs (the tables extra: pyarrow)
    "submit_table": "tables._job", "submit_table_sync": "tables._job", "plan_table": "tables._plan",
    "TableSpec": "tables._rows", "Template": "tables._template", "TableResult": "tables._job", "TablePlan": "tables._plan",
    # errors
    "GatekeeperError": "_errors", "ExitCode": "_errors", "UsageError": "_errors", "Unreachable": "_errors",
    "LedgerError": "_errors", "CredentialsError": "_errors", "TokenExpired": "_errors",
    "InputError": "_errors", "OutputError": "_errors", "JournalError": "_errors",
    "Interrupted": "_errors", "TransportError": "_errors", "ApiError": "_errors", "AuthenticationError": "_errors",
    "NotFoundError": "_errors", "RequestTooLarge": "_errors", "SpendLimitReached": "_errors", "RateLimited": "_errors",
    "AccountRefused": "_errors",
    "QueueFull": "_errors", "ServerError": "_errors", "BadRequest": "_errors", "CreateOutcomeUnknown": "_errors",
    "IncompleteDownload": "_errors", "DuplicateJob": "_errors", "JobLive": "_errors", "JobMissing": "_errors",
}

# (a literal list: type checkers read it to know what is exported; a test holds it to `_EXPORTS`)
__all__ = [
    "AccountRefused", "ApiConfig", "ApiError", "Auth", "AuthenticationError", "AwsPlatform", "BadRequest", "Batch",
    "BatchPlan", "BearerToken", "Board", "CacheScan", "Canceled", "CanceledBatch", "Claim", "ClaimPost", "Clock",
    "CreateOutcomeUnknown", "Credential", "CredentialsError", "DryRun", "DuplicateJob", "EventSink", "ExitCode",
    "Federation", "GatekeeperError", "GooglePlatform", "Headroom", "IncompleteDownload", "InputError",
    "Interrupted", "JobLive", "JobMissing", "JournalError", "Ledger", "LedgerError", "LedgerReading", "Limits",
    "Liveness", "ModelRules", "NotFoundError", "Outgoing", "OutputError", "PlanReport", "Platform", "PriceTable",
    "ProfileLogin", "QueueFull", "QueuedBatch", "RateLimited", "Rates", "Rejection", "Request", "RequestTooLarge",
    "Reservation", "ResultSink", "RetryNotice", "RetryPolicy", "Secret", "ServerError", "Source", "Spawn",
    "SpendLimitReached", "Status", "SubmitSettings", "Summary", "TableJudge", "TablePlan", "TableResult",
    "TableSpec", "Template", "TokenExpired", "TokenProvider", "TransportError", "Unreachable", "UsageError",
    "WallClock", "cancel", "dry_run", "export", "forecast_deadline", "iter_batches", "job_summary", "load_prices",
    "open_ledger", "plan", "plan_table", "preflight", "status", "submit", "submit_sync", "submit_table",
    "submit_table_sync",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gatekeeper' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])


if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` loads each on first use
    from ._clock import Clock, WallClock
    from ._errors import (
        AccountRefused,
        ApiError,
        AuthenticationError,
        BadRequest,
        CreateOutcomeUnknown,
        CredentialsError,
        DuplicateJob,
        ExitCode,
        GatekeeperError,
        IncompleteDownload,
        InputError,
        Interrupted,
        JobLive,
        JobMissing,
        JournalError,
        LedgerError,
        NotFoundError,
        OutputError,
        QueueFull,
        RateLimited,
        RequestTooLarge,
        ServerError,
        SpendLimitReached,
        TokenExpired,
        TransportError,
        Unreachable,
        UsageError,
    )
    from ._prices import PriceTable, Rates, load_prices
    from .api._aws import AwsPlatform
    from .api._config import ApiConfig, Secret
    from .api._credentials import BearerToken, Credential, Federation, ProfileLogin
    from .api._google import GooglePlatform, TokenProvider
    from .api._http import RetryNotice
    from .api._platform import Platform
    from .api._retry import RetryPolicy
    from .api._tokens import Auth, Outgoing, Spawn
    from .checks._forecast import forecast_deadline
    from .checks._status import Status, status
    from .decide._headroom import Headroom, QueuedBatch
    from .input._batches import Batch, Request, iter_batches
    from .input._caching import CacheScan
    from .input._planner import BatchPlan, PlanReport, plan
    from .input._reader import ModelRules, Rejection, Source
    from .input._sizing import Limits
    from .run._loop import ResultSink
    from .run._submit import cancel, dry_run, job_summary, preflight, submit, submit_sync
    from .run.shared._results import export
    from .run.shared._settings import EventSink, SubmitSettings
    from .run.shared._summary import Canceled, CanceledBatch, DryRun, Summary
    from .state._claims import Board, Claim, ClaimPost
    from .state.ledger._base import Ledger, LedgerReading, Liveness, Reservation
    from .state.ledger._open import open_ledger
    from .tables._job import TableResult, submit_table, submit_table_sync
    from .tables._plan import TableJudge, TablePlan, plan_table
    from .tables._rows import TableSpec
    from .tables._template import Template
