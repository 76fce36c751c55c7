"""What a results download cannot go below: each part of the collection's work measured alone, in turns, in one
process (its CPU), on the same body served by a process of its own over loopback HTTP.

Usage: python tests/benchmarks/bench_results_floor.py [--lines 50000] [--answer-bytes 10000] [--repeat 3] [--collect]

The body is `bench_result_lines.results` (10 KB answers: 50,000 lines, 525 MB), sent as the fake sends results
(chunked, 256 KB a chunk). The parts:

- socket: the body read off the socket by asyncio, 1 MB at a time, not parsed (the kernel's and the event loop's
  floor for receiving it);
- httpx: the body received through httpx (h11, httpcore, anyio), as `ApiClient.iter_result_chunks` receives it,
  and dropped;
- httpx, 1 MB reads: the same with httpcore reading up to 1 MB at a time instead of its fixed 64 KB (a class
  attribute of httpcore's, set for this part alone: what fewer, larger reads would save);
- download: httpx, the lines cut (`api._client._line_chunks`) and each decoded by `decide._settle.read_line`: a
  download's whole work short of settling, the journal and the writes;
- decode floor: the body in memory, cut the same way, each line decoded into a struct of no fields (msgspec
  reads every byte to find where a line's values end: verifying a line costs at least this);
- write: the body written through a 1 MB buffer and fsynced, as `Output.appending` writes it;
- rows: a journal's row for each line (`Journal.settling`, `Settlement.final`), in a shuffled order as results
  come, committed: what recording every result costs (SQLite's inserts, most of it).

The collection's CPU (`bench_results.py`) is these plus each line's settling and the request lines read back to
join them (`Members`). "socket + decode floor + write + rows" is the least any collection that keeps its guarantees
(every line verified, every result recorded, the output written and synced) could be brought down to; "httpx +
decode floor + write + rows" the least while the body comes through httpx. With `--collect`, each turn also runs
`bench_results.py`'s `submit` of as many requests, answers as long (this checkout's, against the fake), and the
ratios say how many times as fast as its collection each floor is, a MB for a MB: the most any change could gain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time

import httpcore
import httpx
import msgspec

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_result_lines import results  # noqa: E402
from bench_results import ROOT, run  # noqa: E402
from make_requests import write as write_requests  # noqa: E402

from gatekeeper.api._client import _line_chunks  # noqa: E402
from gatekeeper.decide._settle import read_line  # noqa: E402
from gatekeeper.state._journal import Journal  # noqa: E402

CHUNK = 1 << 18  # the fake's HTTP chunk

SERVER = """
import socket, sys
sys.path.insert(0, sys.argv[1])
from bench_result_lines import results
body = results(int(sys.argv[2]), int(sys.argv[3]))
chunks = [b"%x\\r\\n%s\\r\\n" % (len(body[at:at + CHUNK]), body[at:at + CHUNK]) for at in range(0, len(body), CHUNK)]
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    with c, c.makefile("rb") as f:
        while f.readline() not in (b"\\r\\n", b""):
            pass
        c.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-type: application/x-jsonl\\r\\ntransfer-encoding: chunked\\r\\n\\r\\n")
        for chunk in chunks:
            c.sendall(chunk)
        c.sendall(b"0\\r\\n\\r\\n")
        c.shutdown(socket.SHUT_RDWR)
""".replace("CHUNK", str(CHUNK))


async def by_socket(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /results HTTP/1.1\r\nhost: localhost\r\n\r\n")
    n = 0
    while data := await reader.read(1 << 20):
        n += len(data)
    writer.close()
    return n


async def by_httpx(port: int, lines: bool, read: int | None = None) -> int:
    """`read`: httpcore's read size for this run (64 KB otherwise, fixed; a class attribute, set back after)."""
    size = httpcore.AsyncHTTP11Connection.READ_NUM_BYTES
    httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = read or size
    try:
        return await _received(port, lines)
    finally:
        httpcore.AsyncHTTP11Connection.READ_NUM_BYTES = size


