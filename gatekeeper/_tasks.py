"""A task group whose first error, of its body or of a task started in it, is raised as it is: never wrapped in the
group's ExceptionGroup, so callers (the CLI, the library, Airflow) catch gatekeeper's errors by class and show each
as its one line with its exit code."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio

StartSoon = Callable[..., None]  # start_soon(task, *args): the task runs until the body ends, then is cancelled


@asynccontextmanager
async def tasks_beside() -> AsyncIterator[StartSoon]:
    """Tasks started through the yielded function run beside the body and are cancelled when it ends. A task's
    error ends the body (its scope cancelled); the first error, the body's or a task's, is raised unwrapped."""
    failure: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def guarded(task: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
            try:
                await task(*args)
            except Exception as exc:
                failure.append(exc)
                tg.cancel_scope.cancel()

        try:
            def start(task: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
                tg.start_soon(guarded, task, *args)

            yield start
        except Exception as exc:
            failure.append(exc)
        finally:
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
