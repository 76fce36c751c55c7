"""Prompt caching decisions (decide/_priming.py, decide/_gate.py), table-driven: which prefix a request shares, rounds, the gate
that holds a rest until its primer has ended, the input cost three ways, the read share of the ideal. Pure."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper import load_prices
from gatekeeper._prices import Rates
from gatekeeper.decide._budget import request_worst
from gatekeeper.decide._gate import Waiting, gate, lapsed, reprimable, watch_wait
from gatekeeper.decide._priming import (
    NONE,
    InputRates,
    Marks,
    groups,
    ideal_write_share,
    input_costs,
    lives,
    model_mask,
    read_share,
    round_size,
    rounds,
    shared_prefixes,
    under_mask,
    used_points,
)
from gatekeeper.decide._settle import usage_of
from gatekeeper.input._caching import CacheScan
from gatekeeper.state._journal import BatchRow, Journal

# A marked prefix: (tokens, digest, life)
TOOLS = (600, 1, "1h")  # a tool list every request marks
DOC_A, DOC_B = (3000, 2, "1h"), (3100, 3, "1h")  # a document, marked after the tools
QUESTION = (3050, 4, "5m")  # a per-request marker, unique


def marks_of(*requests: tuple[str, float, tuple[tuple[int, int, str], ...]]) -> Marks:
    """Marks from (model, tokens, prefixes) rows, as a table reads them."""
    marks = Marks()
    for model, tokens, prefixes in requests:
        if model not in marks.models:
            marks.models.append(model)
        marks.add(marks.models.index(model), tokens, ((t, d, int(life == "1h")) for t, d, life in prefixes))
    return marks


def prefixes_of(marks: Marks, chosen) -> list:
    """The chosen points as (tokens, digest, life), None for NONE."""
    return [None if p == NONE else (marks.psize[p], marks.digest[p], marks.life(p)) for p in chosen]


@pytest.mark.parametrize(("requests", "minimum", "expected"), [
    # the longest shared eligible prefix wins over the shorter shared one and over a longer unique one
    ([("m", 3100, (TOOLS, DOC_A)), ("m", 3100, (TOOLS, DOC_A, QUESTION))], [500], [DOC_A, DOC_A]),
    # below the minimum the tools do not count: the documents differ, so each is a group of one
    ([("m", 3100, (TOOLS, DOC_A)), ("m", 3200, (TOOLS, DOC_B))], [1024], [DOC_A, DOC_B]),
    # at a 512 minimum the tools are shared: that is the prefix they share
    ([("m", 3100, (TOOLS, DOC_A)), ("m", 3200, (TOOLS, DOC_B))], [512], [TOOLS, TOOLS]),
    # every prefix below the minimum: nothing is cached
    ([("m", 700, (TOOLS,))], [1024], [None]),
    # two models, each held to its own minimum
    ([("a", 700, (TOOLS,)), ("b", 700, (TOOLS,))], [512, 1024], [TOOLS, None]),
])
def test_the_prefix_each_request_shares(requests: list, minimum: list[float], expected: list) -> None:
    marks = marks_of(*requests)
    assert prefixes_of(marks, shared_prefixes(marks, minimum)) == expected


def _rule(marks: Marks, minimum: list[float]) -> list[int]:
    """The shared-prefix rule as the module docstring states it, one request at a time: the longest eligible point
    another request marks too, else the longest eligible one, else NONE."""
    eligible = [[p for p in range(marks.first[k], marks.first[k + 1]) if marks.psize[p] >= minimum[marks.model[k]]]
                for k in range(len(marks))]
    seen = Counter(marks.digest[p] for points in eligible for p in points)
    return [next((p for p in reversed(points) if seen[marks.digest[p]] > 1), points[-1] if points else NONE)
            for points in eligible]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.lists(st.sampled_from([TOOLS, DOC_A, DOC_B, QUESTION, (10, 9, "5m")]),
                                                           min_size=1, max_size=3, unique=True)), min_size=1, max_size=8),
       st.sampled_from([[500.0, 500.0], [1024.0, 1024.0], [512.0, 4000.0], [10.0, 1024.0], [5000.0, 5000.0]]),
       st.booleans(), st.booleans())
def test_the_shared_prefix_whole_arrays_choose_as_the_rule(rows: list, minimum: list[float], one_model: bool,
                                                           one_marker: bool) -> None:
    """`shared_prefixes` over whole arrays (one marker a request, one model: none, all or some eligible) and
    request by request chooses as the rule does; `used_points` (a range, none, or filtered) lists the chosen ones."""
    requests = [("a" if one_model else model, 4000, tuple(sorted(points))[:1] if one_marker else tuple(sorted(points)))
                for model, points in rows]
    marks = marks_of(*requests)
    minimum = minimum[:len(marks.models)]
    chosen, expected = shared_prefixes(marks, minimum), _rule(marks, minimum)
    assert list(chosen) == expected
    assert list(used_points(chosen)) == [p for p in expected if p != NONE]
    assert list(used_points(under_mask(chosen, bytes([1]) + bytes(len(marks) - 1)))) == [p for p in expected[:1] if p != NONE]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.sampled_from([TOOLS, DOC_A, DOC_B, QUESTION]),
                                                            min_size=1, max_size=3, unique=True)), min_size=1, max_size=9))
def test_each_models_requests_and_lives_counted_over_whole_arrays_as_one_at_a_time(rows: list) -> None:
    """`model_mask` and `lives` (whole arrays, C loops) pick and count as a request-by-request walk does, one point
    a request or several, one model or three."""
    marks = marks_of(*[(model, 4000, tuple(sorted(points))) for model, points in rows])
    points, hours = lives(marks)
    for m in range(len(marks.models)):
        mine = [k for k in range(len(marks)) if marks.model[k] == m]
        assert list(under_mask(range(len(marks)), model_mask(marks, m))) == mine
        mine_points = [p for k in mine for p in range(marks.first[k], marks.first[k + 1])]
        assert points[m] == len(mine_points)
        assert hours[m] == sum(marks.hour[p] for p in mine_points)


def test_groups_and_rounds() -> None:
    marks = marks_of(*[("m", 4000, (p,)) for p in (DOC_A, DOC_B, (10, 9, "5m"), DOC_A, DOC_B, DOC_A, QUESTION)])
    chosen = shared_prefixes(marks, [1024])
    assert groups(marks, chosen) == [[0, 3, 5], [1, 4]]  # QUESTION alone is no group; the short one is not cached
    assert rounds([3, 2, 4, 1], round_size=5) == [[0, 1], [2, 3]]
    assert rounds([7, 1], round_size=5) == [[0], [1]]  # a group larger than a round is a round of its own


@pytest.mark.parametrize(("ceiling", "margin", "batch", "size"), [
    (None, 0, 100_000, 100_000),  # unknown ceiling: one batch a round
    (1000, 0, 250, 500),  # half the queue, so the next primer goes while a rest is processed
    (1000, 600, 100, 200),
    (100, 0, 80, 80),  # never less than a batch
])
def test_round_size(ceiling: int | None, margin: int, batch: int, size: int) -> None:
    assert round_size(ceiling, margin, batch) == size


def test_input_cost_without_caching_cold_and_primed() -> None:
    """Three requests of 4,000 tokens share a 1h prefix of 3,000 at $2 a million: cold, each writes it at 2x; primed,
    one writes and two read at 0.1x. Batch prices halve everything."""
    marks = marks_of(*[("m", 4000, (DOC_A,))] * 3)
    chosen = shared_prefixes(marks, [1024])
    costs = input_costs(marks, chosen, [InputRates(2.0, 2.5, 4.0, 0.2)])
    none = 3 * 4000 * 2.0
    cold = 3 * (1000 * 2.0 + 3000 * 4.0)
    primed = 3 * 1000 * 2.0 + 3000 * 4.0 + 2 * 3000 * 0.2
    assert costs == pytest.approx({"none": none / 2e6, "cold": cold / 2e6, "primed": primed / 2e6})
    assert input_costs(marks, chosen, [None]) == {"none": None, "cold": None, "primed": None}


@pytest.mark.parametrize(("read", "written", "ideal", "share"), [
    (0, 0, None, None),  # nothing could be read
    (500, 100, 1 / 6, 1.0),  # one write in six uses, the other five read: the ideal
    (0, 600, 1 / 6, 0.0),  # cold: every use wrote
    (250, 350, 1 / 6, 0.5),
])
def test_read_share_of_the_ideal(read: int, written: int, ideal: float | None, share: float | None) -> None:
    assert read_share(read, written, ideal) == (None if share is None else pytest.approx(share))


def test_ideal_write_share_is_one_write_per_distinct_prefix() -> None:
    marks = marks_of(*[("m", 4000, (p,)) for p in (DOC_A, DOC_A, DOC_A, DOC_B, (10, 9, "5m"))])
    assert ideal_write_share(marks, used_points(shared_prefixes(marks, [1024]))) == \
        pytest.approx((3000 + 3100) / (3 * 3000 + 3100))
    short = marks_of(("m", 100, ((10, 9, "5m"),)))
    assert ideal_write_share(short, used_points(shared_prefixes(short, [1024]))) is None


def w(idx: int, kind: str, n: int, r: int | None = None) -> Waiting:
    return Waiting(idx, kind, n, r)


@pytest.mark.parametrize(("ended_at", "life", "now", "gone"), [
    (None, 300.0, 1e9, False),  # not ended: nothing to lapse
    (100.0, 300.0, 399.0, False),
    (100.0, 300.0, 401.0, True),  # a 5-minute prefix, 301 s after its primer ended
    (100.0, 3600.0, 401.0, False),
    (100.0, None, 1e9, False),  # a life unknown (a journal from before lives were recorded)
])
def test_a_round_lapses_when_its_primers_ended_longer_ago_than_its_life(ended_at, life, now, gone) -> None:
    assert lapsed(ended_at, life, now) is gone


@pytest.mark.parametrize(("waiting", "ended", "cap", "order", "sizes", "reserve"), [
    # nothing of priming: all as today, in order
    ([w(0, "plan", 10), w(1, "retry", 5)], {}, None, [0, 1], [10, 5], 0),
    # round 0's primer waits: it asks room for its rest too; the rest is held (no reserve yet: its primer is not sent)
    ([w(0, "plan", 10), w(1, "primer", 2, 0), w(2, "rest", 8, 0)], {0: None}, None, [1, 0], [10, 10], 0),
    # the primer is in flight: the rest is held and its room reserved
    ([w(0, "plan", 10), w(2, "rest", 8, 0)], {0: None}, None, [0], [10], 8),
    # the primer ended: the rest goes first
    ([w(0, "plan", 10), w(2, "rest", 8, 0)], {0: 5.0}, None, [2, 0], [8, 10], 0),
    # round 1's primer waits for round 0's rest to be sent, however much room there is
    ([w(2, "rest", 8, 0), w(3, "primer", 2, 1), w(4, "rest", 6, 1)], {0: None, 1: None}, None, [], [], 8),
    ([w(3, "primer", 2, 1), w(4, "rest", 6, 1)], {0: 5.0, 1: None}, None, [3], [8], 0),
    # a round larger than the queue can ever hold asks no more than the cap
    ([w(3, "primer", 2, 1), w(4, "rest", 60, 1)], {1: None}, 50, [3], [50], 0),
])
def test_the_gate(waiting: list[Waiting], ended: dict[int, float | None], cap: int | None, order: list[int], sizes: list[int],
                  reserve: int) -> None:
    g = gate(waiting, ended, cap)
    assert (g.order, g.sizes, g.reserve) == (order, sizes, reserve)


def test_cache_writes_are_priced_by_life_and_the_table_can_override_each_multiplier(tmp_path) -> None:
    prices = load_prices()
    # Sonnet 5: $2 input. 1,000 tokens written 5m (1.25x), 1,000 written 1h (2x), 1,000 read (0.1x), at batch prices
    cost = prices.cost("claude-sonnet-5", 0, 0, cache_write=2000, cache_read=1000, cache_write_1h=1000)
    assert cost == pytest.approx(0.5 * (1000 * 2.5 + 1000 * 4.0 + 1000 * 0.2) / 1e6)
    table = tmp_path / "p.json"
    table.write_text('{"as_of": "x", "cache_multipliers": {"cache_write_1h": 3.0}, "models": {"m": {"input": 1, "output": 1}}}')
    custom = load_prices(table)
    assert custom.cost("m", 0, 0, cache_write=1000, cache_write_1h=1000) == pytest.approx(0.5 * 3000 / 1e6)
    assert custom.cache_minimum("m") == (1024, False) and custom.cache_minimum("claude-opus-5") == (512, True)


def test_usage_splits_cache_writes_by_life_and_a_missing_breakdown_counts_as_5m() -> None:
    msg = {"message": {"model": "m", "usage": {"input_tokens": 5, "output_tokens": 7, "cache_creation_input_tokens": 30,
                                               "cache_read_input_tokens": 40, "cache_creation": {
                                                   "ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20}}}}
    assert usage_of(msg) == ("m", 5, 7, 30, 40, 20)
    del msg["message"]["usage"]["cache_creation"]
    assert usage_of(msg) == ("m", 5, 7, 30, 40, 0)


def test_a_request_that_may_write_an_hour_entry_has_the_dearer_worst_case() -> None:
    rates = [Rates(1.0, 5.0, 1.25, 0.1, 2.0)]
    assert request_worst(1000, 0, rates, hour_write=True) == pytest.approx(2.0 / 1.25 * request_worst(1000, 0, rates))


T = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(("primers", "expected"), [
    ([(0, True, "2026-01-01T00:00:00Z", T + 30.0)], {0: T}),  # the API's ended_at, not when a reading saw it
    ([(0, True, None, T + 30.0)], {0: T + 30.0}),  # no ended_at given: when the journal saw it
    ([(0, True, "2026-01-01T00:00:00Z", None), (0, True, "2026-01-01T00:01:00Z", None)], {0: T + 60.0}),  # the last
    ([(0, True, "2026-01-01T00:00:00Z", None), (0, False, None, None)], {0: None}),  # one still running
    ([(0, False, None, None), (0, True, "2026-01-01T00:00:00Z", None)], {0: None}),  # in either order
    ([(0, True, "2026-01-01T00:00:00Z", None), (1, False, None, None)], {0: T, 1: None}),
    ([], {}),
])
def test_a_round_ends_when_its_last_primer_ended_by_the_apis_clock(primers: list, expected: dict) -> None:
    from gatekeeper.decide._gate import rounds_ended

    assert rounds_ended(primers) == expected


@pytest.mark.parametrize(("measured", "model", "rate"), [
    ({"m": {"tokens_per_byte": 0.3}}, "m", 0.3),  # as the plan measured it
    ({"m": {"input_tokens": 10}}, "m", 0.25),  # not measured: bytes / 4
    ({}, "m", 0.25),
    ({"other": {"tokens_per_byte": 0.3}}, "m", 0.25),
])
def test_repriming_sizes_prefixes_as_the_plan_did(measured: dict, model: str, rate: float) -> None:
    from gatekeeper._prices import tokens_per_byte

    assert tokens_per_byte(measured, model) == rate


def _plan(index: int, first: int, last: int, requests: int, size: int) -> object:
    from gatekeeper.input._planner import BatchPlan

    return BatchPlan(index, requests, size, first, last, first * 100, (last + 1) * 100, f"c{first}", f"c{last}")


@pytest.mark.parametrize(("claimed", "expected"), [
    ({}, [(0, 3, 300, 1, 3), (1, 2, 200, 4, 5)]),  # nothing claimed: the ranges as cut
    ({2: 90}, [(0, 2, 209, 1, 3), (1, 2, 200, 4, 5)]),  # a line and its separator leave the range
    ({1: 90, 2: 90, 3: 90}, [(0, 2, 200, 4, 5)]),  # a range left empty is dropped; indexes close up
    ({4: 90, 9: 90}, [(0, 3, 300, 1, 3), (1, 1, 109, 4, 5)]),  # a claimed line outside every range changes nothing
])
def test_without_lines_leaves_out_what_priming_sends(claimed: dict[int, int], expected: list[tuple]) -> None:
    """The input-range batches less the claimed lines (line -> bytes, each with its one-byte separator)."""
    from gatekeeper.input._cachereport import without_lines

    rows = without_lines([_plan(0, 1, 3, 3, 300), _plan(1, 4, 5, 2, 200)], claimed)
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == expected


def _scan(rows: list[tuple[int, str, list[tuple[int, int, str]]]]) -> CacheScan:
    """A reader's scan of marked lines: (line, model, its prefixes (bytes, digest, life))."""
    scan = CacheScan()
    for line, model, points in rows:
        scan.add(line, line * 100, 100 + line, f"c{line}", model, tuple(points))
    return scan


