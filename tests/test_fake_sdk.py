"""The fake API, driven by the official anthropic SDK: every response must parse into the SDK's own types."""

from __future__ import annotations

import gc
from types import ModuleType
from typing import TYPE_CHECKING

import httpx
import pytest

from gatekeeper.testing import Fault, Outcome
from tests.fakes import ADMIN, WS1, WS2, running_fake

if TYPE_CHECKING:
    import anthropic as anthropic_module

# The SDK takes some 2.5 s of CPU to import: only the one worker that runs this file pays it (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("anthropic-sdk")


@pytest.fixture(scope="module")
def anthropic() -> ModuleType:
    import anthropic as module

    gc.freeze()  # its 140,000 objects live to the end: out of the cycle collector's walks (as conftest does)
    return module


@pytest.fixture
def sdk(anthropic: ModuleType):
    """Make SDK clients that are closed after the test (an unclosed pool leaks sockets into later tests)."""
    made = []

    def make(url: str, key: str) -> anthropic_module.Anthropic:
        client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def _req(cid: str, model: str = "claude-haiku-4-5") -> dict:
    return {"custom_id": cid, "params": {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}}


def test_sdk_full_lifecycle(sdk, anthropic) -> None:
    """create, retrieve, list with pagination, results, cancel and delete all parse in the SDK's models."""
    rule = lambda cid, model, attempt: Outcome("errored", "invalid_request_error") if model == "nope" else None  # noqa: E731
    with running_fake(rate=1e9, speed=1.0, outcome=rule) as fake:
        client = sdk(fake.url, WS1)
        created = client.messages.batches.create(requests=[_req("a"), _req("b", "nope"), _req("c")])
        assert created.processing_status == "in_progress"
        assert created.request_counts.processing == 3
        fake.org.advance(1)
        done = client.messages.batches.retrieve(created.id)
        assert done.processing_status == "ended" and done.results_url
        assert (done.request_counts.succeeded, done.request_counts.errored) == (2, 1)
        results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
        assert set(results) == {"a", "b", "c"}
        assert results["a"].type == "succeeded" and results["a"].message.usage.service_tier == "batch"
        assert results["b"].type == "errored" and results["b"].error.error.type == "invalid_request_error"
        ids = [client.messages.batches.create(requests=[_req(f"x{i}")]).id for i in range(5)]
        listed = [b.id for b in client.messages.batches.list(limit=2)]  # the SDK follows after_id across pages
        assert listed == list(reversed(ids)) + [created.id]
        deleted = client.messages.batches.delete(created.id)
        assert deleted.type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve(created.id)


def test_sdk_cancel_goes_canceling_then_ended(sdk) -> None:
    """cancel answers canceling; the batch ends with canceled results for what was not processed."""
    with running_fake(rate=0.0, speed=1.0, cancel_delay=5.0) as fake:
        client = sdk(fake.url, WS1)
        b = client.messages.batches.create(requests=[_req("a"), _req("b")])
        c = client.messages.batches.cancel(b.id)
        assert c.processing_status == "canceling" and c.cancel_initiated_at is not None
        fake.org.advance(10)
        ended = client.messages.batches.retrieve(b.id)
        assert ended.processing_status == "ended" and ended.request_counts.canceled == 2
        assert {r.result.type for r in client.messages.batches.results(b.id)} == {"canceled"}


def test_sdk_rate_limits_admin_endpoint(sdk, anthropic) -> None:
    """client.beta.organization.rate_limits.list parses the batch group, and pages are followed."""
    with running_fake(ceiling=200_000, rate_limit_page_size=1, rate_limit_empty_first_page=True) as fake:
        admin = sdk(fake.url, ADMIN)
        entries = list(admin.beta.organization.rate_limits.list())
        batch = [e for e in entries if e.group.type == "batch"]
        assert len(entries) == 2 and len(batch) == 1
        assert [lim.value for lim in batch[0].limits if lim.type == "enqueued_batch_requests"] == [200_000]
        # A workspace key is refused by the Admin API; an Admin key by the Batches API.
        with pytest.raises(anthropic.AuthenticationError):
            list(sdk(fake.url, WS1).beta.organization.rate_limits.list())
        with pytest.raises(anthropic.AuthenticationError):
            admin.messages.batches.list()


