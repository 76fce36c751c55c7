"""The promises, checked after every world: each a function of what the world recorded (the fake's books, the jobs'
outputs and summaries), named after the promise it keeps. A broken one says which job and request, and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..._prices import load_prices
from .._wire import prompt_of
from ._sim import Weather
from ._world import JobSpec

SLACK = 600.0  # seconds a batch lane that ends in time still needs: its last reading, the download, the commit


@dataclass
class JobBooks:
    """One job's requests and what became of them."""

    spec: JobSpec
    digests: dict[str, str]  # custom_id -> its prompt's digest
    lines: Counter[str]  # custom_id -> lines in the output
    results: dict[str, dict[str, Any]]  # custom_id -> its (last) result in the output
    last: dict[str, Any] | None  # the last run's summary (None: its last run did not return one)
    how: str  # how its last run ended
    runs: int
    batch_paid: dict[str, int] = field(default_factory=dict)  # custom_id -> answers billed in the batch lane
    realtime_paid: dict[str, int] = field(default_factory=dict)  # custom_id -> answers billed in the real-time lane
    realtime_lost: dict[str, int] = field(default_factory=dict)  # custom_id -> of those, lost on the wire


def books(w: Weather) -> list[JobBooks]:
    out = []
    records = w.fake.org.records
    for spec in w.world.jobs:
        here = Path(w.root) / spec.name
        digests = {}
        for raw in (here / f"{spec.name}.jsonl").read_bytes().splitlines():
            obj = orjson.loads(raw)
            digests[obj["custom_id"]] = prompt_of(obj["params"])[1]
        lines: Counter[str] = Counter()
        results: dict[str, dict[str, Any]] = {}
        out_path = here / "out.jsonl"
        for raw in out_path.read_bytes().splitlines() if out_path.exists() else []:
            obj = orjson.loads(raw)
            lines[obj["custom_id"]] += 1
            results[obj["custom_id"]] = obj["result"]
        runs = [r for r in w.runs if r.job == spec.name]
        job = JobBooks(spec, digests, lines, results, runs[-1].summary if runs else None,
                       runs[-1].how if runs else "never ran", len(runs))
        job.batch_paid = {cid: records.answered.get((cid, d), 0) for cid, d in digests.items()}
        job.realtime_paid = {cid: records.realtime.get(d, 0) for cid, d in digests.items()}
        job.realtime_lost = {cid: records.realtime_lost.get(d, 0) for cid, d in digests.items()}
        out.append(job)
    return out


def _finished(job: JobBooks) -> bool:
    return job.how == "finished"


def answered_once(job: JobBooks) -> list[str]:
    """Every request answered exactly once in its job's output, or reported with its reason (a budget's hold)."""
    found = [f"{cid} in the output {n} times" for cid, n in job.lines.items() if n > 1]
    found += [f"{cid} in the output, not in the input" for cid in job.lines if cid not in job.digests]
    if _finished(job):
        missing = [cid for cid in job.digests if cid not in job.lines]
        held = int(((job.last or {}).get("budget") or {}).get("held_back", 0))
        if len(missing) != held:
            found.append(f"{len(missing)} requests missing from the output ({', '.join(missing[:5])}), {held} held back "
                         "by the budget")
    return found


def batch_once(job: JobBooks) -> list[str]:
    """No batch request accepted twice: an answer billed once at most in the batch lane."""
    return [f"{cid} billed {n} times in batches" for cid, n in job.batch_paid.items() if n > 1]


def paid_at_most_twice(job: JobBooks) -> list[str]:
    """No answer paid more than twice across both lanes (a real-time answer lost on the wire is paid again once)."""
    return [f"{cid} billed {job.batch_paid[cid]} in batches and {n} in real time" for cid, n in job.realtime_paid.items()
            if n + job.batch_paid[cid] > 2]


def never_crossed(job: JobBooks) -> list[str]:
    """No answer joined to another job's row: a succeeded line carries its own prompt's digest (`msg_<digest>`)."""
    found = []
    for cid, result in job.results.items():
        message = result.get("message") if result.get("type") == "succeeded" else None
        if message is not None and cid in job.digests and message.get("id") != "msg_" + job.digests[cid]:
            found.append(f"{cid} answered with {message.get('id')}, its prompt is {job.digests[cid]}")
    return found


