"""`gatekeeper exporter`: scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import ADMIN, WS1, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import gk, start


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    page = httpx.get(url, timeout=10).text
    assert WS1 not in page and ADMIN not in page  # no key in any label or value
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(page) for s in fam.samples}


def _wait_for(url: str, name: str, at_least: float, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        metrics = _scrape(url)
        if metrics.get((name, ()), -1) >= at_least:
            return metrics
        assert time.monotonic() < deadline, f"{name} never reached {at_least}: {metrics}"
        time.sleep(0.1)


def test_exporter_serves_the_queue_and_a_run(tmp_path: Path) -> None:
    """The ceiling, depth (all and per workspace), occupancy, live batches, the verdict, the run's figures; a reading
    that fails keeps the last values and counts an error."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"e{i}") for i in range(20)])
    with running_fake(ceiling=1000, rate=5000) as fake:
        assert gk(["submit", str(path), "--interval", "0.05", "--max-rpm", "60000", "--json"], env_for(fake)).returncode == 0
        fake.org.config.rate = 0.0  # the queue holds still while it is read
        fake.org.add_batch("wrkspc_1", 850)
        state = str(path) + ".gatekeeper"
        proc = start(["exporter", "--port", "0", "--interval", "1", "--json", "--state", state, "--max-rpm", "60000"],
                     env_for(fake))
        assert proc.stdout is not None
        url = orjson.loads(proc.stdout.readline())["url"]
        m = _wait_for(url, "gatekeeper_readings_total", 1)
        assert m[("gatekeeper_queue_ceiling_requests", ())] == 1000
        assert m[("gatekeeper_queue_depth_requests", ())] == 850
        assert m[("gatekeeper_queue_workspace_depth_requests", (("workspace", "ws1"),))] == 850
        assert m[("gatekeeper_queue_occupancy_ratio", ())] == 0.85
        assert m[("gatekeeper_queue_verdict", (("verdict", "queue-near-limit"),))] == 1
        assert m[("gatekeeper_queue_verdict", (("verdict", "queue-clear"),))] == 0
        run = (("run", Path(state).name),)
        assert m[("gatekeeper_run_requests", run)] == 20 and m[("gatekeeper_run_admitted_requests", run)] == 20
        assert m[("gatekeeper_run_final_requests", (*run, ("type", "succeeded")))] == 20
        assert m[("gatekeeper_run_cost_usd", run)] > 0
    # the fake is gone: readings fail, the last values stay, the error counter rises
    m = _wait_for(url, "gatekeeper_reading_errors_total", 1)
    assert m[("gatekeeper_queue_depth_requests", ())] == 850 and m[("gatekeeper_last_reading_age_seconds", ())] >= 0
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)  # (a stop under a loaded suite: seconds, not minutes)
    assert proc.returncode == 0 and "Traceback" not in err and "the last values are kept" in err


def test_exporter_reads_through_federation_with_tokens_shorter_than_its_life(tmp_path: Path) -> None:
    """Workload identity federation with tokens of 2 s and a rule over two workspaces: the exporter keeps reading
    both depths across several exchanges, and no access token nor identity token is in a page or its log."""
    from gatekeeper.testing import FakeFederation, FakeRule, identity_token

    fed = FakeFederation(rules={"fdrl_fake_1": FakeRule(workspaces=("wrkspc_1", "wrkspc_2"))}, token_life=2,
                         keys_refused=True)
    token_file = tmp_path / "token"
    token_file.write_text(identity_token())
    with running_fake(ceiling=1000, rate=0.0, federation=fed) as fake:
        fake.org.add_batch("wrkspc_1", 100)
        fake.org.add_batch("wrkspc_2", 250)
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_IDENTITY_TOKEN_FILE": str(token_file),
               "ANTHROPIC_FEDERATION_RULE_ID": "fdrl_fake_1", "ANTHROPIC_ORGANIZATION_ID": "org_fake_1",
               "ANTHROPIC_WORKSPACE_ID": "wrkspc_1", "ANTHROPIC_EXTRA_WORKSPACE_IDS": "wrkspc_2"}
        proc = start(["exporter", "--port", "0", "--interval", "1", "--json", "--ceiling", "1000"], env)
        assert proc.stdout is not None
        url = orjson.loads(proc.stdout.readline())["url"]
        m = _wait_for(url, "gatekeeper_readings_total", 4)
        pages = httpx.get(url, timeout=10).text
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert m[("gatekeeper_queue_depth_requests", ())] == 350 and m[("gatekeeper_reading_errors_total", ())] == 0
    assert len(fed.exchanges) >= 4 and {e["workspace"] for e in fed.exchanges} == {"wrkspc_1", "wrkspc_2"}
    secrets = [*fed.issued, token_file.read_text().strip()]
    assert proc.returncode == 0 and not any(s in pages + err for s in secrets)
