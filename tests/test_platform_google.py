"""Claude on Google Cloud (issue 62): the fake's Google mode (path-style routes, Google tokens minted at its own token
endpoint from a service-account key file, IAM per route) driven by google-auth unmodified, by the SDK's own
`AnthropicGoogleCloud`, by the CLI and by the library over real HTTP; Microsoft Foundry refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import orjson
import pytest

from gatekeeper import UsageError
from gatekeeper.testing import FakeAPI, FakeGoogle
from gatekeeper.testing._google import TOKEN_PATH
from tests.fakes import running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, fake_api_process, gk

FAST = ["--platform", "google", "--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]


def google_env(fake_url: str, google: FakeGoogle, tmp: Path, **extra: str) -> dict[str, str]:
    """Claude on Google Cloud as the SDK reads it: the project, workspace and a service-account key whose token_uri
    is the fake's; the derived routes pointed at the fake through ANTHROPIC_GOOGLE_CLOUD_BASE_URL."""
    key = google.write_credentials(tmp / "sa.json", fake_url + TOKEN_PATH)
    base = f"{fake_url}/v1/projects/{google.project}/locations/{google.location}/workspaces/{google.workspace_id}/invoke"
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(key), "ANTHROPIC_GOOGLE_CLOUD_PROJECT": google.project,
           "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID": google.workspace_id, "ANTHROPIC_GOOGLE_CLOUD_BASE_URL": base,
           "GCE_METADATA_HOST": "127.0.0.1:1", "NO_GCE_CHECK": "True"}
    env.update(extra)
    return {k: v for k, v in env.items() if v}


def _job(tmp: Path, n: int = 30) -> tuple[Path, set[str]]:
    ids = {f"g{i:03d}" for i in range(n)}
    return write_jsonl(tmp / "in.jsonl", [req(c, text=f"question {c}") for c in sorted(ids)]), ids


def test_the_sdks_own_google_cloud_client_drives_the_fake(tmp_path: Path) -> None:
    """`anthropic.lib.google_cloud.AnthropicGoogleCloud` with google-auth's service-account credentials (their
    token_uri the fake's): a batch created, listed and retrieved, every call on a token the fake minted."""
    from anthropic.lib.google_cloud import AnthropicGoogleCloud
    from google.oauth2 import service_account

    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        key = google.write_credentials(tmp_path / "sa.json", fake.url + TOKEN_PATH)
        creds = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            str(key), scopes=["https://www.googleapis.com/auth/cloud-platform"])
        base = (f"{fake.url}/v1/projects/{google.project}/locations/global/workspaces/{google.workspace_id}/invoke")
        client = AnthropicGoogleCloud(project=google.project, workspace_id=google.workspace_id, credentials=creds,
                                      base_url=base, max_retries=0)
        made = client.messages.batches.create(requests=[
            {"custom_id": "a", "params": {"model": "claude-sonnet-4-5", "max_tokens": 10,
                                          "messages": [{"role": "user", "content": "hi"}]}}])
        assert made.id.startswith("msgbatch_") and made.request_counts.processing == 1
        assert [b.id for b in client.messages.batches.list()] == [made.id]
        assert client.messages.batches.retrieve(made.id).id == made.id
        assert google.minted == 1 and google.refused == [] and google.paths == ["workspace"] * 3
        google.denied.add("batches.create")
        with pytest.raises(Exception, match="batches.create") as refused:
            client.messages.batches.create(requests=[
                {"custom_id": "b", "params": {"model": "claude-sonnet-4-5", "max_tokens": 10,
                                              "messages": [{"role": "user", "content": "hi"}]}}])
        assert getattr(refused.value, "status_code", None) == 403 and fake.org.records.creates == 1


