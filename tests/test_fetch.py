"""Fetched records read by the kernel (runtime/fetch.py) against kafka-python's own reader, record for record."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka_helpers import create_topics

from streamdedup.runtime.fetch import _kernel_records_class, consumer_records, held_fetches
from streamdedup.runtime.source import KafkaSource
from streamdedup.runtime.wire import BinaryHeaderKey, read_binary_header_keys

pytestmark = pytest.mark.skipif(consumer_records is None, reason="the C kernel is not built")

PARTITION = TopicPartition("pages", 3)
KERNEL = _kernel_records_class(Fetcher.PartitionRecords)


def varied_batch(n: int = 300, seed: int = 5, compression: int = 0, base_offset: int = 0) -> bytes:
    """One v2 batch: null keys and values, empty values, 0-3 headers (null values among them), sizes up to 4 KB."""
    rng = random.Random(seed)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
    for i in range(n):
        headers = [(f"h{j}-é", None if j == 1 else rng.randbytes(j * 3)) for j in range(i % 4)]
        key = None if i % 5 == 0 else f"key-{i}".encode()
        value = None if i % 31 == 7 else rng.randbytes(rng.randrange(4096))
        builder.append(i, timestamp=1_700_000_000_000 + rng.randrange(10_000), key=key, value=value, headers=headers)
    raw = bytearray(builder.build())
    raw[0:8] = base_offset.to_bytes(8, "big")
    return bytes(raw)


def taken(cls, raw: bytes, fetch_offset: int = 0, step: int = 10_000) -> tuple[list, list]:
    """Every record ``cls`` gives ``step`` at a time, and its fetch position after each take."""
    parsed = cls(fetch_offset, PARTITION, MemoryRecords(raw))
    records, positions = [], []
    while parsed:
        more = parsed.take(step)
        records += more
        positions.append(parsed.next_fetch_offset)
        if not more:
            break
    return records, positions


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_the_kernel_gives_kafka_pythons_records_and_positions(step):
    raw = varied_batch() + varied_batch(seed=6, base_offset=300)
    ours, theirs = taken(KERNEL, raw, step=step), taken(Fetcher.PartitionRecords, raw, step=step)
    assert len(ours[0]) == 600
    assert ours == theirs
    assert {type(r) for r in ours[0]} == {type(r) for r in theirs[0]}


def test_a_fetch_from_the_middle_of_a_batch_and_a_compressed_batch_read_alike():
    raw = varied_batch(compression=DefaultRecordBatchBuilder.CODEC_GZIP)
    for offset in (0, 1, 150, 299):
        ours = taken(KERNEL, raw, fetch_offset=offset, step=13)
        assert ours == taken(Fetcher.PartitionRecords, raw, fetch_offset=offset, step=13)
        assert ours[0][0].offset == offset


def test_a_header_key_that_is_not_utf8_sends_the_batch_to_kafka_pythons_reader():
    read_binary_header_keys()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i, headers=[("good", b"1")])
    raw = bytearray(builder.build())
    at = raw.index(b"good", raw.index(b"v1"))
    raw[at:at + 4] = b"\xffood"
    raw = bytes(_with_crc(raw))
    ours, theirs = taken(KERNEL, raw), taken(Fetcher.PartitionRecords, raw)
    assert ours == theirs
    assert isinstance(ours[0][1].headers[0][0], BinaryHeaderKey)


def test_bytes_after_the_last_record_raise_kafka_pythons_error_after_the_same_records():
    raw = bytearray(varied_batch(n=5))
    raw += b"\x00\x00"
    raw[8:12] = (int.from_bytes(raw[8:12], "big") + 2).to_bytes(4, "big")
    raw = bytes(_with_crc(raw))
    outcomes = []
    for cls in (KERNEL, Fetcher.PartitionRecords):
        parsed = cls(0, PARTITION, MemoryRecords(raw))
        first = parsed.take(100)
        with pytest.raises(CorruptRecordError) as raised:
            parsed.take(100)
        outcomes.append((first, str(raised.value)))
    assert outcomes[0] == outcomes[1]
    assert len(outcomes[0][0]) == 5


def _with_crc(raw: bytearray) -> bytearray:
    """The batch with its CRC-32C computed again (bytes 17-20, over everything from the attributes on)."""
    from kafka.record.util import calc_crc32c

    raw[17:21] = calc_crc32c(memoryview(raw)[21:]).to_bytes(4, "big")
    return raw


@pytest.mark.kafka
def test_read_committed_on_a_broker_skips_aborted_transactions_and_markers_as_kafka_python(kafka):
    topic = f"fetch-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 1)
    producer = KafkaProducer(bootstrap_servers=kafka, transactional_id=f"fetch-{uuid.uuid4().hex[:8]}")
    producer.init_transactions()
    expected = []
    for round_ in range(6):
        producer.begin_transaction()
        values = [f"round {round_} record {i}".encode() * (i % 9 + 1) for i in range(50)]
        for i, value in enumerate(values):
            producer.send(topic, value=value, key=None if i % 4 else b"k", headers=[("n", str(i).encode())])
        producer.flush()
        if round_ % 3 == 1:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            expected += values
    producer.close()

    source = KafkaSource([topic], {"bootstrap_servers": kafka}, None, 1000)
    assert source.consumer._fetcher.PartitionRecords is KERNEL
    source.assign(source.partitions())
    plain = KafkaConsumer(bootstrap_servers=kafka, isolation_level="read_committed", auto_offset_reset="earliest",
                          enable_auto_commit=False)
    plain.assign([TopicPartition(topic, 0)])
    ours, theirs = _all_of(source.consumer), _all_of(plain)
    source.close()
    plain.close()
    assert [r.value for r in ours] == expected
    assert ours == theirs


def _all_of(consumer) -> list:
    records = []
    for _ in range(30):
        polled = consumer.poll(timeout_ms=500)
        if not polled and records:
            break
        records += [r for batch in polled.values() for r in batch]
    return records


@pytest.mark.kafka
def test_held_fetches_wait_long_only_when_they_ask_for_every_partition(kafka):
    """A fetch that leaves out a partition whose records are not all taken comes back after the short wait (a
    record that comes for that partition meanwhile is not held for the long one); a fetch of every partition
    waits long (the broker answers it as soon as any partition has a record)."""
    topic = f"held-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 2)
    producer = KafkaProducer(bootstrap_servers=kafka, acks="all")
    for _ in range(2):
        producer.send(topic, partition=0, value=b"x")
    producer.flush()
    consumer = KafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False, fetch_max_wait_ms=3000,
                             auto_offset_reset="earliest")
    assert held_fetches(consumer, 10)
    fetcher, asked = consumer._fetcher, []
    create = fetcher._create_fetch_requests

    def seen():
        requests = create()
        asked.extend((len(offsets), request.max_wait_ms) for request, offsets in requests.values())
        return requests

    fetcher._create_fetch_requests = seen
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    taken = []
    while len(taken) < 2:
        taken += _polled(consumer)
    consumer.poll(timeout_ms=0)  # every record taken: a fetch of both partitions, held at the broker
    producer.send(topic, partition=0, value=b"y")
    producer.flush()
    for _ in range(100):  # the held fetch comes back with it, not taken yet
        if fetcher._completed_fetches:
            break
        time.sleep(0.05)
    fetcher.send_fetches()  # partition 0's records wait to be taken: a fetch of partition 1 alone
    while len(taken) < 3:
        taken += _polled(consumer)
    consumer.close()
    producer.close()
    assert [r.value for r in taken] == [b"x", b"x", b"y"]
    assert {wait for n, wait in asked if n == 1} == {10}
    assert {wait for n, wait in asked if n == 2} == {3000}


def _polled(consumer, max_records: int = 500) -> list:
    return [r for batch in consumer.poll(timeout_ms=1000, max_records=max_records).values() for r in batch]
