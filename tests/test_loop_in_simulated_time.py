"""The submit loop with its clock and sleep injected: grace periods and backoff pass in simulated time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from gatekeeper import ApiConfig, Limits, Secret, SubmitSettings, submit
from gatekeeper.api._queue import connect
from gatekeeper.api._retry import RetryPolicy
from gatekeeper.run._loop import SubmitLoop
from gatekeeper.state._journal import Journal
from gatekeeper.state.ledger._base import Ledger
from gatekeeper.state.ledger._sqlite import SqliteLedger
from gatekeeper.testing import Fault
from tests.fakes import WS1, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once

pytestmark = pytest.mark.anyio


class SimulatedTime:
    """A wall clock that moves only when the loop sleeps (starting at the real time, as the fake's stamps do)."""

    def __init__(self) -> None:
        self.now = time.time()
        self.slept = 0.0
        self.org: Any = None  # a fake's organization whose clock moves with this one (its stamps agree with ours)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds
        if self.org is not None:
            self.org.advance(seconds)
        await anyio.sleep(0.01)  # let the fake's (real-time) processing move on a little


async def _run_job(tmp_path: Path, fake: Any, sim: SimulatedTime, settings: SubmitSettings,
                   events: list[tuple[str, dict[str, Any]]], ledger: Ledger | None = None,
                   retry: RetryPolicy | None = None) -> Any:
    journal = Journal.open(tmp_path / "state", clock=sim.clock)
    config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
    try:
        async with connect(config, max_rpm=60_000, retry=retry) as conn:  # (the budget's waits are not under test)
            job = SubmitLoop(str(tmp_path / "in.jsonl"), settings, conn, journal, out_path=str(tmp_path / "out.jsonl"),
                      emit=lambda e, f: events.append((e, f)), stop=anyio.Event(), clock=sim.clock, sleep=sim.sleep,
                      ledger=ledger)
            await job.prepare()
            return await job.run()
    finally:
        journal.close()


async def test_reconcile_grace_passes_in_simulated_time(tmp_path: Path) -> None:
    """A create dropped before the server kept it, on a listing seen current (it shows a batch made moments before
    the first reading): it waits out the 180 s grace in simulated time, then is resent once."""
    write_jsonl(tmp_path / "in.jsonl", [req(f"g{i}") for i in range(20)])
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=1000, interval=30.0, reconcile_grace=180.0)
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.org.add_batch("wrkspc_1", 7, status="ended")  # (another's, just made: the listing is current)
        fake.inject(Fault("create", kind="drop"))
        with anyio.fail_after(20):
            summary = await _run_job(tmp_path, fake, sim, settings, events)
        assert summary.succeeded == 20 and fake.org.records.creates == 1
        assert_exactly_once(fake, tmp_path / "out.jsonl", {f"g{i}" for i in range(20)})
    abandoned = [f for e, f in events if e == "reconciled" and f["outcome"] == "not created"]
    assert abandoned and abandoned[0]["how"] == "absent from listing"
    assert 180.0 < sim.slept < 400.0  # the grace passed on the simulated clock, not the real one
    assert not [e for e, _ in events if e == "listing_unproven"]


async def test_a_listing_never_seen_current_proves_no_absence_before_eight_graces(tmp_path: Path) -> None:
    """The night's first create lost on an account whose listing shows nothing: the listing may lag past the grace
    unseen (swarm seed 63: 15 minutes behind, the batch made, sent again after the grace: paid twice), so absence
    waits eight graces (24 simulated minutes at 180 s), said once; then the create is sent again, once."""
    write_jsonl(tmp_path / "in.jsonl", [req(f"g{i}") for i in range(20)])
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=1000, interval=30.0, reconcile_grace=180.0)
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.inject(Fault("create", kind="drop"))
        with anyio.fail_after(30):
            summary = await _run_job(tmp_path, fake, sim, settings, events)
        assert summary.succeeded == 20 and fake.org.records.creates == 1
    unproven = [f for e, f in events if e == "listing_unproven"]
    assert len(unproven) == 1 and unproven[0]["waits_s"] == 8 * 180.0
    assert 8 * 180.0 < sim.slept < 8 * 180.0 + 200.0


