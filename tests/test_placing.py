"""The sharded signer's placing without decoding: a JSON record's id key found in its bytes by the kernel
(``prepare.json_id_keys``) is the key of the id decoding gives it, and every record it cannot vouch for is decoded,
so ``placement.homes_of_records`` is ``homes_of_items`` of the decoded records, on records of every kind."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from streamdedup.core import prepare as prepare_module
from streamdedup.core.decode import InputSpec
from streamdedup.core.prepare import decode_raw, json_id_keys, raw_payload
from streamdedup.core.records import RawRecord, Source, id_key
from streamdedup.engine.vshards.placement import homes_of_items, homes_of_records

PLACING = InputSpec().placing()
LONG = "x" * 1024

# Values decoding reads to a document or a rejection with an id the scan finds in the bytes.
FOUND = [
    b'{"id": "doc-1", "text": "a page about rivers"}',
    b'{"text": "a page about rivers", "id": "doc-1"}',
    b' \t\r\n{ "id" : "doc-2" , "text" : "spaced out" }\n ',
    b'{"id": 0, "text": "an integer id"}',
    b'{"id": -17, "text": "a negative one"}',
    b'{"id": 123456789012345678, "text": "eighteen digits"}',
    b'{"id": "  ", "text": "an id of spaces"}',
    '{"id": "caf\u00e9 \u65e5\u672c \U0001f600", "text": "raw UTF-8 in the id"}'.encode(),
    ('{"id": "%s", "text": "1024 characters"}' % LONG).encode(),
    ('{"id": "%s", "text": "1024 characters, more bytes"}' % ("\u00e9" * 1024)).encode(),
    b'{"id": "doc-3"}',  # no text: missing_text, with the id
    b'{"id": "doc-4", "text": 7}',  # text_not_string, with the id
    b'{"id": "doc-5", "text": "   "}',  # empty_text, with the id
    b'{"id": "doc-6", "text": "\\ud800 a lone surrogate"}',  # orjson refuses, json reads it: invalid_text
    b'{"id": "doc-7", "text": "escapes \\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00"}',
    b'{"id": "doc-8", "meta": {"id": "inner", "list": [1, -2.5e+3, true, false, null, {}, []]}, "text": "nested"}',
    b'{"meta": {"id": "inner"}, "id": "doc-9", "text": "the top-level id counts"}',
    b'{"id": "doc-10", "n": 1e400, "m": 123456789012345678901234567890, "text": "numbers orjson may not read"}',
    b'{"id": "doc-11", "text": "' + b"plain ascii text " * 200 + b'"}',
    b'{"id": "doc-12", "text": "' + "na\u00efve caf\u00e9 ".encode() * 50 + b'"}',
    b'{"id":"doc-13","text":"x","\xc3\xa9":"a member named in UTF-8"}',
    b'{"id": "doc-14", "text": "deep", "d": ' + b"[" * 60 + b"]" * 60 + b"}",
]

# Values the scan leaves to decoding (rejected without an id, an id found another way, or ones it does not vouch for).
UNSURE = [
    b'{"id": "doc-1", "text": "x"} trailing',
    b'{"id": "doc-1", "text": "x",}',
    b"{'id': 'doc-1'}",
    b'{"id": "doc-1", "n": NaN}',
    b'{"id": "doc-1", "n": Infinity}',
    b'{"id": "doc-1", "n": -}',
    b'{"id": "doc-1", "n": 01}',
    b'{"id": "doc-1", "n": 1.}',
    b'{"id": "doc-1", "n": .5}',
    b'{"id": "doc-1", "n": 1e}',
    b'{"id": "doc-1" /* a comment */}',
    b'\xef\xbb\xbf{"id": "doc-1"}',
    b'{"id": "doc-1", "text": "unclosed}',
    b'{"id": "doc-1", "text": "a raw\ttab"}',
    b'{"id": "doc-1", "text": "a raw\nnewline"}',
    b'{"id": "doc-1", "text": "bad \\x escape"}',
    b'{"id": "doc-1", "text": "bad \\u12G4 escape"}',
    b'{"id": "doc-1", "text": "short \\u12"}',
    b'{"id": "doc-1", "text": "overlong \xc0\x80"}',
    b'{"id": "doc-1", "text": "surrogate \xed\xa0\x80"}',
    b'{"id": "doc-1", "text": "beyond \xf4\x90\x80\x80"}',
    b'{"id": "doc-1", "text": "\xf5\x80\x80\x80"}',
    b'{"id": "doc-1", "text": "truncated \xe6\x97"}',
    b'{"id": "doc-1", "text": "lone continuation \x80"}',
    b'{"id": "d\xffoc", "text": "invalid UTF-8 in the id"}',
    b'{"id": "doc-1", "text": "x"',
    b'{"id": "doc-1", "text": "x"}}',
    b'{"id": "doc-1" "text": "x"}',
    b'{"id" "doc-1"}',
    b'{"id": "doc-1", : "x"}',
    b'{"id": "doc-1", "text": tru}',
    b'{"id": "doc-1", "text": nul}',
    b'{"id": "\\u0061", "text": "an escaped id"}',
    b'{"id": "a\\"b", "text": "a quote in the id"}',
    b'{"id": "\\ud800", "text": "a lone surrogate id"}',
    b'{"id": "\\ud83d\\ude00", "text": "a pair"}',
    b'{"\\u0069d": "doc-1", "text": "an escaped member name"}',
    b'{"id": "doc-1", "id": "doc-2", "text": "the id twice"}',
    b'{"id": "", "text": "an empty id: the key"}',
    b'{"id": null, "text": "a null id: the key"}',
    b'{"text": "no id: the key"}',
    b'{"id": -0, "text": "minus zero is 0"}',
    b'{"id": 1234567890123456789, "text": "nineteen digits"}',
    b'{"id": 99999999999999999999999999, "text": "beyond 64 bits"}',
    b'{"id": 1.0, "text": "a float"}',
    b'{"id": 1e3, "text": "a float"}',
    b'{"id": true, "text": "a bool"}',
    b'{"id": ["a"], "text": "a list"}',
    b'{"id": {"a": 1}, "text": "an object"}',
    ('{"id": "%s", "text": "1025 characters"}' % (LONG + "x")).encode(),
    b'{"id": "doc-1", "text": "deep", "d": ' + b"[" * 70 + b"]" * 70 + b"}",
    b'{"id": "doc-1", "text": "deeper", "d": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'["id", "doc-1"]',
    b'"doc-1"',
    b"17",
    b"{}",
    b"",
    b"   ",
    b"null",
]


def _records(values: list, keys=None) -> list[RawRecord]:
    keys = keys if keys is not None else [f"key-{n}".encode() for n in range(len(values))]
    return [RawRecord(value, Source("raw", n % 3, 100 + n), key, (), 1_000 + n) for n, (value, key) in
            enumerate(zip(values, keys))]


def _decoded_keys(records: list[RawRecord], spec: InputSpec) -> list[bytes]:
    items = decode_raw(raw_payload(records), spec)
    return [id_key(i.id if i.id is not None else f"{i.source.name}:{i.source.partition}:{i.source.offset}")
            for i in items]


def _check(records: list[RawRecord], spec: InputSpec = PLACING) -> list:
    """The kernel's keys, each found one equal to decoding's; homes_of_records equal to homes_of_items."""
    payload = raw_payload(records)
    found = json_id_keys(payload, spec)
    expected = _decoded_keys(records, spec)
    for n, (key, wanted) in enumerate(zip(found, expected)):
        assert key is None or key == wanted, (n, records[n].value[:80])
    for count in (1, 2, 3, 8, 16):
        assert (homes_of_records(payload, spec, count).tolist()
                == homes_of_items(decode_raw(payload, spec), count).tolist())
    return found


def test_the_kernel_finds_the_id_of_plain_json_records_as_decoding_does():
    found = _check(_records(FOUND))
    assert [n for n, key in enumerate(found) if key is None] == []


def test_every_record_the_scan_cannot_vouch_for_is_decoded_and_placed_as_decoding_places_it():
    found = _check(_records(UNSURE))
    assert [n for n, key in enumerate(found) if key is not None] == []
    assert _check(_records(UNSURE, keys=[None] * len(UNSURE)))  # no key: the source's own id, or its place


def test_records_outside_the_json_rules_are_decoded():
    records = _records(FOUND[:3])
    tombstone = dataclasses.replace(records[0], value=None)
    binary_key = dataclasses.replace(records[1], key=b"\xff\xfe")
    refused = dataclasses.replace(records[2], rejected="invalid_header: header key b'\\xff' is not UTF-8")
    found = _check([tombstone, binary_key, refused, *records])
    assert found[:3] == [None, None, None] and None not in found[3:]
    _check([binary_key], dataclasses.replace(PLACING, binary_keys="ignore"))
    small = dataclasses.replace(PLACING, max_record_bytes=len(FOUND[0]))
    assert _check(_records([FOUND[0], FOUND[18]]), small) == [id_key("doc-1"), None]  # the second is too_large


@pytest.mark.parametrize("spec", [
    InputSpec(id_field="doc_id").placing(),
    InputSpec(id_field="meta.id").placing(),
    InputSpec(id_field="").placing(),
    InputSpec(html_field="html").placing(),
    InputSpec(format="text").placing(),
    InputSpec(format="msgpack").placing(),
], ids=["another-field", "dotted", "no-id-field", "html-field", "text", "msgpack"])
def test_other_input_settings_place_records_as_decoding_does(spec):
    values = [*FOUND, *UNSURE, b'{"doc_id": "d-1", "meta": {"id": "m-1"}, "html": "<p>a page</p>", "text": "t"}',
              b'{"doc_id": 5, "html": 7}']
    _check(_records(values), spec)


def test_without_the_kernel_every_record_is_decoded(monkeypatch):
    monkeypatch.setattr(prepare_module, "_kernel", None)
    assert _check(_records(FOUND)) == [None] * len(FOUND)


def test_damaged_records_are_placed_as_decoding_places_them():
    """Valid records cut, with bytes changed, inserted or taken away at random: wherever the kernel vouches for an
    id it is decoding's."""
    rng = random.Random(7)
    base = FOUND + [json.dumps({"id": f"doc-{n}", "text": "some words", "n": [n, n / 3, None]}).encode()
                    for n in range(20)]
    alphabet = b'{}[]":,\\ \t\nu0123456789abcdefeEtrnl.-+\x00\x1f\x7f\x80\xbf\xc3\xe6\xed\xf0\xf4\xff'
    damaged = []
    for _ in range(3000):
        value = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(value) + 1)
            move = rng.random()
            if move < 0.4 and at < len(value):
                value[at] = rng.choice(alphabet)
            elif move < 0.7:
                value.insert(at, rng.choice(alphabet))
            elif at < len(value):
                del value[at]
        damaged.append(bytes(value))
    found = _check(_records(damaged))
    assert 0 < sum(key is not None for key in found) < len(found)


