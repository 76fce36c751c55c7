"""Real services the tests run against: a private redis-server on loopback; servers that hang or are not the
API; a forwarding proxy."""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class Listening(ThreadingHTTPServer):
    """A threaded test server with a listen queue a real one has (socketserver's 5 resets calls opened at once, under
    load: a ReadError the code under test rightly counts as a possible double charge)."""

    daemon_threads = True
    request_queue_size = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s") from None
            time.sleep(0.02)


def redis_binary() -> str | None:
    return shutil.which("redis-server")


@contextmanager
def redis_server(port: int | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of our own on loopback: (url, process). The caller may kill it mid-test."""
    binary = redis_binary()
    assert binary is not None, "redis-server is not installed (apt-get install redis-server)"
    port = port or free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


class _Silent:
    """Accepts connections and never answers (an API that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@contextmanager
def silent_server() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers."""
    s = _Silent()
    try:
        yield s.url
    finally:
        s.close()


@contextmanager
def serving(status: int, content_type: str, body: bytes) -> Iterator[str]:
    """The URL of a server that answers every request alike (a base URL that is not the API)."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            return

    server = Listening(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class ForwardProxy:
    """A forwarding HTTP proxy on loopback, as companies run them: it takes absolute-form requests and forwards
    them, resolving `names` (hosts only the proxy can reach) itself. `seen` lists (method, host, path)."""

    HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
           "transfer-encoding", "upgrade"}

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.seen: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                proxy.relay(self)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                return

        self.server = Listening(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def relay(self, h: BaseHTTPRequestHandler) -> None:
        target = urlsplit(h.path)  # absolute form: http://host:port/path?query
        host = target.hostname or ""
        self.seen.append((h.command, host, target.path))
        body = h.rfile.read(int(h.headers.get("content-length") or 0))
        upstream = http.client.HTTPConnection(self.names.get(host, host), target.port or 80, timeout=30)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in self.HOP}
        path = target.path + (f"?{target.query}" if target.query else "")
        upstream.request(h.command, path, body=body or None, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        h.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in self.HOP and k.lower() != "content-length":
                h.send_header(k, v)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        upstream.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
