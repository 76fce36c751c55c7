"""Credentials without keys (issue 49): the SDK's chain read in the SDK's order, access tokens that outlive nothing
(exchanged ahead of expiry, the identity token file read again at each exchange, one fresh exchange on a 401),
several workspaces read for the queue's depth, and one line for every refusal. The CLI and the library over real
HTTP against the fake's token endpoint; the SDK's own default credentials against the same fake."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gatekeeper import (
    ApiConfig,
    BearerToken,
    CredentialsError,
    Federation,
    ProfileLogin,
    SubmitSettings,
    UsageError,
    submit_sync,
)
from gatekeeper.api._credentials import find_credentials
from gatekeeper.api._tokens import Due, jwt_expiry, refresh_due
from gatekeeper.testing import FakeFederation, FakeRule, identity_token
from tests.fakes import WS1, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, fake_api_process, gk, killed_after_a_create_then_rerun

RULE, ORG = "fdrl_fake_1", "org_fake_1"
FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1"]


def federation_env(url: str, token_file: Path, **extra: str) -> dict[str, str]:
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_IDENTITY_TOKEN_FILE": str(token_file),
           "ANTHROPIC_FEDERATION_RULE_ID": RULE, "ANTHROPIC_ORGANIZATION_ID": ORG}
    env.update(extra)
    return {k: v for k, v in env.items() if v}


def _job(tmp: Path, n: int = 60) -> tuple[Path, set[str]]:
    ids = {f"c{i:03d}" for i in range(n)}
    return write_jsonl(tmp / "in.jsonl", [req(c) for c in sorted(ids)]), ids


class Rotator:
    """Writes a new identity token (a new `jti`) into the file every `every` seconds, as a projected token rotates."""

    def __init__(self, path: Path, every: float = 0.4) -> None:
        self.path, self.every, self.n = path, every, 0
        self.write()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def write(self) -> None:
        self.n += 1
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(identity_token(jti=f"j{self.n}"))
        os.replace(tmp, self.path)  # (as the kubelet does: the file is swapped whole)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.write()

    def __enter__(self) -> Rotator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _secrets_of(fed: FakeFederation, token_file: Path) -> list[bytes]:
    return [t.encode() for t in fed.issued] + [token_file.read_bytes().strip()]


def _assert_nothing_of_a_token(fed: FakeFederation, token_file: Path, *places: Path | str) -> None:
    """No access token nor the identity token in any file under the places, nor in the texts given."""
    secrets = _secrets_of(fed, token_file)
    for place in places:
        blobs = [place.encode()] if isinstance(place, str) else \
            [p.read_bytes() for p in ([place] if place.is_file() else place.rglob("*")) if p.is_file()]
        for blob in blobs:
            assert not any(s in blob for s in secrets), f"a token was found in {place if isinstance(place, Path) else 'the output'}"


# -- the chain, in the SDK's order ------------------------------------------------------------

def _profile(base: Path, name: str, auth: dict[str, Any], **top: str) -> None:
    (base / "configs").mkdir(parents=True, exist_ok=True)
    (base / "configs" / f"{name}.json").write_text(orjson.dumps({"authentication": auth, **top}).decode())


FED_VARS = {"ANTHROPIC_IDENTITY_TOKEN": "x.y.z", "ANTHROPIC_FEDERATION_RULE_ID": RULE, "ANTHROPIC_ORGANIZATION_ID": ORG}


@pytest.mark.parametrize("env, profiles, sdk_kind", [
    ({"ANTHROPIC_API_KEY": "k", "ANTHROPIC_AUTH_TOKEN": "t", **FED_VARS}, ["default"], "key"),
    ({"ANTHROPIC_AUTH_TOKEN": "t", "ANTHROPIC_PROFILE": "work", **FED_VARS}, ["work"], "StaticToken"),
    ({"ANTHROPIC_PROFILE": "work", **FED_VARS}, ["work", "default"], "CredentialsFile"),
    (FED_VARS, ["default"], "WorkloadIdentityCredentials"),
    ({"ANTHROPIC_FEDERATION_RULE_ID": RULE, "ANTHROPIC_IDENTITY_TOKEN": "x.y.z"}, ["default"], "CredentialsFile"),
    ({"ANTHROPIC_FEDERATION_RULE_ID": RULE, "ANTHROPIC_ORGANIZATION_ID": ORG}, [], None),
    ({}, ["default"], "CredentialsFile"),
    ({}, [], None),
])
def test_the_chain_picks_what_the_sdk_picks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                            profiles: list[str], sdk_kind: str | None) -> None:
    """For each environment, gatekeeper's choice is the SDK's own `default_credentials` choice, first match wins."""
    from anthropic.lib.credentials import default_credentials

    home = tmp_path / "home"
    for name in profiles:
        _profile(home / ".config" / "anthropic", name, {"type": "user_oauth"})
    for k in list(os.environ):
        if k.startswith("ANTHROPIC_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(home))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    sdk = default_credentials(base_url="http://127.0.0.1:1")
    sdk_found = "key" if sdk is None and env.get("ANTHROPIC_API_KEY") else type(sdk.provider).__name__ if sdk else None
    assert sdk_found == sdk_kind
    ours = find_credentials({**env, "HOME": str(home)})
    kind = "key" if ours.keys else None if ours.credential is None else {
        BearerToken: "StaticToken", ProfileLogin: "CredentialsFile",
        Federation: "CredentialsFile" if ours.credential and ours.credential.source.startswith("profile")
        else "WorkloadIdentityCredentials"}[type(ours.credential)]
    assert kind == sdk_kind


@pytest.mark.parametrize("env, profiles, expected", [
    ({"ANTHROPIC_PROFILE": "missing"}, [], "no config file"),
    ({"ANTHROPIC_PROFILE": "../etc"}, [], "is not a file name"),
    ({"ANTHROPIC_CONFIG_DIR": "{base}"}, [], "no config file"),
    ({"ANTHROPIC_PROFILE": "odd"}, ["odd"], "authentication.type"),
])
def test_a_broken_profile_the_user_chose_is_one_line(tmp_path: Path, env: dict[str, str], profiles: list[str],
                                                     expected: str) -> None:
    base = tmp_path / "cfg"
    for name in profiles:
        _profile(base, name, {"type": "sso"})
    env = {k: v.format(base=base) for k, v in env.items()}
    with pytest.raises(CredentialsError, match=expected):
        find_credentials({"HOME": str(tmp_path), "ANTHROPIC_CONFIG_DIR": str(base), **env})


def test_a_federation_profile_takes_its_fields_from_the_file_then_the_environment(tmp_path: Path) -> None:
    base = tmp_path / "cfg"
    _profile(base, "ci", {"type": "oidc_federation", "federation_rule_id": "fdrl_file",
                          "identity_token": {"source": "file", "path": "/run/token"}}, workspace_id="wrkspc_9")
    found = find_credentials({"ANTHROPIC_CONFIG_DIR": str(base), "ANTHROPIC_PROFILE": "ci",
                              "ANTHROPIC_ORGANIZATION_ID": ORG, "ANTHROPIC_FEDERATION_RULE_ID": "fdrl_env"})
    assert found.credential == Federation("fdrl_file", ORG, identity_file=Path("/run/token"), workspace_id="wrkspc_9",
                                          source="profile 'ci'")


# -- pure decisions ---------------------------------------------------------------------------

@pytest.mark.parametrize("now, expires_at, life, due", [
    (0, None, None, Due.KEEP),  # a static token never expires
    (0, 600, 600, Due.KEEP),  # ten minutes left
    (500, 600, 600, Due.ADVISORY),  # 100 s left: under 120
    (575, 600, 600, Due.MANDATORY),  # 25 s left: under 30
    (700, 600, 600, Due.MANDATORY),  # expired
    (0, 2, 2, Due.KEEP),  # a token of 2 s, just minted
    (1.2, 2, 2, Due.ADVISORY),  # under half its life left
    (1.6, 2, 2, Due.MANDATORY),  # under a quarter
    (0, 100, None, Due.ADVISORY),  # life unknown: the SDK's thresholds
])
def test_when_a_token_is_exchanged_again(now: float, expires_at: float | None, life: float | None, due: Due) -> None:
    assert refresh_due(now, expires_at, life) is due


def test_the_expiry_of_an_identity_token_is_read_without_trusting_it() -> None:
    token = identity_token(life=60)
    assert abs((jwt_expiry(token) or 0) - (time.time() + 60)) < 2
    assert jwt_expiry("not-a-jwt") is None and jwt_expiry("a.b.c") is None


# -- end to end ------------------------------------------------------------------------------

def test_a_job_outlives_tokens_of_seconds_with_a_rotating_identity_token(tmp_path: Path) -> None:
    """Tokens live 2 s, the identity token file rotates every 0.4 s, keys are refused, and every token the fake has
    issued is expired by force a quarter second after it was minted (a clock that disagrees): the job ends exit 0, every line once, nothing
    created twice; the 401s were answered by fresh exchanges; several rotated identity tokens were read; no token
    anywhere on disk or in the output."""
    path, ids = _job(tmp_path, 120)
    fed = FakeFederation(token_life=2, keys_refused=True)
    token_file = tmp_path / "token"
    stop = threading.Event()
    with running_fake(ceiling=100_000, rate=40, speed=1, federation=fed) as fake, Rotator(token_file):
        def expire() -> None:
            # A token is ended a quarter second after it was minted, checked ten times a second: the client renews
            # it at half its 2 s life, so each token meets its end while in use (ended at half a second, a loaded CI
            # machine once saw none used after its end); the fresh one a 401 brings still works a while.
            while not stop.wait(0.1):
                with fake.org.lock:
                    now = fake.org.clock()
                    for issued in fed.issued.values():
                        if issued.issued_at < now - 0.25:
                            issued.expires_at = min(issued.expires_at or 0, now)
        killer = threading.Thread(target=expire, daemon=True)
        killer.start()
        out = tmp_path / "out.jsonl"
        done = gk(["submit", str(path), "--out", str(out), "--max-requests", "20", "--json", *FAST],
                  federation_env(fake.url, token_file))
        stop.set()
        killer.join()
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exactly_once(fake, out, ids)
        read = next(e for e in events(done.stderr) if e["event"] == "workspaces")["read"]
        assert read == ["ws1: workload identity federation (rule fdrl_fake_1, identity token "
                        f"{token_file}, the environment) for its workspace"]
        assert fed.expired_calls > 0 and len(fed.exchanges) > fed.expired_calls // 4
        assert len({e["jti"] for e in fed.exchanges}) >= 3  # the file was read again at each exchange
        assert fake.org.records.requests_seen.get("create", 0) >= 6
        _assert_nothing_of_a_token(fed, token_file, tmp_path / "in.jsonl.gatekeeper", out, done.stdout + done.stderr)


def test_the_library_takes_a_federation_credential(tmp_path: Path) -> None:
    path, ids = _job(tmp_path, 30)
    fed = FakeFederation(token_life=3, keys_refused=True)
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    with running_fake(ceiling=100_000, rate=200, speed=1, federation=fed) as fake:
        config = ApiConfig(base_url=fake.url, credential=Federation(RULE, ORG, identity_file=token_file))
        out = tmp_path / "out.jsonl"
        summary = submit_sync(path, config=config, settings=SubmitSettings(out=out, interval=0.05,
                                                                           token_sample=0))
        assert summary.succeeded == 30 and summary.complete
        assert_exactly_once(fake, out, ids)
        assert fed.exchanges and fed.calls_by_workspace == {"wrkspc_1": fed.calls_by_workspace["wrkspc_1"]}


def test_the_sdks_default_credentials_speak_to_the_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK 2.x, given nothing but the federation variables, exchanges at the fake's token endpoint, calls with
    its tokens, and exchanges again (reading the rotated file) once a 2-second token is near its end."""
    import anthropic

    fed = FakeFederation(token_life=2, keys_refused=True)
    token_file = tmp_path / "token"
    for k in list(os.environ):
        if k.startswith("ANTHROPIC_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    with running_fake(federation=fed) as fake:
        for k, v in federation_env(fake.url, token_file).items():
            monkeypatch.setenv(k, v)
        token_file.write_text(identity_token(jti="first"))
        client = anthropic.Anthropic(max_retries=0)
        batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": {
            "model": "claude-haiku-4-5-20251001", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}}])
        token_file.write_text(identity_token(jti="second"))
        time.sleep(2.1)
        assert client.messages.batches.retrieve(batch.id).id == batch.id
        client.close()
    assert [e["jti"] for e in fed.exchanges][:2] == ["first", "second"]
    assert fed.refused == [] and fed.calls_by_workspace["wrkspc_1"] >= 2


