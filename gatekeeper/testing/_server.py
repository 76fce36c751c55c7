"""The fake API's HTTP side: a threaded stdlib server on loopback.

The wire follows the real API's as its SDK and docs show it: the error envelope with a
request id (the 413 without one), `request-id` on every response, x-api-key
or Bearer auth, Admin keys only on the Admin endpoints, results as JSONL with a
newline after every line and no blank line, in shuffled order.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from .._errors import UsageError
from . import _endpoints as batches
from ._aws import check
from ._google import refused as google_refused
from ._google import unprefixed
from ._model import FakeConfig, Organization
from ._oauth import bearer_workspace, token_endpoint
from ._realtime import Lane, serve_message
from ._wire import BATCH_ENDPOINTS, Fault, Faults, Wire, fake_token_count, prompt_of, version_refusal

__all__ = ["FakeAPI", "Fault", "fake_token_count", "prompt_of"]

IN_PROCESS_URL = "http://localhost"  # a fake served in process (no socket behind it: its transport answers)


class _Handler(Wire):
    """Dispatch: every request checked as the API checks it (route, faults, the RPM limit, version, key or
    signature), then handed to its endpoint in `ROUTES`."""

    server: _Server

    # -- dispatch -----------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        fake = self.server.fake
        self.pending_drop = False
        self.pending_delay = 0.0
        self.early_body = None
        if fake.config.google is not None and not self.server.results_only and unprefixed(self, fake.config.google):
            return
        endpoint, arg = self.route()
        with fake.org.lock:
            fake.org.records.requests_seen[endpoint] = fake.org.records.requests_seen.get(endpoint, 0) + 1
            fake.org.changed.notify_all()
        try:
            self._serve(endpoint, arg)
        finally:
            fake.org._changed()  # (what the request did: a create, a refusal, a batch processed on the way)

    def _serve(self, endpoint: str, arg: str | None) -> None:
        fake = self.server.fake
        if self.server.results_only:
            return batches.results_other_origin(self, endpoint, arg)
        if endpoint in BATCH_ENDPOINTS and self.rpm_refused():
            return
        if endpoint == "unknown":
            if self.command == "POST":
                self.read_body()
            return self.send_api_error(404, f"no route for {self.command} {urlsplit(self.path).path}")
        if self.injected(endpoint):
            return
        if endpoint == "token":
            return token_endpoint(self)
        key = self.api_key()
        if not self.headers.get("anthropic-version"):
            if self.command == "POST":
                self.read_body()
            return self.send_api_error(400, "anthropic-version: header is required")
        admin = endpoint in ("rate_limits", "workspace_rate_limits")
        cfg = fake.config
        if cfg.aws is not None:
            return self._serve_aws(endpoint, arg, admin)
        if cfg.google is not None:  # (a Google token and the route's permission: the workspace is the path's)
            return None if google_refused(self, cfg.google, endpoint, admin) else _google(self, endpoint, arg, admin)
        if admin:
            if key not in cfg.admin_keys:
                return self.send_api_error(401, "invalid x-api-key")
            return workspace_rate_limits(self, arg) if endpoint == "workspace_rate_limits" else org_rate_limits(self)
        workspace = self._workspace_of(key)
        if not isinstance(workspace, str):
            if self.command == "POST":
                self.read_body()
            return self.send_api_error(*workspace)
        ROUTES[endpoint](self, workspace, arg)

    def _workspace_of(self, key: str | None) -> str | tuple[int, str]:
        """The workspace a call acts on, by its key or bearer token; or (status, why) it is refused."""
        cfg = self.server.fake.config
        fed = cfg.federation
        if key in cfg.workspaces:
            if fed is not None and fed.keys_refused:
                return 401, "API keys are not accepted by this organization: use workload identity federation"
            return cfg.workspaces[key]
        if fed is not None and key and self.headers.get("x-api-key") is None:
            return bearer_workspace(self, fed, key)
        return 401, "invalid x-api-key"

    def _serve_aws(self, endpoint: str, arg: str | None, admin: bool) -> None:
        """Claude Platform on AWS: the signature (or a short-term key) and the workspace checked, no Admin API."""
        aws = self.server.fake.config.aws
        assert aws is not None
        body = self.read_body() if self.command in ("POST", "PUT") else b""
        self.early_body = body  # (`_read_body` hands it to the endpoint: the stream was read to check the signature)
        if admin:
            return self.send_api_error(403, "User is not authorized to perform this action: no IAM action covers the Admin API",
                               error_type="permission_error")
        url = f"http://{self.headers.get('host')}{self.path}"
        why = check(aws, self.command, url, {k.lower(): v for k, v in self.headers.items()}, body or b"")
        if why is not None:
            aws.refused.append(why)
            status = 400 if why.startswith("anthropic-workspace-id") else 403
            return self.send_api_error(status, why, error_type="invalid_request_error" if status == 400 else "permission_error")
        ROUTES[endpoint](self, aws.workspace, arg)


def _google(h: _Handler, endpoint: str, arg: str | None, admin: bool) -> None:
    """Claude on Google Cloud, the call accepted: the organization's rate limits, or the workspace's route."""
    google = h.server.fake.config.google
    assert google is not None
    if admin:
        return workspace_rate_limits(h, arg) if endpoint == "workspace_rate_limits" else org_rate_limits(h)
    return ROUTES[endpoint](h, google.workspace, arg)


# -- models, token counting, messages, admin -------------------------------------

def _models_down(h: Wire) -> bool:
    mode = h.server.fake.config.models_api
    if mode == "ok":
        return False
    if h.command == "POST":
        h.read_body()
    h.send_api_error(int(mode), "Not Found" if mode == "404" else "Internal server error")
    return True


def model(h: Wire, workspace: str, name: str | None) -> None:
    if _models_down(h):
        return
    m = h.server.fake.config.model(name or "")
    if m is None:
        return h.send_api_error(404, f"model: {name}")
    h.send_json(200, m.to_json())


def models(h: Wire, workspace: str, _: str | None) -> None:
    if _models_down(h):
        return
    q = parse_qs(urlsplit(h.path).query)
    limit = int((q.get("limit") or ["20"])[0])
    if not 1 <= limit <= 1000:
        return h.send_api_error(400, "limit: Input should be between 1 and 1000")
    models = sorted(h.server.fake.config.models, key=lambda m: m.created_at, reverse=True)  # newest first
    after = (q.get("after_id") or [""])[0]
    ids = [m.id for m in models]
    start = ids.index(after) + 1 if after in ids else 0
    page = [m.to_json() for m in models[start:start + limit]]
    h.send_json(200, {"data": page, "has_more": start + limit < len(models),
                     "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None})


def messages(h: Wire, workspace: str, _: str | None) -> None:
    serve_message(h, workspace)


def count_tokens_endpoint(h: Wire, workspace: str, _: str | None) -> None:
    if _models_down(h):
        return
    raw = h.read_body() or b""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return h.send_api_error(400, "request body is not valid JSON")
    if not isinstance(body, dict) or h.server.fake.config.model(str(body.get("model") or "")) is None:
        return h.send_api_error(404 if isinstance(body, dict) else 400, f"model: {body.get('model') if isinstance(body, dict) else ''}")
    refused = version_refusal(h.headers.get("anthropic-version"), body)
    if refused:
        return h.send_api_error(400, refused)
    h.send_json(200, {"input_tokens": fake_token_count(body)})


def org_rate_limits(h: Wire) -> None:
    cfg = h.server.fake.config
    rt = cfg.realtime
    entries: list[dict[str, Any]] = [{
        "type": "rate_limit", "id": "rl_01ModelGroupAll00000000", "group_type": "model_group",
        "group": {"id": "rlg_01ModelGroupAll0000000", "type": "model_group", "display_name": "Every model"},
        "models": [m.id for m in cfg.models],
        "limits": [{"type": "requests_per_minute", "value": rt.rpm},
                   {"type": "input_tokens_per_minute_cache_aware" if rt.cache_aware else "input_tokens_per_minute",
                    "value": rt.itpm},
                   {"type": "output_tokens_per_minute", "value": rt.otpm}],
    }]
    if cfg.ceiling is not None:
        entries.append({
            "type": "rate_limit", "id": "rl_01BatchGroup00000000000", "group_type": "batch",
            "group": {"id": "rlg_01BatchGroup0000000000", "type": "batch"}, "models": None,
            "limits": [{"type": "requests_per_minute", "value": 4000},
                       {"type": "enqueued_batch_requests", "value": cfg.ceiling}],
        })
    q = parse_qs(urlsplit(h.path).query)
    group_type = (q.get("group_type") or [""])[0]
    if group_type:
        entries = [e for e in entries if e["group_type"] == group_type]
    size = cfg.rate_limit_page_size
    if size:
        token = (q.get("page") or [""])[0]
        if not token and cfg.rate_limit_empty_first_page:
            return h.send_json(200, {"data": [], "next_page": "p0"})  # clients must follow next_page
        start = int(token.removeprefix("p")) if token else 0
        nxt = f"p{start + size}" if start + size < len(entries) else None
        return h.send_json(200, {"data": entries[start:start + size], "next_page": nxt})
    h.send_json(200, {"data": entries, "next_page": None})


def workspace_rate_limits(h: Wire, workspace_id: str | None) -> None:
    h.send_json(200, {"data": [], "next_page": None})


Endpoint = Callable[[Wire, str, "str | None"], None]  # (the handler, the caller's workspace, the path's argument)
ROUTES: dict[str, Endpoint] = {
    "create": batches.create, "retrieve": batches.retrieve, "list": batches.list_batches, "cancel": batches.cancel,
    "delete": batches.delete, "results": batches.results, "model": model, "models": models,
    "count_tokens": count_tokens_endpoint, "messages": messages,
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # the API's servers never refuse a connection for want of a listen queue; socketserver's default of 5 did, under
    # load, to 64 real-time calls opened at once: the kernel reset a dozen of them after their bytes were sent, and
    # each was counted (rightly) as a possible double charge
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client that died mid-answer (the crash tests kill them on purpose)
        super().handle_error(request, client_address)

    def __init__(self, addr: tuple[str, int], fake: FakeAPI, results_only: bool = False) -> None:
        super().__init__(addr, _Handler)
        self.fake = fake
        self.results_only = results_only


def _listen(host: str, port: int, fake: FakeAPI, results_only: bool = False) -> _Server:
    """A bound server; the socket's errors (a port in use, out of range, no such address) as one `UsageError`."""
    try:
        return _Server((host, port), fake, results_only)
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"the fake API cannot listen on {host}:{port}: {reason}", setting="port") from exc


