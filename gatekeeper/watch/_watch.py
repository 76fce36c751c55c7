"""`status --watch`: the queue re-read on a schedule, one screen redrawn on a terminal, a JSON line a reading elsewhere.

The drawing helpers are pure; `watch` takes its reading, sleep and clock as parameters. It runs in one event loop
for all its readings, so a stop (Ctrl-C, SIGTERM) is asyncio's runner's at any moment but the loop's first start: a
cancellation at the next await, never a KeyboardInterrupt raised while a loop is being built or torn down.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import orjson

if TYPE_CHECKING:
    from ..api._config import ApiConfig

SPARKS = "▁▂▃▄▅▆▇█"
HISTORY = 40  # readings the sparkline shows
CLEAR = "\x1b[H\x1b[2J"


def bar(occupancy: float | None, width: int = 40) -> str:
    """[██████░░░░] 62%: occupancy as a bar (unknown ceiling: a bar of question marks)."""
    if occupancy is None:
        return "[" + "?" * width + "] ceiling unknown"
    filled = max(0, min(width, round(occupancy * width)))
    return "[" + "█" * filled + "░" * (width - filled) + f"] {occupancy:.0%}"


def sparkline(values: list[float | None]) -> str:
    """One character a reading, 0 to 1 (an unknown reading is a space)."""
    return "".join(" " if v is None else SPARKS[max(0, min(len(SPARKS) - 1, int(v * len(SPARKS))))] for v in values)


def min_interval(workspaces: int, max_rpm: float) -> float:
    """The shortest interval between readings that keeps them within the call budget (a list per key and the
    ceiling per reading, at most), and never under a second."""
    return max(1.0, 60.0 * (workspaces + 1) / max_rpm)


def reading_interval(asked: float, config: ApiConfig, max_rpm: float | None = None) -> float:
    """The interval between readings of `status --watch` and the exporter: `asked`, never faster than the call budget
    allows over the platform's reads (`max_rpm` None: its default rate)."""
    return max(asked, min_interval(config.reads, max_rpm or config.default_rpm))


async def watch(read: Callable[[], Awaitable[dict[str, Any]]], render: Callable[[dict[str, Any]], str], *,
                interval: float, tty: bool, out: TextIO, sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                clock: Callable[[], float] = time.time, readings: int | None = None) -> None:
    """Read, show, sleep, until interrupted (or `readings` readings, for tests); a failed reading is shown and
    the next one tried, the first one's failure is raised (a configuration error)."""
    history: deque[float | None] = deque(maxlen=HISTORY)
    n = 0
    while readings is None or n < readings:
        n += 1
        try:
            report = await read()
        except Exception as exc:
            if n == 1:
                raise
            report = {"error": str(exc)}
        report["at"] = clock()
        history.append(report.get("occupancy"))
        if tty:
            out.write(CLEAR + _screen(report, render, list(history)) + "\n")
        else:
            out.write(orjson.dumps(report).decode() + "\n")
        out.flush()
        if readings is None or n < readings:
            await sleep(interval)


def _screen(report: dict[str, Any], render: Callable[[dict[str, Any]], str], history: list[float | None]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(report["at"]))
    if "error" in report:
        return f"gatekeeper status --watch   {stamp}\nreading failed: {report['error']} (the next reading is tried)"
    return "\n".join([f"gatekeeper status --watch   {stamp}   (Ctrl-C to stop)", "",
                      f"occupancy {bar(report.get('occupancy'))}", f"history   {sparkline(history)}", "", render(report)])
