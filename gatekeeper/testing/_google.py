"""The fake's Claude on Google Cloud mode (api.md §24): path-style routes, Google access tokens, IAM per route.

A workspace's routes are `/v1/projects/{project}/locations/{location}/workspaces/{workspace_id}/invoke/v1/...` and
the organization's `/v1/projects/{project}/locations/{location}/claudeOrganization/invoke/v1/organizations/...`; any
other path is Google's 404 (its own envelope, `status` not `type`), and a route naming another project is Google's 403
for a project it does not know (`CONSUMER_INVALID`), or, `service_disabled`, the fake's own project's 403 for a
service not enabled there (`SERVICE_DISABLED`), each with the ErrorInfo Google gives. Every call needs `Authorization: Bearer` with a
token minted here and not expired (else Google's 401), and the IAM permission its route needs (`PERMISSIONS`; one in
`denied` is Google's 403 naming it in its ErrorInfo). Tokens are minted at `/token` on the fake itself, by the
jwt-bearer grant google-auth sends for a service account: its assertion is checked against the key written by
`write_credentials` (RS256, issuer, audience, expiry), so google-auth runs unmodified against the fake; a fault on
the "token" route strikes there (`token_fault`). Results URLs name Anthropic's host, as the body the gateway passes
on does: a client must fetch them from its own route.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ._model import new_id

if TYPE_CHECKING:
    from ._wire import Wire

SERVICE = "claude.googleapis.com"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_PATH = "/token"  # noqa: S105 (a path)
_WORKSPACE = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/workspaces/([^/]+)/invoke(/.*)$")
_ORGANIZATION = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/claudeOrganization/invoke(/v1/organizations/.*)$")
PERMISSIONS = {"create": "batches.create", "retrieve": "batches.get", "results": "batches.get", "list": "batches.list",
               "cancel": "batches.cancel", "delete": "batches.delete", "models": "models.list", "model": "models.get",
               "count_tokens": "messages.countTokens", "messages": "messages.create", "rate_limits": "rateLimits.list",
               "workspace_rate_limits": "rateLimits.list"}


def _key_pair() -> tuple[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return pem, key.public_key()


@dataclass
class FakeGoogle:
    """The fake as Claude on Google Cloud: one project, location and workspace, one service account (its key made
    here), tokens of `token_life` seconds, the IAM permissions refused (`denied`), and whether the organization route
    answers the rate limits (`organization_answers`: undocumented there, so off by default, as rough as it may be)."""

    project: str = "fake-project"
    location: str = "global"
    workspace_id: str = "wrkspc_gcp_1"
    workspace: str = "wrkspc_1"  # the fake's own workspace its batches go to
    client_email: str = "gatekeeper@fake-project.iam.gserviceaccount.com"
    token_life: float = 3600.0
    denied: set[str] = field(default_factory=set)  # permissions refused, as `PERMISSIONS` names them
    organization_answers: bool = False
    service_disabled: bool = False  # the project has not enabled claude.googleapis.com: every route is Google's 403
    minted: int = 0  # tokens issued
    expired_calls: int = 0  # calls refused because their token had expired
    refused: list[str] = field(default_factory=list)  # why each refused call or grant was refused
    paths: list[str] = field(default_factory=list)  # the route prefix of each accepted call ("workspace", "organization")
    issued: dict[str, float] = field(default_factory=dict)  # token -> expires at (monotonic)
    _pem: str = ""
    _public: Any = None

    def __post_init__(self) -> None:
        self._pem, self._public = _key_pair()

    def write_credentials(self, path: Path, token_uri: str) -> Path:
        """A service-account key file google-auth reads (`GOOGLE_APPLICATION_CREDENTIALS`), its `token_uri` the fake's."""
        path.write_text(json.dumps({
            "type": "service_account", "project_id": self.project, "private_key_id": "fake-key-1",
            "private_key": self._pem, "client_email": self.client_email, "client_id": "1",
            "token_uri": token_uri}))
        return path

    def unprefix(self, path: str) -> tuple[str, str] | None:
        """(the API path, "workspace" or "organization") of a Google route for this workspace; None: not one."""
        m = _WORKSPACE.match(path)
        if m and m.group(1, 2, 3) == (self.project, self.location, self.workspace_id):
            return m.group(4), "workspace"
        m = _ORGANIZATION.match(path)
        if m and m.group(1, 2) == (self.project, self.location):
            return m.group(3), "organization"
        return None

    def project_refusal(self, path: str) -> tuple[str, str, dict[str, str]] | None:
        """Google's refusal of the project a route names (its message, ErrorInfo reason and metadata): one it does not
        know, or this one while the service is not enabled there; None: the project is served."""
        m = _WORKSPACE.match(path) or _ORGANIZATION.match(path)
        if m is None:
            return None
        project = m.group(1)
        meta = {"consumer": f"projects/{project}", "service": SERVICE}
        if project != self.project:
            return f"Permission denied on resource project {project}.", "CONSUMER_INVALID", {**meta, "containerInfo": project}
        if self.service_disabled:
            return (f"Claude API has not been used in project {project} before or it is disabled. Enable it by visiting "
                    f"https://console.developers.google.com/apis/api/{SERVICE}/overview?project={project} then retry. "
                    "If you enabled this API recently, wait a few minutes for the action to propagate to our systems "
                    "and retry.", "SERVICE_DISABLED", meta)
        return None