def test_queue_ceiling_refuses_whole_batch_with_429(sdk, anthropic) -> None:
    """A create that would push the organization's queue over the ceiling is refused whole."""
    with running_fake(ceiling=10, rate=0.0) as fake:
        sdk1 = sdk(fake.url, WS1)
        sdk2 = sdk(fake.url, WS2)
        sdk1.messages.batches.create(requests=[_req(f"a{i}") for i in range(6)])
        with pytest.raises(anthropic.RateLimitError) as info:
            sdk2.messages.batches.create(requests=[_req(f"b{i}") for i in range(5)])
        assert info.value.response.headers["retry-after"] == "60"
        assert "queue" in info.value.message
        assert fake.org.records.refusals[0]["requests"] == 5
        assert [b.id for b in sdk2.messages.batches.list()] == []  # workspace-scoped listing
        assert fake.org.records.max_depth == 6


def test_envelope_validation_and_413(sdk, anthropic) -> None:
    """Duplicate custom_id and bad patterns are 400 for the whole batch; oversize bodies get the bare 413."""
    with running_fake(max_body_bytes=2000) as fake:
        client = sdk(fake.url, WS1)
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.create(requests=[_req("a"), _req("a")])
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.create(requests=[_req("a b")])
        r = httpx.post(fake.url + "/v1/messages/batches", content=b"x" * 3000,
                       headers={"x-api-key": WS1, "anthropic-version": "2023-06-01"})
        assert r.status_code == 413
        assert r.json() == {"error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}
        r = httpx.get(fake.url + "/v1/messages/batches", headers={"x-api-key": WS1})
        assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]
        assert r.headers["request-id"] == r.json()["request_id"]
        r = httpx.get(fake.url + "/v1/messages/batches?limit=1001", headers={"x-api-key": WS1, "anthropic-version": "2023-06-01"})
        assert r.status_code == 400


def test_lost_response_after_commit(sdk, anthropic) -> None:
    """drop_after_commit creates the batch but the client sees no answer (the case that makes SDKs double-create)."""
    with running_fake() as fake:
        fake.inject(Fault("create", kind="drop_after_commit"))
        client = sdk(fake.url, WS1)
        with pytest.raises(anthropic.APIConnectionError):
            client.messages.batches.create(requests=[_req("a")])
        assert fake.org.records.creates == 1
        assert len(list(client.messages.batches.list())) == 1


def test_results_order_is_shuffled_and_lines_end_in_newline(sdk) -> None:
    """Results come back in another order than sent, each line newline-terminated, no blank line."""
    with running_fake(rate=1e9) as fake:
        client = sdk(fake.url, WS1)
        b = client.messages.batches.create(requests=[_req(f"r{i}") for i in range(50)])
        fake.org.advance(1)
        raw = httpx.get(fake.url + f"/v1/messages/batches/{b.id}/results",
                        headers={"x-api-key": WS1, "anthropic-version": "2023-06-01"}).content
        lines = raw.split(b"\n")
        assert lines[-1] == b"" and all(lines[:-1])
        order = [line.split(b'"')[3].decode() for line in lines[:-1]]
        assert sorted(order) == sorted(f"r{i}" for i in range(50)) and order != [f"r{i}" for i in range(50)]


def test_sdk_parses_the_models_api_and_count_tokens(sdk, anthropic) -> None:
    """models.retrieve (an alias resolves), models.list (paged) and messages.count_tokens parse in the SDK's types;
    an unknown model is the SDK's NotFoundError."""
    with running_fake() as fake:
        client = sdk(fake.url, WS1)
        info = client.models.retrieve("claude-haiku-4-5")
        assert info.id == "claude-haiku-4-5-20251001" and info.type == "model"
        listed = [m.id for m in client.models.list(limit=2)]
        assert len(listed) == len(fake.config.models) and listed[0] == "claude-opus-5-5"  # newest first, every page
        counted = client.messages.count_tokens(model="claude-sonnet-5", messages=[{"role": "user", "content": "x" * 400}])
        assert counted.input_tokens > 0 and counted.input_tokens != round(400 / 4)
        with pytest.raises(anthropic.NotFoundError):
            client.models.retrieve("claude-nonexistent")


