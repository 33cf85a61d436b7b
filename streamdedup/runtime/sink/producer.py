"""The transactional producer: a batch's outcomes and input offsets in one Kafka transaction."""

from __future__ import annotations

import itertools
import time
from typing import Callable, Optional

from ...core.records import Decision, RawRecord
from ...errors import BrokerUnavailableError, TransactionFencedError
from ..fetch import metadata_paced_as_configured
from .admin import topic_limits
from .appender import RecordAppender, transaction_error
from .messages import clean_message, dead_letter_message, duplicate_message, without_key_if_too_large
from .partitioner import key_partitions

__all__ = ["KafkaSink", "Pending"]


class KafkaSink:
    """A transactional producer writing outcomes and input offsets in one Kafka transaction."""

    def __init__(self, client_settings: dict, transactional_id: str, topics: dict, dead_letter_max_bytes: int):
        from kafka import KafkaProducer

        self.topics = topics  # "clean", "duplicates", "dead_letter" -> topic name ('' skips)
        self.dead_letter_max_bytes = dead_letter_max_bytes
        metadata_paced_as_configured()
        accepted = topic_limits(client_settings, [t for t in topics.values() if t])
        self.producer = KafkaProducer(
            **{
                "transactional_id": transactional_id,
                "max_request_size": max(2 << 20, max(accepted.values(), default=0) + (64 << 10)),
                "linger_ms": 100,  # the commit at the end of each batch sends at once; no need to send earlier
                "batch_size": min(1 << 20, min(accepted.values(), default=1 << 20)),  # a batch must fit too
                **client_settings,
            }
        )
        request = self.producer.config["max_request_size"]  # the producer refuses larger records itself
        self.limits = {topic: min(limit, request) for topic, limit in accepted.items()}
        self._appender = RecordAppender.of(self.producer)
        self.producer.init_transactions()  # fences an older worker and aborts its open transaction
        self._began_under: Optional[tuple[int, int]] = None

    def limit(self, kind: str) -> int:
        """The largest record the topic of ``kind`` ("clean", "duplicates", "dead_letter") takes (0: none)."""
        return self.limits.get(self.topics[kind], 0)

    def messages(self, records: list[RawRecord], decisions: list[Decision],
                 headers: Optional[list] = None) -> list[tuple[str, dict]]:
        """What a batch emits, in batch order; records already decided before emit nothing.

        ``headers``, one list a record, are added to that record's message (if it has one), after ours."""
        extras = itertools.repeat(()) if headers is None else headers
        return [m for m in map(self._message, records, decisions, extras) if m is not None]

    def _message(self, record: RawRecord, decision: Decision, extra: list) -> Optional[tuple[str, dict]]:
        """A record's outcome message (topic, message) with the headers ``extra`` last, or None: decided before,
        or its topic is skipped."""
        if decision.replayed:
            return None
        if decision.status == "kept":
            return self.topics["clean"], clean_message(record, decision, extra)
        if decision.status == "duplicate":
            if not self.topics["duplicates"]:
                return None
            kind, message = "duplicates", without_key_if_too_large(duplicate_message(record, decision),
                                                                   self.limit("duplicates"))
        else:
            kind, message = "dead_letter", dead_letter_message(record, decision, self.dead_letter_max_bytes,
                                                               self.limit("dead_letter"))
        if extra:
            message["headers"] = message["headers"] + extra  # the message is new, made for this call
        return self.topics[kind], message

    def learn_topics(self) -> None:
        """Fetch the output topics' partitions now, so the first batch does not wait for them."""
        for topic in self.topics.values():
            if topic:
                self.producer.partitions_for(topic)

    def begin(self) -> None:
        self._began_under = self.producer_epoch()
        self.producer.begin_transaction()

    def producer_epoch(self) -> Optional[tuple[int, int]]:
        """(producer id, epoch) this producer's transactions run under now; None where the client does not say."""
        manager = getattr(self.producer, "_transaction_manager", None)
        found = getattr(manager, "producer_id_and_epoch", None)
        return None if found is None else (found.producer_id, found.epoch)

    def send(self, messages: list[tuple[str, dict]]) -> None:
        """Produce the messages, each to the partition Kafka's default partitioner would pick.

        The partitions of keyed messages are computed for the whole batch at
        once (``key_partitions``): the client's own per-message murmur2 in
        Python costs about a quarter of its send. Keyed messages then go
        straight to the client's record accumulator (``RecordAppender``, in
        record batches built in compiled code: ``BatchAppender``); the rest
        through ``KafkaProducer.send``.
        """
        producer = self.producer
        if self._appender is None:
            for (topic, message), partition in zip(messages, _partitions(producer, messages)):
                producer.send(topic, partition=partition, **message)
            return
        append = self._appender.append
        try:
            for (topic, message), partition in zip(messages, _partitions(producer, messages)):
                if not append(topic, partition, **message):
                    producer.send(topic, partition=partition, **message)
        finally:
            self._appender.done()

    def send_offsets(self, offsets: dict, group) -> Pending:
        """Add the input offsets to the open transaction for ``group`` (its name, or a consumer's
        ``group_metadata()``, whose generation the group coordinator checks: KIP-447); returns at once,
        ``wait()`` on the result.

        Two round trips to the broker that need nothing from the records, so
        they run on a helper thread while the batch is produced (the client is
        thread-safe). The transaction commits only after they succeeded.
        """
        from kafka.structs import OffsetAndMetadata

        wanted = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in offsets.items()}
        return Pending(lambda: self.producer.send_offsets_to_transaction(wanted, group), "streamdedup-offsets")

    def commit(self, timeout_s: float) -> None:
        """Commit the open transaction, waiting at most ``timeout_s`` for the broker to confirm.

        kafka-python's own wait has no limit, and a broker restarted at the
        wrong moment can leave it waiting forever; past the limit this raises
        ``BrokerUnavailableError``, and the session (this producer with it)
        is thrown away. Whether the commit happened is then settled by the
        next session's recovery.
        """
        self.committed(self.committing(), timeout_s)

    def committing(self) -> "Pending":
        """The commit of the open transaction, begun (several producers' commits then run side by side);
        ``committed`` waits for it."""
        return Pending(self.producer.commit_transaction, "streamdedup-commit")

    def committed(self, committing: "Pending", timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for the commit ``committing`` to be confirmed (``commit``)."""
        try:
            committing.wait(timeout_s, "the Kafka commit", self.transaction_error)
        except Exception as exc:
            self._check_landed(exc)
            raise
        self._check_landed()

    def _check_landed(self, failed: Optional[BaseException] = None) -> None:
        """Raise ``TransactionFencedError`` (from ``failed``, the commit's own error) if the producer's epoch
        moved during the transaction.

        The broker aborts a transaction open longer than ``transaction_timeout_ms`` (a process paused with
        SIGSTOP, say) and bumps the producer's epoch; a send of the transaction then fails with
        INVALID_PRODUCER_EPOCH, on which kafka-python bumps the epoch itself (KIP-360), dropping the
        transaction, and its ``commit_transaction`` then returns as if it had committed (or fails with an
        invalid state transition, depending on timing). Nothing of the transaction is in Kafka, so the
        caller must not commit its own state after it."""
        now = self.producer_epoch()
        if now != self._began_under or self._bumping_epoch():
            raise TransactionFencedError(
                f"the Kafka transaction was fenced: the producer went from (id, epoch) {self._began_under} to {now} "
                "while it was open, so the broker aborted it (open longer than transaction_timeout_ms: was the "
                "process paused?); starting a new session, which decides the batch again") from failed

    def _bumping_epoch(self) -> bool:
        """Whether the client is bumping the producer's epoch now (its open transaction dropped)."""
        state = getattr(getattr(self.producer, "_transaction_manager", None), "_current_state", None)
        return getattr(state, "name", None) == "BUMPING_PRODUCER_EPOCH"

    def transaction_error(self) -> Optional[BaseException]:
        """The error the open transaction failed with, if the client holds one (``appender.transaction_error``):
        a partition the broker refused to add (a missing Write right) can come back after the commit began,
        and then the client's commit never ends."""
        return transaction_error(self.producer)

    def abort(self) -> None:
        self.producer.abort_transaction()

    def close(self, timeout_s: float = 5) -> None:
        """Close the producer, giving pending sends ``timeout_s`` (0 after a wait gave up: nothing is kept)."""
        self.producer.close(timeout=timeout_s)


def _partitions(producer, messages: list[tuple[str, dict]]) -> list[Optional[int]]:
    """The partition of each message (None: unkeyed, the client picks one)."""
    keyed: dict[str, list[int]] = {}
    for row, (topic, message) in enumerate(messages):
        if message["key"] is not None:
            keyed.setdefault(topic, []).append(row)
    partitions: list[Optional[int]] = [None] * len(messages)
    for topic, rows in keyed.items():
        numbers = sorted(producer.partitions_for(topic))
        for row, index in zip(rows, key_partitions([messages[r][1]["key"] for r in rows], len(numbers)).tolist()):
            partitions[row] = numbers[index]
    return partitions


class Pending:
    """A call running on a daemon thread (a client stuck on a lost broker must not keep the process alive).

    ``wait()`` returns its result or raises its error. ``discard(close)``
    gives up on the result: ``close`` is applied to it once it is there.
    """

    def __init__(self, call, name: str = "streamdedup-kafka") -> None:
        import threading

        self._lock = threading.Lock()
        self._value = None
        self._error: Optional[BaseException] = None
        self._discard = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call) -> None:
        try:
            value = call()
        except BaseException as exc:  # handed to wait()
            self._error = exc
            return
        with self._lock:
            self._value = value
            discard = self._discard
        if discard is not None:
            discard(value)

    def wait(self, timeout_s: Optional[float] = None, what: str = "the broker",
             failed: Callable[[], Optional[BaseException]] = lambda: None):
        """The call's result (or its error), waiting at most ``timeout_s`` (None: as long as it takes).

        Past the limit: ``BrokerUnavailableError``; the call goes on on its
        daemon thread, and whoever gave up throws its client away. Meanwhile
        ``failed()`` is asked twice a second: an error it returns is raised
        at once (a call the client will never finish, as its state says).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            self._thread.join(max(left, 0.0))
            if not self._thread.is_alive():
                break
            error = failed()
            if error is not None:
                raise error
            if deadline is not None and time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"gave up waiting for {what} after {timeout_s:.0f} s "
                                             "(worker.kafka_timeout_s); starting a new session")
        if self._error is not None:
            raise self._error
        return self._value

    def discard(self, close) -> None:
        with self._lock:
            self._discard = close
            value = self._value
        if value is not None:
            close(value)
