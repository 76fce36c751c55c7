"""The tests' fork server: its runs are real processes with the environment, streams and exit status of a fresh one."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.forkserver import spawn
from tests.runs import _environ, gk, wait_until


def test_a_forked_run_answers_as_a_fresh_process_does(tmp_path: Path) -> None:
    """Same exit code and output as `python -m gatekeeper`, for a success, a usage error naming the file and a
    configuration error naming the URL the run was given in its environment."""
    env = {"PATH": os.environ.get("PATH", ""), "ANTHROPIC_BASE_URL": "ftp://nowhere.invalid", "ANTHROPIC_API_KEY": "k"}
    missing = str(tmp_path / "missing.jsonl")
    for args in (["--version"], ["plan", missing, "--json"], ["status", "--json"]):
        run = spawn(args, _environ(env))  # the environment a fresh run gets
        out, err = run.communicate(timeout=60)
        fresh = gk(args, env, isolated=True)
        assert run.pid != os.getpid() and (run.returncode, out) == (fresh.returncode, fresh.stdout), args
        assert err.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], args
    assert "ftp://nowhere.invalid" in err  # (status) the run read the URL it was given


def test_a_forked_run_is_killed_for_real() -> None:
    """SIGKILL ends it with -9, as subprocess reports it; poll() is None until then."""
    run = spawn(["fake-api", "--port", "0", "--json"], {"PATH": os.environ.get("PATH", "")})
    wait_until(lambda: Path(f"/proc/{run.pid}").exists(), "the run's process")
    assert run.poll() is None
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=30)
    assert run.returncode == -signal.SIGKILL


def test_a_forked_script_and_module_run_as_python_would_run_them(tmp_path: Path) -> None:
    """`python SCRIPT ARGS` (as `__main__`, its argv, in its folder; stderr merged into stdout when asked, in the
    order written) and `python -m MODULE ARGS`, from a server with preloads and an environment of its own."""
    import sys

    from tests.forkserver import ForkServer

    script = tmp_path / "job.py"
    script.write_text("import os, sys\nprint(__name__, sys.argv[1:], os.getcwd(), os.environ['ONLY'], flush=True)\n"
                      "print('to stderr', file=sys.stderr, flush=True)\nsys.exit(3)\n")
    server = ForkServer(("json",), {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        run = server.spawn(["a", "b"], {"ONLY": "this"}, script=str(script), cwd=str(tmp_path), merged=True)
        out, err = run.communicate(timeout=60)
        assert (run.returncode, out, err) == (3, f"__main__ ['a', 'b'] {tmp_path} this\nto stderr\n", "")
        (tmp_path / "hello_mod.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
        run = server.spawn(["x"], {}, module="hello_mod", cwd=str(tmp_path))  # (found from the run's folder)
        out, err = run.communicate(timeout=60)
        assert (run.returncode, out, err) == (0, "__main__ ['x']\n", "")
    finally:
        server.stop()
