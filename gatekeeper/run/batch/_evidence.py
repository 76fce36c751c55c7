"""The evidence of whose a batch is: our requests sampled, a candidate's results read, our sample counted, and this
job's own billing relation learned from batches proven ours.

The rule that weighs it is `decide._ownership`; this module reads, counts and hands the figures to it, each once a
decision: a candidate's results are kept as per-id figures (the billed prompt tokens of our sampled ids and a
fingerprint of its custom_ids), our requests are read in one pass, counts are kept. A read that cannot be had now (a
damaged download, a 429, a 5xx) answers None: the caller waits and asks again, never guesses. An authentication,
permission or spend-limit error while counting is an error of the run, never a reason to adopt.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from ..._errors import (
    AccountRefused,
    ApiError,
    AuthenticationError,
    IncompleteDownload,
    RateLimited,
    ServerError,
    TransportError,
    UsageError,
)
from ...api._client import ApiClient
from ...api._reads import count_tokens
from ...checks._calibrate import count_body
from ...decide._headroom import total_requests
from ...decide._ownership import MIN_EVIDENCE, MIN_LEARNED, Pair, Relation, id_rank, learn
from ...decide._settle import result_of, usage_of
from ...state._journal import BatchState, Journal
from ..shared._inputs import batch_requests
from ._download import Download

SAMPLE = 4 * MIN_EVIDENCE  # of our ids kept a batch, so that MIN_EVIDENCE of them likely succeeded
LEARN_FROM = 2 * MIN_EVIDENCE  # pairs this job's billing relation is learned from


@dataclass
class IdPrint:
    """An order-free fingerprint of a set of custom_ids: equal sets give equal prints, in any order."""

    n: int = 0
    total: int = 0
    xor: int = 0

    def add(self, rank: bytes) -> None:
        """Add one custom_id by its `id_rank` (the hash the sample is ordered by: computed once an id)."""
        h = int.from_bytes(rank, "big")
        self.n += 1
        self.total = (self.total + h) & 0xFFFF_FFFF_FFFF_FFFF
        self.xor ^= h

    def text(self) -> str:
        """The print as a ledger records it (`Reservation.ids`)."""
        return f"{self.n}.{self.total:x}.{self.xor:x}"


@dataclass
class Ours:
    """Our batch's side: its custom_ids' fingerprint and its lowest-ranked requests, (model, request line) by id."""

    ids: IdPrint
    sample: dict[str, tuple[str, bytes]]


@dataclass
class Results:
    """A candidate's results as the rule needs them."""

    ids: IdPrint = field(default_factory=IdPrint)
    billed: dict[str, int] = field(default_factory=dict)  # sampled id -> prompt tokens billed (succeeded, with usage)
    missing: bool = False  # unavailable for good (past the grace): its custom_ids and usage cannot be known


def our_side(requests: Iterable[tuple[str, bytes]], k: int = SAMPLE) -> Ours:
    """One pass over a batch's requests (custom_id, request line)."""
    ids = IdPrint()

    def ranked() -> Iterable[tuple[bytes, str, bytes]]:
        for cid, body in requests:
            rank = id_rank(cid)
            ids.add(rank)
            yield rank, cid, body

    low = heapq.nsmallest(k, ranked(), key=lambda t: t[0])
    return Ours(ids, {cid: (model_of(body), body) for _, cid, body in low})


def model_of(body: bytes) -> str:
    params = orjson.loads(body).get("params")
    return str(params.get("model") or "") if isinstance(params, dict) else ""


def billed_prompt(result: object) -> int | None:
    """The prompt tokens a succeeded result was billed (input, cache writes and reads, as `usage_of` reads them);
    None without a usage (a gateway may report none: nothing to weigh, not a zero). Pure."""
    result = result_of(result)
    if result.type != "succeeded" or result.message is None or result.message.usage is None:
        return None
    _, tin, _, written, read, _ = usage_of(result)
    return tin + written + read