async def _received(port: int, lines: bool) -> int:
    n = 0
    async with httpx.AsyncClient(trust_env=False) as http, http.stream("GET", f"http://127.0.0.1:{port}/results") as response:
        if not lines:
            async for chunk in response.aiter_bytes():
                n += len(chunk)
            return n
        async for raws in _line_chunks(response):
            for raw in raws:
                read_line(raw)
            n += len(raws)
    return n


class _Nothing(msgspec.Struct):
    pass


def decode_floor(body: bytes) -> int:
    decode, n, start = msgspec.json.Decoder(_Nothing).decode, 0, 0
    while (end := body.find(b"\n", start)) >= 0:
        decode(body[start:end])
        start, n = end + 1, n + 1
    return n


def write(body: bytes, path: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "ab", buffering=1 << 20) as out:
        for at in range(0, len(body), 65_536):
            out.write(body[at:at + 65_536])
        out.flush()
        os.fsync(out.fileno())
    os.remove(path)
    return len(body)


def rows(journal: Journal, n: int, turn: int) -> int:
    """A row for each of `n` lines, as the collector settles succeeded ones, in one committed settlement, in a
    shuffled order (the API keeps none: each row lands anywhere in the results table)."""
    lines = list(range(turn * n, (turn + 1) * n))
    random.Random(turn).shuffle(lines)
    with journal.settling(turn) as s:
        for line in lines:
            s.final(line, f"r-{line:07d}", "succeeded", None, 1, line * 10_000, 10_000,
                    ("claude-haiku-4-5", 812, 2_480, 0, 0, 0), "end_turn")
        s.committed = (turn + 1) * n * 10_000
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--answer-bytes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--collect", action="store_true", help="also run bench_results.py's collection in each turn")
    a = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER, HERE, str(a.lines), str(a.answer_bytes)],
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        body = results(a.lines, a.answer_bytes)
        mb = len(body) / 1e6
        with tempfile.TemporaryDirectory() as tmp:
            parts = {"socket": lambda: asyncio.run(by_socket(port)),
                     "httpx": lambda: asyncio.run(by_httpx(port, lines=False)),
                     "httpx, 1 MB reads": lambda: asyncio.run(by_httpx(port, lines=False, read=1 << 20)),
                     "download": lambda: asyncio.run(by_httpx(port, lines=True)),
                     "decode floor": lambda: decode_floor(body),
                     "write": lambda: write(body, os.path.join(tmp, "out.jsonl")),
                     "rows": lambda: rows(journal, a.lines, len(cpu["rows"]))}
            journal = Journal.open(os.path.join(tmp, "state"))  # (opened once: its schema is no line's cost)
            cpu: dict[str, list[float]] = {name: [] for name in parts}
            collected: list[dict[str, float]] = []
            if a.collect:
                write_requests(os.path.join(tmp, "in.jsonl"), a.lines, approx_bytes=300)
            for _ in range(a.repeat):
                for name, part in parts.items():
                    t = time.process_time()
                    part()
                    cpu[name].append(time.process_time() - t)
                if a.collect:
                    collected.append(run(ROOT, os.path.join(tmp, "in.jsonl"), a.answer_bytes))
            journal.close()
    finally:
        server.kill()
        server.wait()
    best = {name: min(ts) for name, ts in cpu.items()}
    for name, t in best.items():
        print(f"{name:17s} {mb:,.0f} MB: {t:.3f} s CPU = {mb / t:,.0f} MB a CPU second (best of {a.repeat})")
    kept = best["decode floor"] + best["write"] + best["rows"]
    low, through = best["socket"] + kept, best["httpx"] + kept
    print(f"floor, socket + decode floor + write + rows: {low:.2f} s = {mb / low:,.0f} MB a CPU second")
    print(f"floor through httpx, httpx + decode floor + write + rows: {through:.2f} s = {mb / through:,.0f} MB a CPU "
          "second")
    if collected:
        rate = max(r["size"] / 1e6 / r["cpu"] for r in collected)
        print(f"the collection (bench_results.py, best of {len(collected)}): {rate:,.0f} MB a CPU second; the floor "
              f"is {mb / low / rate:.2f}x as fast, the floor through httpx {mb / through / rate:.2f}x")


if __name__ == "__main__":
    main()