async def test_on_a_listing_never_seen_current_the_jobs_other_batches_go_and_show_it(tmp_path: Path) -> None:
    """With a ledger (one unknown create at a time), the first create lost on a listing that shows nothing: the
    job's other batches go meanwhile; once one is listed the listing is current, and the lost create is sent again
    after the plain grace, not eight."""
    write_jsonl(tmp_path / "in.jsonl", [req(f"g{i:02d}") for i in range(40)])
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=1000, interval=30.0, reconcile_grace=180.0, limits=Limits(max_requests=10))
    ledger = SqliteLedger(str(tmp_path / "ledger.db"), "the-job", clock=sim.clock)
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.inject(Fault("create", kind="drop"))
        with anyio.fail_after(30):
            summary = await _run_job(tmp_path, fake, sim, settings, events, ledger)
        assert summary.succeeded == 40 and fake.org.records.creates == 4
        assert_exactly_once(fake, tmp_path / "out.jsonl", {f"g{i:02d}" for i in range(40)})
    assert 180.0 < sim.slept < 600.0
    order = [e for e, f in events if e == "admitted" or e == "reconciled" and f["outcome"] == "not created"]
    assert order.index("reconciled") >= 1  # (another batch was created before the lost one was settled)


async def test_a_reading_that_fails_past_its_retries_is_waited_out(tmp_path: Path) -> None:
    """The API answered, then a reading fails past its retries (the network down, 503s; a cold tester stopped the
    fake mid-run: exit 1 after 17 s): waited out, 5 s then doubling, said each time; the job finishes."""
    write_jsonl(tmp_path / "in.jsonl", [req(f"o{i}") for i in range(10)])
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=1000, interval=1.0)
    with running_fake(ceiling=1000, rate=5000) as fake:
        fake.inject(Fault("list", status=503, after=2, times=6))  # (after the API has answered)
        with anyio.fail_after(30):
            summary = await _run_job(tmp_path, fake, sim, settings, events,
                                     retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.02))
        assert summary.succeeded == 10 and fake.org.records.creates == 1
    said = [f for e, f in events if e == "api_unreachable"]
    assert [f["retry_in"] for f in said] == [5.0, 10.0, 20.0] and "503" in said[0]["error"]


async def test_refusal_backoff_doubles_in_simulated_time(tmp_path: Path) -> None:
    """Hidden load refuses creates: the loop waits 5, 10, 20 ... simulated seconds between tries, then finishes."""
    from gatekeeper import Limits

    write_jsonl(tmp_path / "in.jsonl", [req(f"b{i}") for i in range(10)])
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=100, interval=1.0, min_backoff=5.0, limits=Limits(max_requests=1))  # nothing to re-cut
    with running_fake(ceiling=100, rate=5000, queue_retry_after=None) as fake:
        hidden = fake.org.add_batch("wrkspc_2", 100)  # another workspace's load we cannot see
        fake.config.rate = 0.0

        async def drain_later() -> None:
            while len(fake.org.records.refusals) < 3:
                await anyio.sleep(0.01)
            fake.config.rate = 5000.0  # the hidden load drains after three refusals

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_later)
                summary = await _run_job(tmp_path, fake, sim, settings, events)
        assert summary.succeeded == 10 and hidden.status == "ended"
    waits = [f["wait"] for e, f in events if e == "refused"]
    assert waits[:3] == [5.0, 10.0, 20.0]


async def test_library_submit_rejects_lone_surrogates_like_plan(tmp_path: Path) -> None:
    """A request with a lone surrogate is a rejected line in plan() and in submit(), from dicts and from str."""
    from gatekeeper import plan

    bad_dict = req("s1", text="broken \ud800 text")
    bad_str = '{"custom_id": "s2", "params": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "\ud800"}]}}'
    items: list[Any] = [req("ok1"), bad_dict, bad_str, req("ok2")]
    report = plan(items)
    assert [e.line for e in report.errors] == [2, 3] and report.requests == 2
    with running_fake(ceiling=1000, rate=5000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url)
        with anyio.fail_after(20):
            summary = await submit(items, config=config, settings=SubmitSettings(state_dir=tmp_path / "st", interval=0.05))
    assert (summary.invalid, summary.succeeded) == (2, 2)


