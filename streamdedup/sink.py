"""Where outcomes go: files (offline), or the clean, duplicates and dead-letter topics (the worker)."""

from __future__ import annotations

import json
import os
import sys
from typing import BinaryIO, Optional

from .errors import ResumeError
from .records import KEPT, Decision
from .source import RawRecord

__all__ = ["FileOutputs", "decision_line"]


def decision_line(decision: Decision) -> bytes:
    return json.dumps(decision.as_json(), ensure_ascii=False).encode("utf-8") + b"\n"


class _Output:
    """One output file that can be cut back to a recorded size; ``-`` is stdout (never cut)."""

    def __init__(self, path: str, keep_bytes: int):
        self.path = path
        if path == "-":
            self.handle: BinaryIO = sys.stdout.buffer
            self.size = 0
            return
        mode = "r+b" if os.path.exists(path) else "w+b"
        self.handle = open(path, mode)
        actual = os.fstat(self.handle.fileno()).st_size
        if actual < keep_bytes:
            self.handle.close()
            raise ResumeError(
                f"output {path!r} has {actual} bytes, fewer than the {keep_bytes} the interrupted run had "
                "written; it was changed outside streamdedup: run with --restart to start over"
            )
        self.size = keep_bytes
        self.rewind(keep_bytes)

    def rewind(self, size: int) -> None:
        """Forget everything after ``size`` bytes (what a batch wrote before its commit failed)."""
        if self.path == "-":
            return
        self.handle.seek(size)
        self.handle.truncate(size)
        self.size = size

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.size += len(data)

    def sync(self, durable: bool) -> None:
        self.handle.flush()
        if durable and self.path != "-":
            os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.path != "-":
            self.handle.close()
        else:
            self.handle.flush()


class FileOutputs:
    """The clean file (kept input lines, byte for byte) and the decisions file (one JSON line per input line)."""

    def __init__(self, clean: Optional[str], decisions: Optional[str], sizes: Optional[dict] = None,
                 durable: bool = True):
        sizes = sizes or {}
        self.durable = durable
        self.clean = _Output(clean, sizes.get("clean", 0)) if clean else None
        self.decisions = _Output(decisions, sizes.get("decisions", 0)) if decisions else None

    def sizes(self) -> dict:
        return {
            "clean": self.clean.size if self.clean else 0,
            "decisions": self.decisions.size if self.decisions else 0,
        }

    def rewind(self, sizes: dict) -> None:
        for name, output in (("clean", self.clean), ("decisions", self.decisions)):
            if output is not None:
                output.rewind(sizes[name])

    def write_batch(self, records: list[RawRecord], decisions: list[Decision]) -> None:
        """Append one batch's outcomes and make them durable."""
        if self.decisions is not None:
            self.decisions.write(b"".join(decision_line(d) for d in decisions))
        if self.clean is not None:
            kept = [r.value + b"\n" for r, d in zip(records, decisions) if d.status == KEPT]
            self.clean.write(b"".join(kept))
        for output in (self.clean, self.decisions):
            if output is not None:
                output.sync(self.durable)

    def close(self) -> None:
        for output in (self.clean, self.decisions):
            if output is not None:
                output.close()
