"""What a new user meets in the first hour: a silent API, a base URL that is not the API, a proxy (issue 26).

Every test runs the CLI (in process, so a timeout can be shortened) against real servers on loopback.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest

import gatekeeper._client as client
from gatekeeper.testing import Fault
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk
from tests.services import ForwardProxy, serving, silent_server

FAST = ["--json", "--poll", "0.05", "--max-rpm", "60000", "--no-preflight"]


@pytest.fixture
def short_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read times out after 1 s here (60 s in real use), and every retry is announced."""
    monkeypatch.setattr(client, "DEFAULT_TIMEOUT", httpx.Timeout(connect=2.0, read=1.0, write=5.0, pool=2.0))
    monkeypatch.setattr(client, "NOTICE_AFTER", 0.0)


def test_no_read_waits_over_a_minute_and_a_create_says_what_it_waits_for() -> None:
    assert client.DEFAULT_TIMEOUT.read is not None and client.DEFAULT_TIMEOUT.read <= 60
    assert client.CREATE_TIMEOUT.read == client.CREATE_ANSWER_WAIT > 60


@pytest.mark.usefixtures("short_reads")
@pytest.mark.parametrize("command", ["status", "submit"])
def test_a_silent_api_is_named_with_its_setting_and_every_retry_is_said(tmp_path: Path, command: str) -> None:
    """An API that accepts connections and never answers: each retry is said on stderr, then one line names the
    URL and ANTHROPIC_BASE_URL, exit 2, and a submit leaves no state folder."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with silent_server() as url:
        started = time.monotonic()
        argv = ["status"] if command == "status" else ["submit", str(path), "--poll", "0.05", "--no-preflight"]
        proc = gk(argv, {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "k"})
        took = time.monotonic() - started
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert url in lines[-1] and "ANTHROPIC_BASE_URL" in lines[-1] and "ReadTimeout" in lines[-1]
    said = [x for x in lines[:-1] if "retry" in x or '"retrying"' in x]
    assert said and all(url in x for x in said), proc.stderr
    assert took < 30
    assert not Path(str(path) + ".gatekeeper").exists()


@pytest.mark.parametrize(("status", "kind", "body"), [
    (404, "text/html", b"<html><body><h1>404 Not Found</h1></body></html>"),  # a web server
    (404, "application/json", b'{"detail": "Not Found"}'),  # another JSON API
    (200, "text/html", b"<html>a login page</html>"),  # a captive portal
    (401, "text/html", b"<html>proxy login</html>"),
])
def test_a_base_url_that_is_not_the_api_is_one_line_exit_2(tmp_path: Path, status: int, kind: str, body: bytes) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [req("a")])
    with serving(status, kind, body) as url:
        for argv in (["status"], ["submit", str(path), "--no-preflight"], ["submit", str(path), "--dry-run"]):
            proc = gk(argv, {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "k"})
            lines = proc.stderr.splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (argv, proc.stderr)
            assert "does not answer like the Anthropic API" in lines[0] and url in lines[0]
            assert "ANTHROPIC_BASE_URL" in lines[0] and f"HTTP {status}" in lines[0]
    assert not Path(str(path) + ".gatekeeper").exists()


def test_retries_during_a_run_are_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run rides out 5xx on reads; each retry is a "retrying" event naming the endpoint."""
    monkeypatch.setattr(client, "NOTICE_AFTER", 0.0)
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"r{i}") for i in range(20)])
    with running_fake(ceiling=1000, rate=4000) as fake:
        fake.inject(Fault("list", status=503), Fault("retrieve", status=529, error_type="overloaded_error"))
        proc = gk(["submit", str(path), *FAST], env_for(fake))
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", {f"r{i}" for i in range(20)})
    said = [e for e in events(proc.stderr) if e["event"] == "retrying"]
    assert {e["endpoint"] for e in said} == {"list", "retrieve"} and all(e["retry_in"] >= 0 for e in said)
    assert [e["bytes"] for e in events(proc.stderr) if e["event"] == "creating"][:1]


def test_a_submit_goes_through_the_proxy_the_environment_names(tmp_path: Path) -> None:
    """HTTP_PROXY is honoured as httpx honours it: the API's host here resolves only at the proxy, so the job can
    only finish through it; NO_PROXY=* turns it off (the host then cannot be reached: exit 2, named)."""
    ids = {f"p{i}" for i in range(30)}
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in sorted(ids)])
    with running_fake(ceiling=1000, rate=4000) as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        proxy = ForwardProxy({"api.gatekeeper.test": "127.0.0.1"})
        try:
            env = env_for(fake, ANTHROPIC_BASE_URL=f"http://api.gatekeeper.test:{port}", HTTP_PROXY=proxy.url)
            off = gk(["submit", str(path), *FAST], {**env, "NO_PROXY": "*"})
            assert off.returncode == 2 and "api.gatekeeper.test" in off.stderr, off.stderr
            proc = gk(["submit", str(path), *FAST], env)
            assert proc.returncode == 0, proc.stderr
            assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        finally:
            proxy.close()
    paths = {(method, p.rsplit("/", 1)[-1] if "results" in p else p) for method, _, p in proxy.seen}
    assert ("POST", "/v1/messages/batches") in paths and ("GET", "results") in paths
    assert {host for _, host, _ in proxy.seen} == {"api.gatekeeper.test"}
    assert orjson.loads(proc.stdout)["succeeded"] == 30
