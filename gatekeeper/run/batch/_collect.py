"""Collecting results: download an ended batch's results, verify them, settle each line, commit with the journal.

A batch adopted by listing alone (a create whose answer was lost) is first held
against its results (`_proven_ours`): one billed for another job's prompts is
given back before a line is written. A download is used only when it verifies (`_downloads`): every line parses, is one of
the batch's requests, appears once, and their number is the batch's total. A failed
download is retried later with a doubling wait while the run goes on; missing results
(404s, a null results_url) are waited out for the grace from the batch's end, then
end as final lines of their own. Each line's fate is `_settle.settle`; the rows and
the output's new length are committed in one transaction (`Journal.settling`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import aclosing
from typing import Any, BinaryIO

import msgspec
import orjson

from ..._errors import IncompleteDownload, NotFoundError, RateLimited, ServerError, TransportError
from ...decide._deadline import SLACK
from ...decide._downloads import (
    MISSING_RESULT,
    RESULTS_UNAVAILABLE,
    UNPROVEN_ERROR,
    Missing,
    MissingVerdict,
    download_wait,
    when_results_missing,
)
from ...decide._headroom import parse_time
from ...decide._ownership import Fit, Relation, fit_of
from ...decide._reconcile import candidates_for, listing_would_show, others_in_flight
from ...decide._settle import Result, classify, cut_answer, errored_line, settle, stop_of, usage_of
from ...state._journal import BatchRow, BatchState, Settlement
from ..shared._checkpoints import reached
from ..shared._part import Part, RunContext, Snapshot
from ..shared._settings import SubmitSettings
from ._download import Download
from ._evidence import billed_prompt, count_ours, learned_relations, our_side, pairs_of, wanted_ids


class _NotOurs(Exception):  # (control flow inside the collector, never raised past it)
    """An ended batch adopted by listing carries custom_ids not ours: another job's, given back."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class _Reopen(Exception):  # (control flow inside the collector, never raised past it)
    """A batch adopted by listing alone while the listing now shows another that could be ours: compared instead."""


class _Unproven(Exception):  # (control flow inside the collector, never raised past it)
    """A listing adoption its results could not prove ours, the listing's grace over: kept apart (rolled back and
    settled again, held)."""


def _listing_shows(row: BatchRow, snap: Snapshot | None, grace: float) -> bool:
    """Whether the latest listing was read long enough after our send to show our batch, were it another."""
    return snap is not None and listing_would_show(row.intent_at or 0.0, snap.at, snap.grace(grace))


def _grace_over(row: BatchRow, snap: Snapshot | None, grace: float) -> float:
    """When a listing would show another batch that could be ours (the grace stretched while the listing lags)."""
    return (row.intent_at or 0.0) + (grace if snap is None else snap.grace(grace))


class _NotYet(Exception):  # (control flow inside the collector, never raised past it)
    """A listing adoption's evidence cannot be had now (our requests could not be counted): rolled back, later
    (at `until` when the evidence cannot change before then, else after a doubling wait)."""

    def __init__(self, why: str, until: float | None = None) -> None:
        super().__init__(why)
        self.until = until


class _Request(msgspec.Struct, gc=False):
    custom_id: Any = None  # (the rest of a request's line is skipped, not decoded)


_request = msgspec.json.Decoder(_Request)


def custom_id(line: bytes) -> str:
    """A request line's custom_id (the line was read at plan: an object)."""
    try:
        return str(_request.decode(line).custom_id)
    except msgspec.ValidationError:
        return str(orjson.loads(line).get("custom_id"))


def missing_verdict(row: BatchRow | None, batch: dict[str, Any] | None, settings: SubmitSettings,
                    now: float) -> MissingVerdict:
    """What to do about a batch whose results are missing (404, null results_url, archived), at collection or
    rebuild (`row`: ours as journaled), or a candidate's in reconciliation (`row` None: the batch's own times)."""
    listed = batch or {}
    return when_results_missing(
        archived=bool(listed.get("archived_at")), now=now, grace=settings.results_grace,
        ended_at=parse_time((row.ended_at if row else None) or listed.get("ended_at")),
        created_at=parse_time(row.created_at if row else listed.get("created_at")), retention=settings.retention)


