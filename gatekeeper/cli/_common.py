"""What every command shares: the run a command names, the limits, the API's configuration from the environment,
and printing (JSON, warnings, retries, errors with the flag that sets their setting).

Imported by every command, `plan` included: what `plan` must start without (the API's configuration, the run's
modules) is imported here only by the helper that needs it, when called.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._errors import GatekeeperError, UsageError
from .._wire import API_VERSION, API_VERSION_VARIABLE, AWS_CREDENTIALS_HINT, CREDENTIAL_VARIABLES
from ._render import retry_line

if TYPE_CHECKING:
    from pathlib import Path

    from ..api._config import ApiConfig
    from ..input._sizing import Limits


FLAGS = {"out": "--out", "state_dir": "--state", "ledger": "--ledger", "only": "--only", "ceiling": "--ceiling",
         "max_requests": "--max-requests", "max_bytes": "--max-bytes", "prices": "--prices", "port": "--port", "host": "--host",
         "base_url": "ANTHROPIC_BASE_URL", "admin_key": "ANTHROPIC_ADMIN_KEY",
         "api_key": "ANTHROPIC_API_KEY or ANTHROPIC_EXTRA_WORKSPACE_KEYS",
         "credentials": "docs/credentials.md", "identity_token": "ANTHROPIC_IDENTITY_TOKEN_FILE",
         "profile": "ANTHROPIC_PROFILE",
         "allow_duplicate": "--allow-duplicate to run it anyway", "journal": "--journal", "job": "--job",
         "lease_ttl": "--lease-ttl", "encoding": "--encoding", "infer_types": "--infer-types", "platform": "--platform (or GATEKEEPER_PLATFORM)",
         "api_version": "--api-version (or GATEKEEPER_API_VERSION)",
         "aws_region": "AWS_REGION", "aws_workspace": "ANTHROPIC_AWS_WORKSPACE_ID",
         "aws_credentials": AWS_CREDENTIALS_HINT}


def state_dir(args: argparse.Namespace) -> Path:
    from pathlib import Path

    if args.state:
        return Path(args.state)
    if getattr(args, "input", None) and args.input != "-":
        from ..run.shared._settings import default_state_dir

        return default_state_dir(args.input)
    if getattr(args, "journal", None) and getattr(args, "job", None):
        return Path.cwd()  # a named job in a shared journal needs no local state to be read
    return _only_run_here()


def run_dirs(args: argparse.Namespace, *, live: bool = False) -> list[Path]:
    """The state directory of the run a reading command (results, report, cancel) names: `state_dir`'s; for a table
    job (INPUT a table, or --state its folder), its current run (`live`: every run of it that did not finish)."""
    from pathlib import Path

    from ..tables._names import names_a_table

    given = Path(args.state) if args.state else None
    table = bool(getattr(args, "input", None)) and names_a_table(str(args.input))
    if (given is None and not table) or (args.journal and args.job):  # (a named job's run is read from its journal)
        return [state_dir(args)]
    from ..tables._find import is_table_folder, table_runs

    if given is not None and not is_table_folder(given):
        return [given]
    if given is None:
        from ..tables._where import default_state_dir

        given = default_state_dir(str(args.input), os.environ, create=False)
    runs = table_runs(given, live=live)
    print(f"gatekeeper: the table job's run {runs[-1].stem} in {given} (its result table, every row: "
          f"{given / 'result.parquet'}, result-SPEC.parquet beside it for a job of another template, or submit's "
          "--out)", file=sys.stderr)
    return runs


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


def job_ref(args: argparse.Namespace) -> dict[str, str | None]:
    """The shared journal and job name a reading command (results, report, cancel) was given; the name, when not
    given, derived as submit derives it: from the INPUT's sha256 and the account it went to (never a secret)."""
    if not args.journal or args.job:
        return {"journal": args.journal, "job": args.job}
    from ..tables._names import names_a_table

    if args.input and names_a_table(str(args.input)):
        raise UsageError("a table job's run in a --journal is found by its name: give --job NAME (submit --json "
                         "shows it: run.job)", setting="job")
    config = optional_api_config(args)
    if not args.input or args.input == "-" or config is None:
        raise UsageError("a job in a --journal database is found by its name: give --job NAME (submit's summary "
                         "shows it), or the INPUT with credentials of the account it was submitted to")
    from ..run.shared._opening import job_name_of, recorded_in

    return {"journal": args.journal, "job": job_name_of(args.input, config, recorded=recorded_in(args.journal))}


