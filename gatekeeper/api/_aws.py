"""Claude Platform on AWS: Anthropic's API sold and authenticated through AWS, read from the environment as the SDK's
`AnthropicAWS` reads it, and requests signed with botocore's SigV4 signer.

What differs from the first-party API: the base URL (`https://aws-external-anthropic.{region}.api.aws`, or
`ANTHROPIC_AWS_BASE_URL`), the region (`AWS_REGION`, else `AWS_DEFAULT_REGION`: required, no default), every call
carrying `anthropic-workspace-id` (`ANTHROPIC_AWS_WORKSPACE_ID`: required), and authentication: a short-term API key
(`ANTHROPIC_AWS_API_KEY`, sent as `x-api-key`), else SigV4 over the whole request, body included, for the service
`aws-external-anthropic`, with credentials from the standard AWS chain (environment keys and session token,
`AWS_PROFILE`, config files, `credential_process`, container and instance roles). Credentials are read from the chain
at every signature, so a multi-hour job picks up refreshed ones. There is no Admin API: the queue's ceiling is given
(`--ceiling`) or learned from queue-full answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .._clock import WALL, Clock
from .._errors import AuthenticationError, UsageError
from .._wire import AWS_CREDENTIALS_HINT
from ._config import ApiConfig, Secret
from ._platform import Platform

if TYPE_CHECKING:
    import httpx

    from ._tokens import Auth, Outgoing, Spawn

SERVICE = "aws-external-anthropic"
URL_TEMPLATE = "https://aws-external-anthropic.{region}.api.aws"
WORKSPACE_HEADER = "anthropic-workspace-id"
# The IAM actions a job needs (the docs' page for the platform lists them with what each is for).
ACTIONS = {"create": "CreateBatchInference", "retrieve": "GetBatchInference", "results": "GetBatchInference",
           "list": "ListBatchInferences", "cancel": "CancelBatchInference", "delete": "DeleteBatchInference",
           "models": "the Models API's read action", "count_tokens": "the count-tokens action",
           "messages": "the Messages API's invoke action"}


TIER1_RPM = 50.0  # a workspace's Tier 1: where one starts, with no automatic advancement


@dataclass(frozen=True)
class AwsPlatform(Platform):
    """Where a job goes on Claude Platform on AWS, and how it authenticates (no secret of AWS's is held here: the
    credential chain is asked at each signature)."""

    name: ClassVar[str] = "aws"
    title: ClassVar[str] = "Claude Platform on AWS"
    where: ClassVar[str] = "AWS_REGION (or ANTHROPIC_AWS_BASE_URL)"
    default_rpm: ClassVar[float] = TIER1_RPM

    region: str
    workspace_id: str
    base_url: str
    api_key: Secret | None = None  # a short-term key: x-api-key instead of SigV4
    profile: str | None = None
    access_key: Secret | None = None  # explicit credentials (an Airflow `aws` connection), before the chain's
    secret_key: Secret | None = None
    session_token: Secret | None = None

    @property
    def scope(self) -> str:
        """What its queue belongs to, for a shared ledger and the job's name: the platform, region and workspace."""
        return "aws_" + re.sub(r"[^a-z0-9]+", "_", f"{self.region}_{self.workspace_id}".lower())

    @property
    def url(self) -> str:
        return self.base_url

    def auths(self, config: ApiConfig, http: httpx.AsyncClient, spawn: Spawn | None,
              clock: Clock = WALL) -> list[tuple[Auth, str]]:
        """The short-term key, else SigV4 (its credentials found now: none is one line, before any call)."""
        if self.api_key is not None:
            return [(AwsAuth(self.workspace_id, key=self.api_key), "AWS short-term key (ANTHROPIC_AWS_API_KEY)")]
        return [(AwsAuth(self.workspace_id, signer=SigV4Signer(self)), "AWS credentials (SigV4)")]

    def legacy_identity(self, config: ApiConfig) -> str:
        """(The key's value, or the placeholder that once stood for SigV4.)"""
        return self.api_key.reveal() if self.api_key is not None else f"sigv4:{self.scope}"

    def refusal(self, status: int, message: str, error: dict[str, Any] | None, endpoint: str, label: str,
                fields: dict[str, Any]) -> AuthenticationError | None:
        """The workspace refused (not the request), or the credentials refused for the IAM action the call needs."""
        if status in (400, 403, 404) and "workspace" in message.lower():
            err = AuthenticationError(f"the workspace in ANTHROPIC_AWS_WORKSPACE_ID was refused ({message}): set it "
                                      "to the workspace id of this region's Claude Platform on AWS", **fields)
            err.setting = "aws_workspace"
            return err
        if status not in (401, 403):
            return None
        err = AuthenticationError(f"the {label} were refused for {self.permission(endpoint)} on {SERVICE} "
                                  f"({message or 'no reason given'}; credentials: {AWS_CREDENTIALS_HINT})", **fields)
        err.setting = "aws_credentials"
        return err

    def permission(self, endpoint: str) -> str:
        return ACTIONS.get(endpoint, f"the {endpoint} action")

    def repair(self, state: str) -> list[str] | None:
        if state != "queue-limit-unknown":
            return None
        return [
            "Claude Platform on AWS has no Admin API to read the ceiling from: pass --ceiling N (the workspace's "
            "batch queue limit from its limits page); gatekeeper submit also learns a bound from queue-full answers.",
            "without the ceiling this is a raw count: it cannot say whether the next submission will be accepted.",
        ]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AwsPlatform:
        """As `AnthropicAWS` reads the environment; a missing region or workspace id is named before any call."""
        region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        if not region:
            raise UsageError("Claude Platform on AWS needs a region: set AWS_REGION (or AWS_DEFAULT_REGION)",
                             setting="aws_region")
        workspace = (environ.get("ANTHROPIC_AWS_WORKSPACE_ID") or "").strip()
        if not workspace:
            raise UsageError("Claude Platform on AWS needs the workspace: set ANTHROPIC_AWS_WORKSPACE_ID "
                             "(every call carries it as anthropic-workspace-id)", setting="aws_workspace")
        key = (environ.get("ANTHROPIC_AWS_API_KEY") or "").strip()
        base = (environ.get("ANTHROPIC_AWS_BASE_URL") or URL_TEMPLATE.format(region=region)).rstrip("/")
        return cls(region, workspace, base, Secret(key) if key else None, environ.get("AWS_PROFILE") or None)


