"""Estimated cost at batch prices, from a small price table the user can override. Pure but for loading.

cost = 0.5 x (input x in + output x out + cache_write x 1.25 in + cache_read x 0.1 in) / 10^6,
with the standard per-million prices of the model's row. A model id matches the
longest row name it starts with ("claude-sonnet-4-5-20250929" -> "claude-sonnet-4-5").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

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
    rows: dict[str, tuple[float, float]]  # model prefix -> (input, output) USD per million, standard
    as_of: str = ""

    def lookup(self, model: str | None) -> tuple[float, float] | None:
        if not model:
            return None
        best = None
        for name, price in self.rows.items():
            if model.startswith(name) and (best is None or len(name) > len(best[0])):
                best = (name, price)
        return best[1] if best else None

    def cost(self, model: str | None, input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0) -> float | None:
        price = self.lookup(model)
        if price is None:
            return None
        pin, pout = price
        return BATCH_DISCOUNT * (input_tokens * pin + output_tokens * pout + cache_write * CACHE_WRITE * pin
                                 + cache_read * CACHE_READ * pin) / 1e6


def load_prices(path: str | Path | None = None) -> PriceTable:
    try:
        text = resources.files("gatekeeper").joinpath("prices.json").read_text() if path is None else Path(path).read_text()
        data = json.loads(text)
        rows = {str(k): (float(v["input"]), float(v["output"])) for k, v in data["models"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"price table {path}: not a price table ({exc})", setting="prices") from None
    return PriceTable(rows, str(data.get("as_of", "")))


def estimate_input_tokens(request_bytes: int) -> int:
    return round(request_bytes / BYTES_PER_TOKEN)