def test_a_whole_job_on_google_cloud_through_the_cli(tmp_path: Path) -> None:
    """plan, status and submit with --platform google: tokens from google-auth against the fake's token endpoint,
    expiring every few seconds within the job (minted again, none refused for long), results fetched from the
    workspace's own route (never the Anthropic host the body names), each request answered once; the ceiling is not
    readable on the organization route, so it is given."""
    path, ids = _job(tmp_path)
    google = FakeGoogle(token_life=2.0)
    with running_fake(ceiling=1000, rate=20, google=google) as fake:
        env = google_env(fake.url, google, tmp_path)
        status = gk(["status", "--platform", "google", "--json"], env)
        assert status.returncode == 1, status.stderr  # (a finding: the ceiling unknown)
        said = orjson.loads(status.stdout)
        assert said["ceiling"] is None and "organization route" in " ".join(said["repair"]), said
        before = google.minted
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "10"], env, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert orjson.loads(done.stdout)["succeeded"] == len(ids)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        # (30 requests at 20 a second outlast a 2 s token: it was minted again within the job)
        assert google.minted - before >= 2, (before, google.minted)
        assert fake.org.records.bypass_calls == 0  # (results only from the platform's origin)
        assert fake.org.records.creates == 3
    assert google._pem.split("\n")[1] not in done.stdout + done.stderr


def test_the_ceiling_is_read_on_the_organization_route_when_it_answers(tmp_path: Path) -> None:
    """status names where the ceiling came from as it is (Google's organization route, not "admin-api"), and the
    host ledger's file as the job keeps it: the platform's scope suffixed, the file a job there wrote."""
    google = FakeGoogle(organization_answers=True)
    path, _ = _job(tmp_path, 4)
    with running_fake(ceiling=1234, rate=5000, google=google) as fake:
        env = google_env(fake.url, google, tmp_path)
        assert gk(["submit", str(path), *FAST], env).returncode == 0
        status = gk(["status", "--platform", "google", "--json"], env)
        assert status.returncode == 0, status.stderr
        said = orjson.loads(status.stdout)
        assert said["ceiling"] == 1234 and said["ceiling_source"] == "google-organization-route", said
        assert "Google Cloud's organization route" in said["measured"]
        assert "organization" in google.paths or fake.org.records.requests_seen.get("rate_limits", 0) >= 1
        scope = f"google_{google.project}_{google.location}_{google.workspace_id}".lower().replace("-", "_")
        ledger = said["ledger"]
        assert ledger["kind"] == "host" and ledger["file"] == ledger["url"][len("sqlite://"):] + "." + scope, ledger
        assert Path(ledger["file"]).is_file()  # (the file the job used)
        text = gk(["status", "--platform", "google"], env)
        assert f"this host's, {ledger['file']}:" in text.stdout, text.stdout


@pytest.mark.parametrize("permission", ["batches.create", "batches.list"])
def test_a_refused_iam_permission_is_one_line_exit_2(tmp_path: Path, permission: str) -> None:
    """The workspace's credentials lack a permission: exit 2, one line naming it; nothing created."""
    path, _ = _job(tmp_path, 5)
    google = FakeGoogle(denied={permission})
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        proc = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--no-preflight"], google_env(fake.url, google, tmp_path))
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = [x for x in proc.stderr.splitlines() if permission in x]
        assert lines and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert fake.org.records.creates == 0


@pytest.mark.parametrize(("change", "named"), [
    ({"ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID": "", "ANTHROPIC_GOOGLE_CLOUD_BASE_URL": ""},
     "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID"),
    ({"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/sa.json"}, "Google Cloud credentials"),
    ({"GATEKEEPER_GOOGLE_TOKEN_COMMAND": "false"}, "GATEKEEPER_GOOGLE_TOKEN_COMMAND"),
    # (a cold tester's finding: a path-shaped workspace was put in the routes as given, and the error named it)
    ({"ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID": "../../x", "ANTHROPIC_GOOGLE_CLOUD_BASE_URL": ""},
     "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID='../../x' is not a name"),
    ({"ANTHROPIC_GOOGLE_CLOUD_LOCATION": "us east", "ANTHROPIC_GOOGLE_CLOUD_BASE_URL": ""},
     "ANTHROPIC_GOOGLE_CLOUD_LOCATION='us east' is not a name"),
])
def test_missing_or_broken_google_settings_are_one_line_exit_2(tmp_path: Path, change: dict[str, str],
                                                                named: str) -> None:
    path, _ = _job(tmp_path, 3)
    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        proc = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--no-preflight"],
                  google_env(fake.url, google, tmp_path, **change))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert fake.org.records.creates == 0


