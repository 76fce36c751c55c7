"""A run's report, from its journal alone: the numbers (`run_report`) and one self-contained HTML page (`render_html`).

The page has no scripts and fetches nothing: inline CSS and SVG only, so it can be
mailed, archived, or opened on a machine without a network. It works on a finished
run, a running one (read through a read-only connection that never disturbs it)
and an interrupted one; its size does not grow with the number of requests (every
figure is an aggregate the journal computes).
"""

from __future__ import annotations

import fcntl
import html
import os
import time
from pathlib import Path
from typing import Any

import orjson

from .._prices import PriceTable
from ..decide._headroom import parse_time
from ..decide._host import run_ended
from ..run.shared._summary import summarize
from ..state._host import machine_id, process_started
from ..state._journal import BatchRow, Journal, open_job

MAX_BARS = 1000  # batches drawn; a run with more shows the first ones and says so


def run_report(state_dir: str | os.PathLike[str], prices: PriceTable | None = None, *, now: float | None = None,
               journal: str | None = None, job: str | None = None) -> dict[str, Any]:
    """Every number the report shows, read from the journal in one snapshot (a state directory's, or the job
    named `job` in the shared `journal`)."""
    now = time.time() if now is None else now
    j = open_job(state_dir, journal=journal, job=job)
    try:
        with j.snapshot():
            report = j.get_meta("report") or {}
            summary = summarize(j, str(j.get_meta("output") or ""), prices=prices).to_json()
            return {
                "status": _status(j, Path(state_dir), summary["complete"]), "generated_at": now,
                "input": j.get_meta("input"), "settings": j.get_meta("settings"),
                "plan": {k: report.get(k) for k in ("requests", "invalid", "lines", "models")},
                "preflight": report.get("preflight"), "estimate": report.get("estimate"), "summary": summary,
                "readings": [{"at": at, "depth": d, "ceiling": c, "ours": o} for at, d, c, o in j.outcomes.readings()],
                "batches": [_batch(b, now) for b in j.batches() if b.state.value != "planned"],
                "marks": [{"at": at, "batch": batch, "event": ev, **detail}
                          for at, batch, ev, detail in j.outcomes.events_of("queue_full", "resumed", "recut", "user_canceled")],
            }
    finally:
        j.close()


def _status(j: Journal, state_dir: Path, complete: bool) -> str:
    if complete:
        return "finished"
    if j.job:  # a shared journal's job is running while its lease is live, and its run not known to have ended
        lease = j.lease.holder()
        return "running" if lease and not run_ended(lease, machine_id(), process_started) else "interrupted"
    try:  # a live submit holds the state directory's lock
        fd = os.open(state_dir / "lock", os.O_RDONLY)
    except OSError:
        return "interrupted"
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return "interrupted"
    except BlockingIOError:
        return "running"
    finally:
        os.close(fd)


def _batch(b: BatchRow, now: float) -> dict[str, Any]:
    counts = orjson.loads(b.counts) if b.counts else {}
    counts = counts if isinstance(counts, dict) else {}
    return {"batch": b.idx, "kind": b.kind, "requests": b.requests, "state": b.state.value, "id": b.batch_id,
            "start": b.intent_at or parse_time(b.created_at), "end": parse_time(b.ended_at), "counts": counts,
            "outcome": _outcome(b.state.value, counts)}


def _outcome(state: str, counts: dict[str, Any]) -> str:
    if state in ("intent", "created"):
        return "live"
    done = {k: v for k, v in counts.items() if k != "processing" and isinstance(v, int) and v}
    if not done:
        return "unknown"
    if set(done) == {"succeeded"}:
        return "succeeded"
    if done.get("succeeded"):
        return "partly"  # most batches with a few errors or expiries
    return "errored" if done.get("errored") else "expired" if done.get("expired") else "canceled"


# -- the page -------------------------------------------------------------------

