"""One task with helpers beside it (a signal watcher, a stop relay, lease and ledger heartbeats), the first error of
any of them raised as it is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


async def beside(body: Callable[[], Awaitable[T]], *helpers: Callable[[], Coroutine[Any, Any, None]]) -> T:
    """`body()`'s result, with `helpers` running beside it until it ends (then cancelled). The first error, of
    `body` or of a helper (which then ends `body`), is raised as it is, never wrapped in the task group's
    ExceptionGroup: the CLI, the library and Airflow show it as its one line, with its exit code."""
    outcome: list[T] = []
    failure: list[Exception] = []

    async def helping(helper: Callable[[], Coroutine[Any, Any, None]], scope: anyio.CancelScope) -> None:
        try:
            await helper()
        except Exception as exc:
            failure.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as tg:
        for helper in helpers:
            tg.start_soon(helping, helper, tg.cancel_scope)
        try:
            outcome.append(await body())
        except Exception as exc:
            failure.append(exc)
        finally:
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0]