def test_refused_cache_markers_and_usage_that_follows_the_prompt(sdk) -> None:
    """As the real API does in a batch: a request with five markers, or a 1h one after a 5m one, is accepted and
    ends errored at processing; the others are billed for their own prompt (longer prompt, more input tokens)."""
    def marked(cid: str, *lives: str) -> dict:
        blocks = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral", "ttl": t}} for i, t in enumerate(lives)]
        return {"custom_id": cid, "params": {"model": "claude-haiku-4-5", "max_tokens": 16,
                                             "messages": [{"role": "user", "content": blocks}]}}

    long = {"custom_id": "long", "params": {**_req("x")["params"], "messages": [{"role": "user", "content": "hi " * 300}]}}
    with running_fake(rate=1e9, speed=1.0) as fake:
        client = sdk(fake.url, WS1)
        created = client.messages.batches.create(requests=[marked("five", *["5m"] * 5), marked("late", "5m", "1h"),
                                                           marked("fine", "1h", "5m"), _req("short"), long])
        fake.org.advance(1)
        results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
    assert [results[c].type for c in ("five", "late", "fine")] == ["errored", "errored", "succeeded"]
    assert "maximum of 4" in results["five"].error.error.message
    assert results["long"].message.usage.input_tokens > results["short"].message.usage.input_tokens + 200


def _doc_request(cid: str, doc: str, question: str, life: str = "5m", model: str = "claude-sonnet-5") -> dict:
    system = [{"type": "text", "text": doc, "cache_control": {"type": "ephemeral", "ttl": life}}]
    return {"custom_id": cid, "params": {"model": model, "max_tokens": 16, "system": system,
                                         "messages": [{"role": "user", "content": question}]}}


def test_prompt_cache_cold_batch_writes_and_a_later_batch_reads(sdk) -> None:
    """Section 15 as the fake models it: requests of one batch never see each other's writes (a cold batch writes
    the shared prefix every time), a later batch reads it, a prefix below the minimum is not cached, the usage
    fields add up to the prompt, and the records bill each kind."""
    doc = "The filing says many things. " * 400  # ~3,600 tokens: above Sonnet 5's 1,024
    with running_fake(rate=1e9, speed=1.0) as fake:
        client = sdk(fake.url, WS1)
        cold = client.messages.batches.create(requests=[_doc_request(f"q{i}", doc, f"question {i}", "1h") for i in range(3)]
                                              + [_doc_request("tiny", "short", "q", "5m")])
        fake.org.advance(1)
        first = {r.custom_id: r.result.message.usage for r in client.messages.batches.results(cold.id)}
        warm = client.messages.batches.create(requests=[_doc_request("q9", doc, "question 9", "1h"),
                                                        _doc_request("other-ws", doc, "q", "1h")][:1])
        fake.org.advance(1)
        second = {r.custom_id: r.result.message.usage for r in client.messages.batches.results(warm.id)}
        elsewhere = sdk(fake.url, WS2).messages.batches.create(requests=[_doc_request("ws2", doc, "question 9", "1h")])
        fake.org.advance(4000)  # past the 1h life
        third = {r.custom_id: r.result.message.usage for r in sdk(fake.url, WS2).messages.batches.results(elsewhere.id)}
        late = client.messages.batches.create(requests=[_doc_request("late", doc, "question 9", "1h")])
        fake.org.advance(1)
        fourth = {r.custom_id: r.result.message.usage for r in client.messages.batches.results(late.id)}
        billed = fake.org.records.billed["claude-sonnet-5"]
    writes = [first[f"q{i}"].cache_creation.ephemeral_1h_input_tokens for i in range(3)]
    assert min(writes) > 1024 and len(set(writes)) == 1 and all(first[f"q{i}"].cache_read_input_tokens == 0 for i in range(3))
    assert first["tiny"].cache_creation_input_tokens == 0 and first["tiny"].cache_read_input_tokens == 0
    assert second["q9"].cache_read_input_tokens == writes[0] and second["q9"].cache_creation_input_tokens == 0
    assert third["ws2"].cache_read_input_tokens == 0, "another workspace's key shares no entries"
    assert fourth["late"].cache_read_input_tokens == 0 and fourth["late"].cache_creation.ephemeral_1h_input_tokens == writes[0]
    for u in (*first.values(), *second.values(), *fourth.values()):
        assert u.cache_creation_input_tokens == u.cache_creation.ephemeral_5m_input_tokens + u.cache_creation.ephemeral_1h_input_tokens
    assert billed[3] == 5 * writes[0] and billed[4] == writes[0]
    everything = [*first.values(), *second.values(), *third.values(), *fourth.values()]
    assert billed[0] == sum(u.input_tokens for u in everything)


