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

The Kafka worker
================

The index (decisions, input positions) and Kafka (outputs, the group's
committed offsets) have no transaction in common. Each batch:

1. poll a batch and put it in the canonical order: topic, partition, offset;
2. decode and prepare it (pure: no state changes);
3. decide it in an index write transaction (not yet committed) and put the
   input positions after the batch into that same transaction;
4. in one Kafka transaction: begin, produce the outcomes (clean, duplicates,
   dead-letter) and send the input offsets after the batch for the group
   (both at once: the offsets go on a helper thread), commit;
5. commit the index transaction (durably).

Why a crash anywhere is safe:

- before step 4 commits, Kafka holds nothing of the batch: an open Kafka
  transaction is aborted by the restarted worker's ``init_transactions``
  (same transactional id, derived from the index), the index never committed
  either, and the batch is read and decided again from the same state;
- between steps 4 and 5 (the narrow window) Kafka has the outcomes and the
  group offsets, the index has neither. At start, wherever the group's
  committed offset is ahead of the index's position, exactly that batch is
  replayed into the index *without emitting*, in the canonical order: the
  same records in the same order against the same index state give the same
  decisions, so the index ends as if step 5 had run;
- after step 5 both agree.

The reverse window cannot happen: the index commits only after Kafka. Where
the index is ahead (group offsets expired or were reset), the index wins. A
group with committed offsets and an index that never consumed those
partitions means another index was used with this group: that is refused.
What to do at start, partition by partition, is decided by ``start_plan``.
Nothing writes to the index after step 4, so a map that fills up can only
retry steps 3 and before.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import IndexUnusableError
from .index import Index, IndexTxn
from .source import FilePosition

__all__ = ["FileRun", "Resume", "KafkaCommit", "StartPlan", "start_plan", "crash_point"]

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


class KafkaCommit:
    """Steps 2-5 of the worker's protocol for one batch, and the recovery at start.

    Without a sink (``--index-only``) only the index moves: steps 3 and 5.
    """

    def __init__(self, engine, spec, sink, group_id: str, position_prefix: str):
        self.engine = engine
        self.spec = spec
        self.sink = sink
        self.group_id = group_id
        self.prefix = position_prefix
        self.while_waiting: Callable[[], None] = lambda: None  # called as the batch's waits begin (see feed)

    def position_key(self, partition) -> str:
        return f"{self.prefix}:{partition.topic}:{partition.partition}"

    def stored_positions(self, partitions: list) -> dict:
        with self.engine.index.read() as txn:
            return {p: txn.position(self.position_key(p)) for p in partitions}

    def process(self, records: list, prepared=None, emit: bool = True, positions: Optional[dict] = None) -> list:
        """Decide a batch (in canonical order) and commit it; returns the decisions.

        ``prepared`` is the batch's Step 2, done ahead (``prepare.Preparer``),
        or None to do it here. ``positions`` replaces the offsets after the
        batch (a replayed batch ends where Kafka's committed offsets say,
        control records included).
        """
        if prepared is None:  # Step 2
            from .prepare import prepare_raw, raw_payload

            prepared = prepare_raw(raw_payload(records), self.spec, self.engine.signing)
        after = positions if positions is not None else _offsets_after(records)

        def bookkeeping(txn: IndexTxn, decisions: list) -> None:
            for partition, offset in after.items():  # Step 3 (the decisions are in the transaction)
                txn.set_position(self.position_key(partition), offset)
            crash_point("decided")
            if emit and self.sink is not None:
                self._emit(records, decisions, after)  # Step 4; no index write after this
            else:
                self.while_waiting()  # for the index's durable commit

        decisions = self.engine.decide_batch(prepared, bookkeeping)  # Step 5: commit
        crash_point("index-committed")
        return decisions

    def _emit(self, records: list, decisions: list, after: dict) -> None:
        sink = self.sink
        sink.begin()
        crash_point("kafka-begun")
        offsets = sink.send_offsets(after, self.group_id)  # runs while the outcomes are produced
        sink.send(sink.messages(records, decisions))
        crash_point("produced")
        self.while_waiting()  # for Kafka's commit, then the index's
        offsets.wait()
        crash_point("offsets-sent")
        sink.commit()
        crash_point("kafka-committed")

    def set_positions(self, positions: dict) -> None:
        """Record start positions for partitions the index has never consumed."""

        def put(txn: IndexTxn) -> None:
            for partition, offset in positions.items():
                txn.set_position(self.position_key(partition), offset)

        self.engine.index.write(put)


def _offsets_after(records: list) -> dict:
    """Next offset to read per partition after these records."""
    from kafka import TopicPartition

    after: dict = {}
    for r in records:
        tp = TopicPartition(r.source.name, r.source.partition)
        after[tp] = max(after.get(tp, 0), r.source.offset + 1)
    return after


@dataclass(frozen=True)
class StartPlan:
    """What a worker session does at start (``start_plan``); every dict is keyed by partition."""

    fresh: dict  # partitions the index never consumed: their beginning offset, to record before reading
    gaps: dict  # (index position, group's committed offset): emitted but not indexed, replayed without emitting
    starts: dict  # the offset to read from
    warnings: list  # (event, fields) to log: the group's offsets disagree with the index, which wins


def start_plan(stored: dict, committed: dict, beginnings: dict, has_sink: bool, group_id: str) -> StartPlan:
    """Where each partition starts, from the index's ``stored`` positions (None: never consumed), the group's
    ``committed`` offsets (absent or None: none) and the partitions' ``beginnings``; in the order of ``stored``.

    Without a sink nothing is committed for the group, so a missing group offset is no news then.
    Raises IndexUnusableError when the group has an offset on a partition this index never read.
    """
    fresh, gaps, starts, warnings = {}, {}, {}, []
    for p, s in stored.items():
        c = committed.get(p)
        name = f"{p.topic}/{p.partition}"
        if s is None:
            if c is not None:
                raise IndexUnusableError(
                    f"consumer group {group_id!r} has committed offset {c} on {name} "
                    "but this index never read that partition: another index was used with this group. "
                    "Use the original index, or set kafka.group_id to a new group"
                )
            fresh[p] = starts[p] = beginnings[p]
        elif c is not None and c > s:
            gaps[p] = (s, c)
            starts[p] = c
        else:
            if c is None and has_sink:
                warnings.append(("group_offset_missing", {"partition": name, "index_position": s}))
            elif c is not None and c < s:
                warnings.append(("group_offset_behind", {"partition": name, "group": c, "index": s}))
            starts[p] = s
    return StartPlan(fresh, gaps, starts, warnings)
