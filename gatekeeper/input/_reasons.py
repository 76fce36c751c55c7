"""Why a line is refused, in words: the decoder's errors said as the reader has always said them.

msgspec names the first rule a line breaks, in the order its bytes come, by a path (`$.params.max_tokens`). The
paths a request's own fields take are worded here, with the value the line holds (read again, leniently: a refused
line is rare); a path deeper in the prompt keeps msgspec's words after its own name (`params.messages[0].role:
invalid enum value 'system'`). Each reason is one line, and names the custom_id when the line has a valid one.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .._wire import STRICT_VERSION
from ._schema import BLOCK_TYPES, CUSTOM_ID_PATTERN

VERSION_REFUSES = ("temperature", "top_p", "top_k")  # refused by 2026-10-21 "even if the value is the default"
_custom_id_ok = re.compile(CUSTOM_ID_PATTERN).fullmatch  # (fullmatch: a trailing "\n" must not pass)
_AT = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")
_FIELD = re.compile(r"field `(\w+)`")


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def utf8_reason(body: bytes) -> str | None:
    """Why `body` (a line, stripped: positions do not depend on the line's end) is not UTF-8, or None."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not valid UTF-8 (byte {err.start + 1})"
    return None


def json_reason(body: bytes, exc: Exception) -> str:
    """The reason for a line the decoder could not read as JSON."""
    return utf8_reason(body) or f"not valid JSON: {exc}"


def custom_id_reason(cid: object) -> str:
    if not isinstance(cid, str):
        return f"custom_id must be a string, got {short(cid)}"
    return f"custom_id {short(cid)} does not match {CUSTOM_ID_PATTERN}"


def too_large(size: int, item_limit: int) -> str:
    return f"request is {size} bytes: no batch can hold it (at most {item_limit} bytes a request)"


def duplicate(cid: str, first: int) -> str:
    return f"duplicate custom_id {cid!r} (first on line {first})"


def version_refusal(param: str) -> str:
    return f"params.{param} is refused by API version {STRICT_VERSION} (even at its default): remove it, or use 2023-06-01"


def shape_reason(raw: bytes, error: msgspec.ValidationError) -> tuple[str | None, str]:
    """(the line's custom_id, when valid; why the line's shape is refused), from the decoder's error."""
    obj = _lenient(raw)
    message, path = _split(error)
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    cid = cid if isinstance(cid, str) and _custom_id_ok(cid) else None
    if not path:
        return cid, _top_reason(message, obj)
    if path[0] == "custom_id":
        return None, custom_id_reason(_at(obj, path))
    return cid, _params_reason(message, path, obj)


def refused_by_version(error: msgspec.ValidationError) -> str:
    """Why API version 2026-10-21 refuses a line the base rules take (the strict decoder's error)."""
    message, path = _split(error)
    if len(path) == 2 and path[1] in VERSION_REFUSES:
        return version_refusal(str(path[1]))
    if len(path) > 2 and path[1] == "messages":
        if path[-1] == "type":  # (an assistant turn's block type the version refuses: a document)
            return f"params.messages[{path[2]}]: a document block in an assistant message is refused by API version {STRICT_VERSION}"
        if path[-1] == "citations":
            return f"params.messages[{path[2]}]: citations on a user text block are refused by API version {STRICT_VERSION}"
    return f"{_name(path)}: {_lower(message)} (API version {STRICT_VERSION})"


def _top_reason(message: str, obj: Any) -> str:
    if not isinstance(obj, dict):
        return "not a JSON object"
    field = _FIELD.search(message)
    if message.startswith("Object missing required field") and field:
        return f"missing key {field.group(1)!r}"
    if message.startswith("Object contains unknown field") and field:
        return f"unexpected key {field.group(1)!r}: a request has exactly 'custom_id' and 'params'"
    return _lower(message)


def _params_reason(message: str, path: list[str | int], obj: Any) -> str:
    """The reasons of `params`' own fields, in the words the reader has always used; deeper, msgspec's."""
    field = _FIELD.search(message)
    if len(path) == 1 and message.startswith("Object missing required field") and field:
        path = [*path, field.group(1)]  # (a missing field is named as the field, its value None)
    elif len(path) == 1:
        return "params must be an object"
    key = path[1] if len(path) == 2 else None
    if key == "model":
        return "params.model must be a non-empty string"
    if key == "max_tokens":
        return f"params.max_tokens must be an integer >= 1, got {short(_at(obj, path))}"
    if key == "messages":
        return "params.messages must be a non-empty list"
    if key == "stream":
        return "params.stream must be absent or false: batch requests do not stream"
    if key == "speed":
        return f"params.speed {short(_at(obj, path))} is not allowed in a batch (fast mode is not offered there)"
    if path[-1] == "type" and message.startswith("Invalid value"):
        return (f"{_name(path[:-1])}: block type {short(_at(obj, path))} is not one the API documents "
                f"({', '.join(BLOCK_TYPES)})")
    return f"{_name(path)}: {_lower(message)}"


def _split(error: msgspec.ValidationError) -> tuple[str, list[str | int]]:
    """msgspec's message and its path as steps: 'Expected ... - at `$.params.messages[0]`' -> ('Expected ...',
    ['params', 'messages', 0])."""
    found = _AT.match(str(error))
    assert found is not None  # (the pattern matches any text)
    steps = [name if name else int(index) for name, index in _STEP.findall(found.group(2) or "")]
    return found.group(1), steps


def _name(path: list[str | int]) -> str:
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".")


def _lower(message: str) -> str:
    return message[:1].lower() + message[1:]


def _lenient(raw: bytes) -> Any:
    """The line as plain values, for the words of its reason; None when even that fails."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _at(obj: Any, path: list[str | int]) -> Any:
    """The value at `path` (None where the line has none)."""
    for step in path:
        try:
            obj = obj[step]
        except (KeyError, IndexError, TypeError):
            return None
    return obj