@pytest.mark.parametrize(("first", "second", "base", "models", "lines", "model_of"), [
    # the same models in the same order: the piece's arrays are taken whole, its lines counted from the base
    ([(0, "a", [(10, 1, "5m")])], [(0, "a", [(20, 2, "1h")])], 5, ["a"], [0, 5], [0, 0]),
    # a piece that met its models in another order: its model numbers are remapped to ours
    ([(0, "a", [(10, 1, "5m")]), (1, "b", [(10, 3, "5m")])], [(0, "b", [(30, 3, "5m")]), (1, "c", [(5, 4, "5m")])], 2,
     ["a", "b", "c"], [0, 1, 2, 3], [0, 1, 1, 2]),
    # a piece of lines with no prefix of note merges nothing of its own but the lines
    ([], [(0, "a", [(10, 1, "5m"), (40, 9, "5m")])], 0, ["a"], [0], [0]),
])
def test_a_pieces_scan_merges_as_if_read_in_one_pass(first: list, second: list, base: int, models: list[str],
                                                      lines: list[int], model_of: list[int]) -> None:
    merged = _scan(first)
    merged.merge(_scan(second), base)
    for line in range(base + 3):  # asked before the merged lines are numbered, as the report asks
        assert merged.any_line_in({line, 10**6}) == (line in lines)
    assert not merged.any_line_in(set())
    one_pass = _scan(first)
    for line, model, points in second:
        one_pass.add(line + base, line * 100, 100 + line, f"c{line}", model, tuple(points))
    assert merged.marks.models == models == one_pass.marks.models
    assert list(merged.lines) == lines == list(one_pass.lines) and list(merged.marks.model) == model_of
    for name in ("size", "first", "psize", "digest"):
        assert list(getattr(merged.marks, name)) == list(getattr(one_pass.marks, name)), name
    assert merged.marks.hour == one_pass.marks.hour and merged.cids == one_pass.cids and merged.marks.unit == "bytes"
    assert list(merged.offsets) == list(one_pass.offsets)