def _consumer_record(topic: str, partition: int, offset: int, headers: list = ()):
    from kafka.consumer.fetcher import ConsumerRecord

    value = None if offset % 7 == 3 else f'{{"id": "d-{offset}", "text": "t"}}'.encode()
    key = None if offset % 5 == 2 else f"k-{offset}".encode()
    return ConsumerRecord(topic, partition, 0, offset, 1_000 + offset, 0, key, value, list(headers), None,
                          -1 if key is None else len(key), -1 if value is None else len(value), -1)


def test_a_polls_records_made_column_by_column_are_poll_batchs_raw_records():
    """``source.payload_of`` (the signer's reading) against the RawRecords ``poll_batch`` makes
    (``_raw_record``, ``canonical_order``): partitions out of order, headers (one key not UTF-8: rejected as
    read), offsets not rising (a partition read again), a record the client cannot read."""
    from kafka import TopicPartition

    from streamdedup.core.records import canonical_order
    from streamdedup.runtime.source import _raw_record, payload_of
    from streamdedup.runtime.wire import BinaryHeaderKey

    web, raw0, raw1 = TopicPartition("web", 0), TopicPartition("raw", 0), TopicPartition("raw", 1)
    polled = {
        web: [_consumer_record("web", 0, n) for n in range(4)],
        raw1: [_consumer_record("raw", 1, n, [("h", b"v")] if n == 11 else ()) for n in range(10, 16)],
        raw0: [_consumer_record("raw", 0, n, [(BinaryHeaderKey(b"\xff"), b"v")] if n == 5 else ()) for n in range(2, 9)],
    }

    def expected(polled: dict, unreadable: list = ()) -> tuple:
        records = [_raw_record(r) for records in polled.values() for r in records] + list(unreadable)
        return raw_payload(canonical_order(records))

    made = payload_of(polled)
    assert made == expected(polled)
    assert made[4][:8] == ["raw"] * 8 and made[7].count(None) == len(made[0]) - 1  # the binary key's record
    again = {**polled, raw0: polled[raw0] + [_consumer_record("raw", 0, n) for n in range(4, 7)]}
    assert payload_of(again) == expected(again)
    lost = RawRecord(None, Source("raw", 1, 16), rejected="unreadable_record: a failed checksum")
    assert payload_of(polled, [lost]) == expected(polled, [lost])
    assert payload_of({}) == raw_payload([])


def test_an_epochs_records_are_cut_by_their_bytes_a_larger_record_alone():
    from streamdedup.runtime.vshards.sign import signed_spans

    assert signed_spans([4, 4, 4, 4, 4], 8) == [(0, 2), (2, 4), (4, 5)]
    assert signed_spans([3, 20, 3, 3, 0, 0, 9], 8) == [(0, 1), (1, 2), (2, 6), (6, 7)]
    assert signed_spans([], 8) == [] and signed_spans([0, 0], 8) == [(0, 2)]