@pytest.mark.parametrize("where", ["workspaces/wrkspc_other", "locations/europe-west4"])
def test_a_wrong_workspace_or_location_names_the_google_settings(tmp_path: Path, where: str) -> None:
    """A route to a workspace or location that is not there (Google's own 404): one line, exit 2, naming the Google
    settings that make the route (not the first-party ANTHROPIC_BASE_URL), nothing created."""
    path, _ = _job(tmp_path, 3)
    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        env = google_env(fake.url, google, tmp_path)
        right = f"workspaces/{google.workspace_id}" if where.startswith("workspaces") else f"locations/{google.location}"
        env["ANTHROPIC_GOOGLE_CLOUD_BASE_URL"] = env["ANTHROPIC_GOOGLE_CLOUD_BASE_URL"].replace(right, where)
        proc = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--no-preflight"], env)
        assert proc.returncode == 2, proc.stderr[-2000:]
        [line] = proc.stderr.strip().splitlines()
        assert "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID" in line and "ANTHROPIC_GOOGLE_CLOUD_LOCATION" in line, line
        assert "Google said: Requested entity was not found" in line and where.split("/")[1] in line, line
        assert "does not answer like the Anthropic API" not in line, line  # (Google's gateway answered, in its envelope)
        assert "ANTHROPIC_BASE_URL" not in line.replace("ANTHROPIC_GOOGLE_CLOUD_BASE_URL", "") and "Traceback" not in proc.stderr
        assert fake.org.records.creates == 0


@pytest.mark.parametrize(("wrong", "said"), [
    ("project", "Permission denied on resource project other-project."),
    ("service", "Claude API has not been used in project fake-project before or it is disabled."),
])
def test_a_project_google_refuses_is_one_line_naming_the_project(tmp_path: Path, wrong: str, said: str) -> None:
    """A project Google does not know, or one that has not enabled the service (Google's 403, its ErrorInfo's reason
    CONSUMER_INVALID or SERVICE_DISABLED): submit and status stop with exit 2 in one line naming the project's
    setting and what Google said (not "does not answer like the Anthropic API", nor a missing IAM permission)."""
    path, _ = _job(tmp_path, 3)
    google = FakeGoogle(service_disabled=wrong == "service")
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        env = google_env(fake.url, google, tmp_path)
        if wrong == "project":
            env["ANTHROPIC_GOOGLE_CLOUD_PROJECT"] = "other-project"
            env["ANTHROPIC_GOOGLE_CLOUD_BASE_URL"] = env["ANTHROPIC_GOOGLE_CLOUD_BASE_URL"].replace(
                f"projects/{google.project}/", "projects/other-project/")
        for argv in (["submit", str(path), *FAST, "--ceiling", "1000", "--no-preflight"],
                     ["status", "--platform", "google"]):
            proc = gk(argv, env)
            assert proc.returncode == 2, proc.stderr[-2000:]
            [line] = proc.stderr.strip().splitlines()
            project = "other-project" if wrong == "project" else google.project
            assert "ANTHROPIC_GOOGLE_CLOUD_PROJECT" in line and f"project {project!r}" in line, line
            assert f"Google said: {said}" in line, line
            assert "does not answer like" not in line and "IAM permission" not in line, line
        assert fake.org.records.creates == 0


def test_the_fake_refuses_an_unknown_project_as_google_does(tmp_path: Path) -> None:
    """`fake-api --google`: a route naming another project is Google's 403 PERMISSION_DENIED with an ErrorInfo whose
    reason is CONSUMER_INVALID and whose consumer is that project."""
    import httpx

    with fake_api_process("--google") as env:
        origin = env["GATEKEEPER_GOOGLE_CLOUD_ORIGIN"]
        answer = httpx.get(f"{origin}/v1/projects/nobody/locations/global/workspaces/"
                           f"{env['ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID']}/invoke/v1/messages/batches")
    error = answer.json()["error"]
    assert answer.status_code == 403 and error["status"] == "PERMISSION_DENIED", answer.text
    [info] = [d for d in error["details"] if d["@type"].endswith("ErrorInfo")]
    assert info["reason"] == "CONSUMER_INVALID" and info["metadata"]["consumer"] == "projects/nobody", info


