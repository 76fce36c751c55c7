"""The promises, checked after every world: each a function of what the world recorded (the fake's books, the jobs'
outputs and summaries), named after the promise it keeps. A broken one says which job and request, and why."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..._prices import load_prices
from ...decide._downloads import ANSWER_LOST
from ...state._claims import PRIORITIES
from .._wire import prompt_of
from ._sim import LEASE, Weather
from ._world import DrawnJob

SLACK = 600.0  # seconds a batch lane that ends in time still needs: its last reading, the download, the commit


@dataclass
class JobBooks:
    """One job's requests and what became of them."""

    spec: DrawnJob
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
        if spec.table:
            continue  # (`table_books`)
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
    away; a real-time answer lost on the wire never reached the job, nor one a kill cut off after the API had
    answered: a request whose real-time answers were lost twice, and no batch paid for, ends `answer_lost`, its
    reason said, as the lane promises: never sent a third time)."""
    if not _finished(job):
        return []
    return [f"{cid} paid ({job.batch_paid[cid]} batch, {job.realtime_paid[cid]} real time) but "
            f"{(job.results.get(cid) or {}).get('type', 'absent')} in the output"
            for cid in job.digests
            if job.batch_paid[cid] + job.realtime_paid[cid] - job.realtime_lost.get(cid, 0) > 0
            and (job.results.get(cid) or {}).get("type") != "succeeded" and not _lost_twice(job, cid)]


def _lost_twice(job: JobBooks, cid: str) -> bool:
    result = job.results.get(cid) or {}
    error = (result.get("error") or {}).get("error") or {}
    return job.batch_paid[cid] == 0 and error.get("type") == ANSWER_LOST


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


def longest_stall(name: str, w: Weather) -> tuple[float, float]:
    """The job's longest wait for its turn (`waiting`, reason `shares`) with the queue empty as it read it (depth 0,
    nothing of its own in flight) and no job on the ledger creating a batch meanwhile: (seconds, when it began). One
    pass over the job's events, a bisection over every job's admissions."""
    admits = sorted(t for evs in w.events.values() for t, e, _ in evs if e == "admitted")
    longest, began, start = 0.0, 0.0, None
    for t, e, f in w.events.get(name, []):
        if e == "waiting" and f.get("reason") == "shares":
            if start is None or bisect_right(admits, start) != bisect_right(admits, t):
                start = t  # (a batch admitted since: the stall, if any, begins again here)
            if t - start > longest:
                longest, began = t - start, start
        elif not (e == "progress" and f.get("depth") == 0 and not f.get("in_flight")):
            start = None  # (room taken, its own batches out, or anything else that run did)
    return longest, began


def never_stalls(job: JobBooks, w: Weather) -> list[str]:
    """No job waits for its turn with the queue empty while nobody admits for longer than a turn can take: a dead
    job's claim lapsing with its lease, and the longest interval between readings on the ledger, and `SLACK` (issue
    59: jobs on one ledger that stopped admitting for good)."""
    longest, began = longest_stall(job.spec.name, w)
    bound = LEASE + max(j.poll for j in w.world.jobs) + SLACK
    return [f"waited {longest / 60:.0f} min for its turn from {began / 60:.0f}m with the queue empty and no job admitting "
            f"(a turn takes at most {bound / 60:.0f} min)"] if longest > bound else []


def wanting(w: Weather, name: str) -> list[tuple[float, float]]:
    """The spans (from, to) in which the job's claim on the ledger wanted room, as the job posted it."""
    spans, since = [], None
    for t, want in w.wants.get(name, []):
        if want > 0 and since is None:
            since = t
        elif want <= 0 and since is not None:
            spans.append((since, t))
            since = None
    return spans + ([(since, math.inf)] if since is not None else [])


def _both(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(max(s, u), min(e, v)) for s, e in a for u, v in b if max(s, u) < min(e, v)]


