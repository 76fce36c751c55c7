"""The API's typed error codes (`error.details.error_code`, api.md §25) and what each means to a batch job. Pure.

The SDK (2.x, `_error_classes.py`) maps (status, code) to a class; here a code says what the run does:

- a wait (`WAIT`): 429 `ramp_limit_exceeded` (usage growing too fast) and the load-shedding 429 that carries
  `"details": null` ("not your usage limit"). Both wait their retry-after; neither is a full queue, so neither
  teaches admission anything about the ceiling;
- a stop (`STOPS`): the account's state refuses every request until someone lifts it (a spend limit, billing, an
  organization on hold, a workspace's encryption key disabled, Human Review off, a Claude Code key whose creator
  left). Nothing sent now can succeed: the run stops with its requests still to send, one line naming the code;
- a retry: 503 `cmek_key_unreachable` is a 5xx like any other (reads retried, a create reconciled first).

A code this table does not know is read by its status, as before codes existed.
"""

from __future__ import annotations

from typing import Any

RAMP = "ramp_limit_exceeded"
SHED = "load_shedding"  # (not a code of the API's: how this module names a 429 whose details are null)
WAIT = frozenset({RAMP, SHED})

SPEND = {  # -> what it means; SpendLimitReached
    "enforced_spend_limit_reached": "the organization crossed its API tier's monthly usage threshold",
    "contract_spend_limit_reached": "the organization reached its contract's spend limit",
    "linked_organization_spend_limit_reached": "the organization linked to this user profile reached a spend limit "
                                               "it set, or lacks credit",
    "linked_organization_billing_unavailable": "the organization linked to this user profile cannot be billed now",
}
HELD = {  # -> what it means and what lifts it; AccountRefused
    "organization_on_hold": "Anthropic has put the organization on hold",
    "workspace_human_review_disabled": "the workspace has Human Review turned off, which this call needs: use a "
                                       "workspace with it on",
    "cmek_key_disabled": "the workspace's customer-managed encryption key is disabled or revoked: re-enable it",
    "claude_code_key_creator_not_member": "the key belongs to the Claude Code workspace and its creator is no longer "
                                          "a member of the organization or of that workspace: use another key",
}
STOPS = {**SPEND, **HELD}
RETRIED = frozenset({"cmek_key_unreachable"})
MAX_URL = 300  # characters of an appeal URL shown
LIFTED = "nothing more is sent until it is lifted, then the same command goes on"


def code_of(status: int, raw: dict[str, Any] | None) -> str | None:
    """The code an error answer carries (`raw`: its `error` object), or `SHED` for a 429 whose details are null;
    None when it has none (or its error is not an object)."""
    if raw is None:
        return None
    details = raw.get("details", ...)
    if details is None:  # (present, and null: the load-shedding 429)
        return SHED if status == 429 else None
    code = details.get("error_code") if isinstance(details, dict) else None
    return code if isinstance(code, str) and code else None


def stop_line(code: str, message: str, details: dict[str, Any]) -> str:
    """A stop's line: what the code means, what the API said, the appeal URL when it gives one."""
    said = f"{STOPS[code]} ({message})" if message else STOPS[code]
    url = details.get("appeal_url")
    if isinstance(url, str) and url.strip():
        said += f"; appeal at {''.join(c for c in url.strip() if c.isprintable())[:MAX_URL]}"
    return f"{said}; {LIFTED}"