def test_a_token_command_serves_as_the_token_provider(tmp_path: Path) -> None:
    """GATEKEEPER_GOOGLE_TOKEN_COMMAND: a command printing a token (here, one the fake minted) instead of ADC."""
    path, ids = _job(tmp_path, 6)
    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        from google.auth.transport.requests import Request
        from google.oauth2 import service_account

        creds = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            str(google.write_credentials(tmp_path / "sa.json", fake.url + TOKEN_PATH)),
            scopes=["https://www.googleapis.com/auth/cloud-platform"])
        creds.refresh(Request())
        token = creds.token
        script = tmp_path / "token.sh"
        script.write_text(f"#!/bin/sh\necho '{{\"access_token\": \"{token}\", \"expires_in\": 3600}}'\n")
        script.chmod(0o755)
        env = google_env(fake.url, google, tmp_path, GOOGLE_APPLICATION_CREDENTIALS="",
                         GATEKEEPER_GOOGLE_TOKEN_COMMAND=str(script))
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        assert google.minted == 1 and token not in done.stdout + done.stderr


def test_the_library_runs_a_job_on_google_cloud(tmp_path: Path) -> None:
    """`submit` with `ApiConfig(platform=GooglePlatform(...))`: the same job, the ledger keyed by project, location
    and workspace."""
    from gatekeeper import ApiConfig, GooglePlatform, SubmitSettings, submit

    path, ids = _job(tmp_path, 12)
    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        key = google.write_credentials(tmp_path / "sa.json", fake.url + TOKEN_PATH)
        platform = GooglePlatform(google.project, google.workspace_id, origin=fake.url, credentials_file=key)
        config = ApiConfig(platform=platform)
        assert config.scope == "google_fake_project_global_wrkspc_gcp_1"
        assert config.base_url.endswith("/v1/projects/fake-project/locations/global/workspaces/wrkspc_gcp_1/invoke")
        summary = anyio.run(lambda: submit(path, config=config, settings=SubmitSettings(interval=0.05, ceiling=1000)))
        assert summary.succeeded == len(ids)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        assert google.refused == [] and fake.org.records.bypass_calls == 0


def test_foundry_refuses_batches_in_one_line(tmp_path: Path) -> None:
    path, _ = _job(tmp_path, 2)
    for args in (["submit", str(path), "--platform", "foundry"], ["status", "--platform", "foundry"]):
        proc = gk(args, {"ANTHROPIC_API_KEY": "unused"})
        assert proc.returncode == 2, proc.stderr
        [line] = [x for x in proc.stderr.splitlines() if x.strip()]
        assert "Microsoft Foundry" in line and "no Message Batches" in line


def test_the_fake_speaks_google_cloud_from_its_command_line(tmp_path: Path) -> None:
    """`fake-api --google 60 --deny models.list`: with the exports it prints (a service-account key file of its own,
    the workspace's route), a job finishes; plan's preflight goes on without the Models API, its one warning naming
    the refused permission."""
    import os
    import signal
    import subprocess
    import sys

    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", "0", "--google", "60",
                            "--deny", "models.list", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    env: dict[str, str] = {}
    try:
        assert run.stdout is not None
        lines = [run.stdout.readline()]
        while lines[-1].rstrip() != "}":
            lines.append(run.stdout.readline())
        env = orjson.loads("".join(lines))["env"]
        assert env["GATEKEEPER_PLATFORM"] == "google" and Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).is_file()
        path, ids = _job(tmp_path, 8)
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--no-preflight"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert orjson.loads(done.stdout)["succeeded"] == len(ids)
        listed = gk(["plan", str(path), "--platform", "google"], env)
        assert listed.returncode == 0, listed.stderr[-2000:]
        [warning] = [x for x in listed.stderr.splitlines() if "models.list" in x]
        assert "lack the IAM permission models.list" in warning and "Traceback" not in listed.stderr
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=10)
        if env:
            Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).unlink(missing_ok=True)


