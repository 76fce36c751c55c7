"""The API's reads beside the batches, one function each over an `ApiClient`: the Models API, token counting and
the Admin API's rate limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from ._client import ApiClient
from ._http import PREFLIGHT_RETRY


async def get_model(api: ApiClient, name: str) -> dict[str, Any]:
    """GET /v1/models/{name}: the model's info (an alias resolves to its id); NotFoundError when unknown."""
    return dict(await api.calls.call("GET", f"/v1/models/{quote(name, safe='')}", "models", retry=PREFLIGHT_RETRY, budgeted=False))

async def iter_models(api: ApiClient, *, max_pages: int = 100) -> AsyncIterator[dict[str, Any]]:
    """Every model GET /v1/models lists, following its pages."""
    params: dict[str, Any] = {"limit": 1000}
    for _ in range(max_pages):
        page = await api.calls.call("GET", "/v1/models", "models", params=dict(params), retry=PREFLIGHT_RETRY,
                                budgeted=False)
        data = [m for m in page.get("data") or [] if isinstance(m, dict)]
        for m in data:
            yield m
        if not page.get("has_more") or not data:
            return
        params["after_id"] = page.get("last_id") or data[-1].get("id")

async def count_tokens(api: ApiClient, body: dict[str, Any]) -> int:
    """POST /v1/messages/count_tokens: the input tokens of a Messages body (not billed)."""
    answer = await api.calls.call("POST", "/v1/messages/count_tokens", "count_tokens", json=body, retry=PREFLIGHT_RETRY,
                              budgeted=False)
    return int(answer["input_tokens"])


async def rate_limits(api: ApiClient, group_type: str | None = "batch", max_pages: int = 20) -> list[dict[str, Any]]:
    """Every entry of GET /v1/organizations/rate_limits (an Admin key), following next_page."""
    entries: list[dict[str, Any]] = []
    params: dict[str, Any] = {"group_type": group_type} if group_type else {}
    for _ in range(max_pages):
        page = await api.calls.call("GET", "/v1/organizations/rate_limits", "rate_limits", params=dict(params))
        entries.extend(e for e in (page.get("data") or []) if isinstance(e, dict))
        nxt = page.get("next_page")
        if not nxt:
            break
        params["page"] = nxt
    return entries
