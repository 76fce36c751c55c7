"""The splitter's batches with their bodies (`iter_batches`), for a program that sends them itself.

They are cut by the same `reader.scan` and `sizing.Packer` as `plan`'s report, so a batch here is the batch `plan`
reports and `submit` sends. (Apart from `_planner`, so that `plan` does not import what only this path needs.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ._planner import BatchPlan
from ._reader import scan
from ._sizing import Limits, Packer, body_chunks, body_size, max_item_bytes

if TYPE_CHECKING:
    from ._reader import Rejection, Source


class Request(NamedTuple):
    """One valid line, ready to send."""

    line: int  # 1-based line number in the input
    offset: int  # byte offset of the line in the input (-1 for an iterable source)
    custom_id: str
    model: str
    body: bytes  # the request's bytes as they will be sent


@dataclass(slots=True)
class Batch:
    """A batch ready to send: its plan and its requests."""

    plan: BatchPlan
    requests: list[Request]

    def body(self) -> Iterator[bytes]:
        return body_chunks(r.body for r in self.requests)

    @property
    def body_size(self) -> int:
        return body_size(len(self.requests), sum(len(r.body) for r in self.requests))


def iter_batches(
    source: Source,
    *,
    limits: Limits | None = None,
    reject: Callable[[Rejection], None] | None = None,
) -> Iterator[Batch]:
    """Yield the batches of `source` one at a time (memory: one batch), rejections to `reject`."""
    limits = limits or Limits()
    packer = Packer(limits)
    pending: list[Request] = []
    index = 0
    for line, offset, cid, model, _, raw in scan(source, reject or (lambda r: None), item_limit=max_item_bytes(limits.max_bytes),
                                                 api_version=limits.api_version):
        req = Request(line, offset, cid, model, raw.strip())
        if packer.add(len(req.body)) and pending:
            yield _batch(index, pending)
            index += 1
            pending = []
        pending.append(req)
    if pending:
        yield _batch(index, pending)


def _batch(index: int, requests: list[Request]) -> Batch:
    first, last = requests[0], requests[-1]
    p = BatchPlan(
        index=index,
        requests=len(requests),
        bytes=body_size(len(requests), sum(len(r.body) for r in requests)),
        first_line=first.line,
        last_line=last.line,
        start_offset=first.offset,
        end_offset=last.offset + len(last.body) if last.offset >= 0 else -1,
        first_custom_id=first.custom_id,
        last_custom_id=last.custom_id,
    )
    return Batch(plan=p, requests=requests)
