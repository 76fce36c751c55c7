"""Preflight: judge the input's models against the live Models API before anything is sent.

The API accepts a batch whose requests name a model that does not exist, a model
without batch support, or a `max_tokens` above the model's limit, and reports
each as `errored` when the batch ends, hours later. A file of millions of lines
names a handful of models, so each is asked about once (`GET /v1/models/{name}`,
which also resolves aliases) and every line is judged against the answers while
it is read. The judging is pure (`judge_model`, `needs_second_pass`); `check_models` is
the I/O. When the Models API cannot be reached or does not exist (a proxy
without it), nothing is judged and the run goes on, saying so: preflight never
blocks a job by itself.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._clock import run_sync
from .._errors import AccountRefused, ApiError, AuthenticationError, NotFoundError, TransportError, Unreachable
from ..api._client import ApiClient
from ..api._reads import get_model, iter_models
from ..input._planner import PlanReport, plan
from ..input._reader import ModelRules
from ..input._sizing import Limits
from ._calibrate import SAMPLE_PER_MODEL, calibrate

if TYPE_CHECKING:
    from ..input._reader import Source


@dataclass(frozen=True)
class ModelCheck:
    """What the Models API said of one model name as the input writes it."""

    name: str
    resolved: str | None = None  # the API's id (an alias resolves to a dated id)
    max_tokens: int | None = None  # the largest max_tokens it accepts, when the API says
    batch: bool | None = None  # capabilities.batch.supported, when the API says
    refused: str | None = None  # why every line naming it is rejected; None when usable

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "resolved": self.resolved, "max_tokens": self.max_tokens, "batch": self.batch,
                "refused": self.refused}


@dataclass
class Preflight:
    checked: bool
    reason: str | None = None  # why the models were not checked
    models: dict[str, ModelCheck] = field(default_factory=dict)

    def rules(self) -> ModelRules:
        return {name: (m.refused, m.max_tokens) for name, m in self.models.items()} if self.checked else {}

    def to_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "reason": self.reason, "models": {n: m.to_json() for n, m in self.models.items()}}


def judge_model(name: str, info: dict[str, Any] | None, known_ids: Iterable[str]) -> ModelCheck:
    """One model name against the API's answer (None: 404, not a model it knows)."""
    if info is None:
        close = difflib.get_close_matches(name, list(known_ids), n=3, cutoff=0.5)
        hint = f"; the closest the API lists: {', '.join(close)}" if close else ""
        return ModelCheck(name, refused=f"model {name!r}: not a model the Models API knows{hint}")
    caps = info.get("capabilities")
    batch = (caps.get("batch") or {}).get("supported") if isinstance(caps, dict) else None
    limit = info.get("max_tokens") if isinstance(info.get("max_tokens"), int) else None
    resolved = str(info.get("id") or name)
    if batch is False:
        return ModelCheck(name, resolved, limit, False, f"model {name!r}: {resolved} does not take batch requests")
    return ModelCheck(name, resolved, limit, batch if isinstance(batch, bool) else None)


def needs_second_pass(pf: Preflight, peaks: dict[str, int]) -> bool:
    """Whether any line can be rejected by the answers: a refused model, or a max_tokens seen above a limit."""
    return pf.checked and any(
        m.refused is not None or (m.max_tokens is not None and peaks.get(name, 0) > m.max_tokens)
        for name, m in pf.models.items())


async def check_models(api: ApiClient, names: Iterable[str]) -> Preflight:
    """Ask the Models API about each name once; a Models API that is absent or failing gives `checked=False`."""
    try:
        known = [str(m.get("id")) async for m in iter_models(api)]
        answers = {name: await _model_or_none(api, name) for name in sorted(set(names))}
    except AuthenticationError as exc:
        if exc.status == 401:  # a refused key is the user's to fix, not an API that lacks the endpoint (exit 2)
            raise
        return Preflight(False, f"the Models API could not be used ({exc}): the models were not checked")
    except AccountRefused:
        raise  # (the account's state, a usage limit say: every command stops on it, naming it, exit 2)
    except (ApiError, TransportError, Unreachable) as exc:
        return Preflight(False, f"the Models API could not be used ({exc}): the models were not checked")
    return Preflight(True, None, {name: judge_model(name, info, known) for name, info in answers.items()})


async def _model_or_none(api: ApiClient, name: str) -> dict[str, Any] | None:
    try:
        return await get_model(api, name)
    except NotFoundError:
        return None


def outcome(pf: Preflight, errors: Iterable[Any], dropped: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The preflight as reports show it: checked or why not, and per model its answer and the lines it rejected
    (`dropped`: those a report counted without keeping, by `model 'x'`)."""
    out = pf.to_json()
    if pf.checked:
        counts: dict[str, int] = {name: (dropped or {}).get(f"model {name!r}", 0) for name in pf.models}
        for e in errors:
            for name in pf.models:
                if e.reason.startswith(f"model {name!r}:"):
                    counts[name] = counts.get(name, 0) + 1
        for name, m in out["models"].items():
            m["lines_rejected"] = counts.get(name, 0)
    return out


NOT_ASKED = {"checked": False, "reason": "preflight off or no workspace key: the models were not checked", "models": {}}


async def _off_loop(source: Source, **kwargs: Any) -> PlanReport:
    """`plan` in a worker thread: reading gigabytes takes minutes, and the heartbeats that keep a run's lease and
    reservations alive must go on meanwhile, and a stop must not wait for it (abandoned, it ends with the process).
    (This `plan` is one process: a thread never forks workers here.)"""
    return await run_sync(functools.partial(plan, source, **kwargs), abandon_on_cancel=True)


async def plan_checked(source: Source, api: ApiClient | None, *, limits: Limits, hash_content: bool = False,
                       token_sample: int = SAMPLE_PER_MODEL) -> PlanReport:
    """`plan` with every line judged against the Models API (`api` None: not asked). One pass, and a second
    only when a line can be rejected: a refused model, or a max_tokens seen above a model's limit."""
    if api is None:
        report = await _off_loop(source, limits=limits, hash_content=hash_content)
        report.preflight = NOT_ASKED
        return report
    report = await _off_loop(source, limits=limits, hash_content=hash_content, models={})
    return await judge_plan(source, api, report, limits=limits, hash_content=hash_content, token_sample=token_sample)


async def judge_plan(source: Source, api: ApiClient, report: PlanReport, *, limits: Limits, hash_content: bool,
                     token_sample: int, on_warning: Callable[[str], None] | None = None) -> PlanReport:
    """A first pass's report judged: the models asked about, a second pass only when a line can be rejected, the
    tokens measured by count_tokens on a sample."""
    pf = await check_models(api, report.models)
    if not pf.checked and on_warning is not None:
        on_warning(str(pf.reason))
    if needs_second_pass(pf, report.max_tokens_peak):
        report = await _off_loop(source, limits=limits, hash_content=hash_content, models=pf.rules(),
                                 errors_kept=report.errors_kept)
    report.preflight = outcome(pf, report.errors, report.dropped_by_model)
    path = isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-"
    if pf.checked and token_sample > 0 and path and report.model_bytes:
        report.calibration = await calibrate(api, os.fspath(source), report.model_bytes, token_sample)  # type: ignore[arg-type]
        if not report.calibration.get("measured") and on_warning is not None:
            on_warning(f"{report.calibration.get('reason')}; the estimate is bytes / 4")
    return report

