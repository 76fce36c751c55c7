"""Which waiting batch may go while a job is primed. Pure: plain values in, plain values out.

A round's primer goes only when the previous round's rest has all been created and the queue has room for its own
rest; while it is in flight that room is held (`reserve`), so the rest goes the moment the primer is seen to end,
well inside a 5-minute life unless other submitters fill the queue meanwhile; then the round has `lapsed` and is
primed again (run/batch/_reprime.py). Rounds and groups are `_priming`'s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """A batch not yet created, as the gate sees it: `kind` "primer", "rest" or another (sent as today)."""

    idx: int
    kind: str
    requests: int
    round: int | None


@dataclass(frozen=True, slots=True)
class Gate:
    order: list[int]  # the batches that may go, in the order they should (idx)
    sizes: list[int]  # the room each needs (a primer: its round's, so that its rest will fit)
    reserve: int  # room held for rests whose primer is in flight
    held: int  # batches held back for a primer (for the "waiting" event)


def rounds_ended(primers: list[tuple[int, bool, str | None, float | None]]) -> dict[int, float | None]:
    """Round -> when its last primer batch ended, or None while one has not. A primer's end is its `ended_at` as the
    API reported it (when its prefixes were written), not when a reading saw it end (up to an interval later);
    the journal's moment only where the API gave none. `primers`: (round, ended, ended_at, seen_at) a batch."""
    from ._headroom import parse_time  # (here: `plan` imports this module, and _headroom imports typing)

    out: dict[int, float | None] = {}
    for r, ended, api_at, seen_at in primers:
        at = (parse_time(api_at) or seen_at or 0.0) if ended else None
        out[r] = None if at is None or out.get(r, 0.0) is None else max(out.get(r) or 0.0, at)
    return out


def lapsed(ended_at: float | None, life: float | None, now: float) -> bool:
    """Whether a round's prefixes should have left the cache: its primers ended longer ago than its shortest life."""
    return ended_at is not None and life is not None and now - ended_at > life


WATCH_SHARE = 4  # while a primer flies, a reading at least every quarter of its round's life


def watch_wait(lives_watched: list[float]) -> float | None:
    """The longest wait between readings while primers are in flight with their rest waiting (`lives_watched`: the
    life of each such round): a quarter of the shortest life, so that a primer's end is seen with most of its
    prefixes' life left for the rest. A poll of 5 or 15 minutes would otherwise see every primer end after its
    5-minute prefixes had left the cache, and prime again, round after round (found by the swarm). None: nothing
    to watch."""
    return min(lives_watched) / WATCH_SHARE if lives_watched else None


def reprimable(round_: int, reprimed: set[int]) -> bool:
    """Whether a lapsed round is primed again: once, not a round that is itself a new primer of a lapsed one. Its
    rest then goes as it is (each request writes its prefix: paid once more, never sent twice), so a queue other
    load holds past every life costs one more primer a group, not a primer each time it lapses, and the job finishes."""
    return round_ not in reprimed


def gate(waiting: list[Waiting], primers_ended: dict[int, float | None], cap: int | None) -> Gate:
    """Which waiting batches may go now. `primers_ended[r]`: when every primer of round r had ended (None while one
    is planned or in flight); `cap`: the most room a batch can ever need (ceiling less margin), if known."""
    rests: dict[int, int] = {}
    for w in waiting:
        if w.kind == "rest" and w.round is not None:
            rests[w.round] = rests.get(w.round, 0) + w.requests
    primer_waiting = {w.round for w in waiting if w.kind == "primer"}
    ready, primers, others = [], [], []
    reserve = held = 0
    for w in waiting:
        if w.kind == "rest":
            if primers_ended.get(w.round or 0, 0.0) is not None:
                ready.append((w.idx, w.requests))
            else:
                held += 1
                if w.round not in primer_waiting:
                    reserve += w.requests  # its primer is in flight: keep its room
        elif w.kind == "primer":
            if any(r < (w.round or 0) for r in rests):
                held += 1
                continue
            need = w.requests + rests.get(w.round or 0, 0)
            primers.append((w.idx, min(need, cap) if cap is not None else need))
        else:
            others.append((w.idx, w.requests))
    chosen = ready + primers + others
    return Gate([i for i, _ in chosen], [n for _, n in chosen], reserve, held)
