"""Preparing a run: read the ceiling, then plan the input into the journal (a new job) or check that it is the
same input (a resumed one); with a budget, every model must have a price; one live run a job in a shared ledger."""

from __future__ import annotations

import os
import socket

from ..._clock import run_sync
from ..._errors import ApiError, DuplicateJob, InputError, JournalError, NotFoundError, TransportError, UsageError
from ...api._queue import read_ceiling, read_model_limits
from ...api._tokens import KeyAuth
from ...checks._preflight import plan_checked
from ...decide._admission import batch_size_for
from ...decide._headroom import ModelLimits
from ...decide._priming import round_size
from ...input._cachereport import Marked, caching_report, marked, priming_rounds, without_lines
from ...input._planner import PlanReport
from ...input._sizing import Limits, body_size, pack_rows
from ...state._journal import BatchState, JobPlan, Journal, PendingRow
from ...state._records import Group
from ._inputs import hash_file, stat_identity
from ._part import Part, RunContext


class Preparation(Part):
    """Everything a run does before its first reading of the queue."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.ceiling: int | None = None
        self.realtime_limits: dict[str, ModelLimits] = {}  # model -> its limits, with a deadline
        self.batch_size = ctx.settings.limits.max_requests

    async def prepare(self) -> tuple[int | None, int]:
        """Read the ceiling; plan the input into the journal, or check it is the same input on resume. The ceiling
        and the batch size the job runs with."""
        await self.api.list_page(limit=1)  # an unreachable API or a refused key stops us before anything is journaled
        if len(self.conn.workspaces) > 1 or not isinstance(self.api.calls.auth, KeyAuth):  # (what the depth covers)
            self.emit("workspaces", {"read": [f"ws{i + 1}: {c.label}" for i, c in enumerate(self.conn.workspaces)]})
        self.ceiling, _, error = await read_ceiling(self.conn, self.settings.ceiling)
        if self.settings.deadline is not None:
            self.realtime_limits = await read_model_limits(self.conn)
        if error and self.ceiling is None:
            self.emit("ceiling_unknown", {"reason": error, "policy": "learn a bound from queue-full refusals"})
        if self.journal.initialized:
            await self._resume()
        else:
            await self._start()
        self._check_prices()
        await self._claim_job()
        return self.ceiling, self.batch_size

    def _check_prices(self) -> None:
        """With a budget, every model must have a price: a cost that cannot be bounded cannot be kept under one."""
        if self.settings.budget is None:
            return
        models = ((self.journal.get_meta("report") or {}).get("models") or {}).keys()
        unpriced = sorted(m for m in models if self.prices.lookup(m) is None)
        if unpriced:
            raise UsageError(f"a budget needs a price for every model; none is known for {', '.join(unpriced)} "
                             "(give a price table that has them)", setting="prices")

    async def _claim_job(self) -> None:
        """One input, one live job per account: refused when the shared ledger knows another live run of it (keyed by
        the account, never a secret: a run with a rotated key or token is the same job)."""
        digest = (self.journal.get_meta("input") or {}).get("sha256", "")
        job = f"{digest}:{self.conn.account}"
        info = {"host": socket.gethostname(), "state_dir": os.path.abspath(self.journal.state_dir), "pid": os.getpid()}
        other = await self.ledger.claim_job(job, info)
        if other is None:
            return
        if not self.settings.allow_duplicate:
            raise DuplicateJob(f"this input is already being submitted to this workspace from {other.get('host')} "
                               f"(state directory {other.get('state_dir')}); a second run would send it twice",
                               setting="allow_duplicate")
        self.emit("duplicate_allowed", {"other": other})

    async def _resume(self) -> None:
        j = self.journal
        await check_identity(self.journal, self.path)
        self._check_platform()
        recorded = j.get_meta("output")
        if recorded and os.path.abspath(self.out.path) != recorded:
            if not j.job:
                raise JournalError(f"this job writes its results to {recorded}; the output cannot change on resume")
            # A shared journal's job moves between hosts: the output goes where this host puts it (rebuilt there).
            j.set_meta("output", os.path.abspath(self.out.path), "output_moved", previous=recorded)
        self.batch_size = int((j.get_meta("settings") or {}).get("batch_size", self.batch_size))
        self.emit("resumed", {"state_dir": str(j.state_dir), "batches": len(j.batches()),
                              "collected": j.count(BatchState.COLLECTED)})
        j.event("resumed", collected=j.count(BatchState.COLLECTED))
        if self.user_canceled and self.settings.resume_canceled:
            j.set_meta("user_canceled", False, "cancel_lifted", not_sent=j.held_back())
            self.emit("cancel_lifted", {"not_sent": j.held_back()})
        await self._check_visible()

    def _check_platform(self) -> None:
        """A job's batches are found only on the platform (and in the scope) it was submitted to: a rerun with
        another's settings would poll ids that platform never made, counted live for a day. Refused at once, in one
        line naming both; a journal of an earlier version records this run's."""
        name, title, scope = self.conn.platform
        recorded = self.journal.get_meta("platform")
        if recorded is None:
            self.journal.set_meta("platform", {"name": name, "title": title, "scope": scope})
            return
        if (recorded.get("name"), recorded.get("scope")) == (name, scope):
            return
        was = f"{recorded.get('title') or recorded.get('name')}" + (f" ({recorded['scope']})" if recorded.get("scope") else "")
        now = f"{title}" + (f" ({scope})" if scope else "")
        raise UsageError(f"job {self.journal.job or self.journal.state_dir} was submitted to {was}, and its batches are "
                         f"found only there; this run goes to {now}. Run it with that platform's settings (--platform "
                         f"{recorded.get('name')}), or start another job (--job, or another --state)", setting="platform")

    async def _check_visible(self, most: int = 3) -> None:
        """A job is named by its account, not its key (`ApiConfig.fingerprint`), so a rerun may come with another
        key, of the same workspace (rotated: fine) or of another (which would count the job's batches live for a
        day, then look for their results in vain). When none of (at most `most` of) its live batches is visible,
        each a 404 past the API's lag after a create, the run is refused before anything is sent."""
        grace, now = self.api.calls.retry.not_found_grace, self.clock()
        live = [r for state in (BatchState.CREATED, BatchState.ENDED) for r in self.journal.batches(state)
                if r.batch_id and r.intent_at is not None and now - r.intent_at > grace][:most]
        for row in live:
            try:
                await self.api.retrieve_batch(str(row.batch_id))
                return
            except NotFoundError:
                continue
            except (ApiError, TransportError):
                return  # (only a 404 says a batch is not this workspace's: anything else tells nothing)
        if live:
            raise JournalError(f"job {self.journal.job or self.journal.state_dir}: its batches ({live[0].batch_id}"
                               f"{' and others' if len(live) > 1 else ''}) are not found with these credentials: they "
                               "are another workspace's (or were deleted). Use the credentials of the workspace it "
                               "was submitted to, or name another job (--job, or another --state-dir)", setting="job")

    async def _start(self) -> None:
        self.batch_size = batch_size_for(self.ceiling, self.settings.margin, self.settings.limits.max_requests)
        size, mtime = stat_identity(self.path)
        report = await self._plan_checked(Limits(max_requests=self.batch_size, max_bytes=self.settings.limits.max_bytes,
                                                 api_version=self.api.calls.api_version))
        if stat_identity(self.path) != (size, mtime):
            raise InputError(f"{self.path} changed while it was being read")
        self.journal.start_job(self._job_plan(report, size, mtime), lambda g: body_size(len(g), sum(r.length for r in g)))
        self._check_platform()  # (recorded: a rerun on another platform is refused)
        self.emit("planned", {"requests": report.requests, "invalid": report.invalid, "batches": len(self.journal.batches()),
                              "batch_size": self.batch_size, "ceiling": self.ceiling})
        for err in report.errors[:20]:
            self.emit("rejected", err.to_json())

    async def _plan_checked(self, limits: Limits) -> PlanReport:
        report = await plan_checked(self.path, self.api if self.settings.preflight else None, limits=limits, hash_content=True,
                                    token_sample=self.settings.token_sample)
        if self.settings.preflight and not (report.preflight or {}).get("checked"):
            self.emit("preflight_skipped", {"reason": (report.preflight or {}).get("reason")})
        return report

    def _job_plan(self, report: PlanReport, size: int, mtime: int) -> JobPlan:
        m = marked(report, self.prices)  # (read once: the caching report and the priming rounds both need it)
        estimate = report.estimate(self.prices)
        caching = caching_report(report, self.prices, m, estimate)
        groups, lives = self._priming(m)
        claimed = {r.line: r.length for _, _, rows in groups for r in rows}
        return JobPlan(
            input={"path": os.path.abspath(self.path), "size": size, "mtime_ns": mtime, "sha256": report.content_hash},
            settings={"batch_size": self.batch_size, "max_bytes": self.settings.limits.max_bytes,
                      "max_attempts": self.settings.max_attempts, "ceiling_at_plan": self.ceiling,
                      "api_version": self.api.calls.api_version},
            report={"requests": report.requests, "invalid": report.invalid, "lines": report.lines,
                    "models": report.models, "preflight": report.preflight,
                    "estimate": estimate, "caching": caching,
                    "priming": {"lives": lives} if groups else None},  # (its counts come from the batches)
            output=os.path.abspath(self.out.path),
            batches=without_lines(report.batches, claimed),
            rejections=[(e.line, e.custom_id, e.reason) for e in report.errors],
            groups=groups,
        )

    def _priming(self, m: Marked) -> tuple[list[Group], dict[str, float]]:
        """The primer and rest batches of each round, and each round's shortest life in seconds (by round number);
        none with --no-prime, or when no prefix is shared."""
        if not self.settings.prime:
            return [], {}
        limits = Limits(max_requests=self.batch_size, max_bytes=self.settings.limits.max_bytes)
        groups: list[Group] = []
        lives: dict[str, float] = {}
        for k, r in enumerate(priming_rounds(m, round_size(self.ceiling, self.settings.margin, self.batch_size))):
            for kind, rows in (("primer", r.primers), ("rest", r.rest)):
                groups += [(kind, k, g) for g in pack_rows([PendingRow(*row, 1) for row in rows], limits)]
            lives[str(k)] = r.life
        return groups, lives


async def check_identity(j: Journal, path: str) -> None:
    """The journal's input is still this file (same size and time, or the same content, hashed off the loop)."""
    known = j.get_meta("input")
    size, mtime = stat_identity(path)
    if (size, mtime) == (known["size"], known["mtime_ns"]):
        return
    # (in a thread: hashing gigabytes must not stop the heartbeats of the lease and the reservations)
    digest = await run_sync(lambda: hash_file(path)) if size == known["size"] else ""
    if digest != known["sha256"]:
        raise JournalError(
            f"state directory {j.state_dir} belongs to {known['path']} as it was when the job started "
            f"({known['size']:,} bytes, sha256 {known['sha256'][:12]}); {path} is different. "
            "Use another state directory, or restore the input"
        )
    j.set_meta("input", {**known, "mtime_ns": mtime, "path": os.path.abspath(path)})
