"""`gatekeeper status` through real HTTP against the fake, reproducing the seed script's figures."""

from __future__ import annotations

import orjson
import pytest

from gatekeeper.cli._cli import main
from tests.fakes import WS1, WS2, env_for, running_fake


def _seed_queue(fake) -> None:
    fake.org.add_batch("wrkspc_1", 5, status="ended")
    fake.org.add_batch("wrkspc_1", 214_900)
    fake.org.add_batch("wrkspc_1", 58_400)
    fake.org.add_batch("wrkspc_1", 9_600, status="canceling")


def _status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str], *args: str) -> tuple[int, dict]:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main(["status", "--json", *args])
    out = capsys.readouterr().out
    return code, orjson.loads(out) if out else {}


@pytest.fixture
def seeded():
    with running_fake(ceiling=300_000, rate=0.0, speed=0.0) as fake:
        _seed_queue(fake)
        yield fake


def test_near_limit_at_80(seeded, monkeypatch, capsys) -> None:
    """Depth 282,900 of 300,000: remaining 17,100, 94%, queue-near-limit at threshold 80 (exit 1)."""
    code, out = _status(monkeypatch, capsys, env_for(seeded))
    assert code == 1
    assert out["verdict"] == "queue-near-limit"
    assert (out["ceiling"], out["depth"], out["remaining"]) == (300_000, 282_900, 17_100)
    assert round(out["occupancy"] * 100) == 94
    assert [b["processing"] for b in out["batches"]] == [214_900, 58_400, 9_600]
    assert out["batches"][2]["status"] == "canceling"
    assert out["workspaces"] == 1
    assert any("up to 100,000 requests or 256 MB" in line and "gatekeeper sizes its own" in line for line in out["repair"])


def test_clear_at_95(seeded, monkeypatch, capsys) -> None:
    """The same queue is queue-clear at threshold 95 (exit 0)."""
    code, out = _status(monkeypatch, capsys, env_for(seeded), "--threshold", "95")
    assert (code, out["verdict"]) == (0, "queue-clear")


def test_exhausted_at_ceiling(monkeypatch, capsys) -> None:
    """Depth at the ceiling is queue-exhausted."""
    with running_fake(ceiling=300_000, rate=0.0, speed=0.0) as fake:
        fake.org.add_batch("wrkspc_1", 300_000)
        code, out = _status(monkeypatch, capsys, env_for(fake))
        assert (code, out["verdict"], out["remaining"]) == (1, "queue-exhausted", 0)


def test_limit_unknown_without_admin_key(seeded, monkeypatch, capsys) -> None:
    """No Admin key and no --ceiling: queue-limit-unknown, with nulls rather than zeros."""
    code, out = _status(monkeypatch, capsys, env_for(seeded, admin=False))
    assert (code, out["verdict"]) == (1, "queue-limit-unknown")
    assert out["ceiling"] is None and out["remaining"] is None and out["occupancy"] is None
    assert out["depth"] == 282_900
    code, out = _status(monkeypatch, capsys, env_for(seeded, admin=False), "--ceiling", "400000")
    assert (out["verdict"], out["ceiling_source"], out["remaining"]) == ("queue-clear", "--ceiling", 117_100)


def test_missing_batch_group_is_unknown_not_zero(monkeypatch, capsys) -> None:
    """An Admin answer without the batch group means unknown, never a ceiling of zero."""
    with running_fake(ceiling=None, rate=0.0, speed=0.0) as fake:
        code, out = _status(monkeypatch, capsys, env_for(fake))
        assert out["verdict"] == "queue-limit-unknown" and out["ceiling"] is None


def test_duplicate_key_not_double_counted(seeded, monkeypatch, capsys) -> None:
    """The same key twice (primary and extra) counts its workspace once."""
    code, out = _status(monkeypatch, capsys, env_for(seeded, keys=(WS1, WS1, f" {WS1} ")))
    assert (out["depth"], out["workspaces"]) == (282_900, 1)


