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

from .._errors import ExitCode, GatekeeperError, UsageError
from .._typing import TYPE_CHECKING
from .._wire import API_VERSION, API_VERSION_VARIABLE, CREDENTIAL_VARIABLES
from ._parser import build_parser
from ._render import render_plan, render_plan_brief, render_status, render_summary, retry_line, status_report

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from .._prices import PriceTable
    from ..api._config import ApiConfig
    from ..decide._headroom import Headroom
    from ..input._planner import PlanReport
    from ..input._sizing import Limits
    from ..run.job._settings import SubmitSettings
    from ..state._ledger import LedgerReading
    from ..testing import FakeAws
    from ..watch._exporter import RunFigures



# Library settings named in errors -> the flag or variable a CLI user sets.
FLAGS = {"out": "--out", "state_dir": "--state", "ledger": "--ledger", "only": "--only", "ceiling": "--ceiling",
         "max_requests": "--max-requests", "max_bytes": "--max-bytes", "prices": "--prices", "port": "--port",
         "base_url": "ANTHROPIC_BASE_URL", "admin_key": "ANTHROPIC_ADMIN_KEY",
         "api_key": "ANTHROPIC_API_KEY or ANTHROPIC_EXTRA_WORKSPACE_KEYS",
         "credentials": "the credentials (docs/credentials.md)", "identity_token": "ANTHROPIC_IDENTITY_TOKEN_FILE",
         "profile": "ANTHROPIC_PROFILE",
         "allow_duplicate": "--allow-duplicate to run it anyway", "journal": "--journal", "job": "--job",
         "lease_ttl": "--lease-ttl", "platform": "--platform (or GATEKEEPER_PLATFORM)",
         "api_version": "--api-version (or GATEKEEPER_API_VERSION)",
         "aws_region": "AWS_REGION", "aws_workspace": "ANTHROPIC_AWS_WORKSPACE_ID",
         "aws_credentials": "AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a role, or "
                            "ANTHROPIC_AWS_API_KEY"}


def _state_dir(args: argparse.Namespace) -> Path:
    from pathlib import Path

    if args.state:
        return Path(args.state)
    if getattr(args, "input", None) and args.input != "-":
        from ..run.job._settings import default_state_dir

        return default_state_dir(args.input)
    if getattr(args, "journal", None) and getattr(args, "job", None):
        return Path.cwd()  # a named job in a shared journal needs no local state to be read
    return _only_run_here()


def _only_run_here() -> Path:
    """Without INPUT or --state: the one run in the current directory (`*.gatekeeper` with a journal), as submit
    left it beside its input; none or several is a usage error naming them."""
    from pathlib import Path

    runs = sorted(p for p in Path.cwd().glob("*.gatekeeper") if (p / "journal.sqlite3").is_file())
    if len(runs) == 1:
        print(f"gatekeeper: the run in this directory: {runs[0].name}", file=sys.stderr)
        return runs[0]
    where = f"this directory holds {len(runs)} runs ({', '.join(p.name for p in runs[:5])})" if runs else \
        "this directory holds no run (INPUT.gatekeeper)"
    raise UsageError(f"give the run's INPUT or --state DIR: {where}")


def _job(args: argparse.Namespace) -> dict[str, str | None]:
    """The shared journal and job name a reading command (results, report, cancel) was given; the name, when not
    given, derived as submit derives it: from the INPUT's sha256 and ANTHROPIC_API_KEY."""
    if not args.journal or args.job:
        return {"journal": args.journal, "job": args.job}
    config = _optional_api_config(args)
    if not args.input or args.input == "-" or config is None:
        raise UsageError("a job in a --journal database is found by its name: give --job NAME (submit's summary "
                         "shows it), or the INPUT with the ANTHROPIC_API_KEY it was submitted with")
    from ..run.job._opening import job_name_of

    return {"journal": args.journal, "job": job_name_of(args.input, config)}


