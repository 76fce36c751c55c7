"""Structured logs: one JSON object a line on standard error, what a log collector ingests as it is.

Each line has `at` (RFC 3339), `event` and the event's fields: a request served (method, route, status, tenant,
bytes, seconds, request_id), a job's events (the library's own: planned, created, ended, retrying, finished), a
replica's claims. Never a header, a key or a body: a client's key is only ever hashed (`_keys`), the upstream's
credentials never leave `api/`, and the library's events carry none. The server's own messages (uvicorn's) are
written the same way.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson


class JsonLog:
    """`log(event, **fields)`: one line, flushed (a container's log driver reads it as it comes)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def __call__(self, event: str, **fields: Any) -> None:
        stream = self.stream or sys.stderr
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
        line = orjson.dumps({"at": at, "event": event, **fields}, default=str, option=orjson.OPT_NON_STR_KEYS)
        stream.write(line.decode() + "\n")
        stream.flush()


class _Handler(logging.Handler):
    """The server's log records as our lines (`server`, with its level and message)."""

    def __init__(self, log: JsonLog) -> None:
        super().__init__()
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log("server", level=record.levelname.lower(), message=record.getMessage())
        except Exception:  # (a log line must never take the server down)
            self.handleError(record)


def route_server_logs(log: JsonLog) -> None:
    """uvicorn's messages (startup, shutdown, errors) as JSON lines; its access log is ours (`request` lines)."""
    handler = _Handler(log)
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