@pytest.mark.parametrize("pieces", [
    # one point a line in every piece: `first` stays a range, sent as nothing
    [[(0, "a", [(10, 1, "5m")]), (1, "a", [(20, 2, "5m")])], [(0, "a", [(30, 3, "1h")])]],
    # a piece with a two-point line after one-point pieces, and one-point pieces after it
    [[(0, "a", [(10, 1, "5m")])], [(0, "b", [(10, 1, "5m"), (40, 9, "5m")])], [(0, "a", [(5, 4, "5m")])]],
    # the first piece has it
    [[(0, "a", [(10, 1, "1h"), (40, 9, "5m")]), (1, "a", [(5, 4, "5m")])], [(0, "a", [(30, 3, "5m")])]],
])
def test_pieces_sent_as_the_workers_send_them_join_as_one_pass(pieces: list) -> None:
    """Each piece through marshal (as a forked worker sends it) and merged, against the same lines read in one pass:
    every column equal, `first` among them, a range exactly while every line has one point."""
    import marshal

    merged, one_pass, base = CacheScan(), CacheScan(), 0
    for rows in pieces:
        merged.merge(CacheScan.from_marshal(marshal.loads(marshal.dumps(_scan(rows).to_marshal()))), base)
        for line, model, points in rows:
            one_pass.add(line + base, line * 100, 100 + line, f"c{line}", model, tuple(points))
        base += len(rows)
    for name in ("model", "size", "first", "psize", "digest"):
        assert list(getattr(merged.marks, name)) == list(getattr(one_pass.marks, name)), name
    assert merged.marks.hour == one_pass.marks.hour and list(merged.lines) == list(one_pass.lines)
    one_each = all(len(points) == 1 for rows in pieces for _, _, points in rows)
    assert isinstance(merged.marks.first, range) == isinstance(one_pass.marks.first, range) == one_each


