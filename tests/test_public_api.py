"""The public API stays small, explicit and whole: every type a public function takes is exported."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

import gatekeeper
import gatekeeper.testing

EXPECTED = {
    # planning
    "plan", "iter_batches", "PlanReport", "BatchPlan", "Batch", "Rejection", "Request", "Limits",
    # submitting
    "submit", "submit_sync", "dry_run", "cancel", "job_summary", "export", "preflight", "forecast_deadline", "SubmitSettings", "Summary",
    "ApiConfig", "Platform", "AwsPlatform", "GooglePlatform",
    "Auth", "Outgoing", "CacheScan",  # what a `Platform` subclass's hooks give and take; `PlanReport.cache_scan`
    "status", "Status", "Headroom", "QueuedBatch", "LedgerReading",  # the queue's status, read and judged as `gatekeeper status` prints it
    "DryRun", "Canceled", "CanceledBatch",
    "submit_table", "submit_table_sync", "plan_table", "TableSpec", "Template", "TableResult", "TablePlan",
    "Secret", "BearerToken", "Federation", "ProfileLogin", "RetryPolicy", "PriceTable", "Rates", "load_prices", "Ledger", "Liveness", "open_ledger",
    "Reservation", "Claim", "ClaimPost", "Board",  # what a `Ledger`'s methods take and give (a ledger of one's own)
    "Clock", "WallClock",  # the one clock a run reads and waits on (a simulation hands down its own)
    # the type aliases public functions take
    "Source", "ModelRules", "EventSink", "ResultSink", "Credential", "TokenProvider", "RetryNotice", "TableJudge", "Spawn",
    # errors
    "GatekeeperError", "ExitCode", "UsageError", "Unreachable", "LedgerError", "InputError", "OutputError",
    "JournalError", "CredentialsError", "TokenExpired", "Interrupted", "TransportError", "ApiError", "AuthenticationError", "NotFoundError",
    "RequestTooLarge", "AccountRefused", "SpendLimitReached", "RateLimited", "QueueFull", "ServerError", "BadRequest",
    "CreateOutcomeUnknown", "IncompleteDownload", "DuplicateJob", "JobLive", "JobMissing",
}


def test_all_is_pinned_and_resolves() -> None:
    """__all__ is exactly the documented names, and each one exists."""
    assert set(gatekeeper.__all__) == EXPECTED
    assert all(hasattr(gatekeeper, name) for name in gatekeeper.__all__)
    assert set(gatekeeper.testing.__all__) == {"DEFAULT_MODELS", "FakeAPI", "FakeAws", "FakeGoogle", "FakeConfig", "FakeModel", "FakeRealtime",
                                               "Fault", "Outcome", "prompt_of", "FakeFederation", "FakeRule", "identity_token",
                                               "Records", "fake_token_count"}


ROOMS = {"decide", "input", "api", "state", "checks", "run", "watch", "tables", "cli", "gateway"}  # the packages (their order: the layers contract)


RUN_LANES = ("batch", "realtime", "recovery", "shared")  # run/'s packages, one a lane (shared: what every lane shares)
SUBPACKAGES = {"run": set(RUN_LANES), "state": {"ledger"}}  # packages inside a package: run/'s lanes, the ledger's backends


def test_implementation_modules_are_private() -> None:
    """Every module starts with an underscore: at the top, beside the packages of the house, `testing` and `airflow`
    (the integration, the only place Airflow is imported); and in each package, whose own namespace exports nothing
    (the public API is `gatekeeper`, `gatekeeper.testing` and `gatekeeper.airflow`)."""
    top = {m.name: m.ispkg for m in pkgutil.iter_modules(gatekeeper.__path__)}
    assert {n for n, pkg in top.items() if pkg} == ROOMS | {"testing", "airflow"}
    inner = [m.name for m in pkgutil.iter_modules(importlib.import_module("gatekeeper.airflow").__path__)
             ] if importlib.util.find_spec("airflow") else ["_"]
    assert all(n.startswith("_") for n in inner), inner
    assert all(n.startswith("_") for n, pkg in top.items() if not pkg), top
    assert len([n for n, pkg in top.items() if not pkg]) <= 12
    rooms = [*ROOMS, *(f"run.{lane}" for lane in RUN_LANES), "state.ledger"]
    for room in rooms:
        package = importlib.import_module(f"gatekeeper.{room}")
        inner = {m.name: m.ispkg for m in pkgutil.iter_modules(package.__path__)}
        assert inner and all(n.startswith("_") for n, pkg in inner.items() if not pkg), (room, inner)
        assert {n for n, pkg in inner.items() if pkg} == SUBPACKAGES.get(room, set()), room
        assert [n for n in vars(package) if not n.startswith("_") and n not in SUBPACKAGES.get(room, ())] == [], room


def _classes_in(hint: object) -> typing.Iterator[type]:
    if isinstance(hint, type):
        yield hint
    for arg in typing.get_args(hint):
        yield from _classes_in(arg)


def _as_checked(name: str, seen: dict[str, dict[str, object]] | None = None) -> dict[str, object]:
    """Module `name`'s names as a type checker sees them: its `if TYPE_CHECKING:` blocks run too, and a name they
    import from a sibling module is looked up the same way (it may exist only for the checker, as `Source`)."""
    seen = {} if seen is None else seen
    if name in seen:
        return seen[name]
    module = importlib.import_module(name)
    names = seen[name] = dict(vars(module))
    for node in ast.parse(inspect.getsource(module)).body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level:
                sibling = _as_checked(importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), module.__package__), seen)
                names.update({alias.asname or alias.name: sibling[alias.name] for alias in stmt.names})
            else:
                exec(compile(ast.Module([stmt], []), str(module.__file__), "exec"), names)
    return names


def test_every_type_a_public_function_takes_or_returns_is_exported() -> None:
    """A user can name (and import from `gatekeeper`) every gatekeeper type in a public signature."""
    missing = set()
    for name in gatekeeper.__all__:
        obj = getattr(gatekeeper, name)
        targets = [obj] if inspect.isfunction(obj) else []
        if inspect.isclass(obj) and "__init__" in vars(obj):
            targets.append(obj.__init__)
        for fn in targets:
            for hint in typing.get_type_hints(fn, _as_checked(fn.__module__)).values():
                for cls in _classes_in(hint):
                    if cls.__module__.startswith("gatekeeper.") and cls.__name__ not in EXPECTED:
                        missing.add(f"{name}: {cls.__module__}.{cls.__name__}")
    assert not missing


# exported to be named (`PlanReport.cache_scan`'s type), read through what reports it (`PlanReport.caching`): its
# members are the reader's, and take the reader's own types
OPAQUE = {"CacheScan"}


def test_every_type_a_public_method_or_field_takes_is_exported() -> None:
    """The same for the exported classes' public methods and properties (`ApiConfig.from_env`, `Ledger.put_claim`)
    and their dataclass fields (`SubmitSettings`'s): what a user calls or fills in, they can name."""
    missing = set()
    for name in gatekeeper.__all__:
        obj = getattr(gatekeeper, name)
        if not inspect.isclass(obj) or name in OPAQUE:
            continue
        members = [getattr(v, "fget", None) or getattr(v, "__func__", v) for k, v in vars(obj).items()
                   if not k.startswith("_") and (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod, property)))]
        hints = [h for fn in members for h in typing.get_type_hints(fn, _as_checked(fn.__module__)).values()]
        if dataclasses.is_dataclass(obj) or hasattr(obj, "__struct_fields__"):  # (msgspec's too: `PlanReport`)
            hints += typing.get_type_hints(obj, _as_checked(obj.__module__)).values()
        missing |= {f"{name}: {cls.__module__}.{cls.__name__}" for hint in hints for cls in _classes_in(hint)
                    if cls.__module__.startswith("gatekeeper.") and cls.__name__ not in EXPECTED}
    assert not missing