def _limits(args: argparse.Namespace) -> Limits:
    from ..input._sizing import Limits

    version = getattr(args, "api_version", None) or os.environ.get(API_VERSION_VARIABLE, "").strip() or API_VERSION
    try:
        return Limits(max_requests=args.max_requests, max_bytes=args.max_bytes, api_version=version)
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
    from .._prices import load_prices
    from ..checks._plan import plan_with_preflight
    from ..input._parallel import auto_workers
    from ._render import render_caching, render_deadline
    from ._tables import is_table_job, plan_table_command

    if is_table_job(args):
        return plan_table_command(args, _limits(args))
    prices = load_prices(args.prices)
    config = _optional_api_config(args)
    report = plan_with_preflight(
        args.input, config, limits=_limits(args), preflight=not args.no_preflight, token_sample=args.token_sample,
        workers=args.workers if args.workers is not None else auto_workers(args.input), peaks=args.deadline is not None,
        max_rpm=args.max_rpm, on_retry=_retry_notice(args), on_warning=_warn)
    estimate = report.estimate(prices)
    caching = report.caching(prices)
    deadline = None if args.deadline is None else _forecast(args, config, report, estimate)
    if args.json:
        _print_json({**report.to_json(), "estimate": estimate, "caching": caching,
                     **({"deadline": deadline} if deadline is not None else {})})
    else:
        print(render_plan(report, args.input))
        cost = "unknown (a model has no price)" if estimate["input_cost_usd"] is None else f"~${estimate['input_cost_usd']:,.2f}"
        print(f"estimate        ~{estimate['input_tokens']:,} input tokens, {cost} at batch prices ({estimate['method']})")
        if caching is not None:
            print(render_caching(caching))
        if deadline is not None:
            print(render_deadline(deadline))
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _forecast(args: argparse.Namespace, config: ApiConfig | None, report: PlanReport, estimate: dict[str, Any]
              ) -> dict[str, Any]:
    import time

    from ..checks._forecast import forecast_deadline

    return forecast_deadline(report, estimate, deadline=args.deadline, now=time.time(), config=config,
                             turnaround=args.turnaround, slack=args.deadline_slack, max_rpm=args.max_rpm,
                             on_retry=_retry_notice(args))


def _warn(text: str) -> None:
    print(f"gatekeeper: warning: {text}", file=sys.stderr)


def _run_command(args: argparse.Namespace) -> int:
    """The command, with an orchestrator's stop (SIGTERM: `kill`, `docker stop`, systemd) made a Ctrl-C: 130, or as
    the commands that run until stopped end on Ctrl-C (`fake-api` saying what it received); never cut off. (`submit`
    listens for both itself while it runs; `plan`'s workers are reaped.) The caller's handler is put back after, for
    a process that calls `main()` and goes on."""
    import signal

    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(COMMANDS[args.command](args))
    finally:
        signal.signal(signal.SIGTERM, before)


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


def cmd_status(args: argparse.Namespace) -> int:
    import anyio

    from ..decide._headroom import FINDINGS

    config = _api_config(args)
    read = _status_reader(args, config)
    if args.watch:
        return _watch_status(args, config, read)
    h, ledger = anyio.run(read)
    report = status_report(h, ledger, args.threshold, config.platform)
    if args.json:
        _print_json(report)
    else:
        print(render_status(report))
    return ExitCode.FINDINGS if report["verdict"] in FINDINGS else ExitCode.OK


def _status_reader(args: argparse.Namespace, config: ApiConfig) -> Callable[[], Any]:
    """One reading of the queue (and, with --ledger, the ledger's reservations and jobs), as an async function."""
    from ..api._queue import connect, read_headroom
    from ..state._ledger import LedgerReading, open_ledger

    async def read() -> tuple[Headroom, LedgerReading | None]:
        async with connect(config, max_rpm=args.max_rpm, on_retry=_retry_notice(args)) as conn:
            h = await read_headroom(conn, ceiling=args.ceiling)
        if not args.ledger:
            return h, None
        ledger = open_ledger(args.ledger, owner="status", namespace=config.scope)
        try:
            await ledger.ping()
            live = [r for r in await ledger.reservations() if r.live]  # (not the names of released batches)
            return h, LedgerReading(live, await ledger.claims())
        finally:
            await ledger.close()

    return read


def _watch_status(args: argparse.Namespace, config: ApiConfig, read: Callable[[], Any]) -> int:
    """status --watch: until Ctrl-C (exit 0); never faster than the call budget allows."""
    import anyio

    from ..watch._watch import min_interval, watch

    every = args.interval if args.watch is True else float(args.watch)  # (`--watch 5` is `--watch --interval 5`)
    interval = max(every, min_interval(config.reads, args.max_rpm or config.default_rpm))
    tty = sys.stdout.isatty() and not args.json

    async def reading() -> dict[str, Any]:
        h, ledger = await read()
        return status_report(h, ledger, args.threshold, config.platform)

    try:
        anyio.run(lambda: watch(reading, render_status, interval=interval, tty=tty, out=sys.stdout))
    except KeyboardInterrupt:
        pass
    return ExitCode.OK