def limits(args: argparse.Namespace) -> Limits:
    from ..input._sizing import Limits

    version = getattr(args, "api_version", None) or os.environ.get(API_VERSION_VARIABLE, "").strip() or API_VERSION
    try:
        return Limits(max_requests=args.max_requests, max_bytes=args.max_bytes, api_version=version)
    except ValueError as exc:
        raise UsageError(f"--max-requests/--max-bytes: {exc}") from None


def json_line(obj: Any) -> str:
    """`obj` as one line of JSON (msgspec: `plan`, which decodes with it, then starts without orjson)."""
    import msgspec

    return msgspec.json.encode(obj).decode()


def print_json(obj: Any) -> None:
    import msgspec

    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(obj), indent=2) + b"\n")
    sys.stdout.flush()


def warn(text: str) -> None:
    print(f"gatekeeper: warning: {text}", file=sys.stderr)


def retry_notice(args: argparse.Namespace) -> Callable[[dict[str, Any]], None]:
    """A retried call, told on stderr: a JSON event with --json, else one line (nobody waits in silence)."""
    def notice(fields: dict[str, Any]) -> None:
        if getattr(args, "json", False):
            print(json_line({"event": "retrying", **fields}), file=sys.stderr, flush=True)
        else:
            print(f"gatekeeper: {retry_line(fields)}", file=sys.stderr, flush=True)

    return notice


def api_config(args: argparse.Namespace) -> ApiConfig:
    """The API's URL and keys, from the environment (the one place the CLI reads them): the first-party API's, or
    Claude Platform on AWS's with `--platform aws` (or GATEKEEPER_PLATFORM=aws)."""
    from ..api._config import ApiConfig

    config = ApiConfig.from_env(os.environ, getattr(args, "platform", None), getattr(args, "api_version", None))
    if config.platform.batches is not None:
        config.require_workspace_key()  # (one line: why this platform takes no batches)
    if not config.has_credentials:
        raise UsageError("no credentials: set ANTHROPIC_API_KEY to a workspace API key (ANTHROPIC_EXTRA_WORKSPACE_KEYS "
                         "for the others), or ANTHROPIC_AUTH_TOKEN, ANTHROPIC_PROFILE, or workload identity federation "
                         "(ANTHROPIC_IDENTITY_TOKEN_FILE, ANTHROPIC_FEDERATION_RULE_ID, ANTHROPIC_ORGANIZATION_ID): "
                         "see docs/credentials.md", setting="credentials")
    return config


def optional_api_config(args: argparse.Namespace, *, offline: bool = False) -> ApiConfig | None:
    """As `_api_config`, or None when no workspace key is set (`plan` and `status` work without one). `offline`
    (a plan, which sizes a file without the API): another platform whose settings are missing or wrong is None
    too, said in one warning line, as a plan without credentials is."""
    platform = getattr(args, "platform", None) or os.environ.get("GATEKEEPER_PLATFORM")
    if platform in (None, "", "anthropic") and not _may_have_credentials():
        return None  # (without importing the configuration, 33 M instructions of `plan`'s start)
    from ..api._config import ApiConfig

    try:
        config = ApiConfig.from_env(os.environ, platform, getattr(args, "api_version", None))
    except UsageError as exc:
        if not offline or platform in ("", "anthropic"):
            raise
        warn(f"planned offline, the models not judged and no ceiling read: {exc}")
        return None
    return config if config.has_credentials else None


