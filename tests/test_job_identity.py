"""A job's identity never depends on a secret's value (issue 58 point 6, review F7): its default name and its
duplicate-job guard are keyed by the account (platform and scope, base URL, organization), so rotating a bearer
token, an API key or a federation rule resumes the same job, in a shared journal and with a local state folder; a
job named the old way (by the key) still resumes; a rerun with another workspace's key is refused before it sends
anything, since it cannot see the job's batches."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import pytest

from gatekeeper import ApiConfig, JournalError, RetryPolicy, SubmitSettings, submit_sync
from gatekeeper.run.shared._inputs import hash_file
from gatekeeper.run.shared._opening import chosen_name, job_name_of, recorded_in
from gatekeeper.run.shared._settings import default_job_name
from gatekeeper.testing import FakeFederation, FakeRule, identity_token
from tests.fakes import running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, start_and_wait_for_create

FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]
BASE = {"ANTHROPIC_BASE_URL": "https://api.example.test"}
FED = {**BASE, "ANTHROPIC_IDENTITY_TOKEN_FILE": "/run/token", "ANTHROPIC_FEDERATION_RULE_ID": "fdrl_1",
       "ANTHROPIC_ORGANIZATION_ID": "org_1"}
AWS = {"GATEKEEPER_PLATFORM": "aws", "AWS_REGION": "us-east-1", "ANTHROPIC_AWS_WORKSPACE_ID": "wrkspc_a",
       "ANTHROPIC_AWS_API_KEY": "aws-short-term-key-1"}


@pytest.mark.parametrize("before, after", [
    ({**BASE, "ANTHROPIC_API_KEY": "test-key-monday-1"}, {**BASE, "ANTHROPIC_API_KEY": "test-key-tuesday-2"}),
    ({**BASE, "ANTHROPIC_AUTH_TOKEN": "gw-token-monday"}, {**BASE, "ANTHROPIC_AUTH_TOKEN": "gw-token-tuesday"}),
    (FED, {**FED, "ANTHROPIC_FEDERATION_RULE_ID": "fdrl_2", "ANTHROPIC_IDENTITY_TOKEN_FILE": "/other/token"}),
    (FED, {**FED, "ANTHROPIC_WORKSPACE_ID": "wrkspc_1"}),  # (the rule's only workspace, now named)
    (FED, {**FED, "ANTHROPIC_SERVICE_ACCOUNT_ID": "svac_2"}),
    (AWS, {**AWS, "ANTHROPIC_AWS_API_KEY": "aws-short-term-key-2"}),
    ({**BASE, "ANTHROPIC_API_KEY": "k1"}, {"ANTHROPIC_BASE_URL": "https://API.example.test:443/", "ANTHROPIC_API_KEY": "k2"}),
])
def test_a_rotated_secret_names_the_same_account(before: dict[str, str], after: dict[str, str]) -> None:
    assert ApiConfig.from_env(before).fingerprint() == ApiConfig.from_env(after).fingerprint()
    assert ApiConfig.from_env(before).legacy_fingerprint() != ApiConfig.from_env(after).legacy_fingerprint() \
        or before.get("ANTHROPIC_SERVICE_ACCOUNT_ID") == after.get("ANTHROPIC_SERVICE_ACCOUNT_ID")


@pytest.mark.parametrize("before, after", [
    ({**BASE, "ANTHROPIC_API_KEY": "k"}, {"ANTHROPIC_BASE_URL": "https://gateway.example.test", "ANTHROPIC_API_KEY": "k"}),
    ({**BASE, "ANTHROPIC_API_KEY": "k"}, {"ANTHROPIC_BASE_URL": "https://api.example.test/eu", "ANTHROPIC_API_KEY": "k"}),
    (FED, {**FED, "ANTHROPIC_ORGANIZATION_ID": "org_2"}),
    (AWS, {**AWS, "ANTHROPIC_AWS_WORKSPACE_ID": "wrkspc_b"}),
    (AWS, {**AWS, "AWS_REGION": "eu-west-1"}),
])
def test_another_account_is_another_name(before: dict[str, str], after: dict[str, str]) -> None:
    assert ApiConfig.from_env(before).fingerprint() != ApiConfig.from_env(after).fingerprint()


def test_the_account_is_named_without_a_secret() -> None:
    for env in ({**BASE, "ANTHROPIC_API_KEY": "test-key-secret-1"}, {**BASE, "ANTHROPIC_AUTH_TOKEN": "gw-secret-2"},
                {**AWS, "ANTHROPIC_AWS_API_KEY": "aws-secret-3"}):
        account = ApiConfig.from_env(env).account()
        assert not any(v in account for k, v in env.items() if "KEY" in k or "TOKEN" in k)


@pytest.mark.parametrize("known, expected", [
    (set(), "new"), ({"new"}, "new"), ({"old"}, "old"), ({"new", "old"}, "new"),
])
def test_an_old_name_is_kept_only_where_a_job_is_recorded_under_it_alone(known: set[str], expected: str) -> None:
    assert chosen_name("new", "old", known.__contains__) == expected
    assert chosen_name("new", "old", None) == "new" and chosen_name("same", "same", known.__contains__) == "same"


def test_a_local_folder_named_the_old_way_is_found(tmp_path: Path) -> None:
    """An orchestrator names a job's state folder by its name (Airflow): a folder named by the key goes on."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    config = ApiConfig.from_env({**BASE, "ANTHROPIC_API_KEY": "test-key-monday-1"})
    old = default_job_name(hash_file(str(path)), config.legacy_fingerprint())
    new = default_job_name(hash_file(str(path)), config.fingerprint())
    base = tmp_path / "jobs"
    assert job_name_of(str(path), config, recorded=recorded_in(None, base)) == new
    (base / old).mkdir(parents=True)
    (base / old / "journal.sqlite3").write_bytes(b"")
    assert job_name_of(str(path), config, recorded=recorded_in(None, base)) == old


