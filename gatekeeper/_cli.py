"""The `gatekeeper` command: parsing, wiring and printing only.

Exit codes mean the same in every command: 0 all good, 1 finished with
findings, 2 usage or configuration error, 130 interrupted.

Each command imports what it uses when it runs: `--version`, `--help` and
`plan` never load httpx or anyio, so the command starts as fast as Python does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from . import __version__
from ._errors import ExitCode, GatekeeperError, UsageError
from ._wire import API_MAX_BYTES, API_MAX_REQUESTS

if TYPE_CHECKING:
    from pathlib import Path

    from ._config import ApiConfig
    from ._headroom import Headroom
    from ._ledger import Reservation
    from ._planner import PlanReport
    from ._settings import SubmitSettings
    from ._sizing import Limits
    from ._summary import Summary


# Library settings named in errors -> the flag or variable a CLI user sets.
FLAGS = {"out": "--out", "state_dir": "--state", "ledger": "--ledger", "only": "--only", "ceiling": "--ceiling",
         "max_requests": "--max-requests", "max_bytes": "--max-bytes", "prices": "--prices", "port": "--port",
         "base_url": "ANTHROPIC_BASE_URL", "admin_key": "ANTHROPIC_ADMIN_KEY",
         "api_key": "ANTHROPIC_API_KEY or ANTHROPIC_EXTRA_WORKSPACE_KEYS",
         "allow_duplicate": "--allow-duplicate to run it anyway"}


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
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (_plan_parser, _status_parser, _submit_parser, _results_parser, _cancel_parser, _report_parser,
                _exporter_parser, _fake_api_parser):
        add(sub)
    return parser




def _command(sub: argparse._SubParsersAction[_Parser], name: str, *, help: str, description: str) -> _Parser:  # noqa: A002
    """A subcommand whose description keeps its line breaks (its "Example usage:" block)."""
    return sub.add_parser(name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)


def _plan_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "plan", help="validate and size a JSONL of batch requests (dry run, nothing sent)",
                 description="Validate every line and cut the input into legal batches. Nothing is sent.\n\n"
                 "Example usage:\n  gatekeeper plan requests.jsonl\n  gatekeeper plan - --json < requests.jsonl")
    p.add_argument("input", help="JSONL file of {custom_id, params} lines, or - for standard input")
    _add_limits(p)
    _add_prices(p)
    _add_no_preflight(p)
    _add_max_rpm(p)
    p.add_argument("--workers", type=_non_negative_int, default=None, metavar="N",
                   help="processes that validate a file in parallel (default: 2 on two or more cores for files over 64 MB; 0: one process)")
    _add_json(p)


def _status_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "status", help="queue depth against the organization's ceiling, with a verdict",
                 description="Read the batch queue: the enqueued_batch_requests ceiling (Admin API, or --ceiling) "
                 "and the depth over every workspace key. Read only.\n\nEnvironment: ANTHROPIC_API_KEY, "
                 "ANTHROPIC_EXTRA_WORKSPACE_KEYS, ANTHROPIC_ADMIN_KEY, ANTHROPIC_BASE_URL.\n\n"
                 "Example usage:\n  gatekeeper status\n  gatekeeper status --threshold 90 --json")
    _add_ceiling(p)
    p.add_argument("--threshold", type=_percent, default=80, metavar="PCT",
                   help="occupancy (percent) at which the queue is a finding (default 80)")
    p.add_argument("--watch", type=_positive_float, nargs="?", const=30.0, default=None, metavar="SECONDS",
                   help="re-read every SECONDS (default 30; never faster than --max-rpm allows) until Ctrl-C: one "
                   "screen redrawn on a terminal, one JSON object a reading otherwise or with --json")
    _add_ledger(p)
    _add_max_rpm(p)
    _add_json(p)


def _submit_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "submit", help="run the whole job: admit batches against headroom, collect, resubmit, resume",
                 description="Validate and size INPUT, then create batches only as the queue can take them, "
                 "collect their results into one output file, resubmit what can succeed on another try, until "
                 "every valid request has a final result. Rerun the same command to resume.\n\n"
                 "State: INPUT.gatekeeper/ beside the input (or --state); results: STATE/results.jsonl (or --out).\n\n"
                 "Example usage:\n  gatekeeper submit big.jsonl\n  gatekeeper submit big.jsonl --dry-run\n"
                 "  gatekeeper submit big.jsonl --json --poll 60 > summary.json")
    p.add_argument("input", help="JSONL file of {custom_id, params} lines")
    _add_state(p)
    p.add_argument("--out", default=None, metavar="FILE", help="results file (default STATE/results.jsonl)")
    _add_ceiling(p)
    p.add_argument("--margin", type=_non_negative_int, default=0, metavar="N",
                   help="requests of queue headroom to leave for others (default 0)")
    p.add_argument("--poll", type=_positive_float, default=30.0, metavar="SECONDS",
                   help="seconds between queue readings (default 30)")
    p.add_argument("--max-in-flight", type=_positive_int, default=None, metavar="N",
                   help="our batches live at once, at most (default: as many as fit)")
    p.add_argument("--max-attempts", type=_positive_int, default=3, metavar="N",
                   help="attempts per request, the first included, for results that can succeed on another try (default 3)")
    p.add_argument("--reconcile-grace", type=_positive_float, default=180.0, metavar="SECONDS",
                   help="how long a create whose answer was lost may take to appear in the listing before it is "
                   "taken as not created (default 180)")
    _add_limits(p)
    _add_prices(p)
    _add_ledger(p)
    p.add_argument("--ledger-ttl", type=_positive_float, default=900.0, metavar="SECONDS",
                   help="how long a dead submitter's reservations outlive its last heartbeat (default 900)")
    p.add_argument("--results-grace", type=_positive_float, default=3600.0, metavar="SECONDS",
                   help="how long after a batch ends a 404 or a missing results_url is waited out before its requests "
                   "are reported as results unavailable (default 3600)")
    _add_no_preflight(p)
    p.add_argument("--budget", type=_positive_float, default=None, metavar="USD",
                   help="spend at most this much (batch prices, worst case counted before each create); a rerun "
                   "with a higher budget continues")
    p.add_argument("--allow-duplicate", action="store_true",
                   help="run even while another job with the same input and workspace is live in the --ledger")
    _add_max_rpm(p)
    p.add_argument("--dry-run", action="store_true", help="plan plus live headroom: what would go now and what would wait")
    _add_json(p)


def _results_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "results", help="re-export a run's final results (also while it runs)",
                 description="Write the final result lines of a submit run: all, filtered, or in input order. "
                 "While the run goes on, this is what is final so far.\n\nExample usage:\n"
                 "  gatekeeper results big.jsonl --in-order --out ordered.jsonl\n"
                 "  gatekeeper results --state job.state --only errored,expired")
    _add_run(p)
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of standard output")
    p.add_argument("--in-order", action="store_true", help="in input order (default: the order results arrived)")
    p.add_argument("--only", default=None, metavar="TYPES",
                   help="comma-separated result types (succeeded, errored, expired, canceled) and/or error types")
    _add_prices(p)
    _add_json(p)


def _cancel_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "cancel", help="cancel a run's live batches and record it",
                 description="Cancel the live batches of a submit run; a rerun of submit then sends nothing new and "
                 "collects what ended.\n\nExample usage:\n  gatekeeper cancel big.jsonl\n  gatekeeper cancel --state /data/job.state")
    _add_run(p)
    _add_max_rpm(p)
    _add_json(p)


def _report_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "report", help="one self-contained HTML page of a run: the queue over time, every batch, outcomes",
                 description="Draw a run from its journal alone (finished, running or interrupted): the queue "
                 "against the ceiling with our share, every batch from create to end, results and errors by type, "
                 "retries, tokens and cost, settings and the input's identity. No scripts, no network.\n\n"
                 "Example usage:\n  gatekeeper report big.jsonl\n  gatekeeper report --state job.state --out night.html\n"
                 "  gatekeeper report big.jsonl --json")
    _add_run(p)
    p.add_argument("--out", default=None, metavar="FILE", help="the HTML file (default STATE/report.html)")
    _add_prices(p)
    _add_json(p)


def _exporter_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "exporter", help="serve Prometheus metrics of the queue and of runs",
                 description="Read the queue every --interval seconds (never once per scrape) and serve the last "
                 "reading as Prometheus metrics, with the figures of the runs given by --state. Needs "
                 "pip install 'gatekeeper[exporter]'.\n\nExample usage:\n  gatekeeper exporter --port 9465\n"
                 "  gatekeeper exporter --port 9465 --state /data/night.state --ledger redis://ledger:6379/0")
    p.add_argument("--port", type=_port, default=9465, help="port to serve on (default 9465; 0: any free port)")
    p.add_argument("--listen", default="127.0.0.1", metavar="ADDR", help="address to serve on (default 127.0.0.1: loopback)")
    p.add_argument("--interval", type=_positive_float, default=30.0, metavar="SECONDS",
                   help="seconds between readings (default 30; never faster than --max-rpm allows)")
    p.add_argument("--state", action="append", default=[], metavar="DIR", help="a run's state directory (repeatable)")
    _add_ceiling(p)
    p.add_argument("--threshold", type=_percent, default=80, metavar="PCT", help="occupancy at which the verdict is near-limit")
    _add_ledger(p)
    _add_prices(p)
    _add_max_rpm(p)
    _add_json(p)


def _fake_api_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = _command(sub, "fake-api", help="run the fake Batches API on loopback for offline rehearsal",
                 description="Serve the fake Message Batches API (gatekeeper.testing) until interrupted.\n\n"
                 "Example usage:\n  gatekeeper fake-api --port 8765 --ceiling 300000 --rate 5000 --speed 60\n"
                 "  ANTHROPIC_BASE_URL=http://127.0.0.1:8765 ANTHROPIC_API_KEY=test-key-ws1 gatekeeper status")
    p.add_argument("--port", type=_port, default=0, help="port on 127.0.0.1 (default: any free port)")
    p.add_argument("--ceiling", type=_positive_int, default=300_000, metavar="N", help="enqueued_batch_requests (default 300,000)")
    p.add_argument("--rate", type=_positive_float, default=5_000.0, help="requests processed per simulated second (default 5,000)")
    p.add_argument("--speed", type=_positive_float, default=1.0, help="simulated seconds per real second (default 1)")
    p.add_argument("--workspace-key", action="append", default=None, metavar="KEY",
                   help="a workspace key the fake accepts (repeatable; default test-key-ws1)")
    p.add_argument("--admin-key", default="test-admin-key", metavar="KEY", help="the Admin key it accepts")
    p.add_argument("--error-model", default=None, metavar="MODEL",
                   help="requests for this model end errored with invalid_request_error (a model that does not exist)")
    _add_json(p)


def _add_no_preflight(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-preflight", action="store_true",
                   help="do not judge the input's models against the Models API (by default: whenever a workspace key is set)")
    p.add_argument("--token-sample", type=_non_negative_int, default=50, metavar="N",
                   help="requests per model counted with count_tokens for the input-token estimate (default 50; 0: bytes / 4)")


def _add_max_rpm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-rpm", type=_positive_float, default=300.0, metavar="N",
                   help="calls a minute to the batch endpoints at most, all keys together (default 300; the "
                   "organization's limit, 1,000 on the smallest tier, is shared with its other pipelines)")


def _add_ledger(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", default=None, metavar="URL",
                   help="shared admission ledger for several submitters: sqlite:///PATH (one host) or "
                   "redis://HOST:PORT/DB (many hosts); default: in-process")


def _add_prices(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prices", default=None, metavar="FILE",
                   help="price table (JSON, the shape of gatekeeper/prices.json) for cost estimates")


def _add_run(p: argparse.ArgumentParser) -> None:
    """The run a command reads: its INPUT (state beside it) or --state DIR."""
    p.add_argument("input", nargs="?", help="the run's input (its state is INPUT.gatekeeper/), or give --state")
    _add_state(p)


def _add_state(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", default=None, metavar="DIR", help="the run's state directory (default INPUT.gatekeeper/ beside the input)")


def _state_dir(args: argparse.Namespace) -> Path:
    from pathlib import Path

    if args.state:
        return Path(args.state)
    if getattr(args, "input", None) and args.input != "-":
        from ._settings import default_state_dir

        return default_state_dir(args.input)
    raise UsageError("give the run's INPUT or --state DIR")


def _add_ceiling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ceiling", type=_positive_int, default=None, metavar="N",
                   help="the organization's enqueued_batch_requests, when no Admin key can read it")


def _limits(args: argparse.Namespace) -> Limits:
    from ._sizing import Limits

    try:
        return Limits(max_requests=args.max_requests, max_bytes=args.max_bytes)
    except ValueError as exc:
        raise UsageError(f"--max-requests/--max-bytes: {exc}") from None


def orjson_line(obj: Any) -> str:
    import orjson

    return orjson.dumps(obj).decode()


def _print_json(obj: Any) -> None:
    import orjson

    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def cmd_plan(args: argparse.Namespace) -> int:
    from ._parallel import auto_workers
    from ._planner import plan
    from ._prices import load_prices

    prices = load_prices(args.prices)
    workers = args.workers if args.workers is not None else auto_workers(args.input)
    config = _api_config(required=False)
    check = config is not None and not args.no_preflight and args.input != "-"  # (stdin cannot be read twice)
    report = plan(args.input, limits=_limits(args), workers=workers, models={} if check else None)
    if config is not None and check:
        report = _preflight_plan(args, config, report, workers)
    estimate = report.estimate(prices)
    if args.json:
        _print_json({**report.to_json(), "estimate": estimate})
    else:
        print(render_plan(report, args.input))
        cost = "unknown (a model has no price)" if estimate["input_cost_usd"] is None else f"~${estimate['input_cost_usd']:,.2f}"
        print(f"estimate        ~{estimate['input_tokens']:,} input tokens, {cost} at batch prices ({estimate['method']})")
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _preflight_plan(args: argparse.Namespace, config: ApiConfig, report: PlanReport, workers: int | None) -> PlanReport:
    """Judge the planned input's models against the Models API; plan again only when some line can fail."""
    import anyio

    from ._calibrate import calibrate
    from ._planner import plan
    from ._preflight import check_models, needs_second_pass, outcome
    from ._queue import connect

    async def check() -> Any:
        async with connect(config, max_rpm=args.max_rpm) as conn:
            return await check_models(conn.primary, report.models)

    pf = anyio.run(check)
    if not pf.checked:
        print(f"gatekeeper: warning: {pf.reason}", file=sys.stderr)
    if needs_second_pass(pf, report.max_tokens_peak):
        report = plan(args.input, limits=_limits(args), workers=workers, models=pf.rules())
    report.preflight = outcome(pf, report.errors)

    async def measure() -> Any:
        async with connect(config, max_rpm=args.max_rpm) as conn:
            return await calibrate(conn.primary, args.input, report.model_bytes, args.token_sample)

    if args.token_sample == 0:
        return report
    report.calibration = anyio.run(measure)
    if not report.calibration.get("measured"):
        print(f"gatekeeper: warning: {report.calibration.get('reason')}; the estimate is bytes / 4", file=sys.stderr)
    return report


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
    pf = report.preflight
    if pf is not None:
        if pf["checked"]:
            names = ", ".join(f"{n}" + (f" -> {m['resolved']}" if m["resolved"] not in (None, n) else "")
                              + (f" (rejected {m['lines_rejected']:,} lines)" if m.get("lines_rejected") else "")
                              for n, m in sorted(pf["models"].items()))
            out.append(f"models checked  {names} (Models API)")
        else:
            out.append(f"models          not checked: {pf['reason']}")
    if report.requests:
        out.append(f"largest request {report.largest_bytes:,} bytes (line {report.largest_line}, {report.largest_custom_id})")
        out.append("models")
        for model, n in sorted(report.models.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {n:>9,}  {model}")
    return "\n".join(out)


def cmd_status(args: argparse.Namespace) -> int:
    import anyio

    from ._headroom import FINDINGS

    config = _api_config()
    read = _status_reader(args, config)
    if args.watch is not None:
        return _watch_status(args, config, read)
    h, reservations = anyio.run(read)
    report = status_report(h, reservations, args.threshold)
    if args.json:
        _print_json(report)
    else:
        print(render_status(report))
    return ExitCode.FINDINGS if report["verdict"] in FINDINGS else ExitCode.OK


def _status_reader(args: argparse.Namespace, config: ApiConfig) -> Callable[[], Any]:
    """One reading of the queue (and the ledger's reservations with --ledger), as an async function."""
    from ._ledger import open_ledger
    from ._queue import connect, read_headroom

    async def read() -> tuple[Headroom, list[Reservation] | None]:
        async with connect(config, max_rpm=args.max_rpm) as conn:
            h = await read_headroom(conn, ceiling=args.ceiling)
        if not args.ledger:
            return h, None
        ledger = open_ledger(args.ledger, owner="status")
        try:
            await ledger.ping()
            return h, await ledger.reservations()
        finally:
            await ledger.close()

    return read


def _watch_status(args: argparse.Namespace, config: ApiConfig, read: Callable[[], Any]) -> int:
    """status --watch: until Ctrl-C (exit 0); never faster than the call budget allows."""
    import anyio

    from ._watch import min_interval, watch

    interval = max(args.watch, min_interval(len(config.workspace_keys), args.max_rpm))
    tty = sys.stdout.isatty() and not args.json

    def reading() -> dict[str, Any]:
        h, reservations = anyio.run(read)
        return status_report(h, reservations, args.threshold)

    try:
        watch(reading, render_status, interval=interval, tty=tty, out=sys.stdout)
    except KeyboardInterrupt:
        pass
    return ExitCode.OK


def status_report(h: Headroom, reservations: list[Reservation] | None, threshold: int) -> dict[str, Any]:
    """One reading as the JSON `status --json` prints (and the human report is drawn from)."""
    from ._headroom import SCOPE_CAVEAT, repair_lines, verdict

    state, detail = verdict(h, threshold)
    source = "the Rate Limits API" if h.ceiling_source == "admin-api" else h.ceiling_source or "nowhere"
    return {
        "verdict": state, "detail": detail, "ceiling": h.ceiling, "ceiling_source": h.ceiling_source,
        "ceiling_error": h.ceiling_error, "depth": h.depth, "remaining": h.remaining,
        "occupancy": None if h.occupancy is None else round(h.occupancy, 4), "threshold": threshold,
        "workspaces": h.workspaces, "batches": [b.to_json() for b in h.batches],
        "measured": f"enqueued_batch_requests from {source}; the sum of request_counts.processing over "
                    f"{len(h.batches)} live batch(es) in {h.workspaces} workspace(s)",
        "inferred": SCOPE_CAVEAT, "repair": repair_lines(state, h),
        "ledger": None if reservations is None else {
            "reserved": sum(r.requests for r in reservations), "reservations": [r.to_json() for r in reservations]},
    }


def render_status(r: dict[str, Any]) -> str:
    ceiling = "unknown" if r["ceiling"] is None else format(r["ceiling"], ",")
    why = r["ceiling_source"] or r["ceiling_error"]
    batches = r["batches"]
    out = [f"{r['verdict']:<20} {r['detail']}", f"  ceiling   {ceiling}" + (f" ({why})" if why else ""),
           f"  depth     {r['depth']:,} in {len(batches)} live batch(es), {r['workspaces']} workspace(s)"]
    out += [f"    {b['id']:<34} {b['workspace']:<4} {b['status']:<12} {b['processing']:>9,}" for b in batches[:5]]
    if len(batches) > 5:
        out.append(f"    ... and {len(batches) - 5} more")
    out += [f"  measured: {r['measured']}", f"  inferred: {r['inferred']}"] + [f"  repair: {line}" for line in r["repair"]]
    ledger = r["ledger"]
    if ledger is not None:
        owners = {x["owner"] for x in ledger["reservations"]}
        out.append(f"  ledger    {ledger['reserved']:,} requests reserved by {len(owners)} submitter(s), "
                   f"beside the observed depth {r['depth']:,}")
        out += [f"    {x['owner']:<36} batch {x['batch']:<5} {x['requests']:>9,}  {x['batch_id'] or '(creating)'}  "
                f"expires in {x['expires_in']:,.0f} s" for x in ledger["reservations"][:10]]
    return "\n".join(out)


def _crash_hook(spec: str | None) -> Callable[[str], None]:
    """GATEKEEPER_CRASH_AT=point[:n]: SIGKILL ourselves the n-th time `point` is reached (the crash tests use it)."""
    import signal

    if not spec:
        return lambda name: None
    point, _, nth = spec.partition(":")
    remaining = [int(nth or 1)]

    def checkpoint(name: str) -> None:
        if name == point:
            remaining[0] -= 1
            if remaining[0] <= 0:
                os.kill(os.getpid(), signal.SIGKILL)

    return checkpoint


@overload
def _api_config(*, required: Literal[True] = True) -> ApiConfig: ...
@overload
def _api_config(*, required: bool) -> ApiConfig | None: ...
def _api_config(*, required: bool = True) -> ApiConfig | None:
    """The API's URL and keys, from the environment (the one place the CLI reads them); None when not required
    and no workspace key is set."""
    from ._config import ApiConfig

    config = ApiConfig.from_env(os.environ)
    if not config.workspace_keys and not required:
        return None
    if not config.workspace_keys:
        raise UsageError("set ANTHROPIC_API_KEY to a workspace API key (and ANTHROPIC_EXTRA_WORKSPACE_KEYS, "
                         "comma-separated, to cover more workspaces of the organization)")
    return config


def _submit_settings(args: argparse.Namespace) -> SubmitSettings:
    from pathlib import Path

    from ._settings import SubmitSettings

    return SubmitSettings(
        state_dir=_state_dir(args), out=Path(args.out) if args.out else None, ceiling=args.ceiling, margin=args.margin,
        poll=args.poll, max_in_flight=args.max_in_flight, max_attempts=args.max_attempts, limits=_limits(args),
        reconcile_grace=args.reconcile_grace, min_backoff=min(5.0, args.poll * 2),
        ledger=args.ledger, ledger_ttl=args.ledger_ttl, results_grace=args.results_grace, max_rpm=args.max_rpm,
        allow_duplicate=args.allow_duplicate, preflight=not args.no_preflight, budget=args.budget,
        token_sample=args.token_sample,
    )


def cmd_submit(args: argparse.Namespace) -> int:
    import anyio

    from ._prices import load_prices
    from ._submit import dry_run

    if args.input == "-":
        raise UsageError("submit needs a file it can read again on resume, not standard input: save it first")
    config = _api_config()
    settings = _submit_settings(args)
    if not args.dry_run:
        return _submit_run(args, config, settings)
    prices = load_prices(args.prices)
    result = anyio.run(lambda: dry_run(args.input, config=config, settings=settings, prices=prices))
    if args.json:
        _print_json(result)
    else:
        print(render_plan_brief(result))
    return ExitCode.OK if result["plan"]["invalid"] == 0 else ExitCode.FINDINGS


def _submit_run(args: argparse.Namespace, config: ApiConfig, settings: SubmitSettings) -> int:
    """The whole job, with progress on stderr; Ctrl-C stops at the next safe point, twice at once."""
    import shlex

    import anyio

    from ._errors import Interrupted
    from ._prices import load_prices
    from ._progress import Progress
    from ._submit import submit

    progress = Progress(sys.stderr, "json" if args.json or not sys.stderr.isatty() else "tty")
    prices = load_prices(args.prices)

    async def run(stop: anyio.Event) -> Summary:
        return await submit(args.input, config=config, settings=settings, on_event=progress, stop=stop,
                            checkpoint=_crash_hook(os.environ.get("GATEKEEPER_CRASH_AT")), prices=prices)

    try:
        summary = anyio.run(_with_signals, run, progress.close)
    except Interrupted:
        progress.close()
        resume = "gatekeeper " + " ".join(shlex.quote(a) for a in args.argv)
        print(f"gatekeeper: interrupted; batches already created keep processing. Resume with: {resume}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    finally:
        progress.close()
    if args.json:
        _print_json(summary.to_json())
    else:
        print(render_summary(summary))
    return ExitCode.OK if summary.ok else ExitCode.FINDINGS


async def _with_signals(body: Callable[[Any], Any], on_stop: Callable[[], None]) -> Any:
    """Run `body(stop)` with SIGINT/SIGTERM setting `stop`; a second signal exits at once (the journal is
    consistent at every instant). Errors are re-raised as they are, not wrapped by the task group."""
    import signal

    import anyio

    stop = anyio.Event()
    outcome: list[Any] = []
    failure: list[BaseException] = []

    async def watch() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if stop.is_set():
                    os._exit(ExitCode.INTERRUPTED)
                stop.set()
                on_stop()
                print("gatekeeper: stopping at the next safe point (Ctrl-C again to exit at once)", file=sys.stderr)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            outcome.append(await body(stop))
        except Exception as exc:
            failure.append(exc)
        finally:
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0]


def render_plan_brief(r: dict[str, Any]) -> str:
    p = r["plan"]
    e = r["estimate"]
    ceiling = "unknown" if r["ceiling"] is None else f"{r['ceiling']:,}"
    cost = "unknown" if e["input_cost_usd"] is None else f"~${e['input_cost_usd']:,.2f}"
    return "\n".join([
        f"estimate        ~{e['input_tokens']:,} input tokens, {cost} at batch prices (output not included)",
        f"valid requests  {p['requests']:,}   rejected lines {p['invalid']:,}",
        f"batches         {len(p['batches']):,} of at most {r['batch_size']:,} requests ({r['policy']})",
        f"queue now       {r['depth']:,} of {ceiling}",
        f"would create    {r['would_create_now']:,} batch(es) now ({r['requests_now']:,} requests); {r['would_wait']:,} would wait",
        f"queue after     {r['queue_after']:,} of {ceiling}",
    ])


def render_summary(s: Summary) -> str:
    lines = [
        f"requests    {s.requests:,}   (rejected lines: {s.invalid:,})",
        f"succeeded   {s.succeeded:,}",
        f"errored     {s.errored:,}" + ("   " + ", ".join(f"{k} {v:,}" for k, v in sorted(s.errors.items())) if s.errors else ""),
        f"expired     {s.expired:,}",
        f"canceled    {s.canceled:,}",
    ]
    if s.pending:
        lines.append(f"not final   {s.pending:,}")
    lines.append(f"batches     {s.batches:,}   resubmitted {s.resubmitted:,} (succeeded later: {s.succeeded_after_retry:,})")
    u = s.usage
    if u:
        lines.append(f"tokens      input {u.get('input_tokens', 0):,} · output {u.get('output_tokens', 0):,} · "
                     f"cache write {u.get('cache_creation_input_tokens', 0):,} · cache read {u.get('cache_read_input_tokens', 0):,}")
    if s.cost_usd is not None:
        lines.append(f"cost        ~${s.cost_usd:,.2f} at batch prices")
    else:
        lines.append("cost        unknown: a model that succeeded has no price (give --prices FILE)")
    if s.budget is not None and s.budget["held_back"]:
        lines.append(f"budget      spent ${s.budget['spent'] or 0:,.2f} of ${s.budget['limit']:,.2f}; "
                     f"{s.budget['held_back']:,} requests not sent. Rerun with a higher --budget to continue "
                     "(nothing already sent is sent again)")
    lines.append(f"results     {s.output}")
    return "\n".join(lines)


def cmd_results(args: argparse.Namespace) -> int:
    from ._output import check_writable
    from ._prices import load_prices
    from ._results import export
    from ._submit import job_summary

    state = _state_dir(args)
    only = [t.strip() for t in args.only.split(",") if t.strip()] if args.only else None
    if args.json and not args.out:
        raise UsageError("results --json prints the summary: give --out FILE for the lines")
    if args.out:
        check_writable(args.out)
        with open(args.out, "wb") as f:
            count = export(state, f, in_order=args.in_order, only=only)
    else:
        count = export(state, sys.stdout.buffer, in_order=args.in_order, only=only)
        sys.stdout.flush()
    summary = job_summary(state, load_prices(args.prices))
    if args.json:
        _print_json({**summary.to_json(), "written": count, "written_to": args.out})
    elif args.out:
        print(render_summary(summary))
        print(f"wrote {count:,} line(s) to {args.out}")
    return ExitCode.OK if summary.ok else ExitCode.FINDINGS


def cmd_cancel(args: argparse.Namespace) -> int:
    import anyio

    from ._submit import cancel

    config = _api_config()
    result = anyio.run(lambda: cancel(_state_dir(args), config=config, max_rpm=args.max_rpm))
    if args.json:
        _print_json(result)
    else:
        for b in result["canceled"]:
            print(f"canceled batch {b['batch']} {b['id']} ({b['status']})")
        print(f"{len(result['canceled'])} batch(es) canceled; {result['not_sent']:,} planned requests will not be sent. "
              "Rerun submit to collect what ended.")
    return ExitCode.OK


def cmd_fake_api(args: argparse.Namespace) -> int:
    import time

    from .testing import FakeAPI, FakeConfig, Outcome

    keys = args.workspace_key or ["test-key-ws1"]
    bad_model = args.error_model
    config = FakeConfig(
        ceiling=args.ceiling, rate=args.rate, speed=args.speed,
        workspaces={k: f"wrkspc_{i + 1}" for i, k in enumerate(keys)}, admin_keys={args.admin_key},
        outcome=(lambda cid, model, attempt: Outcome("errored", "invalid_request_error", f"model: {model} not found")
                 if model == bad_model else None) if bad_model else None,
    )
    with FakeAPI(config, port=args.port) as fake:
        info = {"url": fake.url, "ceiling": args.ceiling, "rate": args.rate, "speed": args.speed, "workspaces": len(keys)}
        if args.json:
            _print_json(info)
        else:
            print(f"fake Batches API on {fake.url} (ceiling {args.ceiling:,}, {args.rate:,.0f} requests/s, speed x{args.speed:g}); "
                  f"{len(keys)} workspace key(s); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return ExitCode.OK


def cmd_report(args: argparse.Namespace) -> int:
    from ._output import check_writable
    from ._prices import load_prices
    from ._report import render_html, run_report

    state = _state_dir(args)
    data = run_report(state, load_prices(args.prices))
    if args.json:
        _print_json(data)
        return ExitCode.OK
    out = check_writable(args.out or str(state / "report.html"))
    with open(out, "w", encoding="utf-8") as f:
        f.write(render_html(data))
    print(f"wrote {out} ({data['status']}: {data['summary']['succeeded']:,} of {data['summary']['requests']:,} succeeded, "
          f"{len(data['batches']):,} batches)")
    return ExitCode.OK


def cmd_exporter(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import anyio

    from ._exporter import Snapshot, run_figures, serve
    from ._prices import load_prices
    from ._watch import min_interval

    config = _api_config()
    prices = load_prices(args.prices)
    snap = Snapshot()
    url, server = serve(snap, args.threshold, args.listen, args.port)
    interval = max(args.interval, min_interval(len(config.workspace_keys), args.max_rpm))
    if args.json:  # one line: a long-running command's output is read line by line
        print(orjson_line({"url": url, "interval": interval}), flush=True)
    else:
        print(f"serving Prometheus metrics on {url}, reading the queue every {interval:g} s; Ctrl-C stops it", flush=True)
    read = _status_reader(args, config)
    try:
        while True:
            try:
                h, reservations = anyio.run(read)
                runs = {Path(d).name: run_figures(Path(d), prices) for d in args.state}
            except GatekeeperError as exc:
                with snap.lock:
                    snap.errors += 1
                print(f"gatekeeper: reading failed, the last values are kept: {_for_cli(exc)}", file=sys.stderr, flush=True)
            else:
                with snap.lock:
                    snap.headroom, snap.reservations, snap.runs = h, reservations, runs
                    snap.read_at, snap.readings = time.time(), snap.readings + 1
            time.sleep(interval)
    except KeyboardInterrupt:
        return ExitCode.OK
    finally:
        server.shutdown()


COMMANDS = {"plan": cmd_plan, "status": cmd_status, "submit": cmd_submit, "results": cmd_results, "cancel": cmd_cancel,
            "report": cmd_report, "exporter": cmd_exporter, "fake-api": cmd_fake_api}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv)
        args.argv = argv
        if not args.command:
            parser.print_help(sys.stderr)
            return ExitCode.USAGE
        return int(COMMANDS[args.command](args))
    except GatekeeperError as exc:
        print(f"gatekeeper: {_for_cli(exc)}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("gatekeeper: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # Output piped into `head`: not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.OK


def _for_cli(exc: GatekeeperError) -> str:
    """The library's message, with the flag that sets the setting it names."""
    flag = FLAGS.get(getattr(exc, "setting", None) or "")
    text = str(exc).replace("\n", " ")
    return f"{text} ({flag})" if flag and flag not in text else text