def test_the_fakes_windows_run_on_its_injected_clock() -> None:
    """Listing lag and the 404 window after a create are read from the clock the fake is given: a test moves it
    instead of sleeping through them."""
    import httpx

    from gatekeeper.testing import FakeAPI, FakeConfig

    now = [100.0]
    config = FakeConfig(listing_lag=600.0, not_found_after_create=300.0, workspaces={WS1: "wrkspc_1"})
    with FakeAPI(config, clock=lambda: now[0]) as fake:
        headers = {"x-api-key": WS1, "anthropic-version": "2023-06-01"}
        body = {"requests": [req("c0")]}
        created = httpx.post(f"{fake.url}/v1/messages/batches", json=body, headers=headers).json()

        def listed() -> list[str]:
            return [b["id"] for b in httpx.get(f"{fake.url}/v1/messages/batches", headers=headers).json()["data"]]

        def found() -> int:
            return httpx.get(f"{fake.url}/v1/messages/batches/{created['id']}", headers=headers).status_code

        assert listed() == [] and found() == 404  # inside both windows
        now[0] += 301
        assert listed() == [] and found() == 200  # past the 404 window, still lagging in the listing
        now[0] += 300
        assert listed() == [created["id"]]


async def _hide_after_primers(fake: Any, sim: SimulatedTime, events: list[tuple[str, dict[str, Any]]], primers: int,
                              held: float) -> None:
    """After each of the first `primers` admissions, another workspace's load we cannot see is held in the queue (a
    batch that takes forever to cancel counts and is never processed) for `held` simulated seconds: the rest cannot
    fit until then."""
    for turn in range(1, primers + 1):
        while sum(1 for e, _ in events if e == "admitted") < turn:
            await anyio.sleep(0.001)
        hidden = fake.org.add_batch("wrkspc_2", 100, status="canceling")
        until = sim.slept + held
        while sim.slept < until:
            await anyio.sleep(0.005)
        with fake.org.lock:
            hidden.cancel_initiated_at = -1e9  # it ends now


async def test_a_rest_held_past_its_primers_life_is_primed_again(tmp_path: Path) -> None:
    """Priming: hidden load fills the queue once the primer has ended, so its round's rest waits longer than the
    prefix's 5-minute life (in simulated time). The rest is primed again: one of its requests goes first in a new
    round, the other after it has ended; each request once; the lapse is recorded and counted."""
    doc = "Context shared by three questions. " * 200  # about 2,100 of the fake's tokens: above the minimum
    rows = [{"custom_id": f"q{i}", "params": {"model": "claude-sonnet-5", "max_tokens": 8, "messages": [
        {"role": "user", "content": f"question {i}"}],
        "system": [{"type": "text", "text": doc, "cache_control": {"type": "ephemeral"}}]}} for i in range(3)]
    write_jsonl(tmp_path / "in.jsonl", rows)
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=100, interval=60.0, preflight=False)
    with running_fake(ceiling=100, rate=400, queue_retry_after=None, cancel_delay=1e9) as fake:
        sim.org = fake.org  # (a primer's ended_at, on the API's clock, agrees with the loop's: lapses are timed from it)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_hide_after_primers, fake, sim, events, 1, 360.0)
                summary = await _run_job(tmp_path, fake, sim, settings, events)
        assert_exactly_once(fake, tmp_path / "out.jsonl", {"q0", "q1", "q2"})
        batches = sorted(fake.org.batches.values(), key=lambda b: b.seq)
    assert [f for e, f in events if e == "primer_lapsed"] == [{"round": 0, "life": 300.0, "reprimed_as": 1}]
    ours = [b for b in batches if b.workspace == "wrkspc_1"]
    assert [len(b.requests) for b in ours] == [1, 1, 1]  # the first primer, the new primer, then the rest
    assert ours[2].created_at >= (ours[1].ended_at or 1e18)  # the rest went after the new primer had ended
    assert summary.caching is not None and summary.caching["priming"]["lapsed_rounds"] == 1
    assert summary.caching["priming"]["rounds"] == 2


def _cached_rows(n: int) -> list[dict[str, Any]]:
    doc = "Context shared by three questions. " * 200  # about 2,100 of the fake's tokens: above the minimum
    return [{"custom_id": f"q{i}", "params": {"model": "claude-sonnet-5", "max_tokens": 8, "messages": [
        {"role": "user", "content": f"question {i}"}],
        "system": [{"type": "text", "text": doc, "cache_control": {"type": "ephemeral"}}]}} for i in range(n)]


