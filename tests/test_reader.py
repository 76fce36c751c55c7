"""The reader: every rejection kind names its line; accepted lines are sent as given."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import orjson
import pytest

from gatekeeper import Limits, plan
from gatekeeper.input._idindex import FP_SHIFT, IdIndex
from gatekeeper.input._reader import Columns, LineReader, Rejection, estimate_lines, scan, validate
from tests.helpers import req, write_jsonl

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# line -> (custom_id, a fragment of the reason), for examples/defective.jsonl
DEFECTIVE = {
    2: (None, "not valid JSON"),
    3: (None, "not valid UTF-8"),
    4: (None, "not a JSON object"),
    5: (None, "missing key 'custom_id'"),
    6: ("no-params", "missing key 'params'"),
    7: ("extra-key", "unexpected key 'metadata'"),
    8: (None, "custom_id must be a string"),
    9: (None, "does not match"),
    10: (None, "does not match"),
    11: ("good-1", "duplicate custom_id 'good-1' (first on line 1)"),
    12: ("params-list", "params must be an object"),
    13: ("no-model", "params.model"),
    14: ("zero-tokens", "params.max_tokens"),
    15: ("no-messages", "params.messages"),
    16: ("streaming", "params.stream"),
    17: ("fast-mode", "params.speed"),
}


def test_defective_example_names_every_line() -> None:
    """Each rejection kind in the bundled defective file is reported on its own line with its reason."""
    report = plan(EXAMPLES / "defective.jsonl")
    got = {e.line: (e.custom_id, e.reason) for e in report.errors}
    assert set(got) == set(DEFECTIVE)
    for line, (cid, fragment) in DEFECTIVE.items():
        assert got[line][0] == cid, line
        assert fragment in got[line][1], (line, got[line][1])
        assert "\n" not in got[line][1]
    assert report.requests == 2


def test_bundled_example_is_all_valid() -> None:
    """The example a new user runs first has no rejected line."""
    report = plan(EXAMPLES / "requests.jsonl")
    assert report.ok and report.requests == 300 and len(report.batches) == 1


@pytest.mark.parametrize(
    ("cid", "ok"),
    [("a", True), ("A-z_09", True), ("x" * 64, True), ("x" * 65, False), ("", False), ("a\n", False),
     ("a b", False), ("é", False), ("a.b", False)],
)
def test_custom_id_pattern(tmp_path: Path, cid: str, ok: bool) -> None:
    """custom_id must match [A-Za-z0-9_-]{1,64} in full; a trailing newline does not pass."""
    report = plan([req(cid)])
    assert report.ok is ok
    if not ok:
        assert report.errors[0].line == 1


def test_bom_crlf_and_blank_lines(tmp_path: Path) -> None:
    """A UTF-8 BOM, CRLF endings and blank lines are accepted; line numbers count every line."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + orjson.dumps(req("a")) + b"\r\n\r\n   \n" + orjson.dumps(req("a")) + b"\r\n" + orjson.dumps(req("b"))
    )
    report = plan(path)
    assert report.lines == 5
    assert report.requests == 2
    assert [(e.line, e.custom_id) for e in report.errors] == [(4, "a")]
    assert "first on line 1" in report.errors[0].reason


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_the_content_hash_and_offsets_count_a_bom(tmp_path: Path, bom: bytes) -> None:
    """A submit's content hash covers every byte, the BOM included; the first request starts after it, and an
    iterable's first item loses its BOM the same way."""
    import hashlib

    data = bom + orjson.dumps(req("a")) + b"\n" + orjson.dumps(req("b")) + b"\n"
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    report = plan(path, hash_content=True)
    assert report.content_hash == hashlib.sha256(data).hexdigest()
    assert report.batches[0].start_offset == len(bom) and report.batches[0].end_offset == len(data) - 1
    assert plan([data.split(b"\n")[0], b""]).requests == 1


def test_request_bytes_are_sent_as_given(tmp_path: Path) -> None:
    """The body carries each line's own bytes (spacing, key order, escapes), not a re-serialization."""
    raw = b'{ "params" : {"max_tokens": 5, "model":"m", "messages":[{"role":"user","content":"caf\\u00e9"}]},  "custom_id":"k1" }'
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"  " + raw + b"  \r\n")
    rows = list(scan(path, lambda r: None, item_limit=10**6))
    assert rows[0][5].strip() == raw and rows[0][4] == len(raw)
    assert rows[0][1] == 2  # offset of the request's first byte


