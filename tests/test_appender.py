"""The sink's RecordAppender on a real broker: the records ``KafkaProducer.send`` would write, in one transaction."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaProducer
from kafka.errors import MessageSizeTooLargeError
from kafka.serializer import Serializer
from kafka_helpers import create_topics, read_all

from streamdedup.runtime.sink.appender import RecordAppender
from streamdedup.runtime.sink.messages import record_bytes, upper_bytes


def transactional(bootstrap: str, **settings) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"appender-{uuid.uuid4().hex[:8]}",
                             linger_ms=100, **settings)
    producer.init_transactions()
    return producer


def batch(n: int) -> list[tuple]:
    """(partition, key, value, headers) rows: every partition, one header-less record, varied sizes."""
    rows = []
    for i in range(n):
        headers = [] if i == 7 else [("streamdedup.id", f"doc-{i}".encode()), ("origin", b"x" * (i % 50))]
        rows.append((i % 3, f"key-{i}".encode(), ("text " * (i % 400)).encode() or None, headers))
    return rows


def as_read(messages) -> list[tuple]:
    return [(m.partition, m.key, m.value, [(k, v) for k, v in m.headers]) for m in messages]


def test_appended_records_are_those_send_writes_in_one_transaction(kafka):
    tag = uuid.uuid4().hex[:8]
    by_send, by_appender = f"send-{tag}", f"append-{tag}"
    create_topics(kafka, [by_send, by_appender], 3)
    rows = batch(700)
    producer = transactional(kafka, batch_size=16 << 10)  # small record batches: several fill up in a transaction
    try:
        appender = RecordAppender.of(producer)
        assert appender is not None
        producer.begin_transaction()
        for partition, key, value, headers in rows:
            producer.send(by_send, key=key, value=value, headers=headers, partition=partition)
            assert appender.append(by_appender, partition, key, value, headers)
        appender.done()
        producer.commit_transaction()
    finally:
        producer.close()
    sent, appended = as_read(read_all(kafka, by_send)), as_read(read_all(kafka, by_appender))
    assert len(appended) == len(rows)
    assert appended == sent
    in_order = sorted(rows, key=lambda row: row[0])  # per partition, in the order appended
    assert appended == [(p, k, v, h) for p, k, v, h in in_order]


def test_an_aborted_transaction_hides_appended_records_and_the_next_one_takes_its_partitions_again(kafka):
    topic = f"abort-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 3)
    producer = transactional(kafka)
    try:
        appender = RecordAppender.of(producer)
        producer.begin_transaction()
        for partition in range(3):
            assert appender.append(topic, partition, b"gone", b"aborted", [])
        appender.done()
        producer.abort_transaction()
        producer.begin_transaction()
        for partition in range(3):
            assert appender.append(topic, partition, b"kept", b"committed", [])
        appender.done()
        producer.commit_transaction()
    finally:
        producer.close()
    assert [(m.partition, m.key) for m in read_all(kafka, topic)] == [(0, b"kept"), (1, b"kept"), (2, b"kept")]


def test_a_record_that_may_be_too_large_is_left_to_send(kafka):
    topic = f"large-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 1)
    producer = transactional(kafka, max_request_size=4096)
    try:
        appender = RecordAppender.of(producer)
        producer.begin_transaction()
        assert not appender.append(topic, 0, b"k", b"v" * 5000, [])
        assert not appender.append(topic, 0, None, None, [])
        with pytest.raises(MessageSizeTooLargeError):  # what the sink's fallback to send then raises
            producer.send(topic, key=b"k", value=b"v" * 5000, partition=0)
        producer.abort_transaction()
    finally:
        producer.close()


class Unchanged(Serializer):
    def serialize(self, topic, value):
        return value


def test_no_appender_for_a_producer_with_serializers_or_without_transactions(kafka):
    plain = KafkaProducer(bootstrap_servers=kafka)
    serializing = KafkaProducer(bootstrap_servers=kafka, transactional_id=f"ser-{uuid.uuid4().hex[:8]}",
                                value_serializer=Unchanged())
    try:
        assert RecordAppender.of(plain) is None
        assert RecordAppender.of(serializing) is None
    finally:
        plain.close()
        serializing.close()


@pytest.mark.parametrize("key,value,headers", [
    (b"k", b"v", []), (None, b"x" * 3000, [("a", b"")]), (b"k" * 200, None, [("\u00e9" * 40, b"y" * 100)] * 5),
])
def test_the_cheap_size_bound_is_never_below_the_clients_estimate(key, value, headers):
    assert upper_bytes(key, value, headers) >= record_bytes(key, value, headers)


def test_no_appender_for_a_kafka_python_release_it_was_not_checked_against(kafka, monkeypatch):
    import kafka as client

    producer = transactional(kafka)
    try:
        assert RecordAppender.of(producer) is not None
        monkeypatch.setattr(client, "__version__", "3.1.0")
        assert RecordAppender.of(producer) is None
    finally:
        producer.close()
