"""Reading records kafka-python cannot: header keys that are not UTF-8.

Kafka's protocol says a header key is a UTF-8 string, but the broker does
not check, and clients that write bytes (librdkafka, Go, hand-built batches)
can send any bytes. kafka-python (3.0.12) decodes header keys strictly, so
such a record raises ``CorruptRecordError`` from ``poll``, again at every
start, and every later record of the same record batch is unreadable with
it (each fetch parses the batch from its start). Skipping by offset would
lose those records.

``read_binary_header_keys`` makes kafka-python's record reader fall back,
*only when its own reading of a record fails on a header key*, to reading
that record again here, with such a key as a ``BinaryHeaderKey``: a ``str``
(Latin-1, so the client can measure it) that keeps the original bytes. The
worker rejects the record as ``invalid_header`` with its key, value and
headers intact (``source.KafkaSource``). Every other record is read by
kafka-python's own code, untouched.
"""

from __future__ import annotations

__all__ = ["BinaryHeaderKey", "read_binary_header_keys"]


class BinaryHeaderKey(str):
    """A record header key that is not UTF-8: its bytes as Latin-1 text, and ``raw``, the bytes themselves."""

    raw: bytes

    def __new__(cls, raw: bytes) -> "BinaryHeaderKey":
        key = super().__new__(cls, raw.decode("latin-1"))
        key.raw = raw
        return key


def read_binary_header_keys() -> None:
    """Install the fallback in kafka-python's v2 record reader (once per process; again: nothing)."""
    from kafka.record.default_records import DefaultRecordBatch

    original = DefaultRecordBatch._read_msg
    if getattr(original, "binary_header_keys", False):
        return

    def read_msg(batch, *args, **kwargs):
        try:
            return original(batch, *args, **kwargs)
        except UnicodeDecodeError:  # a header key; the batch's position has not moved
            return _read_record(batch)

    read_msg.binary_header_keys = True
    DefaultRecordBatch._read_msg = read_msg


def _read_record(batch):
    """The record at ``batch._pos``, read as kafka-python does but with ``BinaryHeaderKey`` where UTF-8 fails.

    The v2 record layout (Kafka's DefaultRecord): length, attributes,
    timestamp delta, offset delta, key, value, headers, all varint-framed.
    """
    from kafka.errors import CorruptRecordError
    from kafka.record.default_records import ControlRecord, DefaultRecord
    from kafka.record.util import decode_varint

    buffer, pos = batch._buffer, batch._pos
    length, pos = decode_varint(buffer, pos)
    start = pos
    _, pos = decode_varint(buffer, pos)  # attributes (unused)
    timestamp_delta, pos = decode_varint(buffer, pos)
    timestamp = (batch.max_timestamp if batch.timestamp_type == batch.LOG_APPEND_TIME
                 else batch.first_timestamp + timestamp_delta)
    offset_delta, pos = decode_varint(buffer, pos)
    key, pos = _read_bytes(buffer, pos)
    value, pos = _read_bytes(buffer, pos)
    count, pos = decode_varint(buffer, pos)
    headers = []
    for _ in range(count):
        name, pos = _read_bytes(buffer, pos)
        if name is None:
            raise CorruptRecordError("a record header key is null")
        header_value, pos = _read_bytes(buffer, pos)
        headers.append((_header_key(name), header_value))
    if pos - start != length:
        raise CorruptRecordError(f"invalid record size: expected {length} bytes, read {pos - start}")
    batch._pos = pos
    kind = ControlRecord if batch.is_control_batch else DefaultRecord
    return kind(length, batch.base_offset + offset_delta, timestamp, batch.timestamp_type, key, value, headers)


def _read_bytes(buffer, pos: int):
    """A varint-framed byte string (None for length -1) and the position after it."""
    from kafka.record.util import decode_varint

    size, pos = decode_varint(buffer, pos)
    if size < 0:
        return None, pos
    return bytes(buffer[pos : pos + size]), pos + size


def _header_key(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return BinaryHeaderKey(raw)
