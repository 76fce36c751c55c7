"""The gateway (`gatekeeper serve`) from the client's side: the official anthropic SDK pointed at it, it pointed at
the fake. Every answer must parse into the SDK's own types; the fake's records judge what reached the API."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import pytest

from gatekeeper._wire import BOTH_CURSORS
from gatekeeper.testing import Fault
from tests.fakes import ADMIN, WS1, running_fake
from tests.gateways import Relay, gateway, request, requests

if TYPE_CHECKING:
    import anthropic as anthropic_module

pytestmark = pytest.mark.xdist_group("gateway")


@pytest.fixture(scope="module")
def anthropic() -> ModuleType:
    import anthropic as module

    gc.freeze()
    return module


@pytest.fixture
def sdk(anthropic: ModuleType):
    """SDK clients, closed after the test; `max_retries` as the SDK's default (2) unless asked."""
    made = []

    def make(url: str, key: str, max_retries: int = 2, **kw: Any) -> anthropic_module.Anthropic:
        client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=max_retries, **kw)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def ended(client: anthropic_module.Anthropic, batch_id: str, timeout: float = 60.0) -> Any:
    """Poll as a client does, until the batch has ended."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.monotonic() < deadline, f"{batch_id} still {batch.processing_status} after {timeout} s"
        time.sleep(0.2)


def answered_once(fake: Any, ids: set[str]) -> None:
    """The fake answered each request exactly once, and nothing else."""
    assert set(fake.org.records.succeeded) == ids
    assert all(n == 1 for n in fake.org.records.succeeded.values())


def test_a_create_is_one_job_polled_to_its_end_and_its_results_joined(tmp_path: Path, sdk) -> None:
    """A create answers at once with the gateway's own batch; the job behind it splits under the ceiling into
    several batches upstream; retrieve shows the whole job's counts as the API would; the results stream from the
    gateway's results_url with exactly one line a request; every request was answered once upstream."""
    with running_fake(rate=2_000, speed=20.0, ceiling=1_200) as fake:
        with gateway(fake, tmp_path) as gw:
            client = sdk(gw.url, gw.key("acme"))
            sent = requests(3_000)
            created = client.messages.batches.create(requests=sent)
            assert created.id.startswith("msgbatch_") and created.id not in fake.org.batches
            assert created.processing_status == "in_progress"
            assert created.request_counts.processing == 3_000 and created.results_url is None
            done = ended(client, created.id)
            assert done.request_counts.succeeded == 3_000 and done.request_counts.processing == 0
            assert done.results_url == f"{gw.url}/v1/messages/batches/{created.id}/results"
            assert done.ended_at is not None and done.expires_at > done.created_at
            lines = list(client.messages.batches.results(created.id))
            assert sorted(r.custom_id for r in lines) == sorted(r["custom_id"] for r in sent)
            assert all(r.result.type == "succeeded" for r in lines)
        assert fake.org.records.creates >= 3  # (split: a quarter of the ceiling a batch)
        answered_once(fake, {r["custom_id"] for r in sent})


