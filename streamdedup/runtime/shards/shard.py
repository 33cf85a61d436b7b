"""The ``shard`` role: one shard's process, reading every signed batch and deciding it with every other shard.

The loop, reconnection and telemetry are the worker's (``worker.WorkerLoop``);
a session here reads the signed topic (this shard's group stores its
offsets), reads the evidence topic (no group: its positions are in the
index), and writes outcomes and evidence with one transactional producer.
The commit protocol of a batch is ``checkpoint.ShardCommit``.
"""

from __future__ import annotations

import time
from typing import Optional

from ...config import Config, kafka_client_settings
from ...core.signed import ForgetOrder, unpack_signed
from ...engine.evidence import ShardPlace
from ...engine.shards.shard import ShardEngine
from ...errors import BrokerUnavailableError, IndexUnusableError
from ...ops.logs import Log
from ...ops.telemetry import WorkerTelemetry
from ..checkpoint import ShardCommit
from ..sink import KafkaSink
from ..source import KafkaSource
from ..worker import LAG_CHECK_S, Stopper, WorkerLoop, WorkerStats, close_quietly, session_rights
from .topics import SIGNED_MESSAGE_BYTES, ensure_internal_topics, values_topic

__all__ = ["run_shard", "EvidenceBoard", "ValuesBoard"]

GATHER_PATIENCE_S = 5.0  # a batch waiting longer than this for other shards' evidence says so in the log


class EvidenceBoard:
    """Every shard's evidence on the signed batches, as read from the evidence topic (one partition per shard).

    A shard may publish its evidence on a batch twice (after a crash); the
    two are the same, and the first is kept. Evidence on later batches read
    early waits here for its batch.
    """

    def __init__(self, source: KafkaSource, signed_topic: str, evidence_topic: str, count: int, log: Log,
                 step, stopper: Stopper):
        from kafka import TopicPartition

        self.source = source
        self.signed_topic = signed_topic
        self.count = count
        self.log = log
        self.step = step
        self.stopper = stopper
        self.partitions = [TopicPartition(evidence_topic, n) for n in range(count)]
        self._found: dict[tuple, dict[int, tuple[bytes, int]]] = {}  # (signed offset, round) -> shard -> (evidence, offset)
        self._last: Optional[tuple] = None  # the last answer of ``gather``

    def start(self, positions: dict) -> None:
        """Read each shard's partition from ``positions[n]`` (None: its beginning)."""
        self.source.assign(self.partitions)
        for n, partition in enumerate(self.partitions):
            self.source.seek(partition, positions.get(n))
        self._found.clear()
        self._last = None

    def gather(self, offset: int, round_: str) -> tuple[list[bytes], dict]:
        """Every shard's evidence of round ``round_`` ("a", "b"; "f" for a forget order) on the signed message at
        ``offset``, in shard order, and each partition's offset after it. Asked again for the same, it
        answers the same (a batch decided again)."""
        wanted = (offset, round_)
        if self._last is not None and self._last[0] == wanted:
            return self._last[1]
        for earlier in [k for k in self._found if k[0] < offset]:
            del self._found[earlier]
        began = time.monotonic()
        told = 0.0
        while len(self._found.get(wanted, ())) < self.count:
            if self.stopper.stopped:
                raise BrokerUnavailableError("stopping while waiting for the other shards' evidence")
            self.step(f"round {round_} evidence on signed batch {offset} from every shard")
            for record in self.source.poll_batch(200, max_records=1000):
                batch, _, its_round = record.key.decode().partition("/")
                key = (int(batch), its_round)
                if key[0] >= offset:
                    self._found.setdefault(key, {}).setdefault(record.source.partition,
                                                              (record.value, record.source.offset))
            waited = time.monotonic() - began
            if waited - told >= GATHER_PATIENCE_S:
                told = waited
                missing = sorted(set(range(self.count)) - set(self._found.get(wanted, {})))
                self.log.warning("waiting_for_shards", batch=offset, round=round_,
                                 missing=",".join(map(str, missing)), waited_s=round(waited, 1))
        here = self._found.pop(wanted)
        result = [here[n][0] for n in range(self.count)], {n: here[n][1] + 1 for n in range(self.count)}
        self._last = (wanted, result)
        return result

    def close(self) -> None:
        self.source.close()


