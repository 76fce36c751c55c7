"""gatekeeper: get very large Message Batches jobs through the API without tripping its limits."""

from .errors import (
    ApiError,
    CreateOutcomeUnknown,
    ExitCode,
    GatekeeperError,
    QueueFull,
)
from .config import ApiConfig, Secret
from .planner import Batch, BatchPlan, PlanReport, iter_batches, plan
from .runner import Interrupted, SubmitSettings, Summary
from .submit import cancel, dry_run, submit, submit_sync
from .reader import Rejection
from .sizing import Limits

__version__ = "0.1.0"

__all__ = [
    "ApiConfig",
    "ApiError",
    "Batch",
    "BatchPlan",
    "CreateOutcomeUnknown",
    "ExitCode",
    "GatekeeperError",
    "Interrupted",
    "Limits",
    "PlanReport",
    "QueueFull",
    "Rejection",
    "Secret",
    "SubmitSettings",
    "Summary",
    "cancel",
    "dry_run",
    "iter_batches",
    "plan",
    "submit",
    "submit_sync",
]
