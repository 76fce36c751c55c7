"""`status --watch`: as a pipe (a JSON line a reading) and on a pseudo-terminal (one screen redrawn); Ctrl-C is exit 0."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import time

import anyio
import orjson
import pytest

from gatekeeper.watch._watch import bar, min_interval, reading_interval, sparkline, watch
from tests.fakes import env_for, running_fake
from tests.runs import start


def _environ(env: dict[str, str]) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_")) or k == "GATEKEEPER_HOME"}
    full.update(env)
    return full


@pytest.mark.parametrize("argv", [["--watch", "--interval", "1"], ["--watch", "1"]])
def test_watch_as_a_pipe_prints_a_json_line_a_reading_and_stops_on_ctrl_c(argv: list[str]) -> None:
    """Not a terminal: one JSON object per reading, each with the verdict; SIGINT ends it with exit 0. `--watch 1`
    (issue 13's form, in scripts) is `--watch --interval 1`."""
    with running_fake(ceiling=1000, rate=0.0) as fake:
        fake.org.add_batch("wrkspc_1", 900)
        proc = start(["status", *argv], env_for(fake))
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    readings = [orjson.loads(line) for line in lines]
    assert proc.returncode == 0, err
    assert [r["verdict"] for r in readings] == ["queue-near-limit"] * 2 and readings[0]["depth"] == 900
    assert readings[1]["at"] - readings[0]["at"] >= 0.9  # the interval holds
    assert "Traceback" not in err


def test_watch_on_a_terminal_redraws_one_screen() -> None:
    """On a pseudo-terminal: the screen is cleared and redrawn with the occupancy bar and the sparkline."""
    with running_fake(ceiling=1000, rate=0.0) as fake:
        fake.org.add_batch("wrkspc_1", 500)
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "status", "--watch", "--interval", "1"], env=_environ(env_for(fake)),
                                stdout=slave, stderr=slave, text=True)
        os.close(slave)
        screen = b""
        deadline = time.monotonic() + 20
        while screen.count(b"\x1b[H\x1b[2J") < 2 and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                screen += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        os.close(master)
    text = screen.decode(errors="replace")
    assert proc.returncode == 0
    assert text.count("\x1b[H\x1b[2J") >= 2 and "occupancy [" in text and "50%" in text
    assert "history   " in text and "{" not in text.split("history")[1][:50]


@pytest.mark.parametrize(("occupancy", "expected"), [(0.0, 0), (0.5, 20), (1.0, 40), (1.3, 40)])
def test_bar(occupancy: float, expected: int) -> None:
    """The bar fills in proportion, capped at its width."""
    assert bar(occupancy).count("█") == expected


def test_sparkline_and_interval() -> None:
    """Readings map to eight levels (unknown is blank); the interval respects the call budget."""
    assert sparkline([0.0, 0.5, 0.99, None]) == "▁▅█ "
    assert min_interval(1, 300.0) == 1.0 and min_interval(9, 60.0) == 10.0
    # (status --watch and the exporter alike: asked, or the floor over the platform's reads at its default rate)
    from gatekeeper import ApiConfig, AwsPlatform, Secret

    first = ApiConfig(workspace_keys=[Secret("k1"), Secret("k2")])
    assert reading_interval(5.0, first) == 5.0 and reading_interval(0.1, first) == 1.0
    assert reading_interval(0.1, first, 30.0) == 6.0  # (two keys: three calls a reading)
    aws = ApiConfig(platform=AwsPlatform(region="us-east-1", workspace_id="w", base_url="https://aws.example.test"))
    assert reading_interval(0.1, aws) == 60.0 * 2 / aws.default_rpm


def test_watch_rides_out_a_failed_reading_but_not_the_first() -> None:
    """A failing reading after the first is shown and the next tried; a failing first reading is raised."""
    calls = iter([{"occupancy": 0.1}, RuntimeError("down"), {"occupancy": 0.2}])

    async def read() -> dict:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return dict(item)

    async def fails() -> dict:
        raise RuntimeError("x")

    async def no_sleep(seconds: float) -> None:
        pass

    out = io.StringIO()
    anyio.run(lambda: watch(read, lambda r: "", interval=0.0, tty=False, out=out, sleep=no_sleep, readings=3))
    rows = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [r.get("occupancy") for r in rows] == [0.1, None, 0.2] and rows[1]["error"] == "down"
    with pytest.raises(RuntimeError):
        anyio.run(lambda: watch(fails, lambda r: "", interval=0, tty=False, out=out, sleep=no_sleep, readings=1))
