"""The `gatekeeper` command line's parser: every command, flag and help text. Imports nothing heavy.

A flag means the same in every command: the shared ones are added by the `_add_*` helpers.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from .._errors import UsageError
from .._version import __version__
from .._wire import API_MAX_BYTES, API_MAX_REQUESTS, API_VERSION, API_VERSIONS, STRICT_VERSION
from ..api._platform import PLATFORMS


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _deadline(text: str) -> float:
    """A deadline given on the command line, as wall seconds (a duration counts from now)."""
    import time

    from ..decide._deadline import parse_deadline

    try:
        return parse_deadline(text, time.time())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_deadline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deadline", type=_deadline, default=None, metavar="WHEN",
                   help="finish by then: a duration from now (90m, 6h, 1h30m), an ISO 8601 time, or a time of day "
                   "(06:00Z: the next one; UTC without a zone); "
                   "what the batch lane is projected to miss goes through the real-time Messages API at standard "
                   "prices, paced on its rate limits (default: the batch lane only, no real-time call)")
    p.add_argument("--turnaround", type=_positive_float, default=3600.0, metavar="SECONDS",
                   help="how long a batch is expected to take until the job has seen one end (default 3600)")
    p.add_argument("--deadline-slack", type=_positive_float, default=None, metavar="SECONDS",
                   help="time kept in hand before the deadline (default 60, at most a quarter of the window)")


def _percent(text: str) -> int:
    value = _positive_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"must be a percentage from 1 to 100, got {value}")
    return value


def _columns() -> int:
    """The terminal's width as `shutil.get_terminal_size` finds it, without importing shutil: argparse imports it
    for every formatter it makes (one a flag added), and with it bz2 and lzma, 5 ms of every start."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0 and sys.__stdout__ is not None:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (ValueError, OSError):
            columns = 0
    return columns or 80


class _Wrapped(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)  # (argparse's own margin)


class _Raw(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns every exit code."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('gatekeeper').strip() or 'usage'}: {message}")


def _add_json(p: argparse.ArgumentParser, help: str = "print one JSON object on stdout instead of the human report") -> None:  # noqa: A002
    p.add_argument("--json", action="store_true", help=help)


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-requests", type=_positive_int, default=API_MAX_REQUESTS, metavar="N",
                   help=f"requests per batch at most (default and API limit {API_MAX_REQUESTS:,})")
    p.add_argument("--max-bytes", type=_positive_int, default=API_MAX_BYTES, metavar="N",
                   help=f"bytes per create body at most (default and API limit {API_MAX_BYTES:,})")


