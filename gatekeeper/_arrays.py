"""Arrays filled from lists at C speed, for the reader's columns and the caching facts.

`array.fromlist` converts the items in one C loop. Measured on Python 3.11, over 100,000 ints scattered in memory as
the reader leaves them, it beats `struct.pack(f"{n}I", *values)`: 0.4 ms against 1.7 ms ('I'), 1.1 against 1.7
('q'), 1.7 against 2.3 ('i'). The star call first copies every item into an argument tuple, touching each int once
more. `array(code, values)` and `array.extend` iterate item by item."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any


def packed(code: str, values: list[Any]) -> bytes:
    """The machine bytes of `array(code, values)`."""
    out = array(code)
    out.fromlist(values)
    return out.tobytes()


def extend(target: array[Any], values: Iterable[float]) -> array[Any]:
    """`target.extend(values)`, returning `target`; an array of the same type is copied as it is."""
    if isinstance(values, array) and values.typecode == target.typecode:
        target.extend(values)
    else:
        target.fromlist(values if values.__class__ is list else list(values))
    return target