def test_status_reads_every_workspace_a_credential_acts_on(tmp_path: Path) -> None:
    """A rule that enables two workspaces: with ANTHROPIC_EXTRA_WORKSPACE_IDS the depth covers both (one exchange
    per workspace) and the report names what it read; a static token selects its workspaces by header."""
    fed = FakeFederation(rules={RULE: FakeRule(workspaces=("wrkspc_1", "wrkspc_2"))},
                         bearer_tokens={"static-token-1": ("wrkspc_1", "wrkspc_2")})
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    with running_fake(federation=fed, rate=0.0) as fake:
        fake.org.add_batch("wrkspc_1", 300)
        fake.org.add_batch("wrkspc_2", 4_000)
        env = federation_env(fake.url, token_file, ANTHROPIC_WORKSPACE_ID="wrkspc_1")
        one = gk(["status", "--json", "--ceiling", "100000"], env)
        both = gk(["status", "--json", "--ceiling", "100000"], {**env, "ANTHROPIC_EXTRA_WORKSPACE_IDS": "wrkspc_2"})
        static = gk(["status", "--json", "--ceiling", "100000"],
                    {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_AUTH_TOKEN": "static-token-1",
                     "ANTHROPIC_EXTRA_WORKSPACE_IDS": "wrkspc_2"})
    assert orjson.loads(one.stdout)["depth"] == 300
    report = orjson.loads(both.stdout)
    assert report["depth"] == 4_300 and len(report["read"]) == 2 and "wrkspc_2" in report["read"][1]
    assert sorted(e["workspace"] for e in fed.exchanges) == ["wrkspc_1", "wrkspc_1", "wrkspc_2"]
    assert orjson.loads(static.stdout)["depth"] == 4_300, static.stderr[-2000:]