HELP = {  # one line a command, for the top-level --help (the other commands' flags are not built)
    "plan": "validate and size a JSONL of batch requests (no batch created)",
    "status": "queue depth against the organization's ceiling, with a verdict",
    "submit": "run the whole job: admit batches against headroom, collect, resubmit, resume",
    "results": "re-export a run's final results (also while it runs)",
    "cancel": "cancel a run's live batches and record it",
    "report": "one self-contained HTML page of a run: the queue over time, every batch, outcomes",
    "exporter": "serve Prometheus metrics of the queue and of runs",
    "fake-api": "run the fake Batches API on loopback for offline rehearsal",
    "serve": "a gateway that speaks the Message Batches API: any SDK's batches get gatekeeper's guarantees",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; given `argv` naming a command, only that command is built (building all of them costs
    about 20 ms of every start); otherwise every command is listed, without its flags."""
    parser = _Parser(prog="gatekeeper", description="Get very large Message Batches jobs through the API without tripping its limits.",
                     formatter_class=_Wrapped)
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, add in (("plan", _plan_parser), ("status", _status_parser), ("submit", _submit_parser),
                      ("results", _results_parser), ("cancel", _cancel_parser), ("report", _report_parser),
                      ("exporter", _exporter_parser), ("fake-api", _fake_api_parser), ("serve", _serve_parser)):
        if wanted is None or wanted == name:
            add(sub)
        elif wanted not in HELP:
            sub.add_parser(name, help=HELP[name], formatter_class=_Wrapped)
    return parser




def _command(sub: argparse._SubParsersAction[_Parser], name: str, *, help: str, description: str) -> _Parser:  # noqa: A002
    """A subcommand whose description keeps its line breaks (its "Example usage:" block)."""
    return sub.add_parser(name, help=help, description=description, formatter_class=_Raw)


def _plan_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "plan", help=HELP["plan"],
                 description="Validate every line and cut the input into legal batches. Nothing is sent.\n\n"
                 "Example usage:\n  gatekeeper plan requests.jsonl\n  gatekeeper plan - --json < requests.jsonl")
    p.add_argument("input", help="JSONL file of {custom_id, params} lines, or - for standard input; or a table "
                                 "with --template")
    _add_table(p)
    _add_state(p)
    _add_limits(p)
    _add_ceiling(p)
    _add_margin(p)
    _add_journal(p, lease=False)
    _add_prices(p)
    _add_no_preflight(p)
    _add_max_rpm(p)
    _add_platform(p)
    p.add_argument("--workers", type=_non_negative_int, default=None, metavar="N",
                   help="processes that validate a file in parallel (default: 2 on two or more cores for files over 8 MB; 0: one process)")
    _add_deadline(p)
    _add_json(p)


def _status_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "status", help=HELP["status"],
                 description="Read the batch queue: the enqueued_batch_requests ceiling (Admin API, or --ceiling) "
                 "and the depth over every workspace key. Read only.\n\nEnvironment: ANTHROPIC_API_KEY, "
                 "ANTHROPIC_EXTRA_WORKSPACE_KEYS, ANTHROPIC_ADMIN_KEY, ANTHROPIC_BASE_URL.\n\n"
                 "Example usage:\n  gatekeeper status\n  gatekeeper status --threshold 90 --json\n"
                 "  gatekeeper status --watch 5")
    _add_ceiling(p)
    p.add_argument("--threshold", type=_percent, default=80, metavar="PCT",
                   help="occupancy (percent) at which the queue is a finding (default 80)")
    p.add_argument("--watch", nargs="?", const=True, default=False, type=_positive_float, metavar="SECONDS",
                   help="re-read every SECONDS (or --interval) seconds until Ctrl-C: one screen redrawn on a terminal, "
                   "one JSON object a reading otherwise or with --json")
    _add_interval(p, "between readings with --watch")
    _add_ledger(p)
    _add_max_rpm(p)
    _add_platform(p)
    _add_json(p)


def _submit_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "submit", help=HELP["submit"],
                 description="Validate and size INPUT, then create batches only as the queue can take them, "
                 "collect their results into one output file, resubmit what can succeed on another try, until "
                 "every valid request has a final result. Rerun the same command to resume.\n\n"
                 "State: INPUT.gatekeeper/ beside the input (or --state); results: STATE/results.jsonl (or --out).\n\n"
                 "Example usage:\n  gatekeeper submit big.jsonl\n  gatekeeper submit big.jsonl --dry-run\n"
                 "  gatekeeper submit big.jsonl --json --interval 60 > summary.json\n"
                 "  gatekeeper submit big.jsonl --deadline 6h --budget 200")
    p.add_argument("input", help="JSONL file of {custom_id, params} lines; or a table with --template")
    _add_table(p)
    _add_state(p)
    p.add_argument("--out", default=None, metavar="FILE", help="the file this command writes: the job's results "
                   "(default STATE/results.jsonl; for a table job STATE/result.parquet, or STATE/result-SPEC.parquet "
                   "when a job of another spec wrote that first; or .csv, .arrow, s3://...)")
    _add_ceiling(p)
    _add_margin(p)
    _add_interval(p, "between queue readings")
    p.add_argument("--poll", type=_positive_float, dest="interval", action=_OldName, help=argparse.SUPPRESS)
    p.add_argument("--max-in-flight", type=_positive_int, default=None, metavar="N",
                   help="our batches live at once, at most (default: as many as fit)")
    p.add_argument("--max-attempts", type=_positive_int, default=3, metavar="N",
                   help="attempts per request, the first included, for results that can succeed on another try (default 3)")
    _add_reconcile_grace(p)
    _add_limits(p)
    _add_prices(p)
    _add_ledger(p)
    _add_journal(p)
    p.add_argument("--ledger-ttl", type=_positive_float, default=900.0, metavar="SECONDS",
                   help="how long a dead submitter's reservations outlive its last heartbeat in the ledger (default 900; "
                   "one of this machine is known dead at once)")
    p.add_argument("--priority", choices=["high", "normal", "low"], default="normal",
                   help="on a shared --ledger: while a job of higher priority waits for room, lower ones admit "
                   "nothing new (what they queued drains); a job that waited 30 min goes first (default normal)")
    p.add_argument("--share", type=_positive_float, default=1.0, metavar="N",
                   help="on a shared --ledger: room freed goes to the waiting jobs of one priority in proportion to "
                   "their shares (default 1)")
    p.add_argument("--results-grace", type=_positive_float, default=3600.0, metavar="SECONDS",
                   help="how long after a batch ends a 404 or a missing results_url is waited out before its requests "
                   "are reported as results unavailable (default 3600)")
    _add_no_preflight(p)
    p.add_argument("--budget", type=_positive_float, default=None, metavar="USD",
                   help="spend at most this much (batch prices, worst case counted before each create); a rerun "
                   "with a higher budget continues")
    p.add_argument("--no-prime", action="store_true",
                   help="send requests that share a cached prefix as they come, cold (default: one per prefix first, "
                        "the rest once its batch has ended, so that they read the cache; a new job only)")
    p.add_argument("--resume-canceled", action="store_true",
                   help="a job stopped by cancel sends the requests it never sent (without it, a rerun only collects)")
    p.add_argument("--allow-duplicate", action="store_true",
                   help="run even while another job with the same input and workspace is live in the --ledger")
    _add_deadline(p)
    _add_max_rpm(p)
    _add_platform(p)
    p.add_argument("--dry-run", action="store_true", help="plan plus live headroom: what would go now and what would wait")
    _add_json(p)


def _results_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "results", help=HELP["results"],
                 description="Write the final result lines of a submit run: all, filtered, or in input order. "
                 "While the run goes on, this is what is final so far.\n\nExample usage:\n"
                 "  gatekeeper results big.jsonl --in-order --out ordered.jsonl\n"
                 "  gatekeeper results --state job.state --only errored,expired")
    _add_run(p)
    p.add_argument("--out", default=None, metavar="FILE", help="the file this command writes: the exported lines (default: standard output)")
    p.add_argument("--in-order", action="store_true", help="in input order (default: the order results arrived)")
    p.add_argument("--only", default=None, metavar="TYPES",
                   help="comma-separated result types (succeeded, errored, expired, canceled), error types, "
                   "refused and truncated (succeeded answers that stopped for a refusal, or at max_tokens or the "
                   "context window), rejected (the input lines refused before sending, with line number and reason) "
                   "and/or unproven (answers kept apart: their batch, found after a lost create answer, could not be "
                   "proven this job's)")
    _add_prices(p)
    _add_reading_platform(p)
    _add_json(p, "print the summary as one JSON object instead of the human report: on stdout beside --out, on "
              "stderr when the lines themselves go to stdout")


def _cancel_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "cancel", help=HELP["cancel"],
                 description="Cancel the live batches of a submit run; a rerun of submit then sends nothing new and "
                 "collects what ended.\n\nExample usage:\n  gatekeeper cancel big.jsonl\n  gatekeeper cancel --state /data/job.state")
    _add_run(p)
    _add_max_rpm(p)
    _add_platform(p)
    _add_json(p)


def _report_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "report", help=HELP["report"],
                 description="Draw a run from its journal alone (finished, running or interrupted): the queue "
                 "against the ceiling with our share, every batch from create to end, results and errors by type, "
                 "retries, tokens and cost, settings and the input's identity. No scripts, no network.\n\n"
                 "Example usage:\n  gatekeeper report big.jsonl\n  gatekeeper report --state job.state --out night.html\n"
                 "  gatekeeper report big.jsonl --json")
    _add_run(p)
    p.add_argument("--out", default=None, metavar="FILE", help="the file this command writes: the HTML page (default STATE/report.html)")
    _add_prices(p)
    _add_reading_platform(p)
    _add_json(p)


def _exporter_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "exporter", help=HELP["exporter"],
                 description="Read the queue every --interval seconds (never once per scrape) and serve the last "
                 "reading as Prometheus metrics, with the figures of the runs given by --state. Needs "
                 "pip install 'gatekeeper-batches[exporter]'.\n\nExample usage:\n  gatekeeper exporter --port 9465\n"
                 "  gatekeeper exporter --port 9465 --state /data/night.state --ledger redis://ledger:6379/0")
    p.add_argument("--port", type=_port, default=9465, help="port to serve on (default 9465; 0: any free port)")
    p.add_argument("--listen", default="127.0.0.1", metavar="ADDR", help="address to serve on (default 127.0.0.1: loopback)")
    _add_interval(p, "between readings")
    p.add_argument("--state", action="append", default=[], metavar="DIR", help="a run's state directory (repeatable)")
    p.add_argument("--journal", default=os.environ.get("GATEKEEPER_JOURNAL"), metavar="URL",
                   help="the shared journal (postgresql://...) of the jobs given by --job")
    p.add_argument("--job", action="append", default=[], metavar="NAME", help="a job in the --journal (repeatable)")
    _add_ceiling(p)
    p.add_argument("--threshold", type=_percent, default=80, metavar="PCT", help="occupancy at which the verdict is near-limit")
    _add_ledger(p)
    _add_prices(p)
    _add_max_rpm(p)
    _add_platform(p)
    _add_json(p)


FAULT_ROUTES = ("create", "list", "retrieve", "results", "cancel", "delete", "messages", "count_tokens", "models",
                "model", "rate_limits", "token", "*")


def _fault(text: str) -> tuple[str, str, int, int]:
    """ROUTE:WHAT[:TIMES[:AFTER]] -> (route, what, times, after): WHAT a typed code the fake knows (`CODED`), an HTTP
    status (500, 529, 429 ...), or `lose` (a create made, its answer dropped)."""
    from ..testing._wire import CODED

    parts = text.split(":")
    try:
        route, code = parts[0], parts[1]
        times, after = int(parts[2]) if len(parts) > 2 else 1, int(parts[3]) if len(parts) > 3 else 0
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r}: use ROUTE:CODE[:TIMES[:AFTER]], e.g. create:organization_on_hold:1") from None
    known = code in CODED or (code == "lose" and route == "create") or (code.isdigit() and 400 <= int(code) <= 599)
    if route not in FAULT_ROUTES or not known or len(parts) > 4 or times < 1 or after < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: ROUTE one of {', '.join(FAULT_ROUTES)}; CODE one of "
                                         f"{', '.join(sorted(CODED))}, an HTTP status 400-599, or lose (create "
                                         "only); TIMES >= 1, AFTER >= 0")
    return route, code, times, after


def _fake_api_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "fake-api", help=HELP["fake-api"],
                 description="Serve the fake Message Batches API (gatekeeper.testing) until interrupted.\n\n"
                 "Example usage:\n  gatekeeper fake-api --port 8765 --simulated-ceiling 300000 --rate 5000 --speed 60\n"
                 "  ANTHROPIC_BASE_URL=http://127.0.0.1:8765 ANTHROPIC_API_KEY=test-key-ws1 gatekeeper status")
    _fake_world_flags(p)
    _fake_answer_flags(p)
    _fake_lane_flags(p)
    _fake_platform_flags(p)
    _fake_fault_flag(p)
    _add_json(p)


def _fake_world_flags(p: _Parser) -> None:
    """The fake's world: where it listens, its queue's ceiling and speed, the keys it takes."""
    p.add_argument("--port", type=_port, default=0, help="port on 127.0.0.1 (default: any free port)")
    # (not --ceiling: everywhere else that is the ceiling you tell gatekeeper; here it is the one the fake enforces)
    p.add_argument("--simulated-ceiling", type=_positive_int, default=300_000, metavar="N",
                   help="the enqueued_batch_requests the fake enforces and reports (default 300,000)")
    p.add_argument("--rate", type=_non_negative_float, default=5_000.0,
                   help="requests processed per simulated second (default 5,000; 0: batches stall, as a queue that does "
                   "not move: rehearse a --deadline)")
    p.add_argument("--speed", type=_positive_float, default=1.0, help="simulated seconds per real second (default 1)")
    p.add_argument("--workspace-key", action="append", default=None, metavar="KEY",
                   help="a workspace key the fake accepts (repeatable; default test-key-ws1)")
    p.add_argument("--admin-key", default="test-admin-key", metavar="KEY", help="the Admin key it accepts")


def _fake_answer_flags(p: _Parser) -> None:
    """How the fake's answers go wrong or vary: a model that does not exist, usage, lost creates, a lagging listing,
    its draws' seed."""
    p.add_argument("--error-model", default=None, metavar="MODEL",
                   help="requests for this model end errored with invalid_request_error (a model that does not exist)")
    p.add_argument("--usage", type=_usage_mode, default="count", metavar="MODE",
                   help="what a succeeded request bills against count_tokens: count (default), count-K (K tokens fewer), "
                   "scale:F, const:N (a gateway's own figure), noisy:P (count x (1 ± P), drawn per prompt: an estimate's "
                   "error) or none (no usage reported)")
    p.add_argument("--lose-creates", type=_share, default=0.0, metavar="P",
                   help="the share of creates whose answer is lost once the batch exists (default 0; 0.25: a quarter, "
                   "drawn per create)")
    p.add_argument("--listing-lag", type=_non_negative_float, default=0.0, metavar="SECONDS",
                   help="how long a new batch is missing from the listing, and answers 404 (default 0)")
    p.add_argument("--seed", type=int, default=1, help="the seed of the fake's draws (default 1)")


def _fake_lane_flags(p: _Parser) -> None:
    """The fake's real-time lane: its limits and latency."""
    lane = p.add_argument_group("the real-time lane (POST /v1/messages), the same limits for every model")
    lane.add_argument("--realtime-rpm", type=_positive_int, default=4_000, metavar="N", help="requests a minute (default 4,000)")
    lane.add_argument("--realtime-itpm", type=_positive_int, default=2_000_000, metavar="N",
                      help="input tokens a minute (default 2,000,000)")
    lane.add_argument("--realtime-otpm", type=_positive_int, default=400_000, metavar="N",
                      help="output tokens a minute (default 400,000)")
    lane.add_argument("--realtime-latency", type=_non_negative_float, default=0.02, metavar="SECONDS",
                      help="how long an answer takes (default 0.02)")


def _fake_platform_flags(p: _Parser) -> None:
    """Which platform the fake serves as (Claude Platform on AWS, Claude on Google Cloud), or federation only."""
    p.add_argument("--aws", action="store_true",
                   help="serve as Claude Platform on AWS: SigV4 with the access key it prints (or its short-term API key), "
                   "the workspace header, no Admin API; the line to paste sets AWS_REGION, ANTHROPIC_AWS_WORKSPACE_ID, "
                   "ANTHROPIC_AWS_BASE_URL and the keys (use --platform aws)")
    p.add_argument("--google", type=_positive_float, nargs="?", const=3600.0, default=None, metavar="SECONDS",
                   help="serve as Claude on Google Cloud: path-style routes, Google access tokens of SECONDS (default "
                   "3600) minted at its own token endpoint for the service-account key file it writes, IAM per route; "
                   "the line to paste sets GOOGLE_APPLICATION_CREDENTIALS, the project, location and workspace, "
                   "GATEKEEPER_GOOGLE_CLOUD_ORIGIN (the fake, both routes' paths as on the platform) and "
                   "GATEKEEPER_PLATFORM=google")
    p.add_argument("--deny", action="append", default=[], metavar="PERMISSION",
                   help="with --google: refuse this IAM permission (batches.create, batches.list, messages.create, ...)")
    p.add_argument("--organization-answers", action="store_true",
                   help="with --google: the organization route (.../claudeOrganization/invoke/v1/organizations/"
                   "rate_limits) answers the queue's ceiling, the --simulated-ceiling, to the workspace's token; "
                   "without it that read is refused (403 rateLimits.list), as the live platform may refuse it: "
                   "whether it answers there is not documented")
    p.add_argument("--federation", type=_positive_float, default=None, metavar="SECONDS",
                   help="take workload identity federation only (API keys refused), with access tokens of SECONDS: "
                   "the line to paste names an identity token file it writes, a rule and an organization")


def _fake_fault_flag(p: _Parser) -> None:
    """--fault: the errors the fake answers on a route."""
    p.add_argument("--fault", action="append", type=_fault, default=[], metavar="ROUTE:CODE[:TIMES[:AFTER]]",
                   help="answer the next TIMES calls (default 1) to ROUTE (create, list, retrieve, results, cancel, "
                   "messages, count_tokens, models, token (with --google: the Google token endpoint) or *), after AFTER "
                   "that pass, with CODE (repeatable): an "
                   "HTTP status (500, 529, 429 ...), lose (create only: the batch is made, its answer dropped), or "
                   "the API's typed error code as the API sends it: ramp_limit_exceeded, load_shedding (a 429 whose details "
                   "are null), enforced_spend_limit_reached, contract_spend_limit_reached, "
                   "linked_organization_spend_limit_reached, linked_organization_billing_unavailable, "
                   "organization_on_hold, workspace_human_review_disabled, cmek_key_disabled, "
                   "claude_code_key_creator_not_member or cmek_key_unreachable")


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a share from 0 up to (not including) 1")
    return value


def _serve_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "serve", help=HELP["serve"],
                 description="Serve the Message Batches API (create, retrieve, list, cancel, delete, results; the "
                 "Models API and count_tokens passed through) to clients that take a base URL: each create, of any "
                 "size, becomes a gatekeeper job. Clients use keys from `serve keys add`; the upstream's credentials "
                 "are read as submit reads them. Needs pip install 'gatekeeper-batches[gateway]'.\n\n"
                 "Example usage:\n  gatekeeper serve keys add team-a\n  gatekeeper serve --host 0.0.0.0 --port 8080 "
                 "--state /data/gateway\n  ANTHROPIC_BASE_URL=http://gateway:8080 ANTHROPIC_API_KEY=sk-gk-... python etl.py")
    _add_serve_state(p)
    p.add_argument("--host", default=os.environ.get("GATEKEEPER_HOST", "127.0.0.1"), metavar="ADDR",
                   help="address to serve on (default 127.0.0.1, or GATEKEEPER_HOST; 0.0.0.0 in a container)")
    p.add_argument("--port", type=_port, default=os.environ.get("GATEKEEPER_PORT") or "8080",
                   help="port to serve on (default 8080, or GATEKEEPER_PORT; 0: any free port)")
    p.add_argument("--journal", default=os.environ.get("GATEKEEPER_JOURNAL"), metavar="URL",
                   help="keep the book of batches and every job's journal in PostgreSQL (postgresql://USER@HOST:PORT/DB, "
                   "or GATEKEEPER_JOURNAL), for several replicas behind a load balancer sharing one --state volume; "
                   "default: SQLite in the state folder, one replica")
    _add_ledger(p, default="one for all its jobs: SQLite in the --state folder, or the --journal database")
    p.add_argument("--public-url", default=os.environ.get("GATEKEEPER_PUBLIC_URL"), metavar="URL",
                   help="the base of results_url (default: the URL the client called, or GATEKEEPER_PUBLIC_URL)")
    p.add_argument("--dedup-window", type=_non_negative_float, default=3600.0, metavar="SECONDS",
                   help="a tenant's create of the same requests within SECONDS returns the same batch (default 3600; "
                   "0: only an Idempotency-Key does)")
    _add_interval(p, "between a job's queue readings")
    _add_reconcile_grace(p)
    p.add_argument("--lease-ttl", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="a replica that stops heartbeating loses its jobs to another after SECONDS (default 60)")
    p.add_argument("--ledger-ttl", type=_positive_float, default=900.0, metavar="SECONDS",
                   help="how long a dead replica's reservations outlive its last heartbeat (default 900)")
    _add_ceiling(p)
    p.add_argument("--margin", type=_non_negative_int, default=0, metavar="N",
                   help="requests of queue headroom to leave for others (default 0)")
    p.add_argument("--max-attempts", type=_positive_int, default=3, metavar="N",
                   help="attempts per request, the first included (default 3)")
    p.add_argument("--max-jobs", type=_positive_int, default=16, metavar="N",
                   help="jobs this replica runs at once; more wait their turn (default 16; with --journal each holds "
                   "about three PostgreSQL connections: its journal, its lease's heartbeat, the ledger)")
    _add_max_rpm(p)
    p.add_argument("--platform", choices=PLATFORMS, default=None,
                   help=f"the upstream: {PLATFORM_HELP}. Each job keeps the anthropic-version of the create that made it")
    _add_json(p)
    keys = p.add_subparsers(dest="serve_command", metavar="keys", parser_class=_Parser)
    k = keys.add_parser("keys", help="the clients' keys: add, list, remove", formatter_class=_Wrapped)
    kinds = k.add_subparsers(dest="keys_command", metavar="add|list|remove", parser_class=_Parser, required=True)
    add = kinds.add_parser("add", help="a new key for TENANT, printed once (the file keeps only its hash)",
                           formatter_class=_Wrapped)
    add.add_argument("tenant", help="who the key speaks for (1-64 of A-Z a-z 0-9 _ - .)")
    add.add_argument("--priority", choices=["high", "normal", "low"], default=None,
                     help="the tenant's jobs' priority on the shared ledger (default: as before, else normal)")
    add.add_argument("--share", type=_positive_float, default=None, metavar="N",
                     help="the tenant's jobs' share of freed room (default: as before, else 1)")
    remove = kinds.add_parser("remove", help="remove a key (by its id) or every key of a tenant", formatter_class=_Wrapped)
    remove.add_argument("ref", metavar="KEY_ID|TENANT")
    listed = kinds.add_parser("list", help="the keys: id, tenant, first characters, priority, share", formatter_class=_Wrapped)
    for q in (add, remove, listed):
        _add_serve_state(q)
        _add_json(q)


