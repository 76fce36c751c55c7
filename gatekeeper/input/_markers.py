"""Cache markers the API refuses, found before anything is sent. Pure.

In a batch a refused marker comes back as an errored line hours later, billed for nothing useful: `validate`
rejects the line instead, naming why. What is refused (the prompt-caching docs): more than 4 markers in a
request, a `ttl` other than 5m or 1h, and a 1h marker after a 5m one (1h markers must come first, in the order
tools, system, messages). Where the docs leave it open, a line is accepted: the top-level (automatic) marker is
checked for its `ttl` only.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._schema import CacheControl, Params, Part, Prompt, Request, Text

MAX_MARKERS = 4
LIVES = ("5m", "1h")

Point = tuple[int, int, str]  # a marked prefix: (its bytes, its digest, its life "5m" or "1h")


def marker_walk(params: Params | Prompt | dict[str, Any], model: str, memo: Memo | None = None
                ) -> tuple[str | None, tuple[Point, ...]]:
    """One walk over the request's parts (tools, the system as a string or its blocks, then each message's content):
    why the API would refuse its markers (None when it would not), and its marked prefixes. Only the parts up to
    the last marker are serialized and digested (the rest of the prompt is in no prefix, unless the top-level
    marker marks the whole of it). `params` as values (a dict) is read as the reader reads a line (`Prompt`)."""
    if isinstance(params, dict):
        params = _prompt.decode(msgspec.json.encode(params))
    parts: list[Part] = []
    if params.tools is not None:
        parts += params.tools
    system = params.system
    if system.__class__ is list:
        parts += system
    elif system is not None:
        parts.append(system)  # type: ignore[arg-type]
    for message in params.messages:
        content = message.content
        if content.__class__ is list:
            parts += content
        else:
            parts.append(content)  # type: ignore[arg-type]
    return _walk(parts, params.cache_control, model, memo)


def system_walk(system: list[Text] | list[dict[str, Any]], model: str, memo: Memo | None = None
                ) -> tuple[str | None, tuple[Point, ...]]:
    """`marker_walk` of a request whose only blocks are its system's: no tools, no top-level marker, every message
    plain text (the shape `plan`'s reader tells apart, the common one of a shared document). Its markers can stand
    only in the system's blocks, so those are the parts, as they are: nothing gathered. A system equal to the last
    line's, of the same model, gets the last answer at once."""
    if system and isinstance(system[0], dict):
        system = _blocks.decode(msgspec.json.encode(system))
    if memo is not None and model == memo.model and system == memo.parts:
        return memo.answer
    return _walk(system, None, model, memo)  # type: ignore[arg-type]


def chunk_walks(requests: list[Request], memos: dict[str, Memo]) -> tuple[dict[int, str], list[int], list[tuple[Point, ...]]]:
    """`marker_walk` of each line of a chunk the reader decoded that holds a marker (`holds_marker`), with a `Memo` a
    model (files interleave models, and a prefix is per model): why the API would refuse a line's markers, by index;
    the indices of the others, and their prefixes. A request whose only blocks are its system's (no tools, no
    top-level marker, one message of plain text: the common shape of a shared document) is walked over those alone
    (`system_walk`), and one whose system equals its model's last walk's gets that answer at once: such a marked
    line's only step in Python is this loop's."""
    reasons: dict[int, str] = {}
    noted: list[int] = []
    points: list[tuple[Point, ...]] = []
    memo = Memo()
    for k, request in enumerate(requests):
        params = request.params
        model, system, messages = params.model, params.system, params.messages
        if model != memo.model:
            memo = memos.get(model) or memos.setdefault(model, Memo())
        if (system.__class__ is list and params.tools is None and params.cache_control is None and len(messages) == 1
                and messages[0].content.__class__ is str):
            if model == memo.model and system == memo.parts:  # (the last walk's parts, which held a marker)
                answer = memo.answer
            elif any(block.cache_control is not None for block in system):
                answer = _walk(system, None, model, memo)  # type: ignore[arg-type]
            else:
                continue
        elif holds_marker(params):
            answer = marker_walk(params, model, memo)
        else:
            continue
        if answer[0] is not None:
            reasons[k] = answer[0]
        elif answer[1]:
            noted.append(k)
            points.append(answer[1])
    return reasons, noted, points


class Memo:
    """The last walk of a reader: its model, its parts, those up to its last marker (`head`), each with the prefix
    size and digest up to it (`walked`), and its answer. A line whose head equals the last one's (the usual order: a
    document's requests one after another) gets the same answer after one equality check, a memory compare of the
    document (the serializing and the siphash it saves are about 30 times that); one whose head begins as the last
    one's did takes those parts' sizes and digests. (Equality is Python's: 1 and 1.0 compare equal, a difference
    the estimate bears.)"""

    __slots__ = ("model", "parts", "head", "walked", "answer")

    def __init__(self) -> None:
        self.model: str | None = None
        self.parts: list[Part] | None = None  # all the parts, where no top-level marker was
        self.head: list[Part] | None = None
        self.walked: list[tuple[Part, int, int]] = []
        self.answer: tuple[str | None, tuple[Point, ...]] = (None, ())


def _walk(parts: list[Part], top: CacheControl | None, model: str, memo: Memo | None
          ) -> tuple[str | None, tuple[Point, ...]]:
    """The walk of `marker_walk` over the prompt's parts in the API's order; `top`: the top-level marker, if any."""
    last = len(parts)
    if top is None:
        while last and _marker(parts[last - 1]) is None:
            last -= 1
    head = parts if last == len(parts) else parts[:last]
    if memo is None:
        return _digest(head, top, model, [], [])
    same = model == memo.model
    if same and top is None and head == memo.head:
        return memo.answer
    walked: list[tuple[Part, int, int]] = []
    answer = _digest(head, top, model, memo.walked if same else [], walked)
    memo.model, memo.walked, memo.answer = model, walked, answer
    memo.parts, memo.head = (parts, head) if top is None else (None, None)
    return answer


def _digest(head: list[Part], top: CacheControl | None, model: str, before: list[tuple[Part, int, int]],
            walked: list[tuple[Part, int, int]]) -> tuple[str | None, tuple[Point, ...]]:
    """The check and the points of the parts up to the last marker (`head`). `plan`'s hot path on marked lines: a
    prefix's digest is chained over its parts' serialized bytes (as the schema encodes them: payloads as given), the
    size and digest up to each part appended to `walked`; the first parts' come from `before` (the last walk's)
    while the head is the last one's part for part."""
    dumps = msgspec.json.encode
    points: list[Point] = []
    size, digest = 0, hash(model)
    seen_5m = late_1h = False
    known = len(before)
    for k, part in enumerate(head):
        if k < known and part == before[k][0]:
            size, digest = before[k][1], before[k][2]
        else:
            known = 0
            data = dumps(part)
            size += len(data)
            digest = hash((digest, data))
        walked.append((part, size, digest))
        marker = _marker(part)
        if marker is not None:
            life = marker.ttl
            if life == "5m":
                seen_5m = True
            elif life == "1h":
                late_1h = late_1h or seen_5m
            else:
                return f"cache_control ttl {life!r}: the API takes 5m or 1h", ()
            points.append((size, digest, life))
    if len(points) > MAX_MARKERS:
        return f"{len(points)} cache_control markers: the API takes at most {MAX_MARKERS} in a request", ()
    if late_1h:
        return "a 1h cache_control marker after a 5m one: the API wants the 1h markers first (tools, system, messages)", ()
    if top is not None:
        life = top.ttl
        if life not in LIVES:
            return f"cache_control ttl {life!r}: the API takes 5m or 1h", ()
        if size and (not points or points[-1][0] < size):
            points.append((size, digest, life))
    return None, tuple(points)


def holds_marker(params: Params) -> bool:
    """Whether a request holds a cache marker: at the top, or on a system block, a tool or a turn's block."""
    if params.cache_control is not None:
        return True
    system = params.system
    if system.__class__ is list:
        for block in system:
            if block.cache_control is not None:
                return True
    for tool in params.tools or ():
        if tool.cache_control is not None:
            return True
    for message in params.messages:
        content = message.content
        if content.__class__ is list:
            for part in content:
                if part.cache_control is not None:
                    return True
    return False


def marker_reason(params: Params | Prompt | dict[str, Any]) -> str | None:
    """Why the API would refuse this request's cache markers, or None (`marker_walk`'s first answer)."""
    return marker_walk(params, "")[0]


def marker_points(params: Params | Prompt | dict[str, Any], model: str) -> tuple[Point, ...]:
    """The marked prefixes of a request whose markers the API takes, shortest first (`marker_walk`'s second
    answer): what the API may cache for it. A prefix is the model and every part of the prompt up to and including
    a marked block, in the order the API reads it (tools, system, messages); its digest is chained over those parts
    (`hash`, stable within one run, so equal prefixes of two lines compare equal). The top-level (automatic) marker
    marks the whole prompt."""
    return marker_walk(params, model)[1]


def _marker(part: Part) -> CacheControl | None:
    return None if part.__class__ is str else part.cache_control  # type: ignore[union-attr]


_prompt = msgspec.json.Decoder(Prompt)
_blocks = msgspec.json.Decoder(list[Text])