def _less(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans of `a` outside every span of `b`."""
    out = []
    for s, e in a:
        pieces = [(s, e)]
        for u, v in b:
            pieces = [p for x, y in pieces for p in ((x, min(y, u)), (max(x, v), y)) if p[0] < p[1]]
        out += pieces
    return out


def admissions(w: Weather, name: str) -> list[tuple[float, int]]:
    return [(t, int(f.get("requests", 0))) for t, e, f in w.events.get(name, []) if e == "admitted"]


def contended(w: Weather, a: DrawnJob, b: DrawnJob) -> list[tuple[float, float]]:
    """The spans in which jobs `a` and `b`, of one priority, both wanted room (each held by the turn or the queue:
    a job that can admit does so, and then wants no more) and no job of a higher priority did."""
    rank = PRIORITIES[a.priority]
    higher = [span for j in w.world.jobs if PRIORITIES[j.priority] < rank for span in wanting(w, j.name)]
    return _less(_both(wanting(w, a.name), wanting(w, b.name)), higher)


def share_bound(w: Weather, a: DrawnJob, b: DrawnJob) -> float:
    """How far, in requests over share, `b` may get ahead of `a` while both want room: two batches of each (the rule
    lets a batch that fits go before one that does not while the virtual times stay within the waiting job's next
    two batches; two submitters reading the claims at once may both create, a batch at most)."""
    def batch(j: DrawnJob) -> int:
        return max([n for _, n in admissions(w, j.name)] or [j.batch_size])
    return 2 * batch(a) / a.share + 2 * batch(b) / b.share


def shares_kept(w: Weather) -> list[str]:
    """Among jobs of one priority that all want room (no higher priority wanting any), room goes by their shares:
    over any span in which both `a` and `b` wanted room, what `b` admitted over its share rises above what `a` did
    over its own by no more than `share_bound` (fair queuing's bound for jobs that are both backlogged; issue 60,
    point 3). A higher priority's precedence and the starvation bound are `never_stalls`' and the rule's tables'."""
    out = []
    for a in w.world.jobs:
        for b in w.world.jobs:
            if a.name == b.name or a.priority != b.priority:
                continue
            bound = share_bound(w, a, b)
            for t0, t1 in contended(w, a, b):
                rise = _rise([(t, n / a.share, 0.0) for t, n in admissions(w, a.name) if t0 < t <= t1]
                             + [(t, 0.0, n / b.share) for t, n in admissions(w, b.name) if t0 < t <= t1])
                if rise > bound:
                    out.append(f"{b.name} got {rise:.0f} requests over its share ahead of {a.name} while both wanted "
                               f"room from {t0 / 60:.0f}m to {min(t1, 1e9) / 60:.0f}m (at most {bound:.0f})")
    return out


def contention(w: Weather) -> str | None:
    """What `shares_kept` weighed: the spans in which two jobs of one priority both wanted room, and the batches
    admitted in them (None: none, the check had nothing to weigh)."""
    pairs = [(a, b) for a in w.world.jobs for b in w.world.jobs if a.name < b.name and a.priority == b.priority]
    spans = [(a, b, t0, t1) for a, b in pairs for t0, t1 in contended(w, a, b)]
    if not spans:
        return None
    weighed = sum(1 for a, b, t0, t1 in spans for j in (a, b) for t, _ in admissions(w, j.name) if t0 < t <= t1)
    end = max((r.ended for r in w.runs), default=0.0)  # (a span still open when the world ended: to its last moment)
    minutes = sum(max(0.0, min(t1, end) - t0) for *_, t0, t1 in spans) / 60
    return f"shares: {len(spans)} spans of contention, {minutes:.0f} min, {weighed} batches weighed"


def _rise(steps: list[tuple[float, float, float]]) -> float:
    """The largest rise of (b's admitted over its share) less (a's over its own) over any span of the steps."""
    d = low = rise = 0.0
    for _, da, db in sorted(steps, key=lambda x: x[0]):
        d += db - da
        low = min(low, d)
        rise = max(rise, d - low)
    return rise


CHECKS = ("answered_once", "batch_once", "paid_at_most_twice", "never_crossed", "paid_answers_kept", "within_budget",
          "deadline_kept", "never_stalls", "finishes", "shares_kept")


def check(w: Weather) -> tuple[list[JobBooks], dict[str, list[str]]]:
    """Every promise over every job: (the books, {promise: what broke it})."""
    broken: dict[str, list[str]] = {}
    all_books = books(w)
    for job in all_books:
        found = {"answered_once": answered_once(job), "batch_once": batch_once(job),
                 "paid_at_most_twice": paid_at_most_twice(job), "never_crossed": never_crossed(job),
                 "paid_answers_kept": paid_answers_kept(job), "within_budget": within_budget(job, w),
                 "deadline_kept": deadline_kept(job, w), "never_stalls": never_stalls(job, w), "finishes": finishes(job)}
        for name, what in found.items():
            if what:
                broken.setdefault(name, []).extend(f"{job.spec.name}: {x}" for x in what)
    if shares := shares_kept(w):
        broken["shares_kept"] = shares
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


# -- table jobs -----------------------------------------------------------------------------------------------------

@dataclass
class TableBooks:
    """One table job's rows (the table as it is at the world's end) and what became of them."""

    spec: DrawnJob
    ids: list[str]  # the input's ids, in order
    digests: dict[str, str | None]  # id -> its prompt's digest (None: a row with a missing value, rejected)
    out: list[str] | None  # the result table's ids, in order (None: no result table)
    status: dict[str, str]  # id -> its status in the result table
    how: str
    runs: int
    batch_paid: dict[str, int] = field(default_factory=dict)  # id -> answers billed in the batch lane, any prompt
    realtime_paid: dict[str, int] = field(default_factory=dict)
    realtime_lost: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # id -> its error in the result table (errored rows)


def table_books(w: Weather) -> list[TableBooks]:
    import pyarrow.parquet as pq

    from ._tables import digest_of, out_path, table_path

    records = w.fake.org.records
    by_id: Counter[str] = Counter()
    for (cid, _), n in records.answered.items():
        by_id[cid] += n
    out = []
    for spec in w.world.jobs:
        if not spec.table:
            continue
        here = Path(w.root) / spec.name
        qs = _qs(table_path(spec, here))
        ids = [f"{spec.name}-r{k}" for k in range(len(qs))]
        digests = {cid: digest_of(spec, k) if q is not None else None for k, (cid, q) in enumerate(zip(ids, qs))}
        result = pq.read_table(out_path(here), columns=["id", "status", "error"]) if out_path(here).exists() else None
        runs = [r for r in w.runs if r.job == spec.name]
        books = TableBooks(spec, ids, digests, None if result is None else result["id"].to_pylist(),
                           {} if result is None else dict(zip(result["id"].to_pylist(), result["status"].to_pylist())),
                           runs[-1].how if runs else "never ran", len(runs))
        books.batch_paid = {cid: by_id.get(cid, 0) for cid in ids}
        books.realtime_paid = {cid: records.realtime.get(d, 0) if d else 0 for cid, d in digests.items()}
        books.realtime_lost = {cid: records.realtime_lost.get(d, 0) if d else 0 for cid, d in digests.items()}
        if result is not None:
            books.errors = {i: e for i, e in zip(result["id"].to_pylist(), result["error"].to_pylist(), strict=True) if e}
        out.append(books)
    return out


def _qs(path: Path) -> list[float | None]:
    """The `q` column of a table job's input (None: missing), from its Parquet file or its CSV's text."""
    import math

    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return [None if q is None or (isinstance(q, float) and math.isnan(q)) else q
                for q in pq.read_table(path, columns=["q"])["q"].to_pylist()]
    return [float(line.rsplit(",", 1)[1]) if line.rsplit(",", 1)[1] else None
            for line in path.read_text().splitlines()[1:]]


def table_rows(job: TableBooks) -> list[str]:
    """A finished table job's result table has exactly its input's rows, in its order, each once: a sound row
    answered (never left unsent), a row with a missing value rejected."""
    if job.how != "finished":
        return []
    if job.out is None:
        return ["no result table"]
    found = [f"{cid} in the result table {n} times" for cid, n in Counter(job.out).items() if n > 1]
    if job.out != job.ids:
        found.append(f"the result table's {len(job.out)} rows are not the input's {len(job.ids)} in order "
                     f"(first apart: {next((a, b) for a, b in zip(job.out + [''] * len(job.ids), job.ids) if a != b)})")
    for cid, digest in job.digests.items():
        status = job.status.get(cid, "absent")
        if digest is None and status != "rejected":
            found.append(f"{cid} (a missing value) {status} in the result table, not rejected")
        elif digest is not None and status in ("unsent", "rejected", "absent"):
            found.append(f"{cid} {status} in the result table of a finished job")
    return found


def table_paid(job: TableBooks) -> dict[str, list[str]]:
    """No row paid twice in the batch lane across runs and the table's changes (an id's answers billed, whatever
    its prompt); at most twice across both lanes; a row paid for is succeeded in the finished job's result table."""
    once = [f"{cid} billed {n} times in batches" for cid, n in job.batch_paid.items() if n > 1]
    twice = [f"{cid} billed {job.batch_paid[cid]} in batches and {n} in real time"
             for cid, n in job.realtime_paid.items() if n + job.batch_paid[cid] > 2]
    kept = [] if job.how != "finished" else [
        f"{cid} paid but {job.status.get(cid, 'absent')} in the result table" for cid in job.ids
        if job.batch_paid[cid] + job.realtime_paid[cid] - job.realtime_lost[cid] > 0
        and job.status.get(cid) != "succeeded"
        and not (job.batch_paid[cid] == 0 and job.errors.get(cid, "").startswith(ANSWER_LOST))]  # (its reason said)
    return {"batch_once": once, "paid_at_most_twice": twice, "paid_answers_kept": kept}


