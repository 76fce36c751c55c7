"""Submit from an ETL job: requests from a generator, results consumed as they arrive.

Run: python examples/etl_submit.py   (against the fake API, so it runs anywhere)

With a real account, build ApiConfig from your own secret store instead of the fake's URL and key.
"""

from __future__ import annotations

import tempfile

import anyio

import gatekeeper
from gatekeeper.testing import FakeAPI, FakeConfig


def rows():
    for i in range(1_000):
        yield {"custom_id": f"row-{i:05d}", "params": {
            "model": "claude-haiku-4-5-20251001", "max_tokens": 128,
            "messages": [{"role": "user", "content": f"Normalise this address: {i} Main St"}]}}


async def etl(url: str, state_dir: str) -> gatekeeper.Summary:
    config = gatekeeper.ApiConfig(workspace_keys=[gatekeeper.Secret("etl-key")], base_url=url)
    settings = gatekeeper.SubmitSettings(state_dir=state_dir, ceiling=2_000, interval=0.2)
    stored = 0

    def store(custom_id: str, result: dict) -> None:  # called once per final result, after it is committed
        nonlocal stored
        stored += 1

    summary = await gatekeeper.submit(rows(), config=config, settings=settings, on_result=store)
    print(f"stored {stored} results")
    return summary


with FakeAPI(FakeConfig(ceiling=2_000, rate=500, workspaces={"etl-key": "wrkspc_1"})) as fake, \
        tempfile.TemporaryDirectory() as state:
    summary = anyio.run(etl, fake.url, state)
    print(summary.to_json())
