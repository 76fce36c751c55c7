"""Real services the tests run against: a private redis-server on loopback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager


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
