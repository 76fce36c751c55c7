"""`gatekeeper results` and `gatekeeper report`: a run's results exported, and its report, read from its journal."""

from __future__ import annotations

import argparse
import sys

from .._errors import ExitCode
from .._prices import load_prices
from ..run._submit import job_summary
from ..run.shared._results import export
from ..state._output import replacing
from ..watch._report import render_html, run_report
from ._common import job_ref, json_line, print_json, run_dirs
from ._render import render_summary


def cmd_results(args: argparse.Namespace) -> int:
    ref = job_ref(args)  # first: without a name, say how to give one
    state = run_dirs(args)[-1]
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
            print_json(report)
        else:
            print(json_line(report), file=sys.stderr)
    elif args.out:
        print(render_summary(summary))
        print(f"wrote {count:,} line(s) to {args.out}")
    if summary.invalid and "rejected" not in (only or ()) and not args.json:
        print(f"gatekeeper: {summary.invalid:,} input line(s) were rejected before sending and are not results; "
              "--only rejected lists them", file=sys.stderr)
    return ExitCode.OK  # a good export; what the job's results hold is in them and in its summary


def cmd_report(args: argparse.Namespace) -> int:
    ref = job_ref(args)  # first: without a name, say how to give one
    state = run_dirs(args)[-1]
    data = run_report(state, load_prices(args.prices), journal=ref["journal"], job=ref["job"])
    if args.json:
        print_json(data)
        return ExitCode.OK
    out = args.out or str(state / "report.html")
    with replacing(out, "the report") as f:
        f.write(render_html(data).encode())
    print(f"wrote {out} ({data['status']}: {data['summary']['succeeded']:,} of {data['summary']['requests']:,} succeeded, "
          f"{len(data['batches']):,} batches)")
    return ExitCode.OK