def _add_serve_state(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", default=os.environ.get("GATEKEEPER_STATE"), metavar="DIR",
                   help="the gateway's state folder: keys, batches' requests and results, the SQLite book (default "
                   "GATEKEEPER_STATE, else the user's state folder's gateway/); one volume every replica mounts")


def _usage_mode(text: str) -> str:
    kind, _, arg = text.replace("count-", "count:", 1).partition(":")
    try:
        ok = text in ("count", "none") or (kind in ("count", "const") and int(arg) >= 0) or (kind == "scale" and float(arg) > 0) \
            or (kind == "noisy" and 0 <= float(arg) < 1)
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r}: use count, count-K, scale:F, const:N, noisy:P (0 <= P < 1) or none")
    return text


def _add_no_preflight(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-preflight", action="store_true",
                   help="do not judge the input's models against the Models API (by default: whenever a workspace key is set)")
    p.add_argument("--token-sample", type=_non_negative_int, default=50, metavar="N",
                   help="requests per model counted with count_tokens for the input-token estimate (default 50; 0: bytes / 4)")


PLATFORM_HELP = (f"where the Batches API runs: {', '.join(PLATFORMS)} (default anthropic, or GATEKEEPER_PLATFORM), "
                 "each read from the environment as its SDK client reads it (docs/aws.md, docs/google.md; foundry "
                 "serves no batches)")


