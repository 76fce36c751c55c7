"""mkdocs hook: the CLI reference is the parser's own help, made at build time, so it cannot drift from the code."""

from __future__ import annotations

import os
from typing import Any

MARK = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARK not in markdown:
        return markdown
    os.environ["COLUMNS"] = "100"  # (argparse wraps to the terminal's width: the page's width, whoever builds it)
    from gatekeeper.cli._parser import HELP, build_parser

    sections = []
    for name in HELP:
        parser = build_parser([name])
        sub = next(a for a in parser._subparsers._group_actions if a.choices).choices[name]  # type: ignore[union-attr]
        sections += _sections(f"gatekeeper {name}", sub, "##")
    return markdown.replace(MARK, "\n".join(sections))


def _sections(title: str, parser: Any, level: str) -> list[str]:
    """A command's help, then its own subcommands' (`serve keys add`), each under its heading."""
    out = [f"{level} `{title}`\n\n```text\n{parser.format_help().rstrip()}\n```\n"]
    for action in getattr(parser, "_actions", []):
        choices = getattr(action, "choices", None)
        for name, child in (choices.items() if isinstance(choices, dict) else ()):
            out += _sections(f"{title} {name}", child, "###")
    return out