def test_second_workspace_adds_its_depth(seeded, monkeypatch, capsys) -> None:
    """A second workspace's key adds what that workspace holds."""
    seeded.org.add_batch("wrkspc_2", 7_000)
    code, out = _status(monkeypatch, capsys, env_for(seeded))
    assert out["depth"] == 282_900
    code, out = _status(monkeypatch, capsys, env_for(seeded, keys=(WS1, WS2)))
    assert (out["depth"], out["workspaces"], out["verdict"]) == (289_900, 2, "queue-near-limit")
    assert {b["workspace"] for b in out["batches"]} == {"ws1", "ws2"}


def test_more_than_1000_live_batches_across_pages(monkeypatch, capsys) -> None:
    """Over 1,000 live batches are read across list pages."""
    with running_fake(ceiling=300_000, rate=0.0, speed=0.0) as fake:
        for _ in range(1_203):
            fake.org.add_batch("wrkspc_1", 2)
        code, out = _status(monkeypatch, capsys, env_for(fake))
        assert (out["depth"], len(out["batches"])) == (2_406, 1_203)
        assert fake.org.records.requests_seen["list"] == 2


def test_no_workspace_key_is_config_error(monkeypatch, capsys) -> None:
    """Without ANTHROPIC_API_KEY: exit 2 and one line naming the variable."""
    code = main(["status"])
    err = capsys.readouterr().err
    assert code == 2 and "ANTHROPIC_API_KEY" in err and err.count("\n") == 1


def test_refused_key_named_by_position_never_by_value(seeded, monkeypatch, capsys) -> None:
    """A key the API refuses: exit 2, the message names its position and never the key."""
    secret = "not-a-real-key-5f2e9c"
    for k, v in env_for(seeded, keys=(WS1, secret)).items():
        monkeypatch.setenv(k, v)
    code = main(["status"])
    captured = capsys.readouterr()
    assert code == 2
    assert "workspace key 2" in captured.err
    assert secret not in captured.err + captured.out


def test_human_output(seeded, monkeypatch, capsys) -> None:
    """The human report leads with the verdict and carries measured, inferred and repair lines."""
    for k, v in env_for(seeded).items():
        monkeypatch.setenv(k, v)
    assert main(["status"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("queue-near-limit")
    assert "measured:" in text and "inferred:" in text and "repair:" in text


def test_refused_admin_key_is_config_error(seeded, monkeypatch, capsys) -> None:
    """An Admin key the rate-limits API refuses is a configuration error (exit 2), the key never shown."""
    env = env_for(seeded)
    env["ANTHROPIC_ADMIN_KEY"] = "not-an-admin-key-31"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main(["status"])
    captured = capsys.readouterr()
    assert code == 2 and "admin key was refused" in captured.err and "(ANTHROPIC_ADMIN_KEY)" in captured.err
    assert "not-an-admin-key-31" not in captured.err + captured.out


def test_the_library_status_is_what_the_cli_prints() -> None:
    """`gatekeeper.status` reads and judges the queue; `gatekeeper status --json` prints exactly its `to_json()`
    (the verdict and the repair lines are the library's, not the CLI's)."""
    import anyio

    from gatekeeper import ApiConfig, Secret, status
    from tests.fakes import ADMIN
    from tests.runs import gk

    with running_fake(ceiling=1000, rate=0.0) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1), Secret(WS2)], admin_key=Secret(ADMIN), base_url=fake.url)
        reading = anyio.run(lambda: status(config, threshold=50))
        printed = gk(["status", "--threshold", "50", "--json"], env_for(fake, keys=(WS1, WS2)))
    assert printed.returncode == (1 if reading.finding else 0), printed.stderr
    assert orjson.loads(printed.stdout) == reading.to_json()
    assert reading.headroom.ceiling == 1000 and reading.verdict == "queue-clear" and reading.repair
