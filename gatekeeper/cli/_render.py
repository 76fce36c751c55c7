"""What the CLI prints for people: the plan, the queue's status, a dry run, a summary. Pure: values in, text out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..input._planner import PlanReport
    from ..run.shared._summary import Summary


def render_plan(report: PlanReport, name: str) -> str:
    out = [
        f"input           {name}",
        f"lines read      {report.lines:,}",
        f"valid requests  {report.requests:,}",
        f"rejected lines  {report.invalid:,}",
    ]
    for err in report.errors[:20]:
        cid = f" [{err.custom_id}]" if err.custom_id else ""
        out.append(f"  line {err.line}{cid}: {err.reason}")
    if report.invalid > 20:
        out.append(f"  ... and {report.invalid - 20:,} more (--json lists all)")
    out.append(f"batches         {len(report.batches):,}"
               f"   (at most {report.limits.max_requests:,} requests and {report.limits.max_bytes:,} bytes each)")
    if report.batches:
        out.append(f"  {'#':>5} {'requests':>9} {'bytes':>13}  lines")
        shown = report.batches if len(report.batches) <= 40 else report.batches[:20] + report.batches[-20:]
        for i, b in enumerate(shown):
            if len(report.batches) > 40 and i == 20:
                out.append(f"  {'...':>5}")
            out.append(f"  {b.index:>5} {b.requests:>9,} {b.bytes:>13,}  {b.first_line}-{b.last_line}")
    pf = report.preflight
    if pf is not None:
        if pf["checked"]:
            names = ", ".join(f"{n}" + (f" -> {m['resolved']}" if m["resolved"] not in (None, n) else "")
                              + (f" (rejected {m['lines_rejected']:,} line(s))" if m.get("lines_rejected") else "")
                              for n, m in sorted(pf["models"].items()))
            out.append(f"models checked  {names} (Models API)")
        else:
            out.append(f"models          not checked: {pf['reason']}")
    if report.requests:
        out.append(f"largest request {report.largest_bytes:,} bytes (line {report.largest_line}, {report.largest_custom_id})")
        out.append("models")
        for model, n in sorted(report.models.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {n:>9,}  {model}")
    return "\n".join(out)


def render_status(r: dict[str, Any]) -> str:
    ceiling = "unknown" if r["ceiling"] is None else format(r["ceiling"], ",")
    why = r["ceiling_source"] or r["ceiling_error"]
    batches = r["batches"]
    out = [f"{r['verdict']:<20} {r['detail']}", f"  ceiling   {ceiling}" + (f" ({why})" if why else ""),
           f"  depth     {r['depth']:,} in {len(batches)} live batch(es), {r['workspaces']} workspace(s)"]
    out += [f"    {b['id']:<34} {b['workspace']:<4} {b['status']:<12} {b['processing']:>9,}" for b in batches[:5]]
    out += [f"  read      {line}" for line in r.get("read") or []]
    if len(batches) > 5:
        out.append(f"    ... and {len(batches) - 5} more")
    out += [f"  measured: {r['measured']}", f"  inferred: {r['inferred']}"] + [f"  repair: {line}" for line in r["repair"]]
    ledger = r["ledger"]
    if ledger["kind"] == "none":
        out.append("  ledger    none (--ledger none): after a lost create answer, ownership rests on usage alone")
    else:
        owners = {x["owner"] for x in ledger["reservations"]}
        where = f"this host's, {ledger.get('file') or ledger['url']}" if ledger["kind"] == "host" else ledger["url"] or "shared"
        out.append(f"  ledger    {where}: {ledger['reserved']:,} requests reserved by {len(owners)} submitter(s), "
                   f"beside the observed depth {r['depth']:,}")
        out += [f"    {x['owner']:<36} batch {x['batch']:<5} {x['requests']:>9,}  {x['batch_id'] or '(creating)'}  "
                f"expires in {x['expires_in']:,.0f} s" for x in ledger["reservations"][:10]]
        out += [_orphan_line(x) for x in (ledger.get("orphans") or [])[:10]]
        out += _jobs_lines(ledger.get("jobs") or [])
    return "\n".join(out)


def _orphan_line(x: dict[str, Any]) -> str:
    """A dead job's create that was out when it died: whose, and why and how long it still holds creates of its size
    (their batch could be taken for its after a lost answer: docs/shared.md)."""
    who = f"job {x['job']}" if x["job"] else f"submitter {x['owner']}"
    where = "" if x["pid"] is None else f" (pid {x['pid']} {'on this host' if x['this_host'] else 'on another host'})"
    found = "" if x["dead_for"] is None else f", found dead {x['dead_for']:,.0f} s ago"
    return (f"    orphan of dead {who}{where}, batch {x['batch']}: its create of {x['requests']:,} requests was out when it "
            f"died{found}; holds the turn for creates of {x['requests']:,} requests (no room), lapses in "
            f"{x['lapses_in']:,.0f} s or when its rerun settles it")


def _jobs_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """The jobs on the ledger: who waits for room, who is ahead (`decide._shares`)."""
    if not jobs:
        return []
    out = [f"  jobs      {len(jobs)} on the ledger (priority, share, queued, waiting, admitted this run)"]
    for x in jobs[:20]:
        waiting = (f"waiting for {x['want']:,} ({x['waiting_s']:,.0f} s behind higher priorities)" if x["want"]
                   else "not waiting")
        out.append(f"    {x['job'][:36]:<36} {x['priority']:<6} x{x['share']:<4g} queued {x['queued']:>9,}  {waiting}; "
                   f"admitted {x['admitted']:,}")
    return out


def caching_line(c: dict[str, Any]) -> str:
    """The summary's caching line: what was read and written, against the ideal, and what it saved."""
    share = "n/a" if c["read_share_of_ideal"] is None else f"{c['read_share_of_ideal']:.0%}"
    v = c["saving_usd"]
    saved = ("saving unknown" if v is None else f"~${v:,.2f} saved against no caching" if v >= 0
             else f"~${-v:,.2f} more than no caching")
    primed = c.get("priming")
    how = f"primed in {primed['rounds']:,} round(s)" if primed else "not primed"
    return (f"caching     read {c['read_tokens']:,} · written 5m {c['write_5m_tokens']:,}, 1h {c['write_1h_tokens']:,} · "
            f"{share} of the reads possible · {saved} ({how})")