def test_stream_false_is_accepted() -> None:
    """stream: false is allowed (only true is refused)."""
    assert plan([req("a", stream=False)]).ok


def test_duplicate_across_batches_names_first_line() -> None:
    """Uniqueness holds across the whole input, not per batch."""
    items = [req(f"id{i}") for i in range(10)] + [req("id3")]
    report = plan(items, limits=Limits(max_requests=2))
    assert [(e.line, e.custom_id) for e in report.errors] == [(11, "id3")]
    assert "first on line 4" in report.errors[0].reason


def test_request_too_large_for_any_batch_is_a_rejection() -> None:
    """A single request larger than a whole body is a rejected line, not a crash."""
    report = plan([req("small"), req("big", text="x" * 5000), req("small2")], limits=Limits(max_bytes=2000))
    assert [(e.line, e.custom_id) for e in report.errors] == [(2, "big")]
    assert "no batch can hold it" in report.errors[0].reason
    assert report.requests == 2


def test_iterable_sources_dicts_bytes_and_str() -> None:
    """An ETL job can plan dicts, encoded lines or str lines without writing a file."""
    report = plan([req("a"), orjson.dumps(req("b")), orjson.dumps(req("c")).decode(), b"{bad"])
    assert report.requests == 3
    assert [(e.line, e.reason.split(":")[0]) for e in report.errors] == [(4, "not valid JSON")]


