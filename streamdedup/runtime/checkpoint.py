"""Where input positions move: the commit protocols, in numbered steps.

Each front end commits a batch in one method that lists its steps top to
bottom: ``FileRun.commit`` (offline) and ``KafkaCommit.commit`` (the worker).
A batch's index transaction is explicit (``index.TxnState``): *open* while
the batch is decided, *prepared* once it is written (no index write after
that), then *committed* or *aborted*; each step checks it.

Offline runs (``streamdedup dedup``)
====================================

The index and the output files must agree. A run is named by its inputs and
outputs; its checkpoint (in the index's ``positions`` database) holds the
input position after the last committed batch and the sizes the output files
had then. Each batch:

1. decide the batch in an index write transaction, and put into it the new
   checkpoint: the position after the batch and the output sizes after its
   lines; the transaction is prepared (a map that fills up here: grown, and
   the batch decided again);
2. append the batch's decision and clean lines to the outputs and ``fsync``
   them: begun on a thread as soon as the decisions are made, while step 1
   writes the batch's documents into the transaction, and waited for before
   step 3 (with an output that cannot be cut back, stdout or a pipe, only
   once step 1 is done);
3. commit the index transaction durably.

Why a crash anywhere is safe: until step 3 commits, the index holds neither
the batch's decisions nor the new checkpoint, so a restart cuts the outputs
back to the recorded sizes (dropping whatever step 2 wrote) and decides the
batch again from the same index state, which gives the same decisions.
After step 3 the outputs already hold the batch durably (step 2 synced them
before the commit), so nothing committed can be missing from them. A commit
that fills the map (step 3) is recovered like a crash before it, without
the restart: the batch is decided again into the grown map, with the same
decisions and so the same checkpoint, and committed; step 2 is not repeated
(the outputs already hold the batch, and stdout cannot be cut back). A run
that finishes marks its checkpoint done; running the same command again then
starts over, and every document is recognized as already decided.

The Kafka worker
================

The index (decisions, input positions) and Kafka (outputs, the group's
committed offsets) have no transaction in common. Each batch:

1. poll a batch and put it in the canonical order: topic, partition, offset
   (``source``, ``feed``);
2. decode and prepare it (pure: no state changes);
3. decide it in an index write transaction with the input positions after
   the batch, and leave it prepared (a map that fills up here: grown, and
   the batch decided again: nothing has left the process yet);
4. in one Kafka transaction: begin, produce the outcomes (clean, duplicates,
   dead-letter) and send the input offsets after the batch for the group
   (both at once: the offsets go on a helper thread), commit. Every wait is
   bounded by ``worker.kafka_timeout_s``: a wait that gives up aborts the
   index transaction and throws the session away (its producer closed, its
   open transaction aborted by the next session's ``init_transactions`` or
   by the broker), and the next session recovers the batch as below;
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
  decisions, so the index ends as if step 5 had run. A step 5 that fills
  the map is recovered the same way at once: the batch is decided again
  into the grown map and committed, and nothing is emitted again;
- after step 5 both agree.

The reverse window cannot happen: the index commits only after Kafka. Where
the index is ahead (group offsets expired or were reset), the index wins. A
group with committed offsets and an index that never consumed those
partitions means another index was used with this group: that is refused.
What to do at start, partition by partition, is decided by ``start_plan``.

A virtual shard of a sharded deployment
=======================================

A vshard (``runtime.vshards``) decides an epoch in stages, exchanging
messages with the other vshards through the exchange topic; its own
messages go out without a transaction (they are deterministic: the vshard's
state as of the epoch before, and the messages it received, so one sent
twice is the same, and a receiver keeps the first). Once the epoch is
decided here (``VShardCommit.commit``, for every vshard of the process that
decided one in the same turn of its loop, each step for all of them before
the next):

1. wait until the broker has every message the vshard sent in the epoch (a
   vshard past an epoch never sends its messages of it again, and the
   others wait for them); a message it never took (refused, or given up
   on by the producer) raises here, before anything is committed
   (``sink.deliveries``);
2. in one Kafka transaction of the process's producer, for all its vshards
   that decided an epoch in the turn: their outcomes, and for each of them
   the order topic's offset after its epoch, committed for the group
   ``<group_id>-vshards`` (the one that gives processes their vshards) on
   the vshard's partition of the exchange topic, with the group's
   generation as this process last followed it (KIP-447): a process the
   group has moved on from (its vshards given to others) is fenced by the
   group coordinator, its transaction aborted;
3. commit the vshard's state (LMDB, every change of the epoch in the one
   write transaction it began with it) with its positions: the next order
   message, each input partition's next offset, the next serial, where to
   read its records and exchange partitions from.

Why a crash anywhere is safe: before step 2 commits, Kafka holds no outcome
of the epoch and the state is the epoch before's; the restarted vshard
reads the epoch's order message, its records and the messages the others
sent it again, sends its own again (the same), and decides the epoch again,
alike. Between steps 2 and 3 Kafka has the outcomes and the order offset,
the state has neither: a process given the vshard reads that committed
offset (read_committed, so once no transaction that may write it is open)
and decides every epoch before it again *without emitting*; it reads it
again whenever the group's generation changes, as any commit of another
generation than its own is refused. A vshard moved to another process is
the same restart, there. A transaction the broker aborted (the process
paused past ``transaction_timeout_ms``), a fenced producer or a refused
generation never gets to step 3: ``TransactionFencedError`` ends the
session (not the process), its epochs in flight thrown away uncommitted
(``GroupMovedError`` for a refused generation: the next session starts at
once, the broker being there).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..core.memory import collector_paused
from ..core.prepare import PreparedBatch
from ..core.records import Decision, FileBatch
from ..errors import GroupMovedError, IndexUnusableError, TransactionFencedError
from ..faults import reached
from ..store.index import Index, IndexTxn
from .sink import FileOutputs
from .sink.messages import HEADER_PREFIX
from .source import FilePosition

if TYPE_CHECKING:
    from ..engine.engine import Engine

__all__ = ["FileRun", "Resume", "KafkaCommit", "VShardCommit", "VShardEpoch", "StartPlan", "start_plan",
           "WORKER_POSITIONS"]

WORKER_POSITIONS = "kafka"  # the prefix of the live worker's input positions in the index (``KafkaCommit``)


def _nothing() -> None:
    pass


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

    def commit(self, engine: Engine, outputs: FileOutputs, lines: FileBatch, position: FilePosition,
               prepared: PreparedBatch) -> list[Decision]:
        """One batch through the offline protocol's steps 1-3; returns its decisions."""
        with collector_paused():  # from the batch's Documents on (see ``engine``)
            # Step 1. Decide, with the checkpoint after the batch, in a prepared index transaction; step 2 begins
            # as soon as the decisions are made, while the batch's documents are written into the transaction.
            sizes, written, appending = outputs.sizes(), {}, []

            def checkpoint(txn: IndexTxn, decisions: list[Decision]) -> None:
                written.update(outputs.batch_bytes(lines, decisions))  # the same bytes if decided again
                self._save(txn, position, outputs.sizes_after(written, sizes))
                if not appending:
                    appending.append(outputs.appending(written))

            try:
                decided = engine.decide(prepared, checkpoint)
            except BaseException:
                for started in appending:
                    started.settle()
                raise
            try:
                reached("file-decided")  # the append may be under way
                # Step 2. The batch's lines appended to the outputs, durably.
                appending[0].wait()
            except BaseException:
                appending[0].settle()
                decided.abort()
                raise
            reached("file-written")
            # Step 3. Commit the index transaction.
            decisions = engine.commit(decided)
        reached("file-committed")
        return decisions

    def _save(self, txn: IndexTxn, position: FilePosition, sizes: dict) -> None:
        txn.set_position(self.key, {"inputs": self.inputs, "position": position.as_dict(), "sizes": sizes,
                                    "done": False})

    def finish(self, index: Index, sizes: dict) -> None:
        """Mark the run done, so the same command next time starts over."""

        def mark(txn: IndexTxn) -> None:
            txn.set_position(self.key, {"inputs": self.inputs, "sizes": sizes, "done": True})

        index.write(mark)


