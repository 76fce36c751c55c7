"""Reading the queue over the network: the ceiling (Admin API) and the depth (every workspace key)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from .._clock import WALL, Clock
from .._errors import ApiError, AuthenticationError, TransportError
from .._tasks import tasks_beside
from ..decide._headroom import (
    Headroom,
    ModelLimits,
    QueuedBatch,
    build_headroom,
    enqueued_ceiling,
    live_batches,
    model_limits,
    parse_time,
)
from ._client import ApiClient
from ._config import ApiConfig
from ._http import RetryNotice, open_http
from ._reads import rate_limits
from ._retry import CallBudget, RetryPolicy

# A batch expires 24 h after creation, so one created longer ago than this has
# ended: listing (newest first) can stop there instead of reading all history.
LIVE_HORIZON = dt.timedelta(hours=25)


@dataclass
class Connection:
    """One client per workspace key (labelled by position), plus the Admin client when a key was given; `account`
    names whose queue and batches these are without a secret (`ApiConfig.fingerprint`)."""

    workspaces: Sequence[ApiClient]
    admin: ApiClient | None
    account: str = ""
    # whether the organization's routes are only tried (a platform's, with the workspace's own credentials): a
    # refusal there leaves the ceiling unknown, where a refused Admin key stops the command
    admin_tried: bool = False
    ceiling_source: str = "admin-api"  # how a ceiling its organization's routes gave is named (`Platform.ceiling_source`)
    workspace: str | None = None  # the primary workspace's print (`ApiConfig.workspace_print`)
    # where a job's batches are found: the platform (its name, its title) and its scope (`Platform.scope`)
    platform: tuple[str, str, str] = ("anthropic", "Anthropic's API", "")

    @property
    def primary(self) -> ApiClient:
        return self.workspaces[0]


@asynccontextmanager
async def connect(config: ApiConfig, *, retry: RetryPolicy | None = None, max_rpm: float | None = None,
                  on_retry: RetryNotice | None = None, clock: Clock = WALL,
                  transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[Connection]:
    """Clients for every workspace the platform reads (`Platform.auths`), over one HTTP client and one call budget
    (the batch RPM limit is the organization's; `max_rpm` None: the platform's default, `ApiConfig.default_rpm`), and
    for its organization's routes when it has them (`Platform.admin`). `on_retry` hears of every call that is
    retried (so nobody waits in silence). A credential's tokens are exchanged ahead of expiry in the background, for
    as long as the connection is open. Every wait and reading of time (retries, retry-after, the call budget, token
    expiry) is on `clock`; `transport` replaces the network (`open_http`). A platform that serves no batches is
    refused here, before any call. A background exchange records its failures for the calls that wait on it."""
    config.require_workspace_key()  # (a platform without batches is refused here, before any call)
    platform = config.platform
    budget = CallBudget(per_minute=max_rpm or config.default_rpm)
    timed = {"sleep": clock.sleep, "clock": clock.monotonic, "wall": clock.now}
    async with open_http(transport=transport) as http, tasks_beside() as spawn:
        common: dict[str, Any] = {"retry": retry, "on_retry": on_retry, "platform": platform, **timed}
        auths = platform.auths(config, http, spawn, clock)
        ws = [ApiClient(http, config.base_url, auth, label=label, budget=budget, api_version=config.version, **common)
              for auth, label in auths]
        # (the Admin API keeps the version its fields were written for: gatekeeper reads 2023-06-01's names there;
        # it has its own limits, apart from the batch call budget)
        org = platform.admin(config, http, spawn, auths)
        admin = None if org is None else ApiClient(http, org[0], org[1], label=org[2], **common)
        yield Connection(ws, admin, config.fingerprint(), admin_tried=config.admin_key is None,
                         ceiling_source=platform.ceiling_source, workspace=config.workspace_print(),
                         platform=(platform.name, platform.title, config.scope))


async def recent_batches(client: ApiClient, now: float) -> AsyncIterator[dict[str, Any]]:
    """Every batch one key can see that may still be live: newest first, stopping past the 25-hour horizon."""
    horizon = now - LIVE_HORIZON.total_seconds()
    async for batch in client.list_batches(limit=1000):
        created = parse_time(batch.get("created_at"))
        if created is not None and created < horizon:
            return
        yield batch


async def read_live(client: ApiClient, workspace: str, *, now: float | None = None) -> list[QueuedBatch]:
    """The live batches one key can see."""
    return live_batches([b async for b in recent_batches(client, client.calls.now() if now is None else now)], workspace)


async def read_ceiling(conn: Connection, override: int | None) -> tuple[int | None, str | None, str | None]:
    """(ceiling, source, error). `override` (--ceiling) wins; an Admin key that is refused is a configuration error
    (organization routes only tried, `Connection.admin_tried`, that refuse leave the ceiling unknown)."""
    if override is not None:
        return override, "--ceiling", None
    if conn.admin is None:
        return None, None, "no admin key"
    try:
        entries = await rate_limits(conn.admin, "batch")
    except AuthenticationError as exc:
        if not conn.admin_tried:
            raise  # a refused key is a configuration error, not a missing reading
        return None, None, f"could not read the ceiling: {exc}"
    except (ApiError, TransportError) as exc:
        return None, None, f"could not read the ceiling: {exc}"
    ceiling = enqueued_ceiling(entries)
    if ceiling is None:
        return None, None, "the rate-limits answer has no batch group with enqueued_batch_requests"
    return ceiling, conn.ceiling_source, None


async def read_model_limits(conn: Connection) -> dict[str, ModelLimits]:
    """The real-time lane's limits by model, from the Admin API's model groups ({} without an Admin key, or when it
    cannot say: the lane then starts from the lowest tier's and the headers correct it)."""
    if conn.admin is None:
        return {}
    try:
        return model_limits(await rate_limits(conn.admin, "model_group"))
    except (ApiError, TransportError):
        return {}


async def read_depth(conn: Connection) -> list[QueuedBatch]:
    rows: list[QueuedBatch] = []
    for i, client in enumerate(conn.workspaces):
        rows.extend(await read_live(client, f"ws{i + 1}"))
    return rows


async def read_headroom(conn: Connection, *, ceiling: int | None = None) -> Headroom:
    """One full reading: ceiling and depth over every workspace key."""
    value, source, error = await read_ceiling(conn, ceiling)
    rows = await read_depth(conn)
    return build_headroom(value, rows, len(conn.workspaces), ceiling_source=source, ceiling_error=error,
                          read=[f"ws{i + 1}: {c.label}" for i, c in enumerate(conn.workspaces)])
