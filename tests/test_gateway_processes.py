"""The gateway as the process `gatekeeper serve`: killed with -9 mid-job and started again, stopped with SIGTERM,
and two replicas on one PostgreSQL journal behind a client that calls either, one of them killed."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fakes import running_fake
from tests.gateways import add_key, free_port, kill9, output, requests, serve_process, wait_healthy

# (processes started, killed and started again, each job run to its end: 15-25 s alone, several times that on two
# cores that a whole suite keeps busy)
pytestmark = [pytest.mark.xdist_group("gateway"), pytest.mark.timeout(600)]
V = {"anthropic-version": "2023-06-01"}


def _create(url: str, key: str, body: list[dict]) -> dict:
    r = httpx.post(url + "/v1/messages/batches", json={"requests": body}, headers={"x-api-key": key, **V}, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _poll(urls: list[str], key: str, batch_id: str, timeout: float = 240.0) -> dict:
    """Poll by turns through `urls` (a load balancer's replicas) until the batch has ended; a replica that is down
    is passed over."""
    deadline = time.monotonic() + timeout
    k = 0
    while True:
        k += 1
        try:
            r = httpx.get(f"{urls[k % len(urls)]}/v1/messages/batches/{batch_id}", headers={"x-api-key": key, **V}, timeout=10)
            if r.status_code == 200 and r.json()["processing_status"] == "ended":
                return dict(r.json())
            assert r.status_code == 200, r.text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{batch_id} has not ended after {timeout} s"
        time.sleep(0.2)


def _results(url: str, key: str, batch_id: str) -> list[dict]:
    with httpx.stream("GET", f"{url}/v1/messages/batches/{batch_id}/results", headers={"x-api-key": key, **V}, timeout=60) as r:
        assert r.status_code == 200
        return [orjson.loads(line) for line in r.iter_lines() if line]


def _stop(proc) -> str:  # type: ignore[no-untyped-def]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=90)
    return output(proc)


def test_kill_9_mid_job_then_a_restart_finishes_it_with_nothing_sent_twice(tmp_path: Path) -> None:
    """The gateway is killed with -9 while its job has batches out; started again on the same state, it resumes
    the job from its journal: the batch ends with one result line a request, and the API answered each once."""
    with running_fake(rate=300.0, speed=10.0, ceiling=2_000) as fake:
        key = add_key(tmp_path, "acme")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        first = serve_process(fake, tmp_path, port)
        try:
            wait_healthy(url, first)
            sent = requests(6_000)
            batch = _create(url, key, sent)
            fake.org.wait_for(lambda r: r.creates >= 3, "three of the job's batches out", timeout=60)
        finally:
            kill9(first)
        assert first.returncode == -signal.SIGKILL
        second = serve_process(fake, tmp_path, port)
        try:
            wait_healthy(url, second)
            done = _poll([url], key, batch["id"])
            lines = _results(url, key, batch["id"])
        finally:
            err = _stop(second)
        assert second.returncode == 0, err
    assert done["request_counts"]["succeeded"] == 6_000
    assert sorted(x["custom_id"] for x in lines) == sorted(r["custom_id"] for r in sent)
    assert set(fake.org.records.succeeded) == {r["custom_id"] for r in sent}
    assert fake.org.records.succeeded_twice == 0


def test_sigterm_stops_gracefully_and_the_next_start_resumes(tmp_path: Path) -> None:
    """SIGTERM: the server stops taking requests, each job stops at a safe point, the process exits 0 in seconds;
    the next start resumes the job to its end."""
    with running_fake(rate=100.0, speed=10.0, ceiling=1_000) as fake:
        key = add_key(tmp_path, "acme")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = serve_process(fake, tmp_path, port)
        wait_healthy(url, proc)
        batch = _create(url, key, requests(2_000))
        fake.org.wait_for(lambda r: r.creates >= 1, "the job's first batch out", timeout=60)
        started = time.monotonic()
        err = _stop(proc)
        assert proc.returncode == 0 and time.monotonic() - started < 30, err
        events = [orjson.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
        assert "stopping" in events and "job_failed" not in events
        again = serve_process(fake, tmp_path, port)
        try:
            wait_healthy(url, again)
            done = _poll([url], key, batch["id"])
        finally:
            _stop(again)
    assert done["request_counts"]["succeeded"] == 2_000 and fake.org.records.succeeded_twice == 0


def test_replicas_on_postgresql_carry_a_killed_replicas_job_on(tmp_path: Path, pg_database: str) -> None:
    """Two replicas share a PostgreSQL journal and a state volume; a create through one is seen through the other;
    the one that runs the job is killed with -9 and the other carries it on: every request answered once, the
    results whole through either."""
    with running_fake(rate=300.0, speed=10.0, ceiling=2_000) as fake:
        key = add_key(tmp_path, "acme")
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        procs = [serve_process(fake, tmp_path, p, "--journal", pg_database) for p in ports]
        try:
            for url, proc in zip(urls, procs):
                wait_healthy(url, proc)
            sent = requests(6_000)
            batch = _create(urls[0], key, sent)
            r = httpx.get(f"{urls[1]}/v1/messages/batches/{batch['id']}", headers={"x-api-key": key, **V})
            assert r.status_code == 200 and r.json()["id"] == batch["id"]
            fake.org.wait_for(lambda r: r.creates >= 2, "the job's batches out", timeout=60)
            runner = _runner_of(procs, batch["id"], pg_database)
            kill9(procs[runner])
            survivor = 1 - runner
            done = _poll([urls[survivor]], key, batch["id"], timeout=300)
            lines = _results(urls[survivor], key, batch["id"])
        finally:
            errs = [_stop(p) for p in procs]
        assert procs[survivor].returncode == 0, errs[survivor]
    assert done["request_counts"]["succeeded"] == 6_000
    assert sorted(x["custom_id"] for x in lines) == sorted(r["custom_id"] for r in sent)
    assert fake.org.records.succeeded_twice == 0 and set(fake.org.records.succeeded) == {r["custom_id"] for r in sent}
    assert '"job_started"' in errs[survivor]


def _runner_of(procs: list, batch_id: str, book_url: str) -> int:  # type: ignore[type-arg]
    """Which replica runs the batch's job: the one whose pid its claim in the book names."""
    import psycopg

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with psycopg.connect(book_url, autocommit=True) as conn:
            row = conn.execute("SELECT owner_info FROM gatekeeper_gateway.gateway_batches WHERE id = %s", (batch_id,)).fetchone()
        pid = None if row is None or row[0] is None else orjson.loads(row[0])["pid"]
        for k, proc in enumerate(procs):
            if proc.pid == pid:
                return k
        time.sleep(0.1)
    raise AssertionError(f"no replica claimed {batch_id}")
