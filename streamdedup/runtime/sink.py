"""Where outcomes go: files (offline), or the clean, duplicates and dead-letter topics (the worker)."""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import BinaryIO, Optional

import numpy as np

from ..core.records import KEPT, Decision, FileBatch, RawRecord
from ..errors import BrokerUnavailableError, ResumeError

__all__ = ["FileOutputs", "KafkaSink", "Pending", "decision_line"]


_STRING = json.encoder.encode_basestring  # JSON string of a str, in C, as json.dumps(ensure_ascii=False) writes it
_ASCII_STRING = json.encoder.encode_basestring_ascii  # the same, as json.dumps writes it by default


def decision_line(decision: Decision) -> bytes:
    """``decision.as_json()`` as one JSON line, written directly (what json.dumps gives, twice as fast)."""
    similarity = _similarity_json(decision.similarity)
    return (f'{{"id": {_STRING(decision.id)}, "status": {_STRING(decision.status)}, '
            f'"cluster": {_json_string(decision.cluster)}, "matched": {_json_string(decision.matched)}, '
            f'"similarity": {similarity}, "reason": {_json_string(decision.reason)}, '
            f'"relation": {_json_string(decision.relation)}, '
            f'"containment": {_similarity_json(decision.containment)}}}\n').encode("utf-8")


def _similarity_json(similarity: Optional[float]) -> str:
    """The similarity rounded to 6 decimals as JSON writes a float, or null."""
    return "null" if similarity is None else repr(round(similarity, 6))


def _json_string(text, encode=_STRING) -> str:
    """A JSON string, or null for None (``encode``: ``_STRING``, or ``_ASCII_STRING`` as ``json.dumps`` writes)."""
    return "null" if text is None else encode(text)


class _Output:
    """One output file that can be cut back to a recorded size.

    ``-`` (stdout) and other files that are not regular (``/dev/null``, a named pipe) are written
    as they come and never cut: a resumed run appends to them.
    """

    def __init__(self, path: str, keep_bytes: int):
        self.path = path
        self.cuttable = path != "-" and not _is_stream(path)
        if path == "-":
            self.handle: BinaryIO = sys.stdout.buffer
            self.size = 0
            return
        if not self.cuttable:
            self.handle = open(path, "wb")
            self.size = 0
            return
        mode = "r+b" if os.path.exists(path) else "w+b"
        self.handle = open(path, mode)
        actual = os.fstat(self.handle.fileno()).st_size
        if actual < keep_bytes:
            self.handle.close()
            raise ResumeError(
                f"output {path!r} has {actual} bytes, fewer than the {keep_bytes} the interrupted run had "
                "written; it was changed outside streamdedup: run with --restart to start over"
            )
        self.size = keep_bytes
        self.rewind(keep_bytes)

    def rewind(self, size: int) -> None:
        """Forget everything after ``size`` bytes (what a batch wrote before its commit failed)."""
        if not self.cuttable:
            return
        self.handle.seek(size)
        self.handle.truncate(size)
        self.size = size

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.size += len(data)

    def sync(self, durable: bool) -> None:
        self.handle.flush()
        if durable and self.cuttable:
            os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.path != "-":
            self.handle.close()
        else:
            self.handle.flush()


def _is_stream(path: str) -> bool:
    """Whether ``path`` is an existing file that is not a regular one (a device, a pipe)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


class FileOutputs:
    """The clean file (kept input lines, byte for byte) and the decisions file (one JSON line per input line)."""

    def __init__(self, clean: Optional[str], decisions: Optional[str], sizes: Optional[dict] = None,
                 durable: bool = True):
        sizes = sizes or {}
        self.durable = durable
        self.clean = _Output(clean, sizes.get("clean", 0)) if clean else None
        self.decisions = _Output(decisions, sizes.get("decisions", 0)) if decisions else None

    def sizes(self) -> dict:
        return {
            "clean": self.clean.size if self.clean else 0,
            "decisions": self.decisions.size if self.decisions else 0,
        }

    def batch_bytes(self, lines: FileBatch, decisions: list[Decision]) -> dict:
        """What one batch appends to each output (only to those this run writes)."""
        written = {}
        if self.decisions is not None:
            written["decisions"] = b"".join(decision_line(d) for d in decisions)
        if self.clean is not None:
            written["clean"] = b"".join(value + b"\n" for value, d in zip(lines.values(), decisions)
                                        if d.status == KEPT)
        return written

    def sizes_after(self, written: dict) -> dict:
        """The outputs' sizes once ``written`` is appended."""
        return {name: size + len(written.get(name, b"")) for name, size in self.sizes().items()}

    def append(self, written: dict) -> None:
        """Append one batch's bytes (``batch_bytes``) and make them durable."""
        for name, output in (("clean", self.clean), ("decisions", self.decisions)):
            if output is not None:
                output.write(written[name])
                output.sync(self.durable)

    def close(self) -> None:
        for output in (self.clean, self.decisions):
            if output is not None:
                output.close()


