"""The gateway (`gatekeeper serve`) measured: its overhead against direct calls, a whole job through the SDK, and its
memory on a 2 GB create.

Usage: python tests/benchmarks/bench_gateway.py [--requests 250000] [--compare 100000] [--repeat 3] [--big-gb 2]

The fake API and the gateway run as processes of their own (`gatekeeper fake-api`, `gatekeeper serve`); this
process is the client.

1. **The SDK, end to end**: `client.messages.batches.create(requests=...)` with --requests requests (about 300
   bytes each) through the gateway, polled to its end, the results streamed with `client.messages.batches.results`
   and joined by custom_id. Reports each phase's seconds and MB/s, and that every request has its one line.
2. **Overhead against direct calls**: the same create body of --compare requests (at most the API's 100,000) sent
   to the fake directly and to the gateway, in turn, --repeat times; and the same batch's results downloaded from
   each. Reports MB/s and the gateway's time as a ratio of the direct call's (the median of the pairs).
3. **A 2 GB create**: a body of --big-gb GB (requests of about 1.5 KB) streamed to the gateway without ever being
   whole in this process; the gateway's peak RSS (VmHWM) before the create, at its answer, and once its job has
   planned the requests, and the create's MB/s. The batch is canceled after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fake_process import start_fake  # noqa: E402

from gatekeeper.gateway._keys import FILE, KeyFile  # noqa: E402

V = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
MODEL = "claude-haiku-4-5"
FAKE_KEY = "test-key-ws1"


def item(i: int, prefix: str, pad: int) -> bytes:
    return orjson.dumps({"custom_id": f"{prefix}{i:09d}", "params": {
        "model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": f"question {i} " + "x" * pad}]}})


def body(n: int, prefix: str, pad: int = 200) -> bytes:
    return b'{"requests":[' + b",".join(item(i, prefix, pad) for i in range(n)) + b"]}"


def hwm(pid: int) -> int:
    """A process's peak RSS so far, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    """The processes a process started (its judge)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def start_gateway(fake_url: str, state: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_"))}
    env.update({"ANTHROPIC_BASE_URL": fake_url, "ANTHROPIC_API_KEY": FAKE_KEY, "ANTHROPIC_ADMIN_KEY": "test-admin-key"})
    with open(state / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gatekeeper", "serve", "--port", str(port), "--state", str(state),
                                 "--interval", "1"], env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/healthz", timeout=30).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    sys.exit("the gateway did not start: " + (state / "serve.log").read_text()[-2000:])


def wait_ended(url: str, key: str, batch_id: str) -> dict:
    while True:
        b = httpx.get(f"{url}/v1/messages/batches/{batch_id}", headers={"x-api-key": key, **V}, timeout=120).json()
        if b["processing_status"] == "ended":
            return dict(b)
        time.sleep(0.2)


def download(url: str, key: str) -> tuple[int, float]:
    """(bytes, seconds) of a results stream read to its end."""
    started = time.perf_counter()
    n = 0
    with httpx.stream("GET", url, headers={"x-api-key": key, **V}, timeout=600) as r:
        for chunk in r.iter_bytes(1 << 20):
            n += len(chunk)
    return n, time.perf_counter() - started


def served_seconds(state: Path) -> list[float]:
    """The gateway's own seconds for each create it answered (from its log), in order."""
    return [orjson.loads(line)["seconds"] for line in (state / "serve.log").read_bytes().splitlines()
            if b'"route":"/v1/messages/batches"' in line and b'"method":"POST"' in line]


def sdk_end_to_end(gw: str, key: str, n: int, state: Path) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=gw, api_key=key, timeout=600)
    sent = [orjson.loads(item(i, "sdk-", 200)) for i in range(n)]
    size = len(orjson.dumps({"requests": sent}))
    t0 = time.perf_counter()
    batch = client.messages.batches.create(requests=sent)
    t1 = time.perf_counter()
    while client.messages.batches.retrieve(batch.id).processing_status != "ended":
        time.sleep(0.5)
    t2 = time.perf_counter()
    joined = {}
    for line in client.messages.batches.results(batch.id):
        joined[line.custom_id] = line.result.type
    t3 = time.perf_counter()
    ok = len(joined) == n and set(joined.values()) == {"succeeded"}
    served = served_seconds(state)[-1]
    print(f"SDK end to end, {n:,} requests ({size / 1e6:.0f} MB): create {t1 - t0:.1f} s in the SDK, of which {served:.1f} s "
          f"in the gateway ({size / 1e6 / served:.0f} MB/s), "
          f"job {t2 - t1:.1f} s, results streamed and joined {t3 - t2:.1f} s; {len(joined):,} lines joined, "
          f"{'every request once' if ok else 'MISSING OR FAILED LINES'}")


