"""Tokens never stall calls (issue 58 point 5, review findings F6, F11, F12, F14): a valid token keeps serving while one
exchange is in flight, a failed exchange backs off as the SDK's TokenCache does, only a caller whose token is past its
mandatory window waits (and all of them wait on one exchange); headers are made after the call budget's wait; no
secret a token endpoint echoes reaches the error line; ANTHROPIC_AUTH_TOKEN goes out as the SDK sends it. Against the
fake's own token endpoint, with the token's clock injected."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import orjson
import pytest

from gatekeeper import Federation, Secret, TransportError
from gatekeeper.api._client import ApiClient
from gatekeeper.api._http import given_up, open_http
from gatekeeper.api._retry import CallBudget
from gatekeeper.api._tokens import ADVISORY_BACKOFF, Outgoing, TokenAuth, redacted
from gatekeeper.testing import FakeAPI, FakeFederation, Fault, identity_token
from tests.fakes import WS1, running_fake
from tests.runs import gk

pytestmark = pytest.mark.anyio

RULE, ORG = "fdrl_fake_1", "org_fake_1"
LIFE = 600.0  # seconds a token lives: advisory from 480 (120 s left), mandatory from 570 (30 s left)


def _exchanges_asked(fake: FakeAPI) -> int:
    return fake.org.records.requests_seen.get("token", 0)


async def _until(condition: object, what: str, limit: float = 20.0) -> None:
    """Poll a condition on the event loop (the fake answers on its own threads) for at most `limit` real seconds."""
    with anyio.fail_after(limit):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.01)


async def _all_ready(auth: TokenAuth, n: int = 8) -> list[BaseException | None]:
    """`n` calls asking for a token at once: what each got (None: a token)."""
    out: list[BaseException | None] = []

    async def one() -> None:
        try:
            await auth.ready()
            out.append(None)
        except TransportError as exc:
            out.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return out


async def test_eight_calls_in_the_advisory_window_never_wait_on_a_slow_failing_endpoint(tmp_path: Path) -> None:
    """Review S4. The token is valid and due for refresh; the token endpoint takes 2 s to fail. Eight concurrent
    calls all go on with the valid token while one exchange is out (none waits for it); eight more while it is out
    start no other; once it failed, nothing is asked again for ADVISORY_BACKOFF seconds (of the injected clock);
    after that one exchange, for any number of callers, and it is kept."""
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    now = [0.0]
    with running_fake(federation=FakeFederation(token_life=LIFE)) as fake:
        async with open_http() as http, anyio.create_task_group() as background:
            auth = TokenAuth(Federation(RULE, ORG, identity_file=token_file), None, http=http, base_url=fake.url,
                             clock=lambda: now[0], spawn=background.start_soon)
            await auth.ready()
            assert (auth.generation, _exchanges_asked(fake)) == (1, 1)

            now[0] = 500.0  # (100 s left: advisory)
            fake.inject(Fault("token", status=503, delay=2.0))
            started = time.monotonic()
            assert await _all_ready(auth) == [None] * 8
            waited = time.monotonic() - started
            await _until(lambda: _exchanges_asked(fake) == 2, "the exchange to reach the token endpoint")
            assert auth.refreshing, "the calls came back only once the exchange ended: they waited on it"
            assert await _all_ready(auth) == [None] * 8  # (while it is out)
            assert _exchanges_asked(fake) == 2 and auth.refreshing and waited < 2.0

            await _until(lambda: not auth.refreshing, "the slow exchange to fail")
            assert auth.generation == 1  # (failed: the valid token still serves)
            now[0] = 500.0 + ADVISORY_BACKOFF - 1  # (inside the backoff)
            assert await _all_ready(auth) == [None] * 8
            await anyio.sleep(0.2)
            assert _exchanges_asked(fake) == 2 and not auth.refreshing

            now[0] = 500.0 + ADVISORY_BACKOFF + 1  # (past it, still advisory)
            assert await _all_ready(auth) == [None] * 8
            await _until(lambda: auth.generation == 2, "the exchange after the backoff")
            assert _exchanges_asked(fake) == 3
            background.cancel_scope.cancel()


async def test_past_the_mandatory_window_every_caller_waits_on_one_exchange_and_is_told_its_failure(
        tmp_path: Path) -> None:
    """30 s from expiry eight calls must have a new token: one exchange is made and all eight wait for it; when it
    fails each is told (a TransportError its retry rides out), none makes an exchange of its own; the next call, the
    endpoint back, gets a fresh token."""
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    now = [0.0]
    with running_fake(federation=FakeFederation(token_life=LIFE)) as fake:
        async with open_http() as http, anyio.create_task_group() as background:
            auth = TokenAuth(Federation(RULE, ORG, identity_file=token_file), None, http=http, base_url=fake.url,
                             clock=lambda: now[0], spawn=background.start_soon)
            await auth.ready()
            now[0] = LIFE - 10  # (10 s left: mandatory)
            fake.inject(Fault("token", status=503, delay=0.5))
            got = await _all_ready(auth)
            assert len(got) == 8 and all(isinstance(e, TransportError) for e in got), got
            assert _exchanges_asked(fake) == 2 and auth.generation == 1
            assert await _all_ready(auth) == [None] * 8
            assert _exchanges_asked(fake) == 3 and auth.generation == 2
            background.cancel_scope.cancel()


async def test_without_a_task_group_the_advisory_caller_exchanges_itself_and_others_go_on(tmp_path: Path) -> None:
    """No background (a TokenAuth used on its own): the one caller that starts the advisory exchange waits for it,
    as the SDK's does; the seven others go on with the valid token at once; one exchange in all."""
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    now = [0.0]
    with running_fake(federation=FakeFederation(token_life=LIFE)) as fake:
        async with open_http() as http:
            auth = TokenAuth(Federation(RULE, ORG, identity_file=token_file), None, http=http, base_url=fake.url,
                             clock=lambda: now[0])
            await auth.ready()
            now[0] = 500.0
            fake.inject(Fault("token", status=503, delay=0.5))
            assert await _all_ready(auth) == [None] * 8
            assert _exchanges_asked(fake) == 2 and auth.generation == 1


