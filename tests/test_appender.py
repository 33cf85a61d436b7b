"""The sink's RecordAppender on a real broker: the records ``KafkaProducer.send`` would write, in one transaction."""

from __future__ import annotations

import time
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


def rows_of_every_kind(n: int) -> list[tuple]:
    """(partition, key, value, headers): null keys and values, null and empty header values, non-ASCII names,
    many headers, values past a record batch's size."""
    rows = []
    for i in range(n):
        key = None if i % 5 == 0 else f"key-{i}".encode()
        value = None if i % 11 == 3 and key is not None else b"v" * (i % 9) * (i % 300)
        if i % 97 == 50:
            value = b"L" * (40 << 10)  # larger than the 16 KiB batches: a batch of its own
        headers = [(f"h\u00e9-{j}", b"" if j % 3 == 0 else bytes([j]) * j) for j in range(i % 7)]
        if i % 13 == 0:
            headers = [(f"n{j}", b"x") for j in range(130)]  # a header count past one varint byte
        rows.append((i % 3, key, value, headers))
    return rows


def test_built_batches_are_the_clients_bytes_header_and_crc_included():
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from streamdedup.runtime.sink.appender import BuiltRecords, record_batches

    if record_batches is None:
        pytest.skip("the C kernel is not built")
    rows = [(1_700_000_000_000 + (i * 7) % 13 - 6, key, value, headers + [("null", None)] * (i % 2))
            for i, (_, key, value, headers) in enumerate(rows_of_every_kind(400))]
    for batch_size in (100, 16 << 10, 1 << 20):
        theirs, builder = [], None
        for row in rows:
            if builder is None or builder.append(builder._num_records, *row) is None:
                builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size)
                theirs.append(builder)
                assert builder.append(0, *row) is not None
        built = record_batches(rows, batch_size)
        assert len(built) == len(theirs) > 0
        for number, ((buffer, count, first_ms, max_ms, _), builder) in enumerate(zip(built, theirs)):
            ours = BuiltRecords(buffer, count, first_ms, max_ms)
            state = (4242, 3, 1000 * number, number % 2 == 0)
            ours.set_producer_state(*state)
            builder.set_producer_state(*state)
            ours.close()
            assert ours.next_offset() == builder._num_records
            assert bytes(ours.buffer()) == bytes(builder.build())


@pytest.mark.parametrize("bad", [(0, "str key", b"v", []), (0, b"k", b"v", [(b"bytes name", b"v")]),
                                 (0, b"k", b"v", [("name", "str value")]), (0, b"k", b"v")])
def test_built_batches_refuse_what_the_client_refuses(bad):
    from streamdedup.runtime.sink.appender import record_batches

    if record_batches is None:
        pytest.skip("the C kernel is not built")
    with pytest.raises(TypeError):
        record_batches([bad], 1 << 20)


def fields(messages) -> list[tuple]:
    return [(m.partition, m.key, m.value, [(k, v) for k, v in m.headers], m.timestamp_type) for m in messages]


def produce_both_ways(kafka, rows_by_transaction, producer, appender_topic: str, send_topic: str) -> tuple:
    """Each transaction's rows through ``send`` to one topic and the appender to the other; (the appender,
    the earliest and latest time in ms its records could carry)."""
    appender = RecordAppender.of(producer)
    began = int(time.time() * 1000)
    for rows, commit in rows_by_transaction:
        producer.begin_transaction()
        for partition, key, value, headers in rows:
            producer.send(send_topic, key=key, value=value, headers=headers, partition=partition)
            if not appender.append(appender_topic, partition, key, value, headers):
                producer.send(appender_topic, key=key, value=value, headers=headers, partition=partition)
        appender.done()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    return appender, began, int(time.time() * 1000) + 1


def test_batches_across_transactions_are_the_records_send_writes(kafka):
    tag = uuid.uuid4().hex[:8]
    by_send, by_appender = f"send-{tag}", f"built-{tag}"
    create_topics(kafka, [by_send, by_appender], 3)
    rows = rows_of_every_kind(600)
    too_large_a_guess = (1, b"guess", b"g" * 50_000, [("n" * 5000, b"")])  # upper_bytes says no: left to send
    assert upper_bytes(*too_large_a_guess[1:]) > 64 << 10 > record_bytes(*too_large_a_guess[1:])
    transactions = [(rows[:300] + [too_large_a_guess] + rows[300:400], True), (rows[400:500], False),
                    (rows[500:], True)]
    producer = transactional(kafka, batch_size=16 << 10, max_request_size=64 << 10)
    try:
        appender, began, ended = produce_both_ways(kafka, transactions, producer, by_appender, by_send)
        assert type(appender).__name__ == "BatchAppender"
    finally:
        producer.close()
    sent, appended = read_all(kafka, by_send), read_all(kafka, by_appender)
    assert len(appended) == 600 - 100 + 1
    assert fields(appended) == fields(sent)
    assert all(began <= m.timestamp <= ended for m in appended)
    assert [m.value for m in appended if m.key == b"guess"] == [too_large_a_guess[2]]


def test_without_the_kernel_the_appender_writes_the_same_records(kafka, monkeypatch):
    from streamdedup.runtime.sink import appender as module

    tag = uuid.uuid4().hex[:8]
    built, plain = f"built-{tag}", f"plain-{tag}"
    create_topics(kafka, [built, plain], 3)
    rows = rows_of_every_kind(300)
    for topic, kernel in ((built, module.record_batches), (plain, None)):
        monkeypatch.setattr(module, "record_batches", kernel)
        producer = transactional(kafka, batch_size=16 << 10)
        try:
            appender = RecordAppender.of(producer)
            assert (type(appender) is module.BatchAppender) == (kernel is not None)
            producer.begin_transaction()
            for partition, key, value, headers in rows:
                assert appender.append(topic, partition, key, value, headers)
            appender.done()
            producer.commit_transaction()
        finally:
            producer.close()
    assert fields(read_all(kafka, built)) == fields(read_all(kafka, plain))


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_producer_without_transactions_gets_the_records_send_writes(kafka, idempotent):
    tag = uuid.uuid4().hex[:8]
    by_send, by_appender = f"send-{tag}", f"built-{tag}"
    create_topics(kafka, [by_send, by_appender], 3)
    rows = [(p, None, value, []) for p, _, value, _ in rows_of_every_kind(500) if value is not None]
    producer = KafkaProducer(bootstrap_servers=kafka, acks="all", linger_ms=0, batch_size=16 << 10,
                             enable_idempotence=idempotent)
    try:
        appender = RecordAppender.of(producer, transactional=False)
        assert appender is not None
        for start in range(0, len(rows), 150):  # several rounds, as the vshards' exchange sends them
            for partition, key, value, headers in rows[start:start + 150]:
                producer.send(by_send, key=key, value=value, headers=headers, partition=partition)
                assert appender.append(by_appender, partition, key, value, headers)
            appender.done()
            producer.flush(timeout=60)
    finally:
        producer.close()
    assert fields(read_all(kafka, by_appender)) == fields(read_all(kafka, by_send))


def test_a_compressing_producer_appends_record_by_record(kafka):
    from streamdedup.runtime.sink import appender as module

    producer = transactional(kafka, compression_type="gzip")
    try:
        assert type(RecordAppender.of(producer)) is RecordAppender
    finally:
        producer.close()
    if module.record_batches is not None:
        producer = transactional(kafka)
        try:
            assert type(RecordAppender.of(producer)) is module.BatchAppender
        finally:
            producer.close()