def test_no_client_key_reaches_the_upstream_and_no_upstream_credential_reaches_a_client(tmp_path: Path, sdk) -> None:
    """Every call upstream carries the gateway's own key; no answer to the client holds the upstream's keys, its
    organization or its batch ids."""
    with running_fake(rate=1e6, speed=100.0) as fake:
        relay = Relay(fake.url)
        try:
            with gateway(fake, tmp_path, upstream=relay.url) as gw:
                key = gw.key("acme")
                client = sdk(gw.url, key)
                b = client.messages.batches.create(requests=requests(20))
                ended(client, b.id)
                raw = []
                with httpx.Client(base_url=gw.url, headers={"x-api-key": key, "anthropic-version": "2023-06-01"}) as http:
                    for method, path, body in [("GET", f"/v1/messages/batches/{b.id}", None),
                                               ("GET", "/v1/messages/batches", None),
                                               ("GET", f"/v1/messages/batches/{b.id}/results", None),
                                               ("GET", "/v1/models", None), ("GET", "/v1/models/claude-haiku-4-5", None),
                                               ("POST", "/v1/messages/count_tokens", request("x")["params"]),
                                               ("GET", "/v1/messages/batches/msgbatch_nope", None)]:
                        r = http.request(method, path, json=body)
                        raw.append(r.text + repr(dict(r.headers)))
        finally:
            relay.close()
    upstream_ids = set(fake.org.batches)
    sent_keys = {({k.lower(): v for k, v in h.items()}.get("x-api-key") or "") for _, _, h in relay.seen}
    assert relay.seen and sent_keys == {WS1, ADMIN}  # (the admin key reads the ceiling)
    assert not any(key in repr(h) for _, _, h in relay.seen)
    assert {p.split("?")[0] for _, p, _ in relay.seen} >= {"/v1/models", "/v1/messages/count_tokens", "/v1/messages/batches"}
    assert not any(secret in text for text in raw for secret in (WS1, ADMIN, *upstream_ids))
    assert key not in gw.log.getvalue() and WS1 not in gw.log.getvalue() and ADMIN not in gw.log.getvalue()


def test_sdk_retries_of_a_create_whose_answer_was_lost_make_one_batch(tmp_path: Path, sdk) -> None:
    """The create's answer is lost between the SDK and the gateway (twice): the SDK's retries send the same body
    again, and get the same batch; one job runs, each request is answered once upstream."""
    with running_fake(rate=1e6, speed=100.0) as fake:
        with gateway(fake, tmp_path) as gw:
            relay = Relay(gw.url, lose=lambda method, path: method == "POST" and path == "/v1/messages/batches"
                          and relay.lost < 2)
            try:
                client = sdk(relay.url, gw.key("acme"), max_retries=2)
                sent = requests(500)
                created = client.messages.batches.create(requests=sent)
                assert relay.lost == 2
                assert [b.id for b in client.messages.batches.list()] == [created.id]
                ended(client, created.id)
                assert len(list(client.messages.batches.results(created.id))) == 500
            finally:
                relay.close()
        answered_once(fake, {r["custom_id"] for r in sent})
        assert '"batch_repeated"' in gw.log.getvalue()


def test_an_idempotency_key_names_one_batch(tmp_path: Path, sdk, anthropic) -> None:
    """The same Idempotency-Key returns the same batch (also past the window); with other requests it is a 400; a
    new key is a new batch, even for the same requests (a client's deliberate rerun); without a key, the same
    requests from the same tenant within the window return the same batch, and from another tenant make another."""
    with running_fake(rate=0.0) as fake, gateway(fake, tmp_path, dedup_window=3600.0) as gw:
        a = sdk(gw.url, gw.key("acme"))
        first = a.messages.batches.create(requests=requests(3), extra_headers={"Idempotency-Key": "k-1"})
        again = a.messages.batches.create(requests=requests(3), extra_headers={"Idempotency-Key": "k-1"})
        assert again.id == first.id
        with pytest.raises(anthropic.BadRequestError, match="Idempotency-Key"):
            a.messages.batches.create(requests=requests(4), extra_headers={"Idempotency-Key": "k-1"})
        rerun = a.messages.batches.create(requests=requests(3), extra_headers={"Idempotency-Key": "k-2"})
        assert rerun.id != first.id
        same = a.messages.batches.create(requests=requests(3))
        assert same.id in (first.id, rerun.id)
        other = a.messages.batches.create(requests=requests(3, prefix="s"))
        assert other.id != first.id
        theirs = sdk(gw.url, gw.key("globex")).messages.batches.create(requests=requests(3))
        assert theirs.id not in (first.id, other.id)
        # (canceled, the same requests again are a new batch, never the ended one: a cold tester's finding)
        a.messages.batches.cancel(other.id)
        after = a.messages.batches.create(requests=requests(3, prefix="s"))
        assert after.id != other.id and after.processing_status == "in_progress"
    with running_fake(rate=0.0) as fake, gateway(fake, tmp_path / "no-window", dedup_window=0.0) as gw:
        a = sdk(gw.url, gw.key("acme"))
        assert a.messages.batches.create(requests=requests(3)).id != a.messages.batches.create(requests=requests(3)).id


