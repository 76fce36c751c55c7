"""The price table: dated, covering the current models, cache rates, and the first shape still accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatekeeper import load_prices
from gatekeeper.testing import DEFAULT_MODELS


def test_bundled_table_is_dated_and_prices_every_current_model() -> None:
    """Every model the fake lists (the current lineup) and the README's examples have a price; the table is dated."""
    table = load_prices()
    assert table.as_of >= "2026-12-01"
    for model in [m.id for m in DEFAULT_MODELS] + ["claude-haiku-4-5-20251001", "claude-sonnet-4-5-20250929", "claude-opus-4-6"]:
        assert table.lookup(model) is not None, model


@pytest.mark.parametrize(("model", "tokens", "expected"), [
    # batch = half of every rate: input, output, cache write, cache read
    ("claude-sonnet-5", (1_000_000, 0, 0, 0), 1.0),
    ("claude-sonnet-5", (0, 1_000_000, 0, 0), 5.0),
    ("claude-sonnet-5", (0, 0, 1_000_000, 0), 1.25),
    ("claude-sonnet-5", (0, 0, 0, 1_000_000), 0.10),
    ("claude-opus-5-5", (1_000_000, 1_000_000, 0, 0), 12.0),
    ("claude-opus-4-8", (1_000_000, 0, 0, 0), 2.5),  # not priced as claude-opus-4 (15.0): the longest name wins
    ("claude-haiku-5-5", (1, 1, 0, 0), None),  # tiered: no price, never a guess
    ("no-such-model", (1, 1, 0, 0), None),
])
def test_cost_at_batch_prices(model: str, tokens: tuple[int, int, int, int], expected: float | None) -> None:
    """Costs are at batch prices with the row's own cache rates; a model without a row costs None."""
    cost = load_prices().cost(model, *tokens)
    assert cost == (pytest.approx(expected) if expected is not None else None)


def test_first_shape_still_accepted(tmp_path: Path) -> None:
    """--prices FILE in the first shape (input and output only): cache rates default to 1.25x and 0.1x input."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"models": {"my-model": {"input": 2.0, "output": 10.0}}}))
    table = load_prices(path)
    assert table.cost("my-model-1", 0, 0, 1_000_000, 1_000_000) == pytest.approx(0.5 * (2.5 + 0.2))
