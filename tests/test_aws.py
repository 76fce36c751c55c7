"""Claude Platform on AWS (issue 36): the same job against the fake's AWS mode, which checks every request's SigV4
signature with botocore's own signer (or a short-term key) and its workspace header, and has no Admin API. Every
job is the CLI over real HTTP."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import orjson
import pytest

from gatekeeper.testing import FakeAws
from tests.fakes import running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, killed_after_a_create_then_rerun, said

KEY_ID, SECRET = "AKIAFAKEFAKEFAKE0001", "fake/secret/key/0001"
FAST = ["--platform", "aws", "--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]


def aws_env(fake_url: str, tmp: Path, **extra: str) -> dict[str, str]:
    """Claude Platform on AWS as the SDK's AnthropicAWS reads it; nothing of this host's own AWS setup."""
    env = {"AWS_REGION": "us-east-1", "ANTHROPIC_AWS_WORKSPACE_ID": "wrkspc_aws_1", "ANTHROPIC_AWS_BASE_URL": fake_url,
           "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials")}
    env.update(extra)
    return {k: v for k, v in env.items() if v}


def _job(tmp: Path, n: int = 40) -> tuple[Path, set[str]]:
    ids = {f"a{i:03d}" for i in range(n)}
    return write_jsonl(tmp / "in.jsonl", [req(c, text=f"question {c} " * (1 + int(c[1:]) % 7)) for c in sorted(ids)]), ids


def test_a_deadline_on_the_platform_signs_every_real_time_call(tmp_path: Path) -> None:
    """A stalled batch lane on Claude Platform on AWS (no Admin API): the lane's limits are read from one probe's
    headers before the live batch is canceled (never on the lowest tier's assumed ones), the real-time calls are
    signed like the batch calls, and the job finishes by its deadline."""
    path, ids = _job(tmp_path, 12)
    with running_fake(ceiling=1000, rate=0.0, aws=FakeAws()) as fake:
        # (the last chance 4 s in, as soon as the batch has waited long enough to show it late; met by half a minute)
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--deadline", "40s", "--deadline-slack", "36"],
                  aws_env(fake.url, tmp_path))
        assert done.returncode == 0, done.stderr[-3000:]
        s = orjson.loads(done.stdout)
        assert s["lanes"]["realtime"]["requests"] == 12 and s["deadline"]["met"]
        aws = fake.config.aws
        probes = [e for e in events(done.stderr) if e["event"] == "realtime_probe"]
        assert len(probes) == 1 and probes[0]["measured"] is True
        first_cancel = next(e["t"] for e in events(done.stderr) if e["event"] == "deadline_cancel")
        assert probes[0]["t"] <= first_cancel
        assert aws is not None and aws.refused == [] and fake.realtime.records.answered == 12 + 1
        assert fake.org.records.requests_seen.get("rate_limits", 0) == 0  # (no Admin API on the platform)


def test_a_streamed_real_time_call_on_the_platform_is_signed_as_it_is_sent(tmp_path: Path) -> None:
    """Requests whose `max_tokens` the SDKs would only stream: each call's `accept: text/event-stream` is among the
    signed headers, so the platform accepts every one."""
    ids = {f"s{i:02d}" for i in range(4)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c, text=f"a long answer {c}", max_tokens=30_000) for c in sorted(ids)])
    with running_fake(ceiling=1000, rate=0.0, aws=FakeAws()) as fake:
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--deadline", "40s", "--deadline-slack", "38"],
                  aws_env(fake.url, tmp_path))
        assert done.returncode == 0, done.stderr[-3000:]
        aws = fake.config.aws
        assert aws is not None and aws.refused == []
        assert fake.realtime.records.streamed == 4 and orjson.loads(done.stdout)["succeeded"] == 4


def test_a_whole_job_signed_with_sigv4_through_every_command(tmp_path: Path) -> None:
    """plan (with its preflight), status, submit, results, report and cancel against the platform: every request
    signed and accepted, the ceiling given (no Admin API), each request answered once."""
    path, ids = _job(tmp_path)
    with running_fake(ceiling=1000, rate=5000, aws=FakeAws()) as fake:
        env = aws_env(fake.url, tmp_path)
        plan = gk(["plan", str(path), "--platform", "aws", "--json"], env)
        assert plan.returncode == 0, plan.stderr
        assert orjson.loads(plan.stdout)["estimate"]["models"]  # count_tokens measured, signed
        status = gk(["status", "--platform", "aws", "--ceiling", "1000", "--json"], env)
        assert status.returncode == 0 and orjson.loads(status.stdout)["ceiling"] == 1000, status.stderr
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "15"], env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert orjson.loads(done.stdout)["succeeded"] == len(ids)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        aws = fake.config.aws
        assert aws is not None and aws.refused == [] and aws.signed > 10
        assert gk(["cancel", str(path), "--platform", "aws", "--json"], env).returncode == 0
    assert len(gk(["results", str(path)], {}).stdout.splitlines()) == len(ids)
    assert orjson.loads(gk(["report", str(path), "--json"], {}).stdout)["summary"]["succeeded"] == len(ids)
    assert SECRET not in done.stdout + done.stderr and KEY_ID not in done.stdout + done.stderr


def test_a_kill_after_a_create_then_a_rerun_on_the_platform(tmp_path: Path) -> None:
    """SIGKILL right after a create was answered, then the same command: the batch is found by listing (signed),
    nothing is created twice."""
    path, ids = _job(tmp_path, 45)
    with running_fake(ceiling=1000, rate=5000, aws=FakeAws()) as fake:
        args = ["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "15"]
        killed_after_a_create_then_rerun(fake, path, ids, args, aws_env(fake.url, tmp_path))
        assert fake.org.records.creates == 3


def test_a_short_term_key_goes_as_x_api_key(tmp_path: Path) -> None:
    """ANTHROPIC_AWS_API_KEY (at most 12 hours): sent as x-api-key, no signature, no AWS credentials needed."""
    path, ids = _job(tmp_path, 10)
    with running_fake(ceiling=1000, rate=5000, aws=FakeAws()) as fake:
        env = aws_env(fake.url, tmp_path, ANTHROPIC_AWS_API_KEY="aws-short-term-key-1", AWS_ACCESS_KEY_ID="",
                      AWS_SECRET_ACCESS_KEY="")
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        assert fake.config.aws is not None and fake.config.aws.signed == 0


@pytest.mark.parametrize(("change", "named"), [
    ({"AWS_SECRET_ACCESS_KEY": "not/the/secret"}, "AWS credentials"),  # a refused signature
    ({"ANTHROPIC_AWS_API_KEY": "expired-key", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}, "short-term key"),
    ({"ANTHROPIC_AWS_WORKSPACE_ID": ""}, "ANTHROPIC_AWS_WORKSPACE_ID"),  # before any call
    ({"AWS_REGION": ""}, "AWS_REGION"),
    ({"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}, "no AWS credentials found"),
])
def test_a_refused_or_missing_credential_is_one_line_exit_2(tmp_path: Path, change: dict[str, str], named: str) -> None:
    """A wrong secret, an expired short-term key, a missing workspace id, region or credentials: exit 2 with one
    line naming the variable or the credentials (and, for a refusal, the IAM action), where the credentials come from
    said once (under --json and in plain text); nothing of a secret in it."""
    path, _ = _job(tmp_path, 5)
    with running_fake(ceiling=1000, rate=5000, aws=FakeAws()) as fake:
        env = aws_env(fake.url, tmp_path, **change)
        proc = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--no-preflight"], env)
        assert fake.org.records.creates == 0
        seen = sum(fake.org.records.requests_seen.values())
        plain = gk(["status", "--platform", "aws"], env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert plain.returncode == 2 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr[-2000:]
    for line in (said(proc.stderr)[-1], plain.stderr.strip()):
        assert line.count("AWS_SECRET_ACCESS_KEY") <= 1 and line.count("AWS_PROFILE") <= 1, line  # (the hint once)
    last = proc.stderr.strip().splitlines()[-1]
    assert named in last and "Traceback" not in proc.stderr
    assert "not/the/secret" not in proc.stderr + proc.stdout and SECRET not in proc.stderr + proc.stdout
    if "refused" in last:
        assert "ListBatchInferences" in last or "CreateBatchInference" in last
    if named in ("ANTHROPIC_AWS_WORKSPACE_ID", "AWS_REGION", "no AWS credentials found"):
        assert seen == 0  # named before any call


def test_credentials_that_rotate_mid_job_are_picked_up(tmp_path: Path) -> None:
    """Credentials from a `credential_process` that expire within seconds: botocore asks the chain again, the job
    goes on after the platform stops accepting the first key, and finishes."""
    current = tmp_path / "current-key"
    current.write_text(f"{KEY_ID} {SECRET}")
    script = tmp_path / "creds.py"
    script.write_text("import datetime, json, sys\n"
                      f"kid, secret = open({str(current)!r}).read().split()\n"
                      "end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)\n"
                      "print(json.dumps({'Version': 1, 'AccessKeyId': kid, 'SecretAccessKey': secret,\n"
                      "                  'SessionToken': 'token-' + kid, 'Expiration': end.isoformat()}))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    config = tmp_path / "aws-config"
    config.write_text(f"[profile rotating]\ncredential_process = {sys.executable} {script}\n")
    path, ids = _job(tmp_path, 60)
    aws = FakeAws()
    with running_fake(ceiling=1000, rate=20, aws=aws) as fake:
        env = aws_env(fake.url, tmp_path, AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="", AWS_PROFILE="rotating",
                      AWS_CONFIG_FILE=str(config))
        from tests.runs import start

        run = start(["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "20", "--no-preflight"], env)
        fake.org.wait_for(lambda r: r.creates >= 1, "the first create")
        aws.credentials["AKIAFAKEFAKEFAKE0002"] = "fake/secret/key/0002"  # the rotation: a new key issued ...
        current.write_text("AKIAFAKEFAKEFAKE0002 fake/secret/key/0002")
        # (the old key retires once the run has signed with the new one: the chain re-reads the profile by itself)
        fake.org.wait_for(lambda _: aws.signed_by.get("AKIAFAKEFAKEFAKE0002", 0) > 0, "a call signed with the new key", 60)
        del aws.credentials[KEY_ID]  # ... and the old one retired
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err[-3000:]
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        assert aws.signed_by.get(KEY_ID, 0) > 0 and aws.signed_by.get("AKIAFAKEFAKEFAKE0002", 0) > 0
        assert aws.refused == []  # (the chain was asked again before the old key was retired)


def test_the_fake_refuses_what_aws_refuses(tmp_path: Path) -> None:
    """The fake's AWS mode through plain HTTP: no workspace header, no signature, a tampered body, the Admin API."""
    import httpx

    from gatekeeper.api._aws import AwsPlatform, SigV4Signer

    with running_fake(ceiling=1000, aws=FakeAws()) as fake:
        base = {"anthropic-version": "2023-06-01"}
        assert httpx.get(f"{fake.url}/v1/messages/batches", headers=base).status_code == 400  # no workspace
        ws = {**base, "anthropic-workspace-id": "wrkspc_aws_1"}
        assert httpx.get(f"{fake.url}/v1/messages/batches", headers=ws).status_code == 403  # no signature
        saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET)
        try:
            signer = SigV4Signer(AwsPlatform("us-east-1", "wrkspc_aws_1", fake.url))
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        url = f"{fake.url}/v1/messages/count_tokens"
        body = orjson.dumps({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]})
        signed = signer.headers("POST", url, {**ws, "content-type": "application/json"}, body)
        assert httpx.post(url, content=body, headers=signed).status_code == 200
        assert httpx.post(url, content=body + b" ", headers=signed).status_code == 403  # the body was signed
        admin = signer.headers("GET", f"{fake.url}/v1/organizations/rate_limits", ws, b"")
        assert httpx.get(f"{fake.url}/v1/organizations/rate_limits", headers=admin).status_code == 403


