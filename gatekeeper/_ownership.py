"""Whose batch is it: a candidate's results held against our own requests. Pure.

The API has no batch label, and custom_ids are unique only within a job (pipelines number their rows alike), so a
batch whose results carry exactly our custom_ids may still be another job's. What the API bills for each result
follows its prompt, and `count_tokens` says what our own request with that custom_id would be billed. So a sample
of the ids that succeeded is counted and held against what each candidate billed, id by id.

The rule:
- an id *agrees* when the prompt tokens the candidate billed for it (input, cache writes and cache reads: the
  whole prompt) are within `slack` of our count (count_tokens is documented as an estimate: 3 tokens or 2%);
- a candidate *fits* when at least `FIT_SHARE` of the ids compared agree, and *misfits* when at most
  `MISFIT_SHARE` do, with at least half of the sample (`MIN_EVIDENCE` ids that succeeded, or all of them when
  fewer did) compared, never none; anything else is *unclear*;
- among candidates that carry exactly our custom_ids, the one that fits while every other misfits is ours,
  proven. Those that misfit are another submitter's. When several fit (their prompts are ours) or none can be
  judged, the results cannot tell: the candidate created nearest after our send is taken, reported unproven.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MIN_EVIDENCE = 12  # ids compared per candidate when that many succeeded
FIT_SHARE = 0.8
MISFIT_SHARE = 0.2


class Fit(str, enum.Enum):
    FITS = "fits"
    MISFITS = "misfits"
    UNCLEAR = "unclear"


@dataclass(frozen=True)
class Choice:
    ours: str | None  # the candidate taken as ours (None: none can be)
    foreign: tuple[str, ...]  # candidates proven another submitter's
    proven: bool  # whether the results proved `ours` (else: the results could not tell)


def slack(expected: int) -> int:
    return max(3, -(-expected * 2 // 100))


def agrees(expected: int, billed: int) -> bool:
    return abs(billed - expected) <= slack(expected)


def sample_ids(ids: Iterable[str], n: int = MIN_EVIDENCE) -> list[str]:
    """`n` of `ids`, the same ones every time (ordered by a hash, so not the first rows of a file)."""
    return sorted(ids, key=lambda c: hashlib.blake2b(c.encode(), digest_size=8).digest())[:n]


def fit(expected: Mapping[str, int], billed: Mapping[str, int]) -> Fit:
    """How one candidate's billed prompt tokens (by custom_id, succeeded lines only) fit our counts."""
    compared = [c for c in expected if c in billed]
    if not compared or len(compared) < min(MIN_EVIDENCE, len(expected)) // 2:
        return Fit.UNCLEAR
    share = sum(agrees(expected[c], billed[c]) for c in compared) / len(compared)
    if share >= FIT_SHARE:
        return Fit.FITS
    return Fit.MISFITS if share <= MISFIT_SHARE else Fit.UNCLEAR


def choose(fits: Mapping[str, Fit], nearest_first: Sequence[str]) -> Choice:
    """Which candidate (by id) is ours, given each one's fit; `nearest_first` orders them by how soon after our
    send they were created, the tie-break when the results cannot tell."""
    foreign = tuple(b for b in nearest_first if fits[b] is Fit.MISFITS)
    fitting = [b for b in nearest_first if fits[b] is Fit.FITS]
    if len(fitting) == 1 and len(foreign) == len(fits) - 1:
        return Choice(fitting[0], foreign, True)
    open_ = fitting or [b for b in nearest_first if fits[b] is Fit.UNCLEAR]
    return Choice(open_[0] if open_ else None, foreign, False)
