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

    results = [anyio.run(one, state) for state in states]  # (a table job's unfinished runs: one, as a rule)
    result = Canceled(tuple(b for r in results for b in r.batches), sum(r.not_sent for r in results),
                      sum(r.unanswered for r in results), tuple(b for r in results for b in r.refused),
                      next((r.permission for r in results if r.permission), None))
    if args.json:
        print_json(result.to_json())
    elif result.refused:  # (a cold tester's cancel exited 2 on the 403, the mark already recorded, said nowhere)
        _say_refused(result)
    else:
        for b in result.batches:
            print(f"canceled batch {b.batch} {b.id} ({b.status})")
        print(f"{len(result.batches):,} batch(es) canceled; {result.not_sent:,} planned requests will not be sent. "
              "Rerun submit to collect what ended.")
        if result.unanswered:  # (a cold tester read "0 batch(es) canceled" while one ran on, its create unanswered)
            print(f"{result.unanswered:,} create(s) still unanswered (no batch id yet): the running submit, or the "
                  "next, cancels each once it finds it in the listing.")
    return ExitCode.FINDINGS if result.refused else ExitCode.OK


def _say_refused(result: Canceled) -> None:
    for b in result.batches:
        print(f"canceled batch {b.batch} {b.id} ({b.status})")
    ids = ", ".join(b.id for b in result.refused)
    held = f" ({result.not_sent:,} planned requests)" if result.not_sent else ""
    print(f"job marked canceled: nothing new will be sent{held}. "
          f"{len(result.refused):,} live batch(es) could not be canceled, for lack of {result.permission} ({ids}): "
          "they run on, billed, and submit collects them when they end. `gatekeeper submit --resume-canceled` "
          "undoes the mark.")
