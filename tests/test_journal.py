"""The journal's typed methods, run against both backends: SQLite in a state directory and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gatekeeper import JobLive, JournalError
from gatekeeper.state._journal import MIGRATIONS, BatchState, JobPlan, Journal, PendingRow

Open = Callable[[], Journal]


@pytest.fixture(params=["sqlite", "postgres"])
def open_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """Opens the same job's journal again each call (as a resume would)."""
    opened: list[Journal] = []

    def make() -> Journal:
        if request.param == "sqlite":
            j = Journal.open(tmp_path / "state")
        else:
            j = Journal.open_shared(request.getfixturevalue("pg_url"), request.getfixturevalue("job_name"), tmp_path / "state")
        opened.append(j)
        return j

    yield make
    for j in opened:
        j.close()


def _plan(n: int = 3) -> JobPlan:
    return JobPlan(input={"path": "/in.jsonl", "sha256": "ab"}, settings={"batch_size": 10}, report={"requests": 10 * n},
                   output="/out.jsonl", rejections=[(7, "bad", "no params")],
                   batches=[(i, 10, 1000, i * 10, i * 10 + 9, i * 1000, i * 1000 + 1000, f"c{i * 10}", f"c{i * 10 + 9}")
                            for i in range(n)])


def test_migrates_a_blank_database_once(open_journal: Open) -> None:
    """A blank journal gets every migration, recorded; opening it again applies nothing twice."""
    j = open_journal()
    names = [r[0] for r in j.db.execute("SELECT name FROM schema_migrations ORDER BY name")]
    assert names == [name for name, _ in MIGRATIONS]
    assert j.outcomes.final_count() == 0 and not j.initialized
    open_journal()
    assert j.db.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == len(MIGRATIONS)


def test_a_job_moves_through_its_states(open_journal: Open) -> None:
    """Planned, intent, created, ended, collected: each step is one transaction, seen by the next open."""
    j = open_journal()
    j.start_job(_plan())
    j.mark_intent(0, at=1_700_000_000.123456, worst_usd=1.5)
    j.mark_body_complete(0)
    j.mark_created(0, "msgbatch_1", "2026-12-03T00:00:00Z")
    j.mark_intent(1, at=1_700_000_001.0, worst_usd=2.0)
    j.back_to_planned(1, "queue_full", depth=5)
    j.mark_ended(0, "2026-12-03T01:00:00Z", {"succeeded": 10})
    again = open_journal()
    row = again.batch(0)
    assert (row.state, row.batch_id, row.body_complete, row.worst_usd) == (BatchState.ENDED, "msgbatch_1", True, 1.5)
    assert row.intent_at == 1_700_000_000.123456  # a double, not a 4-byte float
    assert again.batch(1).state is BatchState.PLANNED and again.batch(1).intent_at is None
    assert again.in_flight_worst() == 1.5 and again.held_back() == 20
    assert again.adoptions.known_batch_ids() == {"msgbatch_1"} and again.groups.skipped_lines(0, 9) == {7}
    assert [e[3] for e in again.outcomes.events_of("queue_full")] == [{"depth": 5}]
    assert again.get_meta("input") == {"path": "/in.jsonl", "sha256": "ab"}


def test_settlement_commits_rows_and_length_together_or_not_at_all(open_journal: Open) -> None:
    """Results, retries and the output's length commit with the batch's state; a failure rolls all of it back."""
    j = open_journal()
    j.start_job(_plan(1))
    j.mark_intent(0, at=1.0)
    j.mark_created(0, "b0", None)
    j.mark_ended(0, None, {})
    with pytest.raises(RuntimeError), j.settling(0) as s:
        s.final(0, "c0", "succeeded", None, 1, 0, 50, ("m", 3, 4, 0, 0, 0))
        s.committed = 50
        raise RuntimeError("the download broke")
    assert (j.outcomes.final_count(), j.outcomes.committed_output(), j.batch(0).state) == (0, 0, BatchState.ENDED)
    with j.settling(0) as s:
        s.final(0, "c0", "succeeded", None, 1, 0, 50, ("m", 3, 4, 3, 2, 1))
        s.retry(1, 100, 20, "c1", 1, 0, "errored", "overloaded_error", b'{"raw": 1}')
        s.retry(1, 100, 20, "c1", 1, 0, "errored", "overloaded_error", b'{"raw": 2}')  # the same row again replaces
        s.committed = 50
    again = open_journal()
    assert (again.outcomes.final_count(), again.outcomes.committed_output(), again.batch(0).state) == (1, 50, BatchState.COLLECTED)
    totals = again.outcomes.totals()
    assert totals.usage == (3, 4, 3, 2, 1) and all(type(v) is int for v in totals.usage)  # SUM() is int on both
    assert totals.types == {"succeeded": 1} and totals.resubmitted == 1
    assert again.groups.pending_count() == 1
    assert list(again.outcomes.result_spans(types=["succeeded"], error_types=[], in_order=True)) == [(0, 50)]
    assert again.outcomes.batch_results(0) == [(0, "c0", 0, 50)]


