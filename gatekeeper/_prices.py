"""Estimated cost at batch prices, from a small dated price table the user can override. Pure but for loading.

cost = 0.5 x (input x in + output x out + cache_write x cw + cache_read x cr) / 10^6,
with the standard per-million prices of the model's row (cw and cr default to 1.25x
and 0.1x the input price when the row does not give them). A model id matches the
longest row name it starts with ("claude-sonnet-4-5-20250929" -> "claude-sonnet-4-5").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import orjson

from ._errors import UsageError

BATCH_DISCOUNT = 0.5
CACHE_READ = 0.1
CACHE_WRITE = 1.25
# Dry-run token estimate: ~4 bytes of request JSON per input token. For English
# prose this lands within about +-30%; JSON structure and short prompts push it
# toward an overestimate, code and non-Latin scripts toward an underestimate.
BYTES_PER_TOKEN = 4.0


@dataclass(frozen=True)
class PriceTable:
    rows: dict[str, tuple[float, ...]]  # model prefix -> (input, output[, cache_write, cache_read]) USD per million, standard
    as_of: str = ""

    def _row(self, model: str | None) -> tuple[float, ...] | None:
        if not model:
            return None
        best = None
        for name, price in self.rows.items():
            if model.startswith(name) and (best is None or len(name) > len(best[0])):
                best = (name, price)
        return best[1] if best else None

    def lookup(self, model: str | None) -> tuple[float, float] | None:
        """(input, output) standard USD per million tokens, or None: no known price."""
        row = self._row(model)
        return None if row is None else (row[0], row[1])

    def cost(self, model: str | None, input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0) -> float | None:
        row = self._row(model)
        if row is None:
            return None
        pin, pout = row[0], row[1]
        pcw = row[2] if len(row) > 2 else CACHE_WRITE * pin
        pcr = row[3] if len(row) > 3 else CACHE_READ * pin
        return BATCH_DISCOUNT * (input_tokens * pin + output_tokens * pout + cache_write * pcw + cache_read * pcr) / 1e6


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The price table at `path` (JSON, the shape of gatekeeper/prices.json), or the bundled, dated one."""
    try:
        data = orjson.loads(_builtin_table() if path is None else _read(path))
        rows = {str(k): _price_row(v) for k, v in data["models"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"price table {path}: not a price table ({exc})", setting="prices") from None
    return PriceTable(rows, str(data.get("as_of", "")))


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


def _price_row(v: dict[str, float]) -> tuple[float, ...]:
    """(input, output[, cache_write, cache_read]): the cache rates are optional, as in the table's first shape."""
    base = (float(v["input"]), float(v["output"]))
    if "cache_write" in v or "cache_read" in v:
        return (*base, float(v.get("cache_write", CACHE_WRITE * base[0])), float(v.get("cache_read", CACHE_READ * base[0])))
    return base


def estimate_input_tokens(request_bytes: int) -> int:
    return round(request_bytes / BYTES_PER_TOKEN)
