"""Re-export a run's final results at any time, also while it runs (what is committed so far).

Reads the journal through a read-only connection, so it never blocks or
disturbs a running submit; only lines covered by the committed output length
are read, never a batch that is half written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import orjson

from ..._errors import OutputError, UsageError, os_error
from ...decide._settle import KNOWN_ERRORS, STOPPED_EARLY
from ...state._journal import Journal, open_job
from ...state._output import OutputFile

RESULT_KINDS = ("succeeded", "errored", "expired", "canceled")
REJECTED = "rejected"  # input lines refused before anything was sent: not results, exported on request
UNPROVEN_KIND = "unproven"  # answers kept apart, their batch never proven ours: not results, exported on request
EXTRAS = (REJECTED, UNPROVEN_KIND)


def check_filter(only: Iterable[str], present: set[str]) -> tuple[list[str], list[str]]:
    """(result types, error types) of a filter; `UsageError` for a name that is neither known nor in the results.
    (`refused` and `truncated`, succeeded answers that stopped early, are `stopped_early`'s.)"""
    names = [n for n in only if n not in EXTRAS and n not in STOPPED_EARLY]
    unknown = [n for n in names if n not in RESULT_KINDS and n not in KNOWN_ERRORS and n not in present]
    if unknown:
        raise UsageError(f"unknown result or error type {unknown[0]!r}: use {', '.join(RESULT_KINDS)}, "
                         f"{', '.join(STOPPED_EARLY)}, {REJECTED}, {UNPROVEN_KIND}, "
                         "or an error type such as invalid_request_error", setting="only")
    return [n for n in names if n in RESULT_KINDS], [n for n in names if n not in RESULT_KINDS]


def export(state_dir: str | os.PathLike[str], dest: BinaryIO, *, in_order: bool = False, only: Iterable[str] | None = None,
           journal: str | None = None, job: str | None = None) -> int:
    """Write the run's final result lines to `dest`; return how many. Memory stays bounded either way. `only`
    filters by result or error type; "rejected" adds the input lines refused before sending, "unproven" the
    answers kept apart because their batch could not be proven this job's.

    The run: its state directory, or the job named `job` in the shared journal at `journal`."""
    j = open_job(state_dir, journal=journal, job=job)
    try:
        with j.snapshot():  # one snapshot: the committed length and the rows agree
            output = OutputFile(str(j.get_meta("output") or Path(state_dir) / "results.jsonl"))
            committed = j.outcomes.committed_output()
            names = list(only or ())
            types, errors = check_filter(names, j.outcomes.result_types())
            stops = [r for n in names if n in STOPPED_EARLY for r in STOPPED_EARLY[n]]
            try:
                count = _copy(j, output, committed, dest, (types, errors, stops), in_order) \
                    if types or errors or stops or not names or not set(names) <= set(EXTRAS) else 0
                count += _rejected(j, dest) if REJECTED in names else 0
                return count + (_unproven(j, dest) if UNPROVEN_KIND in names else 0)
            except BrokenPipeError:
                raise  # a reader that stopped reading (`| head`): not a failure of ours (the CLI ends quietly)
            except FileNotFoundError as exc:
                raise UsageError(f"the run's results file is missing here: {exc.filename}. Rerun the same "
                                 "`gatekeeper submit` on this host (same --journal and --job for a shared job): it "
                                 "downloads the results again from the API and sends nothing twice") from exc
            except OSError as exc:
                raise OutputError(os_error(exc, "cannot copy the results")) from exc
    finally:
        j.close()


def _copy(journal: Journal, output: OutputFile, committed: int, dest: BinaryIO,
          only: tuple[list[str], list[str], list[str]], in_order: bool) -> int:
    types, errors, stops = only
    if not types and not errors and not stops and not in_order:  # the output file is already the results, in arrival order
        count = 0
        for chunk in output.head(committed):
            dest.write(chunk)
            count += chunk.count(b"\n")
        return count
    count = 0
    spans = journal.outcomes.result_spans(types=types, error_types=errors, in_order=in_order, stop_reasons=stops)
    for line in output.spans(spans, committed):
        dest.write(line)
        count += 1
    return count


def _rejected(journal: Journal, dest: BinaryIO) -> int:
    """The input lines refused before sending, one JSON line each: {"custom_id", "line", "result": {"type":
    "rejected", "reason"}} (custom_id null when the line had none), after any results."""
    count = 0
    for line, cid, reason in journal.outcomes.rejections():
        dest.write(orjson.dumps({"custom_id": cid, "line": line, "result": {"type": REJECTED, "reason": reason}}) + b"\n")
        count += 1
    return count


def _unproven(journal: Journal, dest: BinaryIO) -> int:
    """The answers kept apart, as the API gave them, each with the batch it came in: {"custom_id", "batch_id",
    "result"}. Their batch was found by listing after its create's answer was lost, and could not be proven this
    job's: each may be another job's answer to its own request of the same custom_id."""
    count = 0
    for cid, batch_id, raw in journal.outcomes.unproven():
        dest.write(orjson.dumps({"custom_id": cid, "batch_id": batch_id, "result": orjson.loads(raw).get("result")}) + b"\n")
        count += 1
    return count
