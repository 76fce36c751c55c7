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


def rerun_of(state_dir: str) -> dict[str, Any] | None:
    """What a rerun of the job kept in `state_dir` sends, when an earlier run left its journal there (None: no
    journal, a fresh job): its requests out (created or being created: collected, never sent again), answered, and
    those still to send (the batches never created and the requests waiting for another attempt)."""
    if not os.path.exists(os.path.join(state_dir, "journal.sqlite3")):
        return None  # (no journal: nothing of the state is imported, `plan` starts as it did)
    from ..state._journal import BatchState, open_job

    j = open_job(state_dir)
    try:
        if not j.initialized:
            return None
        planned = j.batches(BatchState.PLANNED)
        out = sum(b.requests for b in j.batches(BatchState.INTENT, BatchState.CREATED, BatchState.ENDED))
        waiting = j.groups.pending_count()
        return {"state": state_dir, "out": out, "answered": j.outcomes.final_count(),
                "to_send": sum(b.requests for b in planned) + waiting, "batches": len(planned), "retries": waiting}
    finally:
        j.close()
