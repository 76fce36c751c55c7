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
