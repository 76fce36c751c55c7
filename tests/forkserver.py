"""The tests' CLI processes, forked from one that has imported the CLI already.

A test that kills the CLI, or runs several at once, needs each run to be a real process: its own pid, pipes and
exit status, killed by a real SIGKILL halfway through a journal write. Starting each as `python -m gatekeeper`
paid about 0.3 s of CPU re-importing httpx, anyio and the package, some 45 times a suite (a fifth of its CPU).
Here one server process a test worker imports them once; each run is a fork of it that sets the run's
environment, standard streams and working directory and calls `main(args)`, exactly what `python -m gatekeeper`
calls. What a fork skips is the interpreter's start and the imports, which tests of their own run as fresh
processes (`runs.gk(..., isolated=True)`, the start-up benchmark).

The server is single-threaded and has run nothing but imports when it forks. It learns of each run's end through
a pidfd and reports the exit status (negative for a signal, as `subprocess` does).

A server can preload other modules and run a script or a module's `__main__` instead of the CLI: the Airflow tests'
Dag runs (`python dag.py`, `python -m airflow ...`) fork from one that imported Airflow (about 2 s of CPU a run).
"""

from __future__ import annotations

import atexit
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from contextlib import suppress
from typing import Any

import orjson

COMMANDS = ("_plan", "_status", "_submit", "_results", "_cancel", "_exporter")  # (cli/'s modules a test runs)
PRELOAD = ("gatekeeper.cli._cli", *(f"gatekeeper.cli.{m}" for m in COMMANDS), "gatekeeper.run._submit",
           "gatekeeper.watch._watch", "gatekeeper.watch._exporter", "gatekeeper.watch._report", "anyio._backends._asyncio",
           "httpcore", "sqlite3", "redis", "psycopg")


PRELOAD_WAIT = 600.0  # seconds the server may take over its imports (Airflow's: 2 s of CPU, a minute at load 20)
FORK_WAIT = 60.0  # seconds a fork may take to be reported, once the imports are done


def serve(fd: int, preload: tuple[str, ...] = PRELOAD) -> None:
    """The server: fork a run per request; report each run's pid, then its exit status."""
    import importlib

    for name in preload:
        with suppress(ImportError):  # an optional extra not installed: a run that needs it imports it itself
            importlib.import_module(name)
    from gatekeeper.api._http import tls_context

    tls_context()  # loaded once, as one process running job after job loads it: a quarter of a run's CPU otherwise
    control = socket.socket(fileno=fd)
    control.sendall(orjson.dumps(["ready", 0]) + b"\n")  # (the imports done: from here a fork answers at once)
    watch = selectors.DefaultSelector()
    watch.register(control, selectors.EVENT_READ)
    while True:
        for key, _ in watch.select():
            if key.fileobj is control:
                message, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
                if not message:
                    os._exit(0)  # the test worker is gone (skipping the interpreter's teardown: 0.6 s of its exit)
                pid = _fork(orjson.loads(message), fds, control)
                watch.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                control.sendall(orjson.dumps(["started", pid]) + b"\n")
            else:
                watch.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(key.data, 0)
                control.sendall(orjson.dumps(["exited", key.data, os.waitstatus_to_exitcode(status)]) + b"\n")


def _fork(request: dict[str, Any], fds: list[int], control: socket.socket) -> int:
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    code = 1
    try:
        control.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        code = _main(request)
    except SystemExit as exc:  # as the interpreter turns it into a status
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):  # a reader gone, or a stream the run closed
                stream.flush()
        os._exit(code)