class FakeAPI:
    """A fake Message Batches + rate-limits API on loopback. Use as a context manager::

        with FakeAPI(FakeConfig(ceiling=300_000)) as fake:
            client = anthropic.Anthropic(base_url=fake.url, api_key="test-key-ws1")

    `fake.org.records` holds what a test judges a client by; `fake.faults`
    takes `Fault`s; `fake.org.advance(seconds)` jumps the clock; `clock` (real seconds, monotonic by default) is
    the one every time of the fake is read from, so a test can drive it (listing lag, 404 windows, the RPM window,
    the real-time lane's buckets). `epoch`: the wall time its clock starts at (now, by default). With `listen`
    False no socket is opened: the fake is served in process (`InProcess`, an httpx transport) at `IN_PROCESS_URL`.
    """

    def __init__(self, config: FakeConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 clock: Callable[[], float] = time.monotonic, epoch: float | None = None, listen: bool = True) -> None:
        self.config = config or FakeConfig()
        self.org = Organization(self.config, clock, epoch=epoch)
        self.faults = Faults()
        self.id_rng = random.Random(self.config.seed + 1)
        self.cut_results_after: int | None = None  # reset the next results stream midway (any value)
        self.rpm_calls: deque[float] = deque()
        self.realtime = Lane(self.config.realtime, clock, self.org.wall)
        self._server = _listen(host, port, self) if listen else None
        self._other: _Server | None = None
        if listen and (self.config.results_origin != "self" or self.config.results_redirect
                       or self.config.google is not None):  # (Google's: results_url names Anthropic's host)
            self._other = _listen(host, 0, self, results_only=True)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        if self._server is None:
            return IN_PROCESS_URL
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def results_base(self) -> str:
        if self._other is None or self.config.results_redirect:
            return self.url
        host, port = self._other.server_address[:2]
        return f"http://localhost:{port}"  # another origin: a different host name and port

    def inject(self, *faults: Fault) -> None:
        with self.faults.lock:
            self.faults.items.extend(faults)

    def start(self) -> FakeAPI:
        for srv in (self._server, self._other):
            if srv is not None:
                t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._server, self._other):
            if srv is not None:
                srv.shutdown()
                srv.server_close()

    def __enter__(self) -> FakeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

