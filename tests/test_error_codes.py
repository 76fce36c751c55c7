"""The API's typed error codes (issue 62 point 5, api.md §25): each answered as its meaning asks. A ramp limit and
load shedding are waits, never a full queue; the account's refusals stop the run with one line naming the code
(exit 2), nothing lost, and the same command finishes once lifted; `cmek_key_unreachable` is retried. The mapping
as a table; then end to end through the CLI over HTTP against the fake, which answers each code on request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gatekeeper import (
    AccountRefused,
    ApiError,
    BadRequest,
    ExitCode,
    QueueFull,
    RateLimited,
    ServerError,
    SpendLimitReached,
)
from gatekeeper.api._codes import create_not_made
from gatekeeper.api._http import error_from_response, retryable
from gatekeeper.api._messages import Kind, kind_of
from gatekeeper.testing import Fault
from gatekeeper.testing._wire import CODED
from tests.fakes import env_for, running_fake
from tests.helpers import req, write_jsonl
from tests.runs import assert_exactly_once, events, gk, said

FAST = ["--interval", "0.05", "--max-rpm", "60000", "--reconcile-grace", "1", "--json"]
USAGE_LIMIT = "You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC."
STOPPING = ["enforced_spend_limit_reached", "contract_spend_limit_reached", "linked_organization_spend_limit_reached",
            "linked_organization_billing_unavailable", "organization_on_hold", "workspace_human_review_disabled",
            "cmek_key_disabled", "claude_code_key_creator_not_member"]


def _answer(status: int, details: Any = ..., *, message: str = "m", retry_after: str | None = None) -> httpx.Response:
    err: dict[str, Any] = {"type": "error_type", "message": message}
    if details is not ...:
        err["details"] = details
    headers = {"retry-after": retry_after} if retry_after else {}
    return httpx.Response(status, json={"type": "error", "error": err, "request_id": "req_1"}, headers=headers)


def _coded(code: str, **extra: Any) -> dict[str, Any]:
    return {"error_code": code, **extra}


# (status, details (... absent), message, on a create?) -> (class exactly, code kept, exit code, retried, lane's kind)
TABLE = [
    # waits: never a full queue, on a create too
    ((429, _coded("ramp_limit_exceeded"), "m", True), (RateLimited, "ramp_limit_exceeded", 1, True, Kind.LIMITED)),
    ((429, None, "Server is temporarily limiting requests", True), (RateLimited, None, 1, True, Kind.LIMITED)),
    ((429, None, "m", False), (RateLimited, None, 1, True, Kind.LIMITED)),
    # (the control: a create's 429 without a code or a per-minute header is still taken as a full queue)
    ((429, ..., "m", True), (QueueFull, None, 1, True, Kind.LIMITED)),
    ((429, ..., "m", False), (RateLimited, None, 1, True, Kind.LIMITED)),
    # stops: the account's state
    ((429, _coded("enforced_spend_limit_reached"), "m", True), (SpendLimitReached, "enforced_spend_limit_reached", 2, False, Kind.ACCOUNT)),
    ((429, _coded("contract_spend_limit_reached"), "m", True), (SpendLimitReached, "contract_spend_limit_reached", 2, False, Kind.ACCOUNT)),
    ((402, _coded("linked_organization_spend_limit_reached"), "m", False),
     (SpendLimitReached, "linked_organization_spend_limit_reached", 2, False, Kind.ACCOUNT)),
    ((402, _coded("linked_organization_billing_unavailable"), "m", False),
     (SpendLimitReached, "linked_organization_billing_unavailable", 2, False, Kind.ACCOUNT)),
    ((400, _coded("organization_on_hold", appeal_url="https://appeal.example.test/x"), "m", True),
     (AccountRefused, "organization_on_hold", 2, False, Kind.ACCOUNT)),
    ((400, _coded("workspace_human_review_disabled"), "m", True), (AccountRefused, "workspace_human_review_disabled", 2, False, Kind.ACCOUNT)),
    ((400, _coded("cmek_key_disabled"), "m", False), (AccountRefused, "cmek_key_disabled", 2, False, Kind.ACCOUNT)),
    ((400, _coded("claude_code_key_creator_not_member"), "m", False),
     (AccountRefused, "claude_code_key_creator_not_member", 2, False, Kind.ACCOUNT)),
    # (the stops without a code, as before codes)
    ((400, ..., USAGE_LIMIT, False), (SpendLimitReached, None, 2, False, Kind.ACCOUNT)),
    ((402, ..., "Billing error", False), (SpendLimitReached, None, 2, False, Kind.ACCOUNT)),
    # retried
    ((503, _coded("cmek_key_unreachable"), "m", False), (ServerError, "cmek_key_unreachable", 1, True, Kind.SERVER)),
    # a code this table does not know: read by its status
    ((400, _coded("image_dimensions_too_large"), "m", True), (BadRequest, "image_dimensions_too_large", 1, False, Kind.REFUSED)),
    ((400, {"error_code": 7}, "m", True), (BadRequest, None, 1, False, Kind.REFUSED)),
]


@pytest.mark.parametrize("given, expected", TABLE)
def test_each_status_and_code_maps_to_one_error_and_kind(given: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
    status, details, message, creating = given
    cls, code, exit_code, retried, kind = expected
    response = _answer(status, details, message=message, retry_after="3")
    error = error_from_response(response, "create" if creating else "list", creating=creating)
    assert type(error) is cls and error.code == code and int(error.exit_code) == exit_code
    assert retryable(error, response, None, 0.0, 300.0) is retried
    assert kind_of(error) is kind
    assert error.retry_after == 3.0
    if code is not None:
        assert code in str(error)  # (the line names the code)
    if isinstance(error, AccountRefused):
        assert "\n" not in str(error) and "the same command goes on" in str(error)


def test_the_appeal_url_is_in_the_line_and_a_secret_a_body_echoes_is_not() -> None:
    on_hold = error_from_response(_answer(400, _coded("organization_on_hold", appeal_url="https://appeal.example.test/o1")),
                                  "create", creating=True)
    assert "appeal at https://appeal.example.test/o1" in str(on_hold) and "organization_on_hold" in str(on_hold)
    key = "sk-ant-api03-" + "k" * 40
    echoed = httpx.Response(400, text=f"<html>bad header x-api-key: {key}</html>")
    error = error_from_response(echoed, "list", redact=lambda t: t.replace(key, "***"))
    assert key not in str(error) and "***" in str(error)


def test_every_code_the_fake_answers_maps_as_the_table_says() -> None:
    """The fake's answer for each code (the real envelope: `error.details.error_code`, or `"details": null` for load
    shedding) maps to the class the table gives for that code: the fake and the client agree on the wire."""
    expected = {"ramp_limit_exceeded": RateLimited, "load_shedding": RateLimited, "cmek_key_unreachable": ServerError,
                **{c: SpendLimitReached for c in STOPPING[:4]}, **{c: AccountRefused for c in STOPPING[4:]}}
    assert set(expected) == set(CODED)
    with running_fake() as fake:
        for code, cls in expected.items():
            fake.inject(Fault("list", code=code))
            answer = httpx.get(fake.url + "/v1/messages/batches", headers={"x-api-key": "test-key-ws1",
                                                                          "anthropic-version": "2023-06-01"})
            body = orjson.loads(answer.content)
            assert answer.status_code == CODED[code][0] and "details" in body["error"] and body["request_id"]
            error = error_from_response(answer, "create", creating=True)
            assert type(error) is cls, code
    with pytest.raises(ValueError, match="no error code"):
        Fault("create", code="queue_full")


# -- end to end: the CLI over HTTP --------------------------------------------------------------------

def _input(tmp: Path, n: int = 9) -> tuple[Path, set[str]]:
    ids = {f"r{i:02d}" for i in range(n)}
    return write_jsonl(tmp / "in.jsonl", [req(c) for c in sorted(ids)]), ids


def _one_line(stderr: str) -> str:
    lines = said(stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("code", STOPPING)
def test_a_create_refused_for_the_account_stops_naming_the_code_and_the_rerun_finishes(tmp_path: Path, code: str) -> None:
    """A create refused with a stopping code: exit 2, one line naming the code (the appeal URL for a hold), nothing
    created or counted failed; the same command, once lifted, finishes with every request answered once."""
    path, ids = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault("create", code=code))
        stopped = gk(["submit", str(path), *FAST], env_for(fake))
        line = _one_line(stopped.stderr)
        assert stopped.returncode == ExitCode.USAGE and code in line, line
        assert code != "organization_on_hold" or "appeal at https://appeals.example.test/organization" in line
        assert fake.org.records.creates == 0 and not fake.org.records.succeeded
        assert fake.org.records.requests_seen["create"] == 1  # (asked once: never retried)
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        assert orjson.loads(done.stdout)["succeeded"] == len(ids)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        assert set(fake.org.records.succeeded.values()) == {1}


@pytest.mark.parametrize("endpoint, code", [("retrieve", "enforced_spend_limit_reached"), ("list", "organization_on_hold"),
                                            ("results", "linked_organization_billing_unavailable"),
                                            ("retrieve", "cmek_key_disabled")])
def test_a_refusal_for_the_account_while_batches_are_out_stops_and_the_rerun_collects_them(tmp_path: Path, endpoint: str,
                                                                                          code: str) -> None:
    """A stopping code on a poll, a listing or a download (batches already created): exit 2, one line naming the
    code; the same command, once lifted, collects what was created and sends the rest, no batch created twice and
    every request answered once."""
    path, ids = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault(endpoint, code=code))
        stopped = gk(["submit", str(path), "--max-requests", "4", *FAST], env_for(fake))
        line = _one_line(stopped.stderr)
        assert stopped.returncode == ExitCode.USAGE and code in line and line.startswith(f"gatekeeper: {endpoint}:"), line
        done = gk(["submit", str(path), "--max-requests", "4", *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-2000:]
        assert orjson.loads(done.stdout)["succeeded"] == len(ids)
        assert fake.org.records.creates == 3  # (9 requests in batches of 4: none created twice)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


@pytest.mark.parametrize("code", ["ramp_limit_exceeded", "load_shedding"])
def test_a_ramp_limit_on_a_create_is_waited_out_not_read_as_a_full_queue(tmp_path: Path, code: str) -> None:
    """Two creates refused by a ramp limit (or load shedding, details null): each waits its retry-after and the job
    finishes; no queue-full refusal is recorded, no bound on the ceiling is learned, no batch is cut smaller."""
    path, ids = _input(tmp_path, 30)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault("create", code=code, times=2))
        done = gk(["submit", str(path), "--max-requests", "10", *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        seen = [e["event"] for e in events(done.stderr)]
        assert seen.count("create_deferred") == 2 and "refused" not in seen and "recut" not in seen, seen
        deferred = [e for e in events(done.stderr) if e["event"] == "create_deferred"]
        assert all(e["wait"] == 1.0 for e in deferred)  # (the retry-after the fake gave)
        assert all(f.times == 0 for f in fake.faults.items)
        summary = orjson.loads(done.stdout)
        assert summary["succeeded"] == 30 and summary.get("refusals", 0) == 0
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


# (status, code) of a create's error answer -> whether it proves no batch was made (api.md §7, §25)
NOT_MADE_TABLE = [
    ((503, "cmek_key_unreachable"), True),  # typed: the key to store a batch with was out of reach
    ((503, None), False),  # a bare 5xx may follow a create that was made
    ((500, None), False),
    ((529, None), False),
    ((503, "some_future_code"), False),  # a code this table does not know: read by its status
    ((500, "ramp_limit_exceeded"), False),  # (a wait's code on a 5xx is not a refusal this table knows)
    ((429, "ramp_limit_exceeded"), True),  # every refusal below 500 is answered before anything is made
    ((429, None), True),
    ((400, "organization_on_hold"), True),
    ((413, None), True),
]


@pytest.mark.parametrize("given, not_made", NOT_MADE_TABLE)
def test_which_create_answers_prove_no_batch_was_made(given: tuple[int, str | None], not_made: bool) -> None:
    assert create_not_made(*given) is not_made


@pytest.mark.parametrize("endpoint", ["create", "list"])
def test_an_unreachable_encryption_key_is_retried(tmp_path: Path, endpoint: str) -> None:
    """503 cmek_key_unreachable: a listing is retried; a create is sent again after its backoff without waiting out
    the reconcile grace (the typed code proves no batch was made; the grace here is ten minutes, the test's limit
    far less): either way the job finishes, nothing created twice."""
    path, ids = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault(endpoint, code="cmek_key_unreachable", times=2))
        done = gk(["submit", str(path), *FAST, "--reconcile-grace", "600"], env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        assert all(f.times == 0 for f in fake.faults.items)
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)
        seen = [e["event"] for e in events(done.stderr)]
        assert "create_unknown" not in seen and "reconciled" not in seen, seen
        assert seen.count("create_deferred") == (2 if endpoint == "create" else 0), seen
        waits = [e["wait"] for e in events(done.stderr) if e["event"] == "create_deferred"]
        assert waits == ([0.1, 0.2] if endpoint == "create" else []), waits  # (doubling from the backoff's floor)
        assert fake.org.records.creates == 1


def test_a_bare_503_on_a_create_is_still_an_unknown_outcome(tmp_path: Path) -> None:
    """The control: a 503 without a code may follow a create that was made, so it is reconciled, never resent at once
    (here the grace is one second: the job finishes once the listing proves nothing was made)."""
    path, ids = _input(tmp_path)
    with running_fake(ceiling=10_000, rate=5000) as fake:
        fake.inject(Fault("create", status=503))
        done = gk(["submit", str(path), *FAST], env_for(fake))
        assert done.returncode == 0, done.stderr[-3000:]
        seen = [e["event"] for e in events(done.stderr)]
        assert "create_unknown" in seen and "create_deferred" not in seen, seen
        assert_exactly_once(fake, Path(str(path) + ".gatekeeper") / "results.jsonl", ids)


def test_the_fake_answers_a_code_from_its_command_line(tmp_path: Path) -> None:
    """`fake-api --fault create:organization_on_hold`: the submit stops naming the code (exit 2); the fault spent,
    the same command finishes. A code it does not know is refused in one line."""
    bad = subprocess.run([sys.executable, "-m", "gatekeeper", "fake-api", "--fault", "create:no_such_code"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert bad.returncode == 2 and "organization_on_hold" in bad.stderr and "Traceback" not in bad.stderr
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--fault", "create:organization_on_hold",
                            "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert run.stdout is not None
        lines = [run.stdout.readline()]
        while lines[-1].rstrip() != "}":
            lines.append(run.stdout.readline())
        env = orjson.loads("".join(lines))["env"]
        path, _ = _input(tmp_path, 4)
        stopped = gk(["submit", str(path), *FAST], env)
        assert stopped.returncode == 2 and "organization_on_hold" in _one_line(stopped.stderr)
        done = gk(["submit", str(path), *FAST], env)
        assert done.returncode == 0 and orjson.loads(done.stdout)["succeeded"] == 4, done.stderr[-2000:]
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=10)


def test_the_fake_loses_a_create_and_answers_a_status_from_its_command_line(tmp_path: Path) -> None:
    """`fake-api --fault create:lose --fault create:529:2:1`: the first create's answer dropped (the batch made), the
    next two creates overloaded; the submit finishes with every request answered once, and the fake's summary counts
    what it received, the lost answer included. A status outside 400-599, or `lose` on another route, is refused in one line."""
    for wrong in ("create:200", "list:lose"):
        bad = subprocess.run([sys.executable, "-m", "gatekeeper", "fake-api", "--fault", wrong], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert bad.returncode == 2 and "HTTP status" in bad.stderr and "Traceback" not in bad.stderr
    run = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--fault", "create:lose", "--fault",
                            "create:529:2:1", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert run.stdout is not None
        lines = [run.stdout.readline()]
        while lines[-1].rstrip() != "}":
            lines.append(run.stdout.readline())
        env = orjson.loads("".join(lines))["env"]
        path, _ = _input(tmp_path, 6)
        done = gk(["submit", str(path), *FAST, "--max-requests", "3"], env)
        assert done.returncode == 0 and orjson.loads(done.stdout)["succeeded"] == 6, done.stderr[-2000:]
    finally:
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=10)
    received = orjson.loads(out)["received"]
    assert received["answered_twice"] == 0 and received["requests"] == 6 and received["creates"] == 2, received
    assert received["lost_create_answers"] == 1, received  # (the fault's loss counted, as --lose-creates' are)


def test_every_stop_is_an_account_refusal_and_an_api_error() -> None:
    assert issubclass(SpendLimitReached, AccountRefused) and issubclass(AccountRefused, ApiError)
    assert AccountRefused.exit_code == ExitCode.USAGE
