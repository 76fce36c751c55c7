"""The client against the fake over real HTTP: retries, fatal errors, creates never retried, key origins."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest

from gatekeeper._errors import (
    AuthenticationError,
    CreateOutcomeUnknown,
    NotFoundError,
    QueueFull,
    RateLimited,
    RequestTooLarge,
    ServerError,
    SpendLimitReached,
)
from gatekeeper.api._client import ApiClient
from gatekeeper.api._config import ApiConfig, Secret, workspace_keys
from gatekeeper.api._http import open_http
from gatekeeper.api._reads import rate_limits
from gatekeeper.api._retry import RetryPolicy, backoff_delay, next_delay, parse_retry_after, status_is_retryable
from gatekeeper.decide._headroom import enqueued_ceiling
from gatekeeper.input._sizing import body_chunks
from gatekeeper.testing import Fault
from tests.fakes import ADMIN, WS1, running_fake

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(base=0.01, cap=0.05, max_total=5.0)


def _body(*cids: str) -> bytes:
    items = [b'{"custom_id":"%s","params":{"model":"claude-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}' % c.encode()
             for c in cids]
    return b"".join(body_chunks(items))


class _Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_reads_retry_5xx_529_and_429_with_retry_after() -> None:
    """retrieve rides out 500, 529 and a 429 whose retry-after (120 s, beyond the SDK's 60 s cap) is honoured."""
    with running_fake() as fake:
        sleeps = _Sleeps()
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1), retry=RetryPolicy(base=0.01, cap=0.05, max_total=1000), sleep=sleeps)
            b = await api.create_batch(_body("a"))
            fake.inject(Fault("retrieve", status=500), Fault("retrieve", status=529),
                        Fault("retrieve", status=429, retry_after="120"))
            got = await api.retrieve_batch(b["id"])
        assert got["id"] == b["id"]
        assert sleeps.waits[2] == 120.0
        assert sleeps.waits[1] >= 0.01 * 2 * 4.0 * 0.75  # 529 backs off harder


async def test_x_should_retry_false_is_obeyed() -> None:
    """A 503 carrying x-should-retry: false is raised at once."""
    with running_fake() as fake:
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1), retry=FAST, sleep=_Sleeps())
            fake.inject(Fault("list", status=503, should_retry="false"))
            with pytest.raises(ServerError) as info:
                await api.list_page()
        assert info.value.status == 503


async def test_spend_cap_429_is_fatal() -> None:
    """The spend-cap 429 (no retry-after, enforced_spend_limit_reached) is not retried."""
    with running_fake() as fake:
        sleeps = _Sleeps()
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1), retry=FAST, sleep=sleeps)
            fake.inject(Fault("list", status=429, message="You have reached your API usage limits.",
                              details={"error_code": "enforced_spend_limit_reached"}, times=5))
            with pytest.raises(SpendLimitReached):
                await api.list_page()
        assert sleeps.waits == []


async def test_create_never_retried_and_outcome_unknown() -> None:
    """A dropped answer after the server created the batch is CreateOutcomeUnknown, and only one batch exists."""
    with running_fake() as fake:
        fake.inject(Fault("create", kind="drop_after_commit"))
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1), retry=FAST, sleep=_Sleeps())
            with pytest.raises(CreateOutcomeUnknown):
                await api.create_batch(_body("a", "b"))
            fake.inject(Fault("create", status=529))
            with pytest.raises(CreateOutcomeUnknown):
                await api.create_batch(_body("c"))
        assert fake.org.records.creates == 1


async def test_queue_full_and_413_are_definite_refusals() -> None:
    """The queue 429 on create is QueueFull (with its retry-after); the edge 413 is RequestTooLarge."""
    with running_fake(ceiling=1, max_body_bytes=500) as fake:
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1), retry=FAST, sleep=_Sleeps())
            with pytest.raises(QueueFull) as info:
                await api.create_batch(_body("a", "b"))
            assert info.value.retry_after == 60.0 and info.value.status == 429
            assert isinstance(info.value, RateLimited)
            with pytest.raises(RequestTooLarge):
                await api.create_batch(_body(*[f"x{i}" for i in range(20)]))
        assert fake.org.records.creates == 0