def test_stdin_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'-' reads standard input."""
    import io
    import sys

    data = orjson.dumps(req("a")) + b"\n" + orjson.dumps(req("a")) + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    report = plan("-")
    assert report.requests == 1 and report.errors[0].line == 2


def test_id_index_finds_duplicates_through_collisions() -> None:
    """The compact index finds every duplicate, also when home slots collide and the table grows."""
    index = IdIndex()
    for i in range(5000):
        assert index.add(f"c{i}", i + 1) == 0
    for i in range(0, 5000, 7):
        assert index.add(f"c{i}", 10_000 + i) == i + 1
    assert len(index) == 5000


def test_id_index_confirms_equal_fingerprints_exactly() -> None:
    """An equal fingerprint counts as a duplicate only when the earlier line really holds the same id."""
    held = {100: "x", 200: "y", 300: "x"}  # offset -> the custom_id on that line
    index = IdIndex(confirm=held.get)
    fp = hash("x") >> FP_SHIFT
    assert index.insert(index.record(1, 100, fp), "x") == 0
    # Same hash, different id (a forged collision): the earlier line is read back and holds "x", not "y".
    assert index.insert(index.record(2, 200, fp), "y") == 0
    # No custom_id given: the index reads the candidate's own back from its offset.
    assert index.insert(index.record(3, 300, fp)) == 1
    assert len(index) == 2


def test_id_index_without_a_file_compares_full_hashes() -> None:
    """With no file to read back from, the full 64-bit hash is the proof: equal top bits alone are not a duplicate."""
    index = IdIndex()
    h = hash("x")
    low = (1 << FP_SHIFT) - 1
    forged = (h & ~low) | ((h + 1) & low)  # same fingerprint (top 31 bits), other low bits
    assert forged != h and forged >> FP_SHIFT == h >> FP_SHIFT
    assert index.insert(index.record(1, h, h >> FP_SHIFT)) == 0
    assert index.insert(index.record(2, forged, forged >> FP_SHIFT)) == 0
    assert index.insert(index.record(3, h, h >> FP_SHIFT)) == 1


def test_id_index_keeps_every_id_through_growth() -> None:
    """Growing rehashes from the fingerprints alone; every id is still found afterwards, with its first line."""
    index = IdIndex()
    for i in range(10_000):
        assert index.add(f"k{i}", i + 1) == 0
    assert index.mask + 1 > 10_000  # it grew
    assert [index.add(f"k{i}", 20_000 + i) for i in (0, 4321, 9999)] == [1, 4322, 10_000]


def test_large_file_duplicate_detected(tmp_path: Path) -> None:
    """Over a few thousand lines (past the index's up-front sizing), late duplicates are still found."""
    items = [req(f"r{i}") for i in range(3000)] + [req("r5"), req("r2999")]
    path = write_jsonl(tmp_path / "in.jsonl", items)
    report = plan(path)
    assert [(e.line, e.custom_id) for e in report.errors] == [(3001, "r5"), (3002, "r2999")]


def test_rejection_to_json() -> None:
    assert Rejection(3, None, "x").to_json() == {"line": 3, "custom_id": None, "reason": "x"}


def test_inlined_index_grows_without_a_size_hint() -> None:
    """An iterable source gives no size hint: the reader's inlined index grows many times and still finds every duplicate."""
    items = [req(f"g{i}") for i in range(20_000)] + [req("g0"), req("g12345"), req("g19999")]
    report = plan(items)
    assert report.requests == 20_000
    assert [(e.line, e.custom_id) for e in report.errors] == [(20_001, "g0"), (20_002, "g12345"), (20_003, "g19999")]
    assert "first on line 12346" in report.errors[1].reason


def test_id_index_add_many_reports_each_duplicate_and_counts_the_rest() -> None:
    """The batched probe (the parallel reader's) agrees with one `add` an id: duplicates within a run and across
    runs, an equal fingerprint that is not a duplicate, and the count of ids held."""
    from array import array

    ids = [f"m{i}" for i in range(3000)] + ["m5", "m2999", "m3000", "m3000"]
    held = dict(enumerate(ids))  # offset k holds ids[k]
    forged = hash("m7") & ~0xFFFFFFFF | 1  # m7's fingerprint on another id's line
    held[len(ids)] = "not-m7"
    fps = array("i", [hash(cid) >> FP_SHIFT for cid in ids] + [forged >> FP_SHIFT])
    offsets = array("q", range(len(fps)))
    one = IdIndex(confirm=held.get)
    expected = [(k, first) for k, cid in enumerate(ids) if (first := one.add(cid, k + 1, k))]
    many = IdIndex(confirm=held.get)
    got = []
    for start in range(0, len(fps), 1000):  # runs counted from their base line, as pieces are
        part = slice(start, start + 1000)
        lines = array("I", range(1, len(fps[part]) + 1))
        got += [(start + k, first) for k, first in many.add_many(lines, offsets[part], fps[part], base=start)]
    assert got == expected == [(3000, 6), (3001, 3000), (3003, 3003)]
    assert len(many) == len(one) + 1 == 3002  # every unique id and the forged one


def test_a_file_sizes_its_duplicate_index_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the first line is read, the index is sized from lines sampled across the file, not grown by
    rehashing as it fills."""
    grown = []
    rehash = IdIndex._rehash
    monkeypatch.setattr(IdIndex, "_rehash", lambda self, cap: (grown.append(cap), rehash(self, cap))[1])
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"s{i}") for i in range(20_000)])
    assert plan(path).requests == 20_000
    assert grown == []


def _lines_of(path: Path, lengths: list[int]) -> Path:
    """A file of lines of these lengths, newlines included ('x' padding)."""
    path.write_bytes(b"".join(b"x" * (n - 1) + b"\n" for n in lengths))
    return path


@pytest.mark.parametrize(
    ("name", "lengths"),
    [
        ("uniform", [1400] * 3000),
        ("sorted by length", [100] * 40_000 + [20_000] * 600),  # the first 4 MB alone said 40 times too many
        ("mixed", [80, 3000, 700, 15_000, 250] * 2000),
        ("longer than a window", [200] * 5000 + [100_000] * 30),
        ("no newline at the end", [1400] * 2999 + [1399]),
    ],
)
def test_a_file_s_lines_are_estimated_from_samples(tmp_path: Path, name: str, lengths: list[int]) -> None:
    """Within a quarter of the true count whatever the lines' lengths and order (lines hit in proportion to their
    length, so the mean of 1/length), while reading 256 samples, not the file."""
    path = _lines_of(tmp_path / "in.jsonl", lengths)
    if name == "no newline at the end":
        path.write_bytes(path.read_bytes()[:-1])
    fd = os.open(path, os.O_RDONLY)
    try:
        got = estimate_lines(fd, os.path.getsize(path))
    finally:
        os.close(fd)
    assert abs(got - len(lengths)) <= len(lengths) / 4, (name, got, len(lengths))


def test_a_length_sorted_file_does_not_oversize_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short requests first, long ones after: both readers size the duplicate index for about the requests there
    are (sized from the first lines, it was 30 times too big)."""
    import gatekeeper.input._parallel

    monkeypatch.setattr(gatekeeper.input._parallel, "PIECE_BYTES", 1 << 18)
    items = [req(f"s{i}") for i in range(20_000)] + [req(f"l{i}", text="x" * 60_000) for i in range(100)]
    path = write_jsonl(tmp_path / "in.jsonl", items)
    reserved: list[int] = []
    reserve = IdIndex.reserve
    monkeypatch.setattr(IdIndex, "reserve", lambda self, n: (reserved.append(n), reserve(self, n))[1])
    sizes: list[int] = []
    init = IdIndex.__init__
    monkeypatch.setattr(IdIndex, "__init__", lambda self, expected=0, confirm=None: (sizes.append(expected),
                                                                                    init(self, expected, confirm))[1])
    one, two = plan(path), plan(path, workers=2)
    assert one.requests == two.requests == 20_100
    assert 15_000 < sizes[0] < 30_000 and 15_000 < max(reserved) < 30_000, (sizes, reserved)


