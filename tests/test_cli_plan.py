"""`gatekeeper plan`: report shape and exit codes, in-process and as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gatekeeper.cli._cli import main
from tests.helpers import req, write_jsonl

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_plan_json_valid_file(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with requests, invalid, errors and batches; exit 0 when all valid."""
    assert main(["plan", str(EXAMPLES / "requests.jsonl"), "--json", "--max-requests", "100"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["requests"] == 300 and out["invalid"] == 0 and out["errors"] == []
    assert [b["requests"] for b in out["batches"]] == [100, 100, 100]
    assert all(b["bytes"] > 0 for b in out["batches"])


def test_plan_json_rejections_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Rejected lines make exit 1 and every one is listed with line, custom_id and reason."""
    assert main(["plan", str(EXAMPLES / "defective.jsonl"), "--json"]) == 1
    out = orjson.loads(capsys.readouterr().out)
    assert out["invalid"] == len(out["errors"]) == 16
    assert set(out["errors"][0]) == {"line", "custom_id", "reason"}


def test_plan_human_lists_first_20(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The human form shows the first 20 rejections and a count of the rest."""
    path = write_jsonl(tmp_path / "in.jsonl", [req("ok")] + [b"{" for _ in range(25)])
    assert main(["plan", str(path)]) == 1
    text = capsys.readouterr().out
    assert "line 21:" in text and "line 22:" not in text
    assert "and 5 more" in text


@pytest.mark.parametrize(
    "argv",
    [["plan"], ["plan", "missing.jsonl"], ["plan", "x", "--max-requests", "0"], ["plan", "x", "--max-bytes", "abc"],
     ["plan", "x", "--max-requests", "100001"], ["frobnicate"]],
)
def test_plan_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Usage errors and unreadable files: exit 2, one line on stderr, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err


def test_plan_subprocess_stdin(tmp_path: Path) -> None:
    """`python -m gatekeeper plan -` reads standard input."""
    data = orjson.dumps(req("a")) + b"\n" + orjson.dumps(req("b")) + b"\n"
    proc = subprocess.run([sys.executable, "-m", "gatekeeper", "plan", "-", "--json"], input=data, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout)["requests"] == 2


def test_directory_is_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory given as input is a clear usage error."""
    assert main(["plan", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_command_exits_with_main_s_code_and_output_and_without_the_collector_s_last_walk() -> None:
    """The installed script and `python -m gatekeeper` run `run()`: main's exit code and its whole output, then the
    objects left frozen out of the collector (freeing the imports' cycles at exit was 7 ms of a short `plan`);
    `main()` alone, for a program that goes on, leaves the collector as it was."""
    import tomllib

    scripts = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gatekeeper"] == "gatekeeper.cli._cli:run"
    done = subprocess.run([sys.executable, "-m", "gatekeeper", "plan", str(EXAMPLES / "defective.jsonl"), "--json"],
                          capture_output=True)
    assert done.returncode == 1 and orjson.loads(done.stdout)["invalid"] == 16
    probe = ("import contextlib, gc, io, sys\n"
             "from gatekeeper.cli._cli import main, run\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    alone = main(['plan', sys.argv[1]])\n"
             "    frozen_by_main = gc.get_freeze_count()\n"
             "    sys.argv = ['gatekeeper', 'plan', sys.argv[1]]\n"
             "    code = run()\n"
             "print(alone, frozen_by_main, code, gc.get_freeze_count() > 1000)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(EXAMPLES / "defective.jsonl")], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["1", "0", "1", "True"], out.stderr


def test_plan_after_a_killed_submit_counts_what_the_rerun_sends(tmp_path: Path) -> None:
    """A JSONL job killed right after its first of three batches was created: `plan` of the same input (its state
    beside it) says 40 to send in the 2 batches never created, 20 out; the rerun then sends exactly those 40. A
    plan with no earlier run says what it always did (`rerun` null, to_send every request)."""
    from tests.fakes import env_for, running_fake
    from tests.runs import gk

    path = write_jsonl(tmp_path / "in.jsonl", [req(f"b{i:04d}", text="Hello") for i in range(60)])
    fresh = gk(["plan", str(path), "--json"], {})
    with running_fake(rate=2000) as fake:
        env = env_for(fake, admin=False)
        run = ["submit", str(path), "--max-requests", "20", "--interval", "0.05", "--reconcile-grace", "1", "--json"]
        assert gk(run, env, crash_at="after-create:1").returncode == -9
        planned = gk(["plan", str(path), "--json"], env)
        human = gk(["plan", str(path)], env)
        before = sum(len(b.requests) for b in fake.org.batches.values())
        done = gk(run, env)
        sent = sum(len(b.requests) for b in fake.org.batches.values()) - before
    first = orjson.loads(fresh.stdout)
    assert first["rerun"] is None and first["to_send"] == 60
    j = orjson.loads(planned.stdout)
    assert j["to_send"] == 40 and {k: j["rerun"][k] for k in ("out", "answered", "batches", "retries")} == \
        {"out": 20, "answered": 0, "batches": 2, "retries": 0}
    assert "20 request(s) out (collected, not sent again), 0 answered; a rerun sends 40: 2 batch(es)" in human.stdout
    assert done.returncode == 0 and sent == 40, done.stderr[-2000:]
