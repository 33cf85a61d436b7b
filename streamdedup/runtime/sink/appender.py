"""Records appended straight to kafka-python's record accumulator: the one place that leans on its internals."""

from __future__ import annotations

from typing import Optional

from .messages import upper_bytes

__all__ = ["RecordAppender", "APPENDER_KAFKA_PYTHON", "transaction_error"]


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

    def __init__(self, producer, transactional: bool = True) -> None:
        self._producer = producer
        self._transactional = transactional
        self._accumulator = producer._accumulator
        self._transactions = producer._transaction_manager
        self._sender = producer._sender
        self._max_bytes = min(producer.config["max_request_size"], producer.config.get("buffer_memory") or 1 << 62)
        self._joined: dict = {}  # (topic, partition) -> TopicPartition added to the open transaction

    @classmethod
    def of(cls, producer, transactional: bool = True) -> Optional["RecordAppender"]:
        """An appender for ``producer`` (``transactional``: its records are of its transactions), or None where its
        client is not the kafka-python this was written for."""
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
        return cls(producer, transactional)

    def append(self, topic: str, partition: int, key: Optional[bytes], value: Optional[bytes],
               headers: list) -> bool:
        """Append one record to ``partition`` of ``topic``; False: not done, send it with ``KafkaProducer.send``."""
        if self._producer._closed or (key is None and value is None):
            return False
        if upper_bytes(key, value, headers) > self._max_bytes:
            return False
        tp = self._joined.get((topic, partition))
        if tp is None:
            from kafka.structs import TopicPartition

            if partition not in self._producer.partitions_for(topic):  # waits for the topic's metadata, as send
                return False
            tp = TopicPartition(topic, partition)
            if self._transactional:
                self._transactions.maybe_add_partition_to_transaction(tp)
            self._joined[(topic, partition)] = tp
        self._accumulator.append(tp, None, key, value, headers)
        return True

    def done(self) -> None:
        """The batch's records are all appended: wake the sender once, forget the partitions (the next
        transaction adds them again)."""
        self._joined.clear()
        self._sender.wakeup()


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
