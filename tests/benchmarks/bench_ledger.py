"""Three submitters in three workspaces against one ceiling: without a ledger (--ledger none), through this host's
(the default) and through a shared one.

Usage: python tests/benchmarks/bench_ledger.py [--redis redis://127.0.0.1:6379/0]

Without --redis a throwaway redis-server is started from PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.scenarios import three_submitters


def local_redis() -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = shutil.which("redis-server") or sys.exit("no redis-server: apt-get install redis-server")
    proc = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return f"redis://127.0.0.1:{port}/0", proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis", default=None)
    a = ap.parse_args()
    server = None
    url = a.redis
    if url is None:
        url, server = local_redis()
    try:
        # (the host's ledger is the default: three submitters on one machine share it, whatever their workspaces)
        for label, ledger in (("no ledger", "none"), ("host ledger", None), ("redis ledger", url)):
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["GATEKEEPER_HOME"] = os.path.join(tmp, "home")  # (a state folder of its own)
                t0 = time.monotonic()
                out = three_submitters(Path(tmp), ledger=ledger)
                print(f"{label:>12}: queue-full refusals {out.refusals}; deepest queue {out.max_depth} (ceiling "
                      f"{out.ceiling}); exit codes {out.codes}; succeeded {[s.get('succeeded') for s in out.summaries]}; "
                      f"succeeded twice {out.succeeded_twice}; wall {time.monotonic() - t0:.1f} s")
    finally:
        if server:
            server.terminate()


if __name__ == "__main__":
    main()