def _add_platform(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-version", choices=API_VERSIONS, default=None, metavar="VERSION",
                   help=f"the anthropic-version sent on every call: {API_VERSION} (the default; or "
                   f"GATEKEEPER_API_VERSION) or {STRICT_VERSION} (refuses temperature, top_p, top_k, document blocks "
                   "in assistant messages and citations on user text: such lines are rejected before sending). A job "
                   "keeps the version it started with")
    p.add_argument("--platform", choices=PLATFORMS, default=None, help=PLATFORM_HELP)


def _add_reading_platform(p: argparse.ArgumentParser) -> None:
    """A command that only reads a job (no call): the platform names the account its job in a --journal went to."""
    p.add_argument("--platform", choices=PLATFORMS, default=None,
                   help=f"{PLATFORM_HELP}; here only the account whose job a --journal database holds for INPUT")


def _add_max_rpm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-rpm", type=_positive_float, default=None, metavar="N",
                   help="calls a minute to the batch endpoints at most, all keys together (default: the platform's, 300 "
                   "on anthropic, 50 where a workspace starts at Tier 1: aws, google; the organization's limit is "
                   "shared with its other pipelines)")


def _add_ledger(p: argparse.ArgumentParser, *, default: str = "host") -> None:
    p.add_argument("--ledger", default=os.environ.get("GATEKEEPER_LEDGER"), metavar="URL",
                   help=f"the admission ledger creates go through (default: {default}; or GATEKEEPER_LEDGER): host "
                   "(this user's on this machine, in the state folder, GATEKEEPER_HOME), a URL several hosts share "
                   "(redis://HOST:PORT/DB, postgresql://USER@HOST:PORT/DB, sqlite:///PATH), or none (ownership after "
                   "a lost create answer then rests on usage alone)")


