"""Progress people can read: one live line on a terminal, JSON events otherwise."""

from __future__ import annotations

import sys
import time
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


class Progress:
    """An EventSink. mode: "json" (one event per line), "tty" (a status line redrawn in place), "quiet"."""

    def __init__(self, stream: TextIO | None = None, mode: str = "json") -> None:
        self.stream = stream or sys.stderr
        self.mode = mode
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
                       "realtime_stopping", "create_stopping", "deadline_cancel_refused", "adoption_unproven", "workspaces"):
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
        total, final, admitted = f.get("total") or 0, f.get("final") or 0, f.get("admitted") or 0
        elapsed = float(f.get("elapsed") or 0)
        ceiling = f.get("ceiling")
        occ = f" ({100 * f['depth'] / ceiling:.0f}%)" if ceiling else ""
        eta = "?"
        if final and total and final < total:
            if self._first_final is None:
                self._first_final = (elapsed, final)
            t0, n0 = self._first_final
            if final > n0 and elapsed > t0:
                eta = _duration((total - final) * (elapsed - t0) / (final - n0))
        flying = int(f.get("in_flight") or 0)
        named = list(f.get("batches") or [])
        which = f" ({', '.join(named)}{f' +{flying - len(named):,}' if flying > len(named) else ''})" if named else ""
        after = f.get("next_reading_in")
        text = (f"admitted {admitted:,}/{total:,} · done {final:,} · queue {f.get('depth', 0):,}/"
                f"{f'{ceiling:,}' if ceiling is not None else '?'}{occ} · {flying} in flight{which} · "
                f"{_duration(elapsed)} elapsed · ~{eta} left"
                + (f" · next reading in {after:g} s" if after is not None else ""))
        self.stream.write("\r" + text.ljust(self._last_len))
        self.stream.flush()
        self._last_len = len(text)

    def close(self) -> None:
        if self.mode == "tty" and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
