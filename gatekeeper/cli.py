"""The `gatekeeper` command: parsing, wiring and printing only.

Exit codes mean the same in every command: 0 all good, 1 finished with
findings, 2 usage or configuration error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from .errors import ExitCode, GatekeeperError, UsageError
from .planner import PlanReport, plan
from .sizing import API_MAX_BYTES, API_MAX_REQUESTS, Limits


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _percent(text: str) -> int:
    value = _positive_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"must be a percentage from 1 to 100, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns every exit code."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog.removeprefix('gatekeeper').strip() or 'usage'}: {message}")


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the human report")


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-requests", type=_positive_int, default=API_MAX_REQUESTS, metavar="N",
                   help=f"requests per batch at most (default and API limit {API_MAX_REQUESTS:,})")
    p.add_argument("--max-bytes", type=_positive_int, default=API_MAX_BYTES, metavar="N",
                   help=f"bytes per create body at most (default and API limit {API_MAX_BYTES:,})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gatekeeper", description="Get very large Message Batches jobs through the API without tripping its limits.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("plan", help="validate and size a JSONL of batch requests (dry run, nothing sent)",
                       description="Validate every line and cut the input into legal batches. Nothing is sent.\n\n"
                       "Example usage:\n  gatekeeper plan requests.jsonl\n  gatekeeper plan - --json < requests.jsonl",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="JSONL file of {custom_id, params} lines, or - for standard input")
    _add_limits(p)
    _add_json(p)
    return parser


def _limits(args: argparse.Namespace) -> Limits:
    try:
        return Limits(max_requests=args.max_requests, max_bytes=args.max_bytes)
    except ValueError as exc:
        raise UsageError(f"--max-requests/--max-bytes: {exc}") from None


def _print_json(obj: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def cmd_plan(args: argparse.Namespace) -> int:
    report = plan(args.input, limits=_limits(args))
    if args.json:
        _print_json(report.to_json())
    else:
        print(render_plan(report, args.input))
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def render_plan(report: PlanReport, name: str) -> str:
    out = [
        f"input           {name}",
        f"lines read      {report.lines:,}",
        f"valid requests  {report.requests:,}",
        f"rejected lines  {report.invalid:,}",
    ]
    for err in report.errors[:20]:
        cid = f" [{err.custom_id}]" if err.custom_id else ""
        out.append(f"  line {err.line}{cid}: {err.reason}")
    if report.invalid > 20:
        out.append(f"  ... and {report.invalid - 20:,} more (--json lists all)")
    out.append(f"batches         {len(report.batches):,}"
               f"   (at most {report.limits.max_requests:,} requests and {report.limits.max_bytes:,} bytes each)")
    if report.batches:
        out.append(f"  {'#':>5} {'requests':>9} {'bytes':>13}  lines")
        shown = report.batches if len(report.batches) <= 40 else report.batches[:20] + report.batches[-20:]
        for i, b in enumerate(shown):
            if len(report.batches) > 40 and i == 20:
                out.append(f"  {'...':>5}")
            out.append(f"  {b.index:>5} {b.requests:>9,} {b.bytes:>13,}  {b.first_line}-{b.last_line}")
    if report.requests:
        out.append(f"largest request {report.largest_bytes:,} bytes (line {report.largest_line}, {report.largest_custom_id})")
        out.append("models")
        for model, n in sorted(report.models.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {n:>9,}  {model}")
    return "\n".join(out)


COMMANDS = {"plan": cmd_plan}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help(sys.stderr)
            return ExitCode.USAGE
        return int(COMMANDS[args.command](args))
    except GatekeeperError as exc:
        print(f"gatekeeper: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("gatekeeper: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # Output piped into `head`: not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.OK
