"""Offline outputs: the clean lines and the decisions file, cut back to a checkpoint on resume."""

from __future__ import annotations

import os
import stat
import sys
from typing import BinaryIO, Optional

from ...core.records import KEPT, Decision, FileBatch
from ...errors import ResumeError
from .messages import STRING, json_string, similarity_json

try:
    from ...core import _kernel
except ImportError:  # built without a C compiler: each line written here
    _kernel = None

__all__ = ["FileOutputs", "decision_line", "decision_lines"]


def decision_line(decision: Decision) -> bytes:
    """``decision.as_json()`` as one JSON line, written directly (what json.dumps gives, twice as fast)."""
    if (decision.status == KEPT and decision.cluster == decision.id and decision.matched is None
            and decision.similarity is None and decision.reason is None and decision.containment is None):
        ident = STRING(decision.id)  # most lines: a new cluster, named by its own id
        return (f'{{"id": {ident}, "status": "kept", "cluster": {ident}, "matched": null, "similarity": null, '
                f'"reason": null, "relation": null, "containment": null}}\n').encode("utf-8")
    similarity = similarity_json(decision.similarity)
    return (f'{{"id": {STRING(decision.id)}, "status": {STRING(decision.status)}, '
            f'"cluster": {json_string(decision.cluster)}, "matched": {json_string(decision.matched)}, '
            f'"similarity": {similarity}, "reason": {json_string(decision.reason)}, '
            f'"relation": {json_string(decision.relation)}, '
            f'"containment": {similarity_json(decision.containment)}}}\n').encode("utf-8")


def decision_lines(decisions: list[Decision]) -> bytes:
    """``decision_line`` of each decision, joined: the new clusters' lines (most) by the kernel
    (``_kernel.decision_lines``, the same bytes), every other line by ``decision_line``."""
    if _kernel is not None:
        return _kernel.decision_lines(decisions if isinstance(decisions, list) else list(decisions), decision_line)
    return b"".join(decision_line(d) for d in decisions)


class _Output:
    """One output file that can be cut back to a recorded size.

    ``-`` (stdout) and other files that are not regular (``/dev/null``, a named pipe) are written
    as they come and never cut: a resumed run appends to them.
    """

    def __init__(self, path: str, keep_bytes: int):
        self.path = path
        self.cuttable = path != "-" and not _is_stream(path)
        if path == "-":
            self.handle: BinaryIO = sys.stdout.buffer
            self.size = 0
            return
        if not self.cuttable:
            self.handle = open(path, "wb")
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
        if not self.cuttable:
            return
        self.handle.seek(size)
        self.handle.truncate(size)
        self.size = size

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.size += len(data)

    def sync(self, durable: bool) -> None:
        self.handle.flush()
        if durable and self.cuttable:
            os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.path != "-":
            self.handle.close()
        else:
            self.handle.flush()


def _is_stream(path: str) -> bool:
    """Whether ``path`` is an existing file that is not a regular one (a device, a pipe)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


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

    def batch_bytes(self, lines: FileBatch, decisions: list[Decision]) -> dict:
        """What one batch appends to each output (only to those this run writes)."""
        written = {}
        if self.decisions is not None:
            written["decisions"] = decision_lines(decisions)
        if self.clean is not None:
            written["clean"] = b"".join(value + b"\n" for value, d in zip(lines.values(), decisions)
                                        if d.status == KEPT)
        return written

    def sizes_after(self, written: dict) -> dict:
        """The outputs' sizes once ``written`` is appended."""
        return {name: size + len(written.get(name, b"")) for name, size in self.sizes().items()}

    def append(self, written: dict) -> None:
        """Append one batch's bytes (``batch_bytes``) and make them durable."""
        for name, output in (("clean", self.clean), ("decisions", self.decisions)):
            if output is not None:
                output.write(written[name])
                output.sync(self.durable)

    def close(self) -> None:
        for output in (self.clean, self.decisions):
            if output is not None:
                output.close()
