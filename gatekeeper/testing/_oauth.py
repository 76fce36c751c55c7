"""The fake's credentials without keys (api.md §23): workload identity federation's token endpoint, bearer calls, and
an organization that refuses API keys when asked.

`POST /v1/oauth/token` takes the jwt-bearer grant as the SDK (`anthropic` 2.x) sends it: the federation beta header,
a rule and an organization that match, an identity token (a JWT, its signature not checked) whose issuer and, when
the rule names one, subject match the rule and which has not expired; the workspace asked for must be one the rule
enables (none asked: the rule's only one). It answers an access token of `token_life` seconds, for that workspace
only. It takes the refresh_token grant of a login too. Refusals are OAuth's `{"error", "error_description"}`.

A call with `Authorization: Bearer` is accepted for a token issued here that has not expired, with
`anthropic-beta: oauth-2025-04-20`, or for a static one (`bearer_tokens`: a gateway's token, a key sent as Bearer),
which needs no beta (the SDK sends `ANTHROPIC_AUTH_TOKEN` as a plain Bearer); a federation token acts on its own
workspace only, a static one on the workspace `anthropic-workspace-id` names (its first by default). Every bearer
call's beta header is counted (`betas`), so a test can tell what was sent.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ._model import new_id

if TYPE_CHECKING:
    from ._wire import Wire

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
OAUTH_BETA = "oauth-2025-04-20"
FEDERATION_BETA = "oidc-federation-2026-04-01"


@dataclass
class FakeRule:
    organization_id: str = "org_fake_1"
    issuer: str = "https://issuer.example.test"
    subject: str | None = None  # None: any subject of the issuer
    workspaces: tuple[str, ...] = ("wrkspc_1",)  # the fake's workspace ids (the values of FakeConfig.workspaces)


@dataclass
class Issued:
    workspaces: tuple[str, ...]
    expires_at: float | None  # on the fake's clock (real seconds); None: never
    federated: bool  # a federation token acts on its one workspace; the header cannot switch it
    issued_at: float = 0.0


@dataclass
class FakeFederation:
    rules: dict[str, FakeRule] = field(default_factory=lambda: {"fdrl_fake_1": FakeRule()})
    token_life: float = 600.0  # seconds an access token lives
    keys_refused: bool = False  # the organization takes no API keys (workload identity only)
    tokens_revoked: bool = False  # every bearer call is refused, however fresh its token (a service account disabled)
    bearer_tokens: dict[str, tuple[str, ...]] = field(default_factory=dict)  # static token -> its workspaces
    refresh_tokens: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)  # -> (client id, workspaces)
    issued: dict[str, Issued] = field(default_factory=dict)
    exchanges: list[dict[str, Any]] = field(default_factory=list)  # each token minted: grant, workspace, jti, at
    refused: list[str] = field(default_factory=list)  # why each refused exchange or call was refused
    expired_calls: int = 0  # calls refused because their token had expired
    calls_by_workspace: dict[str, int] = field(default_factory=dict)  # bearer calls accepted, by workspace
    betas: dict[str, int] = field(default_factory=dict)  # bearer calls by their anthropic-beta header ("": none)


def token_endpoint(h: Wire) -> None:
    fed = h.server.fake.config.federation
    body = h.read_body() or b""
    if fed is None:
        return h.send_api_error(404, "no route for POST /v1/oauth/token")
    try:
        asked = orjson.loads(body)
    except orjson.JSONDecodeError:
        asked = None
    if not isinstance(asked, dict):
        return _refuse(h, fed, 400, "invalid_request", "the body is not a JSON object")
    flags = _flags(h)
    with h.server.fake.org.lock:
        if asked.get("grant_type") == JWT_BEARER:
            if FEDERATION_BETA not in flags:
                return _refuse(h, fed, 400, "invalid_request", f"the {FEDERATION_BETA} beta header is required")
            return _federate(h, fed, asked)
        if asked.get("grant_type") == "refresh_token":
            return _refresh(h, fed, asked)
    return _refuse(h, fed, 400, "unsupported_grant_type", f"grant_type {asked.get('grant_type')!r}")


def _federate(h: Wire, fed: FakeFederation, asked: dict[str, Any]) -> None:
    rule = fed.rules.get(str(asked.get("federation_rule_id")))
    if rule is None:
        return _refuse(h, fed, 401, "invalid_grant", "no federation rule matches")
    if asked.get("organization_id") != rule.organization_id:
        return _refuse(h, fed, 401, "invalid_grant", "the organization does not match the federation rule")
    claims = _claims(str(asked.get("assertion") or ""))
    if claims is None:
        return _refuse(h, fed, 400, "invalid_request", "the assertion is not a JWT")
    if claims.get("iss") != rule.issuer:
        return _refuse(h, fed, 401, "invalid_grant", "the identity token's issuer does not match the federation rule")
    if rule.subject is not None and claims.get("sub") != rule.subject:
        return _refuse(h, fed, 401, "invalid_grant", "the identity token's subject does not match the federation rule")
    if not isinstance(claims.get("exp"), (int, float)) or claims["exp"] <= h.server.fake.org.wall():
        return _refuse(h, fed, 401, "invalid_grant", "the identity token has expired")
    workspace = asked.get("workspace_id")
    if workspace is None:
        if len(rule.workspaces) != 1:
            return _refuse(h, fed, 400, "invalid_request", "workspace_id is required: the rule enables several")
        workspace = rule.workspaces[0]
    if workspace not in rule.workspaces:
        return _refuse(h, fed, 403, "invalid_grant", f"the federation rule does not enable workspace {workspace}")
    _issue(h, fed, (str(workspace),), "jwt-bearer", federated=True, jti=claims.get("jti"))


def _refresh(h: Wire, fed: FakeFederation, asked: dict[str, Any]) -> None:
    known = fed.refresh_tokens.pop(str(asked.get("refresh_token")), None)
    if known is None or known[0] != asked.get("client_id"):
        return _refuse(h, fed, 400, "invalid_grant", "the refresh token is not valid")
    rotated = new_id("rt_", h.server.fake.id_rng)
    fed.refresh_tokens[rotated] = known  # (rotated: the old one is spent)
    _issue(h, fed, known[1], "refresh_token", federated=False, refresh_token=rotated)


def _issue(h: Wire, fed: FakeFederation, workspaces: tuple[str, ...], grant: str, *, federated: bool,
           **extra: Any) -> None:
    token = new_id("fake-access-", h.server.fake.id_rng)  # (nothing like a real token's form)
    now = h.server.fake.org.clock()
    fed.issued[token] = Issued(workspaces, now + fed.token_life, federated, now)
    fed.exchanges.append({"grant": grant, "workspace": workspaces[0], "jti": extra.pop("jti", None), "at": now})
    h.send_json(200, {"access_token": token, "token_type": "Bearer", "expires_in": max(1, int(fed.token_life)),
                      **extra})


def _refuse(h: Wire, fed: FakeFederation, status: int, error: str, description: str) -> None:
    fed.refused.append(description)
    h.send_json(status, {"error": error, "error_description": description})


def _claims(jwt: str) -> dict[str, Any] | None:
    parts = jwt.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return claims if isinstance(claims, dict) else None


def _flags(h: Wire) -> list[str]:
    return [f.strip() for f in (h.headers.get("anthropic-beta") or "").split(",")]


def bearer_workspace(h: Wire, fed: FakeFederation, token: str) -> str | tuple[int, str]:
    """The workspace a bearer call acts on, or (status, why) it is refused."""
    with h.server.fake.org.lock:
        beta = h.headers.get("anthropic-beta") or ""
        fed.betas[beta] = fed.betas.get(beta, 0) + 1
        issued = fed.issued.get(token)
        minted = issued is not None
        if issued is None and token in fed.bearer_tokens:
            issued = Issued(fed.bearer_tokens[token], None, False)
        if issued is None or fed.tokens_revoked:
            return 401, "invalid bearer token"
        if minted and OAUTH_BETA not in _flags(h):
            return 401, "OAuth authentication is currently not supported."
        if issued.expires_at is not None and h.server.fake.org.clock() >= issued.expires_at:
            fed.expired_calls += 1
            return 401, "the access token has expired"
        asked = h.headers.get("anthropic-workspace-id")
        if asked is not None and asked not in issued.workspaces:
            why = "a federation token acts on its own workspace only" if issued.federated else \
                f"this token cannot act on workspace {asked}"
            return 403, why
        workspace = asked or issued.workspaces[0]
        fed.calls_by_workspace[workspace] = fed.calls_by_workspace.get(workspace, 0) + 1
        return workspace


def identity_token(issuer: str = "https://issuer.example.test", subject: str = "system:serviceaccount:etl:gatekeeper",
                   life: float = 3600.0, jti: str = "1", now: float | None = None) -> str:
    """An identity token as an issuer would write it (unsigned: the fake checks claims, not signatures), issued at
    `now` (wall seconds; the real time by default)."""
    issued = time.time() if now is None else now
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(obj)).rstrip(b"=").decode()

    claims = {"iss": issuer, "sub": subject, "aud": "https://api.anthropic.com", "exp": int(issued + life),
              "iat": int(issued), "jti": jti}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"