def test_a_profile_login_is_refreshed_and_written_back(tmp_path: Path) -> None:
    """A login's access token has expired: gatekeeper refreshes it with the refresh token and the profile's client
    id, writes the rotated refresh token back (0600), and reads the queue."""
    base = tmp_path / "cfg"
    _profile(base, "default", {"type": "user_oauth", "client_id": "client-1"}, workspace_id="wrkspc_1")
    creds = base / "credentials" / "default.json"
    creds.parent.mkdir(parents=True)
    creds.write_text(orjson.dumps({"access_token": "old", "expires_at": int(time.time()) - 10,
                                   "refresh_token": "rt-1"}).decode())
    creds.chmod(0o600)
    fed = FakeFederation(refresh_tokens={"rt-1": ("client-1", ("wrkspc_1",))})
    with running_fake(federation=fed) as fake:
        done = gk(["status", "--json", "--ceiling", "1000"], {"ANTHROPIC_BASE_URL": fake.url,
                                                              "ANTHROPIC_CONFIG_DIR": str(base)})
    assert done.returncode == 0, done.stderr[-2000:]
    written = orjson.loads(creds.read_bytes())
    assert written["refresh_token"] in fed.refresh_tokens and written["access_token"] in fed.issued
    assert creds.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("change, expected", [
    ({"ANTHROPIC_FEDERATION_RULE_ID": "fdrl_other"}, "no federation rule matches"),
    ({"issuer": "https://evil.example.test"}, "issuer does not match"),
    ({"expired": "1"}, "expired"),
    ({"ANTHROPIC_IDENTITY_TOKEN_FILE": "{tmp}/absent"}, "cannot be read"),
    ({"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}, "cannot reach the token endpoint"),
    ({"two": "1"}, "needs ANTHROPIC_WORKSPACE_ID"),
    ({"key": "1"}, "API keys are not accepted"),
    ({"none": "1"}, "no credentials"),
])
def test_every_refusal_is_one_line_and_exit_2(tmp_path: Path, change: dict[str, str], expected: str) -> None:
    path, _ = _job(tmp_path, 3)
    token_file = tmp_path / "token"
    token_file.write_text(identity_token(issuer=change.get("issuer", "https://issuer.example.test"),
                                         life=-5 if "expired" in change else 600))
    rules = {RULE: FakeRule(workspaces=("wrkspc_1", "wrkspc_2") if "two" in change else ("wrkspc_1",))}
    fed = FakeFederation(rules=rules, keys_refused=True)
    with running_fake(federation=fed) as fake:
        env = federation_env(fake.url, token_file)
        env.update({k: v.format(tmp=tmp_path) for k, v in change.items() if k.startswith("ANTHROPIC_")})
        if "key" in change:
            env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": WS1}
        if "none" in change:
            env = {"ANTHROPIC_BASE_URL": fake.url, "HOME": str(tmp_path)}
        done = gk(["submit", str(path), "--out", str(tmp_path / "out.jsonl"), *FAST], env)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in done.stderr, done.stderr
    _assert_nothing_of_a_token(fed, token_file, done.stderr + done.stdout)
    if "ANTHROPIC_IDENTITY_TOKEN_FILE" in change or "none" in change:
        return
    assert str(token_file) in lines[0] or "rule" in lines[0] or "token endpoint" in lines[0] or "key" in lines[0]


def test_a_token_refused_again_when_fresh_is_a_refusal_not_a_loop(tmp_path: Path) -> None:
    """Every bearer call refused (a disabled service account): one fresh exchange, then one line and exit 2; the
    batch that was about to be created is back to planned, nothing created."""
    path, _ = _job(tmp_path, 5)
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    fed = FakeFederation(tokens_revoked=True)
    with running_fake(federation=fed) as fake:
        done = gk(["status", "--ceiling", "10"], federation_env(fake.url, token_file))
        assert done.returncode == 2 and "invalid bearer token" in done.stderr and len(fed.exchanges) == 2
        done = gk(["submit", str(path), "--out", str(tmp_path / "out.jsonl"), *FAST], federation_env(fake.url, token_file))
        assert done.returncode == 2, done.stderr[-2000:]
        assert fake.org.records.requests_seen.get("create", 0) == 0 or fake.org.batches == {}


def test_a_kill_after_a_create_then_a_rerun_with_new_tokens(tmp_path: Path) -> None:
    """SIGKILL right after a create was answered; the rerun exchanges its own tokens (the file rotated meanwhile)
    and finds the batch by listing: nothing created twice, every line once."""
    path, ids = _job(tmp_path, 45)
    token_file = tmp_path / "token"
    fed = FakeFederation(token_life=2, keys_refused=True)
    with running_fake(ceiling=1000, rate=5000, federation=fed) as fake, Rotator(token_file):
        args = ["submit", str(path), *FAST, "--ceiling", "1000", "--max-requests", "15"]
        killed_after_a_create_then_rerun(fake, path, ids, args, federation_env(fake.url, token_file))
        assert fake.org.records.creates == 3
        _assert_nothing_of_a_token(fed, token_file, Path(str(path) + ".gatekeeper"))


def test_an_airflow_connection_can_name_federation() -> None:
    from gatekeeper.airflow._connection import api_config

    c = api_config("wif", None, "api.example.test", {"identity_token_file": "/var/run/secrets/anthropic/token",
                                                     "federation_rule_id": RULE, "organization_id": ORG,
                                                     "workspace_id": "wrkspc_1", "extra_workspace_ids": ["wrkspc_2"]})
    assert c.credential == Federation(RULE, ORG, identity_file=Path("/var/run/secrets/anthropic/token"),
                                      workspace_id="wrkspc_1", source="connection 'wif'")
    assert c.workspace_ids == ("wrkspc_2",) and c.base_url == "https://api.example.test" and c.reads == 2
    with pytest.raises(UsageError, match="federation needs identity_token_file"):
        api_config("wif", None, None, {"federation_rule_id": RULE})


def test_the_fake_rehearses_federation_from_its_command_line(tmp_path: Path) -> None:
    """`fake-api --federation 2`: keys refused, tokens of 2 s; with the exports it prints (an identity token file,
    a rule, an organization), a job exchanges its tokens and finishes; an API key is refused."""
    with fake_api_process("--federation", "2") as env:
        assert {"ANTHROPIC_IDENTITY_TOKEN_FILE", "ANTHROPIC_FEDERATION_RULE_ID", "ANTHROPIC_ORGANIZATION_ID"} <= set(env)
        path, ids = _job(tmp_path, 10)
        done = gk(["submit", str(path), *FAST, "--json"], env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert orjson.loads(done.stdout)["succeeded"] == 10
        keyed = gk(["status"], {"ANTHROPIC_BASE_URL": env["ANTHROPIC_BASE_URL"], "ANTHROPIC_API_KEY": WS1})
        assert keyed.returncode == 2 and "API keys are not accepted" in keyed.stderr


def test_a_token_endpoint_that_fails_mid_job_is_ridden_out(tmp_path: Path) -> None:
    """Once the job runs, the token endpoint answers 503 three times and drops one connection: the exchanges are
    retried like any call (the current token kept while it is still good), and the job ends with every line once."""
    from gatekeeper.testing import Fault

    path, ids = _job(tmp_path, 60)
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    fed = FakeFederation(token_life=2, keys_refused=True)
    with running_fake(rate=8, speed=1, federation=fed) as fake:  # (about 8 s: several exchanges of 2 s tokens)
        def inject() -> None:
            fake.org.wait_for(lambda r: r.creates >= 1, "a first create")
            fake.inject(Fault("token", status=503, times=3), Fault("token", kind="drop"))
        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
        out = tmp_path / "out.jsonl"
        done = gk(["submit", str(path), "--out", str(out), "--max-requests", "20", *FAST],
                  federation_env(fake.url, token_file))
        injector.join()
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exactly_once(fake, out, ids)
        assert all(f.times == 0 for f in fake.faults.items), "the job ended before it met every failure"
        assert fake.org.records.requests_seen["token"] >= len(fed.exchanges) + 4  # (the four failures were met)


def _process_after(fake, holds) -> None:
    """The fake's processing (held at rate 0) let go at 400 a second once `holds`, or after a minute in any case."""
    try:
        fake.org.wait_for(holds, "a refusal or a first create", 60)
    except AssertionError:
        pass  # (the test's own assertions say what went wrong)
    finally:
        fake.org.config.rate = 400.0


@pytest.mark.parametrize("extra, refused", [("wrkspc_2", False), ("", True)])
def test_admission_counts_every_workspace_a_federation_acts_on(tmp_path: Path, extra: str, refused: bool) -> None:
    """Another workspace of the same rule holds 700 of a ceiling of 1,000. With ANTHROPIC_EXTRA_WORKSPACE_IDS naming
    it, submit reads both depths (an exchange each) and creates only what fits: no refusal, never over the ceiling,
    and its workspaces event names both. Without it, the job sees a lower bound and is refused (the control)."""
    path, ids = _job(tmp_path, 600)
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    fed = FakeFederation(rules={RULE: FakeRule(workspaces=("wrkspc_1", "wrkspc_2"))}, token_life=3)
    # (nothing is processed until the refusal, or the first create where none is due: the other workspace's 700 still
    # hold their place when the job's second create goes out, however slowly a loaded machine runs the job up to it)
    with running_fake(ceiling=1000, rate=0.0, speed=1, federation=fed, queue_retry_after=0.2) as fake:
        fake.org.add_batch("wrkspc_2", 700)
        env = federation_env(fake.url, token_file, ANTHROPIC_WORKSPACE_ID="wrkspc_1",
                             ANTHROPIC_EXTRA_WORKSPACE_IDS=extra)
        out = tmp_path / "out.jsonl"
        release = threading.Thread(target=_process_after, args=(fake, lambda r: bool(r.refusals) or (not refused and r.creates >= 1)))
        release.start()
        try:
            done = gk(["submit", str(path), "--out", str(out), "--ceiling", "1000", "--max-requests", "300", "--json",
                       *FAST], env)
        finally:
            release.join()
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exactly_once(fake, out, ids)
        assert bool(fake.org.records.refusals) is refused
        assert fake.org.records.max_depth <= 1000
        read = next(e for e in events(done.stderr) if e["event"] == "workspaces")["read"]
        assert len(read) == (1 if refused else 2)
        assert {e["workspace"] for e in fed.exchanges} == ({"wrkspc_1"} if refused else {"wrkspc_1", "wrkspc_2"})
        _assert_nothing_of_a_token(fed, token_file, Path(str(path) + ".gatekeeper"), out, done.stdout + done.stderr)