COLOURS = {"succeeded": "#2e7d32", "partly": "#9e9d24", "errored": "#e65100", "expired": "#757575", "canceled": "#9e9e9e",
           "live": "#1565c0", "unknown": "#bdbdbd"}
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse}td,th{padding:2px 10px 2px 0;text-align:left}td.n{text-align:right}
.muted{color:#666}.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
svg{background:#fafafa;border:1px solid #e0e0e0}
"""


def render_html(data: dict[str, Any]) -> str:
    s = data["summary"]
    title = f"gatekeeper run: {(data.get('input') or {}).get('path', '')}"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1><p class='muted'>{_e(data['status'])} · generated {_e(_when(data['generated_at']))}</p>",
        _totals(s, sum(m["event"] == "queue_full" for m in data["marks"])),
        "<h2>The queue</h2>", _queue_svg(data), "<h2>Batches</h2>", _batches_svg(data),
        _legend(), _results(s), _settings(data), "</body></html>",
    ]
    return "".join(parts)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "-"


def _rows(pairs: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td class='n'>{_e(f'{v:,}' if isinstance(v, int) else v)}</td></tr>" for k, v in pairs)
    return f"<table>{cells}</table>"


def _totals(s: dict[str, Any], refusals: int) -> str:
    cost = "unknown (a model has no price)" if s["cost_usd"] is None else f"${s['cost_usd']:,.4f}"
    return "<h2>Outcome</h2>" + _rows([
        ("requests", s["requests"]), ("succeeded", s["succeeded"]), ("errored", s["errored"]),
        ("expired", s["expired"]), ("canceled", s["canceled"]), ("not final yet", s["pending"]),
        ("rejected lines", s["invalid"]), ("batches", s["batches"]), ("queue-full refusals", refusals),
        ("resent", s["resubmitted"]), ("recovered by a retry", s["succeeded_after_retry"]),
        ("input tokens", s["usage"].get("input_tokens", 0)), ("output tokens", s["usage"].get("output_tokens", 0)),
        *_caching(s.get("caching")), *_lanes(s), ("cost at batch prices" if "realtime" not in (s.get("lanes") or {})
                                                  else "cost (both lanes)", cost)])


def _lanes(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """With a deadline: what each lane answered and cost, and whether the deadline was met."""
    lanes, d = s.get("lanes") or {}, s.get("deadline")
    rt = lanes.get("realtime")
    rows: list[tuple[str, Any]] = []
    if rt:
        b = lanes["batch"]
        rows += [("batch lane", f"{b['requests']:,} requests, ${b['cost_usd'] or 0:,.4f} (batch prices)"),
                 ("real-time lane", f"{rt['requests']:,} requests, ${rt['cost_usd'] or 0:,.4f} (standard prices), "
                                    f"{rt['calls']:,} calls"),
                 ("possibly charged twice", f"{rt['possible_double_charges']:,} (answers lost and sent again)")]
    if d:
        rows.append(("deadline", f"{d['at']}: " + ("met" if d["met"] else "missed" + (" for the budget" if d["missed_for_budget"] else ""))))
    return rows


def _caching(c: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The realized caching rows: reads, writes by life, the read share of the ideal, the saving."""
    if not c:
        return []
    share = "n/a" if c["read_share_of_ideal"] is None else f"{c['read_share_of_ideal']:.1%}"
    saving = "unknown" if c["saving_usd"] is None else f"${c['saving_usd']:,.4f}"
    primed = c.get("priming")
    return [("cache read tokens", c["read_tokens"]), ("cache write tokens, 5m", c["write_5m_tokens"]),
            ("cache write tokens, 1h", c["write_1h_tokens"]), ("reads of those possible", share),
            ("saved against no caching", saving),
            ("primed", f"{primed['primers']:,} primers in {primed['rounds']:,} round(s)" if primed else "no")]


def _results(s: dict[str, Any]) -> str:
    errors = sorted(s["errors"].items(), key=lambda kv: -kv[1])
    stops = sorted((s.get("stop_reasons") or {}).items(), key=lambda kv: -kv[1])
    return ("<h2>Errors by type</h2>" + (_rows(errors) if errors else "<p class='muted'>none</p>")
            + "<h2>Succeeded answers by stop reason</h2>"
            + (_rows(stops) if stops else "<p class='muted'>none</p>")
            + "<p class='muted'>max_tokens and model_context_window_exceeded are truncated answers, refusal an answer "
              "refused (billed): <code>gatekeeper results --only truncated,refused</code> exports them.</p>")


def _settings(data: dict[str, Any]) -> str:
    ident = data.get("input") or {}
    settings = data.get("settings") or {}
    pf = data.get("preflight") or {}
    est = data.get("estimate") or {}
    rows = [("input", ident.get("path")), ("size (bytes)", ident.get("size")), ("sha256", ident.get("sha256")),
            *((f"setting: {k}", v) for k, v in sorted(settings.items())),
            ("models checked", "yes" if pf.get("checked") else f"no ({pf.get('reason')})"),
            ("input tokens estimated", est.get("input_tokens")), ("estimated by", est.get("method"))]
    return "<h2>Settings and input</h2>" + _rows([(k, v) for k, v in rows if v is not None])


def _span(data: dict[str, Any]) -> tuple[float, float]:
    times = [r["at"] for r in data["readings"]] + [t for b in data["batches"] for t in (b["start"], b["end"]) if t]
    if not times:
        return data["generated_at"] - 1, data["generated_at"]
    lo, hi = min(times), max(times)
    return lo, max(hi, lo + 1)


def _queue_svg(data: dict[str, Any], w: int = 900, h: int = 240) -> str:
    """Depth (line) against the ceiling (dashed), our share shaded, refusals as red dots, resumes as blue lines."""
    readings = data["readings"]
    if not readings:
        return "<p class='muted'>no queue readings recorded</p>"
    lo, hi = _span(data)
    top = max(max(max(r["depth"], r["ours"], r["ceiling"] or 0) for r in readings), 1)

    def xy(at: float, v: float) -> str:
        return f"{(at - lo) / (hi - lo) * (w - 60) + 50:.1f},{h - 20 - v / top * (h - 40):.1f}"

    ours = " ".join([xy(readings[0]["at"], 0)] + [xy(r["at"], r["ours"]) for r in readings] + [xy(readings[-1]["at"], 0)])
    depth = " ".join(xy(r["at"], r["depth"]) for r in readings)
    ceiling = " ".join(xy(r["at"], r["ceiling"]) for r in readings if r["ceiling"])
    marks = "".join(_mark(m, lo, hi, w, h) for m in data["marks"])
    return (f"<svg width='{w}' height='{h}' viewBox='0 0 {w} {h}' role='img' aria-label='queue depth over time'>"
            f"<polygon points='{ours}' fill='#90caf9' fill-opacity='.6'/>"
            f"<polyline points='{depth}' fill='none' stroke='#0d47a1' stroke-width='1.5'/>"
            + (f"<polyline points='{ceiling}' fill='none' stroke='#c62828' stroke-dasharray='6 4'/>" if ceiling else "")
            + marks + f"<text x='4' y='14' font-size='11'>{top:,}</text><text x='4' y='{h - 22}' font-size='11'>0</text>"
            f"<text x='50' y='{h - 4}' font-size='11'>{_e(_when(lo))}</text>"
            f"<text x='{w - 190}' y='{h - 4}' font-size='11'>{_e(_when(hi))}</text></svg>"
            "<p class='legend muted'>depth (line), ceiling (dashed), our share (shaded), refusals (red), resumes (blue)</p>")


def _mark(m: dict[str, Any], lo: float, hi: float, w: int, h: int) -> str:
    x = (m["at"] - lo) / (hi - lo) * (w - 60) + 50
    if m["event"] == "queue_full":
        return f"<circle cx='{x:.1f}' cy='{h - 30}' r='4' fill='#c62828'><title>refused</title></circle>"
    if m["event"] == "resumed":
        return f"<line x1='{x:.1f}' x2='{x:.1f}' y1='10' y2='{h - 20}' stroke='#1565c0' stroke-dasharray='2 3'/>"
    return ""


def _batches_svg(data: dict[str, Any], w: int = 900) -> str:
    """Every batch as a bar from its create to its end, coloured by outcome; live ones run to now."""
    bars = data["batches"][:MAX_BARS]
    if not bars:
        return "<p class='muted'>no batch created yet</p>"
    lo, hi = _span(data)
    hi = max(hi, data["generated_at"]) if data["status"] == "running" else hi
    h = 14 * len(bars) + 30
    rects = []
    for k, b in enumerate(bars):
        start = b["start"] or lo
        end = b["end"] or (data["generated_at"] if b["outcome"] == "live" else start)
        x0 = (start - lo) / (hi - lo) * (w - 60) + 50
        x1 = max(x0 + 2, (end - lo) / (hi - lo) * (w - 60) + 50)
        tip = f"batch {b['batch']} ({b['kind']}): {b['requests']:,} requests, {b['outcome']}"
        rects.append(f"<rect x='{x0:.1f}' y='{10 + 14 * k}' width='{x1 - x0:.1f}' height='10' "
                     f"fill='{COLOURS[b['outcome']]}'><title>{_e(tip)}</title></rect>")
    more = f"<p class='muted'>first {MAX_BARS} of {len(data['batches']):,} batches</p>" if len(data["batches"]) > MAX_BARS else ""
    return f"<svg width='{w}' height='{h}' viewBox='0 0 {w} {h}' role='img' aria-label='batches'>{''.join(rects)}</svg>" + more


def _legend() -> str:
    return "<p class='legend muted'>" + "".join(f"<span style='background:{c}'></span>{_e(k)}" for k, c in COLOURS.items()) + "</p>"
