from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's real keys or base URL."""
    for name in list(os.environ):
        if name.startswith("ANTHROPIC_") or name.startswith("GATEKEEPER_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