def test_the_columns_hold_what_the_generator_yields() -> None:
    """The parallel reader's form (`LineReader.read` into `Columns`) holds the same requests as the yielded one
    (`validate`): lines, offsets, sizes, custom_ids and models; with the same rejections, whitespace and blank lines
    included."""
    lines = [orjson.dumps(req("a", model="m1")) + b"\n", b"\n", b"  " + orjson.dumps(req("b", model="m2")) + b" \r\n",
             b'{"custom_id": "bad id", "params": {}}\n', orjson.dumps(req("c", model="m1", text="longer text")) + b"\n",
             orjson.dumps(req("d", model="m2"))]
    yielded_rejections: list[Rejection] = []
    rows = list(validate(iter(lines), yielded_rejections.append, item_limit=1 << 20))
    cols, rejections = Columns(), []
    LineReader(rejections.append, item_limit=1 << 20).read(b"".join(lines), cols)
    assert rejections == yielded_rejections and [r.line for r in rejections] == [4]
    assert cols.lines == [row[0] for row in rows] == [1, 3, 5, 6]
    assert cols.offsets == [row[1] for row in rows] == [0, len(b"".join(lines[:2])) + 2, len(b"".join(lines[:4])),
                                                         len(b"".join(lines[:5]))]
    assert cols.sizes == [row[4] for row in rows] == [len(line.strip()) for k, line in enumerate(lines) if k in (0, 2, 4, 5)]
    assert cols.cids == [row[2] for row in rows] == ["a", "b", "c", "d"]
    assert cols.models == [row[3] for row in rows] == ["m1", "m2", "m1", "m2"]


@pytest.mark.parametrize("cuts", [[], [1], [2, 3], [1, 2, 3, 4, 5]])
def test_a_reader_read_in_parts_numbers_lines_as_one_read(cuts: list[int]) -> None:
    """The reader judges a chunk of lines at a time: given its input in parts it numbers every line and offset as
    it does given the whole, and keeps one marker memo across them."""
    lines = [orjson.dumps(req(f"r{i}", text=f"prompt {i}" * i)) + b"\n" for i in range(5)] + [b"\n", b"{bad\n"]
    whole, whole_rejections = Columns(), []
    LineReader(whole_rejections.append, item_limit=1 << 20, offset=7).read(b"".join(lines), whole)
    parts, part_rejections = Columns(), []
    reader = LineReader(part_rejections.append, item_limit=1 << 20, offset=7)
    for a, b in zip([0, *cuts], [*cuts, len(lines)]):
        reader.read(b"".join(lines[a:b]), parts)
    assert parts == whole and whole.lines == [1, 2, 3, 4, 5] and whole.offsets[0] == 7
    assert part_rejections == whole_rejections and [r.line for r in whole_rejections] == [7]
    assert reader.line == 7 and reader.offset == 7 + sum(map(len, lines))


