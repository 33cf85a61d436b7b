"""Records appended straight to kafka-python's record accumulator: the one place that leans on its internals."""

from __future__ import annotations

import struct
import time
from typing import Optional

from .messages import upper_bytes

try:
    from ...core import _kernel

    record_batches = _kernel.record_batches
except ImportError:  # built without a C compiler: records go to the accumulator one by one (the same records)
    record_batches = None

__all__ = ["RecordAppender", "BatchAppender", "BuiltRecords", "APPENDER_KAFKA_PYTHON", "transaction_error"]


APPENDER_KAFKA_PYTHON = "3.0."  # the kafka-python releases whose accumulator ``RecordAppender`` was checked against


class RecordAppender:
    """Appends records of a transaction straight to kafka-python's record accumulator, as ``send`` ends up doing.

    ``KafkaProducer.send`` spends most of its 20-35 µs a record on what a batch
    of ours does not need record by record: checking the headers' types,
    serializers (none are set), the partition's metadata, a size estimate in
    Python, adding the partition to the transaction under a lock, formatting a
    debug line, and waking the sender thread whenever a partition has a full
    record batch, which is at every record once it has two: the sender then
    takes the GIL, and the producing thread waits up to the 5 ms switch
    interval to get it back. This does once per batch and partition what must
    be done (the topic's metadata is known, the partition joins the
    transaction, which also fails at once if the producer is in error), checks
    the size with a cheap upper bound (a record that might be too large goes
    through ``send``, which raises), and wakes the sender once, at the end
    (before that it wakes by itself when ``linger_ms`` has passed; the
    transaction commits right after). The records, their order, partitions,
    timestamps and transaction are what ``send`` gives: only who does the
    bookkeeping changes.

    Built only for the kafka-python releases it was checked against
    (``APPENDER_KAFKA_PYTHON``), for a producer without serializers,
    transactional unless asked otherwise (``of``); otherwise the sink uses
    ``send`` for everything. A producer without transactions (the vshards'
    messages to each other, which are many and small) gains the most: a
    record's partition has a full batch at once there too.
    """

    def __init__(self, producer, transactional: bool = True, sent=None) -> None:
        self._producer = producer
        self._transactional = transactional
        self._sent = sent  # ``deliveries.Deliveries`` the record futures go to (None: not kept)
        self._accumulator = producer._accumulator
        self._transactions = producer._transaction_manager
        self._sender = producer._sender
        self._max_bytes = min(producer.config["max_request_size"], producer.config.get("buffer_memory") or 1 << 62)
        self._joined: dict = {}  # (topic, partition) -> TopicPartition added to the open transaction

    @classmethod
    def of(cls, producer, transactional: bool = True, sent=None) -> Optional["RecordAppender"]:
        """An appender for ``producer`` (``transactional``: its records are of its transactions), or None where its
        client is not the kafka-python this was written for. ``sent``: a ``deliveries.Deliveries`` that gets each
        record's future, for a producer without transactions whose failed sends must be seen (a transaction's
        failed send fails its commit: it needs none)."""
        import kafka

        if not kafka.__version__.startswith(APPENDER_KAFKA_PYTHON):  # the internals below may have moved
            return None
        config = producer.config
        parts = ("_accumulator", "_transaction_manager", "_sender")
        if not all(hasattr(producer, part) for part in parts) or _transactional(producer) != transactional:
            return None
        if config.get("key_serializer") is not None or config.get("value_serializer") is not None:
            return None
        if producer.max_usable_produce_magic(config["api_version"]) != 2:
            return None
        if cls is RecordAppender and record_batches is not None and config.get("compression_type") is None:
            return BatchAppender(producer, transactional, sent)
        return cls(producer, transactional, sent)

    def append(self, topic: str, partition: Optional[int], key: Optional[bytes], value: Optional[bytes],
               headers: list) -> bool:
        """Append one record to ``partition`` of ``topic``; False: not done, send it with ``KafkaProducer.send``
        (None: a partition the client picks is always left to ``send``)."""
        tp = self._partition(topic, partition, key, value, headers)
        if tp is None:
            return False
        future = self._accumulator.append(tp, None, key, value, headers)[0]
        if self._sent is not None:
            self._sent.add(future)
        return True

    def _partition(self, topic: str, partition: Optional[int], key: Optional[bytes], value: Optional[bytes],
                   headers: list):
        """The TopicPartition the record goes to, joined to the open transaction; None: leave it to ``send``."""
        if partition is None or self._producer._closed or (key is None and value is None):
            return None
        if upper_bytes(key, value, headers) > self._max_bytes:
            return None
        tp = self._joined.get((topic, partition))
        if tp is None:
            from kafka.structs import TopicPartition

            if partition not in self._producer.partitions_for(topic):  # waits for the topic's metadata, as send
                return None
            tp = TopicPartition(topic, partition)
            if self._transactional:
                self._transactions.maybe_add_partition_to_transaction(tp)
            self._joined[(topic, partition)] = tp
        return tp

    def done(self) -> None:
        """The batch's records are all appended: wake the sender once, forget the partitions (the next
        transaction adds them again)."""
        self._joined.clear()
        self._sender.wakeup()


