"""The requests of a table not answered yet, one per request (rows with the same request share it): written as a
run's JSONL file named by its content (`pending_file`), or fed to a plan as sizes, nothing written (`sized`). Rows
are counted as they go by; the rejected ones are counted, and the first `KEPT` of them kept (memory stays flat
however many rows are rejected)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .._errors import JournalError, os_error
from ..input._planner import SizedPlan
from ..state._answers import Answers
from ._batch import Judgements
from ._judged import TableRows
from ._seen import SeenIds, SeenRequests

KEPT = 100  # rejected rows kept with their reasons (the rest are counted)


def rejection(text: str, custom_id: str | None = None) -> dict[str, Any]:
    """A judged row's rejection ("row N: why") as a record, with the keys `plan`'s rejections have."""
    head, _, reason = text.partition(": ")
    return {"row": int(head.removeprefix("row ")), "custom_id": custom_id, "reason": reason}


@dataclass
class Counts:
    rows: int = 0
    answered: int = 0
    rejected: int = 0
    first_rejected: list[dict[str, Any]] = field(default_factory=list)  # the first `KEPT`, as records
    unsent: int = 0  # distinct requests not answered yet
    shared: int = 0  # rows to send whose request an earlier row has: one request is sent for them all
    in_flight: int = 0  # rows whose requests a run that did not finish has out or answered (its collection answers)

    def reject(self, judged: Judgements) -> None:
        if not judged.rejected:
            return
        self.rejected += len(judged.rejected)
        room = KEPT - len(self.first_rejected)
        if room > 0:
            self.first_rejected += [rejection(judged.rejected[i], judged.cids[i] if judged.cids else None) for i in sorted(judged.rejected)[:room]]


def pending_file(rows: TableRows, answers: Answers | None, runs: Path, row_numbers: Path | None = None, *,
                 name: Callable[[Path], Path] | None = None, setting: str | None = "state_dir",
                 taken: set[str] | None = None) -> tuple[Path | None, Counts]:
    """The requests not answered yet, written to a file named by its content (or by what `name` makes of that
    name; None: every row is answered or rejected); with `row_numbers`, beside it each line's row (4 bytes a
    line), for a plan to name the rows of the requests it refuses. A file that cannot be written (a full disk) is one
    line naming it, and `setting`, the setting that moves `runs`."""
    try:
        runs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JournalError(os_error(exc, f"cannot make the folder of the table job's runs {runs}"),
                           setting=setting) from exc
    tmp = runs / f"pending-{os.getpid()}-{os.urandom(4).hex()}.jsonl.tmp"  # (two jobs of one table may plan at once)
    digest = hashlib.sha256()
    numbers = open(row_numbers, "wb") if row_numbers is not None else None  # noqa: SIM115  # (closed below)
    try:
        try:
            with open(tmp, "wb") as f:
                for judged, keep in _unsent_rows(rows, answers, counts := Counts(), taken=taken):
                    lines = judged.lines(keep)
                    f.write(lines)
                    digest.update(lines)
                    if numbers is not None:
                        numbers.write(judged.row_numbers(keep).tobytes())
            if not counts.unsent:
                return None, counts
            path = runs / f"{digest.hexdigest()[:16]}.jsonl"
            path = name(path) if name is not None else path
            os.replace(tmp, path)
        except OSError as exc:  # (a full disk: one line naming the file, before anything is sent)
            raise JournalError(os_error(exc, f"cannot write the run's requests to {tmp}"), setting=setting) from exc
        return path, counts
    finally:
        tmp.unlink(missing_ok=True)  # (a table refused halfway, or nothing to send: no file left behind)
        if numbers is not None:
            numbers.close()


def sized(rows: TableRows, answers: Answers | None, plan: SizedPlan, row_numbers: BinaryIO | None = None,
          taken: set[str] | None = None) -> Counts:
    """`pending_file`'s requests fed to `plan` as sizes: nothing written (a third of a plan's time went to the file),
    and without answers to look up, no key computed; with `row_numbers`, each request's row written there (4 bytes
    a request), as `pending_file` writes them. `taken`: the keys of requests that runs which did not finish have
    out or answered (`_runs.taken_keys`), left out as answered ones are: their collection answers them."""
    keyed = answers is not None or bool(taken)
    for judged, keep in _unsent_rows(rows, answers, counts := Counts(), keyed=keyed, taken=taken):
        sizes, cids = judged.sizes(keep)
        if sizes:
            plan.add(sizes, cids)
            if row_numbers is not None:
                row_numbers.write(judged.row_numbers(keep).tobytes())
    return counts


Note = Callable[[Judgements, list[int]], None]
"""Told each batch's rows to send (their places in it), before the rows that repeat a request are left out."""