def google_error(h: Wire, status: int, message: str, state: str, permission: str | None = None,
                 info: tuple[str, dict[str, str]] | None = None) -> None:
    """Google's error envelope (`code`, `message`, `status`; an ErrorInfo naming a refused permission, or `info`'s
    reason and metadata)."""
    error: dict[str, Any] = {"code": status, "message": message, "status": state}
    if permission is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED",
                             "domain": SERVICE, "metadata": {"permission": permission}}]
    if info is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": info[0],
                             "domain": "googleapis.com", "metadata": info[1]},
                            {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US",
                             "message": message}]
    h.send_json(status, {"error": error})


def unprefixed(h: Wire, g: FakeGoogle) -> bool:
    """The token endpoint, or the path-style route taken off the request's path (True: answered here)."""
    split = urlsplit(h.path)
    if split.path == TOKEN_PATH and h.command == "POST":
        fake = h.server.fake
        with fake.org.lock:
            fake.org.records.requests_seen["token"] = fake.org.records.requests_seen.get("token", 0) + 1
        if not token_fault(h, g):
            token_grant(h, g)
        return True
    found = g.unprefix(split.path)
    project = g.project_refusal(split.path)
    if found is None or project is not None:
        if h.command == "POST":
            h.read_body()
        if project is not None:
            google_error(h, 403, project[0], "PERMISSION_DENIED", info=project[1:])
        else:
            google_error(h, 404, f"Requested entity was not found: {split.path}", "NOT_FOUND")
        return True
    h.path = found[0] + (f"?{split.query}" if split.query else "")
    h.google_scope = found[1]
    return False


def refused(h: Wire, g: FakeGoogle, endpoint: str, admin: bool) -> bool:
    """Refuse the call as Google's gateway would (True: answered): its token, then the permission its route needs,
    then a workspace route asked on the organization's prefix."""
    if _refused(h, g, endpoint, h.google_scope):
        if h.command == "POST":
            h.read_body()
        return True
    if h.google_scope == "organization" and not admin:
        if h.command == "POST":
            h.read_body()
        google_error(h, 404, f"Requested entity was not found: {h.path}", "NOT_FOUND")
        return True
    return False


def _refused(h: Wire, g: FakeGoogle, endpoint: str, scope: str) -> bool:
    auth = h.headers.get("authorization") or ""
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    expires = g.issued.get(token)
    if expires is None or expires <= time.monotonic():
        g.expired_calls += expires is not None
        g.refused.append("expired token" if expires is not None else "no valid token")
        google_error(h, 401, "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
                     "cookie or other valid authentication credential.", "UNAUTHENTICATED")
        return True
    permission = PERMISSIONS.get(endpoint, endpoint)
    closed = endpoint in ("rate_limits", "workspace_rate_limits") and not g.organization_answers
    if closed or permission in g.denied:
        g.refused.append(permission)
        where = (f"projects/{g.project}/locations/{g.location}/workspaces/{g.workspace_id}" if scope == "workspace"
                 else f"projects/{g.project}/locations/{g.location}/claudeOrganization")
        google_error(h, 403, f"Permission '{permission}' denied on resource '{where}' (or it may not exist).",
                     "PERMISSION_DENIED", permission)
        return True
    g.paths.append(scope)
    return False


def token_grant(h: Wire, g: FakeGoogle) -> None:
    """The jwt-bearer grant of a service account, as Google's token endpoint answers it (form-encoded in, JSON out)."""
    asked = {k: v[0] for k, v in parse_qs((h.read_body() or b"").decode(errors="replace")).items()}
    if asked.get("grant_type") != JWT_BEARER:
        return _deny(h, g, "unsupported_grant_type", f"grant_type {asked.get('grant_type')!r}")
    claims = _verified(g, asked.get("assertion") or "")
    if claims is None:
        return _deny(h, g, "invalid_grant", "Invalid JWT Signature.")
    if claims.get("iss") != g.client_email or not isinstance(claims.get("exp"), int) or claims["exp"] < time.time():
        return _deny(h, g, "invalid_grant", "Invalid JWT: the issuer is not the service account, or it has expired.")
    token = new_id("ya29.fake-", h.server.fake.id_rng)
    with h.server.fake.org.lock:
        g.issued[token] = time.monotonic() + g.token_life
        g.minted += 1
    h.send_json(200, {"access_token": token, "expires_in": max(1, int(g.token_life)), "token_type": "Bearer"})


def token_fault(h: Wire, g: FakeGoogle) -> bool:
    """A fault injected on the "token" route (`--fault token:503:5`), as Google's token endpoint answers it: OAuth's
    `{"error", "error_description"}` body (an outage `backend_error`, a 400 `invalid_grant`), a dropped connection,
    or a delay. True: answered here."""
    fault = h.server.fake.faults.take("token")
    if fault is None:
        return False
    if fault.kind in ("delay", "delay_after_commit"):
        h.pause(fault.delay)
        return False
    h.read_body()
    if fault.kind in ("drop", "drop_after_commit"):
        h.drop()
        return True
    if fault.delay:
        h.pause(fault.delay)
    error = "invalid_grant" if 400 <= fault.status < 500 and fault.status != 429 else "backend_error"
    g.refused.append(f"token fault {fault.status}")
    h.send_json(fault.status, {"error": error, "error_description": fault.message or f"injected fault ({fault.status})"})
    return True


def _deny(h: Wire, g: FakeGoogle, error: str, description: str) -> None:
    g.refused.append(description)
    h.send_json(400, {"error": error, "error_description": description})


def _verified(g: FakeGoogle, jwt: str) -> dict[str, Any] | None:
    """The claims of an RS256 JWT signed with the service account's key; None when its signature does not hold."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    parts = jwt.split(".")
    if len(parts) != 3:
        return None
    try:
        signature = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
        g._public.verify(signature, f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256())
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (InvalidSignature, ValueError):
        return None
    return claims if isinstance(claims, dict) else None
