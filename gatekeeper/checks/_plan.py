"""The plan command's work for a caller that owns its thread (the CLI): the first pass here, so the planner's workers
may fork; the Models API and count_tokens asked only when there is a key and a file (`_preflight.judge_plan`). Nothing
heavy is imported until it is needed: `plan` without a key starts as fast as Python."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..input._planner import PlanReport, plan

if TYPE_CHECKING:
    from ..api._config import ApiConfig
    from ..input._reader import Source
    from ..input._sizing import Limits


def plan_with_preflight(source: Source, config: ApiConfig | None, *, limits: Limits, workers: int | None = None,
                        preflight: bool = True, token_sample: int, peaks: bool = False,
                        max_rpm: float | None = None, on_retry: Callable[[dict[str, Any]], None] | None = None,
                        on_warning: Callable[[str], None] | None = None) -> PlanReport:
    """`plan_checked` for a caller that owns its thread (the CLI): the first pass in this thread, so `workers` may
    fork (nothing else runs yet), then the models judged and the tokens measured through `config` (None, or
    `preflight` False: not asked; standard input is read once, so never). `peaks`: gather the models' max_tokens
    peaks even unchecked (a deadline's forecast needs them). `on_warning` hears why the models were not checked, or
    why the estimate stays bytes / 4."""
    path = isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-"
    report = plan(source, limits=limits, workers=workers, models={} if (config and preflight and path) or peaks else None)
    if config is None or not preflight or not path:
        return report  # (its preflight None: the report says not asked)
    import anyio

    from .._errors import CredentialsError
    from ..api._queue import connect
    from ._preflight import judge_plan

    async def judge_it() -> PlanReport:
        try:
            async with connect(config, max_rpm=max_rpm, on_retry=on_retry) as conn:
                return await judge_plan(source, conn.primary, report, limits=limits, hash_content=False,
                                        token_sample=token_sample, on_warning=on_warning)
        except CredentialsError as exc:  # (a plan sizes the file without the API: its credentials are submit's need)
            if on_warning is not None:
                on_warning(f"planned offline, the models not judged and no ceiling read: {exc}")
            return report

    return anyio.run(judge_it)


__all__ = ["plan_with_preflight"]
