"""API version 2026-10-21 (shared/api.md §20): chosen with --api-version, GATEKEEPER_API_VERSION, `ApiConfig` or the
Airflow operator; its refusals judged on every line before anything is sent; a job keeps the version it started
with. Against the fake over HTTP, which records each batch's version and errors what that version refuses."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gatekeeper import ApiConfig, Secret, SubmitSettings, UsageError, submit_sync
from gatekeeper.input._reader import version_reason
from tests.fakes import WS1, env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import gk, said

FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]
NEW = "2026-10-21"


def _doc(role: str, block: dict) -> dict:
    return {"role": role, "content": [block]}


@pytest.mark.parametrize(("params", "refused"), [
    ({"temperature": 1.0}, "params.temperature"),
    ({"top_p": 0.9}, "params.top_p"),
    ({"top_k": 5}, "params.top_k"),
    ({"messages": [_doc("user", {"type": "text", "text": "q"}),
                   _doc("assistant", {"type": "document", "source": {"type": "text", "data": "d"}})]}, "messages[1]"),
    ({"messages": [_doc("user", {"type": "text", "text": "q", "citations": [{"type": "char_location"}]})]}, "messages[0]"),
    ({"messages": [_doc("user", {"type": "text", "text": "q", "citations": []})]}, None),  # (empty: not refused)
    ({"messages": [_doc("user", {"type": "document", "source": {"type": "text", "data": "d"}})]}, None),
    ({"speed": "standard"}, None),
    ({}, None),
])
def test_what_2026_10_21_refuses(params: dict, refused: str | None) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}], **params}
    reason = version_reason(body)
    assert (reason is None) if refused is None else (refused in (reason or "") and NEW in (reason or ""))


def _input(tmp_path: Path) -> tuple[Path, set[str]]:
    rows = [req(f"a{i}") for i in range(6)] + [req("warm", temperature=0.2), req("topk", top_k=3),
                                                req("std", speed="standard")]
    return write_jsonl(tmp_path / "in.jsonl", rows), {f"a{i}" for i in range(6)} | {"std"}


def test_plan_judges_every_line_by_the_version_asked(tmp_path: Path) -> None:
    """`plan` under 2023-06-01 takes temperature and top_k; under 2026-10-21 (flag or environment) they are rejected
    lines with their numbers (exit 1); `speed: "standard"` passes either way; an unknown version is exit 2."""
    path, _ = _input(tmp_path)
    old = gk(["plan", str(path), "--json"], {})
    assert old.returncode == 0 and orjson.loads(old.stdout)["invalid"] == 0, old.stderr
    for args, env in ((["--api-version", NEW], {}), ([], {"GATEKEEPER_API_VERSION": NEW})):
        new = gk(["plan", str(path), "--json", *args], env)
        report = orjson.loads(new.stdout)
        assert new.returncode == 1 and report["invalid"] == 2, new.stderr
        assert {e["line"] for e in report["errors"]} == {7, 8} and all(NEW in e["reason"] for e in report["errors"])
    bad = gk(["plan", str(path), "--api-version", "2025-01-01"], {})
    assert bad.returncode == 2 and "2025-01-01" in bad.stderr and "Traceback" not in bad.stderr


def test_submit_under_2026_sends_only_what_that_version_takes_and_the_job_keeps_it(tmp_path: Path) -> None:
    """`submit --api-version 2026-10-21`: the refused lines are rejected before sending (never reach the API), every
    call carries the version (the fake records the batch's), and a rerun asking for 2023-06-01 is refused with one
    line (exit 2) while a rerun asking nothing keeps 2026-10-21."""
    path, ok = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        done = gk(["submit", str(path), *FAST, "--api-version", NEW], env_for(fake))
        assert done.returncode == 1, done.stderr  # (findings: two lines rejected)
        s = orjson.loads(done.stdout)
        assert (s["succeeded"], s["invalid"]) == (len(ok), 2)
        assert set(fake.org.records.versions.values()) == {NEW}
        assert "warm" not in fake.org.records.succeeded and "topk" not in fake.org.records.succeeded
        other = gk(["submit", str(path), *FAST, "--api-version", "2023-06-01"], env_for(fake))
        lines = said(other.stderr)
        assert other.returncode == 2 and len(lines) == 1 and "started with API version 2026-10-21" in lines[0], other.stderr
        again = gk(["submit", str(path), *FAST], env_for(fake))
        assert again.returncode == 1 and fake.org.records.creates == 1, again.stderr


def test_the_library_sends_the_version_of_its_config(tmp_path: Path) -> None:
    """`ApiConfig(api_version=...)`: the same rules from the library; an unknown version is a UsageError."""
    path, ok = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        config = ApiConfig(workspace_keys=[Secret(WS1)], base_url=fake.url, api_version=NEW)
        s = submit_sync(path, config=config, settings=SubmitSettings(state_dir=tmp_path / "s", interval=0.05))
        assert s.succeeded == len(ok) and s.invalid == 2
        assert set(fake.org.records.versions.values()) == {NEW}
    with pytest.raises(UsageError, match="API version"):
        ApiConfig(workspace_keys=[Secret(WS1)], api_version="2024-01-01")


USAGE_LIMIT = "You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC."


@pytest.mark.parametrize("endpoint", ["create", "list"])
def test_the_usage_limit_stops_any_command_with_one_line_naming_the_date(tmp_path: Path, endpoint: str) -> None:
    """The account's usage limit (400, api.md §22), on a create or a listing: `submit` and `status` stop with one
    line naming the date (exit 2), nothing counted failed; once lifted, the same submit finishes every request."""
    from gatekeeper.testing import Fault

    path, _ = _input(tmp_path)
    commands = [["status"]] if endpoint == "list" else []  # (status lists; it never creates)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault(endpoint, status=400, error_type="invalid_request_error", message=USAGE_LIMIT,
                          times=len(commands) + 1))
        for cmd in (*commands, ["submit", str(path), *FAST]):
            stopped = gk(cmd, env_for(fake))
            lines = said(stopped.stderr)
            assert stopped.returncode == 2 and "Traceback" not in stopped.stderr, stopped.stderr[-1500:]
            assert "2027-01-01" in lines[-1] and len(lines) == 1, lines
        assert fake.org.records.creates == 0 and not fake.org.records.succeeded
        done = gk(["submit", str(path), *FAST], env_for(fake))  # (2023-06-01: every line is taken)
        assert done.returncode == 0 and orjson.loads(done.stdout)["succeeded"] == 9, done.stderr
        assert set(fake.org.records.succeeded.values()) == {1}


@pytest.mark.parametrize("endpoint", ["models", "count_tokens"])
def test_plan_under_the_usage_limit_stops_naming_the_date(tmp_path: Path, endpoint: str) -> None:
    """`plan` asks the Models API and count_tokens: the account's usage limit on either stops it as it stops submit
    and status (exit 2, one line naming the date), not a warning and an estimate said to be unmeasured for want of
    a key that was given."""
    from gatekeeper.testing import Fault

    path, _ = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault(endpoint, status=400, error_type="invalid_request_error", message=USAGE_LIMIT, times=50))
        done = gk(["plan", str(path)], env_for(fake))
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        assert done.returncode == 2 and len(lines) == 1 and "2027-01-01" in lines[0], done.stderr
        assert "Traceback" not in done.stderr and "estimate" not in done.stdout


def test_an_unmeasured_estimate_says_why(tmp_path: Path) -> None:
    """With a key whose count_tokens fails (a gateway without it), the estimate says why it is bytes / 4, not "no
    key"; without a key it says count_tokens was not asked."""
    from gatekeeper.testing import Fault

    path, _ = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault("count_tokens", status=404, message="Not Found", times=50))
        keyed = gk(["plan", str(path), "--json"], env_for(fake))
    method = orjson.loads(keyed.stdout)["estimate"]["method"]
    assert keyed.returncode == 0 and "no key" not in method and "count_tokens could not be used" in method, method
    keyless = gk(["plan", str(path), "--json"], {})
    assert "count_tokens not asked" in orjson.loads(keyless.stdout)["estimate"]["method"]