def configure(environ: Mapping[str, str], api_version: str | None) -> ApiConfig:
    """Claude Platform on AWS as the SDK's AnthropicAWS reads the environment (no Admin key: there is no Admin API)."""
    return ApiConfig(platform=AwsPlatform.from_env(environ), api_version=api_version)


class AwsAuth:
    """A call to Claude Platform on AWS: its workspace header, then a short-term key as `x-api-key`, or SigV4 over
    the request, body included (`requires_request_body`: a streamed body is signed by its digest)."""

    refreshable = False
    generation = 0

    def __init__(self, workspace_id: str, *, key: Secret | None = None, signer: SigV4Signer | None = None) -> None:
        self.workspace_id, self.key, self.signer = workspace_id, key, signer
        self.requires_request_body = signer is not None

    async def ready(self) -> None:
        return None

    def sign(self, request: Outgoing) -> dict[str, str]:
        headers = {**request.headers, WORKSPACE_HEADER: self.workspace_id}
        if self.signer is None:
            assert self.key is not None
            return {**headers, "x-api-key": self.key.reveal()}
        return self.signer.headers(request.method, request.url, headers, request.body, request.body_sha256)

    def rejected(self, generation: int) -> bool:
        return False

    def accepted(self, generation: int) -> None:
        return None

    def redact(self, text: str) -> str:
        return text if self.key is None else self.key.redact(text)


class SigV4Signer:
    """Signs one request at a time with botocore's SigV4 signer, credentials taken from the chain each time
    (botocore refreshes expiring ones: roles, `credential_process`)."""

    def __init__(self, platform: AwsPlatform) -> None:
        try:
            import botocore.session
        except ImportError:
            raise UsageError("Claude Platform on AWS signs with botocore: pip install 'gatekeeper-batches[aws]'",
                             setting="platform") from None
        self.platform = platform
        session = botocore.session.Session(profile=platform.profile)
        if platform.access_key is not None and platform.secret_key is not None:
            session.set_credentials(platform.access_key.reveal(), platform.secret_key.reveal(),
                                    platform.session_token.reveal() if platform.session_token else None)
        try:
            self._credentials = session.get_credentials()
        except Exception as exc:  # (botocore's ProfileNotFound, a broken config file: one line, never a traceback)
            raise UsageError(f"AWS credentials: {exc}", setting="aws_credentials") from None
        if self._credentials is None:
            raise UsageError(f"no AWS credentials found: give {AWS_CREDENTIALS_HINT} (a role: run where one provides "
                             "them)", setting="aws_credentials")

    def headers(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                body_sha256: str | None = None) -> dict[str, str]:
        """The signature's headers for this request (Authorization, X-Amz-Date, a session token); `body_sha256`
        stands for a body streamed later (sent as X-Amz-Content-SHA256, which the signature covers)."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        try:
            frozen = self._credentials.get_frozen_credentials()
        except Exception as exc:  # (a refresh that failed: expired and not renewable)
            raise UsageError(f"AWS credentials could not be refreshed: {exc}", setting="aws_credentials") from None
        request = AWSRequest(method=method.upper(), url=url, headers=dict(headers), data=body or b"")
        if body_sha256 is not None:
            request.headers["X-Amz-Content-SHA256"] = body_sha256
        SigV4Auth(Credentials(frozen.access_key, frozen.secret_key, frozen.token), SERVICE,
                  self.platform.region).add_auth(request)
        return {k: v for k, v in request.headers.items() if v is not None}

