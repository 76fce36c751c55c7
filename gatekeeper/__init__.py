"""gatekeeper: get very large Message Batches jobs through the API without tripping its limits."""

from .errors import (
    ApiError,
    CreateOutcomeUnknown,
    ExitCode,
    GatekeeperError,
    QueueFull,
)
from .planner import Batch, BatchPlan, PlanReport, iter_batches, plan
from .reader import Rejection
from .sizing import Limits

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "Batch",
    "BatchPlan",
    "CreateOutcomeUnknown",
    "ExitCode",
    "GatekeeperError",
    "Limits",
    "PlanReport",
    "QueueFull",
    "Rejection",
    "iter_batches",
    "plan",
]