def _add_journal(p: argparse.ArgumentParser, *, lease: bool = True) -> None:
    """`lease`: the command runs the job (submit), else it only reads one."""
    p.add_argument("--journal", default=os.environ.get("GATEKEEPER_JOURNAL"), metavar="URL",
                   help=("keep the job's journal in PostgreSQL (postgresql://USER@HOST:PORT/DB; the password from "
                         "PGPASSWORD or ~/.pgpass, or GATEKEEPER_JOURNAL, so it is not in ps) so it resumes on any host; "
                         "default: SQLite in the state directory") if lease else
                   ("read the job from this PostgreSQL journal (postgresql://USER@HOST:PORT/DB, or GATEKEEPER_JOURNAL) "
                    "instead of a state directory; name it with --job"))
    p.add_argument("--job", default=None, metavar="NAME",
                   help="the job's name in a --journal database (default: from the input's sha256 and the API key)")
    if not lease:
        return
    p.add_argument("--lease-ttl", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="a --journal job held by a run that stopped heartbeating is free after SECONDS (default 60)")


def _add_prices(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prices", default=None, metavar="FILE",
                   help="price table (JSON, the shape of gatekeeper/prices.json) for cost estimates")


def _add_run(p: argparse.ArgumentParser) -> None:
    """The run a command reads: its INPUT (state beside it) or --state DIR."""
    p.add_argument("input", nargs="?", help="the run's input (its state is INPUT.gatekeeper/), or give --state; a "
                   "table: its table job's current run")
    _add_state(p)
    _add_journal(p, lease=False)


