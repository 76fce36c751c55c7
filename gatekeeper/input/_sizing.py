"""Exact byte sizing of a create body, and greedy packing into legal batches. Pure.

The body is `{"requests":[` + items joined by `,` + `]}`. `body_chunks` builds it
and `body_size` counts it from the same three constants, so the bytes we size
are the bytes we send: there is no second serializer to disagree with.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import TYPE_CHECKING

import msgspec

from .._errors import UsageError
from .._wire import API_MAX_BYTES, API_MAX_REQUESTS, API_VERSION, API_VERSIONS

if TYPE_CHECKING:
    from ..state._records import PendingRow

BODY_OPEN = b'{"requests":['
BODY_SEP = b","
BODY_CLOSE = b"]}"
ENVELOPE_BYTES = len(BODY_OPEN) + len(BODY_CLOSE)



def body_size(count: int, item_bytes: int) -> int:
    """Length of the body holding `count` items whose lengths add up to `item_bytes`."""
    return ENVELOPE_BYTES + item_bytes + max(0, count - 1) * len(BODY_SEP)


def body_chunks(items: Iterable[bytes]) -> Iterator[bytes]:
    """The create body, piece by piece, with every item sent as given."""
    yield BODY_OPEN
    first = True
    for item in items:
        if not first:
            yield BODY_SEP
        first = False
        yield item
    yield BODY_CLOSE


def max_item_bytes(max_bytes: int) -> int:
    """The largest single item that fits in a body of `max_bytes`."""
    return max_bytes - ENVELOPE_BYTES


class Limits(msgspec.Struct, frozen=True):
    """Per-batch limits (both can only be lowered below the API's), and the API version whose rules each request is
    judged by (`api_version`: under 2026-10-21 some parameters and blocks are refused)."""

    max_requests: int = API_MAX_REQUESTS
    max_bytes: int = API_MAX_BYTES
    api_version: str = API_VERSION

    def __post_init__(self) -> None:
        if not 1 <= self.max_requests <= API_MAX_REQUESTS:
            raise UsageError(f"max_requests must be between 1 and {API_MAX_REQUESTS}, got {self.max_requests}",
                             setting="max_requests")
        if not ENVELOPE_BYTES + 2 <= self.max_bytes <= API_MAX_BYTES:
            raise UsageError(f"max_bytes must be between {ENVELOPE_BYTES + 2} and {API_MAX_BYTES}, got "
                             f"{self.max_bytes}", setting="max_bytes")
        if self.api_version not in API_VERSIONS:
            raise UsageError(f"API version {self.api_version!r}: use {' or '.join(API_VERSIONS)}",
                             setting="api_version")

    def under(self, api_version: str) -> Limits:
        """These limits, judged by another API version."""
        return Limits(self.max_requests, self.max_bytes, api_version)


class Packer:
    """Greedy packing in input order: a batch closes only when the next item would break a limit.

    `add` returns True when the item opens a new batch (the previous one closed).
    """

    __slots__ = ("max_requests", "max_bytes", "count", "size", "batches", "_closed")

    def __init__(self, limits: Limits) -> None:
        self.max_requests = limits.max_requests
        self.max_bytes = limits.max_bytes
        self.count = 0  # items in the open batch
        self.size = ENVELOPE_BYTES  # body bytes of the open batch
        self.batches = 0  # batches opened so far
        self._closed = (0, 0)  # (count, bytes) of the batch closed last

    @property
    def closed(self) -> tuple[int, int]:
        """(requests, body bytes) of the batch closed last."""
        return self._closed

    def add(self, item_len: int) -> bool:
        if self.count and (self.count >= self.max_requests or self.size + 1 + item_len > self.max_bytes):
            self._closed = (self.count, self.size)
            self.count = 0
            self.size = ENVELOPE_BYTES
        opened = self.count == 0
        if opened:
            self.batches += 1
            self.size += item_len
        else:
            self.size += 1 + item_len
        self.count += 1
        return opened

    def add_many(self, lengths: Sequence[int], total: int | None = None) -> list[tuple[int, int, int]]:
        """`add` for a run of items, in C-speed steps rather than one Python step an item (`total`: their sum, if known).

        Returns, for each batch that opens in the run, (index of its first item, request count and body
        bytes of the batch it closed); the first batch ever closes nothing and gives (0, 0, 0).
        """
        opened: list[tuple[int, int, int]] = []
        count, size = self.count, self.size
        m = len(lengths)
        if not m:
            return opened
        grown = size + (sum(lengths) if total is None else total) + m - (0 if count else 1)
        if count + m <= self.max_requests and grown <= self.max_bytes:  # the common case: the run fits whole
            if not count:
                opened.append((0, *self._closed))
                self.batches += 1
            self.count, self.size = count + m, grown
            return opened
        # ends[k] = sum of (length + 1) over the first k items: every item after a batch's first adds its
        # length and one separator, so items a..b-1 joining a batch add ends[b] - ends[a] bytes.
        ends = list(accumulate(map(add, lengths, repeat(1)), initial=0))
        a = 0
        while a < m:
            if count:
                room_items, room_bytes = self.max_requests - count, self.max_bytes - size
            else:  # an empty batch: its first item adds no separator, so count from one byte less
                room_items, room_bytes = self.max_requests, self.max_bytes - ENVELOPE_BYTES + 1
            b = min(m, a + room_items, bisect_right(ends, ends[a] + room_bytes, a) - 1)
            if b > a:
                if not count:
                    opened.append((a, *self._closed))
                    self.batches += 1
                    size -= 1
                size += ends[b] - ends[a]
                count += b - a
                a = b
            elif count:  # the next item does not fit: the open batch closes
                self._closed = (count, size)
                count, size = 0, ENVELOPE_BYTES
            else:
                raise ValueError(f"an item of {lengths[a]} bytes fits in no batch of {self.max_bytes} bytes")
        self.count, self.size = count, size
        return opened


def pack_rows(rows: list[PendingRow], limits: Limits) -> list[list[PendingRow]]:
    """Requests in line order, cut by the one packing rule (`Packer`)."""
    packer = Packer(limits)
    groups: list[list[PendingRow]] = []
    for r in rows:
        if packer.add(r.length):
            groups.append([])
        groups[-1].append(r)
    return groups