class ValuesBoard:
    """This shard's partition of the values topic: the values messages the signed batches name for it.

    Two signing processes write their values messages in any order, so a
    signed batch may name one before that of the batch before it: the
    messages read ahead are held for a while, and one asked for again
    after it left is read again from its offset.
    """

    HELD = 64  # values messages held on either side of the one asked for last

    def __init__(self, source: KafkaSource, topic: str, number: int, step, stopper: Stopper,
                 timeout_s: float = 60.0):
        from kafka import TopicPartition

        self.source = source
        self.step = step
        self.stopper = stopper
        self.timeout_s = timeout_s
        self.partition = TopicPartition(topic, number)
        self.source.assign([self.partition])
        self._held: dict[int, bytes] = {}
        self._next: Optional[int] = None  # the offset the reader reads next (None: not placed yet)

    def at(self, offset: int) -> bytes:
        """The values message at ``offset`` (BrokerUnavailableError if it does not come within ``timeout_s``:
        the session starts again)."""
        if offset not in self._held and (self._next is None or offset < self._next):
            self._seek(offset)
        deadline = time.monotonic() + self.timeout_s
        while offset not in self._held:
            if self.stopper.stopped:
                raise BrokerUnavailableError("stopping while reading the values of a signed batch")
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(
                    f"values message {offset} of {self.partition.topic}/{self.partition.partition}, named by a signed "
                    f"batch, did not come in {self.timeout_s:.0f} s")
            self.step(f"values message {offset} of shard {self.partition.partition}")
            for record in self.source.poll_batch(200, max_records=100):
                self._held[record.source.offset] = record.value
                self._next = record.source.offset + 1
        found = self._held[offset]
        for old in [at for at in self._held if at < offset - self.HELD or at > offset + self.HELD]:
            del self._held[old]
        return found

    def _seek(self, offset: int) -> None:
        first = self.source.consumer.beginning_offsets([self.partition])[self.partition]
        if first > offset:
            raise IndexUnusableError(
                f"a signed batch names values message {offset} of {self.partition.topic}/{self.partition.partition}, "
                f"which the topic no longer holds (it now begins at {first}): its retention must be at least the "
                "signed topic's (deploy/README.md)")
        self.source.seek(self.partition, offset)
        self._held.clear()
        self._next = offset

    def close(self) -> None:
        self.source.close()


class ShardSession:
    """One connection to the broker for a shard: the signed and evidence readers, the transactional producer."""

    def __init__(self, engine: ShardEngine, config: Config, log: Log, transactional_id: str, group_id: str,
                 stopper: Stopper, step):
        ensure_internal_topics(config)
        self.engine = engine
        self.config = config
        self.log = log
        shards = config.shards
        settings = kafka_client_settings(config.kafka, "consumer")
        self.signed = self.board = self.values = self.sink = self.publisher = None
        try:
            from kafka import KafkaProducer

            self.publisher = KafkaProducer(**{"acks": "all", "linger_ms": 0, "max_request_size": SIGNED_MESSAGE_BYTES,
                                              **kafka_client_settings(config.kafka, "producer")})
            self.signed = KafkaSource([shards.signed_topic], settings, group_id, 1)
            self.board = EvidenceBoard(KafkaSource([shards.evidence_topic], settings, None, 1000),
                                       shards.signed_topic, shards.evidence_topic, shards.count, log, step, stopper)
            self.values = ValuesBoard(KafkaSource([values_topic(config)], settings, None, 100), values_topic(config),
                                      engine.place.number, step, stopper, config.worker.kafka_timeout_s)
            out = config.output
            self.sink = KafkaSink(kafka_client_settings(config.kafka, "producer"), transactional_id,
                                  {"clean": out.clean_topic, "duplicates": out.duplicates_topic,
                                   "dead_letter": out.dead_letter_topic}, out.dead_letter_max_bytes)
        except BaseException:
            self.close()
            raise
        self.commit = ShardCommit(engine, self.sink, self.board, self.values, self.publisher, group_id,
                                  shards.evidence_topic,
                                  config.worker.kafka_timeout_s)
        self.partitions: list = []

    def recover(self) -> dict:
        """Decide again, without emitting, the batches Kafka committed and the index did not; seek; returns
        the signed offset to read from."""
        from kafka import TopicPartition

        signed = TopicPartition(self.config.shards.signed_topic, 0)
        self.partitions = [signed]
        self.signed.assign(self.partitions)
        stored = self.commit.stored_position()
        committed = self.signed.committed(signed, self.config.worker.kafka_timeout_s)
        if stored is None and committed is not None:
            raise IndexUnusableError(
                f"shard group {self.commit.group_id!r} has committed signed offset {committed} but this shard's "
                "index never read the signed topic: another index was used for this shard. Restore the shard's "
                "index (see deploy/README.md), or start a new deployment with new topics and group")
        if stored is None:
            stored = self.signed.consumer.beginning_offsets(self.partitions)[signed]
            self.commit.set_start(stored)
        evidence = self.commit.evidence_positions()
        self.board.start(evidence)
        self._refuse_lost_offsets(signed, stored, evidence)
        start = stored
        self.signed.seek(signed, start)
        if committed is not None and committed > start:
            while self.signed.position(signed) < committed:
                for offset, batch in self._signed_batches(500, committed):
                    self.commit.commit(offset, batch, emit=False)
            self.log.info("replayed_unindexed_batch", role="shard", signed=f"{start}-{committed}")
            start = committed
            self.signed.seek(signed, start)  # the replay's last poll may have read past it
        return {signed: start}

    def _refuse_lost_offsets(self, signed, stored: Optional[int], evidence: dict) -> None:
        """Refuse to read on from offsets the internal topics no longer hold (their retention deleted them, as
        after restoring a backup older than it): the readers would jump to the earliest offset left, and the
        shard would skip signed batches or wait forever for evidence it needs."""
        wanted = {} if stored is None else {signed: stored}
        wanted.update({self.board.partitions[n]: at for n, at in evidence.items() if at is not None})
        if not wanted:
            return
        firsts = {}  # each reader asks of its own partitions: another's may be unknown to it (a KeyError then)
        if stored is not None:
            firsts.update(self.signed.consumer.beginning_offsets([signed]))
        ours = [p for p in wanted if p != signed]
        if ours:
            firsts.update(self.board.source.consumer.beginning_offsets(ours))
        lost = sorted(f"{p.topic}/{p.partition} from {wanted[p]} (it now begins at {firsts[p]})"
                      for p in wanted if firsts[p] > wanted[p])
        if lost:
            raise IndexUnusableError(
                f"shard {self.engine.place.number}'s index must read on from offsets the internal topics no longer "
                f"hold: {'; '.join(lost)}. Its index is older than the topics' retention (a backup kept too long): "
                "restore it from a newer backup, or rebuild the whole sharded index (deploy/README.md, "
                "\"Backing up and restoring a sharded index\")")

    def next_batches(self, timeout_ms: int) -> list:
        """The next signed batches: (offset, SignedBatch) each."""
        return self._signed_batches(timeout_ms)

    def _signed_batches(self, timeout_ms: int, limit: Optional[int] = None) -> list:
        records = self.signed.poll_batch(timeout_ms, limit=None if limit is None else {self.partitions[0]: limit})
        return [(r.source.offset, unpack_signed(r.value)) for r in records]

    def lag(self) -> dict:
        ends = self.signed.end_offsets(self.partitions)
        return {p: max(ends[p] - self.signed.position(p), 0) for p in self.partitions}

    def close(self) -> None:
        close_quietly(self.sink, self.publisher, self.signed, self.board, self.values)