def test_prompt_cache_waves_and_lives(sdk) -> None:
    """A batch processed in waves: later waves read what earlier waves wrote. A 5m entry dies 5 minutes after its
    last use, and a use renews it."""
    doc = "Shared context, written once. " * 300
    with running_fake(rate=1e9, speed=1.0, cache_wave=2) as fake:
        client = sdk(fake.url, WS1)
        b = client.messages.batches.create(requests=[_doc_request(f"w{i}", doc, f"q{i}") for i in range(5)])
        fake.org.advance(1)
        usage = {r.custom_id: r.result.message.usage for r in client.messages.batches.results(b.id)}
        reads = []
        for gap in (200, 200, 200, 400):  # renewed by each use within 5 minutes; dead after 400 s without one
            fake.org.advance(gap)
            nb = client.messages.batches.create(requests=[_doc_request(f"g{gap}-{len(reads)}", doc, "again")])
            fake.org.advance(1)
            reads += [r.result.message.usage.cache_read_input_tokens for r in client.messages.batches.results(nb.id)]
    assert [usage[f"w{i}"].cache_read_input_tokens > 0 for i in range(5)] == [False, False, True, True, True]
    assert reads[:3] == [usage["w2"].cache_read_input_tokens] * 3 and reads[3] == 0


def test_the_sdk_of_2026_speaks_to_the_fake_as_to_the_api(sdk, anthropic) -> None:
    """The registry's SDK (2.x) sends anthropic-version 2026-10-21 and its key as `Authorization: Bearer`: the fake
    takes both, records the batch's version, and errors a request that version refuses (temperature, even at its
    default) at processing, as the API does; the same request under 2023-06-01 succeeds. `speed: "standard"`, the
    SDK's own field, is no fast mode: taken."""
    with running_fake(rate=1e9) as fake:
        client = sdk(fake.url, WS1)
        warm = {**_req("t"), "params": {**_req("t")["params"], "temperature": 1.0}}
        plain = {**_req("s"), "params": {**_req("s")["params"], "speed": "standard"}}
        created = client.messages.batches.create(requests=[warm, plain])
        assert fake.org.records.versions[created.id] == "2026-10-21"
        fake.org.advance(1)
        results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
        assert results["t"].type == "errored" and "temperature" in results["t"].error.error.message
        assert results["s"].type == "succeeded"
        old = client.with_options(default_headers={"anthropic-version": "2023-06-01"})
        again = old.messages.batches.create(requests=[{**warm, "custom_id": "t2"}])
        assert fake.org.records.versions[again.id] == "2023-06-01"
        fake.org.advance(1)
        assert next(iter(client.messages.batches.results(again.id))).result.type == "succeeded"
        with pytest.raises(anthropic.BadRequestError, match="temperature"):
            client.messages.count_tokens(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}],
                                         extra_body={"temperature": 0.5})  # (the SDK no longer offers it)


def test_output_never_exceeds_max_tokens_in_either_lane(sdk) -> None:
    """The real API never bills more output than a request's max_tokens, and says it cut the answer (stop_reason
    "max_tokens"); the fake billed 12 output tokens at max_tokens 5 (a cold tester, issue 59). Its answer is 12 tokens:
    cut below that, whole at 12 and above, in a batch's results, a real-time answer and what the fake billed."""
    with running_fake(rate=1e9, speed=1.0) as fake:
        client = sdk(fake.url, WS1)
        created = client.messages.batches.create(requests=[
            {"custom_id": f"m{n}", "params": {"model": "claude-haiku-4-5", "max_tokens": n,
                                              "messages": [{"role": "user", "content": "hi"}]}} for n in (1, 5, 12, 16)])
        fake.org.advance(1)
        assert client.messages.batches.retrieve(created.id).processing_status == "ended"
        got = {r.custom_id: r.result.message for r in client.messages.batches.results(created.id)}
        assert {cid: (m.usage.output_tokens, m.stop_reason) for cid, m in got.items()} == {
            "m1": (1, "max_tokens"), "m5": (5, "max_tokens"), "m12": (12, "end_turn"), "m16": (12, "end_turn")}
        assert fake.org.records.billed["claude-haiku-4-5"][1] == 1 + 5 + 12 + 12
        for n, want in ((5, (5, "max_tokens")), (12, (12, "end_turn")), (64, (12, "end_turn"))):
            m = client.messages.create(model="claude-haiku-4-5", max_tokens=n, messages=[{"role": "user", "content": "hi"}])
            assert (m.usage.output_tokens, m.stop_reason) == want, n
        assert fake.org.records.billed_realtime["claude-haiku-4-5"][1] == 5 + 12 + 12