# -- end to end ---------------------------------------------------------------------------------------------

def _input(tmp: Path, tag: str, n: int = 30) -> tuple[Path, set[str]]:
    ids = {f"{tag}-{i:03d}" for i in range(n)}
    return write_jsonl(tmp / "in.jsonl", [req(c) for c in sorted(ids)]), ids


def _rotation(kind: str, tmp: Path) -> tuple[dict[str, object], dict[str, str], dict[str, str]]:
    """(the fake's config, the environment before, after; without the base URL) of one kind of rotation, in one
    workspace."""
    if kind == "key":
        return ({"workspaces": {"key-monday-1": "wrkspc_1", "key-tuesday-2": "wrkspc_1"}},
                {"ANTHROPIC_API_KEY": "key-monday-1"}, {"ANTHROPIC_API_KEY": "key-tuesday-2"})
    if kind == "token":
        fed = FakeFederation(bearer_tokens={"gw-token-monday": ("wrkspc_1",), "gw-token-tuesday": ("wrkspc_1",)})
        return {"federation": fed}, {"ANTHROPIC_AUTH_TOKEN": "gw-token-monday"}, {"ANTHROPIC_AUTH_TOKEN": "gw-token-tuesday"}
    token = tmp / "identity"
    token.write_text(identity_token())
    fed = FakeFederation(rules={"fdrl_fake_1": FakeRule(), "fdrl_fake_2": FakeRule()})
    env = {"ANTHROPIC_IDENTITY_TOKEN_FILE": str(token), "ANTHROPIC_FEDERATION_RULE_ID": "fdrl_fake_1",
           "ANTHROPIC_ORGANIZATION_ID": "org_fake_1"}
    return {"federation": fed}, env, {**env, "ANTHROPIC_FEDERATION_RULE_ID": "fdrl_fake_2"}