class ShardLoop(WorkerLoop):
    """The worker's loop of sessions, with a shard's session and batches."""

    def transactional_id(self) -> str:
        return f"{super().transactional_id()}-shard-{self.engine.place.number}"

    def group_id(self) -> str:
        return f"{self.config.kafka.group_id}-shard-{self.engine.place.number}"

    def rights(self):
        shards = self.config.shards
        topics = [shards.signed_topic, values_topic(self.config), shards.evidence_topic]
        return session_rights(self.config, topics, self.group_id(), self.transactional_id())

    def _new_session(self) -> ShardSession:
        return ShardSession(self.engine, self.config, self.log, self.transactional_id(), self.group_id(),
                            self.stopper, self.watchdog.phase)

    def _batches(self, session: ShardSession, starts: dict, until_caught_up: bool) -> None:
        last_lag_check = 0.0
        watchdog = self.watchdog
        while not self.stopper.stopped:
            watchdog.phase("signed batches")
            batches = session.next_batches(self.config.worker.poll_timeout_ms)
            for offset, batch in batches:
                began = time.monotonic()
                if isinstance(batch, ForgetOrder):
                    report = session.commit.forget(offset, batch.ids)
                    self.log.info("forgotten", role="shard", signed=offset, ids=len(report.forgotten),
                                  dissolved=report.dissolved, released=report.released)
                    continue
                decisions = session.commit.commit(offset, batch)
                self._after_batch(decisions, time.monotonic() - began)
                self.engine.sweep()
            now = time.monotonic()
            if not batches or now - last_lag_check > LAG_CHECK_S:
                last_lag_check = now
                watchdog.phase("end offset of the signed topic")
                self.stats.lag = session.lag()
                self.telemetry.set_lag(self.stats.lag)
                self.telemetry.refresh_index()
                self.stats.caught_up = not batches and not any(self.stats.lag.values())
                if until_caught_up and self.stats.caught_up:
                    watchdog.phase(None)
                    self.log.info("caught_up", role="shard", documents=self.stats.summary.total)
                    return
            watchdog.phase(None)
        self.telemetry.stopping = True
        self.log.info("stopping", reason="signal")


def run_shard(config: Config, state: Optional[str], number: int, until_caught_up: bool, log: Log,
              stopper: Optional[Stopper] = None) -> WorkerStats:
    """The ``run --role shard`` command: shard ``number`` of ``shards.count`` until stopped (or caught up)."""
    stopper = stopper or Stopper()
    place = ShardPlace(number, config.shards.count)
    with ShardEngine(config, place, state) as engine:
        telemetry = WorkerTelemetry(engine.index, config.metrics.address if config.metrics.enabled else None)
        telemetry.refresh_index()
        telemetry.start()
        log.info("started", role="shard", shard=f"{number}/{place.count}", index=engine.index.path,
                 signed_topic=config.shards.signed_topic, bootstrap=config.kafka.bootstrap_servers,
                 metrics=telemetry.url() or "off")
        began = time.monotonic()
        try:
            stats = ShardLoop(engine, config, log, stopper, telemetry).run(until_caught_up)
        finally:
            telemetry.stop()
        stats.summary.seconds = time.monotonic() - began
        return stats