def test_a_job_recorded_before_versions_were_kept_keeps_2023_06_01(tmp_path: Path) -> None:
    """A journal from before the version was recorded (its settings without one): the rerun keeps 2023-06-01, the
    only version then, whatever the environment asks by default; asking 2026-10-21 for it is refused in one line."""
    from gatekeeper.state._journal import Journal

    path, ok = _input(tmp_path)
    state = Path(str(path) + ".gatekeeper")
    with running_fake(ceiling=10_000, rate=5000) as fake:
        killed = gk(["submit", str(path), *FAST, "--max-requests", "3"], env_for(fake), crash_at="after-create:1")
        assert killed.returncode == -9, killed.stderr[-2000:]
        journal = Journal.open(state)
        settings = dict(journal.get_meta("settings"))
        del settings["api_version"]  # (as a journal of before the change has them)
        journal.set_meta("settings", settings)
        journal.close()
        refused = gk(["submit", str(path), *FAST], env_for(fake, GATEKEEPER_API_VERSION=NEW))
        assert refused.returncode == 2 and "started with API version 2023-06-01" in refused.stderr, refused.stderr
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        assert orjson.loads(done.stdout)["succeeded"] == 9  # (under 2023-06-01 every line is taken)
        assert set(fake.org.records.versions.values()) == {"2023-06-01"}
