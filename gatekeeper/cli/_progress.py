"""Progress people can read: one live line on a terminal, JSON events otherwise."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import orjson

from ._render import retry_line

LOUD_CREATE = 16_000_000  # bytes: a create this big is announced on a terminal (its upload and answer take a while)


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _human(value: Any) -> Any:
    """A number as people read it (1,234); anything else as it is. (--json keeps raw numbers.)"""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value


def progress_parts(f: dict[str, Any], eta: str | None) -> list[str]:
    """The status line's parts, most wanted first (a narrow terminal keeps the first ones)."""
    total, final, admitted = f.get("total") or 0, f.get("final") or 0, f.get("admitted") or 0
    ceiling = f.get("ceiling")
    occ = f" ({100 * f['depth'] / ceiling:.0f}%)" if ceiling else ""
    flying = int(f.get("in_flight") or 0)
    named = list(f.get("batches") or [])
    which = f"batches {', '.join(named)}{f' +{flying - len(named):,}' if flying > len(named) else ''}" if named else ""
    after = f.get("next_reading_in")
    parts = [f"done {final:,}/{total:,}", f"~{eta} left" if eta else "", f"admitted {admitted:,}",
             f"queue {f.get('depth', 0):,}/{f'{ceiling:,}' if ceiling is not None else '?'}{occ}",
             f"{flying} in flight", f"{_duration(float(f.get('elapsed') or 0))} elapsed",
             f"next reading in {after:g} s" if after is not None else "", which]
    return [p for p in parts if p]


def fit(parts: list[str], width: int, sep: str = " · ") -> str:
    """As many of `parts`, in order, as fit in `width` characters (the first one always, cut if it must be)."""
    out = parts[0][:max(width, 1)] if parts else ""
    for part in parts[1:]:
        if len(out) + len(sep) + len(part) > width:
            break
        out += sep + part
    return out


def _columns(stream: TextIO) -> int:
    """The width of the terminal `stream` writes to (COLUMNS first, as the shells set it; 100 when unknown)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 100
    return columns if columns >= 20 else 100  # (a pseudo-terminal nobody sized says 0)


class Progress:
    """An EventSink. mode: "json" (one event per line), "tty" (a status line redrawn in place, fitted to the
    terminal's width: `columns`, read at each redraw so a resized window is followed), "quiet"."""

    def __init__(self, stream: TextIO | None = None, mode: str = "json",
                 columns: Callable[[], int] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.mode = mode
        self.columns = columns or (lambda: _columns(self.stream))
        self.started = time.monotonic()
        self._last_len = 0
        self._first_final: tuple[float, int] | None = None

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        if self.mode == "quiet":
            return
        if self.mode == "json":
            record = {"event": event, "t": round(time.monotonic() - self.started, 3), **fields}
            self.stream.write(orjson.dumps(record, default=str).decode() + "\n")
            self.stream.flush()
            return
        if event == "progress":
            self._line(fields)
        elif event == "retrying":
            self._say(retry_line(fields))
        elif event == "creating" and fields.get("bytes", 0) >= LOUD_CREATE:
            self._say(f"creating batch {fields['batch']:,} ({fields['bytes'] / 1e6:,.1f} MB): the upload, then up to "
                      f"{fields['answer_within']:g} s for the API's answer")
        elif event in ("refused", "resumed", "reconciled", "create_unknown", "resubmitting", "ceiling_unknown", "planned",
                       "deadline_cancel", "to_realtime", "deadline_for_budget", "realtime_lost", "realtime_unknown",
                       "realtime_stopping", "create_stopping", "deadline_cancel_refused", "cancel_refused", "realtime_closed",
                       "adoption_unproven", "deadline_passed", "workspaces", "collecting", "ballast_freed", "ballast_short",
                       "realtime_unrecorded"):
            self._clear()
            detail = ", ".join(f"{k}={_human(v)}" for k, v in fields.items() if k not in ("t",))
            self.stream.write(f"gatekeeper: {event}: {detail}\n")
            self.stream.flush()

    def _say(self, text: str) -> None:
        self._clear()
        self.stream.write(f"gatekeeper: {text}\n")
        self.stream.flush()

    def _clear(self) -> None:
        if self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
            self._last_len = 0

    def _line(self, f: dict[str, Any]) -> None:
        text = fit(progress_parts(f, self._eta(f)), self.columns() - 1)  # (the last column: no wrap on any terminal)
        self.stream.write("\r" + text.ljust(self._last_len))
        self.stream.flush()
        self._last_len = len(text)

    def _eta(self, f: dict[str, Any]) -> str | None:
        """Time left, by the pace at which results became final: since the first seen, once a second reading
        shows more; before that, since the run began (batches show nothing until they end: the first results
        are the first figure there is)."""
        total, final, elapsed = f.get("total") or 0, f.get("final") or 0, float(f.get("elapsed") or 0)
        if not (final and total and final < total and elapsed > 0):
            return None
        if self._first_final is None:
            self._first_final = (elapsed, final)
        t0, n0 = self._first_final
        if final > n0 and elapsed > t0:
            return _duration((total - final) * (elapsed - t0) / (final - n0))
        return _duration((total - final) * elapsed / final)

    def close(self) -> None:
        if self.mode == "tty" and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