def _rests(tmp_path: Path, docs: list[tuple[str, int, int]]) -> tuple[str, Journal, list[BatchRow]]:
    """An input of marked requests (`docs`: (name, its bytes, requests sharing it)) recorded as one planned rest
    batch of round 0, as priming leaves a lapsed round's rest."""
    import orjson

    from gatekeeper.state._journal import JobPlan, Journal, PendingRow
    from gatekeeper.state._records import BatchState

    path, rows, offset, line = tmp_path / "in.jsonl", [], 0, 0
    with open(path, "wb") as f:
        for name, size, n in docs:
            for i in range(n):
                body = orjson.dumps({"custom_id": f"{name}-{i}", "params": {
                    "model": "claude-sonnet-4-5", "max_tokens": 10, "system": [
                        {"type": "text", "text": name * (size // len(name)), "cache_control": {"type": "ephemeral"}}],
                    "messages": [{"role": "user", "content": f"question {i}"}]}})
                f.write(body + b"\n")
                rows.append(PendingRow(line, offset, len(body), f"{name}-{i}", 1))
                offset, line = offset + len(body) + 1, line + 1
    journal = Journal.open(tmp_path / "state")
    journal.start_job(JobPlan(input={}, settings={}, report={}, output="", batches=[], rejections=[],
                              groups=[("rest", 0, rows)]), size=lambda g: 100 * len(g))
    return str(path), journal, journal.batches(BatchState.PLANNED)


@pytest.mark.parametrize(("docs", "primers", "groups"), [
    # two documents well above the minimum: the first request of each primes a new round, the others wait for it
    ([("alpha", 40_000, 3), ("beta", 40_000, 2)], 2,
     [("primer", 1, ["alpha-0", "beta-0"]), ("rest", 1, ["alpha-1", "alpha-2", "beta-1"])]),
    # a document below the model's minimum is cached by nobody: no primer, everything waits in the rest
    ([("tiny", 200, 3)], 0, [("rest", 1, ["tiny-0", "tiny-1", "tiny-2"])]),
    # one above, one below: a primer for the one that caches
    ([("alpha", 40_000, 2), ("tiny", 200, 2)], 1, [("primer", 1, ["alpha-0"]), ("rest", 1, ["alpha-1", "tiny-0", "tiny-1"])]),
])
def test_a_lapsed_rest_is_regrouped_into_a_new_round(tmp_path: Path, docs: list, primers: int, groups: list) -> None:
    from gatekeeper.input._sizing import Limits
    from gatekeeper.run.batch._reprime import regroup

    path, journal, rows = _rests(tmp_path, docs)
    got, n = regroup(path, journal, rows, load_prices(), Limits())
    assert n == primers
    assert [(kind, r, [m.custom_id for m in g]) for kind, r, g in got] == groups


def test_pieces_merged_then_a_line_added_keep_input_order() -> None:
    """Merged pieces are joined when first read, before any line added after them: the arrays stay in input order."""
    merged = _scan([(0, "a", [(10, 1, "5m")])])
    merged.merge(_scan([(0, "b", [(20, 2, "1h")]), (1, "a", [(30, 3, "5m"), (40, 4, "5m")])]), 1)
    merged.merge(_scan([(0, "a", [(50, 5, "5m")])]), 3)
    merged.add(9, 900, 109, "c9", "b", ((60, 6, "1h"),))
    assert list(merged.lines) == [0, 1, 2, 3, 9] and merged.marks.models == ["a", "b"]
    assert list(merged.marks.model) == [0, 1, 0, 0, 1] and list(merged.marks.first) == [0, 1, 2, 4, 5, 6]
    assert list(merged.marks.digest) == [1, 2, 3, 4, 5, 6] and bytes(merged.marks.hour) == b"\x00\x01\x00\x00\x00\x01"
    assert list(merged.offsets) == [0, 0, 100, 0, 900] and len(merged) == 5


@pytest.mark.parametrize(("lives", "wait"), [
    ([], None),                 # no primer in flight with its rest waiting: the poll stands
    ([300.0], 75.0),            # a 5-minute prefix: a reading at least every 75 s
    ([3600.0, 300.0], 75.0),    # the shortest life rules
    ([3600.0], 900.0),          # an hour's prefix: every 15 minutes
])
def test_a_flying_primer_is_watched_at_a_quarter_of_its_life(lives: list[float], wait: float | None) -> None:
    assert watch_wait(lives) == wait


@pytest.mark.parametrize(("round_", "reprimed", "again"), [
    (0, set(), True),     # a first round that lapsed is primed again
    (1, {1}, False),      # a round that is itself a new primer is not: its rest goes as it is
    (2, {1}, True),       # another first round still is
])
def test_a_lapsed_round_is_primed_again_once(round_: int, reprimed: set[int], again: bool) -> None:
    assert reprimable(round_, reprimed) is again
