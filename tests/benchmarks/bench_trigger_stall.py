"""The Airflow trigger and the event loop it shares: the loop's longest stall while a prepared job runs to its end,
with the job's loop in the trigger's own thread (as `GatekeeperTrigger` runs it) or on the event loop itself.

Usage: python tests/benchmarks/bench_trigger_stall.py [--requests 100000] [--rounds 2]   (needs the airflow extra)

The fake runs in a process of its own (`gatekeeper fake-api`), as the real API is elsewhere. Airflow's connections
and providers are loaded before the measurement, as a running triggerer has long done (their first load alone sets
off full collections of the heap). A ticker sleeps 5 ms at a time on the loop; a stall is how late it wakes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from gatekeeper import ApiConfig, Secret, SubmitSettings, submit, submit_sync

KEY, ADMIN = "bench-key", "bench-admin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _input(path: Path, n: int) -> None:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"custom_id": f"t-{i:06d}", "params": {"model": "claude-haiku-4-5", "max_tokens": 16,
                    "messages": [{"role": "user", "content": "a longer prompt " * 20}]}}) + b"\n")


async def _measure(body) -> float:
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            worst = max(worst, now - last - 0.005)
            last = now

    gc.collect()
    tick = asyncio.create_task(ticker())
    await body()
    tick.cancel()
    return worst


def run(n: int, how: str) -> float:
    from airflow.providers.common.compat.connection import get_async_connection, get_async_extra_dejson

    from gatekeeper.airflow import GatekeeperTrigger
    from gatekeeper.airflow._job import JobSpec

    port = _free_port()
    fake = subprocess.Popen([sys.executable, "-m", "gatekeeper", "fake-api", "--port", str(port), "--rate", "20000",
                             "--simulated-ceiling", str(10 * n), "--workspace-key", KEY, "--admin-key", ADMIN, "--json"],
                            stdout=subprocess.DEVNULL)
    try:
        time.sleep(2)
        url = f"http://127.0.0.1:{port}"
        os.environ["AIRFLOW_CONN_ANTHROPIC_DEFAULT"] = json.dumps(
            {"conn_type": "anthropic", "password": KEY, "host": url, "extra": {"admin_key": ADMIN}})
        with tempfile.TemporaryDirectory() as tmp:
            path, state = Path(tmp) / "in.jsonl", Path(tmp) / "state"
            _input(path, n)
            config = ApiConfig(workspace_keys=[Secret(KEY)], admin_key=Secret(ADMIN), base_url=url)
            settings = SubmitSettings(state_dir=state, interval=0.1)
            submit_sync(path, config=config, settings=settings, prepare_only=True)
            spec = JobSpec(conn_id="anthropic_default", input_path=str(path), state_dir=str(state), results_path=None,
                           journal=None, job=None, ledger=None, ceiling=None, budget=None, max_attempts=3, poll_interval=0.1,
                           state_base=tmp)  # (the trigger finds the job's folder by the operator's rule: under this one)

            async def main() -> float:
                conn = await get_async_connection("anthropic_default")  # (a running triggerer's warm state)
                await get_async_extra_dejson(conn)
                if how == "thread":
                    return await _measure(lambda: _drain(GatekeeperTrigger(**spec.to_kwargs()).run()))
                return await _measure(lambda: submit(path, config=config, settings=settings))

            return asyncio.run(main())
    finally:
        fake.terminate()


async def _drain(events) -> None:
    async for event in events:
        assert event.payload["status"] == "success", event.payload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for _ in range(args.rounds):
        for how in ("thread", "loop"):
            where = "in the trigger's thread" if how == "thread" else "on the event loop itself"
            print(f"{args.requests:,} requests, the job's loop {where}: longest stall {run(args.requests, how) * 1000:.1f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