@pytest.mark.parametrize("answers", [True, False])
def test_the_ceiling_read_on_the_organization_route_is_rehearsed_from_the_command_line(tmp_path: Path,
                                                                                      answers: bool) -> None:
    """`fake-api --google --organization-answers`: the environment it prints points both routes at the fake with their
    platform paths (no base URL, which would send the organization's read to the workspace's route), and `status`
    reads the ceiling on `.../claudeOrganization/invoke/v1/organizations/rate_limits`; without the flag that read is
    refused (403 rateLimits.list) and status says what to do: --ceiling, or what submit learns."""
    flag = ["--organization-answers"] if answers else []
    with fake_api_process("--google", "--simulated-ceiling", "777", *flag) as env:
        assert "ANTHROPIC_GOOGLE_CLOUD_BASE_URL" not in env and env["GATEKEEPER_GOOGLE_CLOUD_ORIGIN"].startswith("http://127.0.0.1:")
        status = gk(["status", "--json"], env)
        said = orjson.loads(status.stdout)
        if answers:
            assert status.returncode == 0 and said["ceiling"] == 777, status.stderr[-2000:]
            assert said["ceiling_source"] == "google-organization-route" and "organization route" in said["measured"], said
        else:
            assert said["ceiling"] is None and said["ceiling_source"] is None, said
            assert "claudeOrganization" in " ".join(said["repair"]) and "--ceiling" in " ".join(said["repair"])
            assert "rateLimits.list" in said["ceiling_error"] and "claudeOrganization" in said["ceiling_error"], said
            # (an organization route's permission: not the workspace's to grant; a cold tester's finding)
            assert "grant it on the project" in said["ceiling_error"] and "on the workspace" not in said["ceiling_error"]


@pytest.mark.parametrize("env, url, organization", [
    ({}, "https://claude.googleapis.com/v1/projects/p/locations/global/workspaces/w/invoke",
     "https://claude.googleapis.com/v1/projects/p/locations/global/claudeOrganization/invoke"),
    ({"GATEKEEPER_GOOGLE_CLOUD_ORIGIN": "http://127.0.0.1:9/"}, "http://127.0.0.1:9/v1/projects/p/locations/global/workspaces/w/invoke",
     "http://127.0.0.1:9/v1/projects/p/locations/global/claudeOrganization/invoke"),
    ({"ANTHROPIC_GOOGLE_CLOUD_LOCATION": "us-east5", "GATEKEEPER_GOOGLE_CLOUD_ORIGIN": "https://psc.example.test"},
     "https://psc.example.test/v1/projects/p/locations/us-east5/workspaces/w/invoke",
     "https://psc.example.test/v1/projects/p/locations/us-east5/claudeOrganization/invoke"),
    # (the SDK's base URL is every route's, and wins)
    ({"GATEKEEPER_GOOGLE_CLOUD_ORIGIN": "http://127.0.0.1:9", "ANTHROPIC_GOOGLE_CLOUD_BASE_URL": "https://b.example.test/x"},
     "https://b.example.test/x", "https://b.example.test/x"),
])
def test_where_the_routes_point(env: dict[str, str], url: str, organization: str) -> None:
    from gatekeeper.api._google import from_env

    platform = from_env({"ANTHROPIC_GOOGLE_CLOUD_PROJECT": "p", "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID": "w",
                         "GATEKEEPER_GOOGLE_TOKEN_COMMAND": "true", **env})
    assert (platform.url, platform.organization_url) == (url, organization)


@pytest.mark.parametrize("origin", ["claude.googleapis.com", "https://psc.example.test/v1/projects/p", "ftp://x"])
def test_an_origin_that_is_not_one_is_refused_in_one_line(origin: str) -> None:
    from gatekeeper.api._google import from_env

    with pytest.raises(UsageError, match="GATEKEEPER_GOOGLE_CLOUD_ORIGIN=.*give an origin alone"):
        from_env({"ANTHROPIC_GOOGLE_CLOUD_PROJECT": "p", "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID": "w",
                  "GATEKEEPER_GOOGLE_TOKEN_COMMAND": "true", "GATEKEEPER_GOOGLE_CLOUD_ORIGIN": origin})


