"""Whose batch is it: a candidate's results held against our own requests. Pure.

The API has no batch label, and custom_ids are unique only within a job (pipelines number their rows alike), so a
batch whose results carry exactly our custom_ids may still be another job's. What the API bills for each result
follows its prompt, so a sample of the ids that succeeded is counted with `count_tokens` and held against what
each candidate billed for them, id by id (a `Pair`: our count, its billed prompt tokens).

`count_tokens` is an estimate: the bill may sit below it by a fixed amount (tokens the API adds and does not bill),
on another scale, or follow it not at all (a gateway that reports usage of its own, or none). So nothing here
assumes billed equals counted. A *relation* (billed ~ scale x count + offset, per model, Theil-Sen) is what ties
them, and an id *agrees* with a relation when its billed tokens are within `slack` of what the relation predicts
(3 tokens or 2%).

The rule. A batch is given back (`foreign`) only on positive evidence that it is another job's:
- (a) *relative*: among several candidates that carry exactly our custom_ids, one *explains* our requests (at least
  `FIT_SHARE` of its ids agree with its own fitted relation, and that relation follows the prompt: scale at least
  `MIN_SCALE`) and every other one fails that relation (fewer than `HALF` agree): the one is ours, proven, and the
  others are another submitter's;
- (b) *learned*: this job's own billing relation (`learned`, learned from batches proven ours because their create
  was answered, kept in the journal) is usable for the candidate's models, fewer than `HALF` of its ids agree with
  it, and its own billing does not explain our requests either: another's;
- (c) a shared ledger naming another submitter as the creator is weighed before this rule (such a batch is never
  a candidate);
- (d) *unrelated*: our prompts' lengths spread widely (from the 10th to the 90th percentile of our counts, at least
  `SPREAD` = 40% of the median: four times an estimate error of 10%), its billing varies from request to request,
  and it does not rise with our counts (rank correlation below `MIN_RANK`). Where our lengths spread that widely,
  our own batch's billing rises with them whatever its offset, scale or estimate error.
Evidence (a), (b) and (d) rests on usage held against `count_tokens`, which the API calls an estimate: it ranks
candidates (the others are set aside when one is taken), and never decides that none is ours, which would send our
batch again: when none bills as our requests, reconciliation waits out the listing's grace for ours, then keeps the
nearest, unproven (`_reconcile.compared`).
Without such evidence a candidate is not set aside either: a constant, zero or absent usage never gives one back, and
neither does a billing that merely fails to correlate with our prompts. `count_tokens` is an estimate, off by a few
percent per request with images, documents and tools; for templated prompts of nearly equal length that error
alone breaks any correlation (an earlier rule gave our own batch back on it, and it was sent again, billed twice),
while it never moves a figure by a quarter. A lone candidate is ours:
*proven* when it agrees with the learned relation, or, with none learned, bills as `count_tokens` says (within a
common offset of `MAX_OFFSET` tokens or 5%), and only when the evidence *tells*: the same billing paired with other
ids of the sample (shifted by half the sample) must fail, else prompts so alike would prove any batch with our ids
ours. Otherwise it is adopted *unproven* (its answers kept apart, never joined as ours). Among several that the
evidence cannot tell apart (the same prompts, a constant or absent usage), the one created nearest our send is
taken, unproven, and every other one of them is collected beside it, its answers kept apart too (`alike`): if
the one taken is not ours, ours is among the others, paid for, and its answers are kept rather than never read.

Error rates, with `MIN_EVIDENCE` = 24 ids compared. Another job's prompts, unrelated in length to ours id by id (the
soak's vary by a few hundred characters), agree with a relation on about one id in six by chance: reaching
`FIT_SHARE` has a chance below 10^-9, so (a) never proves the wrong one. Our own batch disagreeing
with a usable relation (one that at least 90% of its own learning pairs agree with) on more than half of 24 ids:
below 10^-6; and even then (b) requires that its billing not be explained by our prompts under any relation, so a
drift of the API's relation mid-job does not give our batch back. Prompts of another job whose lengths are ours id
by id (or an affine function of them) cannot be told apart: the summary says so.
"""

