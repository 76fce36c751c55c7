"""One CLI: a flag means the same in every command that has it, every command has `--json`, and every command that
reaches an account, or names a job by the account it went to, takes `--platform`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import orjson
import pytest

from gatekeeper.cli._cli import main
from gatekeeper.cli._parser import HELP, build_parser
from gatekeeper.testing import Fault
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import events, gk

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


# -- errors under --json: one JSON object, the same exit codes ----------------------------------------

# each command, failing as a user would make it fail: (argv, the error's type, exit code, a word of its line)
FAILING = {
    "plan": (["plan", "{tmp}/missing.jsonl"], "InputError", 2, "missing.jsonl"),
    "status": (["status", "--threshold", "101"], "UsageError", 2, "--threshold"),  # (the parser's own refusal)
    "submit": (["submit", "{tmp}/in.jsonl"], "UsageError", 2, "ANTHROPIC_API_KEY"),
    "results": (["results", "{tmp}/in.jsonl"], "UsageError", 2, "--state"),
    "cancel": (["cancel", "{tmp}/in.jsonl"], "UsageError", 2, "ANTHROPIC_API_KEY"),
    "report": (["report", "{tmp}/in.jsonl"], "UsageError", 2, "--state"),
    "exporter": (["exporter"], "UsageError", 2, "ANTHROPIC_API_KEY"),
    "fake-api": (["fake-api", "--deny", "batches.create"], "UsageError", 2, "--google"),
    "serve": (["serve", "--port", "70000"], "UsageError", 2, "--port"),
}


def _no_credentials(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    for name in [n for n in os.environ if n.startswith(("ANTHROPIC_", "GATEKEEPER_", "AWS_", "GOOGLE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp))  # (no profile on disk)


def test_every_command_fails_in_the_table() -> None:
    assert set(FAILING) == set(HELP)


@pytest.mark.parametrize("name", sorted(FAILING))
def test_an_error_under_json_is_one_json_object_and_keeps_its_exit_code(name: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Under --json a command's error is one line on stderr holding one JSON object (`{"event": "error", "error":
    {"type", "message", "exit_code", ...}}`), its message the plain line's, its exit code the documented one;
    stdout holds nothing. Without --json, the same error is the plain line, `gatekeeper: MESSAGE`."""
    _no_credentials(monkeypatch, tmp_path)
    (tmp_path / "in.jsonl").write_text('{"custom_id": "a", "params": {"model": "m", "max_tokens": 1, '
                                       '"messages": [{"role": "user", "content": "x"}]}}\n')
    argv, kind, exit_code, word = FAILING[name]
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main([*argv, "--json"]) == exit_code
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    said = orjson.loads(err)
    assert said["event"] == "error" and set(said) == {"event", "error"}
    error = said["error"]
    assert error["type"] == kind and error["exit_code"] == exit_code and word in error["message"], error
    assert "\n" not in error["message"] and "Traceback" not in err
    assert main(argv) == exit_code
    out, plain = capsys.readouterr()
    assert plain == f"gatekeeper: {error['message']}\n", plain


def test_an_api_error_under_json_names_its_endpoint_status_and_code(tmp_path: Path) -> None:
    """Over HTTP against the fake: a create refused for the account (exit 2) is the JSON error with what the API
    said, the typed code, the status and the endpoint; stdout stays empty."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"r{i}") for i in range(3)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.inject(Fault("create", code="organization_on_hold"))
        done = gk(["submit", str(path), "--interval", "0.05", "--max-rpm", "60000", "--json"], env_for(fake))
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    errors = [e for e in events(done.stderr) if e.get("event") == "error"]
    assert len(errors) == 1 and done.stderr.rstrip().endswith(orjson.dumps(errors[0]).decode()), done.stderr[-2000:]
    error = errors[0]["error"]
    assert error["type"] == "AccountRefused" and error["exit_code"] == 2 and error["code"] == "organization_on_hold"
    assert error["endpoint"] == "create" and error["status"] == 400 and "organization_on_hold" in error["message"]
    assert [x for x in done.stderr.splitlines() if not x.startswith("{")] == []  # (every stderr line JSON)
