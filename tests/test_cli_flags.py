"""One CLI: a flag means the same in every command that has it, every command has `--json`, and every command that
reaches an account, or names a job by the account it went to, takes `--platform`."""

from __future__ import annotations

import argparse

import pytest

from gatekeeper.cli._parser import HELP, build_parser

# (fake-api serves no account of its own: it plays one)
ACCOUNT_COMMANDS = sorted(set(HELP) - {"fake-api"})


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser([name])._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(name: str) -> dict[str, argparse.Action]:
    return {opt: a for a in _command(name)._actions for opt in a.option_strings}


@pytest.mark.parametrize("name", sorted(HELP))
def test_every_command_has_json(name: str) -> None:
    assert "--json" in _flags(name)


@pytest.mark.parametrize("name", ACCOUNT_COMMANDS)
def test_every_command_that_reaches_or_names_an_account_takes_platform(name: str) -> None:
    flags = _flags(name)
    assert "--platform" in flags, name
    assert tuple(flags["--platform"].choices or ()) == ("anthropic", "aws", "google", "foundry")


def test_a_flag_takes_the_same_values_in_every_command() -> None:
    """The choices, the default and the kind of value of each flag agree wherever it appears."""
    seen: dict[str, tuple[str, object, object, object]] = {}
    for name in sorted(HELP):
        for flag, action in _flags(name).items():
            if flag in ("-h", "--help", "--host", "--port", "--state", "--journal", "--out"):
                continue  # (the serve command's --state/--journal are its own folder and book: said in its help)
            kind = type(action).__name__.replace("Append", "Store")  # (exporter's --job: several jobs, each a name)
            shape = (kind, tuple(action.choices or ()), getattr(action.type, "__name__", action.type),
                     action.nargs)
            if flag in seen:
                assert seen[flag][1:] == (shape,), f"{flag}: {seen[flag][0]} and {name} differ"
            else:
                seen[flag] = (name, shape)
