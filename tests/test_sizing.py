"""Sizing is exact and packing greedy: property tests over random inputs."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper import InputError, Limits, UsageError, iter_batches, plan
from gatekeeper.input._sizing import ENVELOPE_BYTES, Packer, body_chunks, body_size

# Any character but a surrogate (which has no UTF-8): spelled as two code point ranges rather than by codec or
# Unicode category, which make hypothesis build its character map first (3 s of CPU in every worker of a fresh
# checkout).
texts = st.text(alphabet=st.characters(max_codepoint=0xD7FF) | st.characters(min_codepoint=0xE000), max_size=300)
items = st.lists(st.tuples(st.integers(0, 40), texts, st.booleans()), min_size=0, max_size=60)


def build(spec: list[tuple[int, str, bool]]) -> list[bytes]:
    out = []
    for i, (dup_of, text, bad) in enumerate(spec):
        cid = f"id{dup_of}" if dup_of < 5 else f"u{i}"
        if bad:
            out.append(b'{"custom_id": "' + cid.encode() + b'", "params": [')
        else:
            out.append(orjson.dumps({"custom_id": cid, "params": {"model": "m", "max_tokens": 1, "messages": [text]}}))
    return out


@settings(max_examples=150, deadline=None)
@given(items, st.integers(1, 7), st.integers(120, 3000))
def test_every_valid_request_in_exactly_one_batch_in_order(spec: list[tuple[int, str, bool]], max_requests: int, max_bytes: int) -> None:
    """Valid requests land in exactly one batch, in input order; no batch breaks a limit; sizes are exact."""
    lines = build(spec)
    limits = Limits(max_requests=max_requests, max_bytes=max_bytes)
    if not spec:  # nothing at all: one rule for plan and submit
        with pytest.raises(InputError, match="holds no requests"):
            plan(lines, limits=limits)
        return
    report = plan(lines, limits=limits)
    batches = list(iter_batches(lines, limits=limits))
    sent = [r.line for b in batches for r in b.requests]
    rejected = {e.line for e in report.errors}
    assert sent == sorted(sent)
    assert set(sent) | rejected == set(range(1, len(lines) + 1))
    assert not set(sent) & rejected
    assert len(batches) == len(report.batches)
    for b, p in zip(batches, report.batches):
        body = b"".join(b.body())
        assert len(body) == p.bytes == b.body_size <= max_bytes
        assert len(b.requests) == p.requests <= max_requests
        assert orjson.loads(body)["requests"] == [orjson.loads(r.body) for r in b.requests]
        assert (p.first_line, p.last_line) == (b.requests[0].line, b.requests[-1].line)
    # Greedy: a batch closed only because the next request would break a limit.
    for b, nxt in zip(batches, batches[1:]):
        first_next = len(nxt.requests[0].body)
        assert len(b.requests) == max_requests or b.body_size + 1 + first_next > max_bytes


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=30))
def test_body_size_matches_body_chunks(parts: list[bytes]) -> None:
    """body_size counts exactly what body_chunks builds."""
    assert len(b"".join(body_chunks(parts))) == body_size(len(parts), sum(map(len, parts)))


def test_packer_closes_on_either_limit() -> None:
    """The reference packer opens a batch on the count limit and on the byte limit."""
    p = Packer(Limits(max_requests=2, max_bytes=ENVELOPE_BYTES + 10))
    assert [p.add(n) for n in (3, 3, 3, 8, 1)] == [True, False, True, True, False]
    assert p.batches == 3


def test_limits_refuse_values_over_the_api() -> None:
    import pytest

    with pytest.raises(UsageError, match="max_requests"):
        Limits(max_requests=100_001)
    with pytest.raises(UsageError, match="max_bytes"):
        Limits(max_bytes=256_000_001)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 60), max_size=80),
    st.lists(st.integers(0, 30), max_size=10),
    st.integers(1, 9),
    st.integers(ENVELOPE_BYTES + 60, 400),
)
def test_add_many_packs_exactly_like_add(lengths: list[int], cuts: list[int], max_requests: int, max_bytes: int) -> None:
    """The run-at-a-time packer (the parallel plan's) opens and closes the same batches as one `add` an item."""
    limits = Limits(max_requests=max_requests, max_bytes=max_bytes)
    one, many = Packer(limits), Packer(limits)
    expected = []  # (global index of a batch's first item, count and bytes of the batch it closed)
    for k, n in enumerate(lengths):
        before = (one.count, one.size)
        if one.add(n):
            expected.append((k, *(before if k else (0, 0))))
    got = []
    bounds = sorted({min(c, len(lengths)) for c in cuts} | {0, len(lengths)})
    for a, b in zip(bounds, bounds[1:]):  # the same items, in runs of random lengths
        run = lengths[a:b]
        got += [(a + k, count, size) for k, count, size in many.add_many(run, sum(run) if a % 2 else None)]
    assert got == expected
    assert (many.count, many.size, many.batches) == (one.count, one.size, one.batches)


def test_add_many_refuses_an_item_no_batch_holds() -> None:
    import pytest

    with pytest.raises(ValueError, match="fits in no batch"):
        Packer(Limits(max_bytes=ENVELOPE_BYTES + 5)).add_many([3, 6])


def test_limits_are_values_and_another_api_versions_are_the_same_sizes() -> None:
    """`Limits` (a frozen msgspec Struct) compares, hashes and prints by its fields, and `under` keeps its sizes for
    another API version."""
    import msgspec

    a, b = Limits(max_requests=5, max_bytes=10_000), Limits(5, 10_000)
    assert isinstance(a, msgspec.Struct) and a == b and hash(a) == hash(b) and a != Limits(6, 10_000) and a != (5, 10_000, "2023-06-01")
    assert repr(a) == "Limits(max_requests=5, max_bytes=10000, api_version='2023-06-01')"
    strict = a.under("2026-10-21")
    assert (strict.max_requests, strict.max_bytes, strict.api_version) == (5, 10_000, "2026-10-21")
    with pytest.raises(UsageError, match="API version"):
        a.under("2025-01-01")