class BatchAppender(RecordAppender):
    """A ``RecordAppender`` whose records are laid out in whole record batches in compiled code.

    kafka-python's accumulator writes each record through its pure-Python
    ``DefaultRecordBatchBuilder`` (varints byte by byte, a future and a
    metadata object a record): most of a ``RecordAppender.append``. Here a
    record is only noted (its timestamp taken as ``send`` takes it); at
    ``done`` each partition's records become record batches in one call of
    the kernel (``_kernel.record_batches``: the builder's bytes and batch
    boundaries, tested byte for byte), and each goes into the accumulator's
    queue of its partition as a ``ProducerBatch`` the sender drains like any
    other, which sets its producer id, epoch and base sequence and closes it
    (``BuiltRecords``). A record left to ``send`` first moves every noted
    record into the accumulator, so each partition keeps the order of the
    calls. Only for an uncompressed producer (``RecordAppender.of``).

    A batch has one produce future, which kafka-python completes even when
    the batch failed (the failure is in its value, and each record's future
    fails from it); its records have none. Where their outcome must be seen
    (``sent``), each record gets one, as ``send`` gives it (``_futures_of``):
    a batch the broker refuses as too large is split by the client, which
    moves each record's future to the part holding it, and the first
    batch's produce future is then never completed.
    """

    def __init__(self, producer, transactional: bool = True, sent=None) -> None:
        super().__init__(producer, transactional, sent)
        self._batch_size = producer.config["batch_size"]
        self._noted: dict = {}  # TopicPartition -> [(timestamp_ms, key, value, headers)] not yet in the accumulator

    def append(self, topic: str, partition: Optional[int], key: Optional[bytes], value: Optional[bytes],
               headers: list) -> bool:
        """Note one record for ``partition`` of ``topic``; False: not done, send it with ``KafkaProducer.send``
        (what was noted before is in the accumulator then, ahead of it)."""
        tp = self._partition(topic, partition, key, value, headers)
        if tp is None:
            self._enqueue_noted()
            return False
        noted = self._noted.get(tp)
        if noted is None:
            noted = self._noted[tp] = []
        noted.append((int(time.time() * 1000), key, value, headers))
        return True

    def done(self) -> None:
        """Every noted record into the accumulator as record batches, then as ``RecordAppender.done``."""
        self._enqueue_noted()
        super().done()

    def _enqueue_noted(self) -> None:
        noted, self._noted = self._noted, {}
        for tp, rows in noted.items():
            self._enqueue(tp, record_batches(rows, self._batch_size))

    def _enqueue(self, tp, built: list) -> None:
        """Record batches of ``tp`` put at the end of its queue in the accumulator, as its ``append`` puts a new
        one (under the partition's lock, counted as an append in progress, refused once it is closed)."""
        from kafka.errors import IllegalStateError
        from kafka.producer.producer_batch import ProducerBatch

        accumulator = self._accumulator
        accumulator._appends_in_progress.increment()
        try:
            with accumulator._tp_lock(tp):
                if accumulator._closed:
                    raise IllegalStateError("RecordAccumulator is closed")
                queue = accumulator._batches[tp]
                for buffer, count, first_ms, max_ms, largest in built:
                    batch = ProducerBatch(tp, BuiltRecords(buffer, count, first_ms, max_ms))
                    batch.max_record_size = largest
                    if self._sent is not None:
                        self._futures_of(batch, count, first_ms)
                    queue.append(batch)
                    accumulator._incomplete.add(batch)
        finally:
            accumulator._appends_in_progress.decrement()

    def _futures_of(self, batch, count: int, first_ms: int) -> None:
        """A record future for each of ``batch``'s ``count`` records, where ``send`` keeps them (the batch's, which
        a split moves to the parts) and in ``sent``."""
        from kafka.producer.future import FutureRecordMetadata

        for index in range(count):
            future = FutureRecordMetadata(batch.produce_future, index, first_ms, None, -1, -1, -1)
            batch._record_futures.append(future)
            self._sent.add(future)


