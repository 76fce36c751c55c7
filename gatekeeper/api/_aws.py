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

from .._errors import UsageError
from ._config import Secret

SERVICE = "aws-external-anthropic"
URL_TEMPLATE = "https://aws-external-anthropic.{region}.api.aws"
WORKSPACE_HEADER = "anthropic-workspace-id"
# The IAM actions a job needs (the docs' page for the platform lists them with what each is for).
ACTIONS = {"create": "CreateBatchInference", "retrieve": "GetBatchInference", "results": "GetBatchInference",
           "list": "ListBatchInferences", "cancel": "CancelBatchInference", "delete": "DeleteBatchInference",
           "models": "the Models API's read action", "count_tokens": "the count-tokens action",
           "messages": "the Messages API's invoke action"}


@dataclass(frozen=True)
class AwsPlatform:
    """Where a job goes on Claude Platform on AWS, and how it authenticates (no secret of AWS's is held here: the
    credential chain is asked at each signature)."""

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
            raise UsageError("no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                             "or run where a role provides them (or give a short-term key in ANTHROPIC_AWS_API_KEY)",
                             setting="aws_credentials")

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