def _varied_lines() -> list[bytes]:
    """Valid requests of every kind the reader tells apart: spacing, CRLF, leading blanks, a line without its
    newline, non-ASCII, markers (a memo's hit and a miss), long system prompts and tool lists, blocks of every
    common type, two models."""
    doc = {"type": "text", "text": "Shared policy. " * 200, "cache_control": {"type": "ephemeral"}}
    tools = [{"name": f"t{i}", "description": "d" * 900, "input_schema": {"type": "object"}} for i in range(3)]
    media = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
             {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
             {"type": "text", "text": "compare"}]
    turns = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "t0", "input": {"a": 1}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
    objs = [req("plain"), req("sys", system=[doc]), req("sys-again", system=[doc]), req("sys-m2", model="m2", system=[doc]),
            req("long-system", system="S" * 3000), req("tools", tools=tools), req("top", cache_control={"type": "ephemeral"}),
            req("media", text=None) | {"params": {**req("x")["params"], "messages": [{"role": "user", "content": media}]}},
            {"custom_id": "agent", "params": {**req("x")["params"], "messages": turns, "tools": tools[:1]}},
            req("uni", text="Größe 請求書")]
    lines = [orjson.dumps(o) for o in objs]
    lines[1] = json.dumps(objs[1]).encode()  # spaced
    return [lines[0] + b"\r\n", b"  " + lines[1] + b"\n", *[x + b"\n" for x in lines[2:-1]], lines[-1]]


def test_a_chunk_read_at_once_gets_the_verdicts_of_one_read_a_line_at_a_time() -> None:
    """A chunk of valid lines is judged by passes over whole columns; one that also holds a blank line is read a
    line at a time. Both give the same requests (lines, offsets, sizes, ids, models), the same caching facts and the
    same refusals (a marker the API refuses, a model the Models API refuses)."""
    from gatekeeper.input._caching import CacheScan

    lines = _varied_lines()
    bad_marker = orjson.dumps(req("bad-ttl", system=[{"type": "text", "text": "x", "cache_control": {"ttl": "2h"}}])) + b"\n"
    chunk = b"".join(lines[:-1]) + bad_marker + lines[-1]
    got = []
    for tail in (b"", b"\n\n"):  # (a blank line: the chunk is read a line at a time)
        cols, refused, cache = Columns(), [], CacheScan()
        reader = LineReader(refused.append, item_limit=1 << 20, cache=cache,
                            models={"m2": ("model 'm2' is retired", None)}, peaks={})
        reader.read(chunk.rstrip(b"\n") + b"\n" + tail if tail else chunk, cols)
        got.append((cols, refused, cache.to_marshal(), cache.cids, cache.unmarked, reader.peaks))
    assert got[0] == got[1]
    cols, refused = got[0][0], got[0][1]
    assert [r.custom_id for r in refused] == ["sys-m2", "bad-ttl"] and "2h" in refused[1].reason
    assert cols.cids == ["plain", "sys", "sys-again", "long-system", "tools", "top", "media", "agent", "uni"]
    assert got[0][3] and got[0][4]  # (marked prefixes noted; long unmarked parts counted)


def test_id_index_fills_its_reserved_arrays_in_place() -> None:
    """Reserved room is allocated once: adding that many ids moves no array (arrays reallocated in turn as they
    grew left the heap fragmented, and the parallel reader's peak memory grew half as much again)."""
    from array import array

    def addresses() -> list[int]:
        return [a.buffer_info()[0] for a in (index.slots, index.fps, index.lines, index.proofs)]

    index = IdIndex(confirm=lambda offset: f"p{offset}")  # offset k holds custom_id pk
    index.reserve(20_000)
    before = addresses()
    for start in range(0, 20_000, 5_000):
        fps = array("i", [hash(f"p{i}") >> FP_SHIFT for i in range(start, start + 5_000)])
        assert index.add_many(array("I", range(1, 5_001)), array("q", range(start, start + 5_000)), fps, base=start) == []
    assert addresses() == before and index.count == index.room == 20_000
    assert index.add("p20000", 20_001, 20_000) == 0  # past the reserved room: the arrays grow, by a quarter at least
    assert index.count == 20_001 and index.room >= 25_000
    assert index.add("p12345", 30_000, 12_345) == 12_346  # entries recorded in place are found, with their lines


