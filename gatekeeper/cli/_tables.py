"""`plan` and `submit` of a table (`--template`): the options made a `TableSpec`, the run, the report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ExitCode, UsageError

if TYPE_CHECKING:  # (typing is not imported at run time: `plan`'s start)
    import argparse


def is_table_job(args: argparse.Namespace) -> bool:
    if getattr(args, "template", None) is not None:
        return True
    from ..tables._names import names_a_table

    if names_a_table(str(args.input)):
        raise UsageError(f"{args.input} is a table: give --template (and --model, --max-tokens) to make its requests",
                         setting="template")
    return False


def table_spec(args: argparse.Namespace) -> Any:
    from ..tables import _require_pyarrow

    _require_pyarrow()
    from ..tables._rows import TableSpec
    from ..tables._template import parse_template

    for flag, value in (("--model", args.model), ("--max-tokens", args.max_tokens)):
        if value is None:
            raise UsageError(f"a table job needs {flag}", setting=flag.lstrip("-").replace("-", "_"))
    return TableSpec(parse_template(args.template), args.model, args.max_tokens,
                     system=parse_template(args.system, "system") if args.system else None,
                     id_column=args.id_column, params=_params(args.param))


def _params(pairs: list[str]) -> dict[str, Any]:
    import orjson  # (here, as in the table commands below: `plan` of a JSONL file starts without it)

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {pair!r}: write KEY=VALUE", setting="param")
        if key.strip() in ("model", "max_tokens", "messages", "system"):
            raise UsageError(f"--param {key}: set by --model, --max-tokens, --template and --system", setting="param")
        try:
            out[key.strip()] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key.strip()] = value
    return out


def plan_table_command(args: argparse.Namespace, limits: Any) -> int:
    import orjson

    from ..tables._job import plan_table

    result = plan_table(args.input, table_spec(args), limits=limits, state_dir=args.state)
    j = result.to_json()
    if args.json:
        print(orjson.dumps(j).decode())
    else:
        print(f"rows            {j['rows']:,}   (answered already: {j['answered']:,}; rejected: {j['rejected_count']:,})")
        print(f"to send         {j['to_send']:,} request(s) in {j['batches']:,} batch(es)"
              + (f"; {j['invalid']:,} refused by plan's rules" if j["invalid"] else ""))
        for reason in j["rejected"][:10] + [f"row of {e['custom_id']}: {e['reason']}" for e in j["errors"][:10]]:
            print(f"  rejected: {reason}")
    return ExitCode.OK if not j["rejected_count"] and not j["invalid"] else ExitCode.FINDINGS


async def submit_table_run(args: argparse.Namespace, config: Any, settings: Any, progress: Any, stop: Any,
                           prices: Any) -> Any:
    from dataclasses import replace
    from pathlib import Path

    from ..tables._io import TableSource
    from ..tables._job import default_state_dir, submit_table

    spec = table_spec(args)
    state = Path(args.state) if args.state else default_state_dir(TableSource(args.input))
    out = args.out or str(state / "result.parquet")
    return await submit_table(args.input, spec, config=config, settings=replace(settings, state_dir=state, out=None),
                              out=out, prices=prices, on_event=progress, stop=stop)


def report_table(args: argparse.Namespace, result: Any) -> int:
    import orjson

    j = result.to_json()
    if args.json:
        print(orjson.dumps(j).decode())
    else:
        statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(j["by_status"].items()))
        print(f"rows      {j['rows']:,}   ({statuses})")
        print(f"sent      {j['sent']:,} request(s) this run; every other row answered before, rejected, or sharing "
              "a request")
        print(f"result    {j['out']}")
    ok = set(j["by_status"]) <= {"succeeded"}
    return ExitCode.OK if ok else ExitCode.FINDINGS