HEADER_PREFIX = "streamdedup."


def _source_header(record: RawRecord) -> bytes:
    s = record.source
    return f"{s.name}/{s.partition}/{s.offset}".encode()


NULL_HEADER = HEADER_PREFIX + "null-header"
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1048588  # a topic's max.message.bytes when neither it nor the broker sets one


def sendable_headers(headers) -> list:
    """A record's own headers as kafka-python's producer takes them: a null value becomes empty, and is named.

    Kafka allows a null header value (Java clients send them), and the
    record batch builder of kafka-python could write one, but
    ``KafkaProducer.send`` accepts only (str, bytes) pairs. So the header
    keeps its name and place with an empty value, and a
    ``streamdedup.null-header`` header, one per such header, holds its name:
    a reader tells an empty value from a null one.
    """
    sendable = [(name, b"" if value is None else value) for name, value in headers]
    return sendable + [(NULL_HEADER, name.encode()) for name, value in headers if value is None]


def kept_headers(headers, cluster: str, doc_id: str, source: bytes) -> list:
    """The headers of a kept record on the clean topic: its own, then ours."""
    return sendable_headers(headers) + [
        (HEADER_PREFIX + "cluster", cluster.encode()),
        (HEADER_PREFIX + "id", doc_id.encode()),
        (HEADER_PREFIX + "source", source),
    ]


def clean_message(record: RawRecord, decision: Decision) -> dict:
    """A kept record for the clean topic: key and value untouched, our headers added to its own."""
    headers = kept_headers(record.headers, decision.cluster, decision.id, _source_header(record))
    return {"key": record.key, "value": record.value, "headers": headers}


def record_bytes(key: Optional[bytes], value: Optional[bytes], headers: list) -> int:
    """The size of a batch holding just this record, as the broker checks it against ``max.message.bytes``.

    kafka-python's own estimate (uncompressed; deltas at their largest): an
    upper bound of what the producer sends.
    """
    from kafka.record.default_records import DefaultRecordBatchBuilder

    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)


def kept_record_bytes(doc_id: str, source, value: Optional[bytes], key: Optional[bytes], headers) -> int:
    """``record_bytes`` of a document's record on the clean topic, were it kept (its own cluster)."""
    where = f"{source.name}/{source.partition}/{source.offset}".encode()
    return record_bytes(key, value, kept_headers(headers, doc_id, doc_id, where))


def duplicate_message(record: RawRecord, decision: Decision) -> dict:
    """The JSON announcement of a duplicate (``duplicate_body``)."""
    headers = [(HEADER_PREFIX + "source", _source_header(record))]
    return {"key": record.key, "value": duplicate_body(record, decision), "headers": headers}


def without_key_if_too_large(message: dict, limit: int) -> dict:
    """A duplicate's announcement without the record's key when the key makes it too large for its topic."""
    if not limit or message["key"] is None or _upper_bytes(**message) <= limit or record_bytes(**message) <= limit:
        return message
    return {**message, "key": None, "headers": message["headers"] + [(HEADER_PREFIX + "dropped", b"key")]}



def duplicate_body(record: RawRecord, decision: Decision) -> bytes:
    """What ``json.dumps`` writes for a duplicate's announcement, written directly (1.4 µs against 4.7 µs).

    ``{"id", "cluster", "matched", "similarity" (6 decimals), "exact", "relation", "containment",
    "source": {"topic", "partition", "offset"}}``
    """
    s = record.source
    similarity = _similarity_json(decision.similarity)
    return (f'{{"id": {_ASCII_STRING(decision.id)}, "cluster": {_json_string(decision.cluster, _ASCII_STRING)}, '
            f'"matched": {_json_string(decision.matched, _ASCII_STRING)}, "similarity": {similarity}, '
            f'"exact": {"true" if decision.exact else "false"}, "relation": "{decision.relation}", '
            f'"containment": {_similarity_json(decision.containment)}, "source": {{"topic": {_ASCII_STRING(s.name)}, '
            f'"partition": {int(s.partition)}, "offset": {int(s.offset)}}}}}').encode("ascii")