def _retry_notice(args: argparse.Namespace) -> Callable[[dict[str, Any]], None]:
    """A retried call, told on stderr: a JSON event with --json, else one line (nobody waits in silence)."""
    def notice(fields: dict[str, Any]) -> None:
        if getattr(args, "json", False):
            print(orjson_line({"event": "retrying", **fields}), file=sys.stderr, flush=True)
        else:
            print(f"gatekeeper: {retry_line(fields)}", file=sys.stderr, flush=True)

    return notice


def _api_config(args: argparse.Namespace) -> ApiConfig:
    """The API's URL and keys, from the environment (the one place the CLI reads them): the first-party API's, or
    Claude Platform on AWS's with `--platform aws` (or GATEKEEPER_PLATFORM=aws)."""
    from ..api._config import ApiConfig

    config = ApiConfig.from_env(os.environ, getattr(args, "platform", None), getattr(args, "api_version", None))
    if not config.has_credentials:
        raise UsageError("no credentials: set ANTHROPIC_API_KEY to a workspace API key (ANTHROPIC_EXTRA_WORKSPACE_KEYS "
                         "for the others), or ANTHROPIC_AUTH_TOKEN, ANTHROPIC_PROFILE, or workload identity federation "
                         "(ANTHROPIC_IDENTITY_TOKEN_FILE, ANTHROPIC_FEDERATION_RULE_ID, ANTHROPIC_ORGANIZATION_ID): "
                         "see docs/credentials.md", setting="credentials")
    return config


def _optional_api_config(args: argparse.Namespace) -> ApiConfig | None:
    """As `_api_config`, or None when no workspace key is set (`plan` and `status` work without one)."""
    platform = getattr(args, "platform", None) or os.environ.get("GATEKEEPER_PLATFORM")
    if platform in (None, "", "anthropic") and not _may_have_credentials():
        return None  # (without importing the configuration, 33 M instructions of `plan`'s start)
    from ..api._config import ApiConfig

    config = ApiConfig.from_env(os.environ, platform, getattr(args, "api_version", None))
    return config if config.has_credentials else None


def _may_have_credentials() -> bool:
    """Whether the environment may hold a credential, known without reading one: a variable of the SDK's chain, or
    a profile in the default config directory."""
    if any(os.environ.get(v) for v in CREDENTIAL_VARIABLES):
        return True
    return os.path.isdir(os.path.join(os.environ.get("HOME") or os.path.expanduser("~"), ".config/anthropic/configs"))


def _submit_settings(args: argparse.Namespace) -> SubmitSettings:
    from pathlib import Path

    from ..run.job._settings import SubmitSettings

    return SubmitSettings(
        state_dir=_state_dir(args), out=Path(args.out) if args.out else None, ceiling=args.ceiling, margin=args.margin,
        poll=args.interval, max_in_flight=args.max_in_flight, max_attempts=args.max_attempts, limits=_limits(args),
        reconcile_grace=args.reconcile_grace, min_backoff=min(5.0, args.interval * 2),
        ledger=args.ledger, ledger_ttl=args.ledger_ttl, priority=args.priority, share=args.share,
        results_grace=args.results_grace, max_rpm=args.max_rpm,
        allow_duplicate=args.allow_duplicate, resume_canceled=args.resume_canceled, preflight=not args.no_preflight,
        budget=args.budget, prime=not args.no_prime,
        token_sample=args.token_sample, journal=args.journal, job=args.job, lease_ttl=args.lease_ttl,
        deadline=args.deadline, turnaround=args.turnaround, deadline_slack=args.deadline_slack,
    )


def cmd_submit(args: argparse.Namespace) -> int:
    import anyio

    from .._prices import load_prices
    from ..run._submit import dry_run

    if args.input == "-":
        raise UsageError("submit needs a file it can read again on resume, not standard input: save it first")
    from ._tables import is_table_job

    table = is_table_job(args)
    config = _api_config(args)
    settings = _submit_settings(args)
    if table and args.dry_run:
        raise UsageError("--dry-run takes a JSONL input: for a table, `gatekeeper plan TABLE --template ...`",
                         setting="dry_run")
    if not args.dry_run:
        return _submit_run(args, config, settings, table)
    prices = load_prices(args.prices)
    notice = _retry_notice(args)
    result = anyio.run(lambda: dry_run(args.input, config=config, settings=settings, prices=prices,
                                       on_event=lambda e, f: notice(f)))
    if args.json:
        _print_json(result.to_json())
    else:
        print(render_plan_brief(result.to_json()))
    return ExitCode.OK if result.plan.invalid == 0 else ExitCode.FINDINGS


