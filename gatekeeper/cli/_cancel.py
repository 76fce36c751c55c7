"""`gatekeeper cancel`: a run's live batches canceled, and what it will not send."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from .._errors import ExitCode
from ..run._submit import cancel
from ..run.shared._summary import Canceled
from ._common import api_config, job_ref, print_json, retry_notice, run_dirs


def cmd_cancel(args: argparse.Namespace) -> int:
    config = api_config(args)
    ref = job_ref(args)  # first: without a name, say how to give one
    states = run_dirs(args, live=True)
    notice = retry_notice(args)
    async def one(state: Path) -> Canceled:
        return await cancel(state, config=config, max_rpm=args.max_rpm, on_event=lambda e, f: notice(f),
                            journal=ref["journal"], job=ref["job"])

    results = [anyio.run(one, state) for state in states]
    if args.json:
        print_json(results[0].to_json() if len(results) == 1 else [r.to_json() for r in results])
    else:
        for result in results:
            for b in result.batches:
                print(f"canceled batch {b.batch} {b.id} ({b.status})")
        print(f"{sum(len(r.batches) for r in results):,} batch(es) canceled; {sum(r.not_sent for r in results):,} "
              "planned requests will not be sent. Rerun submit to collect what ended.")
    return ExitCode.OK
