"""The gateway (`gatekeeper serve`) for tests: in this process on a thread, or as a process of its own to kill; a
proxy that loses answers between a client and it; what its upstream received."""

from __future__ import annotations

import http.client
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from gatekeeper.api._config import ApiConfig, Secret
from gatekeeper.gateway._keys import FILE, KeyFile
from gatekeeper.gateway._logs import JsonLog
from gatekeeper.gateway._server import server
from gatekeeper.gateway._settings import GatewaySettings
from gatekeeper.testing import FakeAPI
from tests.fakes import ADMIN, WS1
from tests.services import Listening

QUICK = {"interval": 0.3, "scan": 0.1, "lease_ttl": 3.0}  # a job's readings and a replica's looks, in tenths of seconds


def request(cid: str, text: str = "hi", model: str = "claude-haiku-4-5") -> dict[str, Any]:
    return {"custom_id": cid, "params": {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}}


def requests(n: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [request(f"{prefix}{i}", f"question {prefix}{i}") for i in range(n)]


def add_key(state: Path, tenant: str, **kw: Any) -> str:
    return KeyFile(state / FILE).add(tenant, **kw)


@dataclass
class Gateway:
    url: str
    state: Path
    log: io.StringIO
    srv: Any = None
    keys: dict[str, str] = field(default_factory=dict)

    def key(self, tenant: str) -> str:
        if tenant not in self.keys:
            self.keys[tenant] = add_key(self.state, tenant)
        return self.keys[tenant]


def _socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@contextmanager
def gateway(fake: FakeAPI, state: Path, *, upstream: str | None = None, **settings: Any) -> Iterator[Gateway]:
    """The gateway on a thread of this process (uvicorn as `serve` runs it), its upstream the fake (or `upstream`,
    a proxy in front of it); its log kept."""
    config = ApiConfig(workspace_keys=[Secret(WS1)], admin_key=Secret(ADMIN), base_url=upstream or fake.url)
    log = io.StringIO()
    srv = server(GatewaySettings(state_dir=state, **{**QUICK, **settings}), config, log=JsonLog(log))
    sock = _socket()
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    try:
        yield Gateway(f"http://127.0.0.1:{sock.getsockname()[1]}", state, log, srv)
    finally:
        srv.should_exit = True
        thread.join(90)
        sock.close()


def serve_process(fake: FakeAPI, state: Path, port: int, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`gatekeeper serve` as a process of its own (to be killed), its upstream the fake."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_"))}
    full.update({"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": WS1, "ANTHROPIC_ADMIN_KEY": ADMIN, **(env or {})})
    cmd = [sys.executable, "-m", "gatekeeper", "serve", "--port", str(port), "--state", str(state), "--interval", "0.3",
           "--lease-ttl", "3", *args]
    log = state.parent / f"serve-{port}-{time.monotonic_ns()}.log"  # (a file, not a pipe: a pipe nobody reads fills up)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=full, stdout=out, stderr=subprocess.STDOUT, text=True)
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def output(proc: subprocess.Popen[str]) -> str:
    """What a `serve_process` printed and logged so far."""
    return str(proc.log_path.read_text())  # type: ignore[attr-defined]


def wait_healthy(url: str, proc: subprocess.Popen[str] | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the gateway exited {proc.returncode}: {output(proc)}")
        assert time.monotonic() < deadline, f"{url} not healthy after {timeout} s"
        time.sleep(0.1)


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Relay:
    """A reverse proxy on loopback in front of `target`: it records every request's method, path and headers, and
    `lose(method, path)` says which answers to lose (the request forwarded and answered, the connection then closed
    without the answer: the client cannot know it happened)."""

    def __init__(self, target: str, lose: Callable[[str, str], bool] = lambda m, p: False) -> None:
        self.target = urlsplit(target)
        self.lose = lose
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.lost = 0
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                relay.forward(self)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                return

        self.server = Listening(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def forward(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("content-length") or 0))
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "host", "keep-alive")}
        self.seen.append((h.command, h.path, headers))
        upstream = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=120)
        upstream.request(h.command, h.path, body=body or None, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        upstream.close()
        if self.lose(h.command, urlsplit(h.path).path):
            self.lost += 1
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                h.send_header(k, v)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
