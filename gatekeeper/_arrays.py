"""Arrays filled without a Python step an item: `struct` converts an int in about a quarter of the instructions an
array's own item conversion takes (`array.append`, `array(code, list)` and `array.extend(list)` parse each item as
an argument), so the reader's columns and the caching facts are packed through it."""

from __future__ import annotations

import struct
from array import array

from ._typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


def packed(code: str, values: list[Any] | tuple[Any, ...]) -> bytes:
    """The machine bytes of `array(code, values)`."""
    return struct.pack(f"{len(values)}{code}", *values)


def extend(target: array[Any], values: Iterable[float]) -> array[Any]:
    """`target.extend(values)`, returning `target`; an array of the same type is copied as it is."""
    if isinstance(values, array) and values.typecode == target.typecode:
        target.extend(values)
    else:
        target.frombytes(packed(target.typecode, values if isinstance(values, (tuple, list)) else tuple(values)))
    return target