class BuiltRecords:
    """A record batch built whole, where kafka-python's accumulator keeps a ``MemoryRecordsBuilder``: closed to
    further records; the producer's state is set when the sender drains it, and ``close`` then writes the
    batch's header and CRC-32C as ``DefaultRecordBatchBuilder.write_header`` does."""

    __slots__ = ("_buffer", "_count", "_first_ms", "_max_ms", "_producer_id", "_producer_epoch", "_base_sequence",
                 "_transactional", "_closed")

    def __init__(self, buffer: bytearray, count: int, first_ms: int, max_ms: int) -> None:
        self._buffer, self._count, self._first_ms, self._max_ms = buffer, count, first_ms, max_ms
        self._producer_id = self._producer_epoch = self._base_sequence = -1
        self._transactional = False
        self._closed = False

    def append(self, timestamp, key, value, headers=None) -> None:
        """No room: the accumulator starts a new batch for a record ``send`` appends after this one."""
        return None

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int,
                           is_transactional: bool) -> None:
        from kafka.errors import IllegalStateError

        if self._closed:  # as MemoryRecordsBuilder: a batch sent once keeps its sequence on a retry
            raise IllegalStateError("Trying to set producer state of an already closed batch.")
        self._producer_id, self._producer_epoch, self._base_sequence = producer_id, producer_epoch, base_sequence
        self._transactional = bool(is_transactional)

    @property
    def producer_id(self) -> int:
        return self._producer_id

    @property
    def producer_epoch(self) -> int:
        return self._producer_epoch

    @property
    def base_sequence(self) -> int:
        return self._base_sequence

    def close(self) -> None:
        if self._closed:
            return
        from kafka.record.default_records import DefaultRecordBase as Base
        from kafka.record.util import calc_crc32c

        buffer = self._buffer
        Base.HEADER_STRUCT.pack_into(
            buffer, 0, 0, len(buffer) - Base.AFTER_LEN_OFFSET, 0, 2, 0,
            Base.TRANSACTIONAL_MASK if self._transactional else 0, self._count - 1, self._first_ms, self._max_ms,
            self._producer_id, self._producer_epoch, self._base_sequence, self._count)
        _CRC.pack_into(buffer, Base.CRC_OFFSET, calc_crc32c(memoryview(buffer)[Base.ATTRIBUTES_OFFSET:]))
        self._closed = True

    def records(self):
        from kafka.record.memory_records import MemoryRecords

        return MemoryRecords(self.buffer())

    def buffer(self) -> bytearray:
        assert self._closed
        return self._buffer

    def size_in_bytes(self) -> int:
        return len(self._buffer)

    def compression_rate(self) -> float:
        return 1.0

    def is_full(self) -> bool:
        return True

    def next_offset(self) -> int:
        return self._count


_CRC = struct.Struct(">I")


def _transactional(producer) -> bool:
    manager = producer._transaction_manager
    return manager is not None and manager.is_transactional()


def transaction_error(producer) -> Optional[BaseException]:
    """The error a transactional producer's open transaction is in (``TransactionManager.last_error`` while it
    ``has_error()``), or None; None too where the client has no such state to read."""
    manager = getattr(producer, "_transaction_manager", None)
    if manager is None or not hasattr(manager, "has_error") or not manager.has_error():
        return None
    return getattr(manager, "last_error", None)
