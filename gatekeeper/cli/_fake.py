"""`gatekeeper fake-api`: the fake Batches API served on loopback, with the environment that points gatekeeper at it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._errors import ExitCode, UsageError
from ..api._google import ORIGIN_VARIABLE
from ..testing import FakeAPI, FakeAws, FakeConfig, FakeFederation, FakeGoogle, FakeRealtime, Fault, Outcome, identity_token
from ..testing._google import PERMISSIONS, TOKEN_PATH
from ._common import print_json


def cmd_fake_api(args: argparse.Namespace) -> int:
    with _stoppable():
        return _serve(args)


@contextlib.contextmanager
def _stoppable() -> Iterator[None]:
    """Ctrl-C, `kill -INT` and `kill` (SIGTERM: the CLI's, a Ctrl-C) stop the fake even where SIGINT came ignored: a
    shell starts a script's background job so (`gatekeeper fake-api ... &`), and Python keeps it ignored, so a
    `kill -INT %1` meant for the fake did nothing and never had its report. (The caller's handler is put back after.)"""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _serve(args: argparse.Namespace) -> int:
    _check_google_only(args.deny, args.organization_answers, google=args.google is not None)
    keys = args.workspace_key or ["test-key-ws1"]
    bad_model = args.error_model
    aws = FakeAws() if args.aws else None
    google = FakeGoogle(token_life=args.google, denied=set(args.deny),
                        organization_answers=args.organization_answers) if args.google is not None else None
    federation, federated_env = _fake_federation(args.federation)
    config = FakeConfig(
        ceiling=args.simulated_ceiling, rate=args.rate, speed=args.speed,
        workspaces={k: f"wrkspc_{i + 1}" for i, k in enumerate(keys)}, admin_keys={args.admin_key}, usage=args.usage,
        lost_creates=args.lose_creates, listing_lag=args.listing_lag, not_found_after_create=args.listing_lag,
        seed=args.seed,
        outcome=(lambda cid, model, attempt: Outcome("errored", "invalid_request_error", f"model: {model} not found")
                 if model == bad_model else None) if bad_model else None,
        realtime=FakeRealtime(rpm=args.realtime_rpm, itpm=args.realtime_itpm, otpm=args.realtime_otpm,
                              latency=args.realtime_latency), aws=aws, federation=federation, google=google,
    )
    with FakeAPI(config, port=args.port) as fake:
        fake.inject(*(_fault(*spec) for spec in args.fault))
        # (made-up keys the fake accepts: printing them is what lets a newcomer paste them)
        env = _fake_env(fake.url, keys, args.admin_key, aws)
        if google is not None:
            env = _google_env(fake.url, google)
        if federated_env:
            env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_ADMIN_KEY": args.admin_key, **federated_env}
        info = {"url": fake.url, "ceiling": args.simulated_ceiling, "rate": args.rate, "speed": args.speed, "workspaces": len(keys),
                "env": env}
        try:  # (from the line that says it serves: a stop once it is said ends it as a stop, with the summary)
            if args.json:
                print_json(info)
            else:
                where = ("Claude Platform on AWS (fake)" if aws else "Claude on Google Cloud (fake)" if google
                         else f"{len(keys):,} workspace key(s)")
                print(f"fake Batches API on {fake.url} (ceiling {args.simulated_ceiling:,}, {args.rate:,.0f} requests/s, "
                      f"speed x{args.speed:g}; real-time lane {args.realtime_rpm:,} RPM); {where}; Ctrl-C stops it. "
                      "In another shell:\n"
                      f"export {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        seen = fake.org.records.summary()
        if args.json:
            print_json({"received": seen})
        else:
            print(f"\nthe fake received {seen['creates']:,} creates ({seen['refusals']:,} refused for a full queue) and "
                  f"{seen['requests']:,} requests; {seen['succeeded']:,} succeeded, {seen['answered_twice']:,} answered "
                  f"twice; deepest queue {seen['deepest_queue']:,}; {seen['lost_create_answers']:,} create answer(s) "
                  "lost (the batch made, the answer dropped)", flush=True)
        return ExitCode.OK


def _check_google_only(denied: list[str], organization_answers: bool, *, google: bool) -> None:
    """--deny names a permission the fake's Google mode checks, and it and --organization-answers come only with
    --google (a typo, or a refusal or answer that would never happen, would rehearse nothing in silence)."""
    if denied and not google:
        raise UsageError("fake-api --deny refuses a Google Cloud IAM permission: give --google too", setting="--deny")
    if organization_answers and not google:
        raise UsageError("fake-api --organization-answers is Google Cloud's organization route: give --google too",
                         setting="--organization-answers")
    known = sorted(set(PERMISSIONS.values()))
    for permission in denied:
        if permission not in known:
            raise UsageError(f"fake-api --deny {permission!r}: not a permission the fake checks; one of "
                             f"{', '.join(known)}", setting="--deny")


def _fake_env(url: str, keys: list[str], admin_key: str, aws: FakeAws | None) -> dict[str, str]:
    """The environment that points gatekeeper at the fake: its made-up keys (first-party), or the AWS platform's."""
    if aws is not None:
        key_id, secret = next(iter(aws.credentials.items()))
        return {"AWS_REGION": aws.region, "ANTHROPIC_AWS_WORKSPACE_ID": aws.workspace_id, "ANTHROPIC_AWS_BASE_URL": url,
                "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "GATEKEEPER_PLATFORM": "aws"}
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": keys[0], "ANTHROPIC_ADMIN_KEY": admin_key}
    if len(keys) > 1:
        env["ANTHROPIC_EXTRA_WORKSPACE_KEYS"] = ",".join(keys[1:])
    return env


def _google_env(url: str, google: FakeGoogle) -> dict[str, str]:
    """Claude on Google Cloud's environment for the fake: a service-account key file of its own (made up, for the
    fake only) whose token endpoint is the fake's, and the fake as the origin of both routes, derived as on the
    platform: the workspace's, and the organization's, where the ceiling is read (a base URL would send that read to
    the workspace's route, as the SDK does)."""
    fd, path = tempfile.mkstemp(prefix="gatekeeper-fake-google-", suffix=".json")
    os.close(fd)
    google.write_credentials(Path(path), url + TOKEN_PATH)
    return {"GOOGLE_APPLICATION_CREDENTIALS": path, "ANTHROPIC_GOOGLE_CLOUD_PROJECT": google.project,
            "ANTHROPIC_GOOGLE_CLOUD_LOCATION": google.location, "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID": google.workspace_id,
            ORIGIN_VARIABLE: url, "GATEKEEPER_PLATFORM": "google"}


def _fake_federation(life: float | None) -> tuple[Any, dict[str, str]]:
    """With --federation: the fake's token endpoint (keys refused) and the environment that uses it, an identity
    token written to a file of its own (made up, for the fake only)."""
    if life is None:
        return None, {}
    fed = FakeFederation(token_life=life, keys_refused=True)
    rule_id, rule = next(iter(fed.rules.items()))
    fd, path = tempfile.mkstemp(prefix="gatekeeper-fake-identity-", suffix=".jwt")
    os.write(fd, identity_token(issuer=rule.issuer, life=7 * 86_400).encode())
    os.close(fd)
    return fed, {"ANTHROPIC_IDENTITY_TOKEN_FILE": path, "ANTHROPIC_FEDERATION_RULE_ID": rule_id,
                 "ANTHROPIC_ORGANIZATION_ID": rule.organization_id}


def _fault(route: str, code: str, times: int, after: int) -> Fault:
    """`--fault`'s fault: a status number, `lose` (the create made, its answer dropped) or a typed code."""
    if code == "lose":
        return Fault(route, kind="drop_after_commit", times=times, after=after)
    if code.isdigit():
        return Fault(route, status=int(code), times=times, after=after)
    return Fault(route, code=code, times=times, after=after)
