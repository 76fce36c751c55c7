"""gatekeeper in real Airflow (issue 29): `dag.test()` end to end against the fake over HTTP, each Dag in a process of
its own (as a Dag run is), with an Airflow home and metadata database per test worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gatekeeper import ApiConfig, Secret, SubmitSettings, submit_sync
from gatekeeper.testing import FakeAPI, Fault
from tests.fakes import ADMIN, WS1, running_fake
from tests.forkserver import ForkServer, Run
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, output_ids

if not os.environ.get("CI"):
    pytest.importorskip("airflow", reason="Airflow is the `airflow` extra: pip install -e '.[airflow]'")

from airflow.sdk.exceptions import AirflowException

# Two workers run them, each in one Airflow home (its database migrated once, 3 s of CPU, not once a test): the kill
# test (about 20 s) on one, the rest (about 30 s) on the other.
# The first test of a worker also waits for its Airflow home (the imports and `db migrate`: 5 s of CPU, a minute and
# more on a loaded machine): a longer limit than the suite's 90 s, which still ends a hang.
# A bound on each wait for a Dag run (its start is Airflow's imports, 2-3.5 s of CPU: over a minute at load 20 on 2
# cores), well inside the test's own limit: it ends a hang, it does not time the run.
RUN_WAIT = 240.0
pytestmark = [pytest.mark.xdist_group("airflow"), pytest.mark.timeout(600)]

# One Dag run's output on stdout, after dag.test() returns: its state, the task's tries and XCom.
DAG_FILE = """
import json, os, sys
from datetime import timedelta
from airflow.sdk import DAG
from gatekeeper.airflow import GatekeeperSubmitOperator

with DAG({dag_id!r}, schedule=None) as dag:
    GatekeeperSubmitOperator(task_id="submit", input_path={input!r}, results_path={results!r}, poll_interval=0.1,
                             retries={retries}, retry_delay=timedelta(seconds=0), deferrable={deferrable},
                             state_dir={state!r})

if __name__ == "__main__":
    import datetime
    dr = dag.test(logical_date=datetime.datetime.now(datetime.timezone.utc))
    ti = dr.get_task_instance("submit")
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    with create_session() as session:
        xcom = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id="submit").first()
        value = None if xcom is None else xcom.value
    print("RESULT " + json.dumps({{"state": str(dr.state), "tries": ti.try_number, "xcom": value}}, default=str))
"""


# What the Airflow processes of a worker fork from (`_python`): a server that imported these once, with the worker's
# Airflow home in its environment (Airflow reads it at import). Each Dag run is still a process of its own, killed by
# a real SIGKILL; what it skips is the interpreter's start and these imports, about 2 s of CPU a run.
AIRFLOW_PRELOAD = ("airflow.sdk", "gatekeeper.airflow", "airflow.models.xcom", "airflow.utils.session",
                   "airflow.api_fastapi.execution_api.app", "airflow.sdk.execution_time.supervisor",
                   "airflow.sdk.execution_time.task_runner", "airflow.jobs.triggerer_job_runner", "airflow.cli.cli_parser",
                   # (what `dag.test()` imports as it goes: another 0.5 s of CPU a run, measured with -X importtime)
                   "airflow.api_fastapi.execution_api.routes", "svcs", "airflow.models.trigger",
                   "airflow.serialization.serialized_objects", "cadwyn", "airflow.executors.workloads",
                   "airflow.api_fastapi.auth.tokens", "airflow.providers.standard.operators.trigger_dagrun",
                   "airflow.providers.standard.sensors.external_task", "airflow.jobs.job", "sqlalchemy.dialects.sqlite")
_forks: dict[Path, ForkServer] = {}


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An Airflow home with its metadata database (SQLite), migrated once for this module on this worker, and the
    fork server its Airflow processes start from."""
    home = tmp_path_factory.mktemp("airflow")
    (home / "dags").mkdir()
    _forks[home] = ForkServer(AIRFLOW_PRELOAD, _env(home))
    try:
        done = _ran(_python(home, _env(home), module="airflow", args=["db", "migrate"]), timeout=RUN_WAIT)
        assert done.returncode == 0, done.stderr[-3000:]
        yield home
    finally:
        _forks.pop(home).stop()


def _python(home: Path, env: dict[str, str], *, script: str | None = None, module: str | None = None,
            args: list[str] | None = None, cwd: str | None = None, merged: bool = False) -> Run:
    """`python SCRIPT ARGS` or `python -m MODULE ARGS` with exactly `env`, forked from the home's server."""
    return _forks[home].spawn(args or [], env, script=script, module=module, cwd=cwd, merged=merged)


def _ran(run: Run, timeout: float) -> subprocess.CompletedProcess[str]:
    """A run to its end, as `subprocess.run(..., capture_output=True, text=True)` returns it."""
    out, err = run.communicate(timeout=timeout)
    assert run.returncode is not None  # (communicate waits for it)
    return subprocess.CompletedProcess(run.args, run.returncode, out, err)


def _env(home: Path, fake: FakeAPI | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__UNIT_TEST_MODE": "False", "PYTHONPATH": str(Path(__file__).parent.parent)})
    if fake is not None:
        env["AIRFLOW_CONN_ANTHROPIC_DEFAULT"] = json.dumps({"conn_type": "anthropic", "password": WS1, "host": fake.url,
                                                           "extra": {"admin_key": ADMIN}})
    return env


@pytest.fixture
def dag(airflow_home: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict]:
    """A Dag of this test's own in the worker's Airflow home (removed after), and where its job's files go."""
    dag_id = "gk_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    spec = {"dag_id": dag_id, "input": str(tmp_path / "in.jsonl"), "results": str(tmp_path / "out" / "results.jsonl"),
            "state": str(tmp_path / "state"), "file": airflow_home / "dags" / f"{dag_id}.py", "home": airflow_home}
    yield spec
    spec["file"].unlink(missing_ok=True)


def _write_dag(dag: dict, *, retries: int = 0, deferrable: bool = True, results: str | None = None) -> Path:
    dag["file"].write_text(DAG_FILE.format(dag_id=dag["dag_id"], input=dag["input"], results=results or dag["results"],
                                           retries=retries, deferrable=deferrable, state=dag["state"]))
    return dag["file"]


def _start(dag: dict, fake: FakeAPI) -> Run:
    """The Dag's file run as `python FILE` in its folder, its log (stdout and stderr) on `stdout`."""
    return _python(dag["home"], _env(dag["home"], fake), script=str(dag["file"]), cwd=str(dag["file"].parent),
                   merged=True)