def render_caching(c: dict[str, Any]) -> str:
    """`plan`'s caching lines: per model what is marked and shared, and the input cost three ways."""
    def usd(v: float | None) -> str:
        return "unknown" if v is None else f"${v:,.2f}"

    out = ["caching"]
    for model, m in c["models"].items():
        minimum = f"{m['minimum_tokens']:,}" + ("" if m["minimum_known"] else " (assumed: not in the table)")
        lives = ", ".join(f"{k} {v:,}" for k, v in sorted(m["lives"].items()))
        cost = m["input_cost_usd"]
        out += [f"  {model}: {m['requests_marked']:,} requests with markers ({lives})",
                f"    {m['prefixes']:,} distinct prefixes, {m['shared_prefixes']:,} shared by {m['requests_sharing']:,} "
                f"requests; ~{m['prefix_tokens']['median']:,} tokens median, ~{m['prefix_tokens']['max']:,} largest",
                f"    {m['below_minimum']:,} below the minimum of {minimum} tokens (not cached)",
                f"    input cost: {usd(cost['none'])} without caching, {usd(cost['cold'])} sent cold, "
                f"{usd(cost['primed'])} primed"]
    for u in c["unmarked"]:
        out.append(f"  unmarked: {u['requests']:,} {u['model']} requests share a {u['part']} of ~{u['tokens']:,} tokens; "
                   f"marking it (1h) would save ~{usd(u['saving_usd'])}")
    out.append(f"  ({c['method']})")
    return "\n".join(out)


