"""One task with helpers beside it (a signal watcher, a stop relay, lease and ledger heartbeats), the first error of
any of them raised as it is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..._tasks import tasks_beside

T = TypeVar("T")


async def beside(body: Callable[[], Awaitable[T]], *helpers: Callable[[], Coroutine[Any, Any, None]]) -> T:
    """`body()`'s result, with `helpers` running beside it until it ends (then cancelled). The first error, of
    `body` or of a helper (which then ends `body`), is raised as it is, never wrapped in the task group's
    ExceptionGroup: the CLI, the library and Airflow show it as its one line, with its exit code."""
    async with tasks_beside() as start:
        for helper in helpers:
            start(helper)
        return await body()
