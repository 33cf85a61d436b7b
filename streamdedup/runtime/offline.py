"""Offline deduplication of JSONL files against the on-disk index: the ``dedup`` command's loop."""

from __future__ import annotations

import os
import time
from typing import Optional

from ..core.decode import InputSpec
from ..errors import ConfigError
from ..engine.engine import Engine
from ..ops.progress import Progress
from ..ops.summary import Summary
from .checkpoint import FileRun
from .feed import ProcessFeed, open_feed
from .sink import FileOutputs
from .source import FilePosition

__all__ = ["Summary", "dedup_files"]


def dedup_files(engine: Engine, inputs: list[str], spec: InputSpec, clean: Optional[str],
                decisions_path: Optional[str], batch_size: int = 1000, restart: bool = False,
                progress: Optional[Progress] = None, prepare_processes: int = 0,
                spawned: Optional[ProcessFeed] = None, learn_first: bool = False) -> Summary:
    """Deduplicate the lines of ``inputs`` in order; see ``checkpoint`` for the commit protocol.

    The next batches are read and prepared by a feed (in a second process
    when ``prepare_processes`` is 1, or ``spawned``: see ``feed.spawn_file_feed``)
    while the current one is decided. ``learn_first``: read the inputs once
    before, to learn every site's template (``Engine.learn_templates_first``).
    """
    run = FileRun(inputs, clean, decisions_path)
    start = run.resume_point(engine.index, restart)
    if learn_first:
        _learn_templates(engine, inputs, spec, batch_size, prepare_processes)
    outputs = FileOutputs(clean, decisions_path, start.sizes, durable=engine.index.settings.sync)
    sizes = _input_sizes(inputs)
    progress = progress or Progress(None if sizes is None else sum(sizes), enabled=False)
    summary = Summary(resumed=start.resumed)
    began = time.monotonic()
    feed = open_feed(inputs, spec, engine.signing, batch_size, prepare_processes, start.position, spawned,
                     lines=clean is not None)
    try:
        for batch in feed.batches():
            feed.fetch_ahead()  # the next batch comes off the pipe on the feed's thread, mostly while this one syncs
            engine.between_batches()
            summary.add(run.commit(engine, outputs, batch.records, batch.position, batch.prepared))
            progress.update(len(batch.records), _bytes_done(sizes, batch.position))
        run.finish(engine.index, outputs.sizes())
    finally:
        feed.close()
        outputs.close()
        progress.close()
    summary.seconds = time.monotonic() - began
    return summary


def _learn_templates(engine: Engine, inputs: list[str], spec: InputSpec, batch_size: int, processes: int) -> None:
    if "-" in inputs:
        raise ConfigError("--learn-first reads the inputs twice: give files, not stdin (-)")
    feed = open_feed(inputs, spec, engine.signing, batch_size, processes, FilePosition(), lines=False)
    try:
        engine.learn_templates_first(batch.prepared for batch in feed.batches())
    finally:
        feed.close()


def _input_sizes(inputs: list[str]) -> Optional[list[int]]:
    """Bytes in each input, for the progress bar; None when reading stdin."""
    return None if "-" in inputs else [os.path.getsize(p) for p in inputs]


def _bytes_done(sizes: Optional[list[int]], position) -> int:
    """Input bytes read up to ``position``."""
    return position.byte if sizes is None else sum(sizes[: position.file]) + position.byte
