"""Table jobs: a table and a prompt template in, one result row per input row out (the `tables` extra: pyarrow).

In the order data flows: `_template` renders a row's request (pure), `_rows` judges every row and gives each its
identity (`_batch` a record batch at once), `_where` says where a table job keeps its state and how a table may be
shown, `_io` reads tables on local disk or object storage (`_encoding` names a CSV's that is not UTF-8), `_judged`
makes the passes over a table, `_pending` the requests not answered yet, `_plan` sizes them without sending, `_runs`
keeps track of each run (one that did not finish is collected before the next), `_job` runs the unanswered rows as
an ordinary JSONL job and joins the answers back (`state._answers` keeps them across runs), and `_out` writes the
result. `_find` finds a table job's current run for the commands that read or stop one (results, report, cancel).
"""


def _require_pyarrow() -> None:
    """The extra's one line when it is missing."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        from .._errors import UsageError

        raise UsageError("table jobs need the tables extra: pip install 'gatekeeper-batches[tables]'",
                         setting="source") from None