def test_retries_and_recut_replace_planned_batches_atomically(open_journal: Open) -> None:
    j = open_journal()
    j.start_job(_plan(3))
    rows = [PendingRow(40, 4000, 100, "r40", 2), PendingRow(41, 4100, 100, "r41", 2)]
    j.groups.recut(5, [(5, 500, 0, 4, 0, 500, "c0", "c4"), (5, 500, 5, 9, 500, 1000, "c5", "c9")], [("retry", None, rows)], lambda g: 300)
    batches = j.batches(BatchState.PLANNED)
    assert [(b.kind, b.requests) for b in batches] == [("plan", 5), ("plan", 5), ("retry", 2)]
    assert j.groups.members(batches[2].idx) == [(40, 4000, 100, "r40", 2), (41, 4100, 100, "r41", 2)]
    assert open_journal().get_meta("settings")["batch_size"] == 5


def test_timeline_keeps_its_span_when_thinned(open_journal: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    import gatekeeper.state._outcomes as journal_module

    monkeypatch.setattr(journal_module, "TIMELINE_ROWS", 10)
    j = open_journal()
    for t in range(25):
        j.outcomes.record_reading(float(t), t * 10, 1000, t)
    readings = j.outcomes.readings()
    assert len(readings) <= 11 and readings[0][0] == 0.0 and readings[-1][0] == 24.0


def test_a_failing_statement_rolls_back_and_is_a_journal_error(open_journal: Open) -> None:
    j = open_journal()
    with pytest.raises(JournalError) as info, j.transaction() as db:
        db.execute("INSERT INTO meta VALUES ('k', '1')")
        db.execute("INSERT INTO no_such_table VALUES (1)")
    assert info.value.__cause__ is not None and "no_such_table" in str(info.value)
    assert j.get_meta("k") is None
    j.set_meta("k", 2)  # the connection is usable after the failure
    assert j.get_meta("k") == 2


def test_lease_refuses_a_second_holder_until_it_expires(pg_url: str, job_name: str, tmp_path: Path) -> None:
    """A live lease names its host and when it was last seen; an expired one is taken over, and the old
    holder's next write is refused (it cannot record an intent after losing the job)."""
    first = Journal.open_shared(pg_url, job_name, tmp_path / "a")
    second = Journal.open_shared(pg_url, job_name, tmp_path / "b")
    try:
        first.lease.take("run-1", {"host": "worker-a", "pid": 11}, ttl=30)
        with pytest.raises(JobLive, match=r"running on worker-a \(pid 11\), last seen \d+ s ago"):
            second.lease.take("run-2", {"host": "worker-b", "pid": 22}, ttl=30)
        first.db.execute("UPDATE gatekeeper.jobs SET heartbeat_at = now() - interval '31 seconds' WHERE name = ?", (job_name,))
        second.lease.take("run-2", {"host": "worker-b", "pid": 22}, ttl=30)
        with pytest.raises(JobLive, match="taken over by worker-b"):
            first.set_meta("k", 1)
        assert not first.lease.renew() and second.lease.renew()
        second.set_meta("k", 2)
        taken = second.outcomes.events_of("lease_taken_over")
        assert [(e[3]["previous"]["host"], e[3]["why"]) for e in taken] == [("worker-a", "expired")]
        second.lease.release()
        third = Journal.open_shared(pg_url, job_name, tmp_path / "c")
        third.lease.take("run-3", {"host": "c"}, ttl=30)  # released: free at once
        third.close()
    finally:
        first.close()
        second.close()


def test_a_live_lease_is_taken_over_at_once_only_when_its_run_has_ended(pg_url: str, job_name: str, tmp_path: Path) -> None:
    """`ended` (the holder's recorded info -> has it certainly ended?) frees a live lease at once, recorded as such;
    a live lease it does not vouch for is refused as before."""
    first = Journal.open_shared(pg_url, job_name, tmp_path / "a")
    second = Journal.open_shared(pg_url, job_name, tmp_path / "b")
    try:
        first.lease.take("run-1", {"host": "here", "pid": 11, "machine": "m"}, ttl=600)
        with pytest.raises(JobLive, match=r"running on here \(pid 11\)"):
            second.lease.take("run-2", {"host": "here", "pid": 22}, ttl=600, ended=lambda h: h.get("machine") != "m")
        second.lease.take("run-2", {"host": "here", "pid": 22}, ttl=600, ended=lambda h: h == {"host": "here", "pid": 11,
                                                                                                "machine": "m"})
        assert [e[3]["why"] for e in second.outcomes.events_of("lease_taken_over")] == ["ended"]
        with pytest.raises(JobLive, match="taken over by here"):
            first.set_meta("k", 1)
    finally:
        first.close()
        second.close()


def test_shared_journal_errors_name_the_url_without_its_password(tmp_path: Path) -> None:
    from tests.services import free_port

    url = f"postgresql://gk:s3cret-pw@127.0.0.1:{free_port()}/gk"
    with pytest.raises(JournalError) as info:
        Journal.open_shared(url, "job", tmp_path / "s", ride_out=0)
    assert "127.0.0.1" in str(info.value) and "s3cret-pw" not in str(info.value) and "***" in str(info.value)


def test_a_batch_row_is_read_by_column_name_and_names_every_column(tmp_path: Path) -> None:
    """BatchRow is read by name (`BATCH_COLUMNS`), never by position; every column the migrations give the batches
    table is one of its fields, so a migration that adds one cannot be misread."""
    from gatekeeper.state._records import BATCH_COLUMNS

    j = Journal.open(tmp_path)
    try:
        columns = [r[1] for r in j.db.execute("PRAGMA table_info(batches)")]
    finally:
        j.close()
    assert sorted(columns) == sorted(BATCH_COLUMNS)


def test_reconciliations_grace_counts_from_when_the_body_was_whole(tmp_path: Path) -> None:
    """An intent's time moves to when its body's last bytes went: a batch cannot exist before, so a long upload
    never eats the grace that a listing's lag needs."""
    j = Journal.open(tmp_path)
    try:
        j.start_job(_plan(1))
        j.mark_intent(0, 100.0)
        assert j.batch(0).intent_at == 100.0 and not j.batch(0).body_complete
        j.mark_body_complete(0, 160.0)
        assert j.batch(0).intent_at == 160.0 and j.batch(0).body_complete
    finally:
        j.close()


def test_requests_of_a_create_that_may_have_made_its_batch_go_real_time_counted_as_charged_once(
        open_journal: Open) -> None:
    """A lost create's wait cut by the deadline sends its requests real time counted as possibly charged once (the
    batch it may have made): a call of theirs out at a kill makes twice, and the lane never makes a third
    (`row.lost >= 2`; swarm seed 100095: billed in the batch, then twice in real time across two kills)."""
    j = open_journal()
    try:
        j.start_job(_plan(2))
        j.lane.move_planned(1, [(10 + k, k * 100, 100, f"c{10 + k}", 1) for k in range(3)], [0.0] * 3, lost=1)
        assert [r.lost for r in j.lane.rows(10)] == [1, 1, 1]
        j.lane.sending(10)
        assert j.lane.resume() == 1
        assert {r.line: r.lost for r in j.lane.rows(10)} == {10: 2, 11: 1, 12: 1}
    finally:
        j.close()


def test_a_create_cut_by_the_deadline_stays_reconciled_and_its_batch_answers_where_the_lane_has_not(
        open_journal: Open) -> None:
    """Swarm seed 100095: a lost create's wait cut by the deadline keeps its batch row (`cut`, its intent kept, to be
    reconciled still); its requests go real time counted as charged once; one whose calls were lost twice waits for
    the batch instead of ending `gatekeeper_answer_lost`; once adopted and collected, the batch's answer is joined
    where the lane has not answered (the lane then never sends it), kept aside where it has, and an answer it did
    not process (expired) takes back the charge it was counted for. A cut create proven never made frees its rows."""
    j = open_journal()
    try:
        j.start_job(_plan(2))
        j.mark_intent(1, 100.0)
        j.mark_body_complete(1, 110.0)
        assert j.lane.move_cut(1, [(10 + k, k * 100, 100, f"c{10 + k}", 1) for k in range(4)], [0.0] * 4) == 4
        assert j.batch(1).state is BatchState.CUT and j.batch(1).cut and j.batch(1).intent_at == 110.0
        assert [r.lost for r in j.lane.rows(10)] == [1, 1, 1, 1]
        for line in (10, 11, 12):
            assert j.lane.sending(line)
        assert j.lane.resume() == 3  # (a kill: each call out counted, lost twice)
        assert [r.line for r in j.lane.rows(10)] == [13] and j.lane.waiting() == 3  # (10-12 wait for the batch)
        assert j.lane.waits(13)  # (its call lost now would wait too, not end it)
        j.lane.sending(13)
        j.lane.received(13, b'{"custom_id": "c13"}')  # (the lane answered 13 first)
        j.mark_created(1, "msgbatch_cut", None, adopted="ledger")
        assert j.batch(1).cut and j.lane.waiting() == 3
        with j.settling(1) as s:
            s.joined_first(10)
            s.final(10, "c10", "succeeded", None, 1, 0, 10, ("m", 1, 1, 0, 0, 0))
            s.aside(11, 1, "expired", None, b"{}", charged=False)  # (not processed by the batch: not a charge)
            s.aside(13, 1, "succeeded", None, b"{}", charged=True)  # (the lane's first: a double charge, not joined)
            s.committed = 10
        assert j.lane.joined([10, 11, 13]) == {10}
        assert not j.lane.sending(10)  # (answered by the batch: no call goes)
        assert {line: lost for line, (_, lost) in j.lane.cut_rows(1).items()} == {10: 2, 11: 1, 12: 2, 13: 1}
        assert [r.line for r in j.lane.rows(10)] == [11, 12] and not j.lane.waiting()  # (11 once more; 12 ends lost)
        j.mark_intent(0, 100.0)
        j.lane.move_cut(0, [(0, 0, 100, "c0", 1)], [0.0])
        j.lane.sending(0)
        j.lane.again(0, lost=True)
        assert j.lane.waiting() == 1
        j.lane.uncut(0)  # (reconciled: never made)
        assert [(r.line, r.lost) for r in j.lane.rows(10)][0] == (0, 1) and not j.batches(BatchState.CUT)
    finally:
        j.close()


def test_the_budget_counts_lost_real_time_calls_and_prices_an_unknown_model_at_the_dearest(open_journal: Open) -> None:
    """What `--budget` counts as spent: a real-time call whose answer was lost at its worst case (it may have been
    billed), once per loss; an answer whose model has no price at the table's dearest rates, never as free."""
    from gatekeeper._prices import load_prices
    from gatekeeper.run.shared._summary import budget_spent, spent_usd

    prices = load_prices()
    j = open_journal()
    j.start_job(_plan(2))
    assert budget_spent(j, prices) == 0.0
    j.lane.move_planned(1, [(10 + k, k * 100, 100, f"c{10 + k}", 1) for k in range(10)], [0.25] * 10)
    j.lane.again(10, lost=True)
    j.lane.again(11, lost=True)
    j.lane.again(11, lost=True)
    assert budget_spent(j, prices) == pytest.approx(0.75)  # three lost answers, 0.25 each at worst
    with j.settling(0) as s:
        s.final(0, "c0", "succeeded", None, 1, 0, 10, ("gateway-rewrote-this-model", 1_000_000, 0, 0, 0, 0))
        s.committed = 10
    dearest = prices.dearest()
    assert spent_usd(j, prices) is None  # (the report never prints a wrong number)
    assert budget_spent(j, prices) == pytest.approx(0.75 + 0.5 * dearest.input)
    assert prices.cost_at_most("claude-haiku-4-5", 1_000_000, 0) == prices.cost("claude-haiku-4-5", 1_000_000, 0)