def _submit_run(args: argparse.Namespace, config: ApiConfig, settings: SubmitSettings, table: bool = False) -> int:
    """The whole job, with progress on stderr; Ctrl-C stops at the next safe point, twice at once."""
    import shlex

    import anyio

    from .._errors import Interrupted
    from .._prices import load_prices
    from ..run._submit import submit
    from ._progress import Progress

    progress = Progress(sys.stderr, "json" if args.json or not sys.stderr.isatty() else "tty")
    prices = load_prices(args.prices)

    async def run(stop: anyio.Event) -> Any:
        if table:
            from ._tables import submit_table_run

            return await submit_table_run(args, config, settings, progress, stop, prices)
        return await submit(args.input, config=config, settings=settings, on_event=progress, stop=stop,
                            prices=prices)

    try:
        summary = anyio.run(_with_signals, run, progress.close)
    except Interrupted:
        progress.close()
        resume = "gatekeeper " + " ".join(shlex.quote(_masked(a)) for a in args.argv)
        print(f"gatekeeper: interrupted; batches already created keep processing. Resume with: {resume}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    finally:
        progress.close()
    if table:
        from ._tables import report_table

        return report_table(args, summary)
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

    from ..run.job._beside import beside

    stop = anyio.Event()

    async def watch() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if stop.is_set():
                    os._exit(ExitCode.INTERRUPTED)
                stop.set()
                on_stop()
                print("gatekeeper: stopping at the next safe point (Ctrl-C again to exit at once)", file=sys.stderr)

    return await beside(lambda: body(stop), watch)


def cmd_results(args: argparse.Namespace) -> int:
    from .._prices import load_prices
    from ..run._submit import job_summary
    from ..run.job._results import export
    from ..state._output import replacing

    ref = _job(args)  # first: without a name, say how to give one
    state = _state_dir(args)
    only = [t.strip() for t in args.only.split(",") if t.strip()] if args.only else None
    if args.out:
        with replacing(args.out, "the results") as f:  # (whole or not at all: never half an export)
            count = export(state, f, in_order=args.in_order, only=only, journal=ref["journal"], job=ref["job"])
    else:
        count = export(state, sys.stdout.buffer, in_order=args.in_order, only=only, journal=ref["journal"], job=ref["job"])
        sys.stdout.flush()
    summary = job_summary(state, load_prices(args.prices), **ref)
    if args.json:  # the summary on stdout beside a file; on stderr when the lines themselves are on stdout
        report = {**summary.to_json(), "written": count, "written_to": args.out}
        if args.out:
            _print_json(report)
        else:
            print(orjson_line(report), file=sys.stderr)
    elif args.out:
        print(render_summary(summary))
        print(f"wrote {count:,} line(s) to {args.out}")
    if summary.invalid and "rejected" not in (only or ()) and not args.json:
        print(f"gatekeeper: {summary.invalid:,} input line(s) were rejected before sending and are not results; "
              "--only rejected lists them", file=sys.stderr)
    return ExitCode.OK  # a good export; what the job's results hold is in them and in its summary


def cmd_cancel(args: argparse.Namespace) -> int:
    import anyio

    from ..run._submit import cancel

    config = _api_config(args)
    ref = _job(args)  # first: without a name, say how to give one
    state = _state_dir(args)
    notice = _retry_notice(args)
    result = anyio.run(lambda: cancel(state, config=config, max_rpm=args.max_rpm, on_event=lambda e, f: notice(f),
                                      journal=ref["journal"], job=ref["job"]))
    if args.json:
        _print_json(result.to_json())
    else:
        for b in result.batches:
            print(f"canceled batch {b.batch} {b.id} ({b.status})")
        print(f"{len(result.batches):,} batch(es) canceled; {result.not_sent:,} planned requests will not be sent. "
              "Rerun submit to collect what ended.")
    return ExitCode.OK


def _fake_env(url: str, keys: list[str], admin_key: str, aws: FakeAws | None) -> dict[str, str]:
    """The environment that points gatekeeper at the fake: its made-up keys (first-party), or the AWS platform's."""
    if aws is not None:
        key_id, secret = next(iter(aws.credentials.items()))
        return {"AWS_REGION": aws.region, "ANTHROPIC_AWS_WORKSPACE_ID": aws.workspace_id, "ANTHROPIC_AWS_BASE_URL": url,
                "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "GATEKEEPER_PLATFORM": "aws"}
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": keys[0], "ANTHROPIC_ADMIN_KEY": admin_key}
    if len(keys) > 1:
        env["ANTHROPIC_EXTRA_WORKSPACE_KEYS"] = ",".join(keys[1:])
    return env


def _fake_federation(life: float | None) -> tuple[Any, dict[str, str]]:
    """With --federation: the fake's token endpoint (keys refused) and the environment that uses it, an identity
    token written to a file of its own (made up, for the fake only)."""
    if life is None:
        return None, {}
    import tempfile

    from ..testing import FakeFederation, identity_token

    fed = FakeFederation(token_life=life, keys_refused=True)
    rule_id, rule = next(iter(fed.rules.items()))
    fd, path = tempfile.mkstemp(prefix="gatekeeper-fake-identity-", suffix=".jwt")
    os.write(fd, identity_token(issuer=rule.issuer, life=7 * 86_400).encode())
    os.close(fd)
    return fed, {"ANTHROPIC_IDENTITY_TOKEN_FILE": path, "ANTHROPIC_FEDERATION_RULE_ID": rule_id,
                 "ANTHROPIC_ORGANIZATION_ID": rule.organization_id}


def cmd_fake_api(args: argparse.Namespace) -> int:
    import time

    from ..testing import FakeAPI, FakeAws, FakeConfig, FakeRealtime, Outcome

    keys = args.workspace_key or ["test-key-ws1"]
    bad_model = args.error_model
    aws = FakeAws() if args.aws else None
    federation, federated_env = _fake_federation(args.federation)
    config = FakeConfig(
        ceiling=args.simulated_ceiling, rate=args.rate, speed=args.speed,
        workspaces={k: f"wrkspc_{i + 1}" for i, k in enumerate(keys)}, admin_keys={args.admin_key}, usage=args.usage,
        outcome=(lambda cid, model, attempt: Outcome("errored", "invalid_request_error", f"model: {model} not found")
                 if model == bad_model else None) if bad_model else None,
        realtime=FakeRealtime(rpm=args.realtime_rpm, itpm=args.realtime_itpm, otpm=args.realtime_otpm,
                              latency=args.realtime_latency), aws=aws, federation=federation,
    )
    with FakeAPI(config, port=args.port) as fake:
        # (made-up keys the fake accepts: printing them is what lets a newcomer paste them)
        env = _fake_env(fake.url, keys, args.admin_key, aws)
        if federated_env:
            env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_ADMIN_KEY": args.admin_key, **federated_env}
        info = {"url": fake.url, "ceiling": args.simulated_ceiling, "rate": args.rate, "speed": args.speed, "workspaces": len(keys),
                "env": env}
        try:  # (from the line that says it serves: a stop once it is said ends it as a stop, with the summary)
            if args.json:
                _print_json(info)
            else:
                where = "Claude Platform on AWS (fake)" if aws else f"{len(keys):,} workspace key(s)"
                print(f"fake Batches API on {fake.url} (ceiling {args.simulated_ceiling:,}, {args.rate:,.0f} requests/s, "
                      f"speed x{args.speed:g}; real-time lane {args.realtime_rpm:,} RPM); {where}; Ctrl-C stops it. "
                      "In another shell:\n"
                      f"export {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        seen = fake.org.records.summary()
        if args.json:
            _print_json({"received": seen})
        else:
            print(f"\nthe fake received {seen['creates']:,} creates ({seen['refusals']:,} refused for a full queue) and "
                  f"{seen['requests']:,} requests; {seen['succeeded']:,} succeeded, {seen['answered_twice']:,} answered "
                  f"twice; deepest queue {seen['deepest_queue']:,}", flush=True)
        return ExitCode.OK


def cmd_report(args: argparse.Namespace) -> int:
    from .._prices import load_prices
    from ..state._output import replacing
    from ..watch._report import render_html, run_report

    ref = _job(args)  # first: without a name, say how to give one
    state = _state_dir(args)
    data = run_report(state, load_prices(args.prices), journal=ref["journal"], job=ref["job"])
    if args.json:
        _print_json(data)
        return ExitCode.OK
    out = args.out or str(state / "report.html")
    with replacing(out, "the report") as f:
        f.write(render_html(data).encode())
    print(f"wrote {out} ({data['status']}: {data['summary']['succeeded']:,} of {data['summary']['requests']:,} succeeded, "
          f"{len(data['batches']):,} batches)")
    return ExitCode.OK


def cmd_exporter(args: argparse.Namespace) -> int:
    import anyio

    from .._prices import load_prices
    from ..watch._exporter import RunFigures, serve
    from ..watch._watch import min_interval

    config = _api_config(args)
    if args.job and not args.journal:
        raise UsageError("exporter --job reads a job in a shared journal: give --journal URL too")
    prices = load_prices(args.prices)
    snap = RunFigures()
    url, server = serve(snap, args.threshold, args.listen, args.port)
    interval = max(args.interval, min_interval(config.reads, args.max_rpm or config.default_rpm))
    read = _status_reader(args, config)

    async def readings() -> None:
        # (one event loop for every reading, as `status --watch`: a stop is a cancellation at the next await. The
        # first reading before the line that says it serves: its metrics are there once it is said.)
        await _export_reading(args, read, prices, snap)
        if args.json:  # one line: a long-running command's output is read line by line
            print(orjson_line({"url": url, "interval": interval}), flush=True)
        else:
            print(f"serving Prometheus metrics on {url}, reading the queue every {interval:g} s; Ctrl-C stops it",
                  flush=True)
        while True:
            await anyio.sleep(interval)
            await _export_reading(args, read, prices, snap)

    try:
        anyio.run(readings)
    except KeyboardInterrupt:
        return ExitCode.OK
    finally:
        server.shutdown()
    return ExitCode.OK  # (never reached: only a stop ends the readings)


async def _export_reading(args: argparse.Namespace, read: Callable[[], Any], prices: PriceTable,
                          snap: RunFigures) -> None:
    """One reading of the queue and the runs into the exporter's figures; a failed one keeps the last, said on stderr."""
    import time
    from pathlib import Path

    from ..watch._exporter import run_figures

    try:
        h, ledger = await read()
        runs = {Path(d).name: run_figures(Path(d), prices) for d in args.state}
        runs.update({job: run_figures(Path.cwd(), prices, journal=args.journal, job=job) for job in args.job})
    except GatekeeperError as exc:
        with snap.lock:
            snap.errors += 1
        print(f"gatekeeper: reading failed, the last values are kept: {_for_cli(exc)}", file=sys.stderr, flush=True)
    else:
        with snap.lock:
            snap.headroom, snap.ledger, snap.runs = h, ledger, runs
            snap.read_at, snap.readings = time.time(), snap.readings + 1


COMMANDS = {"plan": cmd_plan, "status": cmd_status, "submit": cmd_submit, "results": cmd_results, "cancel": cmd_cancel,
            "report": cmd_report, "exporter": cmd_exporter, "fake-api": cmd_fake_api}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        args.argv = argv
        _warn_passwords_in_argv(argv)
        if not args.command:
            parser.print_help(sys.stderr)
            return ExitCode.USAGE
        return _run_command(args)  # (after parsing: --version and --help start without `signal`)
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


def _masked(arg: str) -> str:
    """An argument with the password of any URL in it masked."""
    if "://" not in arg:
        return arg
    from ..state._db import safe_url

    return safe_url(arg)  # (also --journal=URL)


def _warn_passwords_in_argv(argv: list[str]) -> None:
    """A password written in a URL on the command line can be read by every user of the host (ps)."""
    if any(_masked(a) != a for a in argv):
        print("gatekeeper: warning: a URL on the command line holds a password, which other users can read with ps; "
              "give it in PGPASSWORD or ~/.pgpass (PostgreSQL), or the whole URL in GATEKEEPER_JOURNAL or "
              "GATEKEEPER_LEDGER", file=sys.stderr)


def _for_cli(exc: GatekeeperError) -> str:
    """The library's message, with the flag that sets the setting it names."""
    flag = FLAGS.get(getattr(exc, "setting", None) or "")
    text = str(exc).replace("\n", " ")
    return f"{text} ({flag})" if flag and flag not in text else text