@pytest.mark.parametrize("args, said", [
    (["--google", "--deny", "batches.creat"], "not a permission the fake checks; one of batches.cancel, batches.create"),
    (["--deny", "batches.create"], "give --google too"),
    (["--organization-answers"], "give --google too"),
])
def test_fake_api_refuses_a_deny_it_would_not_rehearse(args: list[str], said: str) -> None:
    """`fake-api --deny` with a permission the fake never checks (a typo), or without --google (where no IAM is
    checked): exit 2, one line, before anything is served."""
    done = gk(["fake-api", *args], {})
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("platform, env, named", [
    ("google", {"GOOGLE_CLOUD_PROJECT": "", "GCLOUD_PROJECT": "", "CLOUDSDK_CORE_PROJECT": ""},
     "ANTHROPIC_GOOGLE_CLOUD_PROJECT"),
    ("aws", {"AWS_REGION": "", "AWS_DEFAULT_REGION": ""}, "AWS_REGION"),
])
def test_plan_sizes_the_file_offline_when_the_platforms_settings_are_missing(tmp_path: Path, platform: str,
                                                                             env: dict[str, str], named: str) -> None:
    """plan on a platform without its settings (no project, no region) sizes the file as a plan without credentials
    does: exit 0, every line judged, one warning line naming the missing setting; submit still refuses (exit 2)."""
    path, ids = _job(tmp_path, 7)
    env = {**env, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")}
    planned = gk(["plan", str(path), "--platform", platform, "--json"], env)
    assert planned.returncode == 0, planned.stderr
    assert orjson.loads(planned.stdout)["requests"] == len(ids)
    warning = planned.stderr.strip().splitlines()
    assert len(warning) == 1 and "planned offline" in warning[0] and named in warning[0], planned.stderr
    refused = gk(["submit", str(path), "--platform", platform], env)
    assert refused.returncode == 2 and named in refused.stderr, refused.stderr


def test_plan_sizes_the_file_offline_when_the_google_credentials_are_missing(tmp_path: Path) -> None:
    """plan on Google with its settings but no credentials (a key file that is not there): exit 0, every line
    sized, one warning naming the credentials, as on the other platforms; submit still refuses (exit 2). (A cold
    test's finding: it exited 2 with no plan.)"""
    path, ids = _job(tmp_path, 7)
    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        env = google_env(fake.url, google, tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "none.json"))
        planned = gk(["plan", str(path), "--platform", "google", "--json"], env)
        refused = gk(["submit", str(path), *FAST, "--ceiling", "1000"], env)
    assert planned.returncode == 0, planned.stderr
    assert orjson.loads(planned.stdout)["requests"] == len(ids)
    warning = planned.stderr.strip().splitlines()
    assert len(warning) == 1 and "planned offline" in warning[0], planned.stderr
    assert refused.returncode == 2 and fake.org.records.creates == 0


@pytest.mark.parametrize(("status", "retryable", "outage"), [
    (503, True, True), (500, False, True), (502, False, True), (429, False, True), (408, False, True),
    (None, True, True),  # (google-auth's own judgement, from the body: temporarily_unavailable)
    (400, False, False), (401, False, False), (403, False, False), (None, False, False),
])
def test_which_token_failures_are_an_outage(status: int | None, retryable: bool, outage: bool) -> None:
    from gatekeeper.api._google import token_outage

    assert token_outage(status, retryable) is outage


@pytest.mark.parametrize(("returncode", "stop"), [
    (-signal.SIGINT, True), (-signal.SIGTERM, True), (-signal.SIGHUP, True), (130, True), (143, True),
    (1, False), (2, False), (-signal.SIGKILL, False), (-signal.SIGSEGV, False), (0, False),
])
def test_which_token_command_exits_are_a_stop(returncode: int, stop: bool) -> None:
    from gatekeeper.api._google import interrupted

    assert interrupted(returncode) is stop


@pytest.mark.parametrize(("args", "said"), [
    (("backend_error: None", {"error": "backend_error"}), "backend_error"),
    (("invalid_grant: Invalid JWT Signature.", {"error": "invalid_grant"}), "invalid_grant: Invalid JWT Signature."),
    (("plain",), "plain"),
])
def test_a_google_auth_error_is_said_without_its_data(args: tuple[object, ...], said: str) -> None:
    from google.auth.exceptions import RefreshError

    from gatekeeper.api._google import _said

    assert _said(RefreshError(*args)) == said


def test_a_token_endpoint_outage_mid_job_is_ridden_out(tmp_path: Path) -> None:
    """Google's token endpoint answering 503 for a while mid-job (2 s tokens, so the job needs new ones during the
    outage): the job waits, says so ("retrying" on the token endpoint), and finishes when the endpoint is back."""
    from gatekeeper.testing import Fault

    path, ids = _job(tmp_path)
    google = FakeGoogle(token_life=2.0)
    with running_fake(ceiling=1000, rate=20, google=google) as fake:
        fake.inject(Fault("token", status=503, times=9, after=1))  # (google-auth tries 3 times per refresh)
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "10", "--no-preflight"],
                  google_env(fake.url, google, tmp_path), timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        assert fake.org.records.requests_seen["token"] >= 10 and google.minted >= 2
        assert "Google token refresh: HTTP 503" in done.stderr, done.stderr[-3000:]