from __future__ import annotations

import enum
import hashlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

MIN_EVIDENCE = 24  # ids compared per candidate when that many succeeded
FIT_SHARE = 0.8  # agreeing ids that make a relation explain a candidate
HALF = 0.5  # below this share a candidate fails a relation
MIN_SCALE = 0.5  # a relation with a smaller scale does not follow the prompt (a constant usage): it proves nothing
MIN_LEARNED = 8  # pairs a learned relation needs
LEARNED_AGREE = 0.9  # share of its own pairs a learned relation must explain to be used
MAX_OFFSET = 8  # the identity's tolerance: tokens every count may be off by alike (or 5% of the median count)
MIN_RANK = 0.5  # (d): rank correlation with our counts below which a varying billing follows none of our prompts
SPREAD = 0.4  # (d): how widely our counts must spread (q10 to q90, over the median) for correlation to tell


class Pair(NamedTuple):
    """One sampled custom_id: its request's model, our `count_tokens` of it, and the prompt tokens billed for it."""

    model: str
    counted: int
    billed: int


@dataclass(frozen=True)
class Relation:
    """billed ~ scale x count + offset, learned from `n` pairs of which `agree` (a share) fit it."""

    scale: float
    offset: float
    agree: float = 1.0
    n: int = 0

    def predict(self, count: int) -> float:
        return self.scale * count + self.offset

    @property
    def follows_prompt(self) -> bool:
        return self.scale >= MIN_SCALE

    @property
    def usable(self) -> bool:
        """Learned from enough pairs that it explains, and following the prompt (a constant usage proves nothing)."""
        return self.n >= MIN_LEARNED and self.agree >= LEARNED_AGREE and self.follows_prompt

    def as_json(self) -> dict[str, Any]:
        return {"scale": self.scale, "offset": self.offset, "agree": self.agree, "n": self.n}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Relation:
        return cls(float(d["scale"]), float(d["offset"]), float(d["agree"]), int(d["n"]))


class Fit(str, enum.Enum):
    FITS = "fits"
    UNCLEAR = "unclear"


@dataclass(frozen=True)
class Choice:
    ours: str | None  # the candidate taken as ours (None: none can be)
    foreign: tuple[str, ...]  # candidates proven another submitter's
    proven: bool  # whether the evidence proved `ours` (else: it could not tell it from another's)
    basis: str = ""  # what decided, for the events and the summary
    alike: tuple[str, ...] = ()  # unproven: the other candidates the evidence cannot tell from `ours` (kept apart too)


