"""`gatekeeper serve`: the gateway that speaks the Message Batches API (gatekeeper.gateway), and `serve keys`, its
clients' keys."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import socket
import sys
from pathlib import Path

from .._errors import ExitCode, UsageError
from ._common import api_config, json_line, print_json

EXTRA = ("starlette", "uvicorn", "msgspec", "prometheus_client")


def cmd_serve(args: argparse.Namespace) -> int:
    if args.serve_command == "keys":
        return _keys(args)
    missing = [m for m in EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"gatekeeper serve needs the gateway extra ({', '.join(missing)} missing): "
                         "pip install 'gatekeeper-batches[gateway]'")
    from ..gateway._server import server
    from ..gateway._settings import GatewaySettings

    settings = GatewaySettings(
        state_dir=_state_dir(args), host=args.host, port=args.port, journal=args.journal, ledger=args.ledger,
        public_url=args.public_url, dedup_window=args.dedup_window, interval=args.interval, lease_ttl=args.lease_ttl,
        reconcile_grace=args.reconcile_grace,
        ceiling=args.ceiling, margin=args.margin, max_attempts=args.max_attempts, max_rpm=args.max_rpm,
        max_jobs=args.max_jobs, ledger_ttl=args.ledger_ttl)
    config = api_config(args)
    sock = _listen(settings.host, settings.port)
    srv = server(settings, config)
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    if args.json:
        print(json_line({"url": url, "state_dir": str(settings.state_dir)}), flush=True)
    else:
        print(f"serving the Message Batches API on {url} (state {settings.state_dir}); SIGTERM or Ctrl-C stops it",
              flush=True)
    try:
        srv.run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # (uvicorn stopped gracefully, then handed the signal on)
    return ExitCode.OK


def _state_dir(args: argparse.Namespace) -> Path:
    """--state, GATEKEEPER_STATE, else the user's state folder's gateway/."""
    if args.state:
        return Path(args.state)
    from ..state._home import state_home

    return state_home(os.environ) / "gateway"


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound here (so a port in use is one line, and --port 0 is known before it serves)."""
    sock = None
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(2048)
    except OSError as exc:
        if sock is not None:
            sock.close()
        # (in use or refused: the port's; an address not of this machine, or no such name: the host's)
        setting = "port" if exc.errno in (errno.EADDRINUSE, errno.EACCES) else "host"
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", setting=setting) from None
    return sock


def _keys(args: argparse.Namespace) -> int:
    from ..gateway._keys import FILE, KeyFile

    keys = KeyFile(_state_dir(args) / FILE)
    if args.keys_command == "add":
        key = keys.add(args.tenant, priority=args.priority, share=args.share)
        if args.json:
            print_json({"tenant": args.tenant, "key": key})
        else:
            print(key)
            print(f"gatekeeper: a key for {args.tenant}, shown once ({keys.path} keeps only its hash): give it to the "
                  "client as its ANTHROPIC_API_KEY", file=sys.stderr)
        return ExitCode.OK
    if args.keys_command == "remove":
        removed = keys.remove(args.ref)
        if args.json:
            print_json({"removed": removed})
        else:
            print(f"{removed} key(s) removed")
        return ExitCode.OK if removed else ExitCode.FINDINGS
    listing = keys.listing()
    if args.json:
        print_json(listing)
    else:
        for k in listing:
            print(f"{k['id']}  {k['tenant']:<20} {k['hint']:<14} {k['created_at']}  {k.get('priority', 'normal')} "
                  f"share {k.get('share', 1.0):g}")
    return ExitCode.OK