def test_a_tenant_sees_only_its_own_batches(tmp_path: Path, sdk, anthropic) -> None:
    """Another tenant's batch id is the API's 404 on every route, and its listing is its own."""
    with running_fake(rate=1e6, speed=100.0) as fake, gateway(fake, tmp_path) as gw:
        a, b = sdk(gw.url, gw.key("acme")), sdk(gw.url, gw.key("globex"))
        mine = a.messages.batches.create(requests=requests(5))
        ended(a, mine.id)
        for call in (lambda: b.messages.batches.retrieve(mine.id), lambda: b.messages.batches.cancel(mine.id),
                     lambda: b.messages.batches.delete(mine.id)):
            with pytest.raises(anthropic.NotFoundError):
                call()
        with httpx.Client() as http:
            r = http.get(f"{gw.url}/v1/messages/batches/{mine.id}/results",
                         headers={"x-api-key": gw.key("globex"), "anthropic-version": "2023-06-01"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert list(b.messages.batches.list()) == []
        assert [x.id for x in a.messages.batches.list()] == [mine.id]


def test_bad_keys_and_a_missing_version_are_refused_as_the_api_refuses_them(tmp_path: Path, sdk, anthropic) -> None:
    """No key, a wrong key, a removed key: 401 authentication_error with a request id; no anthropic-version: 400."""
    from gatekeeper.gateway._keys import FILE, KeyFile

    with running_fake() as fake, gateway(fake, tmp_path) as gw:
        good = gw.key("acme")
        for key in ("", "sk-gk-wrong", good[:-1], "test-key-ws1"):
            with pytest.raises(anthropic.AuthenticationError) as info:
                sdk(gw.url, key or "x", max_retries=0).messages.batches.list()
            assert info.value.request_id and info.value.request_id.startswith("req_")
            assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        with httpx.Client() as http:
            r = http.get(gw.url + "/v1/messages/batches", headers={"x-api-key": good})
            assert r.status_code == 400 and r.json() == {
                "type": "error", "error": {"type": "invalid_request_error", "message": "anthropic-version: header is required"},
                "request_id": r.headers["request-id"]}
            r = http.get(gw.url + "/v1/messages/batches", headers={"anthropic-version": "2023-06-01"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert KeyFile(tmp_path / FILE).remove("acme") == 1
        with pytest.raises(anthropic.AuthenticationError):
            sdk(gw.url, good, max_retries=0).messages.batches.list()
        assert fake.org.records.requests_seen.get("list", 0) == 0


def test_an_invalid_request_is_a_400_naming_it_and_nothing_is_created(tmp_path: Path, sdk, anthropic) -> None:
    """A request plan would reject (a bad custom_id, a repeated one, a parameter the version refuses) refuses the
    whole create with the API's 400 naming it; nothing reaches the API; no batch and no spool are left."""
    bad_id = request("bad id")
    repeated = request("r1")
    with running_fake() as fake, gateway(fake, tmp_path) as gw:
        client = sdk(gw.url, gw.key("acme"))
        for body, said in (([*requests(3), bad_id], "requests.3: custom_id 'bad id'"),
                           ([*requests(3), repeated], "requests.3: duplicate custom_id 'r1' (first on requests.1)")):
            with pytest.raises(anthropic.BadRequestError) as info:
                client.messages.batches.create(requests=body)
            assert said in info.value.message and info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        strict = request("t")
        strict["params"]["temperature"] = 0.5
        with pytest.raises(anthropic.BadRequestError, match="requests.0: params.temperature"):
            client.messages.batches.create(requests=[strict])  # (the SDK sends 2026-10-21, which refuses it)
        assert list(client.messages.batches.list()) == []
        with httpx.Client() as http:
            for raw, said in ((b'{"requests": []}', "at least 1 item"), (b'{"requests": [1]}', "requests.0: Input should be a valid dictionary"),
                              (b'{"requests": [{"custom_id": "a"', "not valid JSON"), (b'{"reqs": []}', "reqs: Extra inputs")):
                r = http.post(gw.url + "/v1/messages/batches", content=raw,
                              headers={"x-api-key": gw.key("acme"), "anthropic-version": "2023-06-01"})
                assert r.status_code == 400 and said in r.json()["error"]["message"], r.text
    assert fake.org.records.creates == 0
    assert list((tmp_path / "incoming").iterdir()) == []
    assert not (tmp_path / "batches").exists() or list((tmp_path / "batches").iterdir()) == []


def test_cancel_ends_the_batch_with_a_line_for_every_request(tmp_path: Path, sdk, anthropic) -> None:
    """Cancel answers canceling (cancel_initiated_at set); the batch ends with every request canceled that the API
    did not process, one result line each; an ended batch is not canceled again, and can be deleted, after which
    it is the API's 404."""
    with running_fake(rate=0.0, cancel_delay=0.5, speed=10.0) as fake, gateway(fake, tmp_path, ceiling=400) as gw:
        client = sdk(gw.url, gw.key("acme"))
        b = client.messages.batches.create(requests=requests(1_000))
        fake.org.wait_for(lambda r: r.creates >= 1, "the job's first create")
        with pytest.raises(anthropic.BadRequestError, match="finished processing"):
            client.messages.batches.delete(b.id)
        c = client.messages.batches.cancel(b.id)
        assert c.processing_status == "canceling" and c.cancel_initiated_at is not None
        done = ended(client, b.id)
        assert done.request_counts.canceled == 1_000 and done.request_counts.processing == 0
        lines = list(client.messages.batches.results(b.id))
        assert sorted(x.custom_id for x in lines) == sorted(f"r{i}" for i in range(1_000))
        assert {x.result.type for x in lines} == {"canceled"}
        with pytest.raises(anthropic.BadRequestError, match="already ended"):
            client.messages.batches.cancel(b.id)
        assert client.messages.batches.delete(b.id).type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve(b.id)
        assert not (tmp_path / "batches" / b.id).exists()
    # nothing new went out after the cancel: no create once a canceled batch had ended and freed its room (the
    # job's first round may make several batches before the cancel reaches it: a loaded machine decides how many)
    upstream = list(fake.org.batches.values())
    assert all(b.cancel_initiated_at is not None for b in upstream)
    first_end = min(b.ended_at for b in upstream if b.ended_at is not None)
    assert max(b.created_at for b in upstream) <= first_end, [(b.created_at, b.ended_at) for b in upstream]


def test_an_account_refused_upstream_is_the_clients_refusal_until_it_is_lifted(tmp_path: Path, sdk, anthropic,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The organization on hold upstream: the batch already taken waits with its requests kept, /healthz says
    `degraded` naming the refusal, and a new create is the API's own 400 with its typed code (the client learns at
    once, as from the API, instead of polling a batch that cannot move). Lifted: the job moves on, a create is
    taken again, every request answered once."""
    monkeypatch.setattr("gatekeeper.gateway._runner.RETRY_FIRST", 0.3)  # (the job tries again within the test)
    with running_fake(rate=1e6, speed=100.0) as fake, gateway(fake, tmp_path) as gw:
        fake.inject(Fault("create", code="organization_on_hold", times=10_000))
        client = sdk(gw.url, gw.key("acme"), max_retries=0)
        first = client.messages.batches.create(requests=requests(3))
        deadline = time.monotonic() + 30
        while (health := httpx.get(gw.url + "/healthz").json())["status"] == "ok":
            assert time.monotonic() < deadline, "the refusal never reached /healthz"
            time.sleep(0.05)
        assert health["status"] == "degraded" and "organization_on_hold" in health["upstream_error"]
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.batches.create(requests=requests(3, prefix="s"))
        assert refused.value.body["error"]["details"]["error_code"] == "organization_on_hold", refused.value.body  # type: ignore[index]
        # (the API's own words and details, its appeal URL among them, not the CLI's line: a cold tester's finding)
        from gatekeeper.testing._wire import CODED

        _, error_type, said, details, _ = CODED["organization_on_hold"]
        error = refused.value.body["error"]  # type: ignore[index]
        assert (error["type"], error["message"], error["details"]) == (error_type, said, details), error
        assert client.messages.batches.retrieve(first.id).processing_status == "in_progress"
        with fake.faults.lock:
            fake.faults.items.clear()  # (lifted)
        assert ended(client, first.id).request_counts.succeeded == 3
        second = client.messages.batches.create(requests=requests(3, prefix="t"))
        assert ended(client, second.id).request_counts.succeeded == 3
        assert httpx.get(gw.url + "/healthz").json()["status"] == "ok"
    answered_once(fake, {f"{p}{i}" for p in "rt" for i in range(3)})


def test_the_listing_pages_as_the_api_pages(tmp_path: Path, sdk, anthropic) -> None:
    """Newest first; the SDK follows after_id across pages; before_id pages back; first_id/last_id null on an empty
    page; limit outside 1-1000, an unknown cursor and both cursors at once are 400s."""
    with running_fake(rate=0.0) as fake, gateway(fake, tmp_path, dedup_window=0.0) as gw:
        client = sdk(gw.url, gw.key("acme"))
        ids = [client.messages.batches.create(requests=requests(1, prefix=f"b{i}-")).id for i in range(5)]
        assert [b.id for b in client.messages.batches.list(limit=2)] == ids[::-1]
        with httpx.Client(base_url=gw.url, headers={"x-api-key": gw.key("acme"), "anthropic-version": "2023-06-01"}) as http:
            page = http.get("/v1/messages/batches", params={"limit": 2, "after_id": ids[3]}).json()
            assert [b["id"] for b in page["data"]] == [ids[2], ids[1]] and page["has_more"] is True
            assert (page["first_id"], page["last_id"]) == (ids[2], ids[1])
            back = http.get("/v1/messages/batches", params={"limit": 2, "before_id": ids[1]}).json()
            assert [b["id"] for b in back["data"]] == [ids[3], ids[2]] and back["has_more"] is True
            last = http.get("/v1/messages/batches", params={"limit": 2, "after_id": ids[0]}).json()
            assert last == {"data": [], "has_more": False, "first_id": None, "last_id": None}
            for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"after_id": "msgbatch_unknown"},
                           {"after_id": ids[3], "before_id": ids[1]}):
                r = http.get("/v1/messages/batches", params=params)
                assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", params
        with pytest.raises(anthropic.BadRequestError, match="after_id, before_id"):  # (both cursors: as the fake, the API)
            client.messages.batches.list(after_id=ids[3], before_id=ids[1])
        upstream = httpx.get(fake.url + "/v1/messages/batches", params={"after_id": "a", "before_id": "b"},
                             headers={"x-api-key": WS1, "anthropic-version": "2023-06-01"})
        assert upstream.status_code == 400 and upstream.json()["error"]["message"] == BOTH_CURSORS


def test_models_and_count_tokens_pass_through(tmp_path: Path, sdk, anthropic) -> None:
    """The Models API and count_tokens answer as the upstream does (its 404 for an unknown model included)."""
    with running_fake() as fake, gateway(fake, tmp_path) as gw:
        client = sdk(gw.url, gw.key("acme"))
        assert {m.id for m in client.models.list()} == {m.id for m in fake.config.models}
        assert client.models.retrieve("claude-haiku-4-5").id == fake.config.model("claude-haiku-4-5").id
        with pytest.raises(anthropic.NotFoundError):
            client.models.retrieve("claude-nope")
        counted = client.messages.count_tokens(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hello"}])
        assert counted.input_tokens > 0


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    page = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(page) for s in f.samples}


def test_metrics_are_prometheus_text(tmp_path: Path, sdk) -> None:
    """/metrics parses with Prometheus' own parser and counts what happened: a create, its requests, a refusal."""
    with running_fake(rate=0.0) as fake, gateway(fake, tmp_path) as gw:
        client = sdk(gw.url, gw.key("acme"), max_retries=0)
        client.messages.batches.create(requests=requests(7))
        with pytest.raises(Exception):  # noqa: B017 -- (the SDK's BadRequestError)
            client.messages.batches.create(requests=[request("bad id")])
        samples = _samples(gw.url)
    assert samples[("gatekeeper_gateway_creates_total", (("outcome", "created"),))] == 1
    assert samples[("gatekeeper_gateway_creates_total", (("outcome", "refused"),))] == 1
    assert samples[("gatekeeper_gateway_received_requests_total", (("outcome", "created"),))] == 7
    assert samples[("gatekeeper_gateway_batches", (("status", "in_progress"),))] == 1
    assert all("msgbatch_" not in str(labels) for _, labels in samples)
    assert not [name for name, _ in samples if name.endswith("_created")]  # (no series named as if it counted creates)


def test_repeated_creates_count_what_they_sent(tmp_path: Path, sdk) -> None:
    """A repeated create (the same Idempotency-Key, or the same requests, again) sent its body and had it judged:
    its requests and bytes count as received, apart (`outcome="repeated"`), so that creates and received bytes agree
    after a restart too (issue 61, F5: two repeats left both at 0)."""
    sent = requests(7)
    with running_fake(rate=0.0) as fake:
        with gateway(fake, tmp_path, dedup_window=3600.0) as gw:
            client = sdk(gw.url, gw.key("acme"), max_retries=0)
            first = client.messages.batches.create(requests=sent, extra_headers={"Idempotency-Key": "k-1"})
            made = _samples(gw.url)
        with gateway(fake, tmp_path, dedup_window=3600.0) as gw:  # (restarted: its counters start again)
            client = sdk(gw.url, gw.key("acme"), max_retries=0)
            assert client.messages.batches.create(requests=sent, extra_headers={"Idempotency-Key": "k-1"}).id == first.id
            assert client.messages.batches.create(requests=sent).id == first.id
            again = _samples(gw.url)
    bytes_made = made[("gatekeeper_gateway_received_bytes_total", (("outcome", "created"),))]
    assert made[("gatekeeper_gateway_received_requests_total", (("outcome", "created"),))] == 7 and bytes_made > 7
    assert again[("gatekeeper_gateway_creates_total", (("outcome", "repeated"),))] == 2
    assert again[("gatekeeper_gateway_received_requests_total", (("outcome", "repeated"),))] == 14
    assert again[("gatekeeper_gateway_received_bytes_total", (("outcome", "repeated"),))] == 2 * bytes_made
    assert again.get(("gatekeeper_gateway_received_requests_total", (("outcome", "created"),)), 0) == 0


def test_logs_are_json_lines(tmp_path: Path, sdk) -> None:
    """Every log line is one JSON object with its event; a request's line names its route, status and tenant."""
    with running_fake(rate=1e6, speed=100.0) as fake, gateway(fake, tmp_path) as gw:
        client = sdk(gw.url, gw.key("acme"))
        ended(client, client.messages.batches.create(requests=requests(5)).id)
    lines = [orjson.loads(line) for line in gw.log.getvalue().splitlines()]
    events = {line["event"] for line in lines}
    assert {"started", "request", "batch_created", "job_started", "batch_ended", "stopping"} <= events
    create = next(x for x in lines if x["event"] == "request" and x["route"] == "/v1/messages/batches" and x["method"] == "POST")
    assert create["status"] == 200 and create["tenant"] == "acme" and create["request_id"].startswith("req_")


@pytest.mark.timeout(300)  # (about 30 s alone; a whole suite on two busy cores can make it several times that)
def test_a_create_past_the_apis_limits_is_one_batch(tmp_path: Path, sdk) -> None:
    """100,001 requests in one create (the API takes 100,000 at most), to `gatekeeper serve` as a process of its
    own: one batch for the client, two upstream, 100,001 result lines streamed."""
    from tests.gateways import add_key, free_port, output, serve_process, wait_healthy

    with running_fake(rate=1e6, speed=100.0) as fake:
        key = add_key(tmp_path, "acme")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = serve_process(fake, tmp_path, port)
        try:
            wait_healthy(url, proc)
            body = orjson.dumps({"requests": [request(f"q{i}", "x") for i in range(100_001)]})
            r = httpx.post(url + "/v1/messages/batches", content=body, timeout=120,
                           headers={"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"})
            assert r.status_code == 200 and r.json()["request_counts"]["processing"] == 100_001
            client = sdk(url, key)
            done = ended(client, r.json()["id"], timeout=240)
            assert done.request_counts.succeeded == 100_001
            seen = set()
            with httpx.stream("GET", done.results_url, headers={"x-api-key": key, "anthropic-version": "2023-06-01"}) as res:
                for line in res.iter_lines():
                    seen.add(orjson.loads(line)["custom_id"])
        finally:
            proc.terminate()
            proc.wait(60)
        assert len(seen) == 100_001, output(proc)[-2000:]
    assert fake.org.records.creates >= 2 and len(fake.org.records.succeeded) == 100_001


def test_a_tenants_priority_and_share_go_with_its_jobs(tmp_path: Path, sdk) -> None:
    """Each job admits on the gateway's one ledger with its tenant's priority and share (docs/shared.md)."""
    import gatekeeper
    from tests.gateways import add_key

    with running_fake(rate=1e6, speed=100.0) as fake, gateway(fake, tmp_path) as gw:
        high = sdk(gw.url, add_key(tmp_path, "nightly", priority="high", share=3.0))
        low = sdk(gw.url, add_key(tmp_path, "backfill", priority="low"))
        a = high.messages.batches.create(requests=requests(50))
        b = low.messages.batches.create(requests=requests(50))
        ended(high, a.id)
        ended(low, b.id)
    shares = {batch: gatekeeper.job_summary(tmp_path / "batches" / batch / "job").shares for batch in (a.id, b.id)}
    assert shares[a.id]["priority"] == "high" and shares[a.id]["share"] == 3.0  # type: ignore[index]
    assert shares[b.id]["priority"] == "low" and shares[b.id]["share"] == 1.0  # type: ignore[index]


def test_an_upload_cut_off_leaves_nothing_behind(tmp_path: Path) -> None:
    """A client that dies in the middle of its create's body: no batch, no spool, nothing sent upstream."""
    import socket

    with running_fake() as fake, gateway(fake, tmp_path) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        body = orjson.dumps({"requests": requests(20_000)})
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/messages/batches HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"anthropic-version: 2023-06-01\r\nx-api-key: " + gw.key("acme").encode() +
                      b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:len(body) // 2])
        deadline = time.monotonic() + 20
        while "client disconnected" not in gw.log.getvalue():
            assert time.monotonic() < deadline, gw.log.getvalue()[-2000:]
            time.sleep(0.05)
        assert list((tmp_path / "incoming").iterdir()) == []
        assert httpx.get(gw.url + "/v1/messages/batches", headers={"x-api-key": gw.key("acme"), "anthropic-version":
                                                                    "2023-06-01"}).json()["data"] == []
    assert fake.org.records.creates == 0


def test_behind_the_gateway_the_job_recovers_lost_answers_and_resends_what_can_succeed(tmp_path: Path, sdk) -> None:
    """Upstream, a create's answer is lost (the batch made) and a request errors with api_error on its first try:
    the job reconciles the lost create instead of sending it again, resends the one request, and the client sees
    one batch whose every request succeeded, each answered once."""
    from gatekeeper.testing import Fault, Outcome

    rule = lambda cid, model, attempt: Outcome("errored", "api_error") if cid == "r3" and attempt == 1 else None  # noqa: E731
    with running_fake(rate=1e6, speed=100.0, outcome=rule) as fake, gateway(fake, tmp_path) as gw:
        fake.inject(Fault("create", kind="drop_after_commit"))
        client = sdk(gw.url, gw.key("acme"))
        b = client.messages.batches.create(requests=requests(40))
        done = ended(client, b.id)
        assert done.request_counts.succeeded == 40
        assert {x.result.type for x in client.messages.batches.results(b.id)} == {"succeeded"}
    assert fake.org.records.attempts["r3"] == 2 and fake.org.records.creates == 2  # (the lost one, adopted; the resend)
    answered_once(fake, {f"r{i}" for i in range(40)})


@pytest.mark.parametrize("fault, grace", [
    (Fault("create", status=500), 3.0),  # a bare 5xx: the create may have been made; waited out, the listing's lag
    (Fault("create", code="cmek_key_unreachable"), 180.0),  # a typed refusal: nothing made, sent again at once
])
def test_a_5xx_on_an_upstream_create_keeps_the_batch_in_progress_and_creates_once(tmp_path: Path, sdk, fault: Fault,
                                                                                  grace: float) -> None:
    """While the job settles an upstream create answered 5xx, the client's retrieve shows the batch in_progress with
    every request processing (never ended, never errored); a bare 5xx is settled when a listing read the reconcile
    grace after the send proves nothing was made (absence cannot be proven sooner: the listing lags), a typed one
    (`cmek_key_unreachable`, nothing made) after its backoff alone. Either way one batch is created upstream."""
    with running_fake(rate=1e6, speed=100.0) as fake, gateway(fake, tmp_path, reconcile_grace=grace) as gw:
        fake.inject(fault)
        client = sdk(gw.url, gw.key("acme"))
        started = time.monotonic()
        b = client.messages.batches.create(requests=requests(5))
        while not fake.org.records.requests_seen.get("create"):
            assert time.monotonic() - started < 30, "the job never sent its create"
            time.sleep(0.05)
        seen = client.messages.batches.retrieve(b.id)  # (the create refused upstream, the job settling it)
        assert seen.processing_status == "in_progress" and seen.request_counts.processing == 5, seen
        assert (seen.request_counts.succeeded, seen.request_counts.errored, seen.ended_at) == (0, 0, None)
        done = ended(client, b.id, timeout=90)
        took = time.monotonic() - started
        assert done.request_counts.succeeded == 5
        assert fake.org.records.creates == 1 and fake.org.records.requests_seen["create"] == 2
        assert took >= grace if fault.code is None else took < 60, took
    answered_once(fake, {f"r{i}" for i in range(5)})


def test_one_tenants_unsettled_create_holds_back_no_other_size(tmp_path: Path, sdk) -> None:
    """Tenant A's upstream create is answered a bare 500 (made or not: settled only once the listing's grace has
    passed); tenant B's create of another size goes at once, not after A's grace (a cold tester's B waited 2 min 7 s
    behind A with the queue empty). Only a create of the same size could be mistaken for A's."""
    grace = 20.0
    with running_fake(rate=1e6, speed=100.0) as fake, gateway(fake, tmp_path, reconcile_grace=grace) as gw:
        fake.inject(Fault("create", status=500))
        a = sdk(gw.url, gw.key("team-a")).messages.batches.create(requests=requests(5, "a"))
        started = time.monotonic()
        while not fake.org.records.requests_seen.get("create"):
            assert time.monotonic() - started < 30, "A's job never sent its create"
            time.sleep(0.05)
        client_b = sdk(gw.url, gw.key("team-b"))
        b = client_b.messages.batches.create(requests=requests(7, "b"))
        done = ended(client_b, b.id, timeout=90)
        took = time.monotonic() - started
        assert done.request_counts.succeeded == 7 and took < grace, took  # (B's 7 never waited out A's 5's grace)
        assert ended(sdk(gw.url, gw.key("team-a")), a.id, timeout=120).request_counts.succeeded == 5
    answered_once(fake, {*(f"a{i}" for i in range(5)), *(f"b{i}" for i in range(7))})