def _run(dag: dict, fake: FakeAPI) -> tuple[dict, str]:
    """One Dag run to its end: (what it printed as RESULT, its whole log)."""
    proc = _start(dag, fake)
    out, _ = proc.communicate(timeout=RUN_WAIT)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-4000:]
    return json.loads(lines[-1][7:]), out


def _job_dir(dag: dict) -> Path:
    [job] = [p for p in Path(dag["state"]).iterdir() if p.is_dir()]
    return job


def test_a_dag_runs_the_job_in_the_triggerer_and_returns_a_small_summary(dag: dict) -> None:
    """The happy path, deferred: every request once, the results at results_path byte for byte as the CLI writes
    them, a summary under 10 KB as the XCom; no key in the task's log or its XCom."""
    ids = {f"af-{i}" for i in range(60)}
    write_jsonl(Path(dag["input"]), [req(c) for c in sorted(ids)])
    _write_dag(dag)
    with running_fake(ceiling=1000, rate=2000) as fake:
        result, log = _run(dag, fake)
        assert result["state"] == "success", log[-4000:]
        job = _job_dir(dag)
        assert_exactly_once(fake, job / "results.jsonl", ids)
    assert Path(dag["results"]).read_bytes() == (job / "results.jsonl").read_bytes()
    xcom = result["xcom"]
    assert (xcom["requests"], xcom["succeeded"], xcom["ok"], xcom["output"]) == (60, 60, True, dag["results"])
    assert len(json.dumps(xcom)) < 10_000 and xcom["job"] == job.name
    assert "deferring to the triggerer" in log and "60 of 60 succeeded" in log
    assert WS1 not in log + json.dumps(xcom) and ADMIN not in log + json.dumps(xcom)


@pytest.mark.xdist_group("airflow-kill")
def test_a_dag_run_killed_after_its_first_create_then_a_fresh_run_continues_the_job(dag: dict) -> None:
    """SIGKILL the Dag's process once the first batch exists; a new Dag run over the same input re-attaches to the
    job from its journal: nothing created twice, nothing succeeded twice, every request once."""
    ids = {f"k-{i}" for i in range(90)}
    write_jsonl(Path(dag["input"]), [req(c) for c in sorted(ids)])
    _write_dag(dag)
    with running_fake(ceiling=40, rate=30) as fake:  # batches of 10, slowly: the kill lands mid-job
        proc = _start(dag, fake)
        fake.org.wait_for(lambda r: r.creates >= 1, "the first create", timeout=RUN_WAIT)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        first = fake.org.records.creates
        fake.org.config.rate = 3000
        result, log = _run(dag, fake)
        assert result["state"] == "success", log[-4000:]
        assert_exactly_once(fake, _job_dir(dag) / "results.jsonl", ids)
        assert fake.org.records.creates >= first and fake.org.records.succeeded_twice == 0
    assert result["xcom"]["succeeded"] == 90


def test_a_first_try_that_fails_and_its_retry_reattach(dag: dict) -> None:
    """The job fails mid-run (the API refuses the key once, after the first create): the task fails its first try,
    and its retry continues the same job: no batch created again, every request once."""
    from gatekeeper.testing import Fault

    ids = {f"r-{i}" for i in range(60)}
    write_jsonl(Path(dag["input"]), [req(c) for c in sorted(ids)])
    _write_dag(dag, retries=1)
    with running_fake(ceiling=40, rate=30) as fake:
        proc = _start(dag, fake)
        fake.org.wait_for(lambda r: r.creates >= 1, "the first create", timeout=RUN_WAIT)
        fake.inject(Fault("list", status=401, error_type="authentication_error", message="invalid x-api-key"))
        out, _ = proc.communicate(timeout=RUN_WAIT)
        result = json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])
        assert result["state"] == "success" and result["tries"] == 2, out[-4000:]
        assert "AuthenticationError" in out and "a retry continues the job" in out
        assert_exactly_once(fake, _job_dir(dag) / "results.jsonl", ids)


TRIGGER_RUNNER = """
import asyncio, importlib, json, sys, time
with open(sys.argv[1]) as f:
    classpath, kwargs = json.load(f)
module, name = classpath.rsplit(".", 1)
trigger = getattr(importlib.import_module(module), name)(**kwargs)

async def main():
    stalls = [0.0]
    def queued():  # (seconds the loop's thread has waited for a core, runnable: a loaded machine's doing, not the trigger's)
        try:
            with open("/proc/thread-self/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except OSError:
            return 0.0
    async def ticker():  # (a stall: the time between two ticks past the tick, less the time spent waiting for a core;
        last, waited = time.monotonic(), queued()  # what the trigger held the loop with, computing or blocked on I/O)
        while True:
            await asyncio.sleep(0.005)
            now, wait = time.monotonic(), queued()
            stalls[0] = max(stalls[0], now - last - 0.005 - (wait - waited))
            last, waited = now, wait
    tick = asyncio.create_task(ticker())
    events = [e.payload async for e in trigger.run()]
    tick.cancel()
    return events, stalls[0]

events, stall = asyncio.run(main())
print("RESULT " + json.dumps({"events": events, "stall": stall}))
"""


