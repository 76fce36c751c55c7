"""Each row judged before anything is sent, and given its request, its identity and, from its answer, its result
columns. Pure.

A row's *key* is the sha256 of its rendered request (params, keys sorted): what an answer is kept under across runs,
so a changed row is a new request and an unchanged one is never bought twice. Its `custom_id` is its id column's
value when that is a string that is a valid custom id, else one derived from the value and its type (an integer too:
`1234` and `"1234"` are two ids, and an integral float is its integer's, so an int64 id column stored as double the
next night keeps its custom_ids; the result row carries the original), or, without an id column, derived from the key
(rows with the same request share one answer).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import orjson

from .._prices import PriceTable
from ..decide._downloads import ANSWER_LOST, MISSING_RESULT, RESULTS_UNAVAILABLE, UNPROVEN_ERROR
from ._template import Template

_VALID_ID = re.compile(r"[A-Za-z0-9_-]{1,64}").fullmatch
STATUSES = ("succeeded", "errored", "expired", "canceled", "rejected", "unsent")
RESULT_COLUMNS = ("custom_id", "status", "text", "stop_reason", "model", "input_tokens", "output_tokens",
                  "cache_read_input_tokens", "cache_creation_input_tokens", "cost_usd", "error")


@dataclass(frozen=True)
class TableSpec:
    """What turns a row into a Messages request."""

    template: Template
    model: str
    max_tokens: int
    system: Template | None = None
    id_column: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # more request params (temperature, metadata, ...)

    @classmethod
    def of(cls, template: str, model: str, max_tokens: int, *, system: str | None = None,
           id_column: str | None = None, params: Mapping[str, Any] | None = None) -> TableSpec:
        """From the texts (`{column}` fields, `{{`/`}}` for braces, or `@path`), as the CLI's flags give them."""
        from ._template import parse_template

        return cls(parse_template(template), model, max_tokens, parse_template(system, "system") if system else None,
                   id_column, dict(params or {}))

    def to_json(self) -> dict[str, Any]:
        """The spec as plain data (the templates' text, never a file's path): `TableSpec.from_json` reads it back."""
        return {"template": self.template.text, "model": self.model, "max_tokens": self.max_tokens,
                "system": None if self.system is None else self.system.text, "id_column": self.id_column,
                "params": dict(self.params)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TableSpec:
        from ._template import parse_template

        system = obj.get("system")
        return cls(parse_template(obj["template"], files=False), obj["model"], int(obj["max_tokens"]),
                   None if system is None else parse_template(system, "system", files=False), obj.get("id_column"),
                   dict(obj.get("params") or {}))

    @functools.cached_property
    def pieces(self) -> tuple[bytes, ...]:
        return _pieces(self)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns a row's request is made of (its id column included)."""
        cols = self.template.columns + (self.system.columns if self.system else ())
        return tuple(dict.fromkeys(cols + ((self.id_column,) if self.id_column else ())))


_HEAD, _MID, _TAIL = b'{"custom_id":"', b'","params":', b"}\n"  # (a line of a table job's JSONL, around its parts)
LINE_FRAME = len(_HEAD) + len(_MID) + len(_TAIL) - 1  # a line's bytes besides its custom_id and body, newline aside
KEY_HEX = 40  # a key's hex digits: 160 bits of the sha256


def framed(cids: list[bytes], bodies: list[bytes]) -> list[bytes]:
    """Lines of a table job's JSONL, a custom_id and a body each, made with no Python step a line."""
    n = len(bodies)
    return list(map(b"".join, zip(repeat(_HEAD, n), cids, repeat(_MID, n), bodies, repeat(_TAIL, n))))


class Judged(NamedTuple):  # (a tuple: a million of them are made in a few seconds)
    row: int  # 1-based, in input order
    key: str | None = None  # None: rejected
    custom_id: str | None = None
    body: bytes = b""  # the request's params as JSON, keys sorted (what its key is the digest of)
    rejected: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        return dict(orjson.loads(self.body))

    def line(self) -> bytes:
        """The request as a line of a JSONL job (a custom_id is made of letters, digits, `_` and `-`: no escapes)."""
        return framed([(self.custom_id or "").encode()], [self.body])[0]


def request_of(spec: TableSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {"model": spec.model, "max_tokens": spec.max_tokens, **spec.params,
                              "messages": [{"role": "user", "content": spec.template.render(row)}]}
    if spec.system is not None:
        params["system"] = spec.system.render(row)
    return params


_USER, _SYSTEM = "\x00user\x00", "\x00system\x00"


def _pieces(spec: TableSpec) -> tuple[bytes, ...]:
    """The request's JSON (keys sorted) cut around its prompts: the same bytes `orjson.dumps(request_of(...),
    option=OPT_SORT_KEYS)` gives, made by joining each row's encoded prompts between them."""
    probe = {"model": spec.model, "max_tokens": spec.max_tokens, **spec.params,
             "messages": [{"role": "user", "content": _USER}]}
    if spec.system is not None:
        probe["system"] = _SYSTEM
    whole = orjson.dumps(probe, option=orjson.OPT_SORT_KEYS)
    user, system = orjson.dumps(_USER), orjson.dumps(_SYSTEM)
    if spec.system is None:
        return tuple(whole.split(user))
    first, rest = (user, system) if whole.index(user) < whole.index(system) else (system, user)
    a, tail = whole.split(first)
    b, c = tail.split(rest)
    return (a, b, c, b"user-first" if first == user else b"system-first")


def body_of(spec: TableSpec, row: Mapping[str, Any]) -> bytes:
    """A row's request as JSON, keys sorted."""
    pieces = spec.pieces
    user = orjson.dumps(spec.template.render(row))
    if spec.system is None:
        return pieces[0] + user + pieces[1]
    system = orjson.dumps(spec.system.render(row))
    first, second = (user, system) if pieces[3] == b"user-first" else (system, user)
    return pieces[0] + first + pieces[1] + second + pieces[2]


def id_and_key(line: bytes) -> tuple[str, str]:
    """The custom_id and the request's key of a line `Judged.line` made."""
    at = line.index(_MID)
    return line[len(_HEAD):at].decode(), key_of(line[at + len(_MID):line.rindex(b"}")])


def key_of(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:KEY_HEX]


def custom_id_of(value: Any, key: str) -> str:
    """The custom_id for an id column's `value` (None: no id column, the request's key names the row)."""
    if value is None:
        return "r-" + key
    if isinstance(value, str) and _VALID_ID(value):
        return value
    value = hashable(value) if isinstance(value, float) else value  # (7.0 is the id 7, as `hashable` has it)
    text = f"{type(value).__name__}:{value!r}"
    return "id-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def judge_row(spec: TableSpec, row: Mapping[str, Any], number: int, duplicated: Mapping[Any, list[int]]) -> Judged:
    """One row: its request and identity, or why it is rejected (a templated column null, NaN or not UTF-8; a null,
    NaN or duplicated id); `duplicated` maps each id that occurs more than once to the rows it is on."""
    ident = row.get(spec.id_column) if spec.id_column else None
    for template in (spec.template, spec.system):
        why = template.unfit(row) if template is not None else None
        if why is not None:
            return Judged(number, custom_id=kept_id(ident, duplicated), rejected=f"row {number}: {why}")
    if spec.id_column and no_id(ident):
        return Judged(number, rejected=f"row {number}: the id column {spec.id_column!r} is "
                                       f"{'null' if ident is None else 'null (NaN)'}")
    if spec.id_column and hashable(ident) in duplicated:
        on = duplicated[hashable(ident)]
        rows = ", ".join(str(r) for r in on[:10]) + (f" and {len(on) - 10:,} more" if len(on) > 10 else "")
        return Judged(number, rejected=f"row {number}: id {ident!r} is on rows {rows} (ids must be unique)")
    body = body_of(spec, row)  # (joined bytes are their own length: orjson's each keep a 4 KB allocation)
    key = key_of(body)
    return Judged(number, key, custom_id_of(ident if spec.id_column else None, key), body)


def kept_id(ident: Any, duplicated: Mapping[Any, list[int]]) -> str | None:
    """The custom_id a row rejected for its values keeps: its id column's, when that names it alone (a cold tester's
    result table had a null custom_id for a row whose id was sound); None without an id column, or one null or
    duplicated."""
    if no_id(ident) or hashable(ident) in duplicated:
        return None
    return custom_id_of(ident, "")


def no_id(value: Any) -> bool:
    """Whether an id names no row: null, or NaN (which equals nothing, itself included: two NaN ids would pass for
    two ids)."""
    return value is None or (isinstance(value, float) and value != value)


def hashable(value: Any) -> Any:
    """An id as a dict key, compared as written: `"007"` and `"7"` differ; a float that is integral is its integer
    (the id column's type drifting from int64 to double leaves it the same id)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, (str, int, float, bytes, bool)) else repr(value)


NOT_SENT = "not sent: the run did not send it"
# errors of requests processed and maybe billed (an answer lost twice: billed up to twice, never a third time)
NEVER_AGAIN = (UNPROVEN_ERROR, RESULTS_UNAVAILABLE, MISSING_RESULT, ANSWER_LOST)


def is_final(result: Mapping[str, Any]) -> bool:
    """Whether a result answers its request for good: it succeeded, or it is one a run never sends again because it
    may have been billed already (an answer kept apart as unproven, results the API no longer has, a real-time answer
    lost twice: the lane's promise of never a third payment holds across a table's runs too). Anything else
    (errored, expired, canceled) is sent again by the next run."""
    if result.get("type") == "succeeded":
        return True
    err = (result.get("error") or {}).get("error") or result.get("error") or {}
    return result.get("type") == "errored" and isinstance(err, Mapping) and err.get("type") in NEVER_AGAIN


def result_columns(judged: Judged, result: Mapping[str, Any] | None, prices: PriceTable,
                   unsent: str = NOT_SENT) -> dict[str, Any]:
    """A row's result columns from its answer (`result`: the result object of a results line, None: none yet). A
    row judged and refused before anything was sent is `rejected`; a sound row with no answer is `unsent`, for
    `unsent` (why: the budget was reached, the job was canceled, ...)."""
    out: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
    out["custom_id"] = judged.custom_id
    if judged.rejected is not None:
        out["status"], out["error"] = "rejected", judged.rejected
        return out
    if result is None:
        out["status"], out["error"] = "unsent", unsent
        return out
    kind = str(result.get("type"))
    out["status"] = kind if kind in STATUSES else "errored"
    if kind == "rejected":
        out["error"] = f"row {judged.row}: {result.get('reason')}"
    elif kind == "succeeded":
        _message(out, result.get("message") or {}, prices)
    else:
        err = (result.get("error") or {}).get("error") or result.get("error") or {}
        out["error"] = f"{err.get('type')}: {err.get('message')}" if err else kind
    return out


def _message(out: dict[str, Any], message: Mapping[str, Any], prices: PriceTable) -> None:
    blocks = message.get("content") or []
    out["text"] = "".join(b.get("text") or "" for b in blocks if isinstance(b, dict) and b.get("type") == "text")
    out["stop_reason"], out["model"] = message.get("stop_reason"), message.get("model")
    usage = message.get("usage") or {}
    for col in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        out[col] = int(usage.get(col) or 0)
    out["cost_usd"] = prices.cost(out["model"], out["input_tokens"], out["output_tokens"],
                                  out["cache_creation_input_tokens"], out["cache_read_input_tokens"])