def dead_letter_message(record: RawRecord, decision: Decision, max_bytes: int, limit: int = 0) -> dict:
    """A rejected record with its original bytes and why it was rejected, always small enough for its topic.

    The value is cut to ``max_bytes``, and further to fit ``limit`` (the
    dead-letter topic's ``max.message.bytes``; 0: none), with its original
    length in ``streamdedup.original-bytes``. If the key and headers alone
    do not fit, they are dropped too (``streamdedup.dropped: key,headers``).
    A record with neither key nor value (a tombstone without key, an
    unreadable record) gets an empty value: kafka-python refuses to send
    a record with neither.
    """
    reason, _, detail = (decision.reason or "").partition(": ")
    ours = [
        (HEADER_PREFIX + "reason", reason.encode()),
        (HEADER_PREFIX + "detail", detail.encode()),
        (HEADER_PREFIX + "source", _source_header(record)),
    ]
    key, value = record.key, record.value
    if key is None and value is None:
        value = b""
    headers = sendable_headers(record.headers) + ours
    room = max_bytes if not limit else min(max_bytes, _value_room(key, headers, limit))
    if value is not None and len(value) > room:
        headers.append((HEADER_PREFIX + "original-bytes", str(len(value)).encode()))
        value = value[: max(room, 0)]
    if limit and record_bytes(key, value, headers) > limit:
        return {"key": None, "value": b"", "headers": ours + [(HEADER_PREFIX + "dropped", b"key,headers")]}
    return {"key": key, "value": value, "headers": headers}


def _value_room(key: Optional[bytes], headers: list, limit: int) -> int:
    """How many value bytes a record with this key and headers (and an original-bytes header) can hold."""
    counted = headers + [(HEADER_PREFIX + "original-bytes", b"9" * 20)]
    return limit - record_bytes(key, b"", counted) - 4  # the value's length grows from 1 to at most 5 bytes


class KafkaSink:
    """A transactional producer writing outcomes and input offsets in one Kafka transaction."""

    def __init__(self, client_settings: dict, transactional_id: str, topics: dict, dead_letter_max_bytes: int):
        from kafka import KafkaProducer

        self.topics = topics  # "clean", "duplicates", "dead_letter" -> topic name ('' skips)
        self.dead_letter_max_bytes = dead_letter_max_bytes
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

    def limit(self, kind: str) -> int:
        """The largest record the topic of ``kind`` ("clean", "duplicates", "dead_letter") takes (0: none)."""
        return self.limits.get(self.topics[kind], 0)

    def messages(self, records: list[RawRecord], decisions: list[Decision]) -> list[tuple[str, dict]]:
        """What a batch emits, in batch order; records already decided before emit nothing."""
        out = []
        for record, decision in zip(records, decisions):
            if decision.replayed:
                continue
            if decision.status == "kept":
                out.append((self.topics["clean"], clean_message(record, decision)))
            elif decision.status == "duplicate":
                if self.topics["duplicates"]:
                    out.append((self.topics["duplicates"], without_key_if_too_large(
                        duplicate_message(record, decision), self.limit("duplicates"))))
            else:
                out.append((self.topics["dead_letter"], dead_letter_message(
                    record, decision, self.dead_letter_max_bytes, self.limit("dead_letter"))))
        return out

    def learn_topics(self) -> None:
        """Fetch the output topics' partitions now, so the first batch does not wait for them."""
        for topic in self.topics.values():
            if topic:
                self.producer.partitions_for(topic)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, messages: list[tuple[str, dict]]) -> None:
        """Produce the messages, each to the partition Kafka's default partitioner would pick.

        The partitions of keyed messages are computed for the whole batch at
        once (``key_partitions``): the client's own per-message murmur2 in
        Python costs about a quarter of its send. Keyed messages then go
        straight to the client's record accumulator (``RecordAppender``);
        the rest through ``KafkaProducer.send``.
        """
        producer = self.producer
        if self._appender is None:
            for (topic, message), partition in zip(messages, _partitions(producer, messages)):
                producer.send(topic, partition=partition, **message)
            return
        append = self._appender.append
        try:
            for (topic, message), partition in zip(messages, _partitions(producer, messages)):
                if partition is None or not append(topic, partition, **message):
                    producer.send(topic, partition=partition, **message)
        finally:
            self._appender.done()

    def send_offsets(self, offsets: dict, group_id: str) -> Pending:
        """Add the input offsets to the open transaction; returns at once, ``wait()`` on the result.

        Two round trips to the broker that need nothing from the records, so
        they run on a helper thread while the batch is produced (the client is
        thread-safe). The transaction commits only after they succeeded.
        """
        from kafka.structs import OffsetAndMetadata

        wanted = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in offsets.items()}
        return Pending(lambda: self.producer.send_offsets_to_transaction(wanted, group_id), "streamdedup-offsets")

    def commit(self, timeout_s: float) -> None:
        """Commit the open transaction, waiting at most ``timeout_s`` for the broker to confirm.

        kafka-python's own wait has no limit, and a broker restarted at the
        wrong moment can leave it waiting forever; past the limit this raises
        ``BrokerUnavailableError``, and the session (this producer with it)
        is thrown away. Whether the commit happened is then settled by the
        next session's recovery.
        """
        Pending(self.producer.commit_transaction, "streamdedup-commit").wait(timeout_s, "the Kafka commit")

    def abort(self) -> None:
        self.producer.abort_transaction()

    def close(self, timeout_s: float = 5) -> None:
        """Close the producer, giving pending sends ``timeout_s`` (0 after a wait gave up: nothing is kept)."""
        self.producer.close(timeout=timeout_s)


