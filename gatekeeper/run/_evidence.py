"""The evidence of whose a batch is: a candidate's results read whole, and our own requests counted.

The rule that weighs it is `_ownership`; this module reads, counts and hands the figures to it. Each read answers None when it cannot be had
now (a damaged download, a 429, a 5xx): the caller waits and asks again, never guesses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from .._errors import ApiError, IncompleteDownload, RateLimited, ServerError, TransportError
from ..api._client import ApiClient
from ..checks._calibrate import count_body
from ..decide._headroom import total_requests
from ..decide._ownership import Fit, fit, sample_ids
from ..decide._settle import usage_of
from ._download import Download


@dataclass
class Results:
    """What a batch's results say about whose it is."""

    ids: set[str] = field(default_factory=set)
    billed: dict[str, int] = field(default_factory=dict)  # custom_id -> prompt tokens billed (succeeded lines)


def billed_prompt(result: object) -> int | None:
    """The prompt tokens a succeeded result was billed: input, cache writes and cache reads. Pure."""
    if not isinstance(result, dict) or result.get("type") != "succeeded":
        return None
    _, tin, _, cache_write, cache_read, _ = usage_of(result)
    return tin + cache_write + cache_read


async def read_results(api: ApiClient, batch: dict[str, object]) -> Results | None:
    """Every line of an ended batch's results, or None when no complete download can be had now."""
    got = Results()
    download = Download(api, batch, None, f"candidate {batch.get('id')}")
    try:
        async for cid, _, obj in download:
            got.ids.add(cid)
            tokens = billed_prompt(obj.get("result"))
            if tokens is not None:
                got.billed[cid] = tokens
    except (ApiError, TransportError, IncompleteDownload):
        return None
    # (verified by the download; a candidate's counts must be known, and none of its lines unreadable)
    return got if total_requests(batch) and not download.foreign else None


async def count_ours(api: ApiClient, bodies: Iterable[tuple[str, bytes]], wanted: set[str]) -> dict[str, int] | None:
    """count_tokens of our requests with these custom_ids (`bodies`: custom_id and request line). None when
    counting failed for now; {} when this API cannot count (a gateway without the endpoint, a refused body)."""
    counts: dict[str, int] = {}
    for cid, body in bodies:
        if len(counts) == len(wanted):
            break
        if cid not in wanted:
            continue
        try:
            counts[cid] = await api.count_tokens(count_body(orjson.loads(body)["params"]))
        except (RateLimited, ServerError, TransportError):
            return None
        except ApiError:
            return {}
    return counts


async def weigh(api: ApiClient, bodies: Iterable[tuple[str, bytes]], billed: dict[str, dict[str, int]]) -> dict[str, Fit] | None:
    """Each candidate's fit (`billed`: by batch id, what it billed per custom_id) against a sample of our requests
    that succeeded in some candidate, counted now. `bodies` is read once, lazily (a batch's requests can be 256 MB).
    None when counting failed for now."""
    if not billed:
        return {}
    wanted = set(sample_ids({cid for got in billed.values() for cid in got}))
    expected = await count_ours(api, bodies, wanted)
    if expected is None:
        return None
    return {batch_id: fit(expected, got) if expected else Fit.UNCLEAR for batch_id, got in billed.items()}