def test_a_token_refused_mid_job_stops_in_one_line(tmp_path: Path) -> None:
    """400 invalid_grant from the token endpoint (the key revoked mid-job): exit 2, one line naming the credentials
    and what the endpoint said, never google-auth's (message, data) tuple."""
    from gatekeeper.testing import Fault

    path, _ = _job(tmp_path)
    google = FakeGoogle(token_life=2.0)
    with running_fake(ceiling=1000, rate=20, google=google) as fake:
        fake.inject(Fault("token", status=400, message="Invalid JWT Signature.", times=100, after=1))
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "10", "--no-preflight"],
                  google_env(fake.url, google, tmp_path), timeout=180)
        assert done.returncode == 2, done.stderr[-3000:]
        assert "were refused a token (invalid_grant: Invalid JWT Signature.)" in done.stderr, done.stderr[-3000:]
        assert "{'error'" not in done.stderr and "Traceback" not in done.stderr


def _slow_token_command(tmp: Path) -> tuple[str, Path]:
    """A token command that says it started (its pid in a file) and then takes 30 s."""
    started = tmp / "started"
    script = tmp / "token.py"
    script.write_text(f"import os, pathlib, time\npathlib.Path({str(started)!r}).write_text(str(os.getpid()))\n"
                      "time.sleep(30)\n")
    return f"{sys.executable} {script}", started


def _started(run: subprocess.Popen[str], started: Path) -> int:
    for _ in range(400):
        if started.exists() and started.read_text():
            return int(started.read_text())
        assert run.poll() is None, run.communicate()
        time.sleep(0.05)
    raise AssertionError("the token command never started")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("command", ["plan", "status"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_plan_and_status_stop_at_once_while_the_token_command_runs(tmp_path: Path, command: str, sig: int) -> None:
    """SIGINT or SIGTERM to the process alone (not its group) while the token command runs: exit 130 within a
    second or two, the command killed (not waited out, nor the signal lost and the command's answer used)."""
    path, _ = _job(tmp_path, 3)
    args = ["plan", str(path)] if command == "plan" else ["status"]
    with _under_token_command(tmp_path, *args, "--platform", "google") as (run, child, _):
        sent = time.monotonic()
        run.send_signal(sig)
        _, err = run.communicate(timeout=30)
        took = time.monotonic() - sent
    assert run.returncode == 130 and took < 5, (run.returncode, took, err[-2000:])
    assert "Traceback" not in err and _gone(child), err[-2000:]


@contextmanager
def _under_token_command(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], int, FakeAPI]]:
    """`gatekeeper ARGS` (a session of its own) against the Google fake, its tokens from a slow token command: yielded
    once the command runs (with its pid), killed at the end if still running."""
    from tests.runs import _environ

    argv, started = _slow_token_command(tmp_path)
    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        env = google_env(fake.url, google, tmp_path, GOOGLE_APPLICATION_CREDENTIALS="",
                         GATEKEEPER_GOOGLE_TOKEN_COMMAND=argv)
        run = subprocess.Popen([sys.executable, "-m", "gatekeeper", *args], env=_environ(env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            yield run, _started(run, started), fake
        finally:
            if run.poll() is None:
                run.kill()


def test_status_stops_at_once_while_google_auth_waits_for_its_token_endpoint(tmp_path: Path) -> None:
    """SIGINT to `status` while google-auth waits on a token endpoint that holds its answer 20 s (Application Default
    Credentials, refreshed in a worker thread): exit 130 within a second or two, not when the endpoint answers."""
    from gatekeeper.testing import Fault
    from tests.runs import _environ

    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        fake.inject(Fault("token", kind="delay", delay=20))
        run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "status", "--platform", "google"],
                               env=_environ(google_env(fake.url, google, tmp_path)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            for _ in range(400):
                if fake.org.records.requests_seen.get("token"):
                    break
                time.sleep(0.05)
            assert fake.org.records.requests_seen.get("token") == 1
            sent = time.monotonic()
            run.send_signal(signal.SIGINT)
            _, err = run.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 130 and took < 5, (run.returncode, took, err[-2000:])
        assert "Traceback" not in err, err[-2000:]


def test_ctrl_c_while_the_token_command_runs_is_an_interruption(tmp_path: Path) -> None:
    """SIGINT to the process group (a terminal's Ctrl-C) while GATEKEEPER_GOOGLE_TOKEN_COMMAND runs: the command
    dies of it too, and that is the stop it is (exit 130, the resume line), not a credential failure."""
    path, _ = _job(tmp_path, 3)
    with _under_token_command(tmp_path, "submit", str(path), *FAST, "--ceiling", "1000") as (run, _, fake):
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=30)
        assert fake.org.records.creates == 0
    assert run.returncode == 130, err[-3000:]
    assert "Resume with:" in err and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]


