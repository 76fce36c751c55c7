"""Named points of a run (before an intent, after a create, mid-results, ...) where the crash tests kill it.

Nothing happens at them unless a test installs `hook` in the process it is about to kill (tests/forkserver.py):
crash injection lives in the tests, not in any public argument or environment variable.
"""

from __future__ import annotations

from collections.abc import Callable

hook: Callable[[str], None] | None = None


def reached(name: str) -> None:
    if hook is not None:
        hook(name)