def _add_table(p: argparse.ArgumentParser) -> None:
    """A table job's options: INPUT is then a table (Parquet, CSV, Arrow IPC; local or object storage)."""
    g = p.add_argument_group("table jobs (INPUT a .parquet, .csv or .arrow table, local or s3://, gs://, az://)")
    g.add_argument("--template", default=None, metavar="TEXT",
                   help="the user prompt, with {column} fields ({{ and }} for braces), or @FILE to read it")
    g.add_argument("--system", default=None, metavar="TEXT", help="a system prompt, with {column} fields, or @FILE")
    g.add_argument("--model", default=None, metavar="MODEL", help="the model of every row's request")
    g.add_argument("--max-tokens", type=_positive_int, default=None, metavar="N", help="max_tokens of every request")
    g.add_argument("--id-column", default=None, metavar="COL",
                   help="the column that names each row (unique; any value); default: a row is its rendered request")
    g.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="another request parameter (VALUE as JSON, else text), e.g. --param temperature=0")
    g.add_argument("--encoding", default=None, metavar="NAME",
                   help="a CSV's encoding (default UTF-8; a CSV that is not is refused, naming what it looks like), "
                   "e.g. --encoding cp1252")
    g.add_argument("--infer-types", action="store_true",
                   help="read a CSV's column types as pyarrow infers them from its first 4 MB (default: every "
                   "column as text, as written: 02134 stays 02134)")


