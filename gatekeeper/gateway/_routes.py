"""The routes, as the API serves them: the six Message Batches endpoints, the Models API and token counting passed
through, and the gateway's own `/metrics` and `/healthz`.

Every answer carries a `request-id`; every refusal is the API's envelope (`{"type": "error", "error": {"type",
"message"}, "request_id"}`) with its status: a missing anthropic-version 400, a wrong key 401, another tenant's
batch (or none) 404, an invalid create 400 naming the request. A tenant sees only its own batches.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from .._errors import GatekeeperError, GatewayRefusal
from .._wire import BOTH_CURSORS
from ..api._queue import Connection
from ..state._gateway import BatchRecord
from ._create import BookCall, Judge, create, version_of
from ._keys import KeyFile, Tenant
from ._logs import JsonLog
from ._metrics import CONTENT_TYPE, Metrics
from ._proxy import forward, read_body
from ._runner import Runner
from ._settings import GatewaySettings
from ._wire import NOT_FOUND, batch_json, error_body, new_id, page_json, stamp

READ_SIZE = 1 << 20  # bytes a results stream reads from its files at a time
QUIET = ("/metrics", "/healthz")  # routes a scraper or a probe calls every few seconds: logged only when they fail
Handler = Callable[[Request, str], Awaitable[Response]]


class Gateway:
    """What every route needs: the settings, the keys, the book, the runner, the upstream connection, the metrics
    and the log. Its methods are the endpoints; `endpoint(route, handler)` wraps one."""

    def __init__(self, settings: GatewaySettings, *, keys: KeyFile, book: BookCall[Any], runner: Runner,
                 metrics: Metrics, log: JsonLog, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.keys = keys
        self.book = book
        self.runner = runner
        self.metrics = metrics
        self.log = log
        self.clock = clock
        self.conn: Connection | None = None  # the upstream, opened by the server's lifespan
        self.judge = Judge()

    # -- around every route ----------------------------------------------------------

    def endpoint(self, route: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """`handler` with a request id, its refusals as the API's envelope, a log line and its metrics."""
        async def serve(request: Request) -> Response:
            rid = new_id("req_")
            started = time.monotonic()
            refused: dict[str, str] = {}
            try:
                response = await handler(request, rid)
            except GatewayRefusal as exc:
                response = self.refusal(exc.status, str(exc), rid, exc.error_type, exc.code, exc.details)
                refused["error"] = str(exc)
            except ClientDisconnect:  # (an upload cut off: its spool is gone, nobody reads this answer)
                response = self.refusal(400, "the client disconnected before the body was whole", rid)
                refused["error"] = "client disconnected"
            except Exception as exc:  # the book's database away, or a bug: the API's 500 (the SDK retries it), said in the log
                response = self.refusal(500, "Internal server error", rid)
                refused["error"] = f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, GatekeeperError):
                    self.log("bug", request_id=rid, traceback=traceback.format_exc())
            response.headers["request-id"] = response.headers.get("request-id") or rid
            elapsed = time.monotonic() - started
            self.metrics.requests.labels(route, str(response.status_code)).inc()
            self.metrics.seconds.labels(route).observe(elapsed)
            if route not in QUIET or response.status_code >= 400:
                self.log("request", method=request.method, route=route, status=response.status_code,
                         tenant=getattr(request.state, "tenant", None), seconds=round(elapsed, 4), request_id=rid, **refused)
            return response

        return serve

    @staticmethod
    def refusal(status: int, message: str, rid: str, error_type: str | None = None, code: str | None = None,
                details: dict[str, Any] | None = None) -> Response:
        return Response(error_body(status, message, rid, error_type, code, details), status,
                        media_type="application/json", headers={"request-id": rid})

    def tenant(self, request: Request) -> Tenant:
        """Who calls: the key (x-api-key, or a Bearer token as the SDK sends it) checked against the keys file; the
        API's 400 without anthropic-version, its 401 for a wrong key."""
        if not request.headers.get("anthropic-version"):
            raise GatewayRefusal(400, "anthropic-version: header is required")
        key = request.headers.get("x-api-key")
        auth = request.headers.get("authorization") or ""
        if not key and auth[:7].lower() == "bearer ":
            key = auth[7:]
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            raise GatewayRefusal(401, "invalid x-api-key")
        request.state.tenant = tenant.name
        return tenant

    def base_url(self, request: Request) -> str:
        return self.settings.public_url or str(request.base_url)

    @staticmethod
    def json(obj: Any, status: int = 200) -> Response:
        return Response(orjson.dumps(obj), status, media_type="application/json")

    async def _mine(self, request: Request) -> BatchRecord:
        """The batch the path names, when it is the caller's; the API's 404 otherwise (another tenant's included)."""
        tenant = self.tenant(request)
        batch_id = request.path_params["batch_id"]
        record: BatchRecord | None = await self.book(lambda b: b.get(tenant.name, batch_id))
        if record is None:
            raise GatewayRefusal(404, NOT_FOUND)
        return record

    # -- the batch endpoints ---------------------------------------------------------------

    async def create(self, request: Request, rid: str) -> Response:
        tenant = self.tenant(request)
        self._refused_account()
        version = version_of(request.headers.get("anthropic-version"))
        try:
            done = await create(request.stream(), tenant=tenant.name, api_version=version,
                                idem_key=request.headers.get("idempotency-key"), now=self.clock(),
                                settings=self.settings, book=self.book, judged=self.judge)
        except GatewayRefusal:
            self.metrics.creates.labels("refused").inc()
            raise
        record = done.batch
        outcome = "created" if done.new else "repeated"
        self.metrics.creates.labels(outcome).inc()
        self.metrics.received.labels(outcome).inc(done.requests)
        self.metrics.received_bytes.labels(outcome).inc(done.bytes)
        if done.new:
            self.runner.wake()
        self.log("batch_created" if done.new else "batch_repeated", batch=record.id, tenant=tenant.name,
                 requests=record.requests, bytes=record.bytes, received_s=done.received_s, judged_s=done.judged_s,
                 request_id=rid)
        return self.json(batch_json(record, self.base_url(request)))

    async def retrieve(self, request: Request, rid: str) -> Response:
        return self.json(batch_json(await self._mine(request), self.base_url(request)))

    async def listing(self, request: Request, rid: str) -> Response:
        tenant = self.tenant(request)
        q = request.query_params
        try:
            limit = int(q.get("limit", "20"))
        except ValueError:
            raise GatewayRefusal(400, "limit: Input should be a valid integer") from None
        if not 1 <= limit <= 1000:
            raise GatewayRefusal(400, "limit: Input should be between 1 and 1000")
        after, before = q.get("after_id") or None, q.get("before_id") or None
        if after and before:  # (a page runs one way from one cursor: the API refuses both)
            raise GatewayRefusal(400, BOTH_CURSORS)
        records, more = await self.book(lambda b: b.page(tenant.name, limit, after, before))
        return self.json(page_json(records, more, self.base_url(request)))

    async def cancel(self, request: Request, rid: str) -> Response:
        record = await self._mine(request)
        if record.status == "ended":
            raise GatewayRefusal(400, "Message batch has already ended and cannot be canceled.")
        updated = await self.book(lambda b: b.cancel(record.tenant, record.id))
        self.runner.cancel_now(record.id)
        self.log("batch_canceling", batch=record.id, tenant=record.tenant, request_id=rid)
        return self.json(batch_json(updated or record, self.base_url(request)))

    async def delete(self, request: Request, rid: str) -> Response:
        record = await self._mine(request)
        if record.status != "ended" or not await self.book(lambda b: b.delete(record.tenant, record.id)):
            raise GatewayRefusal(400, "Message batches can only be deleted once they have finished processing.")
        await anyio.to_thread.run_sync(_remove_tree, self.settings.batch_dir(record.id))
        self.log("batch_deleted", batch=record.id, tenant=record.tenant, request_id=rid)
        return self.json({"id": record.id, "type": "message_batch_deleted"})

    async def results(self, request: Request, rid: str) -> Response:
        record = await self._mine(request)
        if record.status != "ended":
            raise GatewayRefusal(404, "results are not available until the batch has ended")
        files = [self.settings.results_path(record.id), self.settings.unsent_path(record.id)]
        if not any(f.exists() for f in files):
            raise GatewayRefusal(404, "results are no longer available for this batch")
        return StreamingResponse(self._stream(files), media_type="application/x-jsonl")

    async def _stream(self, files: list[Path]) -> AsyncIterator[bytes]:
        """The job's results, then the lines of requests it never sent: one line a request, read a megabyte at a
        time (memory stays flat whatever the results' size)."""
        for path in files:
            try:
                f = await anyio.open_file(path, "rb")
            except FileNotFoundError:
                continue
            async with f:
                while chunk := await f.read(READ_SIZE):
                    self.metrics.results_bytes.inc(len(chunk))
                    yield chunk

    # -- passed through, and the gateway's own -------------------------------------------------

    async def passthrough(self, request: Request, rid: str) -> Response:
        self.tenant(request)
        assert self.conn is not None
        body = await read_body(request.stream()) if request.method == "POST" else None
        headers = {k.lower(): v for k, v in request.headers.items()}
        status, passed, content = await forward(self.conn, request.method, request.url.path, request.url.query, body,
                                                headers)
        return Response(content, status, headers=passed)

    async def metrics_page(self, request: Request, rid: str) -> Response:
        statuses = await self.book(lambda b: b.statuses())
        page = self.metrics.page(statuses, len(self.runner.jobs), self.runner.failures)
        return Response(page, media_type=CONTENT_TYPE)

    def _refused_account(self) -> None:
        """While the upstream refuses the account (on hold, a spend limit, billing), a create gets the API's own
        refusal: the client learns it at once, as from the API, instead of polling a batch that cannot move."""
        trouble = self.runner.trouble
        refusal = trouble.refuses(self.clock()) if trouble is not None else None
        if refusal is not None:
            raise GatewayRefusal(refusal.status, refusal.said or refusal.api_message, error_type=refusal.error_type,
                                 code=refusal.code, details=refusal.details)

    async def health(self, request: Request, rid: str) -> Response:
        """200 while the book answers (a probe restarts nothing for an upstream outage every replica shares);
        `degraded` with the latest job failure while no job has moved since."""
        await self.book(lambda b: b.statuses())  # (the book answers: the database is reachable)
        trouble = self.runner.trouble
        if trouble is None:
            return self.json({"status": "ok", "jobs_running": len(self.runner.jobs)})
        return self.json({"status": "degraded", "jobs_running": len(self.runner.jobs), "upstream_error": trouble.error,
                          "since": stamp(trouble.at)})

    async def unknown(self, request: Request, rid: str) -> Response:
        raise GatewayRefusal(404, f"no route for {request.method} {request.url.path}")

    async def not_allowed(self, request: Request, rid: str) -> Response:
        raise GatewayRefusal(405, f"{request.method} is not allowed on {request.url.path}", error_type="invalid_request_error")


def _remove_tree(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
