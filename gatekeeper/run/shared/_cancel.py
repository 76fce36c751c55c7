"""A user's cancel of one live batch, and what follows when the credentials may not cancel (an IAM policy without
the cancel action: a 403). Shared by `cancel` and the running submit, so the refusal is journaled once and no run
asks again: the batch stays live and is collected when it ends, as the deadline's refused cancel is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._errors import AuthenticationError

if TYPE_CHECKING:
    from ...api._client import ApiClient
    from ...state._journal import BatchRow, Journal

CANCEL_REFUSED = "cancel_refused"  # journal meta: the batches (indexes) whose cancel the credentials may not make
REFUSED = "refused"  # the status `cancel_batch` gives such a batch


def refused_batches(j: Journal) -> set[int]:
    return {int(i) for i in j.get_meta(CANCEL_REFUSED) or []}


async def cancel_batch(api: ApiClient, j: Journal, row: BatchRow) -> str:
    """Ask the API to cancel `row`'s batch: its status after ("ended" when it was not running), or `REFUSED` when
    the credentials may not cancel it (journaled: never asked again). Any other error is raised."""
    assert row.batch_id is not None
    if row.idx in refused_batches(j):
        return REFUSED
    try:
        return await api.cancel_if_running(row.batch_id)
    except AuthenticationError as exc:
        if exc.status != 403:
            raise
        j.set_meta(CANCEL_REFUSED, sorted(refused_batches(j) | {row.idx}), "cancel_refused", batch=row.idx,
                   id=row.batch_id, reason=str(exc))
        return REFUSED


def refused_policy(api: ApiClient) -> dict[str, Any]:
    """What a refused cancel leaves, for its event."""
    return {"policy": "left live and collected when it ends; nothing new is sent; grant the credentials "
                      f"{api.calls.platform.permission('cancel')} to cancel it"}
