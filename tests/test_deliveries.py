"""Sends outside a transaction checked after their flush (``sink.deliveries``, ``errors.lost_write``): kafka-python's
own future objects, completed here as its sender completes them."""

from __future__ import annotations

import pytest
from kafka import errors
from kafka.producer.future import FutureProduceResult, FutureRecordMetadata
from kafka.structs import TopicPartition

from streamdedup.errors import BrokerError, WriteLostError, kafka_trouble, lost_write
from streamdedup.runtime.sink.deliveries import first_failure, flushed, raise_if_lost


def _batch(topic: str, partition: int, records: int) -> tuple[FutureProduceResult, list]:
    """A batch's produce future and its records' futures, as ``ProducerBatch.try_append`` makes them."""
    produced = FutureProduceResult(TopicPartition(topic, partition))
    return produced, [FutureRecordMetadata(produced, n, 0, None, -1, 10, -1) for n in range(records)]


def _failed(produced: FutureProduceResult, error: Exception) -> None:
    """As the sender fails a batch: its produce future succeeds, with a function giving each record's error."""
    produced.success((-1, -1, lambda index: error))


def test_every_record_acknowledged_is_no_failure():
    produced, futures = _batch("t", 2, 3)
    produced.success((40, -1, None))
    assert first_failure(futures) is None
    assert [f.value.offset for f in futures] == [40, 41, 42]


def test_the_first_failed_record_names_its_topic_partition_and_error():
    taken, first = _batch("exchange", 0, 2)
    refused, second = _batch("exchange", 3, 2)
    taken.success((7, -1, None))
    too_large = errors.MessageSizeTooLargeError("too large")
    _failed(refused, too_large)
    assert first_failure(first + second) == ("exchange", 3, too_large)


def test_a_record_not_done_after_the_flush_counts_as_failed():
    """A batch the client split (refused as too large) never completes its own produce future: a record future
    left on it would not be done."""
    _, futures = _batch("order", 0, 1)
    topic, partition, error = first_failure(futures)
    assert (topic, partition) == ("order", 0) and isinstance(error, errors.KafkaTimeoutError)


def test_a_refusal_that_time_cannot_cure_stops_the_process_saying_what_to_do():
    produced, futures = _batch("signed-x", 0, 1)
    _failed(produced, errors.TopicAuthorizationFailedError("signed-x"))
    with pytest.raises(BrokerError, match="epoch message to signed-x partition 0 .* grant .* WRITE on topic signed-x"
                       ) as raised:
        raise_if_lost(futures, "an epoch message")
    assert not raised.value.retriable and not isinstance(raised.value, WriteLostError)
    assert "max.message.bytes of topic big to 1024" in str(
        lost_write("a message", "big", 1, errors.MessageSizeTooLargeError("x"), 1024))


def test_a_send_given_up_on_ends_the_session_retriably():
    produced, futures = _batch("evidence", 5, 2)
    _failed(produced, errors.KafkaTimeoutError("Expiring 2 record(s) for evidence-5"))
    with pytest.raises(WriteLostError, match="evidence partition 5 .*Expiring 2 record") as raised:
        raise_if_lost(futures, "a vshard's message to another")
    assert raised.value.retriable and kafka_trouble(raised.value) is raised.value


class _AbortingProducer:
    """A producer whose flush raises as kafka-python 3.0.12's does once its sender aborted every batch on an error
    it takes for fatal (a record its topic refuses as too large): ``UnknownError('Future not done')``."""

    def flush(self, timeout=None):
        raise errors.UnknownError("Future not done")


def test_a_flush_that_raises_is_explained_by_the_send_that_failed():
    """The flush's own error would end the session as a lost broker, and the next session would send the same
    record again, for ever: the failed send's error says what to do and stops the process."""
    taken, first = _batch("evidence-x", 0, 1)
    refused, second = _batch("evidence-x", 2, 1)
    taken.success((3, -1, None))
    _failed(refused, errors.MessageSizeTooLargeError("too large"))
    with pytest.raises(BrokerError, match="evidence-x partition 2 .*max.message.bytes of topic evidence-x") as raised:
        flushed(_AbortingProducer(), first + second, "a vshard's message to another", 1024)
    assert not raised.value.retriable
    _, pending = _batch("evidence-x", 1, 1)
    with pytest.raises(errors.UnknownError):  # nothing failed to explain it: the flush's own error
        flushed(_AbortingProducer(), first + pending, "a vshard's message to another")
