"""Estimated cost at batch prices, from a small dated price table the user can override. Pure but for loading.

cost = 0.5 x (input x in + output x out + 5m writes x cw + 1h writes x cw1h + reads x cr) / 10^6,
with the standard per-million prices of the model's row. A row may give cache_write (the 5-minute write),
cache_write_1h and cache_read; what it does not give is the input price times the table's multiplier
(`cache_multipliers`, by default 1.25x, 2x and 0.1x as the prompt-caching docs price them). A model id matches
the longest row name it starts with ("claude-sonnet-4-5-20250929" -> "claude-sonnet-4-5").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from ._errors import UsageError

BATCH_DISCOUNT = 0.5
DEFAULT_CACHE_MINIMUM = 1024  # tokens, for a model the table does not list (the docs' most common minimum)
MULTIPLIERS = {"cache_write": 1.25, "cache_write_1h": 2.0, "cache_read": 0.1}  # of the input rate
# Bytes of request JSON per input token, by purpose (the only three; each says which way it errs):
# - ESTIMATE: the dry-run estimate without count_tokens. For English prose this lands within about +-30%; JSON
#   structure and short prompts push it toward an overestimate, code and non-Latin scripts toward an underestimate.
# - PACING: the real-time lane charges a call's input up front at this (more tokens than most requests bill, so a
#   window is not overrun), corrected by the call's usage when it answers.
# - WORST: the budget's bound: no request bills more than one input token per 2 bytes of its JSON (see
#   decide/_budget), so a budget counted at it never fails open.
BYTES_PER_TOKEN_ESTIMATE = 4.0
BYTES_PER_TOKEN_PACING = 3.0
BYTES_PER_TOKEN_WORST = 2.0


class Rates(msgspec.Struct, frozen=True):
    """One model's standard USD per million tokens, by kind (`cache_write`: a write with the 5-minute life)."""

    input: float
    output: float
    cache_write: float
    cache_read: float
    cache_write_1h: float


class PriceTable(msgspec.Struct, frozen=True):
    """The price table: `rows` maps a model prefix to its standard USD per million tokens (`Rates`), `minimums` a
    model prefix to the shortest prefix it caches, in tokens; each with the date it is as of."""

    rows: dict[str, Rates]
    as_of: str = ""
    minimums: dict[str, int] | None = None
    minimums_as_of: str = ""

    def _row(self, model: str | None) -> Rates | None:
        row: Rates | None = _longest(self.rows, model)
        return row

    def cache_minimum(self, model: str) -> tuple[int, bool]:
        """(the model's minimum cacheable prefix in tokens, whether the table knows it): unknown models 1,024."""
        found: int | None = _longest(self.minimums or {}, model)
        return (DEFAULT_CACHE_MINIMUM, False) if found is None else (found, True)

    def lookup(self, model: str | None) -> tuple[float, float] | None:
        """(input, output) standard USD per million tokens, or None: no known price."""
        row = self._row(model)
        return None if row is None else (row.input, row.output)

    def rates(self, model: str | None) -> Rates | None:
        """The model's standard rates, every cache rate filled in, or None: no known price."""
        return self._row(model)

    def cost(self, model: str | None, input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0,
             cache_write_1h: int = 0) -> float | None:
        """USD at batch prices. `cache_write` counts every cache write, `cache_write_1h` the part of it with a 1h life."""
        row = self._row(model)
        return None if row is None else _at(row, input_tokens, output_tokens, cache_write, cache_read, cache_write_1h)

    def cost_at_most(self, model: str | None, input_tokens: int, output_tokens: int, cache_write: int = 0,
                     cache_read: int = 0, cache_write_1h: int = 0) -> float:
        """`cost`, a model without a known price priced as the table's dearest: what a budget counts (an answer
        whose model a gateway rewrote is never free)."""
        row = self._row(model) or self.dearest()
        return _at(row, input_tokens, output_tokens, cache_write, cache_read, cache_write_1h)

    def dearest(self) -> Rates:
        """The table's dearest rates (by output, then input price)."""
        return max(self.rows.values(), key=lambda r: (r.output, r.input))


def _at(row: Rates, input_tokens: int, output_tokens: int, cache_write: int, cache_read: int, cache_write_1h: int) -> float:
    """USD at batch prices at `row`'s rates."""
    return BATCH_DISCOUNT * (input_tokens * row.input + output_tokens * row.output
                             + (cache_write - cache_write_1h) * row.cache_write + cache_write_1h * row.cache_write_1h
                             + cache_read * row.cache_read) / 1e6


def _longest(rows: dict[str, Any], model: str | None) -> Any:
    """The row of the longest name `model` starts with."""
    if not model:
        return None
    best = None
    for name, value in rows.items():
        if model.startswith(name) and (best is None or len(name) > len(best[0])):
            best = (name, value)
    return best[1] if best else None


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The price table at `path` (JSON, the shape of gatekeeper/prices.json), or the bundled, dated one."""
    try:
        data = msgspec.json.decode(_builtin_table() if path is None else _read(path))
        multipliers = {**MULTIPLIERS, **{k: float(v) for k, v in data.get("cache_multipliers", {}).items()
                                         if k in MULTIPLIERS}}
        rows = {str(k): _price_row(v, multipliers) for k, v in data["models"].items()}
        if "cache_minimums" not in data:  # (a user's table without them: the bundled ones)
            data = {**data, **{k: v for k, v in msgspec.json.decode(_builtin_table()).items()
                               if k.startswith("cache_minimums")}}
        minimums = {str(k): int(v) for k, v in data["cache_minimums"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"price table {path}: not a price table ({exc})", setting="prices") from None
    return PriceTable(rows, str(data.get("as_of", "")), minimums, str(data.get("cache_minimums_as_of", "")))


def _builtin_table() -> bytes:
    """The bundled prices.json: read beside this module (importlib.resources, and the zipfile, lzma and tempfile
    it imports, cost `plan` about 10 ms of start-up), through importlib.resources only from a zipped install."""
    beside = os.path.join(os.path.dirname(__file__), "prices.json")
    if os.path.exists(beside):
        return _read(beside)
    from importlib import resources

    return resources.files("gatekeeper").joinpath("prices.json").read_bytes()


def _read(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _price_row(v: dict[str, float], multipliers: dict[str, float]) -> Rates:
    """A row's rates: the cache rates are optional, each the input rate times its multiplier when absent."""
    pin = float(v["input"])
    cache = {k: float(v[k]) if k in v else m * pin for k, m in multipliers.items()}
    return Rates(pin, float(v["output"]), cache["cache_write"], cache["cache_read"], cache["cache_write_1h"])


def estimate_input_tokens(request_bytes: int) -> int:
    return round(request_bytes / BYTES_PER_TOKEN_ESTIMATE)


def tokens_per_byte(measured: Mapping[str, Mapping[str, Any]], model: str) -> float:
    """A model's input tokens per byte: count_tokens' measure on the plan's sample (`measured`, the calibration's
    "models"), else the estimate's 1 / BYTES_PER_TOKEN_ESTIMATE. Pure."""
    rate = (measured.get(model) or {}).get("tokens_per_byte")
    return float(rate) if rate else 1 / BYTES_PER_TOKEN_ESTIMATE
