"""The spending guard: what a batch can cost at most, and whether it may go. Pure.

A batch's worst case, at batch prices, is

    sum over its requests of  0.5 x max over its models m of (in_bound x in_rate(m) + max_tokens x out(m)) / 10^6

    in_rate(m) = max(input(m), cache_write(m), cache_read(m), cache_write_1h(m) if it may write a 1-hour entry)

with `in_bound = bytes / BYTES_PER_TOKEN_WORST` (2): at most one input token per two bytes of the request's JSON (English text runs
near four bytes a token, so this is twice the usual density); every input token priced at the dearest way the
price table bills input for that model (an input token is billed once, as input, a cache write or a cache read:
the table's own rates, whatever multipliers it sets); every request producing its full `max_tokens` (output can
never exceed it); and its models are the request's own and any fallback models it names (`fallbacks`: an answer
may come from any of them, billed at its rates). A batch may be created only when

    spent + worst case of everything admitted and not yet collected + this batch's worst case <= budget

where `spent` is the actual cost of every result collected. Each term only over-counts: collected results are
priced as billed (at batch prices), and what is in flight is counted at its worst. So the actual total never
exceeds the budget, as long as no request's input runs denser than one token per two bytes (images, documents
or files given by reference can: keep a margin for them). When a batch does not fit, the batches not yet
created wait while anything is in flight (it settles below its worst case, freeing budget); with nothing in
flight they are cut to the size the remaining budget allows, down to `MIN_BATCH` requests; below that, admission
stops and the run ends with exit 1 saying what was spent and what was held back.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from .._errors import UsageError
from .._prices import BATCH_DISCOUNT, BYTES_PER_TOKEN_WORST, PriceTable, Rates

MIN_BATCH = 100  # below this many requests a batch is not worth its create call


def request_worst(nbytes: int, max_tokens: int, rates: Iterable[Rates], *, hour_write: bool = False) -> float:
    """The most one request can cost, in USD at batch prices (see the module docstring), over the rates of every
    model that may answer it: every input token at the dearest rate its model bills input at (the 1-hour write's
    only when the request may write one: `hour_write`)."""
    tokens_in = nbytes / BYTES_PER_TOKEN_WORST
    worst = 0.0
    for r in rates:
        per_in = max(r.input, r.cache_write, r.cache_read, r.cache_write_1h if hour_write else 0.0)
        worst = max(worst, tokens_in * per_in + max_tokens * r.output)
    return BATCH_DISCOUNT * worst / 1e6


def body_worst(body: bytes, line: int, prices: PriceTable) -> float:
    """The most one request line can cost, in USD at batch prices (`request_worst` over every model that may answer
    it); a UsageError naming the line when one of them has no price (a fallback the price check could not see)."""
    import orjson

    params = orjson.loads(body)["params"]
    rates = []
    for model in answering_models(params):
        r = prices.rates(model)
        if r is None:
            raise UsageError(f"a budget needs a price for every model; none is known for {model} (line {line}; give "
                             "a price table that has it)", setting="prices")
        rates.append(r)
    return request_worst(len(body), params["max_tokens"], rates, hour_write=b'"1h"' in body)


def answering_models(params: dict[str, object]) -> list[str]:
    """The models that may answer a request: its own, and the fallbacks it names (`fallbacks`: model ids, or
    objects with a `model`)."""
    models = [str(params.get("model") or "")]
    fallbacks = params.get("fallbacks")
    for f in fallbacks if isinstance(fallbacks, list) else []:
        m = f.get("model") if isinstance(f, dict) else f
        if isinstance(m, str) and m:
            models.append(m)
    return models


class Spend(str, enum.Enum):
    GO = "go"  # create the batch
    WAIT = "wait"  # what is in flight will settle below its worst case: ask again then
    CUT = "cut"  # cut the batches not yet created to `size` requests, then try again
    STOP = "stop"  # nothing more fits: admit nothing, finish what is in flight


@dataclass(frozen=True)
class SpendDecision:
    action: Spend
    size: int = 0


def may_spend(*, budget: float, spent: float, in_flight: float, worst: float, requests: int) -> SpendDecision:
    """Whether a batch whose worst case is `worst` (over `requests` requests) may be created now."""
    remaining = budget - spent - in_flight
    if worst <= remaining:
        return SpendDecision(Spend.GO)
    if in_flight > 0:
        return SpendDecision(Spend.WAIT)
    per_request = worst / max(1, requests)
    fits = int(remaining / per_request + 1e-9) if per_request > 0 else requests  # (float division: 4.0 // 0.005 is 799)
    if fits >= MIN_BATCH and fits < requests:
        return SpendDecision(Spend.CUT, fits)
    return SpendDecision(Spend.STOP)