def _is_alias(obj: object) -> bool:
    """A type alias (`X = A | B`, `Callable[...]`, `dict[...]`), not a class nor a bare typing form."""
    return not isinstance(obj, type) and (typing.get_origin(obj) is not None or isinstance(obj, types.UnionType))


def test_every_type_alias_a_public_signature_names_is_exported() -> None:
    """A user can name every alias a public function, constructor, method or field is annotated with (`Source`,
    `EventSink`, `Credential`, ...) from `gatekeeper`, as the same object."""
    missing = set()
    for name in gatekeeper.__all__:
        obj = getattr(gatekeeper, name)
        fns = [obj] if inspect.isfunction(obj) else []
        if inspect.isclass(obj) and name not in OPAQUE:
            fns += [getattr(v, "fget", None) or getattr(v, "__func__", v) for k, v in vars(obj).items()
                    if (k == "__init__" or not k.startswith("_")) and (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod, property)))]
        annotated = [(fn.__module__, getattr(fn, "__annotations__", {})) for fn in fns]
        if dataclasses.is_dataclass(obj) or hasattr(obj, "__struct_fields__"):
            annotated.append((obj.__module__, inspect.get_annotations(obj)))
        for module, hints in annotated:
            space = _as_checked(module)
            for text in map(str, hints.values()):
                for word in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)):
                    value = space.get(word)
                    if _is_alias(value) and getattr(gatekeeper, word, None) is not value:
                        missing.add(f"{name}: {module}.{word}")
    assert not missing
    aliases = {n for n in gatekeeper.__all__ if _is_alias(getattr(gatekeeper, n))}
    assert aliases == {"Source", "ModelRules", "EventSink", "ResultSink", "Credential", "TokenProvider", "RetryNotice",
                       "TableJudge", "Spawn"}  # (docs/api.md shows each: `test_api_reference_lists_every_public_name`)


