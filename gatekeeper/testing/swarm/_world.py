"""The world a seed draws: the fake's roughness, the faults and when they strike, and the jobs (their inputs, settings,
starts, stops and kills). Pure: one `random.Random(seed)`, nothing else, so a seed is the same world everywhere."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

EPOCH = 1_799_020_800.0  # 2027-01-04T00:00:00Z: where every simulated night starts (after the price table's date)
# seconds after the night's end the world stays healthy, so every job can finish: its batches' longest turnaround
# (a batch made at the night's end expires within a day), an hour's wait for results, two before a failing job is
# run again, and an hour in hand
HEAL = 6 * 3600.0
HEALTHY_TURNAROUND = 3 * 3600.0  # seconds a batch made after the night takes at most (half of `HEAL`)
# the models jobs are given, one each (the fake bills by model: a job's bill is its model's)
MODELS = ("claude-sonnet-5", "claude-opus-5", "claude-sonnet-5-5", "claude-opus-5-5", "claude-haiku-4-5-20251001",
          "claude-sonnet-4-5-20250929", "claude-opus-4-6")
# the named points of a run (`run.shared._checkpoints`) a kill may strike at, besides a drawn moment
POINTS = ("before-intent", "after-intent", "body-complete", "after-create", "after-refusal", "mid-results",
          "before-results-commit", "realtime-answered", "realtime-before-commit")
# ... and those drawn apart (`_rough`), around a batch canceled for a job's deadline (`run.realtime._deadline`)
DEADLINE_POINTS = ("deadline-cancel-journaled", "deadline-canceled")
# listing lags past the jobs' `--reconcile-grace` (`_sim.settings_of`: 300 s): the API's listing can lag minutes,
# and gatekeeper stretches its grace to twice the lag it sees of its own answered creates (`decide._reconcile.
# listing_grace`); drawn apart (`_rough`), in one world in five
LONG_LAGS = (450.0, 900.0, 1800.0)


@dataclass(frozen=True)
class Kill:
    """A kill -9 of one run: `after` seconds into it, or the `nth` time it reaches `point`, whichever comes first."""

    after: float
    point: str | None = None
    nth: int = 1


@dataclass
class DrawnJob:
    name: str
    requests: int
    model: str
    priority: str
    share: float
    batch_size: int
    poll: float
    start: float  # seconds into the night
    budget_share: float | None  # the budget, as a share of the job's worst case (None: no budget)
    deadline: float | None  # seconds after its start (None: no deadline)
    cached: bool  # every prompt shares a marked prefix (prompt caching, priming)
    max_in_flight: int | None
    kills: list[Kill] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)  # a user's stop, seconds into a run (then a rerun)
    rerun_after: float = 600.0  # seconds before a stopped, killed or failed run is started again
    table: str | None = None  # a table job: its input a "parquet" or "csv" file (None: JSONL)

    @property
    def waves(self) -> int:
        """How many times at most its batches go one after another: all at once, or `max_in_flight` at a time (and
        one wave more for what is sent again)."""
        if not self.max_in_flight:
            return 1
        batches = -(-self.requests // self.batch_size)
        return -(-batches // self.max_in_flight) + 1
    # what changes in its table before each run after the first (then the job is run again, finished or not):
    # "append" (rows added at its end) or "drift" (a row with a NaN appended, so an int64 column becomes double, as
    # pandas writes it)
    changes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        extra = [f"budget {self.budget_share:.2f}x" if self.budget_share is not None else "",
                 f"deadline {self.deadline / 3600:.1f}h" if self.deadline is not None else "",
                 "cached" if self.cached else "", f"in-flight {self.max_in_flight}" if self.max_in_flight else "",
                 f"kills {len(self.kills)}" if self.kills else "", f"stops {len(self.stops)}" if self.stops else "",
                 f"{self.table} table" + "".join(f" {c}" for c in self.changes) if self.table else ""]
        return (f"{self.name}: {self.requests} req, {self.priority}/{self.share:g}, batches of {self.batch_size}, "
                f"poll {self.poll:.0f}s, start {self.start / 60:.0f}m" + "".join(f", {e}" for e in extra if e))


@dataclass
class World:
    seed: int
    hours: float
    ceiling: int
    turnaround: tuple[float, float]  # seconds: a batch's wait before processing, drawn log-uniform in this range
    listing_lag: float
    not_found_after_create: float
    results_not_found_after_end: float
    damaged_downloads: int
    usage: str
    errored_share: float  # of first attempts, errored (api_error / overloaded_error): retried
    realtime_rpm: int
    realtime_overloaded: float
    realtime_lost: float
    token_life: float | None  # an access token's life (workload identity federation); None: a workspace key
    lost_creates: list[int]  # create calls (0-based) whose answers are lost after the batch was made
    faults: list[tuple[str, int, int, int]]  # (endpoint, status, after calls, times)
    refusal: tuple[float, float] | None  # an account refusal (a spend limit) from, until
    disk_full: tuple[float, float] | None  # the results' disk full from, until
    jobs: list[DrawnJob]

    @property
    def night(self) -> float:
        return self.hours * 3600.0

    @property
    def end(self) -> float:
        """Seconds after the night's start when the world ends: every job should have finished by then. The world is
        healthy once the night and its last account refusal or full disk are over; a job whose batches must go one
        wave after another (`--max-in-flight`) is given a healthy turnaround for each wave after the first (with one
        more for its retries)."""
        faults = [w[1] for w in (self.refusal, self.disk_full) if w is not None]
        healthy = max([self.night, *faults])
        waves = max((job.waves for job in self.jobs), default=1)
        return healthy + min(self.turnaround[1], 86_400.0) + HEAL + waves * HEALTHY_TURNAROUND - HEALTHY_TURNAROUND

    def describe(self) -> list[str]:
        lo, hi = self.turnaround
        head = (f"seed {self.seed}: {self.hours:g}h, ceiling {self.ceiling}, turnaround {lo / 60:.0f}m-{hi / 3600:.1f}h, "
                f"lag {self.listing_lag:.0f}s, 404 {self.not_found_after_create:.0f}s/{self.results_not_found_after_end:.0f}s, "
                f"damaged {self.damaged_downloads}, usage {self.usage}, errored {self.errored_share:.2f}, "
                f"realtime {self.realtime_rpm}rpm {self.realtime_overloaded:.2f}/{self.realtime_lost:.2f}, "
                f"{'tokens ' + format(self.token_life, '.0f') + 's' if self.token_life else 'keys'}, "
                f"lost creates {self.lost_creates}, faults {len(self.faults)}"
                + (f", refusal {self.refusal[0] / 60:.0f}-{self.refusal[1] / 60:.0f}m" if self.refusal else "")
                + (f", disk full {self.disk_full[0] / 60:.0f}-{self.disk_full[1] / 60:.0f}m" if self.disk_full else ""))
        return [head, *("  " + j.describe() for j in self.jobs)]

    def fake_settings(self) -> dict[str, Any]:
        """`FakeConfig`'s settings for this world (its outcome rule and turnaround apart)."""
        return {"ceiling": self.ceiling, "rate": 2000.0, "listing_lag": self.listing_lag,
                "not_found_after_create": self.not_found_after_create,
                "results_not_found_after_end": self.results_not_found_after_end,
                "damaged_downloads": self.damaged_downloads, "usage": self.usage, "seed": self.seed,
                "ids_seed": self.seed, "queue_retry_after": 60.0}