class Collector(Part):
    """Collects every ended batch of one job into its output and journal."""

    def __init__(self, ctx: RunContext, *, on_result: Callable[[str, dict[str, Any]], None] | None) -> None:
        super().__init__(ctx)
        self.on_result = on_result
        self.download_failures: dict[int, int] = {}  # batch -> failed downloads (or 404 waits) in a row
        self.download_at: dict[int, float] = {}  # batch -> when its next download is due
        self._unproven: set[int] = set()  # listing adoptions weighed unproven, waiting out the listing's grace
        self._counts: dict[int, dict[str, int]] = {}  # batch -> our sampled requests counted (kept across tries)
        # seconds a download's opening may be retried before it is put off (None: the client's policy): a deadline's
        # reading is due by then (issue 60, seed 5908: a 429 ridden out for 2.5 minutes inside a download let the
        # last chance pass, the rest reaching the real-time lane after the deadline)
        self.retry_within: Callable[[], float | None] = lambda: None
        self.slack: Callable[[], float] = lambda: SLACK  # the deadline's slack (`DeadlineKeeper.slack`)

    async def collect_ended(self, snap: Snapshot | None = None) -> None:
        """Collect every ended batch whose download is due; a failed download waits its turn, the others go on.
        `snap`: the latest reading, whose listing a batch adopted by listing alone is held against."""
        for row in self.journal.batches(BatchState.ENDED):
            self.check_stop()
            if self.download_at.get(row.idx, 0.0) > self.clock():
                continue
            self.download_at.pop(row.idx, None)
            try:
                await self.collect(row, snap)
            except (IncompleteDownload, TransportError, ServerError, RateLimited) as exc:
                self._later(row, "download_failed", str(exc))
            else:
                if row.idx not in self.download_at:  # (not put off again: results not there yet keep their wait)
                    self.download_failures.pop(row.idx, None)

    def next_due(self) -> float | None:
        """When the next download put off (a failed one, or results not there yet) is due (None: none is)."""
        return min(self.download_at.values(), default=None)

    def _later(self, row: BatchRow, event: str, reason: str, until: float | None = None) -> None:
        """Try this batch again after a doubling wait (a failed download, or results not there yet), or at `until`
        (nothing can change before then: no download in between)."""
        n = self.download_failures[row.idx] = self.download_failures.get(row.idx, 0) + 1
        urgent = self.slack() / 4 if row.idx in (self.journal.get_meta("deadline_canceled") or ()) else None
        wait = download_wait(n, self.settings.min_backoff, self.settings.max_backoff, urgent) if until is None \
            else max(0.0, until - self.clock())
        self.download_at[row.idx] = self.clock() + wait
        self.emit(event, {"batch": row.idx, "id": row.batch_id, "reason": reason, "attempt": n, "retry_in": wait})

    async def collect(self, row: BatchRow, snap: Snapshot | None = None) -> None:
        """Download one ended batch's results, verify them, and commit them with the journal in one transaction.

        Nothing from a download that fails verification is kept (`IncompleteDownload`, rolled back). A batch adopted
        by listing alone is weighed (`_ownership`) in the same download, before the transaction commits.
        """
        try:
            batch = await self.api.retrieve_batch(str(row.batch_id))
            if batch.get("archived_at") or not batch.get("results_url"):
                return self._results_missing(row, batch)
            proof = (self.journal.adoptions.of(row.idx) or {}).get("proof")  # (None: our create was answered)
            weigh = await self._to_weigh(row, snap) if proof == "listing" else None
            held = proof == "unproven"
            async with self.ctx.write_lock:  # (the real-time lane commits between settlements, never inside one)
                start = self.journal.outcomes.committed_output()
                with self.journal.settling(row.idx) as s, self.out.appending(start) as out:
                    s.before_commit = lambda: reached("before-results-commit")
                    s.committed = await self._write_results(row, batch, s, out, start, weigh, held)
                    if s.adopted and s.adopted[1] == "unproven":
                        # (rolled back: once a listing read the grace after our send shows no other batch that could
                        # be ours, it is weighed once more (this job may have learned how it is billed since) and,
                        # still unproven, its answers are kept apart; an adoption its usage proves is kept as it is)
                        if _listing_shows(row, snap, self.settings.reconcile_grace):
                            raise _Unproven()
                        self._unproven.add(row.idx)
                        raise _NotYet("its usage cannot prove it ours: waiting out the listing's grace for another "
                                      "candidate", until=_grace_over(row, snap, self.settings.reconcile_grace))
        except NotFoundError:
            return self._results_missing(row, None)
        except _NotOurs as wrong:  # (nothing of its download was kept: the transaction and the output rolled back)
            return await self._give_back(row, wrong.why)
        except _Unproven:
            self.journal.adoptions.set(row.idx, str(row.batch_id), "unproven")
            self.emit("adoption_unproven", {"batch": row.idx, "id": row.batch_id, "requests": row.requests,
                                            "policy": "its answers are kept apart, never joined; never resent"})
            return await self.collect(row, snap)
        except _NotYet as later:
            return self._later(row, "ownership_pending", str(later), later.until)
        except _Reopen as rivals:
            return await self._reopen(row, str(rivals))
        self._counts.pop(row.idx, None)
        self.emit("collected", {"batch": row.idx, "id": row.batch_id, "final": s.finals, "retry": s.retries})
        if self.on_result is not None:
            for line in self.out.lines(start, s.committed):
                obj = orjson.loads(line)
                self.on_result(obj["custom_id"], obj["result"])

    async def _to_weigh(self, row: BatchRow, snap: Snapshot | None) -> dict[str, Relation]:
        """For a batch adopted by listing alone: this job's billing relations to weigh it by ({} when none can be
        learned; `_NotYet` when one will be, so it waits for it). When the listing shows another batch that could be
        ours, `_Reopen`: reconciliation compares them all."""
        if snap is not None:
            theirs, _ = others_in_flight(await self.ledger.reservations(), self.ledger.owner)
            rivals = candidates_for(row.requests, row.intent_at or 0.0, snap.listed.values(),
                                    self.journal.adoptions.known_batch_ids() | theirs, self.settings.clock_skew)
            if rivals:
                raise _Reopen(f"{len(rivals)} other listed batch(es) of its size since our send could be ours")
        if row.idx in self._unproven:  # weighed unproven: nothing to download again before the grace is over
            if not _listing_shows(row, snap, self.settings.reconcile_grace):
                raise _NotYet("its usage cannot prove it ours: waiting out the listing's grace for another candidate",
                              until=_grace_over(row, snap, self.settings.reconcile_grace))
            self._unproven.discard(row.idx)
        learned = await learned_relations(self.api, self.journal, self.path)
        if learned is None:
            raise _NotYet("waiting for a batch of ours to end, to learn how this job is billed")
        return learned

    @staticmethod
    def _judge(sample: dict[str, tuple[str, bytes]], counts: dict[str, int] | None,
               billed: dict[str, int], learned: dict[str, Relation]) -> str:
        """A listing adoption's proof from its own results: "results" or "unproven" (never given back on usage, an
        estimate: only custom_ids not ours give a batch back)."""
        v = fit_of(pairs_of(sample, counts or {}, billed), sampled=len(sample), learned=learned)
        return "results" if v is Fit.FITS else "unproven"

    async def _reopen(self, row: BatchRow, why: str) -> None:
        """Another listed batch may be ours: the create's outcome is unknown again; reconciliation compares them."""
        self.journal.adoptions.reopen(row.idx, str(row.batch_id), why)
        if not row.cut:  # (a cut create holds no reservation: released when cut)
            await self.ledger.hold(row.idx, row.requests, None)
        self.download_failures.pop(row.idx, None)
        self.download_at.pop(row.idx, None)
        self.emit("adoption_reopened", {"batch": row.idx, "id": row.batch_id, "why": why})

    async def _give_back(self, row: BatchRow, why: str) -> None:
        """Not ours after all: the create's outcome is unknown again (ours may exist, not listed then) and that
        batch is never a candidate again; the reservation stands, unconfirmed, while ours may be in the queue."""
        self.journal.adoptions.not_ours(row.idx, str(row.batch_id), why)
        if not row.cut:
            await self.ledger.hold(row.idx, row.requests, None)
        self.download_failures.pop(row.idx, None)
        self.download_at.pop(row.idx, None)
        self.emit("adoption_undone", {"batch": row.idx, "id": row.batch_id, "why": why})

    async def _write_results(self, row: BatchRow, batch: dict[str, Any], s: Settlement, out: BinaryIO, start: int,
                             learned: dict[str, Relation] | None, held: bool = False) -> int:
        """Stream, verify (`Download`) and settle every line; the output's new length. `learned` set: the batch
        was adopted by listing, and what it billed for our sampled ids is weighed before anything commits. `held`:
        the batch could not be proven ours, and each answer is kept apart (`_keep_apart`)."""
        members = Members(self._requests_of(row), sample=learned is not None)
        download = Download(self.api, batch, members.ids(), f"batch {row.idx}", self.retry_within())
        billed: dict[str, int] = {}
        pos = start
        # (a create the deadline cut: its requests are the real-time lane's too, each joined from whichever answered
        # first; read inside the settlement, so no answer of the lane lands between)
        cut = self.journal.lane.cut_rows(row.idx) if row.cut else None
        # Read once a batch, not once a line: with a journal on a server each read is a round trip.
        canceled = bool(self.journal.get_meta("user_canceled")) or row.idx in (self.journal.get_meta("canceled_batches") or [])
        # (a batch canceled for the deadline: its canceled requests go real time, their attempt not spent)
        policy = (self._max_attempts() + (row.idx in (self.journal.get_meta("deadline_canceled") or [])), canceled)
        sample, pop = members.sample, members.pop
        wrote = False
        async with aclosing(download.chunks()) as chunks:
            async for lines in chunks:  # (a chunk's lines at a time: the generators stepped once a chunk)
                self.check_stop()  # a stop mid-download rolls back: the batch is downloaded again later
                placed: list[bytes] = []
                for cid, raw, result in lines:
                    if cid in sample and (tokens := billed_prompt(result)) is not None:
                        billed[cid] = tokens
                    if held:
                        pos += _keep_apart(out, row, cid, raw, result, pop(cid), s, pos, cut is None)
                    elif size := (self._settle_line(row, cid, raw, result, pop(cid), s, pos, policy) if cut is None
                                  else _settle_cut(cid, raw, result, pop(cid), s, pos, cut)):
                        placed += (raw, b"\n")  # (not `raw + b"\n"`: a copy of every answer)
                        pos += size
                if placed:
                    out.writelines(placed)  # (one call a chunk; the file's buffer gathers them)
                    if not wrote:
                        wrote = True
                        reached("mid-results")
        if download.foreign:  # a batch adopted by listing that was not ours; ours may exist (not listed then): never resend
            raise _NotOurs(f"{download.foreign} results of another job's custom_ids")
        if held:
            await self._keep_alike_apart(row, s)
        if learned is not None:
            s.adopted = (str(row.batch_id), await self._weighed(row, members.sample, billed, learned))
        for cid, (line, off, length, attempt) in members.left():
            self.emit("missing_result", {"batch": row.idx, "custom_id": cid})
            if cut is not None:
                continue  # (the real-time lane's to answer)
            raw = errored_line(cid, MISSING_RESULT, "the batch's complete results had no line for this request")
            # complete by the API's counts, yet ours is absent: final, never resent
            pos += _write_final(out, s, pos, (line, off, length, attempt), cid, raw, MISSING_RESULT)
        return pos

    async def _weighed(self, row: BatchRow, sample: dict[str, tuple[str, bytes]], billed: dict[str, int],
                       learned: dict[str, Relation]) -> str:
        """Count our sampled ids it billed (kept across tries) and judge it."""
        counts = await count_ours(self.api, sample, wanted_ids(sample, [billed]), self._counts.setdefault(row.idx, {}))
        if counts is None:
            raise _NotYet("our requests could not be counted yet")
        return self._judge(sample, counts, billed, learned)

    def _settle_line(self, row: BatchRow, cid: str, raw: bytes, result: Result, member: tuple[int, int, int, int],
                     s: Settlement, pos: int, policy: tuple[int, bool]) -> int:
        """Settle one verified result line: the bytes it adds to the output (0 when it goes to a retry)."""
        line, off, length, attempt = member
        v = settle(result, attempt=attempt, max_attempts=policy[0], user_canceled=policy[1])
        if v.retry:
            s.retry(line, off, length, cid, attempt, row.idx, v.type, v.error_type, raw)
            return 0
        succeeded = v.type == "succeeded"
        usage = usage_of(result) if succeeded else (None, 0, 0, 0, 0, 0)
        s.final(line, cid, v.type, v.error_type, attempt, pos, len(raw) + 1, usage, stop_of(result) if succeeded else None)
        return len(raw) + 1

    async def _keep_alike_apart(self, row: BatchRow, s: Settlement) -> None:
        """The other candidates the evidence could not tell from this unproven adoption (`Adoptions.apart`): each
        collected in the same transaction, its answers kept apart beside ours (never joined, never resent; the
        budget counts the one adopted, whose billing is theirs alike). One whose results are not there yet waits
        (`_NotYet`, everything rolled back) within the results grace; past it, or archived, it is said and left."""
        alike = self.journal.adoptions.apart(row.idx)
        if not alike:
            return
        lines = {custom_id(body): line for line, _, body, _ in self._requests_of(row)}
        for batch_id in alike:
            try:
                batch: dict[str, Any] | None = await self.api.retrieve_batch(batch_id)
            except NotFoundError:
                batch = None
            if batch is not None and batch.get("results_url") and not batch.get("archived_at"):
                try:
                    async for cid, raw, _ in Download(self.api, batch, set(lines), f"batch {row.idx}, kept apart ({batch_id})"):
                        s.keep_apart(lines[cid], cid, batch_id, raw)
                    self.emit("kept_apart", {"batch": row.idx, "id": batch_id, "requests": len(lines)})
                    continue
                except NotFoundError:
                    pass
            v = missing_verdict(None, batch, self.settings, self.clock())
            if v.action is Missing.WAIT and batch is not None:
                raise _NotYet(f"the results of {batch_id}, kept apart beside it, are not there yet")
            self.emit("kept_apart_unavailable", {"batch": row.idx, "id": batch_id, "reason": v.reason})

    def _results_missing(self, row: BatchRow, batch: dict[str, Any] | None) -> None:
        """A 404 or a null results_url: wait within the grace, else final lines that say so (never resent)."""
        v = missing_verdict(row, batch, self.settings, self.clock())
        if v.action is Missing.WAIT:
            return self._later(row, "results_pending", v.reason)
        start = self.journal.outcomes.committed_output()
        with self.journal.settling(row.idx) as s, self.out.appending(start) as out:
            pos = start
            message = f"results unavailable: {v.reason}; not resent (processed, may have been billed)"
            for line, off, body, attempt in ([] if row.cut else self._requests_of(row)):  # (cut: the lane's to answer)
                cid = custom_id(body)
                pos += _write_final(out, s, pos, (line, off, len(body), attempt), cid,
                                         errored_line(cid, RESULTS_UNAVAILABLE, message), RESULTS_UNAVAILABLE)
            s.committed = pos
        self.emit("results_unavailable", {"batch": row.idx, "id": row.batch_id, "requests": s.finals, "reason": v.reason})

    def _max_attempts(self) -> int:
        return int((self.journal.get_meta("settings") or {}).get("max_attempts", self.settings.max_attempts))


