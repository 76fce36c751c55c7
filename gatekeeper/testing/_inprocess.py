"""The fake served in process: an httpx transport that hands each request to the fake's own handler (the same
dispatch, faults, limits and endpoints as over a socket) and returns its answer; no socket, no thread.

As rough as the wire: a dropped connection is an httpx error (`RemoteProtocolError` before any byte of an answer,
`ReadError` after the part of a body that came), and the request's read timeout holds (an answer held back longer
is a `ReadTimeout`). The fake's own waits (a delayed answer, the real-time lane's latency) pass on the clock the
transport is given, after the handler has served: an answer in flight says what was true when it was served, never
fresher (a delay fault that the socket server sleeps before serving is, here, a late answer).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from ._server import FakeAPI, _Handler

Sleep = Callable[[float], Awaitable[None]]
PIECE = 1 << 16  # bytes a body is handed over in (a stream read in pieces, as from a socket)


class _Stand:
    """What a handler reads of its server."""

    def __init__(self, fake: FakeAPI) -> None:
        self.fake = fake
        self.results_only = False


class _Served(_Handler):
    """One request served from memory: its bytes in, the answer's bytes out, its waits and a drop noted."""

    def __init__(self, stand: _Stand, raw: bytes) -> None:  # (the stdlib's own __init__ serves a socket)
        self.server = stand  # type: ignore[assignment]
        self.rfile = io.BytesIO(raw)
        self.out = self.wfile = io.BytesIO()
        self.client_address = ("127.0.0.1", 0)
        self.close_connection = True
        self.waits: list[float] = []
        self.dropped = False

    def pause(self, seconds: float) -> None:
        self.waits.append(seconds)

    def drop(self) -> None:
        self.dropped = True
        self.close_connection = True


class _Body(httpx.AsyncByteStream):
    def __init__(self, body: bytes, broken: httpx.Request | None) -> None:
        self.body, self.broken = body, broken

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.body), PIECE):
            yield self.body[i:i + PIECE]
        if self.broken is not None:
            raise httpx.ReadError("the connection was reset midway through the answer", request=self.broken)


class InProcess(httpx.AsyncBaseTransport):
    """`fake` (made with `listen=False`) as an httpx transport; its waits on `sleep`. `gate`, called before each
    request, may refuse it by raising (a simulation's killed process has no network)."""

    def __init__(self, fake: FakeAPI, sleep: Sleep, gate: Callable[[httpx.Request], None] | None = None) -> None:
        self.stand = _Stand(fake)
        self.sleep = sleep
        self.gate = gate

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.gate is not None:
            self.gate(request)
        body = await request.aread()
        served = _Served(self.stand, _request_bytes(request, body))
        served.handle_one_request()
        await self._wait(request, sum(served.waits))
        return _response(request, served.out.getvalue(), served.dropped)

    async def _wait(self, request: httpx.Request, seconds: float) -> None:
        read = (request.extensions.get("timeout") or {}).get("read")
        if read is not None and seconds > read:
            await self.sleep(read)
            raise httpx.ReadTimeout("no answer within the read timeout", request=request)
        if seconds > 0:
            await self.sleep(seconds)


def _request_bytes(request: httpx.Request, body: bytes) -> bytes:
    """The request as HTTP/1.1 puts it on the wire (its body whole, by length)."""
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
    for name, value in request.headers.raw:
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(name + b": " + value)
    lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _response(request: httpx.Request, out: bytes, dropped: bool) -> httpx.Response:
    """The handler's bytes as an httpx answer: a body that ends short of its length (or its last chunk) after a
    drop breaks where the connection did."""
    head, sep, rest = out.partition(b"\r\n\r\n")
    if not sep:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
    status_line, *header_lines = head.split(b"\r\n")
    headers = [(n.strip(), v.strip()) for n, _, v in (h.partition(b":") for h in header_lines)]
    named = {n.lower(): v for n, v in headers}
    if named.get(b"transfer-encoding", b"").lower() == b"chunked":
        body, complete = _dechunk(rest)
    else:
        length = int(named.get(b"content-length", b"0"))
        body, complete = rest[:length], len(rest) >= length
    broken = request if dropped and not complete else None
    return httpx.Response(int(status_line.split()[1]), headers=headers, stream=_Body(body, broken), request=request)


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    """A chunked body's content, and whether its last chunk came."""
    parts: list[bytes] = []
    pos = 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return b"".join(parts), False
        size = int(data[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return b"".join(parts), True
        parts.append(data[end + 2:end + 2 + size])
        if end + 2 + size > len(data):
            return b"".join(parts), False
        pos = end + 2 + size + 2