def draw(seed: int, hours: float = 8.0, jobs: int | None = None, *, rough: bool = True) -> World:
    """The world of `seed`: `hours` of night (then `HEAL` of health), `jobs` jobs (drawn, 1 to 4, when None);
    without the roughness drawn later (`_rough`) when not `rough`: the world a seed found before it was found in."""
    rng = random.Random(seed)
    night = hours * 3600.0
    n = jobs if jobs is not None else rng.choice((1, 2, 2, 3, 3, 4))
    lo = rng.choice((60.0, 300.0, 900.0))
    # turnarounds on the night's scale; one world in eight past a batch's 24-hour life (some batches expire), fewer
    # in a short night (a day of readings is most of what a world costs)
    hi = 30 * 3600.0 if rng.random() < 0.125 * min(1.0, hours / 8) else rng.choice((0.5, 1.0, 3.0)) * night
    world = World(
        seed=seed, hours=hours, ceiling=rng.choice((60, 150, 400, 2000)), turnaround=(lo, max(lo * 2, hi)),
        listing_lag=rng.choice((0.0, 0.0, 30.0, 240.0)), not_found_after_create=rng.choice((0.0, 0.0, 20.0)),
        results_not_found_after_end=rng.choice((0.0, 0.0, 60.0)), damaged_downloads=rng.choice((0, 0, 1, 2)),
        usage=rng.choice(("count", "count", "noisy:0.04", "count-3")), errored_share=rng.choice((0.0, 0.0, 0.05, 0.2)),
        realtime_rpm=rng.choice((50, 90, 600, 4000)), realtime_overloaded=rng.choice((0.0, 0.0, 0.1)),
        realtime_lost=rng.choice((0.0, 0.0, 0.05)), token_life=rng.choice((None, None, None, 300.0, 1800.0)),
        lost_creates=sorted(rng.sample(range(8), rng.choice((0, 0, 1, 1, 2)))),
        faults=[(rng.choice(("list", "retrieve", "results", "create", "messages")), rng.choice((500, 529, 429, 503)),
                 rng.randrange(0, 20), rng.choice((1, 2, 5))) for _ in range(rng.choice((0, 1, 3)))],
        refusal=_window(rng, night, 0.15), disk_full=_window(rng, night, 0.1), jobs=[])
    world.jobs = [_job(rng, i, night, hours >= 4) for i in range(n)]
    tables = random.Random(f"tables:{seed}")  # (its own generator: the rest of a seed's world as before tables came)
    for job in world.jobs:
        _table(tables, job)
    if rough:
        _rough(random.Random(f"rough:{seed}"), world)  # (its own too)
    return world


