"""A prompt template: text with `{column}` fields (`{{` and `}}` for braces), rendered per row. Pure."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    def missing(self, row: Mapping[str, Any]) -> str | None:
        """The first templated column that is null in this row, if any."""
        for c in self.columns:
            if row[c] is None:
                return c
        return None


def parse_template(text: str, setting: str = "template", *, files: bool = True) -> Template:
    """`text`, or the file `@path` names (unless not `files`), parsed; a malformed field is a usage error naming the
    setting."""
    if files and text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--{setting} {text}: {exc.strerror or exc}", setting=setting) from None
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise UsageError(f"--{setting}: {exc} (write {{{{ and }}}} for a literal brace)", setting=setting) from None
    parts: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in fields:
        if name is not None and (spec or conversion or not name.strip()):
            raise UsageError(f"--{setting}: the field {{{name}{'!' + conversion if conversion else ''}"
                             f"{':' + spec if spec else ''}}} is not a column name (fields are {{column}}; "
                             "{{ and }} for braces)", setting=setting)
        parts.append((literal, name))
    return Template(tuple(parts), setting, tuple(dict.fromkeys(c for _, c in parts if c is not None)))


def check_columns(template: Template, columns: list[str]) -> None:
    """Every templated column is in the table; else one line naming it and the columns there are."""
    for col in template.columns:
        if col not in columns:
            shown = ", ".join(columns[:20]) + (f" (and {len(columns) - 20} more)" if len(columns) > 20 else "")
            raise UsageError(f"--{template.setting} names the column {col!r}, which the table does not have; its "
                             f"columns: {shown}", setting=template.setting)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
