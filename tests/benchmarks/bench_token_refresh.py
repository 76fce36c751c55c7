"""Calls against a token endpoint in trouble: how long a call waits for its token, and how many exchanges are made.

Usage: python tests/benchmarks/bench_token_refresh.py [--calls N] [--endpoint-seconds S]

The review's scenario S4, against the fake's own token endpoint: a federation token in its advisory window (valid,
due for refresh) while the endpoint takes S seconds to fail. N calls ask for a token at once, three times in a row
(1 s of the token's clock apart, inside the backoff), then once past the backoff. Printed for each mode: the longest
wait of a call, the exchanges made. Two modes: with a task group (as `connect` gives every run: the exchange in the
background) and without (a TokenAuth used on its own: the caller that starts the exchange waits, as the SDK's does).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import anyio

from gatekeeper import Federation
from gatekeeper.api._http import open_http
from gatekeeper.api._tokens import ADVISORY_BACKOFF, TokenAuth
from gatekeeper.testing import FakeAPI, FakeConfig, FakeFederation, Fault, identity_token


async def waits(auth: TokenAuth, n: int) -> float:
    """The longest of `n` concurrent calls' waits for a token, in seconds."""
    longest = [0.0]

    async def one() -> None:
        started = time.perf_counter()
        await auth.ready()
        longest[0] = max(longest[0], time.perf_counter() - started)

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return longest[0]


async def mode(background: bool, calls: int, slow: float, token_file: Path) -> tuple[float, int]:
    now = [0.0]
    with FakeAPI(FakeConfig(federation=FakeFederation(token_life=600))) as fake:
        async with open_http() as http, anyio.create_task_group() as tg:
            auth = TokenAuth(Federation("fdrl_fake_1", "org_fake_1", identity_file=token_file), None, http=http,
                             base_url=fake.url, clock=lambda: now[0], spawn=tg.start_soon if background else None)
            await auth.ready()
            fake.inject(Fault("token", status=503, delay=slow, times=10))
            longest = 0.0
            for k, at in enumerate((500.0, 501.0, 502.0, 500.0 + ADVISORY_BACKOFF + slow + 1)):
                if k == 3:
                    with anyio.fail_after(slow * 4 + 10):
                        while auth.refreshing:
                            await anyio.sleep(0.01)
                now[0] = at
                longest = max(longest, await waits(auth, calls))
            with anyio.fail_after(slow * 4 + 10):
                while auth.refreshing:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        return longest, fake.org.records.requests_seen.get("token", 0) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--endpoint-seconds", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(identity_token())
        print(f"{args.calls} calls x 4 rounds in the advisory window, token endpoint failing after "
              f"{args.endpoint_seconds:g} s")
        for background in (True, False):
            longest, exchanges = anyio.run(mode, background, args.calls, args.endpoint_seconds, token_file)
            print(f"  {'background exchange' if background else 'leader waits (SDK) '}: longest wait of a call "
                  f"{longest * 1000:8.1f} ms, exchanges {exchanges}")


if __name__ == "__main__":
    main()