@pytest.mark.parametrize(("fault", "code", "said"), [
    ("token:503:6:1", 0, "Google token refresh: HTTP 503"),  # (an outage after the first token: ridden out)
    ("token:400:50:1", 2, "were refused a token (invalid_grant"),  # (the grant refused: stops, one line)
])
def test_fake_api_faults_reach_the_google_token_endpoint(tmp_path: Path, fault: str, code: int, said: str) -> None:
    """`fake-api --google 2 --fault token:...`: the fault is the Google token endpoint's (where google-auth mints),
    so an outage or a refusal mid-job is rehearsed from the command line."""
    with fake_api_process("--google", "2", "--rate", "5", "--fault", fault) as env:
        path, _ = _job(tmp_path, 30)
        done = gk(["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "10", "--no-preflight"], env,
                  timeout=180)
        assert done.returncode == code, done.stderr[-3000:]
        assert said in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_token_endpoint_down_from_the_start_is_named_as_such(tmp_path: Path) -> None:
    """The token endpoint answering 503 before any token was had: one line naming the token refresh (exit 1, no
    answer within the retries), not "no answer from the API" and its settings: the API was never asked."""
    from gatekeeper.testing import Fault

    google = FakeGoogle()
    with running_fake(ceiling=1000, rate=5000, google=google) as fake:
        fake.inject(Fault("token", status=503, times=30))
        done = gk(["status", "--platform", "google"], google_env(fake.url, google, tmp_path), timeout=120)
        assert done.returncode == 1, done.stderr[-2000:]
        assert "Google token refresh: HTTP 503 (backend_error" in done.stderr, done.stderr[-2000:]
        assert "no answer from the API" not in done.stderr and "Traceback" not in done.stderr
        assert google.paths == []  # (nothing reached the API without a token)


def test_a_job_resumed_with_another_platforms_settings_is_refused_in_one_line(tmp_path: Path) -> None:
    """A cold tester's finding (issue 62): a job stopped on Google Cloud, rerun with the first-party settings, polled
    its Google batch ids on Anthropic's API, counted live (`batch_not_found`, asked again) without a word. Now the
    rerun stops at once, one line naming the platform and scope the job was submitted to and `--platform google`
    (exit 2), nothing created there; the same command on Google then finishes, each request once."""
    from tests.fakes import env_for
    from tests.runs import start

    path, ids = _job(tmp_path)
    google = FakeGoogle()
    args = ["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "10"]
    with running_fake(ceiling=1000, rate=0.0, google=google) as fake, running_fake(ceiling=1000) as first_party:
        env = google_env(fake.url, google, tmp_path)
        run = start(args, env)
        fake.org.wait_for(lambda r: r.creates >= 1, "a batch on Google", 60)
        run.send_signal(signal.SIGINT)
        assert run.wait(60) == 130
        other = [a for a in args if a not in ("--platform", "google")]
        wrong = gk([*other, "--platform", "anthropic"], env_for(first_party))
        assert wrong.returncode == 2, wrong.stderr[-2000:]
        last = wrong.stderr.strip().splitlines()[-1]
        assert "was submitted to Claude on Google Cloud" in last and "--platform google" in last, last
        assert "Traceback" not in wrong.stderr and first_party.org.records.creates == 0
        fake.org.config.rate = 5000.0
        done = gk(args, env, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
