"""Every `gatekeeper ...` command shown in the README and docs/ parses with today's CLI: a flag renamed or removed
fails here, not in a user's pipeline."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gatekeeper.cli._parser import build_parser

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`(gatekeeper [^`]+)`(?!`)")
SYNOPSIS = re.compile(r"[\[\]|…]|\.\.\.")  # a synopsis (`[INPUT]`, `a|b`), not a command


def shown_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of each command line in a fenced block of the README and docs/ (a shell prompt, comments,
    continuations and what follows a pipe or `&&` taken off)."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for span in INLINE.findall(FENCE.sub("", text).replace("\n", " ")):
            if not SYNOPSIS.search(span):
                out.append((f"{path.relative_to(ROOT)}: {span[:60]}", shlex.split(span)[1:]))
        for block in FENCE.findall(text):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                for part in re.split(r"\s*(?:&&|\|\||\||;)\s*", line):
                    if part.startswith("gatekeeper ") or part == "gatekeeper":
                        words = shlex.split(part.split(" #", 1)[0], posix=True)
                        out.append((f"{path.relative_to(ROOT)}: {part[:60]}", words[1:]))
    return out


COMMANDS = shown_commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 15


# Placeholders the docs write for a value, and a value of the kind the flag takes.
PLACEHOLDERS = {"MODE": "count-20", "N": "5", "SECONDS": "30", "FILE": "out.jsonl", "INPUT": "in.jsonl", "DIR": "state",
                "URL": "postgresql://db.example/gk", "PCT": "80", "NAME": "night-1", "KEY": "k", "TYPES": "errored"}
COMMAND_NAMES = {"plan", "status", "submit", "results", "cancel", "report", "exporter", "fake-api", "serve"}


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where: str, argv: list[str]) -> None:
    """A command as shown (its placeholders given a value of their kind) parses; a bare `gatekeeper plan` names a
    command that exists; `--version` and `--help` exit 0."""
    argv = [PLACEHOLDERS.get(word, word) for word in argv]
    if len(argv) == 1 and not argv[0].startswith("-"):
        assert argv[0] in COMMAND_NAMES, where
        return
    parser = build_parser(argv)
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code != 0:
            pytest.fail(f"{where}: does not parse (exit {exc.code})")


def documented_synopses() -> dict[str, set[str]]:
    """command -> the flags its synopsis lists: the `## \\`cmd ...\\`` headings of docs/commands.md and the bold
    `gatekeeper cmd ...` synopses of docs/watching.md."""
    out: dict[str, set[str]] = {}
    for name, pattern in (("commands.md", r"^## `(\S+)([^`]*)`"), ("watching.md", r"\*\*`gatekeeper (\S+)([^`]*)`\*\*")):
        for m in re.finditer(pattern, (ROOT / "docs" / name).read_text(), re.M):
            out.setdefault(m.group(1), set()).update(re.findall(r"--[\w-]+", m.group(2)))
    return out


def test_every_synopsis_lists_every_flag() -> None:
    """A flag added to a command but not to its synopsis (or one documented that no longer exists) fails here."""
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    synopses = documented_synopses()
    assert {"plan", "status", "submit", "results", "cancel", "report", "exporter"} <= set(synopses)
    for cmd, listed in synopses.items():
        real = {o for a in commands[cmd]._actions for o in a.option_strings
                if o.startswith("--") and o != "--help" and a.help != "==SUPPRESS=="}
        assert listed == real, f"{cmd}: missing {sorted(real - listed)}, gone {sorted(listed - real)}"


# submit's flags and the SubmitSettings fields they set: the library and the CLI start from the same defaults
FLAG_FIELDS = {"margin": "margin", "interval": "interval", "max_in_flight": "max_in_flight",
               "max_attempts": "max_attempts", "reconcile_grace": "reconcile_grace", "ledger_ttl": "ledger_ttl",
               "priority": "priority", "share": "share", "results_grace": "results_grace", "max_rpm": "max_rpm",
               "budget": "budget", "token_sample": "token_sample", "lease_ttl": "lease_ttl", "deadline": "deadline",
               "turnaround": "turnaround", "deadline_slack": "deadline_slack", "ceiling": "ceiling"}


@pytest.mark.parametrize("dest, field", sorted(FLAG_FIELDS.items()))
def test_a_flags_default_is_the_librarys(dest: str, field: str) -> None:
    from gatekeeper import SubmitSettings

    args = build_parser().parse_args(["submit", "in.jsonl"])
    assert getattr(args, dest) == getattr(SubmitSettings(), field)


def test_a_flag_and_its_field_share_one_name() -> None:
    """The CLI's flag and the library's field are named alike (`--interval`, `interval`), the only exception the
    flags whose library name is shorter by design; `poll`, the field's old name, is still taken, with a warning."""
    assert all(dest == field for dest, field in FLAG_FIELDS.items())


@pytest.mark.parametrize("given, interval, warned", [
    ({}, 30.0, False),
    ({"interval": 5.0}, 5.0, False),
    ({"poll": 5.0}, 5.0, True),  # (the old name, still taken)
    ({"poll": 5.0, "interval": 5.0}, 5.0, True),
])
def test_submit_settings_interval_and_its_old_name(given: dict[str, float], interval: float, warned: bool) -> None:
    import warnings

    from gatekeeper import SubmitSettings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings = SubmitSettings(**given)  # type: ignore[arg-type]
        assert settings.interval == interval
        assert settings.poll == interval  # type: ignore[attr-defined]  # (read by its old name too)
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert said[0].startswith("SubmitSettings(poll=...) is deprecated: use interval") if warned else said[0].startswith(
        "SubmitSettings.poll is deprecated"), said
    assert all(w.filename == __file__ for w in caught)  # (each names the caller's line)
    import dataclasses

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a copy passes no old name on: no warning, its interval kept or replaced)
        assert dataclasses.replace(settings, margin=1).interval == interval
        assert dataclasses.replace(settings, interval=9.0).interval == 9.0


def test_submit_settings_refuses_two_intervals() -> None:
    from gatekeeper import SubmitSettings

    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="give interval only"):
        SubmitSettings(interval=5.0, poll=7.0)


def test_every_default_the_help_and_docs_state_is_the_parsers() -> None:
    """Each '(default N)' in a flag's help, and each "`--flag N`, default N" in docs/commands.md, is what the parser
    uses."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    checked = 0
    for name, cmd in sub.items():
        args = vars(cmd.parse_args([] if name not in {"submit", "plan", "results", "report"} else ["x.jsonl"]))
        for action in cmd._actions:
            said = re.search(r"\(default:? ([0-9][0-9,.]*)\)", action.help or "")
            if said and action.dest in args and isinstance(args[action.dest], (int, float)):
                assert float(said.group(1).replace(",", "")) == args[action.dest], (name, action.dest)
                checked += 1
    docs = (ROOT / "docs" / "commands.md").read_text()
    for flag, value in re.findall(r"`(--[a-z-]+) [A-Z]+`[^`(]*?\(?default ([0-9][0-9,.]*)", docs):
        dest = flag[2:].replace("-", "_")
        found = [c for c in sub.values() if dest in vars(c.parse_args(["x.jsonl"] if "input" in
                 {a.dest for a in c._actions} else []))]
        assert found and all(float(value.replace(",", "")) == getattr(c.parse_args(["x.jsonl"]), dest)
                             for c in found[:1]), flag
        checked += 1
    assert checked >= 8
