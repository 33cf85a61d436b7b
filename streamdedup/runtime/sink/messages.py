"""What the worker sends where: the clean, duplicates and dead-letter messages of a record, their headers and sizes."""

from __future__ import annotations

import json
from typing import Optional

from ...core.records import Decision, RawRecord

__all__ = ["HEADER_PREFIX", "NULL_HEADER", "sendable_headers", "kept_headers", "clean_message", "record_bytes",
           "kept_record_bytes", "duplicate_message", "without_key_if_too_large", "duplicate_body",
           "dead_letter_message", "upper_bytes", "STRING", "json_string", "similarity_json"]


STRING = json.encoder.encode_basestring  # JSON string of a str, in C, as json.dumps(ensure_ascii=False) writes it
ASCII_STRING = json.encoder.encode_basestring_ascii  # the same, as json.dumps writes it by default


def similarity_json(similarity: Optional[float]) -> str:
    """The similarity rounded to 6 decimals as JSON writes a float, or null."""
    return "null" if similarity is None else repr(round(similarity, 6))


def json_string(text, encode=STRING) -> str:
    """A JSON string, or null for None (``encode``: ``STRING``, or ``ASCII_STRING`` as ``json.dumps`` writes)."""
    return "null" if text is None else encode(text)


HEADER_PREFIX = "streamdedup."


def _source_header(record: RawRecord) -> bytes:
    s = record.source
    return f"{s.name}/{s.partition}/{s.offset}".encode()


NULL_HEADER = HEADER_PREFIX + "null-header"


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


_CLUSTER_HEADER = HEADER_PREFIX + "cluster"
_ID_HEADER = HEADER_PREFIX + "id"
_SOURCE_HEADER = HEADER_PREFIX + "source"


def kept_headers(headers, cluster: str, doc_id: str, source: bytes) -> list:
    """The headers of a kept record on the clean topic: its own, then ours."""
    return (sendable_headers(headers) if headers else []) + [
        (_CLUSTER_HEADER, cluster.encode()),
        (_ID_HEADER, doc_id.encode()),
        (_SOURCE_HEADER, source),
    ]


def clean_message(record: RawRecord, decision: Decision, extra: list = ()) -> dict:
    """A kept record for the clean topic: key and value untouched, our headers (then ``extra``) added to its own."""
    headers = kept_headers(record.headers, decision.cluster, decision.id, _source_header(record))
    headers.extend(extra)
    return {"key": record.key, "value": record.value, "headers": headers}


def record_bytes(key: Optional[bytes], value: Optional[bytes], headers: list) -> int:
    """The size of a batch holding just this record, as the broker checks it against ``max.message.bytes``.

    kafka-python's own estimate (uncompressed; deltas at their largest): an
    upper bound of what the producer sends.
    """
    from kafka.record.default_records import DefaultRecordBatchBuilder

    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)


def kept_record_bytes(doc_id: str, source, value: Optional[bytes], key: Optional[bytes], headers) -> int:
    """``record_bytes`` of a document's record on the clean topic, were it kept (its own cluster), counted
    directly: every record read is measured, and building its headers to measure them cost a signing process
    a tenth of its time."""
    ident = len(doc_id.encode())
    where = len(f"{source.name}/{source.partition}/{source.offset}".encode())
    size = _RECORD_BOUND + _field_bytes(key) + _field_bytes(value) + _KEPT_NAMES + 2 * _field_bytes_of(ident)
    size += _field_bytes_of(where)
    count = len(headers) + 3
    for name, header_value in headers:
        encoded = len(name.encode())
        size += _varint_bytes(encoded) + encoded + _field_bytes(header_value or b"")
        if header_value is None:  # named again in a null-header header (``sendable_headers``)
            count += 1
            size += _NULL_NAME + _field_bytes_of(encoded)
    return size + _varint_bytes(count)


def _varint_bytes(n: int) -> int:
    """Bytes of the zigzag varint kafka-python writes for ``n`` (``size_of_varint``), for 0 <= n < 2**62."""
    zigzag, size = n << 1, 1
    while zigzag > 0x7F:
        zigzag >>= 7
        size += 1
    return size


def _field_bytes_of(length: int) -> int:
    return _varint_bytes(length) + length


def _field_bytes(data: Optional[bytes]) -> int:
    return 1 if data is None else _field_bytes_of(len(data))


def _name_bytes(name: str) -> int:
    return _field_bytes_of(len(name.encode()))


_RECORD_BOUND = 61 + 21  # a batch's header and a record's fixed fields at their widest (kafka-python's estimate)
_KEPT_NAMES = sum(_name_bytes(HEADER_PREFIX + n) for n in ("cluster", "id", "source"))
_NULL_NAME = _name_bytes(NULL_HEADER)


def duplicate_message(record: RawRecord, decision: Decision) -> dict:
    """The JSON announcement of a duplicate (``duplicate_body``)."""
    headers = [(_SOURCE_HEADER, _source_header(record))]
    return {"key": record.key, "value": duplicate_body(record, decision), "headers": headers}


def without_key_if_too_large(message: dict, limit: int) -> dict:
    """A duplicate's announcement without the record's key when the key makes it too large for its topic."""
    if not limit or message["key"] is None or upper_bytes(**message) <= limit or record_bytes(**message) <= limit:
        return message
    return {**message, "key": None, "headers": message["headers"] + [(HEADER_PREFIX + "dropped", b"key")]}



def duplicate_body(record: RawRecord, decision: Decision) -> bytes:
    """What ``json.dumps`` writes for a duplicate's announcement, written directly (1.4 µs against 4.7 µs).

    ``{"id", "cluster", "matched", "similarity" (6 decimals), "exact", "relation", "containment",
    "source": {"topic", "partition", "offset"}}``
    """
    s = record.source
    similarity = similarity_json(decision.similarity)
    return (f'{{"id": {ASCII_STRING(decision.id)}, "cluster": {json_string(decision.cluster, ASCII_STRING)}, '
            f'"matched": {json_string(decision.matched, ASCII_STRING)}, "similarity": {similarity}, '
            f'"exact": {"true" if decision.exact else "false"}, "relation": "{decision.relation}", '
            f'"containment": {similarity_json(decision.containment)}, "source": {{"topic": {ASCII_STRING(s.name)}, '
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


def upper_bytes(key: Optional[bytes], value: Optional[bytes], headers: list) -> int:
    """An upper bound of ``record_bytes``: the batch header, every varint at its widest, names as 4-byte UTF-8."""
    size = 61 + 5 * 6 + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    for name, header_value in headers:
        size += 10 + 4 * len(name) + len(header_value)
    return size
