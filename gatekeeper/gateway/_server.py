"""The gateway as a server: the ASGI application (Starlette) and the server that runs it (uvicorn).

Why these: Starlette (encode's, as httpx) routes and streams request and response bodies as ASGI gives them, and
adds nothing else; uvicorn is the most used ASGI server, kept by the same people, with httptools' parser and
uvloop when installed, flow control on request bodies (a slow job of ours pauses the client's upload rather than
buffering it), graceful shutdown on SIGTERM (no new connections; requests in flight answered, for up to
`GRACEFUL` seconds), and proxy headers from a load balancer. granian (a Rust server) and hypercorn (HTTP/2 and 3)
are the alternatives; neither is needed for a JSON API behind a load balancer, and the app runs on either.

At start the book is opened (with the SQLite book, the state folder is locked: one replica), creates cut off by a
crash are swept away, and the runner starts taking jobs; at a stop (SIGTERM, Ctrl-C) every job stops at a safe
point and its claim is let go, for another replica or the next start to resume.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._errors import JournalError, UsageError
from ..api._config import ApiConfig
from ..api._queue import connect
from ..state._gateway import GatewayBook, open_book
from ._keys import FILE as KEYS_FILE
from ._keys import KeyFile
from ._logs import JsonLog, route_server_logs
from ._metrics import Metrics
from ._routes import Gateway
from ._runner import Runner
from ._settings import GatewaySettings

GRACEFUL = 30.0  # seconds a stopping server waits for requests in flight (a results stream, an upload)
KEEP_ALIVE = 75.0  # seconds an idle connection stays open: longer than load balancers' idle timeouts (60)
STALE = 3600.0  # seconds after which another replica's unfinished create is taken as cut off
T = TypeVar("T")


class _Book:
    """The book on a thread of its own: every call runs there, one at a time, off the event loop (a SQLite
    connection is used only by the thread that opened it, so the book is opened there too)."""

    def __init__(self, opener: Callable[[], GatewayBook]) -> None:
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-book")
        self.book = self.thread.submit(opener).result()

    async def __call__(self, fn: Callable[[GatewayBook], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, self.book)

    def now(self, fn: Callable[[GatewayBook], T]) -> T:
        """A call from outside any event loop (start-up, shutdown)."""
        return self.thread.submit(fn, self.book).result()

    def close(self) -> None:
        self.now(lambda b: b.close())
        self.thread.shutdown()


def build(settings: GatewaySettings, config: ApiConfig, *, log: JsonLog | None = None,
          clock: Callable[[], float] = time.time) -> Starlette:
    """The application: its book opened (and, SQLite, its state folder locked), its routes, its lifespan."""
    log = log or JsonLog()
    single = not settings.journal
    lock = _lock(settings.state_dir) if single else None
    calls = _Book(lambda: open_book(settings.state_dir, settings.journal, clock))
    keys = KeyFile(settings.state_dir / KEYS_FILE)
    runner = Runner(settings=settings, config=config, book=calls, keys=keys, log=log, single=single, clock=clock)
    gw = Gateway(settings, keys=keys, book=calls, runner=runner, metrics=Metrics(), log=log, clock=clock)
    _sweep(settings, calls.now(lambda b: b.known_ids()), single)
    if keys.empty():
        log("no_keys", hint="no client can call yet: add a key with `gatekeeper serve keys add TENANT`")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with connect(config) as conn:
                gw.conn = conn
                stop = anyio.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(runner.run, stop)
                    log("started", state_dir=str(settings.state_dir), replica=runner.owner,
                        journal="postgresql" if settings.journal else "sqlite")
                    yield
                    log("stopping", jobs=len(runner.jobs))
                    stop.set()
        finally:
            gw.judge.close()
            calls.close()
            if lock is not None:
                os.close(lock)

    return Starlette(routes=_routes(gw), lifespan=lifespan, exception_handlers={
        404: _fallback(gw, "unknown", gw.unknown), 405: _fallback(gw, "not_allowed", gw.not_allowed)})


def _routes(gw: Gateway) -> list[Route]:
    batch, one = "/v1/messages/batches", "/v1/messages/batches/{batch_id}"
    table: list[tuple[str, str, Any]] = [
        (batch, "POST", gw.create), (batch, "GET", gw.listing), (one, "GET", gw.retrieve), (one, "DELETE", gw.delete),
        (one + "/cancel", "POST", gw.cancel), (one + "/results", "GET", gw.results),
        ("/v1/models", "GET", gw.passthrough), ("/v1/models/{model_id:path}", "GET", gw.passthrough),
        ("/v1/messages/count_tokens", "POST", gw.passthrough),
        ("/metrics", "GET", gw.metrics_page), ("/healthz", "GET", gw.health),
    ]
    return [Route(path, gw.endpoint(path, handler), methods=[method]) for path, method, handler in table]


def _fallback(gw: Gateway, route: str, handler: Any) -> Callable[[Request, Exception], Any]:
    """An unknown route (404) or method (405), answered as the API answers them."""
    wrapped = gw.endpoint(route, handler)

    async def answer(request: Request, exc: Exception) -> Response:
        return await wrapped(request)

    return answer


def _lock(state_dir: Path) -> int:
    """One replica a state folder with the SQLite book (several need --journal postgresql://)."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(state_dir / "gateway.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot use the state folder {state_dir}: {exc.strerror}", setting="state_dir") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalError(f"another gateway serves {state_dir}; several replicas share a PostgreSQL --journal",
                           setting="state_dir") from None
    return fd


def _sweep(settings: GatewaySettings, known: set[str], single: bool) -> None:
    """Creates a crash cut off: spools being received, and batch folders whose batch was never recorded (all of
    them with one replica; another replica's only once they are an hour old: it may be receiving them now)."""
    import shutil

    cutoff = time.time() - (0 if single else STALE)
    for spool in settings.incoming.glob("create-*") if settings.incoming.is_dir() else []:
        if spool.stat().st_mtime <= cutoff:
            spool.unlink(missing_ok=True)
    batches = settings.state_dir / "batches"
    for folder in batches.iterdir() if batches.is_dir() else []:
        if folder.name not in known and folder.stat().st_mtime <= cutoff:
            shutil.rmtree(folder, ignore_errors=True)


def server(settings: GatewaySettings, config: ApiConfig, *, log: JsonLog | None = None) -> uvicorn.Server:
    """uvicorn serving the gateway on `settings.host`:`settings.port` (its `run()` blocks until SIGTERM or
    Ctrl-C; in a thread other than the main one it installs no signal handlers: set `should_exit` to stop it)."""
    log = log or JsonLog()
    route_server_logs(log)
    app = build(settings, config, log=log)
    return uvicorn.Server(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=None, access_log=False, proxy_headers=True,
        forwarded_allow_ips=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"), server_header=False,
        timeout_graceful_shutdown=int(GRACEFUL), timeout_keep_alive=int(KEEP_ALIVE), lifespan="on"))


def bound_port(srv: uvicorn.Server) -> int | None:
    """The port a started server listens on (for --port 0)."""
    for s in getattr(srv, "servers", []):
        for sock in s.sockets:
            return int(sock.getsockname()[1])
    return None