async def test_a_create_makes_its_headers_after_the_budget_wait() -> None:
    """The call budget paused by a 429 (a long retry-after): the create's token is read after the wait, not before
    it (a token sent after minutes asleep may have expired; on AWS a signature older than five minutes is refused)."""
    class Auth:
        refreshable, generation, requires_request_body = True, 0, False

        def rejected(self, generation: int) -> bool:
            return False

        def __init__(self) -> None:
            self.readied_at: list[float] = []

        async def ready(self) -> None:
            self.readied_at.append(clock[0])

        def sign(self, request: Outgoing) -> dict[str, str]:
            headers_at.append(clock[0])
            return {**request.headers, "x-api-key": WS1}

        def accepted(self, generation: int) -> None:
            return None

        def redact(self, text: str) -> str:
            return text

    clock, headers_at, slept = [0.0], [], []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    budget = CallBudget()
    budget.pause(400.0)
    with running_fake() as fake:
        async with open_http() as http:
            auth = Auth()
            api = ApiClient(http, fake.url, auth, sleep=sleep, clock=lambda: clock[0], budget=budget)
            body = orjson.dumps({"requests": [{"custom_id": "a", "params": {
                "model": "claude-haiku-4-5-20251001", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}}]})
            await api.create_batch(body)
    assert slept == [400.0] and auth.readied_at == [400.0] and headers_at == [400.0]


