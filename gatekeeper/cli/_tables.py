"""`plan` and `submit` of a table (`--template`): the options made a `TableSpec`, the run, the report."""

from __future__ import annotations

import os
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


def _source(args: argparse.Namespace) -> Any:
    from ..tables._io import TableSource

    return TableSource.of(args.input, encoding=args.encoding, infer_types=args.infer_types)


def plan_table_command(args: argparse.Namespace, limits: Any) -> int:
    import orjson

    from .._prices import load_prices
    from ..tables._plan import plan_table

    spec, source = table_spec(args), _source(args)
    ceiling, _ = _ceiling(args)
    job = _job_name(args, source, spec) if args.journal else None
    result = plan_table(source, spec, limits=limits, state_dir=args.state, ceiling=ceiling, margin=args.margin,
                        journal=args.journal, job=job, prices=load_prices(args.prices), judge=_judge(args))
    j = result.to_json()
    if args.json:
        print(orjson.dumps(j).decode())
    else:
        print(render_table_plan(j))
    return ExitCode.OK if not j["rejected_count"] else ExitCode.FINDINGS


def render_table_plan(j: dict[str, Any]) -> str:
    """`plan TABLE` for people: rows, what goes out in how many batches and rounds, the cost, the rejected rows."""
    rejected = j["rejected_count"]  # (rows judged bad, and requests plan's rules refuse: as submit)
    flying = f"; out in an unfinished run: {j['in_flight']:,}" if j["in_flight"] else ""
    out = [f"rows            {j['rows']:,}   (answered already: {j['answered']:,}{flying}; rejected: {rejected:,})"]
    for run in j["unfinished"]:  # (a cold tester read "submit collects it first" while a second submit was refused)
        then = ("a submit is running it now: another submit of this table is refused until it ends" if run["running"]
                else "submit collects it first and sends none of those again")
        out.append(f"unfinished run  {run['run']} ({run['requests']:,} request(s), {run['taken']:,} of them out or "
                   f"answered): {then}")
    batches, size = len(j["batches"]), j["batch_size"]
    at = (f"; {j['waves']:,} round(s) of creates at the ceiling {j['ceiling']:,}" if j["waves"] is not None else
          "; the ceiling is unknown (give --ceiling, or an Admin key): submit cuts batches to a quarter of it")
    out.append(f"to send         {j['to_send']:,} request(s) in {batches:,} batch(es) of at most {size:,}"
               + (at if batches else "") + (f"; {j['invalid']:,} refused by plan's rules" if j["invalid"] else ""))
    if j["shared"]:
        out.append(f"shared          {_shared(j['shared'])}")
    e = j["estimate"]
    if e is not None:
        cost = "unknown (a model has no price)" if e["input_cost_usd"] is None else f"~${e['input_cost_usd']:,.2f}"
        how = ("count_tokens on a sample" if "count_tokens on" in e["method"] else
               "nothing to send" if not j["to_send"] else e["method"].split(";")[0])
        out.append(f"estimate        ~{e['input_tokens']:,} input tokens, {cost} at batch prices ({how}; output not "
                   "included)")
    for r in j["rejected"][:20]:
        out.append(f"  rejected: row {r['row']}: {r['reason']}")
    if rejected > len(j["rejected"][:20]):
        out.append(f"  ... and {rejected - len(j['rejected'][:20]):,} more (--json lists the first 100)")
    return "\n".join(out)


def _shared(n: int) -> str:
    return (f"{n:,} row(s) share a request with an identical row: it is sent once, and its answer joined to each "
            "(make the prompts differ to sample one prompt several times)")


def _judge(args: argparse.Namespace) -> Any:
    """How `plan TABLE` judges the requests to send as `submit` would, with a key (as `plan` of a JSONL file): the
    Models API's verdicts (a model it does not know, a max_tokens over the model's most) and count_tokens for the
    estimate. None: no key, or --no-preflight (said in the estimate)."""
    from ._common import optional_api_config, retry_notice, warn

    config = optional_api_config(args, offline=True)
    if config is None or args.no_preflight:
        return None

    def judge(pending: Any, report: Any, limits: Any) -> Any:
        import anyio

        from ..api._queue import connect
        from ..checks._preflight import judge_plan

        async def judged() -> Any:
            async with connect(config, max_rpm=args.max_rpm, on_retry=retry_notice(args)) as conn:
                return await judge_plan(pending, conn.primary, report, limits=limits, hash_content=False,
                                        token_sample=args.token_sample, on_warning=warn)

        return anyio.run(judged)

    return judge


