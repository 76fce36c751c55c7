"""Offline rehearsal: run `gatekeeper submit` on the bundled example against the fake API.

Run: python examples/rehearse.py [INPUT]

It starts the fake Batches API on loopback (a 400-request queue ceiling, 100
requests processed per simulated second, the clock 20x real time), points the
environment at it, and runs the real command. With a real key you would run
just: gatekeeper submit examples/requests.jsonl
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gatekeeper.testing import FakeAPI, FakeConfig, Outcome

here = Path(__file__).resolve().parent
source = sys.argv[1] if len(sys.argv) > 1 else str(here / "requests.jsonl")


def outcome(custom_id: str, model: str, attempt: int) -> Outcome | None:
    # A few expire on their first try, to show resubmission.
    return Outcome("expired") if custom_id.endswith("7") and attempt == 1 else None


config = FakeConfig(ceiling=400, rate=100, speed=20, workspaces={"rehearsal-key": "wrkspc_1"},
                    admin_keys={"rehearsal-admin-key"}, outcome=outcome)
# A folder of its own that outlives the rehearsal, so the results it names are still there to read.
state = tempfile.mkdtemp(prefix="gatekeeper-rehearsal-")
with FakeAPI(config) as fake:
    env = {**os.environ, "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "rehearsal-key",
           "ANTHROPIC_ADMIN_KEY": "rehearsal-admin-key"}
    print(f"fake Batches API on {fake.url}; state in {state}", file=sys.stderr)
    # The real command, as a pipeline runs it:
    code = subprocess.call([sys.executable, "-m", "gatekeeper", "submit", source, "--state", state, "--interval", "0.5"], env=env)
    r = fake.org.records
    print(f"\nthe fake saw: {r.creates} creates, {len(r.refusals)} refusals, deepest queue {r.max_depth} "
          f"(ceiling {config.ceiling}), {r.succeeded_twice} requests that succeeded twice", file=sys.stderr)
print(f"results kept in {Path(state) / 'results.jsonl'} (report: gatekeeper report --state {state}); "
      f"delete {state} when done", file=sys.stderr)
sys.exit(code)
