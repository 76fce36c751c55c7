"""The fake's Claude Platform on AWS mode: a request is accepted when botocore's own SigV4 signer, given the secret of
the access key the request names, computes the signature it carries (so the fake checks what AWS checks: method,
path, query, the signed headers and the body's digest, for service `aws-external-anthropic` and the fake's region),
or when it carries a short-term key; and only with the workspace's `anthropic-workspace-id`. The Admin API has no
route here (no IAM action covers it)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

SERVICE = "aws-external-anthropic"
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                   r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})")


@dataclass
class FakeAws:
    """The fake as Claude Platform on AWS: one workspace in one region, the access keys it accepts (id -> secret;
    a test may swap them mid-job, as a rotation does), and short-term API keys."""

    region: str = "us-east-1"
    workspace_id: str = "wrkspc_aws_1"
    workspace: str = "wrkspc_1"  # the fake's own workspace its batches go to
    credentials: dict[str, str] = field(default_factory=lambda: {"AKIAFAKEFAKEFAKE0001": "fake/secret/key/0001"})
    api_keys: set[str] = field(default_factory=lambda: {"aws-short-term-key-1"})
    signed: int = 0  # requests accepted on a SigV4 signature
    signed_by: dict[str, int] = field(default_factory=dict)  # access key id -> requests accepted signed with it
    refused: list[str] = field(default_factory=list)  # why each refused request was refused


def check(aws: FakeAws, method: str, url: str, headers: Mapping[str, str], body: bytes) -> str | None:
    """Why AWS would refuse this request (None: accepted), checked with botocore's signer."""
    if headers.get("anthropic-workspace-id") != aws.workspace_id:
        return "anthropic-workspace-id: missing or not this region's workspace"
    if headers.get("x-api-key") is not None:
        return None if headers["x-api-key"] in aws.api_keys else "the API key is not valid (it may have expired)"
    m = _AUTH.fullmatch(headers.get("authorization") or "")
    if m is None:
        return "missing or malformed SigV4 Authorization"
    key_id, _, region, service, signed, signature = m.groups()
    if region != aws.region or service != SERVICE:
        return f"signed for {service} in {region}, not {SERVICE} in {aws.region}"
    secret = aws.credentials.get(key_id)
    if secret is None:
        return "The security token included in the request is invalid (unknown access key)"
    digest = headers.get("x-amz-content-sha256")
    if digest is not None and digest != hashlib.sha256(body).hexdigest():
        return "the body does not match X-Amz-Content-SHA256"
    expected = _signature(method, url, {h: headers.get(h, "") for h in signed.split(";")}, body, key_id, secret,
                          aws.region, headers.get("x-amz-date") or "")
    if not hmac.compare_digest(expected, signature):
        return "The request signature we calculated does not match the signature you provided"
    aws.signed += 1
    aws.signed_by[key_id] = aws.signed_by.get(key_id, 0) + 1
    return None


def _signature(method: str, url: str, signed: dict[str, str], body: bytes, key_id: str, secret: str, region: str,
               amz_date: str) -> str:
    """The signature botocore computes for these signed headers and this body at `amz_date`."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    token = signed.get("x-amz-security-token")
    request = AWSRequest(method=method, url=url, headers=signed, data=body)
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(key_id, secret, token), SERVICE, region)
    canonical = signer.canonical_request(request)
    return str(signer.signature(signer.string_to_sign(request, canonical), request))
