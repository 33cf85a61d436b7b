"""Offline deduplication of JSONL files against the on-disk index: the ``dedup`` command's loop."""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Optional

from ..core.decode import InputSpec
from ..core.prepare import Preparer
from ..engine.engine import Engine
from ..ops.progress import Progress
from ..ops.summary import Summary
from .checkpoint import FileRun
from .sink import FileOutputs
from .source import FileSource

__all__ = ["Summary", "dedup_files"]


BATCHES_AHEAD = 2  # submitted for preparing before the oldest is decided: the preparing process never idles


def dedup_files(engine: Engine, inputs: list[str], spec: InputSpec, clean: Optional[str],
                decisions_path: Optional[str], batch_size: int = 1000, restart: bool = False,
                progress: Optional[Progress] = None, prepare_processes: int = 0) -> Summary:
    """Deduplicate the lines of ``inputs`` in order; see ``checkpoint`` for the commit protocol.

    The next batches are read and prepared (in a second process when
    ``prepare_processes`` is 1) while the current one is decided.
    """
    run = FileRun(inputs, clean, decisions_path)
    start = run.resume_point(engine.index, restart)
    outputs = FileOutputs(clean, decisions_path, start.sizes, durable=engine.index.settings.sync)
    source = FileSource(inputs)
    progress = progress or Progress(source.total_bytes(), enabled=False)
    summary = Summary(resumed=start.resumed)
    preparer = Preparer(engine.signing, spec, prepare_processes)
    began = time.monotonic()
    done_before = _bytes_done_before(inputs, start)
    try:
        ahead: deque = deque()  # (lines, position, prepared future), oldest first
        for lines, position in source.batches(batch_size, start.position):
            ahead.append((lines, position, preparer.submit(lines)))
            engine.between_batches()
            if len(ahead) > BATCHES_AHEAD:
                _decide_oldest(engine, run, outputs, summary, ahead, progress, done_before + source.bytes_read)
        while ahead:
            _decide_oldest(engine, run, outputs, summary, ahead, progress, done_before + source.bytes_read)
        run.finish(engine.index, outputs.sizes())
    finally:
        preparer.close()
        outputs.close()
        progress.close()
    summary.seconds = time.monotonic() - began
    return summary


def _decide_oldest(engine: Engine, run: FileRun, outputs: FileOutputs, summary: Summary, ahead: deque,
                   progress: Progress, bytes_done: int) -> None:
    lines, position, prepared = ahead.popleft()
    summary.add(run.commit(engine, outputs, lines, position, prepared))
    progress.update(len(lines), bytes_done)


def _bytes_done_before(inputs: list[str], start) -> int:
    """Input bytes an interrupted run had already done (for the progress bar)."""
    if not start.resumed or "-" in inputs:
        return 0
    return sum(os.path.getsize(p) for p in inputs[: start.position.file]) + start.position.byte