def _unsent_rows(rows: TableRows, answers: Answers | None, counts: Counts, keyed: bool = True,
                 taken: set[str] | None = None, note: Note | None = None
                 ) -> Iterator[tuple[Judgements, list[bool] | None]]:
    """Each batch's rows judged, and which of them go in the run (`_unsent`), counted in `counts`."""
    seen = SeenRequests(rows.source.rows_hint)
    for _, judged in rows.judged(every_column=False, keyed=keyed):
        counts.rows += len(judged)
        counts.reject(judged)
        yield judged, _unsent(judged, answers, seen, counts, taken, note)
    counts.unsent = len(seen)


def _unsent(judged: Judgements, answers: Answers | None, seen: SeenRequests, counts: Counts,
            taken: set[str] | None = None, note: Note | None = None) -> list[bool] | None:
    """Which of a batch's rows go in the run: neither rejected, answered nor `taken`, and the first row of their
    request (None: every row, the common case, told without a step a row). Answered, taken and shared rows are
    counted here."""
    n, rejected = len(judged), judged.rejected
    places = None if not rejected else [i for i in range(n) if i not in rejected]
    if taken:
        keys = judged.keys
        assert keys is not None, "taken requests are told by key"
        out = [i for i in (range(n) if places is None else places) if keys[i] in taken]
        if out:
            counts.in_flight += len(out)
            gone = set(out)
            places = [i for i in (range(n) if places is None else places) if i not in gone]
    if answers is not None:
        keys = judged.keys
        assert keys is not None, "answers are looked up by key"
        valid = keys if places is None else [keys[i] for i in places]
        done = answers.answered_among(valid) if valid else set()  # type: ignore[arg-type]
        if done:
            counts.answered += sum(k in done for k in valid)
            places = [i for i in (range(n) if places is None else places) if keys[i] not in done]
    bodies = judged.bodies
    if note is not None:
        note(judged, list(range(n)) if places is None else places)
    again = seen.add_many(bodies if places is None else [bodies[i] for i in places])  # (positions among those)
    counts.shared += len(again)
    if places is None and not again:
        return None
    keep = [False] * n
    for j, i in enumerate(range(n) if places is None else places):
        keep[i] = j not in again
    return keep


def refused_shares(rows: TableRows, answers: Answers | None, refused: np.ndarray, reasons: dict[int, str], *,
                   keyed: bool, taken: set[str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The rows that share a request a plan refused (`refused`: the first rows of the refused requests, sorted;
    `reasons`: the reasons of the first `KEPT` of them, by row), which `submit` rejects as it rejects that request:
    their count, and the first `KEPT` of those whose request's reason is kept, as records. One more pass over the
    table, asked only when a plan refused some request and some rows share one (the ids: about 17 bytes a request)."""
    seen, found = SeenIds(rows.source.rows_hint), [0]
    records: list[dict[str, Any]] = []

    def note(judged: Judgements, places: list[int]) -> None:
        chosen, numbers = set(places), [judged.first + 1 + i for i in places]
        cids, _ = judged.kept([i in chosen for i in range(len(judged))])  # (in the order of `places`)
        at = {row: k for k, row in enumerate(numbers)}
        for row, first in seen.add_many([judged.bodies[i] for i in places], numbers):
            k = int(np.searchsorted(refused, first))
            if k == len(refused) or refused[k] != first:
                continue
            found[0] += 1
            if first in reasons and len(records) < KEPT:
                records.append({"row": row, "custom_id": cids[at[row]], "reason": reasons[first]})

    for _ in _unsent_rows(rows, answers, Counts(), keyed=keyed, taken=taken, note=note):
        pass
    return found[0], records
