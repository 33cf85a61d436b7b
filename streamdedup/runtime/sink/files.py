"""Offline outputs: the clean lines and the decisions file, cut back to a checkpoint on resume."""

from __future__ import annotations

import os
import queue
import stat
import sys
import threading
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
        self._appender: Optional[_Appender] = None  # started by the first ``appending``

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

    def sizes_after(self, written: dict, sizes: Optional[dict] = None) -> dict:
        """The outputs' sizes once ``written`` is appended to them at ``sizes`` (default: their sizes now)."""
        return {name: size + len(written.get(name, b"")) for name, size in (sizes or self.sizes()).items()}

    def appending(self, written: dict) -> "Appending":
        """``append(written)`` begun on the outputs' thread, when every output can be cut back (a resumed run
        drops what a batch never committed wrote); else put off until the caller waits for it (stdout, a pipe:
        nothing reaches them before the batch's decisions are sure)."""
        appending = Appending(self, written)
        if all(output.cuttable for output in (self.clean, self.decisions) if output is not None):
            if self._appender is None:
                self._appender = _Appender()
            self._appender.begin(appending)
        return appending

    def append(self, written: dict) -> None:
        """Append one batch's bytes (``batch_bytes``) and make them durable."""
        for name, output in (("clean", self.clean), ("decisions", self.decisions)):
            if output is not None:
                output.write(written[name])
                output.sync(self.durable)

    def close(self) -> None:
        if self._appender is not None:
            self._appender.stop()
        for output in (self.clean, self.decisions):
            if output is not None:
                output.close()


class Appending:
    """One batch's bytes appended to the outputs and made durable (``FileOutputs.append``): on the outputs'
    thread (``_Appender``) while the caller goes on (the writes and fsyncs wait for the disk without the GIL),
    or, never begun there, by ``wait``."""

    def __init__(self, outputs: FileOutputs, written: dict):
        self._outputs, self._written = outputs, dict(written)
        self._error: Optional[BaseException] = None
        self._done: Optional[threading.Event] = None  # set once appended, when begun on the thread

    def queued(self) -> None:
        """It is handed to the outputs' thread (``_Appender``), which runs it."""
        self._done = threading.Event()

    def run(self) -> None:
        try:
            self._outputs.append(self._written)
        except BaseException as exc:  # raised again in the caller's thread, by ``wait``
            self._error = exc
        if self._done is not None:
            self._done.set()

    def wait(self) -> None:
        """Until the bytes are appended and durable (raises what appending them raised)."""
        if self._done is None:
            self._done = threading.Event()
            self.run()
        self._done.wait()
        if self._error is not None:
            raise self._error

    def settle(self) -> None:
        """Until the append, if it was begun on the thread, has ended (the caller fails: its error is raised)."""
        if self._done is not None:
            self._done.wait()


class _Appender:
    """The thread the outputs' appends run on, one batch after the other (started once: a thread started a
    batch waits for the new thread to run, milliseconds on a busy machine)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="streamdedup-outputs", daemon=True)
        self._thread.start()

    def begin(self, appending: Appending) -> None:
        appending.queued()
        self._jobs.put(appending)

    def _run(self) -> None:
        while (appending := self._jobs.get()) is not None:
            appending.run()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()