def paid_answers_kept(job: JobBooks) -> list[str]:
    """An answer paid for and delivered reaches the output once the job has finished (never kept apart, never thrown
    away; a real-time answer lost on the wire never reached the job)."""
    if not _finished(job):
        return []
    return [f"{cid} paid ({job.batch_paid[cid]} batch, {job.realtime_paid[cid]} real time) but "
            f"{(job.results.get(cid) or {}).get('type', 'absent')} in the output"
            for cid in job.digests
            if job.batch_paid[cid] + job.realtime_paid[cid] - job.realtime_lost.get(cid, 0) > 0
            and (job.results.get(cid) or {}).get("type") != "succeeded"]


def within_budget(job: JobBooks, w: Weather) -> list[str]:
    """No budget exceeded: what the fake billed the job's model (batch prices, real time at twice) within its limit."""
    limit = ((job.last or {}).get("budget") or {}).get("limit")
    if limit is None:
        return []
    spent = billed_usd(w, job.spec.model)
    return [f"billed ${spent:.6f} of a ${limit:.6f} budget"] if spent > limit * (1 + 1e-9) + 1e-9 else []


def billed_usd(w: Weather, model: str) -> float:
    """What the fake billed `model` (the job's alone), at batch prices and the real-time part at standard ones."""
    records, prices = w.fake.org.records, load_prices()
    total = records.billed.get(model, [0] * 5)
    rt = records.billed_realtime.get(model, [0] * 5)
    batch = [a - b for a, b in zip(total, rt, strict=True)]

    def usd(t: list[int]) -> float:
        return prices.cost_at_most(model, t[0], t[1], t[2] + t[3], t[4], t[3])

    return usd(batch) + 2 * usd(rt)


def finishes(job: JobBooks) -> list[str]:
    """Every job finished once the world is healthy again."""
    return [] if _finished(job) else [f"not finished after {job.runs} runs: {job.how[:300]}"]


def deadline_kept(job: JobBooks, w: Weather) -> list[str]:
    """No real-time call where the batch lane met the deadline: every batch the job made would have ended in time.
    Judged only where the batch lane's first attempts were all it needed (no errored first attempt to send again, no
    damaged download to fetch again, no lost create to reconcile): there its batches' turnarounds say it all."""
    if job.spec.deadline is None or not any(job.realtime_paid.values()):
        return []
    world = w.world
    if world.errored_share or world.damaged_downloads or world.lost_creates or (job.last or {}).get("resubmitted"):
        return []
    deadline = job.spec.start + job.spec.deadline
    mine = set(job.digests.values())
    ends = [b.ready_at for b in w.fake.org.batches.values() if b.prompts and b.prompts[0][1] in mine]
    if ends and max(ends) + job.spec.poll + SLACK <= deadline:
        calls = sum(job.realtime_paid.values())
        return [f"{calls} real-time answers, yet its {len(ends)} batches were to end by {max(ends) / 60:.0f}m, "
                f"before the deadline at {deadline / 60:.0f}m"]
    return []


CHECKS = ("answered_once", "batch_once", "paid_at_most_twice", "never_crossed", "paid_answers_kept", "within_budget",
          "deadline_kept", "finishes")


def check(w: Weather) -> tuple[list[JobBooks], dict[str, list[str]]]:
    """Every promise over every job: (the books, {promise: what broke it})."""
    broken: dict[str, list[str]] = {}
    all_books = books(w)
    for job in all_books:
        found = {"answered_once": answered_once(job), "batch_once": batch_once(job),
                 "paid_at_most_twice": paid_at_most_twice(job), "never_crossed": never_crossed(job),
                 "paid_answers_kept": paid_answers_kept(job), "within_budget": within_budget(job, w),
                 "deadline_kept": deadline_kept(job, w), "finishes": finishes(job)}
        for name, what in found.items():
            if what:
                broken.setdefault(name, []).extend(f"{job.spec.name}: {x}" for x in what)
    return all_books, broken


def figures(job: JobBooks, w: Weather) -> str:
    """One job's figures: runs, answers, lanes, cost, when it finished."""
    ok = sum(1 for r in job.results.values() if r.get("type") == "succeeded")
    last = job.last or {}
    finished = (last.get("deadline") or {}).get("finished_at")
    ended = max((r.ended for r in w.runs if r.job == job.spec.name), default=0.0)
    kills = sum(1 for r in w.runs if r.job == job.spec.name and r.how == "killed")
    return (f"{job.spec.name} {job.how.split(':')[0]} after {job.runs} runs ({kills} killed) at {ended / 60:.0f}m: "
            f"{sum(job.lines.values())}/{len(job.digests)} out, {ok} succeeded, {last.get('batches', 0)} batches, "
            f"{sum(job.realtime_paid.values())} real time, ${billed_usd(w, job.spec.model):.6f}"
            + (f", deadline met {(last.get('deadline') or {}).get('met')} ({finished})" if job.spec.deadline else ""))