async def test_create_streams_body_from_async_iterable() -> None:
    """A create body can be streamed in pieces with an exact content-length."""
    with running_fake() as fake:
        body = _body("a", "b", "c")

        async def pieces():
            for i in range(0, len(body), 7):
                yield body[i:i + 7]

        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1))
            b = await api.create_batch(pieces(), size=len(body))
        assert b["request_counts"]["processing"] == 3


async def test_transient_404_after_create_is_waited_out() -> None:
    """A batch we created may 404 for a while; retrieve waits it out within the grace period."""
    with running_fake(not_found_after_create=0.3) as fake:
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1), retry=RetryPolicy(base=0.1, cap=0.2, max_attempts=20))
            b = await api.create_batch(_body("a"))
            started = time.monotonic()
            got = await api.retrieve_batch(b["id"])
            assert got["id"] == b["id"] and time.monotonic() - started >= 0.2
            with pytest.raises(NotFoundError):  # an id we did not create is not waited for
                await api.retrieve_batch("msgbatch_unknown")


async def test_results_on_another_origin_get_no_key() -> None:
    """A results_url on another origin is fetched without the key."""
    with running_fake(results_origin="signed", rate=1e9) as fake:
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1))
            b = await api.create_batch(_body("a", "b"))
            fake.org.advance(1)
            batch = await api.retrieve_batch(b["id"])
            assert not batch["results_url"].startswith(fake.url)
            lines = [line async for line in api.iter_results(batch)]
        assert len(lines) == 2
        assert fake.org.records.wrong_origin_keys == 0
        assert fake.org.records.requests_seen.get("results", 0) >= 1


async def test_rate_limits_pages_and_admin_key() -> None:
    """The Admin reading follows next_page (an empty first page included) and finds the ceiling."""
    with running_fake(ceiling=123_456, rate_limit_page_size=1, rate_limit_empty_first_page=True) as fake:
        async with open_http() as http:
            entries = await rate_limits(ApiClient(http, fake.url, Secret(ADMIN)), None)
            assert enqueued_ceiling(entries) == 123_456
            with pytest.raises(AuthenticationError):
                await rate_limits(ApiClient(http, fake.url, Secret(WS1)))


def test_enqueued_ceiling_accepts_both_shapes() -> None:
    """group_type or group.type; a missing limiter is None."""
    limits = [{"type": "enqueued_batch_requests", "value": 5}]
    assert enqueued_ceiling([{"group_type": "batch", "limits": limits}]) == 5
    assert enqueued_ceiling([{"group": {"type": "batch"}, "limits": limits}]) == 5
    assert enqueued_ceiling([{"group_type": "batch", "limits": [{"type": "requests_per_minute", "value": 9}]}]) is None
    assert enqueued_ceiling([{"group_type": "model_group", "limits": limits}]) is None
    assert enqueued_ceiling([]) is None