def _may_have_credentials() -> bool:
    """Whether the environment may hold a credential, known without reading one: a variable of the SDK's chain, or
    a profile in the default config directory."""
    if any(os.environ.get(v) for v in CREDENTIAL_VARIABLES):
        return True
    return os.path.isdir(os.path.join(os.environ.get("HOME") or os.path.expanduser("~"), ".config/anthropic/configs"))


def masked(arg: str) -> str:
    """An argument with the password of any URL in it masked."""
    if "://" not in arg:
        return arg
    from ..state._db import safe_url

    return safe_url(arg)  # (also --journal=URL)


_STORES = (  # an object store's scheme, and where its SDKs (and pyarrow) read credentials
    (("s3://",), "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://"),
    (("gs://", "gcs://"), "GOOGLE_APPLICATION_CREDENTIALS for gs://"),
    (("az://", "abfs://", "abfss://"), "AZURE_STORAGE_ACCOUNT_KEY, or AZURE_CLIENT_ID, AZURE_TENANT_ID and "
     "AZURE_CLIENT_SECRET, for az://"),
)
_DATABASES = ("give it in PGPASSWORD or ~/.pgpass (PostgreSQL), or the whole URL in GATEKEEPER_JOURNAL or "
              "GATEKEEPER_LEDGER")


def where_secrets_go(args: list[str]) -> str:
    """Where the secrets of these URLs belong instead of the command line: the settings of the kind each names (an
    object store's credentials are its cloud's own environment, a database's password PostgreSQL's)."""
    kinds = dict.fromkeys(_store(a.partition("=")[2] if a.startswith("--") else a) for a in args)
    stores = [k for k in kinds if k is not None]
    said = [f"give the credentials in {'; '.join(stores)}"] if stores else []
    return "; ".join(said + ([_DATABASES] if None in kinds else []))


def _store(url: str) -> str | None:
    return next((setting for schemes, setting in _STORES if url.startswith(schemes)), None)


def for_cli(exc: GatekeeperError) -> str:
    """The library's message, with the flag that sets the setting it names."""
    flag = FLAGS.get(getattr(exc, "setting", None) or "")
    text = str(exc).replace("\n", " ")
    return f"{text} ({flag})" if flag and flag not in text else text


def print_error(exc: GatekeeperError, *, as_json: bool, message: str | None = None) -> int:
    """A command's error, said once on stderr; its exit code returned. One line, `gatekeeper: MESSAGE`; under
    --json one JSON object on one line, `{"event": "error", "error": {"type", "message", "exit_code", ...}}`: on
    stderr as in plain mode, since stdout under --json holds only the command's result and stderr already carries
    its JSON events (`type`: the library's error class; `setting`, `endpoint`, `status`, `code`, `request_id` when
    known). `message`: the line when it says more than the error (an interrupted submit's resume command)."""
    text = message or for_cli(exc)
    code = int(exc.exit_code)
    if not as_json:
        print(f"gatekeeper: {text}", file=sys.stderr, flush=True)
        return code
    error: dict[str, Any] = {"type": type(exc).__name__, "message": text, "exit_code": code}
    setting = getattr(exc, "setting", None)
    if setting:
        error["setting"] = FLAGS.get(setting, setting)
    for name in ("endpoint", "status", "code", "request_id"):
        value = getattr(exc, name, None)
        if value not in (None, ""):
            error[name] = value
    print(json_line({"event": "error", "error": error}), file=sys.stderr, flush=True)
    return code


def run_until_stopped(main: Callable[[], Awaitable[None]]) -> None:
    """Run `main` (a command that reads until stopped: `status --watch`, the exporter) until Ctrl-C or SIGTERM, which
    cancel it through a cancel scope: level-triggered, so a cancellation that one await swallowed (a reading's
    retry, a thread's result) is raised again at the next; a KeyboardInterrupt raised into the event loop was lost
    that way once in a while, and the command read on forever."""
    import signal

    import anyio

    async def until_stopped() -> None:
        async with anyio.create_task_group() as tg:
            async def stopper() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stopper)
            await main()
            tg.cancel_scope.cancel()

    try:
        anyio.run(until_stopped)
    except KeyboardInterrupt:
        pass
