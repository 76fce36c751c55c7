from __future__ import annotations

import functools
import gc
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.services import redis_binary, redis_server

# pytest caches the test modules it rewrites for its assertion messages in __pycache__, unless bytecode writing is
# off: CI machines set PYTHONDONTWRITEBYTECODE, and every worker then rewrote every test module again at each run
# (about 0.7 s of CPU a worker). This is set here, before any test module is imported; the package's own bytecode
# is compiled below.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package's bytecode once, as `pip install` would: the tests start the CLI as a process many
    times, and where PYTHONDONTWRITEBYTECODE is set (CI machines set it) each start would compile every module
    from source again (about a fifth of the suite's CPU)."""
    if not hasattr(config, "workerinput"):  # the controller only, before the workers start
        import compileall

        import gatekeeper

        compileall.compile_dir(os.path.dirname(gatekeeper.__file__), quiet=1)


@pytest.fixture(scope="session", autouse=True)
def _session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A fixture of a wider scope (a run made once for a module) is set up before any test's own state folder:
    it gets the session's, never the developer's (whose host ledger other runs on the machine share)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEKEEPER_HOME", str(tmp_path_factory.mktemp("session-home")))
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("session-state")))
        yield


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test sees the developer's real keys or base URL, nor writes to their state folder (a table job's default
    state is there): each test has a user state folder of its own, inherited by the CLI it starts."""
    for name in list(os.environ):
        if name.startswith("ANTHROPIC_") or name.startswith("GATEKEEPER_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def _own_home(_clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test its own user state folder (GATEKEEPER_HOME), so its own host ledger: no two tests, nor two xdist
    workers, share one (the CLI's subprocesses see it too: `tests.runs` keeps it in their environment)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("GATEKEEPER_HOME", str(home))
    return home


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis on loopback: the one .ci/run started (REDIS_TEST_URL), else one started here from PATH."""
    url = os.environ.get("REDIS_TEST_URL")
    if url:
        yield url
        return
    if redis_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide Redis (.ci/run installs redis-server)")
        pytest.skip("no redis-server on this machine (apt-get install redis-server); CI always has one")
    with redis_server() as (found, _):
        yield found


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A real PostgreSQL: the one .ci/run started (PG_TEST_URL; `eval "$(.ci/postgres start)"` starts one by hand)."""
    url = os.environ.get("PG_TEST_URL")
    if url:
        return url
    if os.environ.get("CI"):
        pytest.fail("CI must provide PostgreSQL (.ci/run starts Debian's postgresql and sets PG_TEST_URL)")
    pytest.skip('no PostgreSQL for this run: eval "$(.ci/postgres start)" starts one; CI always has one')


@pytest.fixture
def pg_database(pg_url: str) -> Iterator[str]:
    """A database of this test's own on the test server (for what shares one ledger or registry per database)."""
    from urllib.parse import urlsplit

    import psycopg

    name = f"t_{os.urandom(6).hex()}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield urlsplit(pg_url)._replace(path=f"/{name}").geturl()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    """A job name of this test's own, so tests sharing one PostgreSQL never meet."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"{name}-{os.urandom(4).hex()}"  # usable as a custom_id prefix too


ASYNC_TEST_LIMIT = 60.0  # seconds: an async test that hangs fails instead of stalling the suite


# Files whose tests run the CLI, kill it or restart servers, and the swarm's seeds (a third of the suite's CPU):
# started first, so that the last seconds of the suite are spent on short tests on every worker rather than on one
# long test while the other cores idle.
LONG_FIRST = ("test_swarm.py", "test_gateway_processes.py", "test_gateway.py",
              "test_airflow.py", "test_caching.py", "test_waits_signals_and_proxies.py", "test_ownership.py",
              "test_ledger.py", "test_shared_journal.py", "test_rough_api.py", "test_submit.py", "test_report.py",
              "test_errors.py", "test_exporter.py", "test_preflight.py", "test_fake_sdk.py", "test_watch.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long files first (a stable sort: every worker collects the same order); every async test runs under
    anyio.fail_after(ASYNC_TEST_LIMIT)."""
    rank = {name: k for k, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))
    for item in items:
        fn = getattr(item, "obj", None)
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(fn):
            item.obj = _time_limited(fn)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection loaded (pytest, hypothesis, httpx, the test modules: some 90,000 objects a worker) lives to
    the end; frozen, the cycle collector stops walking it at each full collection (about 0.6-1.4 s of CPU a worker,
    measured with gc.callbacks)."""
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish() -> None:
    """One full collection, then freeze what is left: pytest's own five at exit (which look for late unraisable
    exceptions, still reported: its hook is installed until then) then walk nothing. About 0.2-0.4 s off the end of
    the run in the last worker and again in the controller, which waits for it."""
    gc.collect()
    gc.freeze()


def _time_limited(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def limited(*args: Any, **kwargs: Any) -> Any:
        with anyio.fail_after(ASYNC_TEST_LIMIT):
            return await fn(*args, **kwargs)

    limited.time_limit = ASYNC_TEST_LIMIT  # type: ignore[attr-defined]
    return limited


@pytest.fixture(scope="session")
def s3() -> Iterator[dict[str, str]]:
    """A real S3 protocol server (moto's) on loopback, with a bucket; the environment a pipeline would set."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    import botocore.session

    client = botocore.session.get_session().create_client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                                                          region_name="us-east-1", aws_access_key_id="testing",
                                                          aws_secret_access_key="testing")
    client.create_bucket(Bucket="lake")
    yield env
    server.stop()
