"""Structured log lines: ``time level event key="value" ...`` text, or one JSON object per line."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

__all__ = ["Log", "LEVELS"]

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class Log:
    def __init__(self, fmt: str = "text", level: str = "info", stream: TextIO = sys.stderr):
        self.fmt = fmt
        self.threshold = LEVELS[level]
        self.stream = stream

    def event(self, level: str, name: str, **fields: Any) -> None:
        if LEVELS[level] < self.threshold:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
        if self.fmt == "json":
            line = json.dumps({"time": stamp, "level": level, "event": name, **fields}, default=str)
        else:
            parts = [stamp, level, name] + [f"{k}={_quoted(v)}" for k, v in fields.items()]
            line = " ".join(parts)
        self.stream.write(line + "\n")
        self.stream.flush()

    def info(self, name: str, **fields: Any) -> None:
        self.event("info", name, **fields)

    def warning(self, name: str, **fields: Any) -> None:
        self.event("warning", name, **fields)

    def error(self, name: str, **fields: Any) -> None:
        self.event("error", name, **fields)


def _quoted(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    if isinstance(value, (int, bool)) or value is None:
        return str(value).lower() if isinstance(value, bool) else str(value)
    return json.dumps(str(value), ensure_ascii=False)
