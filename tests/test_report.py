"""`gatekeeper report`: a self-contained page of a run, from its journal alone, checked as HTML and in a real browser."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest

from gatekeeper.testing import Outcome
from gatekeeper.watch._report import COLOURS
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import gk

FAST = ["--interval", "0.05", "--reconcile-grace", "1", "--max-rpm", "60000", "--json", "--max-requests", "25"]

# The run three of these tests read (about 2.5 s to make) is made once: on one worker, not once on each.
pytestmark = pytest.mark.xdist_group("report-run")


class _Page(HTMLParser):
    """Tags, attributes with URLs, and the text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.urls += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href")]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with refusals (hidden load), retries (first-attempt expiries), a crash and a resume."""
    tmp = tmp_path_factory.mktemp("report")
    path = write_jsonl(tmp / "in.jsonl", [req(f"r{i:03d}") for i in range(150)])
    def rule(cid, model, attempt):
        return (Outcome("expired") if cid.endswith("7") and attempt == 1 else None)
    with running_fake(ceiling=60, rate=0.0, outcome=rule, queue_retry_after=None) as fake:
        fake.org.add_batch("wrkspc_2", 60)  # another workspace's load: our first creates are refused
        crashed = gk(["submit", str(path), *FAST, "--ceiling", "60"], env_for(fake), crash_at="after-refusal:2")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
        fake.org.config.rate = 25.0  # slow enough that the queue is seen holding our batches (a second a batch: at load too)
        done = gk(["submit", str(path), *FAST, "--ceiling", "60"], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
    return path


def test_report_json_has_the_runs_numbers(run_dir: Path) -> None:
    """--json: the outcome, the queue readings, every batch with its span and outcome, refusals and the resume."""
    out = gk(["report", str(run_dir), "--json"], {})
    assert out.returncode == 0, out.stderr
    data = orjson.loads(out.stdout)
    assert data["status"] == "finished" and data["summary"]["succeeded"] == 150
    assert data["summary"]["succeeded_after_retry"] == 15 and len(data["readings"]) >= 3
    assert any(r["ours"] > 0 for r in data["readings"])  # the timeline shows our share of the queue
    assert all(b["start"] and b["end"] and b["end"] >= b["start"] for b in data["batches"])
    assert {b["outcome"] for b in data["batches"]} <= {"succeeded", "partly"} and "partly" in {b["outcome"] for b in data["batches"]}
    events = {m["event"] for m in data["marks"]}
    assert "queue_full" in events and "resumed" in events


def test_report_html_is_self_contained(run_dir: Path) -> None:
    """The page: inline SVG and CSS, no script, nothing fetched; it names the outcome and the errors section."""
    out = gk(["report", str(run_dir)], {})
    assert out.returncode == 0, out.stderr
    html = (Path(str(run_dir) + ".gatekeeper") / "report.html").read_text()
    page = _Page()
    page.feed(html)
    assert "script" not in page.tags and page.urls == []
    assert page.tags.count("svg") == 2 and "polyline" in page.tags and "rect" in page.tags
    text = " ".join(page.text)
    assert "finished" in text and "queue-full refusals" in text and "recovered by a retry" in text


def test_report_of_an_interrupted_run(tmp_path: Path) -> None:
    """A run killed mid-way is reported as interrupted, its live batches drawn to now."""
    path = write_jsonl(tmp_path / "in.jsonl", [req(f"i{i}") for i in range(60)])
    with running_fake(ceiling=1000, rate=0.0) as fake:
        crashed = gk(["submit", str(path), *FAST], env_for(fake), crash_at="after-create:2")
        assert crashed.returncode == -signal.SIGKILL
    data = orjson.loads(gk(["report", str(path), "--json"], {}).stdout)
    assert data["status"] == "interrupted" and data["summary"]["pending"] == 60
    assert "live" in {b["outcome"] for b in data["batches"]}


def _png_pixels(path: Path) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, pixels) of an 8-bit RGB or RGBA PNG, its scanlines unfiltered (the five PNG filters)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 3
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    prev, pixels = bytearray(stride), []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = prev[x], prev[x - channels] if x >= channels else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (0, a, b, (a + b) // 2, a if pa <= pb and pa <= pc else b if pb <= pc else c)[kind]) & 0xFF
        pixels.extend(tuple(line[x:x + 3]) for x in range(0, stride, channels))
        prev = line
    return width, height, pixels


def _shown(pixels: list[tuple[int, int, int]], colour: str, near: int = 40) -> int:
    """How many pixels are close to `colour` (#rrggbb): anti-aliasing blends the edges of lines."""
    want = tuple(int(colour[k:k + 2], 16) for k in (1, 3, 5))
    return sum(1 for p in pixels if sum(abs(x - y) for x, y in zip(p, want)) <= near)


def test_report_renders_in_a_real_browser(run_dir: Path, tmp_path: Path) -> None:
    """Headless Chromium renders the page to a PNG of the right size with a good share of non-white pixels."""
    browser = shutil.which("chromium") or shutil.which("chromium-headless-shell")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide chromium (.ci/run installs it)")
        pytest.skip("no chromium here (apt-get install chromium); CI always has one")
    made = gk(["report", str(run_dir), "--out", str(tmp_path / "r.html")], {})
    assert made.returncode == 0, made.stderr
    shot = tmp_path / "r.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1000,1200",
                    (tmp_path / "r.html").as_uri()], capture_output=True, timeout=60, check=True)
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1000, 1200) and len(pixels) == width * height
    # What the page must show: the depth line, our share shaded under it, the ceiling (dashed), and the batches'
    # bars in the colour of their outcome (this run's batches all succeeded).
    assert _shown(pixels, COLOURS["succeeded"]) > 500, "no succeeded batch bars"
    assert _shown(pixels, "#0d47a1") > 100, "no depth line"
    assert _shown(pixels, "#c62828") > 30, "no ceiling line"
    assert _shown(pixels, "#b1d9f9", near=60) > 500, "no shaded share of ours"


def test_a_rehearsals_report_draws_every_batch_inside_the_run(tmp_path: Path) -> None:
    """The fake keeps one clock: a rehearsal at 20x simulated speed reports its batches' times in real time, so the
    report's batches begin and end inside the run's own readings, and the depth line spans the run."""
    ids = [f"t{i}" for i in range(300)]
    path = write_jsonl(tmp_path / "in.jsonl", [req(c) for c in ids])
    with running_fake(ceiling=400, rate=100, speed=20,
                      outcome=lambda cid, model, attempt: Outcome("expired") if cid.endswith("7") and attempt == 1 else None) as fake:
        started = time.time()
        proc = gk(["submit", str(path), *FAST, "--max-requests", "100"], env_for(fake))
        finished = time.time()
        assert proc.returncode == 0, proc.stderr
    report = orjson.loads(gk(["report", str(path), "--json"], {}).stdout)
    readings = [r["at"] for r in report["readings"]]
    assert readings and started <= min(readings) and max(readings) <= finished
    batches = report["batches"]
    assert len(batches) >= 4  # three of the input, and the expired ones sent again
    for b in batches:
        assert started - 1 <= b["start"] <= b["end"] <= finished + 1, (b, started, finished)
