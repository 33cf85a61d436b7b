"""Bad input is a value with a reason, never an exception."""

from __future__ import annotations

import json
import random

import msgpack
import pytest

from streamdedup.core import decode as decoding
from streamdedup.core.decode import InputSpec, decode
from streamdedup.core.records import Document, Rejected, Source

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
        (b"[" * 100_000, "invalid_json"),  # deeper than any decoder goes: a rejection, not a crash
        (b'{"id": "a", "text": "fine", "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid_json"),
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
    assert decode(b'{"id": 18446744073709551616, "text": "hi"}', SRC, SPEC).id == "18446744073709551616"


def test_msgpack_and_plain_text():
    packed = msgpack.packb({"id": "m", "text": "packed text"})
    assert decode(packed, SRC, InputSpec(format="msgpack")) == Document("m", "packed text", SRC)
    assert decode(b"\xc1\xc1", SRC, InputSpec(format="msgpack")).reason == "invalid_msgpack"
    deep = decode(b"\x81\xa4text" + b"\x91" * 5000 + b"\x01", SRC, InputSpec(format="msgpack"))
    assert deep.reason == "invalid_msgpack" and deep.detail  # nested too deeply: says which error
    assert decode(msgpack.packb([1]), SRC, InputSpec(format="msgpack")).reason == "not_an_object"
    assert decode(msgpack.packb({"text": b"bytes"}), SRC, InputSpec(format="msgpack")).reason == "text_not_string"
    assert decode(packed, SRC, SPEC).reason in ("invalid_utf8", "invalid_json")
    assert decode("plain words".encode(), SRC, InputSpec(format="text"), key=b"k") == Document("k", "plain words", SRC)


def test_binary_keys_are_rejected_or_ignored_as_configured():
    value = b'{"text": "hello"}'
    assert decode(value, SRC, SPEC, key=b"\xff\x00").reason == "invalid_key"
    assert decode(value, SRC, InputSpec(binary_keys="ignore"), key=b"\xff\x00").id == "raw/0/7"


def _random_json(rng: random.Random, depth: int = 0) -> str:
    """A JSON text with the awkward parts: escapes, non-ASCII, big and odd numbers, repeated keys, whitespace."""
    pick = rng.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return rng.choice(["0", "-0", "1e400", "-1E-400", "123456789012345678901234567890", "9223372036854775808",
                           "18446744073709551616", "-9223372036854775809", "NaN", "Infinity", "1.5", "-0.0"])
    if pick == 1:
        return repr(rng.uniform(-1e300, 1e300))
    if pick == 2:
        return rng.choice(["true", "false", "null"])
    if pick in (3, 4, 5):
        chars = [rng.choice(['a', ' ', 'é', '中', '😀', '\\n', '\\"', '\\\\', '\\u00e9', '\\ud83d\\ude00', '\\ud800',
                             '\\udc00x', '\\u0000', '/', '\\/']) for _ in range(rng.randrange(6))]
        return '"' + "".join(chars) + '"'
    if pick in (6, 7):
        keys = [_random_json(rng, 3) if rng.random() < 0.2 else rng.choice(['"id"', '"text"', '"a"'])
                for _ in range(rng.randrange(4))]
        keys = [k for k in keys if k.startswith('"')]
        space = rng.choice(["", " ", "\t", "\r\n"])
        return "{" + ",".join(f"{space}{k}{space}:{space}{_random_json(rng, depth + 1)}" for k in keys) + "}"
    return "[" + ",".join(_random_json(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"


class _RefusingJson:
    """Stands in for orjson: refuses everything, so decoding takes the ``json`` path alone."""

    JSONDecodeError = ValueError

    @staticmethod
    def loads(_):
        raise ValueError("refused")


def test_fast_json_decoding_gives_what_json_gives_for_every_input(monkeypatch):
    """orjson where it can, json where it refuses: every outcome (document or rejection) equals json's alone."""
    rng = random.Random(11)
    values = []
    for _ in range(4000):
        text = _random_json(rng)
        shape = rng.random()
        if shape < 0.3:
            text = '{"id": ' + _random_json(rng, 3) + ', "text": ' + text + "}"
        elif shape < 0.5:
            text = '{"id": "d", "text": "some words", "other": ' + text + "}"
        elif shape < 0.6:
            text = '{"a": {"id": ' + _random_json(rng, 3) + ', "text": ' + text + "}}"
        values.append(text.encode("utf-8", "surrogatepass") + rng.choice([b"", b"\n", b" ", b"\xff", b"}"]))
    nested = InputSpec(text_field="a.text", id_field="a.id")
    fast = [(decode(v, SRC, SPEC), decode(v, SRC, nested)) for v in values]
    monkeypatch.setattr(decoding, "orjson", _RefusingJson)
    slow = [(decode(v, SRC, SPEC), decode(v, SRC, nested)) for v in values]
    assert sum(isinstance(item, Document) for item, _ in fast) > 300  # documents too, not only rejections
    for value, fast_items, slow_items in zip(values, fast, slow):
        assert repr(fast_items) == repr(slow_items), value


@pytest.mark.parametrize("digits", [4301, 5000, 100_000])  # beyond Python's limit on integer conversion (4300)
def test_an_integer_id_too_long_for_python_is_a_bad_id_not_invalid_json(digits):
    value = b'{"id": ' + b"7" * digits + b', "text": "a few words"}'
    item = decode(value, SRC, SPEC)
    assert isinstance(item, Rejected) and item.reason == "bad_id"
    assert f"integer id of {digits} characters" in item.detail
    long_text = decode(b'{"id": "a", "text": ' + b"7" * digits + b"}", SRC, SPEC)
    assert long_text.reason == "text_not_string"


def test_an_unreadable_record_and_one_too_large_to_keep_are_rejected_with_their_reasons():
    assert decode(None, SRC, SPEC, rejected="unreadable_record: CRC").reason == "unreadable_record"
    from streamdedup.runtime.sink.messages import kept_record_bytes

    value = b'{"id": "a", "text": "' + b"x" * 2000 + b'"}'
    assert isinstance(decode(value, SRC, InputSpec(max_output_bytes=2500, kept_bytes=kept_record_bytes)), Document)
    too_large = decode(value, SRC, InputSpec(max_output_bytes=2000, kept_bytes=kept_record_bytes), key=b"k",
                       headers=(("h", None),))
    assert too_large.reason == "too_large_for_output" and too_large.id == "a"
    assert "max.message.bytes 2000" in too_large.detail


def test_the_worker_text_limit_leaves_room_for_the_rest_of_a_record_on_the_clean_topic():
    from streamdedup.core.decode import RECORD_ROOM, text_limit_for_output

    assert text_limit_for_output(1 << 20, 0) == 1 << 20  # no clean topic (offline, the API, index-only)
    assert text_limit_for_output(1 << 20, 1048588) == 1048588 - RECORD_ROOM  # Kafka's default: lowered
    assert text_limit_for_output(1 << 20, 8 << 20) == 1 << 20  # a topic with room: as configured
    assert text_limit_for_output(1000, 10) == 1  # a topic too small for anything still has a limit


def test_decoding_a_batch_gives_what_decoding_each_record_gives():
    """``decode_many``'s short path for the common JSON line makes the Document ``decode`` makes; every other
    record (rejections, keys, odd ids and texts, other formats) is left to ``decode``."""
    from streamdedup.core.decode import decode_many
    from streamdedup.runtime.sink.messages import kept_record_bytes

    rng = random.Random(12)
    values = []
    for i in range(3000):
        text = _random_json(rng)
        shape = rng.random()
        if shape < 0.3:
            text = '{"id": ' + _random_json(rng, 3) + ', "text": ' + text + "}"
        elif shape < 0.6:
            ident = rng.choice(['"d"', '""', "7", "-3", "true", "1.5", '"é"', '"' + "x" * 1100 + '"', "null"])
            words = rng.choice(['"some words"', '"  "', '"x"', '"é à"', '"' + "w " * 80 + '"', "3"])
            url = rng.choice(["", ', "url": "http://a.example/p"', ', "url": ""', ', "url": 5'])
            text = '{"id": ' + ident + ', "text": ' + words + url + "}"
        values.append(text.encode("utf-8", "surrogatepass") + rng.choice([b"", b"\n", b" ", b"\xff", b"}"]))
    values += [None, b'{"id": "a", "text": "' + b"y" * 3000 + b'"}']
    sources = [Source("raw", 0, i) for i in range(len(values))]
    keys = [rng.choice([None, None, b"k", b"", b"\xff", "é".encode()]) for _ in values]
    refused = [rng.choice([None] * 9 + ["unreadable_record: CRC"]) for _ in values]
    specs = [SPEC, InputSpec(binary_keys="ignore"), InputSpec(text_field="a.text", id_field="a.id"), InputSpec(url_field=""), InputSpec(id_field=""),
             InputSpec(max_text_bytes=50, max_record_bytes=200), InputSpec(format="text"),
             InputSpec(max_output_bytes=1200, kept_bytes=kept_record_bytes)]
    documents = 0
    for spec in specs:
        one_by_one = [decode(v, s, spec) for v, s in zip(values, sources)]
        assert repr(decode_many(values, sources, spec)) == repr(one_by_one)
        with_keys = [decode(v, s, spec, k, (), r) for v, s, k, r in zip(values, sources, keys, refused)]
        assert repr(decode_many(values, sources, spec, keys, [()] * len(values), refused)) == repr(with_keys)
        documents += sum(isinstance(item, Document) for item in one_by_one)
    assert documents > 1000