class KafkaCommit:
    """Steps 2-5 of the worker's protocol for one batch, and the recovery at start.

    Without a sink (``--index-only``, or a replayed batch) only the index
    moves: steps 3 and 5.
    """

    def __init__(self, engine: Engine, spec, sink, group_id: str, position_prefix: str,
                 kafka_timeout_s: float = 60.0):
        self.engine = engine
        self.spec = spec
        self.sink = sink
        self.group_id = group_id
        self.prefix = position_prefix
        self.kafka_timeout_s = kafka_timeout_s

    def position_key(self, partition) -> str:
        return f"{self.prefix}:{partition.topic}:{partition.partition}"

    def stored_positions(self, partitions: list) -> dict:
        with self.engine.index.read() as txn:
            return {p: txn.position(self.position_key(p)) for p in partitions}

    def commit(self, records: list, prepared=None, emit: bool = True, positions: Optional[dict] = None,
               while_waiting: Callable[[], None] = _nothing) -> list[Decision]:
        """One batch (in canonical order) through steps 2-5; returns its decisions.

        ``prepared`` is the batch's step 2, done ahead (``feed``), or None to
        do it here. ``positions`` replaces the offsets after the batch (a
        replayed batch ends where Kafka's committed offsets say, control
        records included). ``while_waiting`` is called as the batch starts
        waiting for Kafka and the disk (the feed takes its next batch then).
        """
        if prepared is None:  # Step 2. Decode and prepare.
            from ..core.prepare import prepare_raw, raw_payload

            prepared = prepare_raw(raw_payload(records), self.spec, self.engine.signing)
        after = positions if positions is not None else _offsets_after(records)
        with collector_paused():
            # Step 3. Decide, with the input positions after the batch, in a prepared index transaction.
            decided = self.engine.decide(prepared, lambda txn, _: self._save_positions(txn, after))
            reached("decided")
            # Step 4. The outcomes and the group's offsets in one Kafka transaction.
            try:
                if emit and self.sink is not None:
                    self._kafka_transaction(records, decided.decisions, after, while_waiting)
                else:
                    while_waiting()
            except BaseException:
                decided.abort()
                raise
            # Step 5. Commit the index transaction.
            decisions = self.engine.commit(decided)
        reached("index-committed")
        return decisions

    def _kafka_transaction(self, records: list, decisions: list[Decision], after: dict,
                           while_waiting: Callable[[], None]) -> None:
        """Step 4: begin, produce the outcomes while the offsets are sent, commit; each wait bounded."""
        sink = self.sink
        sink.begin()
        reached("kafka-begun")
        offsets = sink.send_offsets(after, self.group_id)
        sink.send(sink.messages(records, decisions))
        reached("produced")
        while_waiting()
        offsets.wait(self.kafka_timeout_s, "the input offsets to join the Kafka transaction", sink.transaction_error)
        reached("offsets-sent")
        sink.commit(self.kafka_timeout_s)
        reached("kafka-committed")

    def _save_positions(self, txn: IndexTxn, after: dict) -> None:
        for partition, offset in after.items():
            txn.set_position(self.position_key(partition), offset)

    def set_positions(self, positions: dict) -> None:
        """Record start positions for partitions the index has never consumed."""
        self.engine.index.write(lambda txn: self._save_positions(txn, positions))


