"""Soak: `gatekeeper submit` SIGKILLed at random moments against a rough fake, rerun until it finishes; then judged.

Usage: python tests/benchmarks/soak_kill.py [--seed 1] [--requests 20000] [--kills 6] [--jobs 1] [--rounds 1]
                                            [--ledger URL] [--journal URL] [--signal kill|term|int|mixed]
                                            [--same-ids] [--cached] [--usage count|count-K|scale:F|const:N|none]

The crash tests kill a run at named points; this kills it wherever the clock says, while the fake drops created
batches' answers, answers 5xx and 529, hides new batches from the listing and from retrieve, withholds results
URLs, damages every batch's first download, and ends some requests errored (once, retryable), expired (twice)
or invalid. After each kill the next run resumes from the journal; with `--journal postgresql://...` it resumes
on a new "host": the state directory, output and input copy are deleted, and the next run reads another copy at
another path (on this machine the killed run's lease is taken at once; were it not, `--lease-ttl 2` and a retry
wait it out). The password, if in the URL, is passed as PGPASSWORD. With `--jobs 2` two jobs (inputs of their own)
run at once in one workspace, each killed in its own rhythm, so a lost create can meet the other job's batch of
the same size in the listing (give them a shared `--ledger` to keep them under the ceiling together). With
`--same-ids` the jobs number their rows alike (r0, r1, ...) with prompts of their own and `--max-requests` keeps
their batches one size, so a lost answer meets a batch with our size and our ids that is not ours; each result line
is then judged against its own prompt (the fake stamps every answer with its prompt's digest). `--usage` sets what
the fake bills against count_tokens (`FakeConfig.usage`: the count less K, a scale, a gateway's constant, none). With `--cached` the
requests come in shuffled groups of six sharing a marked document, so every run primes (non-contiguous batches). With
`--signal term` (or `int`, or `mixed`: one of the three at random each time) a run is stopped the way a scheduler
or a user stops it: it must exit 130 (or finish) within 60 s and print no traceback. The judgement, from the fake's records and the
results file: every input line has exactly one final result, no request succeeded twice, no request was tried
more than three times (submit's default --max-attempts), every result that could succeed on another try did
(only the invalid ones end errored, none expired), and the queue never went past the ceiling. Prints the
figures; exits 1 on a breach.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import orjson

from gatekeeper.testing import FakeAPI, FakeConfig, Fault, Outcome, prompt_of

CEILING = 6000
MODELS = ("claude-haiku-4-5-20251001", "claude-sonnet-4-5")
ROUGH = (Fault("create", "drop_after_commit"), Fault("create", "status", 500), Fault("list", "status", 529),
         Fault("retrieve", "drop"), Fault("results", "status", 500))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=20_000, help="requests a job")
    ap.add_argument("--kills", type=int, default=6, help="kills a job")
    ap.add_argument("--jobs", type=int, default=1, help="jobs at once, in one workspace (each its own input)")
    ap.add_argument("--rounds", type=int, default=1, help="soaks in a row, seeds --seed, --seed + 1, ...")
    ap.add_argument("--ledger", help="submit's --ledger URL (a Redis or PostgreSQL one: the reservations must outlive kills)")
    ap.add_argument("--journal", help="submit's --journal URL: every run after a kill on a new host")
    ap.add_argument("--signal", choices=("kill", "term", "int", "mixed"), default="kill", help="how a run is stopped")
    ap.add_argument("--same-ids", action="store_true", help="every job numbers its rows alike (r0, r1, ...)")
    ap.add_argument("--cached", action="store_true",
                    help="requests in groups of 6 sharing a marked document (so the job is primed)")
    ap.add_argument("--usage", default="count", help="what the fake bills against count_tokens (FakeConfig.usage)")
    a = ap.parse_args()
    breaches = 0
    for seed in range(a.seed, a.seed + a.rounds):
        with tempfile.TemporaryDirectory() as work:
            breaches += not soak(seed, a.requests, a.kills, a.jobs, work, a.ledger, a.journal, a.signal,
                                   a.same_ids, a.cached, a.usage)
    sys.exit(1 if breaches else 0)


def _write_job(path: str, prefix: str, n: int, rng: random.Random, cached: bool = False) -> None:
    os.makedirs(os.path.dirname(path))
    job = os.path.basename(os.path.dirname(path))  # (no two jobs send the same prompt, even with the same ids)
    rows = []
    for i in range(n):
        params: dict = {"model": MODELS[i % 2], "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"{job} " + "x" * rng.randint(5, 200)}]}
        if cached:  # six requests a document, the document marked (1h for every other one), lines shuffled below
            d = i // 6
            params["model"] = MODELS[1]
            params["system"] = [{"type": "text", "text": f"{job} document {d}: " + "lorem ipsum " * 450,
                                 "cache_control": {"type": "ephemeral", "ttl": "1h" if d % 2 else "5m"}}]
        rows.append(orjson.dumps({"custom_id": f"{prefix}{i}", "params": params}) + b"\n")
    if cached:
        rng.shuffle(rows)
    with open(path, "wb") as f:
        f.writelines(rows)


def soak(seed: int, n: int, kills: int, jobs: int, work: str, ledger: str | None, journal: str | None,
         how: str = "kill", same_ids: bool = False, cached: bool = False, usage: str = "count") -> bool:
    rng = random.Random(seed)
    paths = [os.path.join(work, f"job{j}", "in.jsonl") for j in range(jobs)]
    prefixes = ["r" if same_ids else f"j{j}r" for j in range(jobs)]
    for path, prefix in zip(paths, prefixes, strict=True):
        _write_job(path, prefix, n, rng, cached)
    doom = {f"{p}{i}": rng.randrange(100) for p in set(prefixes) for i in range(n)}  # 0-2: errored once, 3: expired twice, 4: invalid

    def outcome(cid: str, model: str, attempt: int) -> Outcome | None:
        if doom[cid] < 3 and attempt == 1:
            return Outcome("errored", "api_error")
        if doom[cid] == 3 and attempt <= 2:
            return Outcome("expired")
        return Outcome("errored", "invalid_request_error") if doom[cid] == 4 else None

    config = FakeConfig(ceiling=CEILING, rate=150, speed=10, listing_lag=0.4, not_found_after_create=0.3,
                        results_not_found_after_end=0.3, null_results_url_after_end=0.2, damaged_downloads=1,
                        outcome=outcome, seed=seed, usage=usage)
    ran: dict[int, tuple[int, int, dict]] = {}
    with FakeAPI(config) as fake:
        fake.inject(*ROUGH * 3)
        started = time.monotonic()
        threads = [threading.Thread(target=lambda j=j: ran.__setitem__(j, _run_until_done(
            fake, paths[j], kills, random.Random(seed * 100 + j), _options(ledger, journal, seed, j, same_ids, n), how)))
            for j in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        records = fake.org.records
    over = sum(1 for k in records.tries.values() if k > 3)
    twice = sum(1 for k in records.answered.values() if k > 1)
    ok = not (over or twice or records.max_depth > CEILING)
    print(f"seed {seed}: usage {usage}; {jobs} job(s) of {n:,} requests, {elapsed:.1f} s; creates {records.creates}, refusals "
          f"{len(records.refusals)}, deepest {records.max_depth:,} of {CEILING:,}; succeeded twice "
          f"{twice}; tried over 3 times {over}", flush=True)
    for j in range(jobs):
        ok = _judged(f"  job {j}", ran[j], paths[j], prefixes[j], n, doom) and ok
    print(f"  {'ok' if ok else 'BREACH'}", flush=True)
    return ok


def _judged(name: str, ran: tuple[int, int, dict], path: str, prefix: str, n: int, doom: dict[str, int]) -> bool:
    """One job's output: every line's final result once, each answering its own prompt, only the invalid ones
    errored; and how the job's lost create answers were settled (`adoptions`)."""
    code, killed, summary = ran
    if code not in (0, 1):
        print(f"{name}: the last run exited {code}:\n{summary}")
        return False
    with open(path, "rb") as f:
        digests = {o["custom_id"]: prompt_of(o["params"])[1] for o in map(orjson.loads, f)}
    with open(summary["output"], "rb") as results:
        lines = [orjson.loads(line) for line in results]
    finals = collections.Counter(x["custom_id"] for x in lines)
    wrong = sum(1 for x in lines if x["result"]["type"] == "succeeded"
                and x["result"]["message"]["id"] != "msg_" + digests[x["custom_id"]])
    twice = sum(1 for k in finals.values() if k > 1)
    missing = sum(1 for i in range(n) if f"{prefix}{i}" not in finals)
    invalid = sum(1 for i in range(n) if doom[f"{prefix}{i}"] == 4)
    retried = summary["errored"] == invalid and summary["expired"] == 0  # every retryable one came back
    print(f"{name}: {killed} kills, exit {code}; final results {len(finals):,} (twice {twice}, missing {missing}, "
          f"another job's answer {wrong}); errored {summary['errored']} (invalid by design {invalid}); output rebuilt "
          f"{summary.get('rebuilt')}; adoptions {summary.get('adoptions')}", flush=True)
    caching = summary.get("caching")
    if caching and caching.get("priming"):
        print(f"{name}: primed in {caching['priming']['rounds']} round(s); reads {caching['read_share_of_ideal']} of "
              f"the ideal; lapsed rounds {caching['priming']['lapsed_rounds']}", flush=True)
    return retried and not (twice or missing or wrong)


