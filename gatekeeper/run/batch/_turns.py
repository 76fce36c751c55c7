"""This job's claim on a shared ledger, and its turn to admit among the organization's pipelines
(`decide._shares`): posted every admission round and after every batch it admits, so the others see what it wants,
how long it has waited behind higher priorities, and where its share stands. The turn is decided on the claims as
the ledger holds them, this job's own included (its wait and virtual time are the ledger's, not a copy of its own).
Alone on a ledger, or without one, it is always this job's turn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..._errors import UsageError
from ...decide._admission import QueueState
from ...decide._headroom import live_batches
from ...decide._shares import PRIORITIES, ahead_of, fits, may_admit, overtaken_by, starved
from ...state._claims import Board, ClaimPost
from ...state.ledger._base import Ledger, Reservation

WATCH_EVERY = 0.5  # seconds between a waiting job's readings of the ledger (one small read; a local one for the host's)
# seconds between readings of the queue at most, for a job with batches in flight while another job wants room: its
# reservations free the room only once it has seen its batches end, and the other waits for that (with WATCH_EVERY,
# freed room idled up to 7 s at 5.0 and 2.0; a listing every 2 s is 30 calls a minute a key, only while another waits)
READ_FOR_OTHERS = 2.0


class Turns:
    def __init__(self, ledger: Ledger, job: str, priority: str, share: float, clock: Callable[[], float],
                 waited_before: float = 0.0) -> None:
        if priority not in PRIORITIES or not share > 0:
            raise UsageError(f"priority {priority!r} must be high, normal or low, and share {share!r} a positive number",
                             setting="priority" if priority not in PRIORITIES else "share")
        self.ledger, self.job, self.clock = ledger, job, clock
        self.priority, self.share = PRIORITIES[priority], share
        self.vtime = 0.0  # (the ledger raises it to its tier's as the job starts wanting)
        self.admitted = 0
        self.want = 0  # requests of the batch it last said it would admit now
        self.ceiling: int | None = None
        self.overtaking: tuple[str, ...] = ()  # the jobs next before it whose batches did not fit, when it was its turn
        self.starving = False  # its turn is the starvation rule's (its batch comes out of higher priorities' room)
        self.waited = waited_before  # seconds its batch fitted but the turn was another's (this job's runs, together)
        self.blocked_since: float | None = None
        self.ahead: str | None = None  # the job whose turn it was, when it was not ours
        self.others_want = False  # another job's claim wanted room at the last post
        self.reserved_seen = 0  # the requests reserved on the ledger when the turn was last asked (`watch`)

    async def turn(self, want: int, ceiling: int | None = None, seen: int = 0) -> bool:
        """Post the claim and say whether this job may admit now. `want`: the requests of the batch it would admit
        now but for the room (0 for none); `ceiling`: its ceiling less its margin (None: unknown); `seen`: the depth
        it sees, its own creates the listing misses included."""
        if not self.ledger.owner:
            return True
        self.want, self.ceiling = want, ceiling
        board = await self.ledger.put_claim(ClaimPost(self.job, self.priority, self.share, want, self.vtime,
                                                      self.admitted, ceiling, seen))
        mine = next((c for c in board.claims if c.owner == self.ledger.owner), None)
        self.others_want = any(c.want > 0 and c.owner != self.ledger.owner for c in board.claims)
        if mine is not None:
            self.vtime = mine.vtime  # (as its tier stood, when it has just joined)
        ok = may_admit(self.ledger.owner, board.claims, board.reserved)
        self.overtaking = overtaken_by(self.ledger.owner, board.claims, board.reserved) if ok else ()
        self.starving = ok and starved(self.ledger.owner, board.claims)
        self._account(mine is not None and fits(mine, board.reserved), ok, board)
        return ok or want == 0

    async def took(self, requests: int, seen: int, want: int) -> None:
        """A batch of `requests` admitted (`seen`: the depth it sees now, the batch included; `want`: its next
        batch, as `turn` takes it): its virtual time moves on (but for a batch the starvation rule let through: that
        room was higher priorities', not its own priority's, so its shares owe nothing for it), and the ledger ages
        the claims of lower priorities that waited behind it and counts it against those it overtook."""
        started = self.vtime
        self.admitted += requests
        self.vtime += 0.0 if self.starving else requests / self.share
        self.want = want
        if self.ledger.owner:
            await self.ledger.put_claim(ClaimPost(self.job, self.priority, self.share, self.want, self.vtime,
                                                  self.admitted, self.ceiling, seen, took=requests, started=started,
                                                  overtook=self.overtaking))

    def watching(self) -> bool:
        """Whether this job has a batch waiting for room or for its turn on a shared ledger (`watch` wakes it)."""
        return bool(self.ledger.owner) and self.want > 0

    async def watch(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        """Return once another job frees room (the ledger's reservations drop) or the turn becomes this job's (or,
        being its own, another job admitted while this one's limit said its batch could not fit: that limit may be
        stale, and the others wait for it to be read again): a job waiting for room reads the queue then, not at its
        next poll (which may be 30 s away while the room sits idle: the job whose turn it was not waits for it)."""
        if self.ahead is not None and may_admit(self.ledger.owner, await self.ledger.claims(), self.reserved_seen):
            # (the turn came between the round that waited for it and this watch's start: by the round's own reading
            # of the room, so a round that still finds it another's is never woken again at once)
            return
        before = await self._reading()
        if before[1] and before[2]:
            return  # (its turn by a limit others admitted past since its round posted it: read the queue now)
        while True:
            await sleep(WATCH_EVERY)
            now = await self._reading()
            if now[0] < before[0] or (now[1] and (not before[1] or now[2] > before[2])):
                return
            before = now

    async def _reading(self) -> tuple[int, bool, int]:
        """The requests reserved on the ledger, whether the turn is this job's by the claims as they stand, and what
        others admitted since this job's limit said its batch could not fit (`Claim.unread`)."""
        reserved = sum(r.requests for r in await self.ledger.reservations() if r.live)
        claims = await self.ledger.claims()
        mine = next((c for c in claims if c.owner == self.ledger.owner), None)
        return reserved, may_admit(self.ledger.owner, claims, reserved), 0 if mine is None else mine.unread

    def _account(self, fitted: bool, ok: bool, board: Board) -> None:
        """Time its batch fitted but the turn was another's counts as waited for other jobs' turns."""
        now = self.clock()
        if self.blocked_since is not None:
            self.waited += now - self.blocked_since
        self.blocked_since = now if fitted and not ok else None
        self.ahead = ahead_of(self.ledger.owner, board.claims, board.reserved) if not ok else None
        self.reserved_seen = board.reserved

    def to_json(self) -> dict[str, Any]:
        waited = self.waited + (self.clock() - self.blocked_since if self.blocked_since is not None else 0.0)
        names = {v: k for k, v in PRIORITIES.items()}
        return {"priority": names[self.priority], "share": self.share, "waited_s": round(waited, 1)}


def wanted(next_batch: int, q: QueueState, budget_stopped: bool, now: float) -> int:
    """The requests of the batch a job would admit now but for the room, for its claim: 0 when it can use no room
    (nothing waits, or it is canceled, out of budget, at its own limit of batches in flight, or backing off after a
    refusal), so that it never holds the turn from a job that could admit."""
    full = q.max_in_flight is not None and q.in_flight >= q.max_in_flight
    return 0 if q.canceled or budget_stopped or full or now < q.backoff_until else next_batch


def others_reserved(listed: Iterable[dict[str, Any]], reservations: Iterable[Reservation], owner: str) -> int:
    """The requests of the batches in our listing that another submitter's reservation covers (jobs with one key, or
    one workspace, list each other's batches): what the depth we see holds that the ledger already counts, so our
    `seen` leaves it out (counted twice, a job waiting behind another's batches never fits its claim's limit, and
    the grant refuses it room that is free)."""
    theirs = {r.batch_id for r in reservations if r.live and r.owner != owner and r.batch_id}
    return sum(b.processing for b in live_batches((b for b in listed if str(b.get("id")) in theirs), "ws1"))