@pytest.mark.parametrize("kind", ["token", "key", "rule"])
def test_a_rotated_secret_resumes_the_same_shared_journal_job(tmp_path: Path, pg_database: str, kind: str) -> None:
    """`--journal postgresql://`, no --job: killed after its first create, the job is run again after the token
    (the key, the federation rule) was rotated: the same job resumes, every request once, nothing created twice."""
    path, ids = _input(tmp_path, kind)
    fake_config, before, after = _rotation(kind, tmp_path)
    with running_fake(ceiling=10_000, rate=4000, **fake_config) as fake:
        before, after = ({"ANTHROPIC_BASE_URL": fake.url, **env} for env in (before, after))
        args = ["submit", str(path), "--journal", pg_database, "--max-requests", "10", *FAST]
        killed = gk(args, before, crash_at="after-create:1")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        done = gk(args, after)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = orjson.loads(done.stdout)
        assert summary["job"] == default_job_name(hash_file(str(path)), ApiConfig.from_env(before).fingerprint())
        assert summary["succeeded"] == len(ids) and "resumed" in [e["event"] for e in events(done.stderr)]
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


def test_a_job_named_by_its_key_before_this_change_still_resumes(tmp_path: Path, pg_database: str) -> None:
    """A shared journal in the field holds a job under its old name (the input's digest and the key's): the same
    command, no --job, resumes that job (never starts it again under the new name)."""
    path, ids = _input(tmp_path, "legacy")
    with running_fake(ceiling=10_000, rate=4000) as fake:
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key-ws1"}
        legacy = default_job_name(hash_file(str(path)), ApiConfig.from_env(env).legacy_fingerprint())
        common = ["--journal", pg_database, "--max-requests", "10", *FAST]
        killed = gk(["submit", str(path), "--job", legacy, *common], env, crash_at="after-create:1")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        done = gk(["submit", str(path), *common], env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert orjson.loads(done.stdout)["job"] == legacy
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        report = gk(["report", str(path), "--journal", pg_database, "--json"], env)  # (reading commands find it too)
        assert report.returncode == 0, report.stderr[-2000:]
        assert orjson.loads(report.stdout)["summary"]["job"] == legacy


def test_the_duplicate_guard_holds_across_a_rotated_key(tmp_path: Path) -> None:
    """One run of an input is live (a shared ledger knows it); a second run of the same input with the rotated key,
    from another state folder, is refused as a duplicate (exit 2): it would send everything again."""
    path, _ = _input(tmp_path, "dup", 10)
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    with running_fake(ceiling=10_000, rate=0.0, workspaces={"key-monday-1": "wrkspc_1", "key-tuesday-2": "wrkspc_1"}) as fake:
        monday = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "key-monday-1"}
        tuesday = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "key-tuesday-2"}
        live = start_and_wait_for_create(["submit", str(path), "--ledger", ledger, *FAST], monday, fake)
        try:
            second = gk(["submit", str(path), "--ledger", ledger, "--state", str(tmp_path / "other"), *FAST],
                        tuesday, timeout=30)  # (not refused, it would wait on a queue that does not move)
            assert second.returncode == 2 and "already being submitted" in second.stderr, second.stderr[-2000:]
            assert fake.org.records.creates == 1
        finally:
            live.send_signal(signal.SIGINT)
            live.communicate(timeout=30)


def test_another_workspaces_key_cannot_resume_a_job_it_cannot_see(tmp_path: Path, pg_database: str) -> None:
    """The same base URL, so the same default name, but the key of another workspace: the job's batches answer 404
    there, so the run is refused in one line before it sends anything (it would count them live for a day)."""
    path, ids = _input(tmp_path, "other", 20)
    with running_fake(ceiling=10_000, rate=0.0) as fake:
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key-ws1"}
        killed = gk(["submit", str(path), "--journal", pg_database, "--max-requests", "10", *FAST], env,
                    crash_at="after-create:2")  # (the first batch recorded created: there is a batch to look for)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        creates = fake.org.records.creates
        config = ApiConfig.from_env({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key-ws2"})
        settings = SubmitSettings(journal=pg_database, interval=0.05, token_sample=0)
        with pytest.raises(JournalError, match="not found with these credentials"):
            submit_sync(path, config=config, settings=settings, retry=RetryPolicy(not_found_grace=0.0))
        assert fake.org.records.creates == creates
        same = ApiConfig.from_env(env)  # (its own workspace's key: it resumes)
        fake.config.rate = 4000.0
        summary = submit_sync(path, config=same, settings=settings, retry=RetryPolicy(not_found_grace=0.0))
        assert summary.succeeded == 20
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