async def read_results(api: ApiClient, batch: dict[str, object], wanted: set[str]) -> Results | None:
    """An ended candidate's results, read whole: its ids' print and what it billed for `wanted`. None when no
    complete download can be had now. Raises NotFoundError when they are missing (the caller weighs the grace)."""
    got = Results()
    download = Download(api, batch, None, f"candidate {batch.get('id')}")
    try:
        async for cid, _, result in download:
            got.ids.add(id_rank(cid))
            if cid in wanted and (tokens := billed_prompt(result)) is not None:
                got.billed[cid] = tokens
    except (IncompleteDownload, TransportError, RateLimited, ServerError):
        return None
    # (verified by the download; a candidate's counts must be known, and none of its lines unreadable)
    return got if total_requests(batch) and not download.foreign else None


async def count_ours(api: ApiClient, sample: Mapping[str, tuple[str, bytes]], wanted: Iterable[str],
                     known: dict[str, int]) -> dict[str, int] | None:
    """count_tokens of our sampled requests with these custom_ids, added to `known` (kept between decisions).
    None when counting failed for now; {} when this API cannot count (a gateway without the endpoint, a refused
    body, credentials without the count-tokens action: 403). An authentication or spend-limit error stops the run.
    (Without counts nothing is proven: the adoption is kept apart, never resent; the run never stops at the same
    point on every rerun for an action its policy lacks.)"""
    for cid in wanted:
        if cid in known or cid not in sample:
            continue
        try:
            known[cid] = await count_tokens(api, count_body(orjson.loads(sample[cid][1])["params"]))
        except (RateLimited, ServerError, TransportError):
            return None
        except AuthenticationError as exc:
            if exc.status == 403:
                return {}
            raise
        except AccountRefused as exc:
            raise UsageError(f"counting our requests to tell our batch from another's: {exc}",
                             setting="api_key") from None
        except ApiError:
            return {}
    return known


def pairs_of(sample: Mapping[str, tuple[str, bytes]], counts: Mapping[str, int], billed: Mapping[str, int]) -> list[Pair]:
    """The ids counted and billed, as the rule weighs them (in the sample's order)."""
    return [Pair(sample[c][0], counts[c], billed[c]) for c in sample if c in counts and c in billed]


def wanted_ids(sample: Mapping[str, tuple[str, bytes]], billed: Iterable[Mapping[str, int]]) -> list[str]:
    """The sampled ids worth counting: those some candidate billed, lowest-ranked first, MIN_EVIDENCE of them."""
    some = set().union(*billed)
    return [c for c in sample if c in some][:MIN_EVIDENCE]


async def learned_relations(api: ApiClient, journal: Journal, path: str) -> dict[str, Relation] | None:
    """This job's billing relations (per model), learned once from a batch proven ours and kept in the journal.

    None while none can be learned yet but one will (a batch whose create was answered has not been collected);
    {} when nothing can be learned (no such batch, no usage, an API that cannot count). Counting that fails for now
    answers None too: asked again later."""
    kept = journal.get_meta("billing")
    if kept is not None:
        return {m: Relation.from_json(d) for m, d in kept.items()}
    proven = journal.adoptions.proven_batches()
    for row in (r for r in proven if r.state is BatchState.COLLECTED):
        billed = journal.outcomes.billed_results(row.idx)
        if len(billed) < MIN_LEARNED:
            continue
        chosen = dict(sorted(billed.items(), key=lambda kv: id_rank(kv[0]))[:LEARN_FROM])
        sample = {cid: (model_of(body), body) for _, _, body, _ in batch_requests(path, journal, row)
                  if (cid := str(orjson.loads(body).get("custom_id"))) in chosen}
        counts = await count_ours(api, sample, list(sample), {})
        if counts is None:
            return None
        relations = learn(pairs_of(sample, counts, chosen))
        journal.set_meta("billing", {m: r.as_json() for m, r in relations.items()}, "billing_learned",
                         batch=row.idx, relations={m: r.as_json() for m, r in relations.items()})
        return relations
    return None if any(r.state is not BatchState.COLLECTED for r in proven) else {}