def test_an_echoed_grant_never_reaches_the_error_line(tmp_path: Path) -> None:
    """A proxy before the token endpoint answers 400 in plain text, repeating the request: the refresh grant (a
    profile's login) and the identity token (federation) are in that body, never in the one line shown."""
    base = tmp_path / "cfg"
    (base / "configs").mkdir(parents=True)
    (base / "configs" / "default.json").write_text(orjson.dumps(
        {"authentication": {"type": "user_oauth", "client_id": "client-1"}, "workspace_id": "wrkspc_1"}).decode())
    creds = base / "credentials" / "default.json"
    creds.parent.mkdir(parents=True)
    refresh = "rt-" + "s3cr3t" * 10
    creds.write_text(orjson.dumps({"access_token": "old-access-token-1", "expires_at": int(time.time()) - 10,
                                   "refresh_token": refresh}).decode())
    creds.chmod(0o600)
    token_file = tmp_path / "token"
    assertion = identity_token()
    token_file.write_text(assertion)
    with running_fake(federation=FakeFederation()) as fake:
        fake.inject(Fault("token", kind="echo", status=400, times=2))
        login = gk(["status", "--ceiling", "10"], {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_CONFIG_DIR": str(base)})
        federated = gk(["status", "--ceiling", "10"], {
            "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_IDENTITY_TOKEN_FILE": str(token_file),
            "ANTHROPIC_FEDERATION_RULE_ID": RULE, "ANTHROPIC_ORGANIZATION_ID": ORG})
        assert all(f.times == 0 for f in fake.faults.items)  # (both bodies did echo the grant)
    for done, secret in ((login, refresh), (federated, assertion)):
        assert done.returncode == 2 and "refused the exchange (HTTP 400" in done.stderr, done.stderr
        assert secret not in done.stderr + done.stdout
        assert secret[:40] not in done.stderr  # (nor its start: cut after redacting, never mid-secret)
        assert "***" in done.stderr  # (what was there is said to be cut, not silently dropped)


@pytest.mark.parametrize("text, sent, shown", [
    ("grant_type=refresh_token&refresh_token=abc123xyz&client_id=c", {}, "refresh_token=***"),
    ('{"assertion": "eyJhbGciOi.eyJpc3MiOiJo.c2lnbmF0dXJl"}', {}, '"assertion": "***'),
    ("token eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJodHRwcyJ9.c2lnbmF0dXJlc2ln here", {}, "token *** here"),
    ("echo: my-refresh-value", {"refresh_token": "my-refresh-value"}, "echo: ***"),
    ("invalid_grant: the refresh token is not valid", {"refresh_token": "rt-1"}, "invalid_grant: the refresh token is not valid"),
])
def test_what_a_token_endpoint_says_is_redacted(text: str, sent: dict[str, str], shown: str) -> None:
    assert shown in redacted(text, sent)


def test_an_auth_token_is_sent_as_a_plain_bearer_and_a_minted_one_with_the_oauth_beta(tmp_path: Path) -> None:
    """As the SDK: ANTHROPIC_AUTH_TOKEN goes out as `Authorization: Bearer` with no beta added (its `_bearer_auth`);
    a federation token with `anthropic-beta: oauth-2025-04-20` (its `AccessTokenAuth`)."""
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    fed = FakeFederation(bearer_tokens={"gw-token-monday": ("wrkspc_1",)})
    with running_fake(federation=fed) as fake:
        static = gk(["status", "--ceiling", "10"], {"ANTHROPIC_BASE_URL": fake.url,
                                                    "ANTHROPIC_AUTH_TOKEN": "gw-token-monday"})
        assert static.returncode == 0, static.stderr
        assert set(fed.betas) == {""}
        fed.betas.clear()
        minted = gk(["status", "--ceiling", "10"], {
            "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_IDENTITY_TOKEN_FILE": str(token_file),
            "ANTHROPIC_FEDERATION_RULE_ID": RULE, "ANTHROPIC_ORGANIZATION_ID": ORG})
        assert minted.returncode == 0, minted.stderr
        assert set(fed.betas) == {"oauth-2025-04-20"}


def test_a_key_echoed_in_an_error_body_is_cut_from_the_line() -> None:
    """A gateway whose refusal repeats the key it was given: the workspace key is not in the error line."""
    key = "sk-ant-api03-" + "x" * 40
    with running_fake(workspaces={key: "wrkspc_1"}) as fake:
        fake.inject(Fault("list", status=400, message=f"the upstream refused key {key} for this route"))

        async def read() -> str:
            async with open_http() as http:
                try:
                    await ApiClient(http, fake.url, Secret(key)).list_page()
                except Exception as exc:  # (the line is what is judged)
                    return str(exc)
            return ""

        line = anyio.run(read)
    assert "the upstream refused key *** for this route" in line and key not in line


@pytest.mark.parametrize(("failure", "spoke", "kind"), [
    (TransportError("list (u): ConnectError", endpoint="list"), False, "Unreachable"),  # (the URL or network is wrong)
    (TransportError("list (u): ConnectError", endpoint="list"), True, "TransportError"),
    (TransportError("Google token refresh: HTTP 503", endpoint="token"), False, "TransportError"),  # (API not asked)
    (TransportError("token exchange (u): HTTP 502", endpoint="token"), True, "TransportError"),
])
def test_what_is_raised_when_the_retries_are_spent(failure: Exception, spoke: bool, kind: str) -> None:
    raised = given_up("https://api.example", spoke, failure)
    assert type(raised).__name__ == kind and (kind == "Unreachable" or raised is failure)
