"""Fixtures around the fake API."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gatekeeper.testing import FakeAPI, FakeConfig

WS1, WS2, WS3 = "test-key-ws1", "test-key-ws2", "test-key-ws3"
ADMIN = "test-admin-key"


@contextmanager
def running_fake(**config: Any) -> Iterator[FakeAPI]:
    config.setdefault("workspaces", {WS1: "wrkspc_1", WS2: "wrkspc_2", WS3: "wrkspc_3"})
    with FakeAPI(FakeConfig(**config)) as fake:
        yield fake


def env_for(fake: FakeAPI, *, keys: tuple[str, ...] = (WS1,), admin: bool = True, **extra: str) -> dict[str, str]:
    env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": keys[0]}
    if len(keys) > 1:
        env["ANTHROPIC_EXTRA_WORKSPACE_KEYS"] = ",".join(keys[1:])
    if admin:
        env["ANTHROPIC_ADMIN_KEY"] = ADMIN
    env.update(extra)
    return env
