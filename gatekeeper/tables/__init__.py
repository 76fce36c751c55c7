"""Table jobs: a table and a prompt template in, one result row per input row out (the `tables` extra: pyarrow).

In the order data flows: `_template` renders a row's request (pure), `_rows` judges every row and gives each its
identity, `_io` reads and writes tables on local disk or object storage, `_answers` keeps what each rendered request
was answered across runs, `_job` runs the unanswered rows as an ordinary JSONL job and joins the answers back.
"""


def _require_pyarrow() -> None:
    """The extra's one line when it is missing."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        from .._errors import UsageError

        raise UsageError("table jobs need the tables extra: pip install 'gatekeeper-batches[tables]'",
                         setting="source") from None