def _options(ledger: str | None, journal: str | None, seed: int, job: int, same_ids: bool = False,
             n: int = 0) -> tuple[list[str], dict[str, str]]:
    """submit's extra flags and environment for a ledger, a journal, and batches of one size."""
    flags, env = ["--ledger", ledger] if ledger else [], {}
    if same_ids:
        flags += ["--max-requests", str(max(1, n // 4))]
    if journal:
        url = urllib.parse.urlsplit(journal)
        if url.password:
            env["PGPASSWORD"] = url.password
            journal = url._replace(netloc=url.netloc.replace(f":{url.password}@", "@")).geturl()
        flags += ["--journal", journal, "--job", f"soak-{seed}-{job}-{os.urandom(4).hex()}", "--lease-ttl", "2"]
    return flags, env


SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}


def _stopped(run: subprocess.Popen[bytes], sig: signal.Signals) -> str | None:
    """Stop a run with `sig`; what went wrong, if anything (a graceful stop must end in 130, or a finish, within
    60 s, with no traceback)."""
    run.send_signal(sig)
    try:
        _, err = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        run.kill()
        run.communicate()
        return f"{sig.name}: still running 60 s later"
    if sig is not signal.SIGKILL and (run.returncode not in (0, 1, 130) or b"Traceback" in err):
        return f"{sig.name}: exit {run.returncode}: {err.decode()[-2000:]}"
    return None


def _run_until_done(fake: FakeAPI, path: str, kills: int, rng: random.Random,
                    options: tuple[list[str], dict[str, str]], how: str = "kill") -> tuple[int, int, dict]:
    flags, extra = options
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "GATEKEEPER_"))}
    env.update(ANTHROPIC_BASE_URL=fake.url, ANTHROPIC_API_KEY="test-key-ws1", ANTHROPIC_ADMIN_KEY="test-admin-key",
               **extra)
    new_host = "--journal" in flags
    killed = runs = 0
    while True:
        runs += 1
        if new_host:  # a new host: another folder, another copy of the input, no state directory
            host = os.path.join(os.path.dirname(path), f"host{runs}")
            os.makedirs(host)
            shutil.copy(path, os.path.join(host, "in.jsonl"))
        here = os.path.join(host, "in.jsonl") if new_host else path
        cmd = [sys.executable, "-m", "gatekeeper", "submit", here, "--max-requests", "1500", "--interval", "0.2",
               "--reconcile-grace", "3", "--results-grace", "5", "--token-sample", "1", "--json", *flags]
        log = os.environ.get("SOAK_LOG")  # a folder: every run's events kept there, one file a run
        err_to = open(os.path.join(log, f"{os.path.basename(os.path.dirname(path))}-{runs}.err"), "wb") if log else subprocess.PIPE  # noqa: SIM115
        run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err_to)
        if killed < kills:
            try:
                run.wait(timeout=rng.uniform(0.3, 4.0))
            except subprocess.TimeoutExpired:
                sig = SIGNALS[rng.choice(list(SIGNALS)) if how == "mixed" else how]
                wrong = _stopped(run, sig)
                if wrong:
                    return 3, killed, {"stderr": wrong}
                killed += 1
                fake.inject(Fault("create", "drop_after_commit"))  # the next run starts on a lost answer too
                if new_host:
                    shutil.rmtree(host)
                continue
        out, err = run.communicate(timeout=600)
        if run.returncode == 2 and b"is running on" in err:  # the killed run's lease (2 s) has not expired yet
            time.sleep(0.5)
            if new_host:
                shutil.rmtree(host)
            continue
        if run.returncode in (0, 1):
            return run.returncode, killed, orjson.loads(out)
        return run.returncode, killed, {"stderr": err.decode()[-2000:]}


if __name__ == "__main__":
    main()