def check_more(w: Weather, jsonl: list[JobBooks]) -> tuple[list[TableBooks], dict[str, list[str]]]:
    """The promises `check` leaves: every one over every table job, and a deadline an ideal schedule could meet over
    the JSONL jobs (`jsonl`, `check`'s books): (the table jobs' books, {promise: what broke it})."""
    broken: dict[str, list[str]] = {}
    for job in jsonl:
        if what := deadline_could(job, w):
            broken.setdefault("deadline_could", []).extend(f"{job.spec.name}: {x}" for x in what)
    all_books = table_books(w)
    for table in all_books:
        found = {"table_rows": table_rows(table), **table_paid(table),
                 "finishes": [] if table.how == "finished" else [f"not finished after {table.runs} runs: {table.how[:300]}"]}
        for name, what in found.items():
            if what:
                broken.setdefault(name, []).extend(f"{table.spec.name}: {x}" for x in what)
    return all_books, broken


def table_figures(job: TableBooks) -> str:
    ok = sum(1 for s in job.status.values() if s == "succeeded")
    return (f"{job.spec.name} ({job.spec.table} table) {job.how.split(':')[0]} after {job.runs} runs: "
            f"{len(job.out or [])}/{len(job.ids)} rows out, {ok} succeeded, "
            f"{sum(job.batch_paid.values())} billed in batches, {sum(job.realtime_paid.values())} real time")