def compare(gw: str, fake: str, key: str, n: int, repeat: int) -> None:
    ratios_c, ratios_r, rates = [], [], {"direct create": [], "gateway create": [], "direct results": [], "gateway results": []}
    for k in range(repeat):
        data = body(n, f"cmp{k}-")
        t = time.perf_counter()
        direct = httpx.post(fake + "/v1/messages/batches", content=data, headers={"x-api-key": FAKE_KEY, **V}, timeout=600)
        d = time.perf_counter() - t
        t = time.perf_counter()
        via = httpx.post(gw + "/v1/messages/batches", content=data, headers={"x-api-key": key, **V}, timeout=600)
        g = time.perf_counter() - t
        assert direct.status_code == via.status_code == 200, (direct.text, via.text)
        rates["direct create"].append(len(data) / d / 1e6)
        rates["gateway create"].append(len(data) / g / 1e6)
        ratios_c.append(g / d)
        done_direct = wait_ended(fake, FAKE_KEY, direct.json()["id"])
        done_gw = wait_ended(gw, key, via.json()["id"])
        nd, td = download(done_direct["results_url"], FAKE_KEY)
        ng, tg = download(done_gw["results_url"], key)
        rates["direct results"].append(nd / td / 1e6)
        rates["gateway results"].append(ng / tg / 1e6)
        ratios_r.append(tg / td * nd / ng)
    print(f"overhead, {n:,} requests ({len(data) / 1e6:.0f} MB) a create, {repeat} pairs: " + ", ".join(
        f"{name} {statistics.median(v):.0f} MB/s" for name, v in rates.items()))
    print(f"  gateway/direct time: create {statistics.median(ratios_c):.2f}x, results (per byte) {statistics.median(ratios_r):.2f}x")


def stream_body(gb: float, pad: int = 1300) -> Iterator[bytes]:
    """A create body of about `gb` GB, made as it is sent (never whole here)."""
    total = int(gb * 1e9)
    yield b'{"requests":['
    sent, i, chunk = 0, 0, []
    while sent < total:
        line = item(i, "big-", pad)
        chunk.append(line if i == 0 else b"," + line)
        sent += len(line) + 1
        i += 1
        if len(chunk) >= 2000:
            yield b"".join(chunk)
            chunk = []
    yield b"".join(chunk) + b"]}"


def big_create(gw: str, key: str, pid: int, gb: float, state: Path) -> None:
    before = hwm(pid)
    t = time.perf_counter()
    size = sum(len(c) for c in stream_body(gb))  # (the same body again, counted: made twice, never held)
    r = httpx.post(gw + "/v1/messages/batches", content=stream_body(gb), headers={"x-api-key": key, **V}, timeout=3600)
    elapsed = time.perf_counter() - t
    at_answer = hwm(pid)
    assert r.status_code == 200, r.text
    batch = r.json()
    time.sleep(1.0)
    deadline = time.monotonic() + 600  # (until its job has planned: the planned event in the log)
    log = state / "serve.log"
    while b'"job_planned"' not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    planned = hwm(pid)
    judges = [hwm(c) for c in children(pid)]
    made = [orjson.loads(line) for line in log.read_bytes().splitlines() if b'"event":"batch_created"' in line][-1]
    httpx.post(f"{gw}/v1/messages/batches/{batch['id']}/cancel", headers={"x-api-key": key, **V}, timeout=120)
    print(f"2 GB create: {size / 1e9:.2f} GB, {batch['request_counts']['processing']:,} requests, answered in {elapsed:.1f} s "
          f"({size / 1e6 / elapsed:.0f} MB/s, the client making the body included); gateway peak RSS {before / 2**20:.0f} MiB "
          f"before, {at_answer / 2**20:.0f} MiB at the answer, {planned / 2**20:.0f} MiB once its job had planned it; "
          f"its judge process {', '.join(f'{j / 2**20:.0f} MiB' for j in judges) or 'none'} (its two readers forked from it); "
          f"in the gateway: received and cut {made['received_s']:.1f} s ({size / 1e6 / made['received_s']:.0f} MB/s), "
          f"judged {made['judged_s']:.1f} s ({size / 1e6 / made['judged_s']:.0f} MB/s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=250_000)
    ap.add_argument("--compare", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-gb", type=float, default=2.0)
    a = ap.parse_args()
    fake_proc, fake = start_fake("--simulated-ceiling", "1000000", "--rate", "1000000", "--speed", "100")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        key = KeyFile(state / FILE).add("bench")
        port = 18000 + os.getpid() % 2000
        gw_proc = start_gateway(fake, state, port)
        gw = f"http://127.0.0.1:{port}"
        try:
            if a.requests:
                sdk_end_to_end(gw, key, a.requests, state)
            if a.compare:
                compare(gw, fake, key, min(a.compare, 100_000), a.repeat)
            if a.big_gb:
                big_create(gw, key, gw_proc.pid, a.big_gb, state)
        finally:
            gw_proc.terminate()
            gw_proc.wait(120)
            fake_proc.terminate()
            fake_proc.wait(30)


if __name__ == "__main__":
    main()