def render_plan_brief(r: dict[str, Any]) -> str:
    p = r["plan"]
    e = r["estimate"]
    ceiling = "unknown" if r["ceiling"] is None else f"{r['ceiling']:,}"
    cost = "unknown" if e["input_cost_usd"] is None else f"~${e['input_cost_usd']:,.2f}"
    return "\n".join([
        f"estimate        ~{e['input_tokens']:,} input tokens, {cost} at batch prices (output not included)",
        f"valid requests  {p['requests']:,}   rejected lines {p['invalid']:,}",
        f"batches         {len(p['batches']):,} of at most {r['batch_size']:,} requests ({r['policy']})",
        f"queue now       {r['depth']:,} of {ceiling}",
        f"would create    {r['would_create_now']:,} batch(es) now ({r['requests_now']:,} requests); {r['would_wait']:,} would wait",
        f"queue after     {r['queue_after']:,} of {ceiling}",
    ])


def stopped_early(stop_reasons: dict[str, int]) -> str:
    """The succeeded answers that stopped early (billed, yet not a whole answer), for the summary's line."""
    early = {k: v for k, v in sorted(stop_reasons.items()) if k not in ("end_turn", "stop_sequence", "tool_use", "pause_turn")}
    if not early:
        return ""
    return ("   stopped early: " + " · ".join(f"{k} {v:,}" for k, v in early.items())
            + " (`gatekeeper results --only refused,truncated` exports them)")


def render_deadline(d: dict[str, Any]) -> str:
    """`plan --deadline`: whether the batch lane alone is expected to make it, else what the real-time lane needs."""
    a = d["assumes"]
    head = (f"deadline        {d['at']} (in {d['window_seconds'] / 3600:.1f} h), turnaround {a['turnaround_seconds']:g} s, "
            f"{a['waves']} wave(s) of batches")
    if d["batch_lane_alone"]:
        return head + "\n                the batch lane alone is expected to make it: no real-time call"
    cost = "unknown" if d["extra_input_cost_usd"] is None else f"~${d['extra_input_cost_usd']:,.2f} more for input"
    fits = "in time" if d["realtime_in_time"] else "NOT in time even so"
    limits = a["rate_limits"]
    return (head + f"\n                the batch lane alone is not expected to make it: {d['realtime_requests']:,} "
            f"request(s) through the real-time lane, ~{d['realtime_seconds'] / 60:,.1f} min at "
            f"{limits['requests_per_minute']:,} RPM / {limits['input_tokens_per_minute']:,} ITPM / "
            f"{limits['output_tokens_per_minute']:,} OTPM ({a['rate_limits_from']}): {fits}; {cost} (standard prices "
            "are twice the batch price; output not included)")


