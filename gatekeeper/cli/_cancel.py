"""`gatekeeper cancel`: a run's live batches canceled, and what it will not send."""

from __future__ import annotations

import argparse

import anyio

from .._errors import ExitCode
from ..run._submit import cancel
from ._common import api_config, job_ref, print_json, retry_notice, state_dir


def cmd_cancel(args: argparse.Namespace) -> int:
    config = api_config(args)
    ref = job_ref(args)  # first: without a name, say how to give one
    state = state_dir(args)
    notice = retry_notice(args)
    result = anyio.run(lambda: cancel(state, config=config, max_rpm=args.max_rpm, on_event=lambda e, f: notice(f),
                                      journal=ref["journal"], job=ref["job"]))
    if args.json:
        print_json(result.to_json())
    else:
        for b in result.batches:
            print(f"canceled batch {b.batch} {b.id} ({b.status})")
        print(f"{len(result.batches):,} batch(es) canceled; {result.not_sent:,} planned requests will not be sent. "
              "Rerun submit to collect what ended.")
    return ExitCode.OK
