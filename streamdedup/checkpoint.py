"""Where input positions move: the commit protocols, in numbered steps.

Offline runs (``streamdedup dedup``)
====================================

The index and the output files must agree. A run is named by its inputs and
outputs; its checkpoint (in the index's ``positions`` database) holds the
input position after the last committed batch and the sizes the output files
had then. Each batch:

1. decide the batch inside an index write transaction (not yet committed);
2. cut the output files back to the sizes recorded for the batch's start
   (a no-op unless step 1 is being retried after the map grew), append the
   batch's decision and clean lines, and ``fsync`` them;
3. put the new checkpoint (position after the batch, output sizes) in the
   same transaction, and commit it durably.

Why a crash anywhere is safe: until step 3 commits, the index holds neither
the batch's decisions nor the new checkpoint, so a restart cuts the outputs
back to the recorded sizes (dropping whatever step 2 wrote) and decides the
batch again from the same index state, which gives the same decisions.
After step 3 the outputs already hold the batch durably (step 2 synced them
before the commit), so nothing committed can be missing from them. A run
that finishes marks its checkpoint done; running the same command again then
starts over, and every document is recognized as already decided.

The Kafka worker's protocol is ``KafkaCommit`` below.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Optional

from .index import Index, IndexTxn
from .source import FilePosition

__all__ = ["FileRun", "Resume", "crash_point"]

CRASH_ENV = "STREAMDEDUP_TEST_CRASH_AT"  # test-only: "step-name" or "step-name:N" (the N-th time)
_crash_counts: dict[str, int] = {}


def crash_point(step: str) -> None:
    """Die at once, like kill -9, when the test-only crash switch names this step."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != step:
        return
    _crash_counts[step] = _crash_counts.get(step, 0) + 1
    if _crash_counts[step] >= int(nth or 1):
        os._exit(137)


@dataclass(frozen=True)
class Resume:
    """Where a run starts: the input position and the output sizes to keep."""

    position: FilePosition
    sizes: dict
    resumed: bool


class FileRun:
    """The checkpoint of one offline run, named by its inputs and outputs."""

    def __init__(self, inputs: list[str], clean: Optional[str], decisions: Optional[str]):
        names = [p if p == "-" else os.path.abspath(p) for p in inputs]
        outs = [None if p is None or p == "-" else os.path.abspath(p) for p in (clean, decisions)]
        digest = hashlib.blake2b(json.dumps([names, outs]).encode(), digest_size=8).hexdigest()
        self.key = f"file-run:{digest}"
        self.inputs = names

    def resume_point(self, index: Index, restart: bool = False) -> Resume:
        """Continue an interrupted run of the same command, else start from the beginning."""
        with index.read() as txn:
            saved = txn.position(self.key)
        if saved is None or saved.get("done") or restart:
            return Resume(FilePosition(), {"clean": 0, "decisions": 0}, False)
        return Resume(FilePosition(**saved["position"]), saved["sizes"], True)

    def save(self, txn: IndexTxn, position: FilePosition, sizes: dict) -> None:
        """Step 3: the checkpoint after a batch, in the batch's transaction."""
        txn.set_position(self.key, {"inputs": self.inputs, "position": position.as_dict(), "sizes": sizes,
                                    "done": False})

    def finish(self, index: Index, sizes: dict) -> None:
        """Mark the run done, so the same command next time starts over."""

        def mark(txn: IndexTxn) -> None:
            txn.set_position(self.key, {"inputs": self.inputs, "sizes": sizes, "done": True})

        index.write(mark)