def _main(request: dict[str, Any]) -> int:
    """What a forked run runs: `python SCRIPT ARGS` (`script`), `python -m MODULE ARGS` (`module`), else the CLI."""
    import runpy

    if "script" in request or "module" in request:
        sys.argv = [request.get("script") or request["module"], *request["args"]]
        if "script" in request:
            runpy.run_path(request["script"], run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return 0
    from gatekeeper.cli._cli import main

    _crash_at(request["env"].get("GATEKEEPER_CRASH_AT"))
    return main(request["args"])


class ForkServer:
    """The test worker's side: one server, started on first use, stopped when the worker exits. `preload`: the
    modules it imports before any fork; `env`: its own environment (what those imports read, as Airflow its home)."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, env: dict[str, str] | None = None) -> None:
        ours, theirs = socket.socketpair()
        self._server = subprocess.Popen(
            [sys.executable, "-c", f"from tests.forkserver import serve; serve({theirs.fileno()}, {preload!r})"],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, cwd=os.path.dirname(os.path.dirname(__file__)),
            env=env)
        theirs.close()
        self._control = ours
        self._send = threading.Lock()
        self._started: list[int] = []
        self._ready = False
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._listen, name="forkserver", daemon=True).start()

    def _listen(self) -> None:
        with self._control.makefile("rb") as lines:
            for line in lines:
                kind, pid, *rest = orjson.loads(line)
                with self._changed:
                    if kind == "ready":
                        self._ready = True
                    elif kind == "started":
                        self._started.append(pid)
                    else:
                        self._exits[pid] = rest[0]
                    self._changed.notify_all()
        with self._changed:  # the server died: nothing it started will be reported
            self._exits.setdefault(-1, -1)
            self._changed.notify_all()

    def spawn(self, args: list[str], env: dict[str, str], *, script: str | None = None, module: str | None = None,
              cwd: str | None = None, merged: bool = False) -> Run:
        """Start `gatekeeper ARGS` (or `python SCRIPT ARGS`, `python -m MODULE ARGS`) with exactly `env` and piped
        standard streams (stdin empty; `merged`: stderr into stdout, as `stderr=subprocess.STDOUT`)."""
        out_r, out_w = os.pipe()
        err_r, err_w = (None, out_w) if merged else os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        with self._changed:  # (the imports take seconds of CPU: minutes on a loaded machine, which a fork never does)
            assert self._changed.wait_for(lambda: self._ready or -1 in self._exits, PRELOAD_WAIT), "fork server never ready"
        request = {"args": args, "env": env, "cwd": cwd or os.getcwd(),
                   **({"script": script} if script else {}), **({"module": module} if module else {})}
        with self._send:
            socket.send_fds(self._control, [orjson.dumps(request)], [null, out_w, err_w])
            for fd in {null, out_w, err_w}:
                os.close(fd)
            with self._changed:
                assert self._changed.wait_for(lambda: self._started or -1 in self._exits, FORK_WAIT), "fork server silent"
                assert self._started, "the fork server died"
                pid = self._started.pop(0)
        return Run(self, pid, [script or module or "gatekeeper", *args], out_r, err_r)

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or -1 in self._exits, timeout)
            return self._exits.get(pid)

    def stop(self) -> None:
        self._control.shutdown(socket.SHUT_RDWR)  # (the listening thread's reader holds the socket open)
        self._control.close()
        self._server.wait(10)


class Run:
    """A forked run, with the parts of `subprocess.Popen` the tests use."""

    def __init__(self, server: ForkServer, pid: int, args: list[str], out: int, err: int | None) -> None:
        self._server, self.pid, self.args = server, pid, args
        self.stdout = open(out, encoding="utf-8")  # noqa: SIM115
        self.stderr = None if err is None else open(err, encoding="utf-8")  # noqa: SIM115 (None: merged into stdout)
        self.returncode: int | None = None

    def __del__(self) -> None:
        # (a run killed and waited for, its streams never read to their end: closed here, as Popen's are, rather than
        # left to the collector, whose ResourceWarning lands in whichever test runs then)
        for stream in (self.stdout, self.stderr):
            if stream is not None and not stream.closed:
                stream.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Both streams to their ends, then the exit status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[Any, list[bytes]] = {stream: [] for stream in (self.stdout, self.stderr) if stream is not None}
        with selectors.DefaultSelector() as sel:
            for stream in chunks:
                if not stream.closed:
                    sel.register(stream, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.fileobj].append(data)
                    else:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out, err = (b"".join(chunks.get(stream, [])).decode("utf-8", "replace") for stream in (self.stdout, self.stderr))
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (as Popen: never signal a pid that may have been reused)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_server: ForkServer | None = None


def spawn(args: list[str], env: dict[str, str]) -> Run:
    """`gatekeeper ARGS` as a forked run of this test worker's server."""
    global _server
    if _server is None:
        _server = ForkServer()
        atexit.register(_server.stop)
    return _server.spawn(args, env)


def _crash_at(spec: str | None) -> None:
    """GATEKEEPER_CRASH_AT=point[:n] in a run's environment: it SIGKILLs itself the n-th time the run reaches
    `point` (a name in gatekeeper.run.shared._checkpoints). Installed here, in the forked run: no hook ships."""
    if not spec:
        return
    from gatekeeper.run.shared import _checkpoints

    point, _, nth = spec.partition(":")
    remaining = [int(nth or 1)]

    def crash(name: str) -> None:
        if name == point:
            remaining[0] -= 1
            if remaining[0] <= 0:
                os.kill(os.getpid(), signal.SIGKILL)

    _checkpoints.hook = crash