def test_the_exporter_reads_the_platforms_queue(tmp_path: Path) -> None:
    """`exporter --platform aws --ceiling N`: the queue read with signed calls and served as metrics."""
    import httpx

    from tests.runs import start

    with running_fake(ceiling=1000, rate=0.0, aws=FakeAws()) as fake:
        fake.org.add_batch("wrkspc_1", 300)
        proc = start(["exporter", "--platform", "aws", "--ceiling", "1000", "--port", "0", "--interval", "1", "--json"],
                     aws_env(fake.url, tmp_path))
        try:
            assert proc.stdout is not None
            url = orjson.loads(proc.stdout.readline())["url"]
            deadline = time.monotonic() + 20
            while "gatekeeper_queue_depth_requests 300" not in (page := httpx.get(url, timeout=10).text):
                assert time.monotonic() < deadline, page[-2000:]
                time.sleep(0.1)
            assert "gatekeeper_queue_ceiling_requests 1000" in page and SECRET not in page and KEY_ID not in page
            assert fake.config.aws is not None and fake.config.aws.signed > 0 and fake.config.aws.refused == []
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


def test_status_names_no_admin_key_and_a_wrong_workspace_is_one_line_naming_its_variable(tmp_path: Path) -> None:
    """On Claude Platform on AWS there is no Admin API: `status` never tells the user to set ANTHROPIC_ADMIN_KEY (it
    says to pass --ceiling). A wrong workspace id is exit 2, one line naming ANTHROPIC_AWS_WORKSPACE_ID, in status
    and submit; a missing one too, before any call."""
    path, _ = _job(tmp_path, 4)
    with running_fake(ceiling=1000, rate=0.0, aws=FakeAws()) as fake:
        status = gk(["status", "--platform", "aws", "--json"], aws_env(fake.url, tmp_path))
        assert status.returncode in (0, 1) and "ANTHROPIC_ADMIN_KEY" not in status.stdout + status.stderr, status.stderr
        assert "--ceiling" in " ".join(orjson.loads(status.stdout)["repair"])
        for cmd in (["status", "--platform", "aws"], ["submit", str(path), *FAST]):
            wrong = gk(cmd, aws_env(fake.url, tmp_path, ANTHROPIC_AWS_WORKSPACE_ID="wrkspc_other"))
            lines = said(wrong.stderr)
            assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-1500:]
            assert len(lines) == 1 and "ANTHROPIC_AWS_WORKSPACE_ID" in lines[0], lines
        missing = gk(["status", "--platform", "aws"], aws_env(fake.url, tmp_path, ANTHROPIC_AWS_WORKSPACE_ID=""))
        assert missing.returncode == 2 and "ANTHROPIC_AWS_WORKSPACE_ID" in missing.stderr
        assert fake.org.records.creates == 0


@pytest.mark.parametrize(("platform", "rpm"), [("anthropic", 300.0), ("aws", 50.0)])
def test_the_platforms_call_budget_is_the_librarys_default_not_the_clis(tmp_path: Path, platform: str, rpm: float) -> None:
    """The library, the Airflow operator and the CLI take one default from `ApiConfig`: 300 calls a minute, 50 on
    Claude Platform on AWS (a workspace's Tier 1); `--max-rpm` and `SubmitSettings(max_rpm=)` default to it."""
    import anyio

    from gatekeeper import ApiConfig, SubmitSettings
    from gatekeeper.api._queue import connect
    from gatekeeper.cli._parser import build_parser

    env = aws_env("http://127.0.0.1:9", tmp_path, ANTHROPIC_AWS_API_KEY="short-term") if platform == "aws" else \
        {"ANTHROPIC_API_KEY": "sk-test"}
    config = ApiConfig.from_env(env, platform=platform)
    assert config.default_rpm == rpm and SubmitSettings().max_rpm is None
    assert build_parser(["submit", "x"]).parse_args(["submit", "x"]).max_rpm is None

    async def budget() -> float:
        async with connect(config) as conn:
            return float(conn.primary.calls.budget.per_minute)
    assert anyio.run(budget) == rpm