def _keep_apart(out: BinaryIO, row: BatchRow, cid: str, raw: bytes, result: Result,
                member: tuple[int, int, int, int], s: Settlement, pos: int, final: bool = True) -> int:
    """An answer of a batch never proven ours: kept in the journal as it came, and a final errored line of
    gatekeeper's own in its place (what it billed counts toward the budget: it may be ours). Never resent. Not
    `final` (a cut create's: its requests are the real-time lane's): kept apart only."""
    line, _, _, attempt = member
    s.keep_apart(line, cid, str(row.batch_id), raw)
    if not final:
        return 0
    # (no batch id in the line: a gateway's client must never see an upstream id; `results --only unproven` has it)
    mark = errored_line(cid, UNPROVEN_ERROR, "answered in a batch found by listing after its create's answer was "
                        "lost, which could not be proven this job's (another job may use the same custom_ids): "
                        "kept apart, not joined, not resent; `gatekeeper results --only unproven` lists it")
    usage = usage_of(result) if result.type == "succeeded" else (None, 0, 0, 0, 0, 0)
    out.write(mark + b"\n")
    s.final(line, cid, "errored", UNPROVEN_ERROR, attempt, pos, len(mark) + 1, usage)
    return len(mark) + 1

def _settle_cut(cid: str, raw: bytes, result: Result, member: tuple[int, int, int, int], s: Settlement, pos: int,
                lane: dict[int, tuple[str, int]]) -> int:
    """One answer of a cut create's batch (`decide._settle.cut_answer`): joined where the real-time lane has not
    answered (the lane then sends it no more), else kept aside as a double charge; the bytes it adds."""
    line, _, _, attempt = member
    c = cut_answer(result, lane[line][0] if line in lane else None)
    v = classify(result)
    if not c.join:
        s.aside(line, attempt, v.type, v.error_type, raw, charged=c.charged)
        return 0
    s.joined_first(line)
    succeeded = v.type == "succeeded"
    usage = usage_of(result) if succeeded else (None, 0, 0, 0, 0, 0)
    s.final(line, cid, v.type, v.error_type, attempt, pos, len(raw) + 1, usage, stop_of(result) if succeeded else None)
    return len(raw) + 1


