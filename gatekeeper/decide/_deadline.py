"""A deadline: when the batch lane is projected to miss it, which work moves to the real-time lane. Pure.

A live batch's finish is projected from its progress: `elapsed / done share` after its creation once any request
is done; before that (always, on the real API: a batch shows no progress until it ends), the job's turnaround (the
median of its ended batches' creation-to-end times, or `prior` before any ended), and never sooner than twice the
time it has already waited. Work not yet in a batch (batches not created, requests waiting for another attempt) is
projected at now plus the turnaround.

Work moves only when all three hold (`worth_moving`): the batch lane is projected to miss the deadline with it
(later than the deadline less `SLACK`); this is its last chance (the deadline less the slack less the real-time
lane's own time for it, the requests already queued there first); and the real-time lane would end it sooner than
the batch lane. So a batch lane that ends in time is never bypassed, nothing moves on an assumed turnaround while
it can still wait, and past the deadline nothing moves to a lane that would end it later. The latest-projected work
is weighed first, and each move counts against the lane's time for the next. A live batch that moves is canceled;
its requests reach the real-time lane only once it has ended (its succeeded results are kept).

Nothing moves on an assumption. Until one of the job's batches has ended, the turnaround is the prior, not the
job's: work then moves only when it misses on what the job's own batches show too (`evidence`: the longest any has
gone with nothing done, twice a live batch's own wait, the spans projected from progress or for a deadline's
cancel), so at the first reading, before any batch has waited, nothing moves (the batch lane is tried; a batch
that then stalls is canceled at its last chance), and the lane must end the work sooner than that shows, or by
the deadline itself: never sooner than the prior hour alone. And the lane's speed must be known: measured (the Admin API's
limits, an answer's headers) to cancel a live batch, measured or at least read (probes answered without the
headers) to move work not yet sent. While it is not, work the batch lane is known to miss with, at its last chance
by the lowest tier's figures (slower than any lane measured: the earliest it could be), asks for a `probe` instead:
no call is paid for while the batch lane is not known to be late.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

PRIOR_TURNAROUND = 3600.0  # seconds: "most batches finish within an hour", until this job has seen one end
SLACK = 60.0  # seconds kept in hand: a reading's delay, a cancel's delay, the last answers' latency
# what a live batch's requests need more, once it is canceled, before the real-time lane can take them (its end seen,
# its results there: an API may answer 404 for a while after the end, a damaged download tried again): 180 s, or a
# twentieth of the job's window when that is shorter
CANCELED_COLLECT = 180.0
CANCELED_COLLECT_SHARE = 0.05


SLACK_SHARE = 0.25  # the slack kept is at most this share of the deadline's window


def kept_slack(slack: float | None, window: float) -> float:
    """The seconds kept in hand before a deadline: the setting given, else a minute, at most a quarter of the job's
    window (a minute's slack in a 45 s window called every request late at the first reading, and paid for a probe)."""
    return slack if slack is not None else min(SLACK, max(0.0, window) * SLACK_SHARE)


def canceled_collect(window: float) -> float:
    """Seconds kept for reading a canceled batch's results, in a deadline's window of `window` seconds."""
    return min(CANCELED_COLLECT, max(0.0, window) * CANCELED_COLLECT_SHARE)
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")


def resolve_deadline(value: str | float | dt.datetime, now: float) -> float:
    """A deadline setting as wall seconds (`parse_deadline` for text); ValueError when it has passed."""
    if isinstance(value, str):
        return parse_deadline(value, now)
    at = (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp() if isinstance(value, dt.datetime) \
        else float(value)
    if at <= now:
        raise ValueError("the deadline has already passed")
    return at


def parse_deadline(text: str, now: float) -> float:
    """A deadline as wall seconds: a duration from `now` (`90m`, `6h`, `1h30m`, `45s`), an ISO 8601 date and time, or
    a time of day (`06:00Z`: the next one); UTC without a zone. ValueError naming the form when it is none of them, or
    when it has passed."""
    m = _DURATION.match(text)
    if m and any(m.groups()):
        h, mins, s = (float(g) if g else 0.0 for g in m.groups())
        at = now + h * 3600 + mins * 60 + s
    else:
        at = _iso(text.strip().replace("Z", "+00:00"), now)
    if at <= now:
        raise ValueError(f"deadline {text!r} has already passed")
    return at


def _iso(text: str, now: float) -> float:
    """An ISO 8601 date and time, or a time of day alone (`06:00Z`: its next occurrence); UTC without a zone."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            clock = dt.time.fromisoformat(text)
        except ValueError:
            raise ValueError(f"deadline {text!r} is neither a duration (90m, 6h, 1h30m) nor an ISO 8601 time") from None
        zone = clock.tzinfo or dt.UTC
        today = dt.datetime.fromtimestamp(now, zone).date()
        when = dt.datetime.combine(today, clock.replace(tzinfo=zone))
        if when.timestamp() <= now:
            when += dt.timedelta(days=1)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True)
class JobBatch:
    """One of this job's live batches, as the deadline keeper projects its end (a reading's `QueuedBatch` is anyone's
    batch in the queue)."""

    idx: int
    requests: int  # in the batch
    created: float  # wall seconds
    done: int  # requests processed so far (succeeded, errored, canceled, expired)


@dataclass(frozen=True)
class Held:
    """Work not in any live batch: a batch not yet created (`idx`), or the requests waiting for another attempt
    (`idx` None)."""

    idx: int | None
    requests: int


@dataclass(frozen=True)
class Moves:
    cancel: tuple[int, ...] = ()  # live batches to cancel (their unfinished requests move once they end)
    move: tuple[int, ...] = ()  # batches not yet created whose requests move now
    move_pending: bool = False  # requests waiting for another attempt move instead of a new batch
    projected: dict[int, float] = field(default_factory=dict)  # each live batch's projected finish
    probe: bool = False  # the batch lane is known to miss, and the lane's speed is not: measure it

    @property
    def any(self) -> bool:
        return bool(self.cancel or self.move or self.move_pending)


def turnaround(ended: Sequence[tuple[float, float]], prior: float = PRIOR_TURNAROUND, waited: float = 0.0,
               projected: Sequence[float] = ()) -> float:
    """The job's batch turnaround: the median span of its batches, ended ones as they took and `projected` ones (live
    with progress, or canceled for the deadline) as they were projected to take; `prior` before there is any (0: what
    the job's batches show alone); and never less than `waited`, the longest any of its batches has gone with nothing
    done: a lane that crawls or has stalled is not expected to turn a new batch around sooner."""
    spans = [e - c for c, e in ended if e >= c] + [p for p in projected if p > 0]
    return max(statistics.median(spans) if spans else prior, waited)


def project(b: JobBatch, now: float, turn: float) -> float:
    """When a live batch is expected to end."""
    elapsed = max(0.0, now - b.created)
    if b.done >= b.requests:
        return now
    if b.done > 0:
        return b.created + elapsed * b.requests / b.done
    return b.created + max(turn, 2 * elapsed)


def stalled_for(b: JobBatch, now: float) -> float:
    """How long a batch has gone with nothing done (0 once anything is)."""
    return max(0.0, now - b.created) if b.done == 0 else 0.0


def worth_moving(*, now: float, deadline: float, finish: float, lane: float, slack: float = SLACK,
                 bound: bool = False, need: float | None = None) -> bool:
    """Whether work the batch lane is projected to end at `finish` moves now, when the real-time lane needs `lane`
    seconds for it (and what is queued there before it): the batch lane would miss, this is the last chance, and
    the real-time lane would end it sooner. `need`: the lane's time for all the work known to miss (`lane` when
    None): the last chance comes when the lane needs it for all of that, not for this piece alone (the pieces
    judged one by one had each their own, later, last chance, and a reading between two of them moved none).
    `bound`: `finish` is only the earliest the batch lane could end it (what the job's batches show before one has
    ended): the lane then also takes work it ends by the deadline itself, never work it would end later than both."""
    end = now + lane
    last = deadline - slack - max(lane, lane if need is None else need)
    return finish > deadline - slack and now >= last and (end < finish or bound and end <= deadline)


def moves(*, now: float, deadline: float, live: Sequence[JobBatch], held: Sequence[Held], turn: float,
          lane_time: Callable[[float], float], queued: int, slack: float = SLACK, evidence: float | None = None,
          measured: bool = True, read: bool = False, collect: float = 0.0) -> Moves:
    """What moves to the real-time lane now (see the module docstring). `lane_time(n)`: the real-time lane's
    seconds for n of this job's requests; `queued`: requests already waiting in it; `turn`: the turnaround the
    projections take; `evidence`: until one of the job's batches has ended, the turnaround its batches show alone
    (`turnaround(..., prior=0)`), and work moves only when it misses on that too (None once one has: `turn` is then
    the job's own); `measured`: whether `lane_time` rests on known limits (else no live batch is canceled); `read`:
    the lane was probed and its limits still not told (work not yet sent may then move on the lowest tier's);
    `collect`: every last chance comes this much earlier (`canceled_collect`), so that a live batch's results, once it
    is canceled, are read in time, what is held moves with what is canceled, and what is held moves before it is
    created (a batch created past it could come back only through a cancel and its collection); a live batch's end in
    the lane comes that much later too, a held one's not (it goes to the lane at once)."""
    items: list[tuple[float, float, int, str, int | None]] = [
        (project(b, now, turn), project(b, now, turn if evidence is None else evidence), b.requests - b.done, "live", b.idx)
        for b in live]
    # (work not yet in a batch, before any batch of the job has waited: nothing shows it late)
    items += [(now + turn, now + (turn if evidence is None else evidence if evidence > 0 else -math.inf), h.requests,
               "held", h.idx) for h in held if h.requests > 0]
    backlog = float(queued)
    cancel: list[int] = []
    move: list[int] = []
    pending = False
    probe = False
    # (the last chance of the work known to miss is when the lane needs all of it: `reading_by` reads then)
    need = lane_time(backlog + sum(n for _, known, n, _, _ in items if known > deadline - slack)) + collect
    for _, known, n, kind, idx in sorted(items, key=lambda i: -i[0]):  # (the latest projected weighed first)
        if known <= deadline - slack:
            continue  # (not known to miss: projected to on the prior alone, the batch lane is tried)
        lane = lane_time(backlog + n) + (collect if kind == "live" else 0.0)
        if not (measured or read) and now >= deadline - slack - max(lane, need):
            probe = True  # (known late, and its last chance by the lowest tier's figures has come: read the limits)
            continue
        # (weighed against what the job's batches show, never the prior: a batch that has waited 20 s of a 45 s window
        # is not given to a lane that would end it a minute past the deadline)
        if not worth_moving(now=now, deadline=deadline, finish=known, lane=lane, slack=slack,
                            bound=evidence is not None, need=need):
            continue
        if kind == "live" and not measured:
            continue
        backlog += n
        if idx is None:
            pending = True
        elif kind == "live":
            cancel.append(idx)
        else:
            move.append(idx)
    # (a canceled batch's span counts in the job's turnaround: as it was projected when canceled, not the prior)
    return Moves(tuple(cancel), tuple(move), pending,
                 {b.idx: project(b, now, turn if evidence is None else evidence) for b in live}, probe)


def canceled_watch(wait: float, ending: int, slack: float) -> float:
    """The wait before the next reading while `ending` batches canceled for the deadline have not been seen to end: a
    quarter of the slack at most (their requests reach the real-time lane only once their end is read), whatever the
    poll; a poll of 15 minutes would otherwise see the end, and send them, a quarter of an hour past the deadline."""
    return min(wait, max(1.0, slack / 4)) if ending else wait


def reading_by(*, now: float, deadline: float, lane: float, wait: float, slack: float = SLACK,
               floor: float = 1.0) -> float:
    """The wait before the next reading with a deadline to keep: `wait` (the poll's), cut so that a reading comes at
    the last chance to move all the job's unfinished work (the deadline less the slack less `lane`, the real-time
    lane's time for it) and, from then on, at halving intervals to the deadline less the slack (never under
    `floor`). A poll of 15 minutes would otherwise read first after the last chance had passed, and the deadline be
    missed with the lane idle."""
    end = deadline - slack
    if now >= end:
        return wait
    last = end - lane
    if now < last:
        return min(wait, max(floor, last - now))
    return min(wait, max(floor, (end - now) / 2))


def batch_alone(*, requests: int, rounds: int, turn: float, window: float, slack: float = SLACK) -> bool:
    """`plan --deadline`: whether `rounds` waves of batches (the queue's ceiling admits one at a time) at the
    turnaround fit the window."""
    return requests == 0 or rounds * turn + slack <= window


def forecast(*, requests: int, rounds: int, turn: float, window: float, lane_time: Callable[[float], float],
             slack: float = SLACK) -> dict[str, Any]:
    """`plan --deadline`: whether the batch lane alone is expected to make it and, if not, what the real-time lane
    would take: the waves that fit the window stay in batches, the rest goes real time (at the lane's pace)."""
    if batch_alone(requests=requests, rounds=rounds, turn=turn, window=window, slack=slack):
        return {"batch_lane_alone": True, "realtime_requests": 0, "realtime_seconds": 0.0, "realtime_in_time": True}
    waves = max(0, int((window - slack) // turn)) if turn > 0 else rounds
    in_batches = min(requests, waves * -(-requests // max(1, rounds)))
    moved = requests - in_batches
    seconds = lane_time(moved)
    return {"batch_lane_alone": False, "realtime_requests": moved, "realtime_seconds": round(seconds, 1),
            "realtime_in_time": seconds + slack <= window}


def newly_given_back(canceled: Iterable[int], collected: Iterable[int], given: set[int]) -> set[int]:
    """The batches canceled for the deadline whose results were collected since the last reading (`given`: those
    seen before): what they gave back waits for another attempt, and goes to the real-time lane, ahead, never into a
    new batch of the lane that was too slow."""
    return set(canceled) & set(collected) - given