_SYS = {"type": "text", "text": "A shared document. " * 20}
_MARK = {"type": "ephemeral"}


@pytest.mark.parametrize(("params", "reason", "lives"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, None, []),  # nothing marked
    ({"system": [{**_SYS, "cache_control": _MARK}], "messages": [{"role": "user", "content": "q"}]}, None, ["5m"]),
    ({"system": [{**_SYS, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
      "messages": [{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": _MARK}]}]}, None, ["1h", "5m"]),
    ({"cache_control": _MARK, "messages": [{"role": "user", "content": "q"}]}, None, ["5m"]),  # top-level: the whole prompt
    ({"tools": [{"name": "t", "cache_control": _MARK}], "system": [{**_SYS, "cache_control": _MARK}],
      "messages": [{"role": "user", "content": "q"}]}, None, ["5m", "5m"]),
    ({"system": [{**_SYS, "cache_control": {"type": "ephemeral", "ttl": "2h"}}], "messages": []}, "ttl '2h'", None),
    ({"cache_control": {"type": "ephemeral", "ttl": "9m"}, "messages": [{"role": "user", "content": "q"}]}, "ttl '9m'", None),
    ({"system": [{**_SYS, "cache_control": _MARK}],
      "messages": [{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]},
     "1h cache_control marker after a 5m one", None),
    ({"system": [{"type": "text", "text": str(i), "cache_control": _MARK} for i in range(5)], "messages": []},
     "5 cache_control markers", None),
])
def test_one_walk_gives_the_marker_check_and_the_prefixes(params: dict, reason: str | None, lives: list | None) -> None:
    """`marker_walk` (plan's one walk a marked line): the reason the API would refuse its markers, or its prefixes,
    shortest first; a line's prefix digest equals another's exactly when their prompts agree up to the marker."""
    from gatekeeper.input._markers import marker_points, marker_reason, marker_walk

    got_reason, points = marker_walk(params, "m")
    assert (got_reason is None) == (reason is None) and (reason is None or reason in got_reason)
    assert marker_reason(params) == got_reason
    if reason is None:
        assert [life for _, _, life in points] == lives and points == marker_points(params, "m")
        assert [size for size, _, _ in points] == sorted(size for size, _, _ in points)
        other = {**params, "messages": [{"role": "user", "content": "another question"}]}
        if params.get("system") and "cache_control" not in params and lives and params["system"][0].get("cache_control"):
            assert marker_walk(other, "m")[1][0][1] == points[0][1]  # the same document: the same prefix
            assert marker_walk(other, "m2")[1][0][1] != points[0][1]  # another model: another prefix


_DOC_B = {"type": "text", "text": "Another document. " * 20}


def _walks() -> list[tuple[dict, str]]:
    """Lines as a reader meets them: runs sharing a document, one whose first block is shared but not its second,
    a refused marker repeated, a top-level marker, another model, and back."""
    marked = {**_SYS, "cache_control": _MARK}

    def line(system: list, content: object = "q", **extra: object) -> dict:
        return {"system": system, "messages": [{"role": "user", "content": content}], **extra}

    return [
        (line([marked]), "m"), (line([marked], "another"), "m"), (line([marked]), "m2"),
        (line([_SYS, {**_DOC_B, "cache_control": _MARK}]), "m"), (line([{**_SYS}, {**_DOC_B, "cache_control": _MARK}]), "m"),
        (line([_SYS, {**_SYS, "cache_control": _MARK}]), "m"),  # the first part as before, the second not
        (line([{**_SYS, "cache_control": {"type": "ephemeral", "ttl": "2h"}}]), "m"),
        (line([{**_SYS, "cache_control": {"type": "ephemeral", "ttl": "2h"}}]), "m"),
        (line([_SYS], cache_control=_MARK), "m"), (line([_SYS]), "m"), (line([_SYS], cache_control={"ttl": "1h"}), "m"),
        (line([marked], [{"type": "text", "text": "q", "cache_control": _MARK}]), "m"),
        (line([marked], [{"type": "text", "text": "r", "cache_control": _MARK}]), "m"),
        (line([marked]), "m"),
    ]


@pytest.mark.parametrize("walker", ["system_walk", "chunk_walks"])
@pytest.mark.parametrize("order", ["given", "reversed", "each twice"])
def test_a_walk_that_remembers_the_last_line_answers_as_one_that_does_not(order: str, walker: str) -> None:
    """The reader's `Memo` (the last line's parts, head, sizes, digests and answer) changes no answer: each line in
    sequence, walked as the reader walks it (`system_walk` where only the system has blocks; `chunk_walks` of the line
    decoded, which passes over a line with no marker), gets the same with the memo as without, rejections included."""
    from gatekeeper.input._markers import Memo, chunk_walks, marker_walk, system_walk
    from gatekeeper.input._schema import Request

    lines = _walks()
    lines = {"given": lines, "reversed": lines[::-1], "each twice": [x for x in lines for _ in (0, 1)]}[order]
    memo, memos, rejected = Memo(), {}, 0
    for params, model in lines:
        fresh = orjson.loads(orjson.dumps(params))  # (new objects, as the reader parses each line)
        if walker == "chunk_walks":
            line = {"custom_id": "x", "params": {**params, "model": model, "max_tokens": 1}}
            reasons, _, points = chunk_walks([msgspec.json.decode(orjson.dumps(line), type=Request)], memos)
            answer = (reasons.get(0), points[0] if points else ())
        elif "cache_control" not in params and isinstance(params["messages"][0]["content"], str):
            answer = system_walk(fresh["system"], model, memo)
        else:
            answer = marker_walk(fresh, model, memo)
        assert answer == marker_walk(params, model)
        rejected += answer[0] is not None
    assert rejected == 2 * (1 + (order == "each twice"))  # the 2h markers: the memo may not hide a rejection


def test_a_memo_a_model_answers_as_no_memo_when_models_interleave() -> None:
    """Files interleave models (a line each, in turn): the reader keeps one `Memo` a model, so a prefix walked for one
    model is reused for that model's next line, and each line's answer is the one without a memo."""
    from gatekeeper.input._markers import Memo, marker_walk

    lines = [(params, m) for params, _ in _walks() for m in ("claude-a", "claude-b", "claude-c")]
    memos: dict[str, Memo] = {}
    for params, model in lines:
        fresh = orjson.loads(orjson.dumps(params))
        answer = marker_walk(fresh, model, memos.get(model) or memos.setdefault(model, Memo()))
        assert answer == marker_walk(params, model)
    assert set(memos) == {"claude-a", "claude-b", "claude-c"}


def test_plan_of_interleaved_models_agrees_with_plan_of_the_same_lines_grouped(tmp_path: Path) -> None:
    """The same marked requests, three models interleaved line by line or grouped by model: the same rejections
    and the same caching figures per model."""
    from gatekeeper import plan
    from gatekeeper._prices import load_prices

    system = [{"type": "text", "text": "Policy. " * 400, "cache_control": {"type": "ephemeral"}}]
    models = ["claude-haiku-4-5-20251001", "claude-sonnet-4-5-20250929", "claude-opus-4-6"]
    rows = [{"custom_id": f"r{i}", "params": {"model": models[i % 3], "max_tokens": 16, "system": system,
                                               "messages": [{"role": "user", "content": f"q{i}"}]}} for i in range(60)]
    rows[7]["params"]["system"] = [{**system[0], "cache_control": {"type": "ephemeral", "ttl": "2h"}}]
    mixed = tmp_path / "mixed.jsonl"
    grouped = tmp_path / "grouped.jsonl"
    mixed.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    grouped.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in sorted(rows, key=lambda r: r["params"]["model"])))
    a, b = plan(str(mixed)), plan(str(grouped))
    assert sorted(e.custom_id for e in a.errors) == sorted(e.custom_id for e in b.errors) == ["r7"]
    ca, cb = a.caching(load_prices()), b.caching(load_prices())
    assert ca is not None and cb is not None
    assert ca["models"] and ca["models"] == cb["models"]
