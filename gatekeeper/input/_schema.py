"""A request line as types: the wire shape, and what each API version refuses, checked by msgspec's compiled
decoder while it parses (docs/decisions.md: why msgspec).

A line is `{"custom_id": ..., "params": {...}}` and nothing else. `params` holds the model, `max_tokens` (at least
1), a non-empty list of messages (each a user or an assistant turn whose content is a string or a list of typed
blocks), and optionally a system prompt (a string or text blocks), tools and a top-level `cache_control`; `stream`
may only be false and `speed` only "standard" (a batch neither streams nor runs in fast mode). Whatever else
`params` holds is the API's to judge: new parameters pass. A block's type must be one the API documents
(`ContentBlockParam`, the SDK's list); its payloads (`source`, `input`, a tool result's `content`) are kept as raw
bytes, unparsed: they are sent as given, and weighed only when a cache marker's prefix holds them.

API version 2026-10-21 refuses `temperature`, `top_p` and `top_k` at any value, a document block in an assistant
turn, and non-empty citations on a user turn's blocks (the API's migration guide to that version): `Params2026`
says so.

What types cannot say is checked after decoding, over these values (`_reader`): the custom_id's characters (a
pattern here would call Python's `re` for every line: a third of the decode's cost), the batch's byte limit,
uniqueness, the Models API's verdicts and the cache markers (`_markers`). Every struct is `gc=False`: decoded trees
hold no cycles, so the collector need not track them.
"""



from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from .._wire import STRICT_VERSION

CUSTOM_ID_PATTERN = "[A-Za-z0-9_-]{1,64}"

Refused = UnsetType
"""A field a version refuses at any value: present, it fails to decode (`UnsetType` decodes from nothing)."""


class CacheControl(Struct, gc=False, omit_defaults=True):
    """A cache marker. Its life is checked with the others of its request (`_markers`): the rules span markers.
    Each one decoded is counted (`markers_decoded`), so that a reader knows a chunk of lines with none at once."""

    type: str = "ephemeral"
    ttl: str = "5m"

    def __post_init__(self) -> None:
        _markers[0] += 1


_markers = [0]


def markers_decoded() -> int:
    """How many cache markers were decoded so far (in this process)."""
    return _markers[0]


class _Block(Struct, tag_field="type", kw_only=True, gc=False, omit_defaults=True):
    cache_control: CacheControl | None = None


class Text(_Block, tag="text"):
    text: str
    citations: list[Any] | None = None


class Image(_Block, tag="image"):
    source: Raw


class Document(_Block, tag="document"):
    source: Raw
    title: str | None = None
    context: str | None = None
    citations: Any = None


class SearchResult(_Block, tag="search_result"):
    content: Raw
    source: str
    title: str
    citations: Any = None


class Thinking(_Block, tag="thinking"):
    thinking: str
    signature: str


class RedactedThinking(_Block, tag="redacted_thinking"):
    data: str


class ToolUse(_Block, tag="tool_use"):
    id: str
    name: str
    input: Raw


class ServerToolUse(_Block, tag="server_tool_use"):
    id: str
    name: str
    input: Raw


class ToolResult(_Block, tag="tool_result"):
    tool_use_id: str
    content: Raw | UnsetType = UNSET
    is_error: bool | None = None


class _ServerResult(_Block):
    tool_use_id: str
    content: Raw


class WebSearchResult(_ServerResult, tag="web_search_tool_result"):
    pass


class WebFetchResult(_ServerResult, tag="web_fetch_tool_result"):
    pass


class CodeExecutionResult(_ServerResult, tag="code_execution_tool_result"):
    pass


class BashCodeExecutionResult(_ServerResult, tag="bash_code_execution_tool_result"):
    pass


class TextEditorCodeExecutionResult(_ServerResult, tag="text_editor_code_execution_tool_result"):
    pass


class ToolSearchResult(_ServerResult, tag="tool_search_tool_result"):
    pass


class ContainerUpload(_Block, tag="container_upload"):
    file_id: str


# The blocks no version refuses anywhere (a union inside a union is flattened).
_Others = (SearchResult | Thinking | RedactedThinking | ToolUse | ServerToolUse | ToolResult | WebSearchResult
           | WebFetchResult | CodeExecutionResult | BashCodeExecutionResult | TextEditorCodeExecutionResult
           | ToolSearchResult | ContainerUpload)
Block = Text | Image | Document | _Others
BLOCK_TYPES = tuple(b.__struct_config__.tag for b in get_args(Block))  # (for a refusal's words)


class Tool(Struct, gc=False, omit_defaults=True):
    """A tool: a custom one (`input_schema`) or one of the API's server tools (`type`, versioned by date)."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: Raw | UnsetType = UNSET
    cache_control: CacheControl | None = None


class Message(Struct, gc=False):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Params(Struct, gc=False):
    model: Annotated[str, Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[Text] | None = None
    tools: list[Tool] | None = None
    cache_control: CacheControl | None = None
    stream: Literal[False] = False  # a batch does not stream
    speed: Literal["standard"] = "standard"  # fast mode is not offered in a batch


class Request(Struct, gc=False, forbid_unknown_fields=True):
    custom_id: Annotated[str, Meta(min_length=1, max_length=64)]  # (its characters: `_reader`)
    params: Params


# API version 2026-10-21: the same, with its refusals.

class UserText2026(Text, tag="text"):
    citations: Annotated[list[Any], Meta(max_length=0)] | None = None  # (non-empty: refused)


class UserTurn2026(Struct, tag_field="role", tag="user", gc=False):
    content: str | list[UserText2026 | Image | Document | _Others]


class AssistantTurn2026(Struct, tag_field="role", tag="assistant", gc=False):
    content: str | list[Text | Image | _Others]  # (no document)


class Params2026(Params):
    messages: Annotated[list[UserTurn2026 | AssistantTurn2026], Meta(min_length=1)]  # type: ignore[assignment]
    temperature: Refused = UNSET
    top_p: Refused = UNSET
    top_k: Refused = UNSET


class Request2026(Request):
    params: Params2026


_decoders: dict[str, msgspec.json.Decoder[Request]] = {}


def decoder(api_version: str) -> msgspec.json.Decoder[Request]:
    """The decoder of request lines under `api_version`, built once (building one walks every type)."""
    if api_version not in _decoders:
        _decoders[api_version] = msgspec.json.Decoder(Request2026 if api_version == STRICT_VERSION else Request)
    return _decoders[api_version]


class Prompt(Struct, gc=False):
    """What a marker walk reads of `params` (`_markers`), for params given as values rather than a line read:
    a re-priming's, a test's. Unlike `Params`, nothing is required."""

    messages: list[Message] = []
    system: str | list[Text] | None = None
    tools: list[Tool] | None = None
    cache_control: CacheControl | None = None


Part = str | Tool | Block
"""A piece of a prompt in the API's order: a tool, a system block (or the system string), a turn's block (or its
content string). (Any `Block` type may be one.)"""
