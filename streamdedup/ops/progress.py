"""A one-line progress bar on stderr with rate and ETA; silent when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Counts records and work done out of a known total (bytes, offsets), redrawn at most 5 times a second."""

    def __init__(self, total: Optional[int], label: str = "docs", stream: TextIO = sys.stderr,
                 enabled: Optional[bool] = None):
        self.total = total
        self.label = label
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.records = 0
        self.done = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def update(self, records: int, done: int) -> None:
        """``records`` more records, ``done`` units of the total reached so far."""
        self.records += records
        self.done = done
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.2:
            self._drawn = now
            self.stream.write("\r" + self.line(now) + "\033[K")
            self.stream.flush()

    def rate(self, now: Optional[float] = None) -> float:
        elapsed = (now or time.monotonic()) - self.started
        return self.records / elapsed if elapsed > 0 else 0.0

    def line(self, now: float) -> str:
        text = f"{self.records:,} {self.label}  {self.rate(now):,.0f} {self.label}/s"
        if self.total:
            fraction = min(self.done / self.total, 1.0)
            width = 24
            filled = int(fraction * width)
            elapsed = now - self.started
            eta = elapsed * (1 - fraction) / fraction if fraction > 0 else 0
            text = f"[{'#' * filled}{'.' * (width - filled)}] {fraction:6.1%}  {text}  ETA {format_duration(eta)}"
        return text

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line(time.monotonic()) + "\033[K\n")
            self.stream.flush()