def test_the_trigger_serialized_runs_in_another_process_and_never_stalls_its_loop(tmp_path: Path, airflow_home: Path) -> None:
    """The job prepared on the "worker" (this process), its trigger serialized (no key in it) and rehydrated in
    another process, where it runs the whole job: the event loop it shares is never held 100 ms (between two of a
    ticker's turns, less the time the loop's thread waited for a core: a machine under load does not count)."""
    from gatekeeper.airflow import GatekeeperTrigger
    from gatekeeper.airflow._job import JobSpec

    ids = {f"t-{i:05d}" for i in range(2000)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c, text="a longer prompt " * 20) for c in sorted(ids)])
    with running_fake(ceiling=2000, rate=3000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        state = tmp_path / "base" / "job-1"  # (the trigger finds it by the same rule: its base, then the job's name)
        spec = JobSpec(conn_id="anthropic_default", input_path=str(path), state_dir=str(state), results_path=None,
                       journal=None, job="job-1", ledger=None, ceiling=None, budget=None, max_attempts=3, poll_interval=0.1,
                       state_base=str(tmp_path / "base"))
        prepared = submit_sync(path, config=config, settings=SubmitSettings(state_dir=state, interval=0.1), prepare_only=True)
        assert prepared.requests == 2000 and fake.org.records.creates == 0
        serialized = json.dumps(GatekeeperTrigger(**spec.to_kwargs()).serialize())
        assert WS1 not in serialized and ADMIN not in serialized
        (tmp_path / "trigger.json").write_text(serialized)
        (tmp_path / "runner.py").write_text(TRIGGER_RUNNER)
        done = _ran(_python(airflow_home, _env(airflow_home, fake), script=str(tmp_path / "runner.py"),
                            args=[str(tmp_path / "trigger.json")]), timeout=RUN_WAIT)
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        assert line, done.stderr[-4000:]
        result = json.loads(line[-1][7:])
        [event] = result["events"]
        assert event["status"] == "success" and event["summary"]["succeeded"] == 2000, event
        assert_exactly_once(fake, state / "results.jsonl", ids)
    print(f"longest stall of the trigger's event loop: {result['stall'] * 1000:.1f} ms")
    assert result["stall"] < 0.1, f"the trigger held its event loop {result['stall'] * 1000:.0f} ms"


def test_on_kill_cancels_the_live_batches_as_cancel_does(tmp_path: Path, airflow_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A user kills the deferred task: the trigger's on_kill cancels the job's live batches and records it, so a
    later run reports them rather than sending anything new. The operator's on_kill does the same on a worker. The
    first create's answer is held back so the kill lands while it is out: the batch it makes is canceled as it lands."""
    from gatekeeper.airflow import GatekeeperSubmitOperator, GatekeeperTrigger
    from gatekeeper.airflow._job import connection_config
    from gatekeeper.state._journal import Journal

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"c-{i}") for i in range(30)])
    held = Fault("create", kind="delay_after_commit", delay=1.5)
    with running_fake(ceiling=20, rate=0.0, cancel_delay=0.0) as fake:  # nothing ends on its own
        fake.inject(held)
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        op = GatekeeperSubmitOperator(task_id="t", input_path=str(path), poll_interval=0.1, state_dir=str(tmp_path / "s"))
        spec = op._job_spec(connection_config("anthropic_default"))
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        submit_sync(path, config=config, settings=SubmitSettings(state_dir=Path(spec.state_dir), interval=0.1), prepare_only=True)
        trigger = GatekeeperTrigger(**spec.to_kwargs())

        async def killed_while_deferred() -> None:
            run = asyncio.ensure_future(trigger.run().__anext__())
            while fake.org.records.creates == 0:
                await asyncio.sleep(0.05)
            await trigger.on_kill()
            run.cancel()  # Airflow cancels the trigger after on_kill: the loop stops at a safe point
            with pytest.raises(asyncio.CancelledError):
                await run

        asyncio.run(killed_while_deferred())
        live = [b for b in fake.org.batches.values()]
        assert live and all(b.status in ("canceling", "ended") and b.cancel_initiated_at is not None for b in live)
        journal = Journal.open(Path(spec.state_dir))
        try:
            assert journal.get_meta("user_canceled") is True
        finally:
            journal.close()
        op.on_kill()  # (nothing is live any more: it records the cancel again and touches no batch)
        assert fake.org.records.creates == len(live)


def test_a_stopped_trigger_waits_for_the_real_time_calls_out_as_long_as_the_run_promises(
        tmp_path: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The triggerer stops while the deadline's real-time lane has calls out, each answer taking 3 s: the trigger waits
    for the run's stop, which waits for them (its wait is the run's own bound: a moment to reach a safe point, then
    the 60 s the lane promises, not a shorter one of its own), so every answer is committed; the next trigger
    finishes the job buying none again."""
    from gatekeeper.airflow import GatekeeperSubmitOperator, GatekeeperTrigger, _trigger
    from gatekeeper.airflow._job import connection_config
    from gatekeeper.run._submit import STOP_GRACE
    from gatekeeper.run.realtime._realtime import CALLS_OUT_WAIT
    from gatekeeper.state._journal import Journal
    from gatekeeper.testing import FakeRealtime

    assert _trigger.STOP_WAIT >= STOP_GRACE + CALLS_OUT_WAIT
    ids = {f"d-{i}" for i in range(30)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in sorted(ids)])
    slow = FakeRealtime(rpm=6000, itpm=2_000_000, otpm=400_000, latency=3.0)
    with running_fake(rate=0.0, realtime=slow) as fake:  # (nothing ends in the batch lane: the deadline moves it all)
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        # (the default slack, 60 s, leaves 2 s before the last chance: the batch is canceled once it has waited)
        op = GatekeeperSubmitOperator(task_id="t", input_path=str(path), poll_interval=0.1, state_dir=str(tmp_path / "s"),
                                      deadline="62s")
        spec = op._job_spec(connection_config("anthropic_default"))
        config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=fake.url)
        submit_sync(path, config=config, settings=SubmitSettings(state_dir=Path(spec.state_dir), interval=0.1), prepare_only=True)

        async def stopped_with_calls_out() -> dict:
            run = asyncio.ensure_future(GatekeeperTrigger(**spec.to_kwargs()).run().__anext__())
            while fake.realtime.records.calls < 30:
                await asyncio.sleep(0.05)
            run.cancel()  # the triggerer stops: the loop stops at a safe point, the calls out answer first
            with pytest.raises(asyncio.CancelledError):
                await run
            journal = Journal.open(Path(spec.state_dir))
            try:
                assert journal.lane.out() == 0 and journal.lane.stats()["possible_double_charges"] == 0
            finally:
                journal.close()
            assert fake.realtime.records.answered == 30
            return (await GatekeeperTrigger(**spec.to_kwargs()).run().__anext__()).payload

        event = asyncio.run(stopped_with_calls_out())
        assert event["status"] == "success" and event["summary"]["succeeded"] == 30, event
        assert fake.realtime.records.calls == 30 and all(n == 1 for n in fake.org.records.realtime.values())
        assert set(output_ids(Path(event["summary"]["output"]))) == ids


def test_not_deferrable_runs_the_same_loop_on_the_worker_and_delivers_to_object_storage(
        tmp_path: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deferrable=False: `execute` runs the whole job where it is, and the results go to an ObjectStoragePath (its
    local file system) byte for byte; a second execute re-attaches and creates nothing."""
    from gatekeeper.airflow import GatekeeperSubmitOperator

    ids = {f"w-{i}" for i in range(40)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in sorted(ids)])
    target = tmp_path / "bucket" / "results.jsonl"
    with running_fake(ceiling=1000, rate=2000) as fake:
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        from airflow.sdk import ObjectStoragePath

        op = GatekeeperSubmitOperator(task_id="w", input_path=str(path), results_path=ObjectStoragePath(f"file://{target}"),
                                      deferrable=False, poll_interval=0.1, state_dir=str(tmp_path / "s"))
        summary = op.execute({})
        again = op.execute({})
        assert fake.org.records.creates == summary["batches"] == again["batches"]
    job = Path(summary["state_dir"])
    assert_exactly_once(fake, job / "results.jsonl", ids)
    assert target.read_bytes() == (job / "results.jsonl").read_bytes() and summary["output"].endswith("results.jsonl")
    assert (summary["succeeded"], again["succeeded"], summary["ok"]) == (40, 40, True)