def _add_state(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", default=None, metavar="DIR", help="the run's state directory (default INPUT.gatekeeper/ beside the input; a table's: "
                   "the user's state folder's tables/NAME-DIGEST/)")


class _OldName(argparse.Action):
    """A flag's old name, still taken: stores as the new one does, with one warning line naming the new."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        new = next(a for a in parser._actions if a.dest == self.dest and a is not self).option_strings[0]
        print(f"gatekeeper: warning: {option_string} is deprecated: use {new} (it means the same)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add_interval(p: argparse.ArgumentParser, what: str) -> None:
    """The one flag for the time between readings, in every command that reads again and again."""
    p.add_argument("--interval", type=_positive_float, default=30.0, metavar="SECONDS",
                   help=f"seconds {what} (default 30; never faster than --max-rpm allows)")


def _add_reconcile_grace(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reconcile-grace", type=_positive_float, default=180.0, metavar="SECONDS",
                   help="how long a create whose answer was lost (a timeout, a reset, a 5xx without a typed code) may "
                   "take to appear in the listing before it is taken as not created (default 180)")


def _add_margin(p: argparse.ArgumentParser) -> None:
    p.add_argument("--margin", type=_non_negative_int, default=0, metavar="N",
                   help="requests of queue headroom to leave for others (default 0)")


def _add_ceiling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ceiling", type=_positive_int, default=None, metavar="N",
                   help="the organization's enqueued_batch_requests, when no Admin key can read it")
