"""The API's typed error codes (`error.details.error_code`, api.md §25) and what each means to a batch job. Pure.

The SDK (2.x, `_error_classes.py`) maps (status, code) to a class; here a code says what the run does:

- a wait (`WAIT`): 429 `ramp_limit_exceeded` (usage growing too fast) and the load-shedding 429 that carries
  `"details": null` ("not your usage limit"). Both wait their retry-after; neither is a full queue, so neither
  teaches admission anything about the ceiling;
- a stop (`STOPS`): the account's state refuses every request until someone lifts it (a spend limit, billing, an
  organization on hold, a workspace's encryption key disabled, Human Review off, a Claude Code key whose creator
  left). Nothing sent now can succeed: the run stops with its requests still to send, one line naming the code;
- a retry (`RETRIED`): 503 `cmek_key_unreachable`, a read retried as any 5xx. On a create it is also proof that no
  batch was made (`NOT_MADE`): the API names why it refused before storing anything (the workspace's encryption key,
  needed to store a batch, was out of reach), so the batch waits its backoff and goes again without waiting out the
  reconcile grace a bare 5xx needs (a 5xx without a code may follow a create that was made).

A code this table does not know is read by its status, as before codes existed: a 5xx with an unknown code is still
an unknown outcome on a create, reconciled before anything is sent again.
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
# The 5xx codes that prove a create made nothing (api.md §25: a refusal the API types, not a failure mid-way). Every
# code below 500 proves it too (a refusal is answered before anything is made, §7); a 5xx without one of these does not.
NOT_MADE = RETRIED
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


def create_not_made(status: int, code: str | None) -> bool:
    """Whether a create's error answer proves no batch was made: any refusal below 500, and a 5xx only when it
    carries a code of `NOT_MADE` (a 5xx without one may follow a create that was made: reconciled first)."""
    return status < 500 or code in NOT_MADE


def stop_line(code: str, message: str, details: dict[str, Any]) -> str:
    """A stop's line: what the code means, what the API said, the appeal URL when it gives one."""
    said = f"{STOPS[code]} ({message})" if message else STOPS[code]
    url = details.get("appeal_url")
    if isinstance(url, str) and url.strip():
        said += f"; appeal at {''.join(c for c in url.strip() if c.isprintable())[:MAX_URL]}"
    return f"{said}; {LIFTED}"