def _offsets_after(records: list) -> dict:
    """Next offset to read per partition after these records."""
    from kafka import TopicPartition

    after: dict = {}
    for r in records:
        where = (r.source.name, r.source.partition)
        after[where] = max(after.get(where, 0), r.source.offset + 1)
    return {TopicPartition(*where): offset for where, offset in after.items()}


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
                    "Use the original index; if its folder was lost, restore it (`streamdedup restore BACKUP`, "
                    "or `streamdedup restore --from-topics` without a backup; see deploy/README.md); "
                    "or set kafka.group_id to a new group"
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


ORDER_HEADER = HEADER_PREFIX + "order"  # an outcome's place in a sharded deployment's decision order


@dataclass
class VShardEpoch:
    """A vshard's epoch, decided: what ``VShardCommit`` puts out and commits."""

    vshard: object  # engine.vshards.VShard
    offset: int  # the epoch's order message's
    records: list  # this home's records of it, whole, with their ``serials`` and ``decisions``
    serials: list
    decisions: list
    positions: dict  # what its state commits with the epoch
    emit: bool  # False: Kafka has its outcomes already (decided again after a crash)

    @property
    def emits(self) -> bool:
        return self.emit and bool(self.records)


def _places(epoch: VShardEpoch) -> list[list]:
    """The ``ORDER_HEADER`` of each record of ``epoch``: the epoch's order offset / the record's serial."""
    return [[(ORDER_HEADER, b"%d/%d" % (epoch.offset, serial))] for serial in epoch.serials]