def render_summary(s: Summary) -> str:
    rejected = f"rejected lines: {s.invalid:,}" + (": `gatekeeper results --only rejected` lists them" if s.invalid else "")
    lines = [
        f"requests    {s.requests:,}   ({rejected})",
        f"succeeded   {s.succeeded:,}" + stopped_early(s.stop_reasons),
        f"errored     {s.errored:,}" + ("   " + ", ".join(f"{k} {v:,}" for k, v in sorted(s.errors.items())) if s.errors else ""),
        f"expired     {s.expired:,}",
        f"canceled    {s.canceled:,}",
    ]
    if s.pending:
        lines.append(f"not final   {s.pending:,}")
    lines.append(f"batches     {s.batches:,}   resubmitted {s.resubmitted:,} (succeeded later: {s.succeeded_after_retry:,})")
    u = s.usage
    if u:
        lines.append(f"tokens      input {u.get('input_tokens', 0):,} · output {u.get('output_tokens', 0):,} · "
                     f"cache write {u.get('cache_creation_input_tokens', 0):,} · cache read {u.get('cache_read_input_tokens', 0):,}")
    if s.caching:
        lines.append(caching_line(s.caching))
    rt = s.lanes.get("realtime")
    if s.cost_usd is not None and rt:
        b = s.lanes["batch"]
        lines.append(f"cost        ~${s.cost_usd:,.2f}: batch lane {b['requests']:,} requests ~${b['cost_usd'] or 0:,.2f} "
                     f"(batch prices) · real-time lane {rt['requests']:,} ~${rt['cost_usd'] or 0:,.2f} (standard prices)")
    elif s.cost_usd is not None:
        lines.append(f"cost        ~${s.cost_usd:,.2f} at batch prices")
    else:
        lines.append("cost        unknown: a model that succeeded has no price (give --prices FILE)")
    if s.budget is not None and s.budget["held_back"]:
        lines.append(f"budget      spent ${s.budget['spent'] or 0:,.2f} of ${s.budget['limit']:,.2f}; "
                     f"{s.budget['held_back']:,} requests not sent. Rerun with a higher --budget to continue "
                     "(nothing already sent is sent again)")
    if rt:
        lines.append(f"real time   {rt['moved']:,} request(s) moved for the deadline, {rt['calls']:,} call(s)"
                     + (f"; {rt['possible_double_charges']:,} answer(s) lost on the wire or to a crash and sent again: "
                        "possibly charged twice" if rt["possible_double_charges"] else ""))
    if s.deadline is not None:
        d = s.deadline
        verdict = "met" if d["met"] else "MISSED" + (" (the budget kept work from the real-time lane)"
                                                      if d["missed_for_budget"] else "")
        lines.append(f"deadline    {d['at']}: {verdict}; finished {d['finished_at']}")
    if s.shares is not None:
        x = s.shares
        lines.append(f"shares      priority {x['priority']}, share {x['share']:g} on the ledger; waited "
                     f"{x['waited_s']:,.1f} s for other jobs' turns")
    if s.rebuilt:
        lines.append(f"rebuilt     {s.rebuilt['results']:,} results of {s.rebuilt['batches']:,} batches downloaded again into the "
                     f"output (unavailable: {s.rebuilt.get('unavailable', 0):,}); nothing resent")
    if s.adoptions:
        lines.append(_adoptions(s.adoptions))
    if s.canceled_job:
        lines.append(f"canceled    by `gatekeeper cancel` at {s.canceled_job['at']}: {s.canceled_job['not_sent']:,} "
                     "request(s) never sent. To send them, rerun this submit with --resume-canceled")
        if s.canceled_job.get("left_live"):
            lines.append(f"            {s.canceled_job['left_live']:,} batch(es) ran on to their end: the credentials "
                         "may not cancel batches")
    lines.append(f"results     {s.output}")
    if s.job:
        lines.append(f"job         {s.job}   (--job: resume or read it from any host with the same --journal)")
    return "\n".join(lines)


def _adoptions(a: dict[str, Any]) -> str:
    """Batches found by listing after lost create answers, and what their results proved."""
    unproven = a["unproven"]
    line = f"adopted     {a['proven']:,} batch(es) found after a lost create answer, proven ours (by the ledger or their results)"
    if unproven:
        line += (f"; {len(unproven):,} the results could not tell from another submitter's (the same prompts and "
                 f"custom_ids: {', '.join(unproven)}): their answers are kept apart, not joined and not resent "
                 "(`gatekeeper results --only unproven` lists them; a ledger, this host's unless --ledger none, or "
                 "one shared with the other submitters, proves ownership next time)")
    if a["not_ours"]:
        line += f"; {len(a['not_ours']):,} another submitter's, set aside (never joined)"
    return line


def retry_line(f: dict[str, Any]) -> str:
    """A retried call, as people read it."""
    return (f"{f['endpoint']} ({f['url']}): {f['reason']}; retry {f['attempt'] + 1} in {f['retry_in']:g} s")


def render_rerun(r: dict[str, Any]) -> str:
    """What a rerun of a job an earlier run left in its state folder sends (`checks._plan.rerun_of`)."""
    retries = f" and {r['retries']:,} waiting for another attempt" if r["retries"] else ""
    return (f"rerun           {r['state']} holds an earlier run: {r['out']:,} request(s) out (collected, not sent again), "
            f"{r['answered']:,} answered; a rerun sends {r['to_send']:,}: {r['batches']:,} batch(es) never "
            f"created{retries}")