def _ceiling(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """The queue ceiling a plan sizes batches at: --ceiling, else the Admin API's (with a key), else unknown."""
    if args.ceiling is not None:
        return args.ceiling, "--ceiling"
    from ._common import optional_api_config

    config = optional_api_config(args, offline=True)
    if config is None or config.admin_key is None:
        return None, None
    import anyio

    from ..api._queue import connect, read_ceiling

    async def read() -> tuple[int | None, str | None]:
        async with connect(config, max_rpm=args.max_rpm) as conn:
            ceiling, source, _ = await read_ceiling(conn, None)
            return ceiling, source

    return anyio.run(read)


def _job_name(args: argparse.Namespace, source: Any, spec: Any) -> str:
    """A table job's name in a --journal: --job, else from the table's identity, the spec and the key."""
    if args.job:
        return str(args.job)
    from ._common import optional_api_config

    config = optional_api_config(args)
    if config is None:
        raise UsageError("a table job's answers in a --journal are found by its name: give --job NAME, or the "
                         "ANTHROPIC_API_KEY it was submitted with", setting="job")
    from pathlib import Path

    from ..tables._job import job_names
    from ..tables._where import default_state_dir

    root = Path(args.state) if args.state else default_state_dir(source.where, os.environ, create=False)
    return job_names(source.where, root, spec, config)[0]


async def submit_table_run(args: argparse.Namespace, config: Any, settings: Any, progress: Any, stop: Any,
                           prices: Any) -> Any:
    from dataclasses import replace
    from pathlib import Path

    from ..tables._job import run_table

    spec, source = table_spec(args), _source(args)
    state = Path(args.state) if args.state else None  # (none: the library's default, made there)
    return await run_table(source, spec, config=config, settings=replace(settings, state_dir=state, out=None),
                           out=args.out, default_out=True,  # (STATE/result.parquet, or the spec's own)
                           prices=prices, on_event=progress, stop=stop)


def report_table(args: argparse.Namespace, result: Any) -> int:
    import orjson

    j = result.to_json()
    if args.json:
        print(orjson.dumps(j).decode())
    else:
        print(render_table_result(j))
    ok = set(j["by_status"]) <= {"succeeded"}
    return ExitCode.OK if ok else ExitCode.FINDINGS


def render_table_result(j: dict[str, Any]) -> str:
    """`submit TABLE` for people: the rows by status, what was sent and collected, where the result is."""
    statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(j["by_status"].items()))
    out = [f"rows      {j['rows']:,}" + (f"   ({statuses})" if statuses else "")]
    for run in j["earlier"]:
        out.append(f"collected an earlier run that had not finished ({run['run']}): {run['answered']:,} of its "
                   f"{run['requests']:,} request(s) answered, in {run['batches']:,} batch(es)")
    unsent = j["by_status"].get("unsent", 0)
    out.append(f"sent      {j['sent']:,} request(s) in {j['batches']:,} batch(es)"
               + (f"; {unsent:,} row(s) not sent" if unsent else "")
               + ("" if j["sent"] or unsent else "; every row was answered before or rejected"))
    if j["shared"]:
        out.append(f"shared    {_shared(j['shared'])}")
    run_cost = (j.get("run") or {}).get("cost_usd")
    if j["sent"] or run_cost:  # (the run's: what this submit bought, as a JSONL job's summary says it)
        out.append(f"cost      ~${run_cost or 0:,.2f}" if run_cost is not None else
                   "cost      unknown: a model that succeeded has no price (give --prices FILE)")
    if j.get("canceled"):
        out.append("canceled  the run collected had been canceled: nothing new was sent; submit again sends the rows "
                   "not answered")
    if j["grew"]:
        out.append("grew      the table has more rows than when it was judged: they wait for the next run")
    out.append(f"result    {j['out']}")
    return "\n".join(out)