def test_one_exception_hierarchy_in_one_module() -> None:
    """Every public exception class in the package is defined in _errors and derives from GatekeeperError."""
    import gatekeeper._errors as errors

    found = []
    for info in pkgutil.walk_packages(gatekeeper.__path__, "gatekeeper."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name and not cls.__name__.startswith("_"):
                found.append(cls)
    assert found and all(c.__module__ == errors.__name__ for c in found), [c for c in found if c.__module__ != errors.__name__]
    assert all(issubclass(c, gatekeeper.GatekeeperError) for c in found)


def test_airflow_is_imported_only_by_gatekeeper_airflow() -> None:
    """The extra is the only place Airflow is imported: no other module names it."""
    root = Path(gatekeeper.__file__).parent
    naming = [str(p.relative_to(root)) for p in root.rglob("*.py")
              if p.parent.name != "airflow" and re.search(r"^\s*(from|import) airflow\b", p.read_text(), re.M)]
    assert naming == []


def test_cli_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    """--version, --help and plan load neither httpx nor anyio (the CLI starts as fast as Python), nor what
    `plan` without a key never needs: pickle (the readers' pieces travel by marshal), shutil (argparse's), orjson
    (msgspec decodes the lines and writes the JSON), the API configuration, typing_extensions (msgspec's import goes
    without it: docs/development.md, start-up)."""
    data = tmp_path / "in.jsonl"
    data.write_text('{"custom_id": "a", "params": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}}\n')
    probe = (
        "import sys, contextlib, io\n"
        "from gatekeeper.cli._cli import main\n"
        "for argv in (['--version'], ['--help'], ['plan', sys.argv[1]]):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "print(sorted(m for m in ('httpx', 'anyio', 'sqlite3', 'gatekeeper.run._loop', 'pickle', 'shutil', 'orjson',"
        " 'gatekeeper.api._config', 'typing_extensions')"
        " if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    out = subprocess.run([sys.executable, "-c", probe, str(data)], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_version_is_answered_before_the_parser_is_built() -> None:
    """`gatekeeper --version` prints what argparse's version action printed, and loads neither argparse nor the
    CLI's other modules (its start is Python's own, docs/development.md)."""
    probe = ("import sys\nfrom gatekeeper.cli._cli import main\ncode = main(['--version'])\n"
             "print(code, sorted(m for m in ('argparse', 'gatekeeper.cli._parser', 'gatekeeper.cli._common', 'msgspec')"
             " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    from gatekeeper import __version__

    assert out.stdout.splitlines() == [f"gatekeeper {__version__}", "0 []"], out.stdout + out.stderr


@pytest.mark.parametrize("columns", ["50", "120", "", "wide", "-3", None])
def test_help_is_as_wide_as_shutil_would_make_it(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    """The CLI finds the help width without importing shutil, and finds the one argparse would have with it."""
    import shutil

    from gatekeeper.cli._parser import _columns

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert _columns() == shutil.get_terminal_size().columns


def test_every_async_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    """The suite cannot hang on an async test: each one runs under a deadline (tests/conftest.py)."""
    coroutines = [item for item in request.session.items
                  if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj)]
    assert all(getattr(item.obj, "time_limit", None) for item in coroutines)


def _alias_docstring(name: str) -> str:
    """A type alias's docstring as the API reference reads it: the string right after its assignment."""
    module = importlib.import_module(f"gatekeeper.{gatekeeper._EXPORTS[name]}")
    body = ast.parse(inspect.getsource(module)).body
    for node, after in zip(body, body[1:], strict=False):
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == name:
            return after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
    return ""


def test_every_public_name_says_what_it_is() -> None:
    """A docstring on every public function and class (the API reference is made from them), and on every type
    alias the string after its assignment."""
    missing = [n for n in gatekeeper.__all__ if not (_alias_docstring(n) if _is_alias(getattr(gatekeeper, n))
                                                      else getattr(gatekeeper, n).__doc__ or "").strip()]
    assert missing == []


def test_submit_sync_takes_submits_arguments_by_name() -> None:
    """No **kwargs: a type checker and a reader see every argument of the synchronous call."""
    sync = inspect.signature(gatekeeper.submit_sync).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in sync.values())
    assert set(sync) <= set(inspect.signature(gatekeeper.submit).parameters)
    assert {"source", "config", "settings", "on_event", "on_result"} <= set(sync)


def test_every_install_hint_names_the_distribution_of_its_own() -> None:
    """`gatekeeper` on the package registry is an unrelated library: no hint (README, docs, examples, messages, the
    provider's metadata) may install it; the distribution is pyproject's name."""
    import re
    import tomllib

    root = Path(__file__).resolve().parent.parent
    name = tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"]
    assert name == "gatekeeper-batches"
    files = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "examples").rglob("*.py"),
             *(root / "gatekeeper").rglob("*.py")]
    # (the distribution a `pip install` names: its first argument, quotes and extras stripped)
    wrong = [f"{p.relative_to(root)}: {m.group(0)}" for p in files
             for m in re.finditer(r"pip install\s+(?:-\w+\s+)*['\"]?([\w.-]+)", p.read_text())
             if m.group(1) == "gatekeeper"]
    assert wrong == []
    from gatekeeper.airflow._provider import get_provider_info

    assert get_provider_info()["package-name"] == name


def test_the_api_reference_shows_every_public_name() -> None:
    """docs/api.md renders each name of `gatekeeper.__all__` from its docstring (a name added without a page entry
    fails here)."""
    import gatekeeper

    doc = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    shown = set(re.findall(r"^::: gatekeeper\.(\w+)$", doc, re.M))
    assert sorted(set(gatekeeper.__all__) - shown) == [] and sorted(shown - set(gatekeeper.__all__)) == []


def _classes() -> dict[str, tuple[int, int, list[str], str]]:
    """name -> (body lines, methods, base names, file) of every class in the package."""
    out: dict[str, tuple[int, int, list[str], str]] = {}
    for path in Path(gatekeeper.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                out[f"{path.name}:{node.name}"] = (node.end_lineno - node.lineno + 1, methods, bases, path.name)
    return out


def test_no_class_a_reader_cannot_hold() -> None:
    """No class whose body with its in-project parents passes 300 lines or 40 methods (collaborators are held,
    not inherited)."""
    classes = _classes()
    by_name = {key.split(":")[1]: value for key, value in classes.items()}

    def whole(name: str, seen: frozenset[str] = frozenset()) -> tuple[int, int]:
        if name not in by_name or name in seen:
            return 0, 0
        lines, methods, bases, _ = by_name[name]
        for base in bases:
            more = whole(base, seen | {name})
            lines, methods = lines + more[0], methods + more[1]
        return lines, methods

    sizes = {key: whole(key.split(":")[1]) for key in classes}
    too_big = {key: size for key, size in sizes.items() if size[0] > 300 or size[1] > 40}
    assert not too_big, too_big
    assert max(size[0] for size in sizes.values()) > 200  # (the measure sees the large ones: it is not vacuous)


def test_all_is_a_literal_list_a_type_checker_reads_and_names_every_export() -> None:
    """`mypy --strict` sees only what a literal `__all__` lists, and only names the `TYPE_CHECKING` block imports (a
    cold test found every public name refused as not exported while `__all__` was computed)."""
    import ast

    import gatekeeper

    tree = ast.parse(Path(gatekeeper.__file__).read_text())
    literal = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    assert isinstance(literal, ast.List) and all(isinstance(e, ast.Constant) for e in literal.elts)
    assert [e.value for e in literal.elts] == sorted(gatekeeper._EXPORTS)  # type: ignore[attr-defined]
    checked = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {a.asname or a.name for n in ast.walk(checked) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert set(gatekeeper._EXPORTS) <= imported, set(gatekeeper._EXPORTS) - imported  # type: ignore[attr-defined]
