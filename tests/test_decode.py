"""Bad input is a value with a reason, never an exception."""

from __future__ import annotations

import json

import msgpack
import pytest

from streamdedup.decode import InputSpec, decode
from streamdedup.records import Document, Rejected, Source

SRC = Source("raw", 0, 7)
SPEC = InputSpec()


@pytest.mark.parametrize(
    "value,reason",
    [
        (None, "tombstone"),
        (b"\xff\xfe not utf-8", "invalid_utf8"),
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"just a string"', "not_an_object"),
        (b'{"id": "a"}', "missing_text"),
        (b'{"id": "a", "text": null}', "missing_text"),
        (b'{"id": "a", "text": 42}', "text_not_string"),
        (b'{"id": "a", "text": ["x"]}', "text_not_string"),
        (b'{"id": "a", "text": "   "}', "empty_text"),
        (b'{"id": "a", "text": "\\ud800 lone surrogate"}', "invalid_text"),
        (b'{"id": {"x": 1}, "text": "fine"}', "bad_id"),
        (b'{"id": true, "text": "fine"}', "bad_id"),
    ],
)
def test_malformed_json_records_are_rejected_with_a_reason(value, reason):
    item = decode(value, SRC, SPEC)
    assert isinstance(item, Rejected)
    assert item.reason == reason
    assert item.source == SRC


def test_size_limits():
    big_text = json.dumps({"id": "x", "text": "word " * 300}).encode()
    assert decode(big_text, SRC, InputSpec(max_text_bytes=1000)).reason == "text_too_large"
    assert decode(big_text, SRC, InputSpec(max_record_bytes=100)).reason == "too_large"


def test_good_json_with_nested_fields_and_fallback_ids():
    spec = InputSpec(id_field="meta.url", text_field="body.text")
    doc = decode(b'{"meta": {"url": "u1"}, "body": {"text": "hello"}}', SRC, spec)
    assert doc == Document("u1", "hello", SRC)
    assert decode(b'{"text": "hi"}', SRC, SPEC, key=b"k1").id == "k1"
    assert decode(b'{"text": "hi"}', SRC, SPEC).id == "raw/0/7"
    assert decode(b'{"id": 12, "text": "hi"}', SRC, SPEC).id == "12"


def test_msgpack_and_plain_text():
    packed = msgpack.packb({"id": "m", "text": "packed text"})
    assert decode(packed, SRC, InputSpec(format="msgpack")) == Document("m", "packed text", SRC)
    assert decode(b"\xc1\xc1", SRC, InputSpec(format="msgpack")).reason == "invalid_msgpack"
    assert decode(msgpack.packb([1]), SRC, InputSpec(format="msgpack")).reason == "not_an_object"
    assert decode(msgpack.packb({"text": b"bytes"}), SRC, InputSpec(format="msgpack")).reason == "text_not_string"
    assert decode(packed, SRC, SPEC).reason in ("invalid_utf8", "invalid_json")
    assert decode("plain words".encode(), SRC, InputSpec(format="text"), key=b"k") == Document("k", "plain words", SRC)


def test_binary_keys_are_rejected_or_ignored_as_configured():
    value = b'{"text": "hello"}'
    assert decode(value, SRC, SPEC, key=b"\xff\x00").reason == "invalid_key"
    assert decode(value, SRC, InputSpec(binary_keys="ignore"), key=b"\xff\x00").id == "raw/0/7"
