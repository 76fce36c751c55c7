"""The `gatekeeper` command: parsing, then the command's own module (`cli/_plan.py`, `_submit.py`, ...), which
parses nothing and prints what the library answers.

Exit codes mean the same in every command: 0 all good, 1 finished with findings, 2 usage or configuration error,
130 interrupted.

A command's module is imported when it runs: `--version`, `--help` and `plan` never load httpx or anyio, so the
command starts as fast as Python does; `--version` alone is answered before the parser is built (the start-up
rules: docs/development.md).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import ExitCode, GatekeeperError, Interrupted

if TYPE_CHECKING:
    import argparse

# each command: its module in this package and its function
COMMANDS = {"plan": ("_plan", "cmd_plan"), "status": ("_status", "cmd_status"), "submit": ("_submit", "cmd_submit"),
            "results": ("_results", "cmd_results"), "cancel": ("_cancel", "cmd_cancel"),
            "report": ("_results", "cmd_report"), "exporter": ("_exporter", "cmd_exporter"),
            "fake-api": ("_fake", "cmd_fake_api"), "serve": ("_serve", "cmd_serve")}


def _run_command(args: argparse.Namespace) -> int:
    """The command, with an orchestrator's stop (SIGTERM: `kill`, `docker stop`, systemd) made a Ctrl-C: 130, or as
    the commands that run until stopped end on Ctrl-C (`fake-api` saying what it received); never cut off. (`submit`
    listens for both itself while it runs; `plan`'s workers are reaped.) SIGINT that came ignored stops it too: a
    shell starts a script's background job so (`gatekeeper submit ... &`), and Python keeps it ignored, so a `kill
    -INT` meant for the job did nothing (a test suite started so saw every command run on past its Ctrl-C). The
    caller's handlers are put back after, for a process that calls `main()` and goes on."""
    import signal  # (here: `--version` and `--help` start without it)

    module, name = COMMANDS[args.command]
    _import_msgspec()
    command = getattr(importlib.import_module(f".{module}", __package__), name)
    before = signal.signal(signal.SIGTERM, _interrupt)
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return int(command(args))
    finally:
        signal.signal(signal.SIGTERM, before)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _import_msgspec() -> None:
    """msgspec loaded before the command's module, without typing_extensions: msgspec takes `get_type_hints` from it
    when it is installed (anyio's dependency), else from `typing`, which on Python 3.11 and later reads every type
    the CLI decodes as well; importing it is about 38 M instructions, half of msgspec's import and a quarter of what
    `plan` loads beyond a bare orjson loop (docs/development.md, start-up). A later import of typing_extensions (httpx,
    anyio) finds it as usual."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # (an ImportError, which msgspec catches)
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM handled as SIGINT is at that moment: inside `anyio.run`, by asyncio's runner, which cancels the main task
    (the running task goes on to its next await and is cancelled there, its cleanup run as for any cancellation,
    rather than interrupted in the middle of its code); elsewhere, a KeyboardInterrupt."""
    import signal

    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def run() -> int:
    """The `gatekeeper` command itself (the installed script and `python -m gatekeeper`): `main()`, then every object
    left is frozen out of the garbage collector, so that the interpreter's exit does not collect and free, one by one,
    the cycles every import leaves (modules, classes, functions: 7 ms of a 45 ms `plan`); their memory goes with the
    process. What is not in a cycle is still freed as its module is cleared (a file closed, its buffer written). (Every
    command has closed what it opened by then: its files, journal and connections.) A program that calls `main()` and
    goes on keeps its collector as it was."""
    code = main()
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # (what argparse's version action prints, without building the parser)
        from .._version import __version__

        print(f"gatekeeper {__version__}")
        return ExitCode.OK
    from ._common import print_error
    from ._parser import build_parser

    as_json = "--json" in argv  # (known before parsing: a usage error the parser finds is said as the command says)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        args.argv = argv
        as_json = bool(getattr(args, "json", False))
        _warn_passwords_in_argv(argv)
        if not args.command:
            parser.print_help(sys.stderr)
            return ExitCode.USAGE
        return _run_command(args)  # (after parsing: --version and --help start without `signal`)
    except GatekeeperError as exc:
        return print_error(exc, as_json=as_json)
    except KeyboardInterrupt:
        return print_error(Interrupted("interrupted"), as_json=as_json)
    except BaseExceptionGroup as group:  # (a stop raised inside a task group arrives wrapped: still a stop)
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        return print_error(Interrupted("interrupted"), as_json=as_json)
    except BrokenPipeError:
        # Output piped into `head`: not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.OK


def _warn_passwords_in_argv(argv: list[str]) -> None:
    """A password written in a URL on the command line can be read by every user of the host (ps)."""
    from ._common import masked, where_secrets_go

    held = [a for a in argv if masked(a) != a]
    if held:
        print("gatekeeper: warning: a URL on the command line holds a password, which other users can read with ps; "
              + where_secrets_go(held), file=sys.stderr)