class VShardCommit:
    """Steps 1-3 of the vshards' protocol for epochs decided together (see the module's docstring)."""

    def __init__(self, publisher, exchange_topic: str, kafka_timeout_s: float):
        """``publisher``: what flushes the vshards' messages to each other (not transactional): their producer,
        or its ``sink.deliveries.Deliveries``, whose flush raises for a message the broker did not take."""
        self.publisher = publisher
        self.exchange_topic = exchange_topic
        self.kafka_timeout_s = kafka_timeout_s

    def commit(self, epochs: list[VShardEpoch], sink, group) -> None:
        """The epochs' outcomes out (those Kafka lacks) in one transaction of ``sink`` (the process's
        transactional producer), their order offsets committed for ``group`` (the vshards' group's metadata, whose
        generation fences a former host, or its bare name for vshards given by number), then each vshard's
        state."""
        self.publisher.flush(timeout=self.kafka_timeout_s)  # Step 1: every message out, or raised for.
        out = [e for e in epochs if e.emits]
        if out:  # Step 2.
            self._fenced_as_retriable(lambda: self._sent_and_committed(out, sink, group))
            reached("vshard-kafka-committed")
        for e in epochs:
            e.vshard.commit(e.positions)  # Step 3.
            reached("vshard-committed")

    def _sent_and_committed(self, out: list[VShardEpoch], sink, group) -> None:
        """Step 2: the transaction open, each epoch's outcomes sent in it, each saying its place in the order
        (``streamdedup.order``: the epoch's order offset / the record's serial), the order offsets joined to
        it, and committed."""
        from kafka import TopicPartition

        sink.begin()
        reached("vshard-kafka-begun")
        offsets = sink.send_offsets({TopicPartition(self.exchange_topic, e.vshard.number): e.offset + 1 for e in out},
                                    group)
        sink.send([message for e in out for message in sink.messages(e.records, e.decisions, _places(e))])
        offsets.wait(self.kafka_timeout_s, "the order offsets to join the Kafka transaction", sink.transaction_error)
        reached("vshard-kafka-sent")  # the transaction is open at the broker now (a pause here outlives it)
        sink.commit(self.kafka_timeout_s)

    @staticmethod
    def _fenced_as_retriable(step: Callable[[], None]) -> None:
        """Run step 2; a fenced producer or a refused generation ends the session (``TransactionFencedError``;
        ``GroupMovedError`` for the generation, after which the next session starts at once), not the process.

        For one worker a fenced producer means another worker took its index (fatal, ``kafka_trouble``); for
        the vshards' producer it means its transaction outlived ``transaction_timeout_ms`` (the process was
        paused) and the broker aborted it, or a new session of the process took its transactional id; a
        refused generation means the group moved the vshards since this process last followed it. Either way
        the epochs' outcomes are not in Kafka: the session is thrown away with its epochs in flight (their
        LMDB transactions aborted), and their hosts, this process or another, decide them again."""
        from kafka.errors import (
            CommitFailedError,
            FencedInstanceIdError,
            IllegalGenerationError,
            InvalidProducerEpochError,
            ProducerFencedError,
            UnknownMemberIdError,
        )

        try:
            step()
        except (ProducerFencedError, InvalidProducerEpochError) as exc:
            raise TransactionFencedError(
                f"the vshards' Kafka transaction was fenced ({type(exc).__name__}): its epochs are decided again in "
                "a new session; if this recurs without pauses, raise [kafka.producer] transaction_timeout_ms above "
                "the longest epoch") from exc
        except (CommitFailedError, FencedInstanceIdError, IllegalGenerationError, UnknownMemberIdError) as exc:
            raise GroupMovedError(
                f"the vshards' Kafka transaction was fenced by their consumer group ({type(exc).__name__}: the group "
                "moved vshards since this process last looked): its epochs are decided again in a new session, by "
                "their hosts now") from exc
