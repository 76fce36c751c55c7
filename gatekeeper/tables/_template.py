"""A prompt template: text with `{column}` fields (`{{` and `}}` for braces), rendered per row. Pure.

A value renders as its text, the same whatever type the column happens to have tonight: a request's key is the
digest of its text, so `1` stored as int64 one night and as double the next (pandas' way once a NaN appears) must
render alike, or every row is bought again. Integral floats render as integers, lists and structs as JSON, bytes
as UTF-8 text; a null, a NaN or bytes that are not UTF-8 are the row's fault (`unfit`), never rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .._errors import UsageError


@dataclass(frozen=True)
class Template:
    """Literal text and the columns between it, in order."""

    parts: tuple[tuple[str, str | None], ...]  # (literal, column or None)
    setting: str = "template"
    columns: tuple[str, ...] = ()  # the columns named, each once, in order (`parse_template` fills it)

    @property
    def text(self) -> str:
        """The template as it would be written (`parse_template(t.text)` is `t`)."""
        return "".join(lit.replace("{", "{{").replace("}", "}}") + ("" if col is None else "{" + col + "}")
                       for lit, col in self.parts)

    def render(self, row: Mapping[str, Any]) -> str:
        """The text for one row; a null field is the caller's to judge first (`missing`)."""
        return "".join(lit + ("" if col is None else _text(row[col])) for lit, col in self.parts)

    def unfit(self, row: Mapping[str, Any]) -> str | None:
        """Why this row cannot be rendered (its first templated column that is null, NaN or bytes that are not
        UTF-8), if it cannot."""
        for c in self.columns:
            why = unfit_value(row[c])
            if why is not None:
                return f"column {c!r} is {why}"
        return None


def parse_template(text: str, setting: str = "template", *, files: bool = True) -> Template:
    """`text`, or the file `@path` names (unless not `files`), parsed; a malformed field is a usage error naming the
    setting."""
    if files and text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--{setting} {text}: {exc.strerror or exc}", setting=setting) from None
    parts = _parts(text, setting)
    return Template(tuple(parts), setting, tuple(dict.fromkeys(c for _, c in parts if c is not None)))


def _parts(text: str, setting: str) -> list[tuple[str, str | None]]:
    """The literal text and the field after each piece of it. A field is everything between `{` and the next `}`,
    verbatim (a column named `a:b`, `x!` or `price (USD)` is written as it is named: there are no format specs),
    `{{` and `}}` outside a field are braces; a column whose name holds a brace cannot be named."""
    parts: list[tuple[str, str | None]] = []
    literal: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "{}" and text.startswith(c * 2, i):
            literal.append(c)
            i += 2
        elif c == "}":
            raise UsageError(f"--{setting}: a lone '}}' at character {i + 1} (write }}}} for a literal brace)",
                             setting=setting)
        elif c == "{":
            end = text.find("}", i + 1)
            name = text[i + 1:end] if end >= 0 else text[i + 1:]
            if end < 0 or "{" in name:
                raise UsageError(f"--{setting}: the field at character {i + 1} is not closed by '}}' (write {{{{ for "
                                 "a literal brace; a column name cannot hold a brace)", setting=setting)
            if not name.strip():
                raise UsageError(f"--{setting}: the field {{{name}}} at character {i + 1} names no column (fields are "
                                 "{column}; {{ and }} for braces)", setting=setting)
            parts.append(("".join(literal), name))
            literal = []
            i = end + 1
        else:
            j = min((k for k in (text.find("{", i), text.find("}", i)) if k >= 0), default=n)
            literal.append(text[i:j])
            i = j
    if literal:
        parts.append(("".join(literal), None))
    return parts


def check_columns(template: Template, columns: list[str]) -> None:
    """Every templated column is in the table; else one line naming it and the columns there are."""
    for col in template.columns:
        if col not in columns:
            shown = ", ".join(columns[:20]) + (f" (and {len(columns) - 20} more)" if len(columns) > 20 else "")
            raise UsageError(f"--{template.setting} names the column {col!r}, which the table does not have; its "
                             f"columns: {shown}", setting=template.setting)


def unfit_value(value: Any) -> str | None:
    """Why a value cannot be rendered (None: it can)."""
    if value is None:
        return "null"
    if isinstance(value, float) and value != value:
        return "null (NaN)"
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"not UTF-8 text (byte {value[exc.start]:#04x} at {exc.start})"
    return None


def _text(value: Any) -> str:
    """A value's text (`unfit_value` judged it first)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple, dict)):
        return orjson.dumps(_plain(value), default=str).decode()
    return str(value)


def _plain(value: Any) -> Any:
    """A nested value with its integral floats as integers (as `_text` renders one at the top)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
