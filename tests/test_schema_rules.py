"""The schema against the rules it replaced: on random lines, the reader (msgspec types checked while decoding)
accepts what the hand-written checks accepted, and refuses what they refused in the same words.

`old_reason` is the reader's checks as they were before the schema (commit 8ca5fa8's `check_request` and
`version_reason`), kept here as the oracle. Those checks did not look inside a message; the lines drawn here hold
well-formed messages, and vary everything the old checks judged: the custom_id, the keys beside it, params' type,
model, max_tokens, messages, stream, speed, the parameters API version 2026-10-21 refuses, a document block in an
assistant turn and citations on a user's text block, in any key order.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatekeeper import Limits, plan

STRICT = "2026-10-21"
_ID = re.compile("[A-Za-z0-9_-]{1,64}").fullmatch


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def old_reason(obj: Any, strict: bool) -> str | None:
    """Why the pre-schema reader refused a parsed line, or None (its `check_request`, then `version_reason`)."""
    if type(obj) is not dict:
        return "not a JSON object"
    cid = obj.get("custom_id")
    if cid is None and "custom_id" not in obj:
        return "missing key 'custom_id'"
    if type(cid) is not str:
        return f"custom_id must be a string, got {_short(cid)}"
    if not _ID(cid):
        return f"custom_id {_short(cid)} does not match [A-Za-z0-9_-]{{1,64}}"
    if len(obj) != 2 or "params" not in obj:
        extra = sorted(k for k in obj if k not in ("custom_id", "params"))
        if extra:
            return f"unexpected key {_short(extra[0])}: a request has exactly 'custom_id' and 'params'"
        return "missing key 'params'"
    params = obj["params"]
    if type(params) is not dict:
        return "params must be an object"
    model = params.get("model")
    if type(model) is not str or not model:
        return "params.model must be a non-empty string"
    max_tokens = params.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        return f"params.max_tokens must be an integer >= 1, got {_short(max_tokens)}"
    messages = params.get("messages")
    if type(messages) is not list or not messages:
        return "params.messages must be a non-empty list"
    if params.get("stream", False) is not False:
        return "params.stream must be absent or false: batch requests do not stream"
    if params.get("speed", "standard") != "standard":
        return f"params.speed {_short(params['speed'])} is not allowed in a batch (fast mode is not offered there)"
    return _old_version_reason(params) if strict else None


def _old_version_reason(params: dict[str, Any]) -> str | None:
    for key in ("temperature", "top_p", "top_k"):
        if key in params:
            return f"params.{key} is refused by API version {STRICT} (even at its default): remove it, or use 2023-06-01"
    for i, message in enumerate(params.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if message.get("role") == "assistant" and block.get("type") == "document":
                return f"params.messages[{i}]: a document block in an assistant message is refused by API version {STRICT}"
            if message.get("role") == "user" and block.get("type") == "text" and block.get("citations"):
                return f"params.messages[{i}]: citations on a user text block are refused by API version {STRICT}"
    return None


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=5), st.builds(list), st.builds(dict))  # (new each draw: a change may fill one)
_IDS = st.one_of(st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True), st.text(max_size=70), _ANY)
_TEXT = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)},
                              optional={"citations": st.sampled_from([[], [{"type": "char_location"}]])})
_DOC = st.just({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}})
_CONTENT = st.one_of(st.text(max_size=8), st.lists(st.one_of(_TEXT, _DOC), min_size=1, max_size=3))
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": _CONTENT})
_VALID = st.fixed_dictionaries(
    {"model": st.sampled_from(["claude-haiku-4-5", "claude-sonnet-4-5"]), "max_tokens": st.integers(1, 64_000),
     "messages": st.lists(_MESSAGE, min_size=1, max_size=3)},
    optional={"system": st.text(max_size=8), "stream": st.just(False), "speed": st.just("standard"),
              "metadata": st.just({"user_id": "u"})})
# One change to a line: (where, key, values); "top" is the line itself, "params" its params; None may drop the key.
_CHANGES = [("top", "custom_id", _IDS), ("top", "custom_id", st.none()), ("top", "params", _ANY),
            ("top", "metadata", st.just(1)), ("top", "id", st.just("x")), ("top", "params", st.just(None)),
            *[("params", key, st.one_of(_ANY, st.just(None))) for key in ("model", "max_tokens", "messages")],
            *[("params", key, _ANY) for key in ("stream", "speed", "temperature", "top_p", "top_k")]]


@st.composite
def lines(draw: st.DrawFn, changes: int) -> tuple[Any, int]:
    """A valid request line (whose messages a strict version may refuse) with up to `changes` of its parts
    replaced, dropped or added, its keys in any order; and how many changes were made."""
    params = draw(_VALID)
    line: dict[str, Any] = {"custom_id": draw(st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)), "params": params}
    made = draw(st.integers(0, changes))
    for where, key, values in draw(st.lists(st.sampled_from(_CHANGES), min_size=made, max_size=made)):
        target = line if where == "top" else line.get("params")
        if not isinstance(target, dict):
            continue
        value = draw(values)
        if value is None and draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = value
    if isinstance(line.get("params"), dict):
        line["params"] = {k: line["params"][k] for k in draw(st.permutations(list(line["params"])))}
    return {k: line[k] for k in draw(st.permutations(list(line)))}, made


def _judged(obj: Any, strict: bool) -> str | None:
    report = plan([orjson.dumps(obj)], limits=Limits(api_version=STRICT if strict else "2023-06-01"))
    assert report.lines == 1
    return report.errors[0].reason if report.errors else None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=lines(changes=4), strict=st.booleans())
def test_the_schema_accepts_what_the_old_rules_accepted(drawn: tuple[Any, int], strict: bool) -> None:
    """Any number of changes: the reader accepts a line exactly when the old checks did."""
    obj, _ = drawn
    got, want = _judged(obj, strict), old_reason(obj, strict)
    assert (got is None) == (want is None), (orjson.dumps(obj), got, want)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=lines(changes=1), strict=st.booleans())
def test_a_line_that_breaks_one_rule_is_refused_in_the_old_words(drawn: tuple[Any, int], strict: bool) -> None:
    """One change (or none, to a line whose messages the strict version refuses): the same words as before."""
    obj, made = drawn
    params = obj.get("params") if isinstance(obj, dict) else None
    if made and strict and isinstance(params, dict) and type(params.get("messages")) is list and _old_version_reason(params):
        return  # (two rules broken: the schema names the first in the line's order, the old checks in theirs)
    assert _judged(obj, strict) == old_reason(obj, strict), orjson.dumps(obj)
