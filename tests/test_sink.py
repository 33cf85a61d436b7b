"""Pure parts of the sink: the partition of each keyed outcome, and lines and messages written directly."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from kafka.errors import KafkaError
from kafka.partitioner.default import murmur2

from streamdedup.runtime.sink.messages import record_bytes, without_key_if_too_large
from streamdedup.runtime.sink.partitioner import key_partitions


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 64])
def test_key_partitions_match_the_default_partitioner(partitions):
    rng = random.Random(partitions)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 41))) for _ in range(3000)]
    keys += [b"", b"a", b"ab", b"abc", b"abcd", "\u00e9\u6f22-doc".encode(), b"\x00" * 9]
    expected = [(murmur2(k) & 0x7FFFFFFF) % partitions for k in keys]
    assert key_partitions(keys, partitions).tolist() == expected


def test_key_partitions_of_no_keys():
    assert key_partitions([], 5).tolist() == []


def test_decision_lines_are_what_json_dumps_writes():
    import json

    from streamdedup.core.records import Decision
    from streamdedup.runtime.sink import decision_line

    cases = [
        Decision("plain", "kept", cluster="plain"),
        Decision("k\u00e9 \"q\"\u2028\x00", "kept", cluster="k\u00e9 \"q\"\u2028\x00", replayed=True),
        Decision("kept-in", "kept", cluster="another"),
        Decision("d\u00e9j\u00e0 \u6771\u4eac \U0001f600", "duplicate", cluster="a\"b\\c\n", matched="x\ty", similarity=0.7123456789),
        Decision("r", "rejected", reason="invalid_json: Expecting value: line 1 column 1 (char 0)"),
        Decision("one", "duplicate", cluster="c", matched="c", similarity=1.0, exact=True),
        Decision("\x00\x1f\u2028", "duplicate", cluster="z", matched="z", similarity=0.70000049),
        Decision("part", "duplicate", cluster="w", matched="w", similarity=0.1234567, containment=0.8765432),
    ]
    for decision in cases:
        expected = json.dumps(decision.as_json(), ensure_ascii=False) + "\n"
        assert decision_line(decision) == expected.encode("utf-8")
        assert json.loads(decision_line(decision)) == decision.as_json()


def test_duplicate_announcements_are_what_json_dumps_writes():
    import json

    from streamdedup.core.records import Decision, RawRecord, Source
    from streamdedup.runtime.sink.messages import duplicate_body

    cases = [
        (Decision("plain", "duplicate", cluster="c1", matched="c1", similarity=0.7123456789), Source("crawl", 0, 5)),
        (Decision("d\u00e9j\u00e0 \u6771\u4eac \U0001f600", "duplicate", cluster="a\"b\\c\n", matched="x\ty",
                  similarity=1.0, exact=True), Source("t\u00f6pic", 12, 2**40)),
        (Decision("\x00\x1f\u2028", "duplicate", cluster="z", matched=None, similarity=None), Source("t", 3, 0)),
        (Decision("part", "duplicate", cluster="w", matched="w", similarity=0.1234567, containment=0.8765432),
         Source("t", 0, 1)),
    ]
    for decision, source in cases:
        expected = {
            "id": decision.id, "cluster": decision.cluster, "matched": decision.matched,
            "similarity": None if decision.similarity is None else round(decision.similarity, 6),
            "exact": decision.exact, "relation": decision.relation,
            "containment": None if decision.containment is None else round(decision.containment, 6),
            "source": {"topic": source.name, "partition": source.partition, "offset": source.offset},
        }
        body = duplicate_body(RawRecord(b"{}", source), decision)
        assert body == json.dumps(expected).encode()
        assert json.loads(body) == expected


def _record(key, value, headers=()):
    from streamdedup.core.records import RawRecord, Source

    return RawRecord(value, Source("raw", 0, 3), key, tuple(headers))


def test_null_header_values_go_out_empty_and_named():
    from streamdedup.runtime.sink.messages import sendable_headers

    assert sendable_headers((("a", None), ("b", b"1"), ("c", None))) == [
        ("a", b""), ("b", b"1"), ("c", b""), ("streamdedup.null-header", b"a"), ("streamdedup.null-header", b"c")]
    assert sendable_headers(()) == []


@pytest.mark.parametrize("limit", [3000, 20_000, 100_000])
def test_a_dead_letter_fits_its_topic_whatever_its_key_and_value(limit):
    from streamdedup.core.records import Decision
    from streamdedup.runtime.sink.messages import dead_letter_message, record_bytes

    decision = Decision("x", "rejected", reason="invalid_json: bad")
    for key, value in [(b"k", b"v" * 50_000), (b"k" * 10_000, b"v" * 50_000), (b"k" * 200_000, b"v"), (None, None)]:
        message = dead_letter_message(_record(key, value, [("h", None)]), decision, 1_000_000, limit)
        assert record_bytes(**message) <= limit
        assert dict(message["headers"])["streamdedup.reason"] == b"invalid_json"
        if message["key"] is None and key is not None:
            assert dict(message["headers"])["streamdedup.dropped"] == b"key,headers"
        elif value is not None and len(message["value"]) < len(value):
            assert value.startswith(message["value"]) and limit - 100 < record_bytes(**message)
            assert dict(message["headers"])["streamdedup.original-bytes"] == str(len(value)).encode()
        assert message["value"] is not None  # kafka-python sends no record without key and value


@pytest.mark.parametrize("key_bytes", [1, 100, 900, 1000, 5000])
def test_a_duplicates_key_is_dropped_exactly_when_the_announcement_would_not_fit(key_bytes):
    limit = 1200
    message = {"key": b"k" * key_bytes, "value": b"v" * 300, "headers": [("streamdedup.source", b"raw/0/1")]}
    kept = without_key_if_too_large(message, limit)
    if record_bytes(**message) <= limit:
        assert kept is message
    else:
        assert kept["key"] is None and ("streamdedup.dropped", b"key") in kept["headers"]
        assert record_bytes(**kept) <= limit


def test_offsets_after_a_batch_are_the_next_offset_of_each_partition():
    from kafka import TopicPartition

    from streamdedup.core.records import RawRecord, Source
    from streamdedup.runtime.checkpoint import _offsets_after

    records = [RawRecord(b"{}", Source(topic, partition, offset))
               for topic, partition, offset in [("a", 0, 5), ("a", 1, 9), ("a", 0, 7), ("b", 0, 2), ("a", 0, 6)]]
    assert _offsets_after(records) == {TopicPartition("a", 0): 8, TopicPartition("a", 1): 10,
                                       TopicPartition("b", 0): 3}


class _EpochBumpingProducer:
    """A transactional producer as kafka-python behaves when the broker aborted its open transaction: the client
    bumps the producer's epoch (KIP-360), dropping the transaction, and the commit then returns as if it had
    committed (``bumped``) or fails on an invalid state transition while the bump is under way (``bumping``)."""

    def __init__(self, how: str):
        self.how = how
        self._transaction_manager = SimpleNamespace(producer_id_and_epoch=SimpleNamespace(producer_id=8, epoch=2),
                                                    has_error=lambda: False, _current_state=None)

    def begin_transaction(self) -> None:
        pass

    def commit_transaction(self) -> None:
        manager = self._transaction_manager
        if self.how == "bumped":
            manager.producer_id_and_epoch = SimpleNamespace(producer_id=8, epoch=3)
        elif self.how == "bumping":
            manager._current_state = SimpleNamespace(name="BUMPING_PRODUCER_EPOCH")
            raise KafkaError("Invalid transition attempted from state BUMPING_PRODUCER_EPOCH to state "
                             "COMMITTING_TRANSACTION")


@pytest.mark.parametrize("how", ["committed", "bumped", "bumping"])
def test_a_commit_under_another_producer_epoch_than_its_begin_is_not_taken_for_landed(how):
    from streamdedup.errors import TransactionFencedError
    from streamdedup.runtime.sink.producer import KafkaSink

    sink = object.__new__(KafkaSink)  # the producer alone: no broker
    sink.producer = _EpochBumpingProducer(how)
    sink.begin()
    if how == "committed":
        sink.commit(5)
    else:
        with pytest.raises(TransactionFencedError, match="transaction_timeout_ms"):
            sink.commit(5)


@pytest.mark.parametrize("duplicates_topic", ["dups", ""])
def test_headers_given_a_record_stay_on_that_records_message_when_others_emit_nothing(duplicates_topic):
    """A vshard's outcomes each carry their place in the order; records that emit nothing (decided before, or
    duplicates with no duplicates topic) must not shift the places of the ones after them."""
    from streamdedup.core.records import Decision, RawRecord, Source
    from streamdedup.runtime.sink import KafkaSink

    sink = object.__new__(KafkaSink)
    sink.topics = {"clean": "clean", "duplicates": duplicates_topic, "dead_letter": "dead"}
    sink.dead_letter_max_bytes, sink.limits = 1000, {"clean": 1 << 20, "dups": 1 << 20, "dead": 1 << 20}
    decisions = [Decision("a", "kept", cluster="a"), Decision("b", "duplicate", cluster="a", matched="a",
                                                              similarity=0.9),
                 Decision("c", "kept", cluster="c", replayed=True), Decision("d", "rejected", reason="bad: x"),
                 Decision("e", "kept", cluster="e")]
    records = [RawRecord(d.id.encode(), Source("in", 0, n), key=d.id.encode()) for n, d in enumerate(decisions)]
    places = [[("place", str(n).encode())] for n in range(len(records))]
    sent = sink.messages(records, decisions, places)
    emitting = {0, 3, 4} | ({1} if duplicates_topic else set())
    assert [dict(m["headers"])["place"] for _, m in sent] == [str(n).encode() for n in sorted(emitting)]
    assert [topic for topic, _ in sent] == [t for n, t in enumerate(["clean", "dups", None, "dead", "clean"])
                                            if n in emitting]
    assert sink.messages(records, decisions) == [(t, {**m, "headers": m["headers"][:-1]}) for t, m in sent]


def test_a_kept_records_size_counted_directly_is_the_producers_estimate_of_it():
    from streamdedup.core.records import Source
    from streamdedup.runtime.sink.messages import kept_headers, kept_record_bytes, record_bytes

    rng = random.Random(7)
    text = "ab\u00e9\u6771\U0001f600"
    for _ in range(2000):
        key = None if rng.random() < .2 else rng.randbytes(rng.choice([0, 5, 63, 64, 20000]))
        value = None if rng.random() < .05 else rng.randbytes(rng.choice([0, 1, 63, 64, 8191, 8192, 2**21]))
        headers = tuple(("".join(rng.choices(text, k=rng.randrange(70))),
                         None if rng.random() < .3 else rng.randbytes(rng.choice([0, 64, 300])))
                        for _ in range(rng.choice([0, 0, 1, 3, 130])))
        doc_id = "".join(rng.choices(text, k=rng.choice([1, 40, 70, 9000])))
        source = Source("".join(rng.choices(text, k=rng.randrange(1, 50))), rng.randrange(1000), rng.randrange(2**40))
        where = f"{source.name}/{source.partition}/{source.offset}".encode()
        assert kept_record_bytes(doc_id, source, value, key, headers) == record_bytes(
            key, value, kept_headers(headers, doc_id, doc_id, where))


class _RecordingSink:
    """The outcome messages of a real ``KafkaSink`` (no producer), the transaction's steps recorded."""

    def __init__(self, duplicates_limit: int) -> None:
        from streamdedup.runtime.sink import KafkaSink

        self.sink = object.__new__(KafkaSink)
        self.sink.topics = {"clean": "clean", "duplicates": "dups", "dead_letter": "dead"}
        self.sink.dead_letter_max_bytes, self.sink.limits = 1000, {"clean": 1 << 20, "dups": duplicates_limit,
                                                                   "dead": 1 << 20}
        self.steps: list = []
        self.messages = self.sink.messages
        self.transaction_error = lambda: None

    def begin(self) -> None:
        self.steps.append("begin")

    def send_offsets(self, offsets: dict, group):
        self.steps.append(("offsets", {tp.partition: offset for tp, offset in offsets.items()}, group))
        return SimpleNamespace(wait=lambda *args: None)

    def send(self, messages: list) -> None:
        self.steps.append(("send", messages))

    def commit(self, timeout_s: float) -> None:
        self.steps.append("commit")