def _rough(rng: random.Random, world: World) -> None:
    """What a world drew after its first draws were fixed, from a generator of its own so that a seed's world is
    otherwise as it was (a seed a soak found still makes the world it was found in): a listing that lags past the
    jobs' grace, and, for a job with a deadline, a kill at a point around a batch canceled for it (appended: it
    strikes the run after the job's drawn kills, the first when it has none)."""
    if rng.random() < 0.2:
        world.listing_lag = max(world.listing_lag, rng.choice(LONG_LAGS))
    for job in world.jobs:
        if job.deadline is not None and rng.random() < 0.4:
            job.kills.append(Kill(rng.uniform(job.deadline / 2, world.night + job.deadline), rng.choice(DEADLINE_POINTS),
                                  rng.randrange(1, 3)))


def _table(rng: random.Random, job: DrawnJob) -> None:
    """One job in four reads a table (Parquet or CSV, through the library's table jobs), which may change between
    its runs. (No budget and no prompt caching: a table job's budget is a run's, its template has no marked prefix.)"""
    if rng.random() >= 0.25:
        return
    job.table = rng.choice(("parquet", "parquet", "csv"))
    job.changes = [rng.choice(("append", "drift")) for _ in range(rng.choice((0, 1, 1, 2)))]
    job.budget_share, job.cached = None, False


def _window(rng: random.Random, night: float, p: float) -> tuple[float, float] | None:
    if rng.random() >= p:
        return None
    start = rng.uniform(0, night * 0.8)
    return start, start + rng.choice((300.0, 1800.0, 3 * 3600.0))


def _job(rng: random.Random, i: int, night: float, long: bool) -> DrawnJob:
    # (a long night's jobs may be larger: 150 requests in batches of 5 one at a time are 30 turnarounds in a row)
    requests = rng.choice((3, 10, 10, 40, 40, 150) if long else (3, 5, 10, 20, 40))
    deadline = rng.choice((None, None, None, 0.25, 1.0, 2.0))
    deadline = None if deadline is None else max(900.0, deadline * night)
    job = DrawnJob(
        name=f"j{i + 1}", requests=requests, model=MODELS[i % len(MODELS)],
        priority=rng.choice(("normal", "normal", "high", "low")), share=rng.choice((1.0, 1.0, 2.0, 0.5)),
        batch_size=rng.choice((5, 20, 50, 100)), poll=rng.choice((30.0, 60.0, 300.0, 900.0)),
        start=0.0 if i == 0 else rng.uniform(0, night / 2), budget_share=rng.choice((None, None, None, 0.5, 1.5)),
        deadline=deadline, cached=rng.random() < 0.25, max_in_flight=rng.choice((None, None, 1, 3)),
        rerun_after=rng.choice((60.0, 600.0, 3600.0)))
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
        after = math.exp(rng.uniform(math.log(5.0), math.log(max(night, 60.0))))
        point = rng.choice((None, None, *POINTS))
        job.kills.append(Kill(after, point, rng.randrange(1, 4)))
    if rng.random() < 0.15:
        job.stops.append(rng.uniform(60.0, night / 2))
    return job
