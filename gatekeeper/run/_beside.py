"""One task with helpers beside it (a signal watcher, a stop relay), its error raised as it is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


async def beside(body: Callable[[], Awaitable[T]], *helpers: Callable[[], Coroutine[Any, Any, None]]) -> T:
    """`body()`'s result, with `helpers` running beside it until it ends (then cancelled); an error of `body` is
    raised as it is, not wrapped in the task group's ExceptionGroup."""
    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as tg:
        for helper in helpers:
            tg.start_soon(helper)
        try:
            outcome.append(await body())
        except Exception as exc:
            failure.append(exc)
        finally:
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0]