def topic_limits(client_settings: dict, topics: list[str]) -> dict:
    """Each topic's ``max.message.bytes`` (the broker's default where the topic sets none), asked of the broker.

    A record larger than this is refused by the broker, at every retry: the
    worker rejects such records before deciding them (clean topic) or cuts
    them to fit (dead letters) instead. Needs DescribeConfigs on the topics.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import AuthorizationError

    admin = KafkaAdminClient(**{k: v for k, v in client_settings.items() if k in KafkaAdminClient.DEFAULT_CONFIG})
    try:
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t, ["max.message.bytes"])
                                        for t in topics], config_filter="all")
    except AuthorizationError as exc:
        from ..errors import BrokerError

        raise BrokerError(f"cannot read the output topics' max.message.bytes ({type(exc).__name__}); grant the "
                          "worker's user DescribeConfigs on them (see README: Pointing the worker at an "
                          "existing cluster)") from None
    finally:
        admin.close()
    described = found.get("topic", {})
    hidden = [t for t in topics if t in described and not described[t]]
    if hidden:
        raise _describe_configs_refused(client_settings, hidden)
    return {t: int(described.get(t, {}).get("max.message.bytes", {}).get("value", KAFKA_DEFAULT_MAX_MESSAGE_BYTES))
            for t in topics}


def create_output_topics(client_settings: dict, input_topics: list[str], output_topics: list[str],
                         replication_factor: int) -> tuple[list[str], int]:
    """Create the missing ``output_topics`` (``output.create_topics``): (the topics created, their partitions).

    They get the most partitions of any input topic; ``replication_factor`` -1
    takes the broker's ``default.replication.factor``. Nothing is created while no
    input topic exists (the start then stops on that, more clearly). Waits until
    every new partition has a leader. Needs Describe and CreateTopics: a topic
    the broker refuses is a ``BrokerError`` that says what to do; an unreachable
    broker raises kafka-python's own error (the worker waits and tries again).
    """
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError, for_code

    from ..errors import BrokerError

    admin = KafkaAdminClient(**{k: v for k, v in client_settings.items() if k in KafkaAdminClient.DEFAULT_CONFIG})
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(output_topics) if t and t not in existing]
        inputs = [t for t in input_topics if t in existing]
        if not missing or not inputs:
            return [], 0
        partitions = max(len(t.get("partitions") or ()) for t in admin.describe_topics(inputs)) or 1
        answer = admin.create_topics({t: {"num_partitions": partitions, "replication_factor": replication_factor}
                                      for t in missing}, raise_errors=False)
        failed = [(t["name"], for_code(t["error_code"]), t.get("error_message")) for t in answer["topics"]
                  if t["error_code"] and for_code(t["error_code"]) is not TopicAlreadyExistsError]
        if failed:
            reasons = "; ".join(f"{name}: {error.__name__}" + (f" ({message})" if message else "")
                                for name, error, message in failed)
            raise BrokerError(f"cannot create the output topics ({reasons}); create them yourself, grant the "
                              "worker's user CreateTopics, or check output.replication_factor against the "
                              "number of brokers")
        admin.wait_for_topics(missing, timeout_ms=30000)
        return missing, partitions
    finally:
        admin.close()


def _describe_configs_refused(client_settings: dict, topics: list[str]):
    """The broker described no setting of these topics: the user lacks DescribeConfigs on them."""
    from .rights import Right, Rights

    rights = Rights.of(client_settings, [], topics, "", None)
    return rights.refused("DescribeConfigs", [Right("DescribeConfigs", "topic", t) for t in topics],
                          hint=" (the worker reads the output topics' max.message.bytes at start)")


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


def key_partitions(keys: list[bytes], partitions: int) -> np.ndarray:
    """The partition index Kafka's default partitioner gives each key: murmur2(key) & 0x7fffffff mod count.

    The same murmur2 as the Java and kafka-python clients, for all keys at
    once: key bytes laid out in rows of little-endian 32-bit words.
    """
    if partitions == 1 or not keys:
        return np.zeros(len(keys), dtype=np.int64)
    m = np.uint32(0x5BD1E995)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    width = (int(lengths.max()) // 4 + 1) * 4  # room for every word and tail
    grid = np.zeros((len(keys), width), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    rows = np.repeat(np.arange(len(keys)), lengths)
    grid[rows, np.arange(len(rows)) - np.repeat(starts, lengths)] = np.frombuffer(b"".join(keys), dtype=np.uint8)
    words = grid.view("<u4").astype(np.uint32)
    full = lengths // 4
    h = np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)
    for i in range(words.shape[1]):
        k = words[:, i] * m
        k ^= k >> np.uint32(24)
        k *= m
        h = np.where(full > i, (h * m) ^ k, h)
    at, extra, zero = np.arange(len(keys)), lengths % 4, np.uint32(0)

    def tail_byte(offset: int) -> np.ndarray:  # byte ``offset`` after the last whole word
        return grid[at, np.minimum(full * 4 + offset, width - 1)].astype(np.uint32)

    h ^= np.where(extra >= 3, tail_byte(2) << np.uint32(16), zero)
    h ^= np.where(extra >= 2, tail_byte(1) << np.uint32(8), zero)
    h = np.where(extra >= 1, (h ^ tail_byte(0)) * m, h)
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions


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
    (``APPENDER_KAFKA_PYTHON``), for a transactional producer without
    serializers (``of``); otherwise the sink uses ``send`` for everything.
    """

    def __init__(self, producer) -> None:
        self._producer = producer
        self._accumulator = producer._accumulator
        self._transactions = producer._transaction_manager
        self._sender = producer._sender
        self._max_bytes = min(producer.config["max_request_size"], producer.config.get("buffer_memory") or 1 << 62)
        self._joined: dict = {}  # (topic, partition) -> TopicPartition added to the open transaction

    @classmethod
    def of(cls, producer) -> Optional["RecordAppender"]:
        """An appender for ``producer``, or None where its client is not the kafka-python this was written for."""
        import kafka

        if not kafka.__version__.startswith(APPENDER_KAFKA_PYTHON):  # the internals below may have moved
            return None
        config = producer.config
        parts = ("_accumulator", "_transaction_manager", "_sender")
        if not all(hasattr(producer, part) for part in parts) or not _transactional(producer):
            return None
        if config.get("key_serializer") is not None or config.get("value_serializer") is not None:
            return None
        if producer.max_usable_produce_magic(config["api_version"]) != 2:
            return None
        return cls(producer)

    def append(self, topic: str, partition: int, key: Optional[bytes], value: Optional[bytes],
               headers: list) -> bool:
        """Append one record to ``partition`` of ``topic``; False: not done, send it with ``KafkaProducer.send``."""
        if self._producer._closed or (key is None and value is None):
            return False
        if _upper_bytes(key, value, headers) > self._max_bytes:
            return False
        tp = self._joined.get((topic, partition))
        if tp is None:
            from kafka.structs import TopicPartition

            if partition not in self._producer.partitions_for(topic):  # waits for the topic's metadata, as send
                return False
            tp = TopicPartition(topic, partition)
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


def _upper_bytes(key: Optional[bytes], value: Optional[bytes], headers: list) -> int:
    """An upper bound of ``record_bytes``: the batch header, every varint at its widest, names as 4-byte UTF-8."""
    size = 61 + 5 * 6 + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    for name, header_value in headers:
        size += 10 + 4 * len(name) + len(header_value)
    return size


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

    def wait(self, timeout_s: Optional[float] = None, what: str = "the broker"):
        """The call's result (or its error), waiting at most ``timeout_s`` (None: as long as it takes).

        Past the limit: ``BrokerUnavailableError``; the call goes on on its
        daemon thread, and whoever gave up throws its client away.
        """
        self._thread.join(timeout_s)
        if self._thread.is_alive():
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