def slack(expected: float) -> int:
    return max(3, -(-int(expected) * 2 // 100))


def agrees(pair: Pair, relation: Relation) -> bool:
    predicted = relation.predict(pair.counted)
    return abs(pair.billed - predicted) <= slack(max(pair.counted, predicted))


def sample_ids(ids: Iterable[str], n: int = MIN_EVIDENCE) -> list[str]:
    """`n` of `ids`, the same ones every time (ordered by a hash, so not the first rows of a file)."""
    return sorted(ids, key=id_rank)[:n]


def id_rank(cid: str) -> bytes:
    return hashlib.blake2b(cid.encode(), digest_size=8).digest()


def fit_relation(pairs: Sequence[Pair]) -> Relation | None:
    """The relation that best explains these pairs (Theil-Sen: the median slope between pairs, then the median
    offset), robust to a few outliers; None when the counts do not vary (no slope can be read)."""
    slopes = [(b.billed - a.billed) / (b.counted - a.counted)
              for i, a in enumerate(pairs) for b in pairs[i + 1:] if b.counted != a.counted]
    if not slopes:
        return None
    scale = statistics.median(slopes)
    offset = statistics.median(p.billed - scale * p.counted for p in pairs)
    rel = Relation(scale, offset, n=len(pairs))
    return Relation(scale, offset, share(pairs, {p.model: rel for p in pairs}) or 0.0, len(pairs))


def learn(pairs: Iterable[Pair]) -> dict[str, Relation]:
    """Each model's relation, from pairs of batches proven ours."""
    by_model: dict[str, list[Pair]] = {}
    for p in pairs:
        by_model.setdefault(p.model, []).append(p)
    return {m: r for m, ps in by_model.items() if (r := fit_relation(ps)) is not None}


def share(pairs: Sequence[Pair], relations: Mapping[str, Relation]) -> float | None:
    """The share of pairs that agree with their model's relation (pairs of other models left out); None when
    none can be compared."""
    judged = [agrees(p, relations[p.model]) for p in pairs if p.model in relations]
    return sum(judged) / len(judged) if judged else None


def _own(pairs: Sequence[Pair]) -> dict[str, Relation]:
    """The candidate's own relations, per model, that follow the prompt."""
    return {m: r for m, r in learn(pairs).items() if r.follows_prompt}


def explains(pairs: Sequence[Pair]) -> dict[str, Relation] | None:
    """The candidate's own relations when they explain its billing from our counts (FIT_SHARE agree); else None."""
    own = _own(pairs)
    s = share(pairs, own) if own else None
    covered = sum(1 for p in pairs if p.model in own)
    return own if s is not None and s >= FIT_SHARE and covered * 2 >= len(pairs) else None


def billed_as_counted(pairs: Sequence[Pair]) -> bool:
    """Whether these pairs bill as `count_tokens` says (the identity, within a small common offset), in a way only
    our prompts would (`tells`)."""
    offset = statistics.median_low(p.billed - p.counted for p in pairs)
    if abs(offset) > max(MAX_OFFSET, statistics.median_low(p.counted for p in pairs) // 20):
        return False
    identity = {p.model: Relation(1.0, offset) for p in pairs}
    return (share(pairs, identity) or 0.0) >= FIT_SHARE and tells(pairs, identity)


def enough(pairs: Sequence[Pair], sampled: int) -> bool:
    """Whether a candidate has enough compared ids to be judged: half the sample, three at least."""
    return len(pairs) >= max(3, min(MIN_EVIDENCE, sampled) / 2)


def choose(evidence: Mapping[str, Sequence[Pair]], nearest_first: Sequence[str], *, sampled: int,
           learned: Mapping[str, Relation] | None = None) -> Choice:
    """Which candidate (by id) is ours, given each one's pairs (`evidence`: only candidates that carry exactly our
    custom_ids); `nearest_first` orders them by how soon after our send they were created; `sampled` is how many
    of our ids were sampled; `learned` this job's billing relations (only the usable ones are used)."""
    usable = {m: r for m, r in (learned or {}).items() if r.usable}
    judged = {c: list(evidence.get(c, ())) for c in nearest_first}
    weighed = {c: ps for c, ps in judged.items() if enough(ps, sampled)}
    fitted = {c: explains(ps) for c, ps in weighed.items()}
    consistent = [c for c in weighed if usable and not _fails(weighed[c], usable, FIT_SHARE)]
    if len(nearest_first) > 1:
        winner = _relative(nearest_first, weighed, fitted, consistent if usable else None)
        if winner is not None:
            return Choice(winner, tuple(c for c in nearest_first if c != winner), True, "it alone bills as our requests")
    foreign = [c for c, ps in weighed.items() if fitted[c] is None and ((usable and _fails(ps, usable)) or unrelated(ps))]
    left = [c for c in nearest_first if c not in foreign]
    if not left:  # (ours may not be listed yet; if it never is, usage being an estimate, the nearest is kept apart)
        return Choice(None, tuple(foreign), False, "none of them bills as our requests")
    if len(left) == 1:
        c = left[0]
        proven = c in weighed and (c in consistent and tells(weighed[c], usable)
                                   or not usable and billed_as_counted(weighed[c]))
        return Choice(c, tuple(foreign), proven, _basis(proven, bool(usable), bool(foreign)))
    pick = ([c for c in consistent if c in left] or [c for c in left if fitted.get(c)] or left)[0]
    return Choice(pick, tuple(foreign), False, "the evidence cannot tell the candidates apart",
                  tuple(c for c in left if c != pick))


def unrelated(pairs: Sequence[Pair]) -> bool:
    """(d): our counts spread widely (`SPREAD`), the billing varies, yet does not rise with our counts (rank
    correlation below `MIN_RANK`). Counts of nearly equal prompts never give a batch back: an estimate's error
    alone breaks their correlation."""
    n = len(pairs)
    if n < 8 or len({p.billed for p in pairs}) * 2 < n or not spread_wide([p.counted for p in pairs]):
        return False
    return rank_correlation([p.counted for p in pairs], [p.billed for p in pairs]) < MIN_RANK


def spread_wide(counts: Sequence[int]) -> bool:
    """Whether counts spread from their 10th to their 90th percentile by at least `SPREAD` of their median."""
    ordered = sorted(counts)
    low, high = ordered[len(ordered) // 10], ordered[-1 - len(ordered) // 10]
    return high - low >= SPREAD * max(1, statistics.median(ordered))


def rank_correlation(xs: Sequence[int], ys: Sequence[int]) -> float:
    """Spearman's rho (ties share their mean rank)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def _ranks(xs: Sequence[int]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def shifted(pairs: Sequence[Pair]) -> list[Pair]:
    """The same billed values paired with other ids of the same model (each moved by half its model's pairs): what
    a batch billing other prompts of the same lengths would show."""
    out: list[Pair] = []
    for model in dict.fromkeys(p.model for p in pairs):
        group = [p for p in pairs if p.model == model]
        k = len(group) // 2
        out += [Pair(model, p.counted, group[(i + k) % len(group)].billed) for i, p in enumerate(group)]
    return out


def tells(pairs: Sequence[Pair], relations: Mapping[str, Relation]) -> bool:
    """Whether agreeing with `relations` says anything: the shifted pairing fails them (fewer than `HALF` agree).
    Prompts whose lengths differ by less than the estimate's slack agree under any pairing: they prove nothing."""
    return len(pairs) >= 3 and (share(shifted(pairs), relations) or 0.0) < HALF


def _fails(pairs: Sequence[Pair], relations: Mapping[str, Relation], below: float = HALF) -> bool:
    s = share(pairs, relations)
    return s is not None and s < below


def _relative(left: Sequence[str], weighed: Mapping[str, Sequence[Pair]], fitted: Mapping[str, dict[str, Relation] | None],
              consistent: Sequence[str] | None) -> str | None:
    """(a): the one candidate that explains our requests while every other fails its relation, or None."""
    explaining = [c for c in left if fitted.get(c) and (consistent is None or c in consistent)]
    if len(explaining) != 1:
        return None
    winner = explaining[0]
    relations = fitted[winner] or {}
    others = [c for c in left if c != winner]
    if all(c in weighed and _fails(weighed[c], relations) for c in others):
        return winner
    return None


def _basis(proven: bool, learned: bool, others_failed: bool) -> str:
    if proven:
        return "it bills as this job's batches do" if learned else "it bills as count_tokens says"
    if others_failed:
        return "the others bill unlike this job's batches"
    return "a lone candidate with our custom_ids (its usage cannot prove it)"


def fit_of(pairs: Sequence[Pair], *, sampled: int, learned: Mapping[str, Relation] | None = None) -> Fit:
    """A lone candidate's verdict: FITS (proven ours) or UNCLEAR (unproven: its answers kept apart). Never
    another's on usage alone: giving it back would send ours again on an estimate."""
    return Fit.FITS if choose({"c": pairs}, ["c"], sampled=sampled, learned=learned).proven else Fit.UNCLEAR
