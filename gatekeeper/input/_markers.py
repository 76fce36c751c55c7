"""Cache markers the API refuses, found before anything is sent. Pure.

In a batch a refused marker comes back as an errored line hours later, billed for nothing useful: `validate`
rejects the line instead, naming why. What is refused (the prompt-caching docs): more than 4 markers in a
request, a `ttl` other than 5m or 1h, and a 1h marker after a 5m one (1h markers must come first, in the order
tools, system, messages). Where the docs leave it open, a line is accepted: the top-level (automatic) marker is
checked for its `ttl` only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: `plan` never imports typing, see gatekeeper/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

MAX_MARKERS = 4
LIVES = ("5m", "1h")

Point = tuple[int, int, str]  # a marked prefix: (its bytes, its digest, its life "5m" or "1h")


def marker_reason(params: dict[str, Any]) -> str | None:
    """Why the API would refuse this request's cache markers, or None."""
    top = params.get("cache_control")
    if top is not None and _life(top) not in LIVES:
        return f"cache_control ttl {_life(top)!r}: the API takes 5m or 1h"
    lives = []
    for block in _blocks(params):
        marker = block.get("cache_control")
        if marker is None:
            continue
        life = _life(marker)
        if life not in LIVES:
            return f"cache_control ttl {life!r}: the API takes 5m or 1h"
        lives.append(life)
    if len(lives) > MAX_MARKERS:
        return f"{len(lives)} cache_control markers: the API takes at most {MAX_MARKERS} in a request"
    if "5m" in lives and "1h" in lives[lives.index("5m"):]:
        return "a 1h cache_control marker after a 5m one: the API wants the 1h markers first (tools, system, messages)"
    return None


def marker_points(params: dict[str, Any], model: str) -> tuple[Point, ...]:
    """The request's marked prefixes, shortest first: what the API may cache for it (after `marker_reason`).

    A prefix is the model and every part of the prompt up to and including a marked block, in the order the API
    reads it (tools, system, messages); its digest is chained over those parts (`hash`, stable within one run, so
    equal prefixes of two lines compare equal). The top-level (automatic) marker marks the whole prompt."""
    import orjson  # (already loaded by the reader; imported here so that this module stays import-free)

    points: list[Point] = []
    size, digest = 0, hash(model)
    for part in _parts(params):
        data = orjson.dumps(part)
        size += len(data)
        digest = hash((digest, data))
        marker = part.get("cache_control") if isinstance(part, dict) else None
        if marker is not None:
            points.append((size, digest, _life(marker)))
    top = params.get("cache_control")
    if top is not None and size and (not points or points[-1][0] < size):
        points.append((size, digest, _life(top)))
    return tuple(points)


def _parts(params: dict[str, Any]) -> Iterator[Any]:
    """Every part of the prompt in the order the API reads a prefix: tools, the system (a string or its blocks),
    then each message's content (a string, or its blocks)."""
    tools, system = params.get("tools"), params.get("system")
    if isinstance(tools, list):
        yield from tools
    if isinstance(system, list):
        yield from system
    elif system is not None:
        yield system
    messages = params.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            yield from content
        else:
            yield content


def _life(marker: Any) -> Any:
    return marker.get("ttl", "5m") if isinstance(marker, dict) else marker


def _blocks(params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The prompt's blocks that can carry a marker, in the order the prefix is read: tools, system, messages."""
    for group in (params.get("tools"), params.get("system")):
        if isinstance(group, list):
            yield from (b for b in group if isinstance(b, dict))
    messages = params.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            yield from (b for b in content if isinstance(b, dict))
