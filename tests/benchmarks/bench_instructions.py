"""CPU instructions a request: a bare orjson loop against one `plan` reader worker, and the parent's duplicate
probe an id, counted by valgrind; and `plan`'s start-up beyond the bare loop's.

Usage: python tests/benchmarks/bench_instructions.py [--file /tmp/gk-bench-instructions.jsonl]

Wall time on a shared 2-core machine moves by 15% from one minute to the next; an instruction count does not.
Each loop runs under `valgrind --tool=callgrind` twice, over the file's first 2 MB and first 6 MB of lines, and
the difference divided by the lines between is the cost of one request, with start-up and imports cancelled out.
The probe is counted the same way: 100,000 ids against none, in runs of 5,600 (a piece's requests).
A worker runs as forked by `plan`: without the cycle collector. Start-up is `gatekeeper plan` of a three-line file
against `python -c "import orjson"` (what the bare loop imports), with the bytecode compiled first. Needs valgrind (Debian: apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

BARE = """import itertools, sys, orjson
with open(sys.argv[1], 'rb') as f:
    for line in itertools.islice(f, int(sys.argv[2])):
        orjson.loads(line)
"""

WORKER = """import gc, sys
from gatekeeper.input._parallel import scan_piece
gc.disable()
scan_piece(sys.argv[1], 0, int(sys.argv[3]), 1 << 28)
"""

PROBE = """import sys
from array import array
from gatekeeper.input._idindex import FP_SHIFT, IdIndex
ids, n = 100_000, int(sys.argv[1])  # the same ids made either way; n of them added
fps = array("i", [hash(f"req-{i:08d}") >> FP_SHIFT for i in range(ids)])
lines, offsets = array("I", range(1, ids + 1)), array("q", range(ids))
index = IdIndex(confirm=lambda offset: None)
index.reserve(int(ids * 1.1))
for s in range(0, n, 5600):
    e = min(n, s + 5600)
    index.add_many(lines[s:e], offsets[s:e], fps[s:e])
"""
PROBE_IDS = 100_000


def instructions(code: str, *args: str) -> int:
    return _counted(["-c", code, *args])


def _counted(argv: list[str]) -> int:
    # One hash seed for every run: with random ones, dict and set probing moved a request's count by 100-200.
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, *argv],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{run.stderr[-500:]}")
    return int(found.group(1))


def first_lines(path: str, size: int) -> tuple[int, int]:
    """(lines, bytes) of the whole lines within the file's first `size` bytes."""
    with open(path, "rb") as f:
        data = f.read(size)
    end = data.rfind(b"\n") + 1
    return data.count(b"\n", 0, end), end


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/tmp/gk-bench-instructions.jsonl")  # (its own: 10,000 requests, not 100,000)
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if not os.path.exists(a.file):
        subprocess.run([sys.executable, os.path.join(HERE, "make_requests.py"), a.file, "10000"], check=True)
    (n1, b1), (n2, b2) = first_lines(a.file, 2 << 20), first_lines(a.file, 6 << 20)
    bare = (instructions(BARE, a.file, str(n2), "") - instructions(BARE, a.file, str(n1), "")) / (n2 - n1)
    worker = (instructions(WORKER, a.file, "", str(b2)) - instructions(WORKER, a.file, "", str(b1))) / (n2 - n1)
    print(f"bare orjson loop     {bare:8,.0f} instructions a request")
    print(f"plan reader worker   {worker:8,.0f} instructions a request ({worker / bare:.2f}x; two workers share it)")
    probe = (instructions(PROBE, str(PROBE_IDS)) - instructions(PROBE, "0")) / PROBE_IDS
    print(f"duplicate probe      {probe:8,.0f} instructions an id (the parent's, beside the workers)")
    startup = _startup(a.file) - instructions("import orjson")
    print(f"plan's start-up      {startup / 1e6:8.0f} M instructions beyond the bare loop's (a three-line file)")


def _startup(path: str) -> int:
    import gatekeeper

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(gatekeeper.__file__)], check=True)
    with open(path, "rb") as f, tempfile.NamedTemporaryFile(suffix=".jsonl") as small:
        small.write(b"".join(itertools.islice(f, 3)))
        small.flush()
        return _counted(["-m", "gatekeeper", "plan", small.name, "--json"])


if __name__ == "__main__":
    main()
