"""The fake API as a process of its own, for benchmarks that measure gatekeeper apart from the fake's own work."""

from __future__ import annotations

import json
import subprocess
import sys


def start_fake(*options: str) -> tuple[subprocess.Popen[str], str]:
    """`gatekeeper fake-api OPTIONS --json` started; the process and its URL (read from the JSON it prints)."""
    proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", *options, "--json"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    text = ""
    while True:  # (one JSON object, over several lines)
        line = proc.stdout.readline()
        if not line:
            sys.exit(f"fake-api exited ({proc.wait()}) before saying where it serves")
        text += line
        try:
            return proc, json.loads(text)["url"]
        except ValueError:
            continue
