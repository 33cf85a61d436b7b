"""Where records come from: JSONL files or stdin (offline), Kafka topics (the worker).

Both yield batches of ``RawRecord`` in a canonical order, each with the
position to store once the batch is committed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator, Optional

from .errors import ResumeError
from .records import Source

__all__ = ["RawRecord", "FilePosition", "FileSource"]


@dataclass(frozen=True)
class RawRecord:
    """One input record's bytes and where it came from."""

    value: Optional[bytes]
    source: Source
    key: Optional[bytes] = None
    headers: tuple = ()
    timestamp_ms: int = -1


@dataclass(frozen=True)
class FilePosition:
    """How far an offline run has read: file number, lines and bytes read in that file."""

    file: int = 0
    line: int = 0
    byte: int = 0

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "byte": self.byte}


@dataclass
class FileSource:
    """The lines of JSONL files (``-`` is stdin), one record per line, in order."""

    paths: list[str]
    lines_read: int = field(default=0, init=False)
    bytes_read: int = field(default=0, init=False)

    def total_bytes(self) -> Optional[int]:
        """Bytes in all inputs, for the progress bar; None when reading stdin."""
        if "-" in self.paths:
            return None
        return sum(os.path.getsize(p) for p in self.paths)

    def batches(self, size: int, start: FilePosition) -> Iterator[tuple[list[RawRecord], FilePosition]]:
        """Batches of at most ``size`` lines from ``start`` on, each with the position after it."""
        for number in range(start.file, len(self.paths)):
            begin = start if number == start.file else FilePosition(number)
            yield from self._file_batches(number, size, begin)

    def _file_batches(self, number: int, size: int, begin: FilePosition):
        path = self.paths[number]
        with self._open_at(path, begin) as handle:
            line_no, offset = begin.line, begin.byte
            batch: list[RawRecord] = []
            for raw in handle:
                line_no += 1
                offset += len(raw)
                self.bytes_read += len(raw)
                value = raw[:-1] if raw.endswith(b"\n") else raw  # a CR of CRLF stays: output is byte for byte
                batch.append(RawRecord(value, Source(path, -1, line_no)))
                if len(batch) == size:
                    yield batch, FilePosition(number, line_no, offset)
                    batch = []
            if batch:
                yield batch, FilePosition(number, line_no, offset)
        self.lines_read = line_no

    def _open_at(self, path: str, begin: FilePosition) -> BinaryIO:
        if path == "-":
            handle = os.fdopen(os.dup(sys.stdin.fileno()), "rb")
            for _ in range(begin.line):  # a pipe cannot seek: skip what was already decided
                if not handle.readline():
                    raise ResumeError(f"stdin ended before line {begin.line}, where the interrupted run stopped; "
                                      "pipe the same input again, or run with --restart")
            return handle
        try:
            handle = open(path, "rb")
        except OSError as exc:
            raise ResumeError(f"cannot read input {path!r}: {exc.strerror}") from None
        if begin.byte:
            if os.path.getsize(path) < begin.byte:
                handle.close()
                raise ResumeError(f"input {path!r} is shorter than where the interrupted run stopped "
                                  f"(byte {begin.byte}); it changed since: run with --restart")
            handle.seek(begin.byte)
        return handle