def test_retry_rules() -> None:
    """retry-after-ms beats retry-after; HTTP dates parse; x-should-retry overrides the status rule."""
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}, 0) == 1.5
    assert parse_retry_after({"retry-after": "7"}, 0) == 7.0
    assert parse_retry_after({"retry-after": "Thu, 01 Jan 1970 00:01:40 GMT"}, 40.0) == 60.0
    assert parse_retry_after({"retry-after": "soon"}, 0) is None
    assert status_is_retryable(503, {}) and not status_is_retryable(400, {})
    assert status_is_retryable(400, {"x-should-retry": "true"}) and not status_is_retryable(500, {"x-should-retry": "false"})
    p = RetryPolicy(base=1.0, cap=8.0, jitter=0.0, max_retry_after=100.0)
    assert [backoff_delay(p, i, 0.5) for i in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert next_delay(p, 0, 0.0, server_wait=500.0) == 100.0


def test_secrets_hide_and_dedupe() -> None:
    """Keys never show in repr/str, and the same key twice is one workspace."""
    s = Secret("abc-123")
    assert "abc" not in repr(s) and "abc" not in str(s)
    assert [k.reveal() for k in workspace_keys(" a ", "b, a ,,c")] == ["a", "b", "c"]
    cfg = ApiConfig.from_env({"ANTHROPIC_API_KEY": "zzz-key", "ANTHROPIC_ADMIN_KEY": "adm-key"})
    assert "zzz-key" not in repr(cfg) and "adm-key" not in repr(cfg)


def test_anyio_run_sync_wrapper_works() -> None:
    """The async client also runs under anyio.run (what the sync wrappers do)."""
    with running_fake() as fake:

        async def go() -> int:
            async with open_http() as http:
                return len((await ApiClient(http, fake.url, Secret(WS1)).list_page())["data"])

        assert anyio.run(go) == 0


async def test_redirect_to_another_origin_drops_the_key() -> None:
    """A results redirect to another origin is followed without the key."""
    with running_fake(results_redirect=True, rate=1e9) as fake:
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1))
            b = await api.create_batch(_body("a", "b", "c"))
            fake.org.advance(1)
            batch = await api.retrieve_batch(b["id"])
            assert batch["results_url"].startswith(fake.url)  # the redirect is what moves origin
            lines = [line async for line in api.iter_results(batch)]
        assert len(lines) == 3
        assert fake.org.records.wrong_origin_keys == 0


def test_error_bodies_without_the_envelope() -> None:
    """The edge's bare 413 and an HTML page from a proxy still map to clear errors with the status."""
    import httpx

    from gatekeeper._errors import ServerError
    from gatekeeper.api._http import error_from_response

    r413 = httpx.Response(413, json={"error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}})
    err = error_from_response(r413, "create")
    assert isinstance(err, RequestTooLarge) and err.error_type == "request_too_large" and err.request_id is None
    html = httpx.Response(502, text="<html><body><h1>502 Bad Gateway</h1></body></html>", headers={"request-id": "req_x"})
    err = error_from_response(html, "list")
    assert isinstance(err, ServerError) and err.status == 502 and "502 Bad Gateway" in str(err) and "req_x" in str(err)
    assert "\n" not in str(err)


async def test_one_verifying_tls_context_serves_every_client_of_a_process() -> None:
    """The CA bundle is loaded once a process, not once a client, and the context verifies peers and names."""
    import ssl

    def context(http: httpx.AsyncClient) -> ssl.SSLContext:
        return http._transport._pool._ssl_context  # (httpx keeps it there; what it would use for TLS)

    async with open_http() as one, open_http() as two:
        first, second = context(one), context(two)
    assert first is second
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname and first.cert_store_stats()["x509_ca"] > 0


async def test_a_results_download_rides_out_a_429_only_within_its_time() -> None:
    """A download given `within` seconds puts a 429's told wait off to its caller (RateLimited at once) rather than
    ride it out: under a deadline the loop's readings go on (issue 60, swarm seed 5908: a 429 ridden out for 2.5
    minutes inside a download let the deadline's last chance pass). Without it the told wait is ridden out."""
    with running_fake(rate=1e9) as fake:
        async with open_http() as http:
            api = ApiClient(http, fake.url, Secret(WS1))
            batch = await api.create_batch(_body("a"), size=len(_body("a")))
            fake.org.advance(1)
            batch = await api.retrieve_batch(batch["id"])
            fake.inject(Fault("results", status=429, retry_after="30", times=1))
            started = time.monotonic()
            with pytest.raises(RateLimited):
                [line async for line in api.iter_results(batch, within=0.0)]
            assert time.monotonic() - started < 10  # (ridden out, 30 s; a loaded machine's margin, not 1 s)
        async with open_http() as http:  # (a client of its own: the first one keeps the 30 s it was told)
            api = ApiClient(http, fake.url, Secret(WS1))
            fake.inject(Fault("results", status=429, retry_after="1", times=1))
            assert len([line async for line in api.iter_results(batch)]) == 1  # (the second try, a second later)