def test_a_deadline_on_the_operator_is_resolved_once_and_moves_a_stalled_job_to_real_time(
        tmp_path: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`deadline` is templated and resolved when the task prepares the job (the trigger keeps the same moment); a
    batch lane that cannot make it (20 s, within the default minute's slack: its last chance is now) sends the job
    through the real-time lane, and the XCom says which lane did what."""
    from gatekeeper.airflow import GatekeeperSubmitOperator
    from gatekeeper.airflow._job import JobSpec

    ids = {f"d-{i}" for i in range(12)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c, text=c) for c in sorted(ids)])
    with running_fake(ceiling=1000, rate=0.0) as fake:  # (a stalled batch lane)
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        op = GatekeeperSubmitOperator(task_id="d", input_path=str(path), deferrable=False, poll_interval=0.1,
                                      state_dir=str(tmp_path / "s"), deadline="20s")
        spec = op._job_spec(ApiConfig(workspace_keys=[Secret(WS1)]))
        assert spec.deadline is not None and abs(spec.deadline - (time.time() + 20)) < 5
        assert JobSpec(**json.loads(json.dumps(spec.to_kwargs()))).deadline == spec.deadline
        summary = op.execute({})
    assert summary["lanes"] == {"batch": 0, "realtime": 12} and summary["deadline_met"] is True and summary["ok"]
    assert set(output_ids(Path(summary["state_dir"]) / "results.jsonl")) == ids
    with pytest.raises(AirflowException, match="deadline='someday'"):
        GatekeeperSubmitOperator(task_id="x", input_path=str(path), deadline="someday")._job_spec(
            ApiConfig(workspace_keys=[Secret(WS1)]))


def test_the_example_dag_loads(airflow_home: Path) -> None:
    """examples/airflow_dag.py parses under Airflow into one Dag with the operator, its paths templated."""
    import runpy

    from gatekeeper.airflow import GatekeeperSubmitOperator

    dag = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "airflow_dag.py"))["dag"]
    [task] = dag.tasks
    assert isinstance(task, GatekeeperSubmitOperator) and "run_after" in task.input_path
    assert set(GatekeeperSubmitOperator.template_fields) == {"input_path", "results_path", "job", "deadline"}


@pytest.mark.xdist_group("airflow-kill")  # (beside the kill test: the long ones spread over two workers)
@pytest.mark.parametrize("kind", ["manual", "scheduled"])
def test_the_example_dag_runs_on_a_manual_trigger_and_on_its_schedule(tmp_path: Path, airflow_home: Path,
                                                                       kind: str) -> None:
    """The example Dag's paths render for a manual run (no logical date: `ds` would be undefined there) and a
    scheduled one, and the Dag runs the job to its end against the fake, the connection made with `airflow
    connections add` (not an AIRFLOW_CONN_ variable), read by the trigger too."""
    import datetime

    day = datetime.date.today().isoformat()
    data = tmp_path / "data"
    (data / "requests").mkdir(parents=True)
    write_jsonl(data / "requests" / f"{day}.jsonl", [req(f"x-{i}") for i in range(12)])
    dag_file = airflow_home / "dags" / f"example_{kind}.py"
    source = (Path(__file__).parent.parent / "examples" / "airflow_dag.py").read_text()
    dag_file.write_text(source.replace('"nightly_classification"', f'"example_{kind}"')
                        .replace("retry_delay=timedelta(minutes=5),", "retry_delay=timedelta(seconds=0), state_dir="
                                 f"{str(tmp_path / 'state')!r},").replace("poll_interval=60", "poll_interval=0.1")
                        + RUN_EXAMPLE.format(manual=kind == "manual"))
    with running_fake(ceiling=1000, rate=5000) as fake:
        env = {**_env(airflow_home), "GATEKEEPER_EXAMPLE_DATA": str(data)}
        conn = f"example_{kind}_conn"
        add = _ran(_python(airflow_home, env, module="airflow", args=[
            "connections", "add", conn, "--conn-type", "anthropic", "--conn-password", WS1, "--conn-host", fake.url,
            "--conn-extra", json.dumps({"admin_key": ADMIN})]), timeout=RUN_WAIT)
        assert add.returncode == 0, add.stderr[-2000:]
        dag_file.write_text(dag_file.read_text().replace('conn_id="anthropic_default"', f"conn_id={conn!r}"))
        try:
            out = _ran(_python(airflow_home, env, script=str(dag_file), cwd=str(dag_file.parent)), timeout=RUN_WAIT)
        finally:
            dag_file.unlink(missing_ok=True)
        lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        assert lines, (out.stdout + out.stderr)[-4000:]
        result = json.loads(lines[-1][7:])
        assert result["state"] == "success" and result["xcom"]["succeeded"] == 12, result
        assert fake.org.records.creates == 1
    assert (data / "results" / f"{day}.jsonl").exists()


# The example Dag run once, as `airflow dags test` runs it: manual (no logical date) or as its schedule would.
RUN_EXAMPLE = """
if __name__ == "__main__":
    import datetime, json
    if {manual}:
        dr = dag.test()
    else:
        dr = dag.test(logical_date=datetime.datetime.now(datetime.timezone.utc))
    ti = dr.get_task_instance("classify")
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    with create_session() as session:
        xcom = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id="classify").first()
        value = None if xcom is None else xcom.value
    print("RESULT " + json.dumps({{"state": str(dr.state), "xcom": value}}, default=str))
"""


def test_findings_fail_the_task_only_when_asked_and_the_state_base_is_configurable(
        tmp_path: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that ended with findings (a rejected line) succeeds with them counted, or fails with
    fail_on_findings=True; an error event fails the try with its message. State directories go below the operator's
    argument, else `[gatekeeper] state_dir`, else $AIRFLOW_HOME/gatekeeper."""
    from gatekeeper.airflow import GatekeeperSubmitOperator
    from gatekeeper.airflow._job import state_base

    rows = [req(f"f-{i}") for i in range(10)] + [b'{"custom_id": "bad"}']
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    with running_fake(ceiling=1000, rate=2000) as fake:
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        lenient = GatekeeperSubmitOperator(task_id="a", input_path=str(path), deferrable=False, poll_interval=0.1,
                                           state_dir=str(tmp_path / "s"))
        summary = lenient.execute({})
        assert (summary["succeeded"], summary["invalid"], summary["ok"]) == (10, 1, False)
        strict = GatekeeperSubmitOperator(task_id="b", input_path=str(path), deferrable=False, poll_interval=0.1,
                                          state_dir=str(tmp_path / "s"), fail_on_findings=True)
        with pytest.raises(AirflowException, match="ended with findings"):
            strict.execute({})  # (the same job, re-attached: nothing is sent again)
        assert fake.org.records.creates == 1
        with pytest.raises(AirflowException, match=r"AuthenticationError: .* \(exit 2\); a retry continues the job"):
            strict.execute_complete({}, {"status": "error", "message": "AuthenticationError: key refused", "exit_code": 2})
    assert state_base("/x") == Path("/x")
    assert state_base(None) == airflow_home / "gatekeeper"
    monkeypatch.setenv("AIRFLOW__GATEKEEPER__STATE_DIR", str(tmp_path / "configured"))
    assert state_base(None) == tmp_path / "configured"


def test_a_restarted_triggerer_and_a_postgresql_journal_named_by_a_connection(
        tmp_path: Path, airflow_home: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deferral path in this process, with the journal in PostgreSQL given as an Airflow connection id (its
    password never in the trigger's arguments): the trigger is cancelled mid-job, as when its triggerer stops; a new
    trigger from the same serialized form continues the job; execute_complete returns its summary."""
    from airflow.sdk.exceptions import TaskDeferred

    from gatekeeper.airflow import GatekeeperSubmitOperator, GatekeeperTrigger

    ids = {f"p-{i}" for i in range(60)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in sorted(ids)])
    password = pg_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    with running_fake(ceiling=40, rate=40) as fake:  # batches of 10, a few seconds in all
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AIRFLOW_CONN_GK_JOURNAL", pg_url)
        op = GatekeeperSubmitOperator(task_id="p", input_path=str(path), journal="gk_journal", poll_interval=0.1,
                                      job=f"airflow-{os.urandom(4).hex()}", state_dir=str(tmp_path / "s"))
        with pytest.raises(TaskDeferred) as deferred:
            op.execute({})
        classpath, kwargs = deferred.value.trigger.serialize()
        assert password not in json.dumps(kwargs) and WS1 not in json.dumps(kwargs)

        async def restarted() -> dict:
            first = asyncio.ensure_future(GatekeeperTrigger(**kwargs).run().__anext__())
            while fake.org.records.creates == 0:
                await asyncio.sleep(0.05)
            first.cancel()  # the triggerer stops: the loop stops at a safe point, nothing is canceled
            with pytest.raises(asyncio.CancelledError):
                await first
            assert all(b.cancel_initiated_at is None for b in fake.org.batches.values())
            return (await GatekeeperTrigger(**kwargs).run().__anext__()).payload

        event = asyncio.run(restarted())
        summary = op.execute_complete({}, event)
        assert_exactly_once(fake, Path(summary["output"]), ids)
    assert summary["succeeded"] == 60 and summary["job"] == kwargs["job"]


def test_a_trigger_where_the_worker_prepared_nothing_fails_at_once_and_sends_nothing(
        tmp_path: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker and triggerer on different machines with the default journal: the trigger, rebuilt from its serialized
    arguments where the worker's state folder is absent, fails at once with one line naming the job, the machine
    that prepared it and the two ways out, and creates nothing (not even the folder)."""
    from gatekeeper.airflow import GatekeeperSubmitOperator, GatekeeperTrigger
    from gatekeeper.airflow._job import connection_config

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"m-{i}") for i in range(10)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        op = GatekeeperSubmitOperator(task_id="t", input_path=str(path), state_dir=str(tmp_path / "worker-only"))
        spec = op._job_spec(connection_config("anthropic_default"))  # (execute would prepare it there; it did not)
        classpath, kwargs = GatekeeperTrigger(**spec.to_kwargs()).serialize()
        assert kwargs["prepared_on"]

        async def fire() -> dict:
            return (await GatekeeperTrigger(**kwargs).run().__anext__()).payload  # type: ignore[no-any-return]

        event = asyncio.run(fire())
        assert fake.org.records.creates == 0 and sum(fake.org.records.requests_seen.values()) == 0
    assert event["status"] == "error" and event["usage"] is True and event["exit_code"] == 2
    message = event["message"]
    assert "JobMissing" in message and spec.job in message and kwargs["prepared_on"] in message
    assert "shared by workers and triggerers" in message and "PostgreSQL" in message and "\n" not in message
    assert not (tmp_path / "worker-only").exists()
    with pytest.raises(AirflowException, match="fix the setting"):
        op._complete(event)


def test_results_delivered_onto_a_full_disk_leave_nothing_half_written(tmp_path: Path) -> None:
    """`results_path` on a disk too small for the results: one OutputError naming the cause, and nothing at the path
    (no half file, no temporary); with room, the copy is byte for byte."""
    from types import SimpleNamespace

    from gatekeeper import OutputError
    from gatekeeper.airflow._job import deliver
    from tests.test_errors import _grow, _mounted

    source = tmp_path / "results.jsonl"
    source.write_bytes(b'{"custom_id": "x"}\n' * 3000)
    finished: Any = SimpleNamespace(output=str(source))
    with _mounted(tmp_path / "dest", "16k") as disk:
        with pytest.raises(OutputError, match="No space left on device"):
            deliver(finished, str(disk / "out" / "results.jsonl"))
        assert os.listdir(disk / "out") == []
        _grow(disk, "1m")
        assert deliver(finished, str(disk / "out" / "results.jsonl")) == str(disk / "out" / "results.jsonl")
        assert (disk / "out" / "results.jsonl").read_bytes() == source.read_bytes()


@pytest.mark.parametrize("job", ["../elsewhere", "a/b", "..", "x" * 129, ""])
def test_a_templated_job_name_never_becomes_a_path(tmp_path: Path, airflow_home: Path, job: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gatekeeper.airflow import GatekeeperSubmitOperator

    monkeypatch.setenv("AIRFLOW_HOME", str(airflow_home))
    op = GatekeeperSubmitOperator(task_id="t", input_path=str(tmp_path / "in.jsonl"), job=job or None,
                                  state_dir=str(tmp_path / "s"))
    config = ApiConfig(workspace_keys=[Secret(WS1)])
    if not job:  # (no name: derived from the input, always a safe name)
        write_jsonl(tmp_path / "in.jsonl", [req("a")])
        assert "/" not in op._job_spec(config).job
        return
    with pytest.raises(AirflowException, match="names the job's state folder"):
        op._job_spec(config)


def test_the_trigger_resolves_the_state_folder_by_its_own_machines_rule(tmp_path: Path, airflow_home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's folder is not the triggerer's path: the trigger finds the job under its own `[gatekeeper]
    state_dir` (here the same shared folder mounted at another path); a journal URL with a password is refused
    before it could be stored with the trigger."""
    from gatekeeper.airflow import GatekeeperSubmitOperator
    from gatekeeper.airflow._job import JobSpec

    worker_base, shared = tmp_path / "worker-mount", tmp_path / "triggerer-mount"
    worker_base.mkdir()
    shared.symlink_to(worker_base)
    monkeypatch.setenv("AIRFLOW_HOME", str(airflow_home))
    monkeypatch.setenv("AIRFLOW__GATEKEEPER__STATE_DIR", str(worker_base))
    op = GatekeeperSubmitOperator(task_id="t", input_path=str(tmp_path / "in.jsonl"), job="night-1")
    spec = op._job_spec(ApiConfig(workspace_keys=[Secret(WS1)]))
    assert spec.state_dir == str(worker_base / "night-1") and spec.state_base is None
    monkeypatch.setenv("AIRFLOW__GATEKEEPER__STATE_DIR", str(shared))  # (the triggerer's configuration)
    assert JobSpec(**spec.to_kwargs()).here().state_dir == str(shared / "night-1")
    with pytest.raises(AirflowException, match="carries a password"):
        GatekeeperSubmitOperator(task_id="p", input_path="x", job="j", journal="postgresql://u:secret@db/gk")._job_spec(
            ApiConfig(workspace_keys=[Secret(WS1)]))


@pytest.mark.parametrize(("password", "host", "extra", "login", "conn_type", "expect"), [
    ("sk-1", None, {}, None, "anthropic", ("anthropic", "https://api.anthropic.com", 1, None)),
    ("sk-1", "gw.example", {"extra_workspace_keys": ["sk-2", "sk-1"], "admin_key": "ad"}, None, "anthropic",
     ("anthropic", "https://gw.example", 2, "ad")),
    ("sk-1", None, {"extra_workspace_keys": "sk-2,sk-3"}, None, "generic", ("anthropic", "https://api.anthropic.com", 3, None)),
    (None, None, {"platform": "aws", "region_name": "eu-west-1", "workspace_id": "ws_9"}, None, "anthropic",
     ("aws", "https://aws-external-anthropic.eu-west-1.api.aws", 1, None)),  # SigV4 from the chain
    ("short-key", None, {"platform": "aws", "region": "us-east-1", "workspace_id": "ws_1"}, None, "anthropic",
     ("aws", "https://aws-external-anthropic.us-east-1.api.aws", 1, None)),  # a short-term key
    ("secret", "http://127.0.0.1:9", {"region_name": "us-east-1", "workspace_id": "ws_1"}, "AKIA1", "aws",
     ("aws", "http://127.0.0.1:9", 1, None)),  # an Airflow aws connection: explicit credentials
    (None, None, {"platform": "google", "project": "p-1", "workspace_id": "wrkspc_g"}, None, "anthropic",
     ("google", "https://claude.googleapis.com/v1/projects/p-1/locations/global/workspaces/wrkspc_g/invoke", 1, None)),
    (None, "http://127.0.0.1:9/v1/projects/p/locations/us/workspaces/w/invoke",
     {"platform": "google", "key_path": "/k.json"}, None, "anthropic",
     ("google", "http://127.0.0.1:9/v1/projects/p/locations/us/workspaces/w/invoke", 1, None)),  # host: every route
    (None, None, {"platform": "google", "project": "p-1", "workspace_id": "wrkspc_g", "origin": "http://127.0.0.1:9"},
     None, "anthropic",  # (origin: the derived routes moved, as GATEKEEPER_GOOGLE_CLOUD_ORIGIN; a cold tester's finding)
     ("google", "http://127.0.0.1:9/v1/projects/p-1/locations/global/workspaces/wrkspc_g/invoke", 1, None)),
])
def test_a_connection_becomes_an_api_config(password: str | None, host: str | None, extra: dict, login: str | None,
                                            conn_type: str, expect: tuple) -> None:
    from gatekeeper import AwsPlatform
    from gatekeeper.airflow._connection import api_config

    c = api_config("c", password, host, extra, login=login, conn_type=conn_type)
    assert (c.platform.name, c.base_url, c.reads, c.admin_key.reveal() if c.admin_key else None) == expect
    if isinstance(c.platform, AwsPlatform):
        assert c.platform.workspace_id in ("ws_9", "ws_1") and c.admin_key is None
        assert (c.platform.access_key is not None) is (conn_type == "aws")
        assert (c.platform.api_key is not None) is (password == "short-key")
    if c.platform.name == "google":
        assert c.scope in ("google_p_1_global_wrkspc_g", "google_p_us_w") and c.admin_key is None


@pytest.mark.parametrize(("extra", "said"), [
    ({"platform": "google", "project": "p"}, "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID"),
    ({"platform": "foundry"}, "Microsoft Foundry"),
    ({"platform": "google", "project": "p", "workspace_id": "w", "origin": "http://h/v1"}, "origin='http://h/v1'"),
])
def test_a_google_or_foundry_connection_is_refused_in_one_line(extra: dict, said: str) -> None:
    from gatekeeper._errors import UsageError
    from gatekeeper.airflow._connection import api_config

    with pytest.raises(UsageError, match=said):
        api_config("c", None, None, extra).require_workspace_key()


@pytest.mark.parametrize(("extra", "missing"), [({"platform": "aws", "workspace_id": "w"}, "region_name"),
                                                ({"platform": "aws", "region_name": "us-east-1"}, "workspace_id")])
def test_an_aws_connection_without_region_or_workspace_is_named(extra: dict, missing: str) -> None:
    from gatekeeper._errors import UsageError
    from gatekeeper.airflow._connection import api_config

    with pytest.raises(UsageError, match=f"'c' is for Claude Platform on AWS: its extra needs {missing}"):
        api_config("c", None, None, extra)


def test_a_dag_with_a_federation_connection_outlives_its_tokens_and_stores_none(dag: dict) -> None:
    """The connection names workload identity federation (an identity token file, a rule, an organization), the
    fake refuses keys and mints tokens of 2 s, the file rotates: the deferred job finishes once, and no access token
    nor identity token is in the task's log, its XCom, or anywhere in Airflow's database (trigger arguments
    included); the file's path may be."""
    from gatekeeper.testing import FakeFederation, identity_token

    ids = {f"f-{i:03d}" for i in range(60)}
    write_jsonl(Path(dag["input"]), [req(c) for c in sorted(ids)])
    _write_dag(dag)
    token_file = Path(dag["state"]).parent / "identity-token"
    first, second = identity_token(jti="first"), identity_token(jti="second")
    token_file.write_text(first)
    fed = FakeFederation(token_life=2, keys_refused=True)
    with running_fake(ceiling=1000, rate=15, speed=1, federation=fed) as fake:
        env = _env(dag["home"], fake)
        env["AIRFLOW_CONN_ANTHROPIC_DEFAULT"] = json.dumps({"conn_type": "anthropic", "host": fake.url, "extra": {
            "identity_token_file": str(token_file), "federation_rule_id": "fdrl_fake_1",
            "organization_id": "org_fake_1"}})
        run = _python(dag["home"], env, script=str(dag["file"]), cwd=str(dag["file"].parent), merged=True)
        fake.org.wait_for(lambda r: r.creates >= 1, "a first create", timeout=RUN_WAIT)
        token_file.write_text(second)  # (rotated while the job runs)
        log, _ = run.communicate(timeout=RUN_WAIT)
        result = json.loads([x for x in log.splitlines() if x.startswith("RESULT ")][-1][7:])
        assert result["state"] == "success", log[-4000:]
        assert_exactly_once(fake, _job_dir(dag) / "results.jsonl", ids)
    assert fed.refused == [] and len(fed.exchanges) >= 3 and {"first", "second"} <= {e["jti"] for e in fed.exchanges}
    secrets = [t.encode() for t in fed.issued] + [first.encode(), second.encode()]
    stored = b"".join(p.read_bytes() for p in dag["home"].rglob("*") if p.is_file() and p.suffix != ".py")
    for secret in secrets:
        assert secret not in log.encode() + json.dumps(result["xcom"]).encode() + stored


AWS_DAG = """
import datetime, json
from airflow.sdk import DAG
from gatekeeper.airflow import GatekeeperSubmitOperator
with DAG({dag_id!r}, schedule=None) as dag:
    GatekeeperSubmitOperator(task_id="submit", input_path={input!r}, conn_id="gk_aws", ceiling=1000, poll_interval=0.1,
                             state_dir={state!r})
if __name__ == "__main__":
    dr = dag.test(logical_date=datetime.datetime.now(datetime.timezone.utc))
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    with create_session() as session:
        xcom = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id="submit").first()
    print("RESULT " + json.dumps({{"state": str(dr.state), "xcom": None if xcom is None else xcom.value}}, default=str))
"""


def test_a_dag_on_claude_platform_on_aws_through_an_aws_connection(dag: dict) -> None:
    """The operator with an Airflow `aws` connection (login the access key id, password the secret, extra the
    region and workspace) against the fake's AWS mode: every call signed, the job run in the triggerer, once."""
    from gatekeeper.testing import FakeAws

    ids = {f"w-{i:03d}" for i in range(20)}
    write_jsonl(Path(dag["input"]), [req(c) for c in sorted(ids)])
    dag["file"].write_text(AWS_DAG.format(dag_id=dag["dag_id"], input=dag["input"], state=dag["state"]))
    with running_fake(ceiling=1000, rate=5000, aws=FakeAws()) as fake:
        env = _env(dag["home"], fake)
        env["AIRFLOW_CONN_GK_AWS"] = json.dumps({
            "conn_type": "aws", "login": "AKIAFAKEFAKEFAKE0001", "password": "fake/secret/key/0001", "host": fake.url,
            "extra": {"region_name": "us-east-1", "workspace_id": "wrkspc_aws_1"}})
        env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(Path(dag["state"]) / "none"),
                   AWS_SHARED_CREDENTIALS_FILE=str(Path(dag["state"]) / "none"))
        out = _ran(_python(dag["home"], env, script=str(dag["file"]), cwd=str(dag["file"].parent)), timeout=RUN_WAIT)
        lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        assert lines, (out.stdout + out.stderr)[-4000:]
        result = json.loads(lines[-1][7:])
        assert result["state"] == "success" and result["xcom"]["succeeded"] == 20, result
        aws = fake.config.aws
        assert aws is not None and aws.refused == [] and aws.signed > 0 and fake.org.records.creates == 1
    assert "fake/secret/key/0001" not in out.stdout + out.stderr


def test_the_operator_sends_the_api_version_it_is_given(tmp_path: Path, airflow_home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`api_version="2026-10-21"` on the operator: the job's calls carry it (the fake records the batch's version)
    and a line that version refuses is rejected before sending, on the worker as with the CLI."""
    from gatekeeper.airflow import GatekeeperSubmitOperator

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"v{i}") for i in range(5)] + [req("warm", temperature=0.3)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        op = GatekeeperSubmitOperator(task_id="v", input_path=str(path), deferrable=False, poll_interval=0.1,
                                      state_dir=str(tmp_path / "s"), api_version="2026-10-21")
        summary = op.execute({})
        assert set(fake.org.records.versions.values()) == {"2026-10-21"}
    assert (summary["succeeded"], summary["invalid"]) == (5, 1)


def test_a_table_job_on_object_storage_continued_by_a_triggerer_on_another_machine(
        tmp_path: Path, airflow_home: Path, pg_url: str, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A table at an s3:// URI, a PostgreSQL journal, and a triggerer that cannot see the worker's folder: the trigger
    renders the same unanswered rows from the URI, continues the run `execute` recorded, and writes the result table
    back to s3:// (one row per input row, in order, the original ids); the next Dag run sends nothing, and one over
    a grown table sends only its new rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from airflow.sdk.exceptions import TaskDeferred
    from pyarrow import fs

    from gatekeeper.airflow import GatekeeperSubmitOperator, GatekeeperTrigger

    tag = os.urandom(4).hex()
    ids = [f"JIRA:SUP-{i}" if i % 2 else str(i) for i in range(30)]
    with running_fake(ceiling=40, rate=40) as fake:
        for k, v in {**_env(airflow_home, fake), **s3, "AIRFLOW_CONN_GK_JOURNAL": pg_url}.items():
            monkeypatch.setenv(k, v)
        lake, _ = fs.FileSystem.from_uri("s3://lake/x")
        with lake.open_output_stream(f"lake/{tag}/tickets.parquet") as f:
            pq.write_table(pa.table({"ticket": ids, "body": [f"printer {i} is on fire" for i in range(30)]}), f)
        worker, triggerer = tmp_path / "worker", tmp_path / "triggerer"

        def task() -> GatekeeperSubmitOperator:
            return GatekeeperSubmitOperator(
                task_id="t", input_path=f"s3://lake/{tag}/tickets.parquet", template="Classify: {body}",
                model="claude-haiku-4-5-20251001", max_tokens=20, id_column="ticket", journal="gk_journal",
                results_path=f"s3://lake/{tag}/result.parquet", poll_interval=0.1)

        def dag_run() -> dict:
            monkeypatch.setenv("AIRFLOW__GATEKEEPER__STATE_DIR", str(worker))
            op = task()
            try:
                return op.execute({})  # type: ignore[no-any-return]  # (every row answered: nothing to defer)
            except TaskDeferred as deferred:
                _, kwargs = deferred.trigger.serialize()
            monkeypatch.setenv("AIRFLOW__GATEKEEPER__STATE_DIR", str(triggerer))  # (another machine's folder)

            async def fire() -> dict:
                return (await GatekeeperTrigger(**kwargs).run().__anext__()).payload  # type: ignore[no-any-return]
            return op.execute_complete({}, asyncio.run(fire()))

        first = dag_run()
        creates = fake.org.records.creates
        assert first["rows"] == first["sent"] == first["succeeded"] == 30 and creates >= 1
        [run] = (triggerer / first["job"] / "runs").glob("*.jsonl")  # (rendered again from the URI there)
        assert run.read_bytes() == (worker / first["job"] / "runs" / run.name).read_bytes()
        with lake.open_input_file(f"lake/{tag}/result.parquet") as f:
            result = pq.read_table(f)
        assert result.column("ticket").to_pylist() == ids and set(result.column("status").to_pylist()) == {"succeeded"}
        second = dag_run()  # (answers are kept in the journal's database: the worker sees what the triggerer kept)
        assert fake.org.records.creates == creates and sum(b.total for b in fake.org.batches.values()) == 30
        assert second["rows"] == 30 and second["succeeded"] == 30 and second["sent"] == 0
        grown = ids + ["JIRA:SUP-new-1", "31"]
        with lake.open_output_stream(f"lake/{tag}/tickets.parquet") as f:
            pq.write_table(pa.table({"ticket": grown, "body": [f"printer {i} is on fire" for i in range(32)]}), f)
        third = dag_run()
        assert third["sent"] == 2 and sum(b.total for b in fake.org.batches.values()) == 32
        with lake.open_input_file(f"lake/{tag}/result.parquet") as f:
            assert pq.read_table(f).column("ticket").to_pylist() == grown


def test_a_table_job_refused_on_the_worker_in_one_line(tmp_path: Path, airflow_home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A table without a template, or a template naming a column the table lacks: one line, nothing sent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gatekeeper.airflow import GatekeeperSubmitOperator

    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), table)
    with running_fake() as fake:
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        plain = GatekeeperSubmitOperator(task_id="t", input_path=str(table), state_dir=str(tmp_path / "s"))
        with pytest.raises(AirflowException, match="is a table: give template="):
            plain.execute({})
        wrong = GatekeeperSubmitOperator(task_id="t", input_path=str(table), template="{bodyy}", model="m",
                                         max_tokens=5, state_dir=str(tmp_path / "s"))
        with pytest.raises(AirflowException, match="'bodyy'.*body") as refused:
            wrong.execute({})
        assert "\n" not in str(refused.value) and fake.org.records.creates == 0


def test_the_operators_priority_and_share_reach_the_run(tmp_path: Path, airflow_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """priority= and share= go with the trigger's arguments into the run's settings; a wrong one is one line."""
    from gatekeeper.airflow import GatekeeperSubmitOperator
    from gatekeeper.airflow._job import JobSpec, settings_of

    monkeypatch.setenv("AIRFLOW_HOME", str(airflow_home))
    write_jsonl(tmp_path / "in.jsonl", [req("a")])
    op = GatekeeperSubmitOperator(task_id="t", input_path=str(tmp_path / "in.jsonl"), state_dir=str(tmp_path / "s"),
                                  ledger="redis://127.0.0.1:1/0", priority="high", share=3)
    spec = JobSpec(**op._job_spec(ApiConfig(workspace_keys=[Secret(WS1)])).to_kwargs())
    assert (settings_of(spec).priority, settings_of(spec).share) == ("high", 3.0)
    with pytest.raises(AirflowException, match="must be high, normal or low"):
        GatekeeperSubmitOperator(task_id="u", input_path="x", priority="urgent")


def test_a_table_job_shares_its_answers_with_the_cli_on_one_host_and_collects_a_killed_run(
        tmp_path: Path, airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI is killed right after its first batch was created; the table grows; the operator on the same host
    (no state_dir set) finds the CLI's state (the table's folder in the user's state folder), collects the killed
    run, and sends only the rows still unanswered: each row is created once. The CLI's plan then finds every row
    answered."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gatekeeper.airflow import GatekeeperSubmitOperator
    from tests.fakes import env_for
    from tests.runs import gk

    table = tmp_path / "t.parquet"

    def write(n: int) -> None:
        pq.write_table(pa.table({"ticket": [f"T-{i}" for i in range(n)],
                                 "body": [f"printer {i} is on fire" + " again" * (i % 9) for i in range(n)]}), table)

    write(60)
    cli = ["--template", "Classify: {body}", "--model", "claude-haiku-4-5-20251001", "--max-tokens", "20",
           "--id-column", "ticket"]
    with running_fake(rate=2000) as fake:
        killed = gk(["submit", str(table), *cli, "--max-requests", "20", "--interval", "0.05"], env_for(fake),
                    crash_at="after-create:1")
        assert killed.returncode == -9, killed.stderr[-2000:]
        write(70)
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        op = GatekeeperSubmitOperator(task_id="t", input_path=str(table), template="Classify: {body}",
                                      model="claude-haiku-4-5-20251001", max_tokens=20, id_column="ticket",
                                      deferrable=False, poll_interval=0.1)
        summary = op.execute({})
        created = [cid for b in fake.org.batches.values() for cid, _ in b.requests]
        assert len(created) == len(set(created)) == 70 and fake.org.records.succeeded_twice == 0
        plan = gk(["plan", str(table), *cli, "--json"], {})
    assert summary["rows"] == summary["succeeded"] == 70
    assert json.loads(plan.stdout)["answered"] == 70


def test_a_table_uri_with_a_credential_is_refused_before_it_is_stored(tmp_path: Path, airflow_home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from gatekeeper.airflow import GatekeeperSubmitOperator

    with running_fake() as fake:
        for k, v in _env(airflow_home, fake).items():
            monkeypatch.setenv(k, v)
        for where in ({"input_path": "s3://AKIAEXAMPLE:SuperSecret123@lake/t.parquet"},
                      {"input_path": str(tmp_path / "t.parquet"),
                       "results_path": "gs://lake/r.parquet?access_token=SuperSecret123"}):
            op = GatekeeperSubmitOperator(task_id="t", template="{body}", model="m", max_tokens=5, **where)
            with pytest.raises(AirflowException, match="carries a credential") as refused:
                op.execute({})
            assert "SuperSecret123" not in str(refused.value) and "\n" not in str(refused.value)
        assert fake.org.records.creates == 0
