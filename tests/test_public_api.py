"""The public API stays small and explicit."""

from __future__ import annotations

import gatekeeper
import gatekeeper.testing

EXPECTED = {
    "ApiConfig", "ApiError", "Batch", "BatchPlan", "CreateOutcomeUnknown", "ExitCode", "GatekeeperError", "Interrupted",
    "Limits", "PlanReport", "QueueFull", "Rejection", "Secret", "SubmitSettings", "Summary", "cancel", "dry_run",
    "iter_batches", "plan", "submit", "submit_sync",
}


def test_all_is_pinned_and_resolves() -> None:
    """__all__ is exactly the documented names, and each one exists."""
    assert set(gatekeeper.__all__) == EXPECTED
    assert all(hasattr(gatekeeper, name) for name in gatekeeper.__all__)
    assert set(gatekeeper.testing.__all__) == {"FakeAPI", "FakeConfig", "Fault", "Outcome", "Records"}


def test_one_exception_hierarchy() -> None:
    """Every error the package raises on purpose derives from GatekeeperError."""
    import inspect

    from gatekeeper import errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, Exception)]
    assert all(issubclass(c, gatekeeper.GatekeeperError) for c in classes)
    assert issubclass(gatekeeper.Interrupted, gatekeeper.GatekeeperError)