def test_the_vshards_outcomes_of_epochs_committed_together_are_these_bytes_in_one_send():
    """Each outcome of a vshard's epoch: its own headers, ours, then its place in the order (``streamdedup.order``:
    the epoch's order offset / the record's serial), byte for byte; the epochs' outcomes in epoch order, sent
    once in one transaction."""
    from streamdedup.core.records import Decision, RawRecord, Source
    from streamdedup.runtime.checkpoint import VShardCommit, VShardEpoch

    kept = RawRecord(b"page", Source("raw", 2, 41), key=b"k1", headers=(("h", b"v"), ("n", None)))
    dup = RawRecord(b"copy", Source("raw", 2, 42), key=b"k" * 300)
    bad = RawRecord(b"\xff", Source("raw", 3, 7), key=None)
    again = RawRecord(b"page", Source("raw", 2, 43), key=b"k1")
    alone = RawRecord(b"other", Source("raw", 0, 9), key=b"k9")
    epochs = [
        VShardEpoch(SimpleNamespace(number=5), 120, [kept, dup, again, bad], [7, 8, 9, 10],
                    [Decision("a", "kept", cluster="a"),
                     Decision("b", "duplicate", cluster="a", matched="a", similarity=0.5),
                     Decision("a", "kept", cluster="a", replayed=True), Decision("c", "rejected", reason="bad: x")],
                    {}, True),
        VShardEpoch(SimpleNamespace(number=1), 121, [alone], [11], [Decision("d", "kept", cluster="d")], {}, True),
    ]
    recording = _RecordingSink(duplicates_limit=300)
    VShardCommit(publisher=None, exchange_topic="exchange", kafka_timeout_s=5)._sent_and_committed(
        epochs, recording, "group")
    assert recording.steps[0] == "begin" and recording.steps[-1] == "commit"
    assert recording.steps[1] == ("offsets", {5: 121, 1: 122}, "group")
    sends = [step[1] for step in recording.steps if step[0] == "send"]
    assert sends == [[
        ("clean", {"key": b"k1", "value": b"page", "headers": [
            ("h", b"v"), ("n", b""), ("streamdedup.null-header", b"n"), ("streamdedup.cluster", b"a"),
            ("streamdedup.id", b"a"), ("streamdedup.source", b"raw/2/41"), ("streamdedup.order", b"120/7")]}),
        ("dups", {"key": None, "value": (b'{"id": "b", "cluster": "a", "matched": "a", "similarity": 0.5, '
                                         b'"exact": false, "relation": "near", "containment": null, '
                                         b'"source": {"topic": "raw", "partition": 2, "offset": 42}}'),
                  "headers": [("streamdedup.source", b"raw/2/42"), ("streamdedup.dropped", b"key"),
                              ("streamdedup.order", b"120/8")]}),
        ("dead", {"key": None, "value": b"\xff", "headers": [
            ("streamdedup.reason", b"bad"), ("streamdedup.detail", b"x"), ("streamdedup.source", b"raw/3/7"),
            ("streamdedup.order", b"120/10")]}),
        ("clean", {"key": b"k9", "value": b"other", "headers": [
            ("streamdedup.cluster", b"d"), ("streamdedup.id", b"d"), ("streamdedup.source", b"raw/0/9"),
            ("streamdedup.order", b"121/11")]}),
    ]]