# -- a deadline an ideal schedule could meet ----------------------------------------------------------------------

LANE_ROOM = 2.0  # the real-time lane's time for a job, at its limit, counted this many times over


def deadline_could(job: JobBooks, w: Weather) -> list[str]:
    """A deadline met whenever an ideal schedule could meet it, judged where that is beyond doubt (a false alarm is
    worse than a missed one). The ideal: the batch lane tried first, then, at the last chance, the rest in real time
    (as `decide._deadline` may move nothing on an assumption). It could meet the deadline when the real-time lane
    alone could answer every request of the job in half its window, twice over: the window (start to deadline) holds
    `LANE_ROOM` times the lane's time for the job at its request and input-token limits, plus two polls and `SLACK`
    twice (the readings that see the batch lane late, the probe, the cancel, the last answers). Judged only where
    nothing else stood in the way: the job ran once (no kill, stop or failure) and finished; no budget (a budget
    wins over a deadline); the only job of the world with a deadline (the lane's limits its own); no account
    refusal or full disk in its window; real-time calls neither overloaded nor lost, no fault on them."""
    spec, world = job.spec, w.world
    if spec.deadline is None or spec.budget_share is not None or job.runs != 1 or not _finished(job):
        return []
    if any(j is not spec and j.deadline is not None for j in world.jobs):
        return []
    if world.realtime_overloaded or world.realtime_lost or any(f[0] == "messages" for f in world.faults):
        return []
    start, end = spec.start, spec.start + spec.deadline
    if any(win and win[0] < end and win[1] > start for win in (world.refusal, world.disk_full)):
        return []
    if spec.deadline < ideal_room(job, w):
        return []
    dl = (job.last or {}).get("deadline") or {}
    if dl.get("met") is False:
        return [f"deadline missed (finished {dl.get('finished_at')}), yet the real-time lane alone needs "
                f"{lane_seconds(job, w):.0f} s for its {len(job.digests)} requests of a {spec.deadline:.0f} s window"]
    return []


def lane_seconds(job: JobBooks, w: Weather) -> float:
    """The real-time lane's seconds for every request of the job at its limits (requests, and input tokens by the
    fake's own count of each prompt)."""
    from .._model import FakeRealtime

    limits = FakeRealtime()
    tokens = len(job.digests) * (20 + 6000 * job.spec.cached)  # (over a prompt's count: the cached prefix counted)
    return 60.0 * max(len(job.digests) / w.world.realtime_rpm, tokens / limits.itpm)


def ideal_room(job: JobBooks, w: Weather) -> float:
    """The window an ideal schedule needs to be sure of the deadline (see `deadline_could`)."""
    return LANE_ROOM * lane_seconds(job, w) + 2 * job.spec.poll + 2 * SLACK