def _write_final(out: BinaryIO, s: Settlement, pos: int, member: tuple[int, int, int, int], cid: str, raw: bytes,
                 error_type: str) -> int:
    """A final errored line of gatekeeper's own; the bytes it adds."""
    line, _, _, attempt = member
    out.write(raw + b"\n")
    s.final(line, cid, "errored", error_type, attempt, pos, len(raw) + 1, (None, 0, 0, 0, 0, 0))
    return len(raw) + 1


class Members:
    """A batch's requests by custom_id, each (line, offset, length, attempt), held in four arrays rather than a tuple
    apiece: 32 bytes a request instead of about 170, and nothing for the cycle collector to walk (it pauses every
    thread, the Airflow triggerer's event loop included). With `sample`, the same pass keeps the lowest-ranked
    requests (`_evidence.our_side`), for weighing a batch adopted by listing."""

    def __init__(self, requests: Iterable[tuple[int, int, bytes, int]], *, sample: bool = False) -> None:
        self._at: dict[str, int] = {}
        self._cols: tuple[array[int], ...] = (array("q"), array("q"), array("q"), array("q"))
        line, off, size, tries = self._cols

        def each() -> Iterator[tuple[str, bytes]]:
            for k, (n, o, body, attempt) in enumerate(requests):
                cid = custom_id(body)
                self._at[cid] = k
                line.append(n)
                off.append(o)
                size.append(len(body))
                tries.append(attempt)
                yield cid, body

        if sample:
            self.sample = our_side(each()).sample
        else:
            self.sample = {}
            for _ in each():
                pass

    def ids(self) -> set[str]:
        return set(self._at)

    def pop(self, cid: str) -> tuple[int, int, int, int]:
        k = self._at.pop(cid)
        return self._cols[0][k], self._cols[1][k], self._cols[2][k], self._cols[3][k]

    def left(self) -> Iterator[tuple[str, tuple[int, int, int, int]]]:
        """The requests not popped: those the results had no line for."""
        for cid in list(self._at):
            yield cid, self.pop(cid)