async def test_a_long_poll_sees_its_primer_end_while_the_prefix_lives(tmp_path: Path) -> None:
    """A poll of 15 minutes and a primer that takes 40: readings come at a quarter of the 5-minute life while the
    primer flies, so its end is seen and the rest goes inside the prefix's life; nothing lapses, nothing is primed
    again (found by the swarm: with readings a poll apart every primer lapsed, round after round, and the job never
    finished)."""
    write_jsonl(tmp_path / "in.jsonl", _cached_rows(3))
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=100, interval=900.0, preflight=False)
    with running_fake(ceiling=100, rate=400, turnaround=lambda rng: 2400.0) as fake:
        sim.org = fake.org
        with anyio.fail_after(30):
            summary = await _run_job(tmp_path, fake, sim, settings, events)
        assert_exactly_once(fake, tmp_path / "out.jsonl", {"q0", "q1", "q2"})
        ours = sorted((b for b in fake.org.batches.values() if b.workspace == "wrkspc_1"), key=lambda b: b.seq)
    assert [e for e, _ in events if e == "primer_lapsed"] == []
    assert [len(b.requests) for b in ours] == [1, 2]  # the primer, then the rest
    assert ours[1].created_at - (ours[0].ended_at or 1e18) < 300.0 / 4 + 1  # seen within a quarter of the life
    assert summary.caching is not None and summary.caching["priming"]["lapsed_rounds"] == 0


async def test_a_round_primed_again_once_lapses_no_more_its_rest_goes_as_it_is(tmp_path: Path) -> None:
    """Hidden load holds the queue past the prefix's life after the first primer ends, and again after the new
    primer ends: the round is primed again once, then its rest goes as it is (each request writes its prefix); the
    job finishes, each request once (the swarm's worlds primed again until the night ended)."""
    write_jsonl(tmp_path / "in.jsonl", _cached_rows(3))
    sim = SimulatedTime()
    events: list[tuple[str, dict[str, Any]]] = []
    settings = SubmitSettings(ceiling=100, interval=60.0, preflight=False)
    with running_fake(ceiling=100, rate=400, queue_retry_after=None, cancel_delay=1e9) as fake:
        sim.org = fake.org

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_hide_after_primers, fake, sim, events, 2, 420.0)
                summary = await _run_job(tmp_path, fake, sim, settings, events)
        assert_exactly_once(fake, tmp_path / "out.jsonl", {"q0", "q1", "q2"})
        ours = sorted((b for b in fake.org.batches.values() if b.workspace == "wrkspc_1"), key=lambda b: b.seq)
    lapses = [f for e, f in events if e == "primer_lapsed"]
    assert [(f["round"], f["reprimed_as"]) for f in lapses] == [(0, 1), (1, None)]
    assert [len(b.requests) for b in ours] == [1, 1, 1]  # the first primer, the new primer, then the rest as it is
    assert summary.pending == 0


async def test_a_damaged_download_is_tried_again_when_due_not_a_poll_later(tmp_path: Path) -> None:
    """A results download cut short is tried again after the `retry_in` it announced, not at the next reading a
    15-minute poll away (found by the swarm, seed 10: a deadline the batch lane had met, missed by a retry that
    waited a poll)."""
    write_jsonl(tmp_path / "in.jsonl", [req(f"d{i}") for i in range(20)])
    sim = SimulatedTime()

    class Timed(list[tuple[Any, ...]]):
        def append(self, item: tuple[Any, ...]) -> None:
            super().append((sim.now, *item))

    events = Timed()
    settings = SubmitSettings(ceiling=1000, interval=900.0, preflight=False)
    with running_fake(ceiling=1000, rate=5000, damaged_downloads=1, turnaround=lambda rng: 7200.0) as fake:
        sim.org = fake.org
        summary = await _run_job(tmp_path, fake, sim, settings, events)  # type: ignore[arg-type]
    assert summary.pending == 0
    failed = [(t, f) for t, e, f in events if e == "download_failed"]
    collected = [t for t, e, _ in events if e == "collected"]
    assert len(failed) == 1 and collected, events
    at, fields = failed[0]
    assert fields["retry_in"] < 60
    assert collected[-1] - at <= fields["retry_in"] + 5.0, (collected[-1] - at, fields)
