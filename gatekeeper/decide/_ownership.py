"""Whose batch is it: a candidate's results held against our own requests. Pure.

The API has no batch label, and custom_ids are unique only within a job (pipelines number their rows alike), so a
batch whose results carry exactly our custom_ids may still be another job's. What the API bills for each result
follows its prompt, and `count_tokens` says what our own request with that custom_id would be billed. So a sample
of the ids that succeeded is counted and held against what each candidate billed, id by id.

The rule:
- for each id compared, the *difference* is the prompt tokens the candidate billed for it (input, cache writes and
  cache reads: the whole prompt) minus our count; the candidate's *offset* is the median difference. An id
  *agrees* when its difference is within `slack` of the offset (count_tokens is documented as an estimate: 3
  tokens or 2%), so a count that is off by the same few tokens for every request does not make our own batch look
  foreign; the offset itself must stay within `MAX_OFFSET` tokens (or 5% of the median count);
- a candidate *fits* when at least `FIT_SHARE` of the ids compared agree and its offset is small; otherwise it
  *misfits*: its prompts differ from ours, at least in part. It is *unclear* only when there is too little to
  compare: fewer than half of the sample (`MIN_EVIDENCE` ids that succeeded, or all of them when fewer did);
- among candidates that carry exactly our custom_ids, the one that fits while every other misfits is ours,
  proven. Those that misfit are another submitter's. When several fit (their prompts are ours) or none can be
  judged (nothing succeeded, or the API cannot count), the results cannot tell: the candidate created nearest to
  our send is taken, and reported as unproven.

Another job's batch whose prompts' lengths vary by a few hundred characters, as the soak's do, agrees on about one
id in six by chance: with 24 compared, the chance that it reaches `FIT_SHARE` is below one in 10^9. A rival whose
prompts are as long as ours, id by id, fits: the results cannot tell, and the summary says so.
"""

from __future__ import annotations

import enum
import hashlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MIN_EVIDENCE = 24  # ids compared per candidate when that many succeeded
FIT_SHARE = 0.8
MAX_OFFSET = 8  # tokens every count may be off by alike (or 5% of the median count, when more)


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


def agrees(expected: int, billed: int, offset: int = 0) -> bool:
    return abs(billed - expected - offset) <= slack(expected)


def sample_ids(ids: Iterable[str], n: int = MIN_EVIDENCE) -> list[str]:
    """`n` of `ids`, the same ones every time (ordered by a hash, so not the first rows of a file)."""
    return sorted(ids, key=lambda c: hashlib.blake2b(c.encode(), digest_size=8).digest())[:n]


def fit(expected: Mapping[str, int], billed: Mapping[str, int]) -> Fit:
    """How one candidate's billed prompt tokens (by custom_id, succeeded lines only) fit our counts."""
    compared = [c for c in expected if c in billed]
    if not compared or len(compared) < min(MIN_EVIDENCE, len(expected)) / 2:
        return Fit.UNCLEAR
    offset = int(statistics.median_low(billed[c] - expected[c] for c in compared))
    if abs(offset) > max(MAX_OFFSET, statistics.median_low(expected[c] for c in compared) // 20):
        return Fit.MISFITS
    share = sum(agrees(expected[c], billed[c], offset) for c in compared) / len(compared)
    return Fit.FITS if share >= FIT_SHARE else Fit.MISFITS


def choose(fits: Mapping[str, Fit], nearest_first: Sequence[str]) -> Choice:
    """Which candidate (by id) is ours, given each one's fit; `nearest_first` orders them by how soon after our
    send they were created, the tie-break when the results cannot tell."""
    foreign = tuple(b for b in nearest_first if fits[b] is Fit.MISFITS)
    fitting = [b for b in nearest_first if fits[b] is Fit.FITS]
    if len(fitting) == 1 and len(foreign) == len(fits) - 1:
        return Choice(fitting[0], foreign, True)
    open_ = fitting or [b for b in nearest_first if fits[b] is Fit.UNCLEAR]
    return Choice(open_[0] if open_ else None, foreign, False)
