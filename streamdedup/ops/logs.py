"""Structured log lines: ``time level event key="value" ...`` text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["Log", "LEVELS", "LibraryLogs", "route_library_logs"]

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

    def debug(self, name: str, **fields: Any) -> None:
        self.event("debug", name, **fields)

    def info(self, name: str, **fields: Any) -> None:
        self.event("info", name, **fields)

    def warning(self, name: str, **fields: Any) -> None:
        self.event("warning", name, **fields)

    def error(self, name: str, **fields: Any) -> None:
        self.event("error", name, **fields)


class LibraryLogs(logging.Handler):
    """Forwards a library's ``logging`` records, warnings and worse, into a ``Log`` as ``event`` lines.

    kafka-python logs through the standard ``logging`` module, which nothing
    here configures: without this its warnings (a broker outage, say) reach
    stderr through logging's last-resort handler as bare text, outside the
    key=value / JSON format that log collectors parse.
    """

    def __init__(self, log: Log, event: str):
        super().__init__(logging.WARNING)
        self.log = log
        self.event_name = event

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            fields = {"logger": record.name, "message": message}
            if record.exc_info and record.exc_info[1] is not None:
                fields["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            self.log.event(_level_of(record.levelno, message), self.event_name, **fields)
        except Exception:
            self.handleError(record)


# kafka-python's warnings of a group coordinator that moved or is not up yet (a new group on a fresh broker
# meets them at every start): the client finds the new one by itself, and a wait that lasts is reported by
# the worker's own ``broker_lost`` lines. They are logged as info.
_ROUTINE = ("NotCoordinatorError", "CoordinatorNotAvailableError", "CoordinatorLoadInProgressError")


def _level_of(levelno: int, message: str) -> str:
    if levelno >= logging.ERROR:
        return "error"
    return "info" if any(name in message for name in _ROUTINE) else "warning"


def route_library_logs(log: Log, library: str = "kafka", event: str = "kafka_client") -> LibraryLogs:
    """Send ``library``'s log records at WARNING and above (only) into ``log``; replaces an earlier routing."""
    logger = logging.getLogger(library)
    for earlier in [h for h in logger.handlers if isinstance(h, LibraryLogs)]:
        logger.removeHandler(earlier)
    handler = LibraryLogs(log, event)
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # its debug and info records are not even built
    logger.propagate = False  # not a second time through handlers the root logger may have
    return handler


def _quoted(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    if isinstance(value, (int, bool)) or value is None:
        return str(value).lower() if isinstance(value, bool) else str(value)
    return json.dumps(str(value), ensure_ascii=False)
