"""What the roles of a sharded deployment send each other: home messages (records whole, with how to decode them),
epochs and forget orders in the order topic, and where each record lives."""

from __future__ import annotations

import dataclasses
import json

import msgpack
import numpy as np
import pytest

from streamdedup import config as config_module
from streamdedup.core.decode import InputSpec
from streamdedup.core.prepare import decode_raw, joined, prepare, prepare_in_pieces, prepare_raw, raw_payload
from streamdedup.core.records import Document, RawRecord, Rejected, Source
from streamdedup.core.signed import ForgetOrder, pack_forget
from streamdedup.core.signing import signing_config
from streamdedup.engine.vshards.placement import homes_of_items
from streamdedup.runtime.sink.messages import kept_record_bytes
from streamdedup.runtime.vshards.messages import (ORDER_HEADER_BYTES, input_ranges, pack_epoch, pack_home,
                                                  unpack_home, unpack_order)

SIGNING = signing_config(config_module.load(None, (), environ={}))


def _records(first_offset: int = 0) -> list[RawRecord]:
    values = [json.dumps({"id": f"doc-{n}", "text": f"page {n} of a site about rivers and their bridges"}).encode()
              for n in range(6)]
    values[2] = b"{not json"  # rejected as it is decoded
    values[4] = json.dumps({"id": "doc-4", "text": "... !!! ---"}).encode()  # a document until it is normalized
    return [RawRecord(value, Source("raw", n % 2, first_offset + n), f"k{n}".encode(), (("h", b"v"),), 1_000 + n)
            for n, value in enumerate(values)]


def _prepared(records, spec: InputSpec = InputSpec()):
    return prepare_raw(raw_payload(records), spec, SIGNING)


@pytest.mark.parametrize("count", [1, 3, 8])
def test_a_home_prepares_from_its_home_message_what_the_whole_epoch_prepared_gives_its_records(count):
    records = _records() + _records(first_offset=6)
    whole = _prepared(records)
    homes = homes_of_items(decode_raw(raw_payload(records), InputSpec()), count).tolist()
    for home in sorted(set(homes)):
        places = [i for i, h in enumerate(homes) if h == home]
        got = unpack_home(pack_home(places, raw_payload([records[i] for i in places]), InputSpec()))
        assert got.places == places and got.records == [records[i] for i in places]
        mine = prepare(got.items(), SIGNING)
        assert [(type(i), i.id, i.source) for i in mine.items] == [(type(whole.items[i]), whole.items[i].id,
                                                                    records[i].source) for i in places]
        rows = [whole.row[i] for i in places if whole.row[i] >= 0]
        assert mine.contents == [whole.contents[r] for r in rows] and mine.id_keys == [whole.id_keys[r] for r in rows]
        assert np.array_equal(mine.keys, whole.keys[rows])
        assert [h.tolist() for h in mine.shingles.each()] == [list(whole.shingles.each())[r].tolist() for r in rows]
        documents = [i for i in mine.items if isinstance(i, Document)]
        assert not documents or set(homes_of_items(documents, count).tolist()) == {home}


def test_a_record_whose_text_normalizes_to_nothing_is_rejected_at_its_ids_home():
    records = _records()
    decoded = decode_raw(raw_payload(records), InputSpec())
    assert isinstance(decoded[4], Document)
    prepared = _prepared(records)
    assert isinstance(prepared.items[4], Rejected) and prepared.items[4].id == "doc-4"
    for count in (2, 3, 5, 8):
        assert homes_of_items(decoded, count)[4] == homes_of_items(prepared.items, count)[4]


def test_a_home_message_carries_the_signers_input_spec_and_its_output_limit():
    records = _records()
    limit = kept_record_bytes("doc-1", records[1].source, records[1].value, records[1].key, records[1].headers)
    spec = InputSpec(text_field="text", max_output_bytes=limit + ORDER_HEADER_BYTES,
                     kept_bytes=lambda *record: kept_record_bytes(*record) + ORDER_HEADER_BYTES)
    longer = dataclasses.replace(records[3], value=json.dumps({"id": "doc-3", "text": "a longer page " * 9}).encode())
    home = unpack_home(pack_home([0, 1, 3], raw_payload([records[0], records[1], longer]), spec))
    settings = [f.name for f in dataclasses.fields(InputSpec) if f.name != "kept_bytes"]
    assert [getattr(home.spec, f) for f in settings] == [getattr(spec, f) for f in settings]
    assert [type(i) for i in home.items()] == [type(i) for i in decode_raw(raw_payload(home.records), spec)]
    assert [i.reason for i in home.items() if isinstance(i, Rejected)] == ["too_large_for_output"]  # doc-3's
    unlimited = unpack_home(pack_home([0], raw_payload(records[:1]), InputSpec()))
    assert unlimited.spec.max_output_bytes == 0 and unlimited.spec.kept_bytes is None


def test_a_home_message_of_another_format_is_refused_saying_so():
    old = msgpack.packb([4, "home", [0], [[b"{}"], [None], [()], [0], ["raw"], [0], [0], [None]], []],
                        use_bin_type=True)
    with pytest.raises(ValueError, match="not a home message of format 5"):
        unpack_home(old)


@pytest.mark.parametrize("cuts", [[3], [1, 4], [2, 3, 5]], ids=["halves", "thirds", "around-the-rejected"])
def test_batches_prepared_apart_and_joined_are_the_batch_prepared_whole(cuts):
    records = _records() + _records(first_offset=6)
    whole = _prepared(records)
    bounds = [0, *cuts, len(records)]
    pieces = prepare_in_pieces(decode_raw(raw_payload(records), InputSpec()), SIGNING, size=cuts[0])
    for parts in (joined([_prepared(records[a:b]) for a, b in zip(bounds, bounds[1:])]), pieces):
        assert [type(i) for i in parts.items] == [type(i) for i in whole.items]
        assert parts.row == whole.row and parts.contents == whole.contents and parts.id_keys == whole.id_keys
        assert np.array_equal(parts.shingles.hashes, whole.shingles.hashes)
        assert np.array_equal(parts.shingles.offsets, whole.shingles.offsets)
        assert np.array_equal(parts.keys, whole.keys) and np.array_equal(parts.sites, whole.sites)
        assert parts.hosts == whole.hosts


def test_the_order_topic_holds_epochs_and_forget_orders_and_refuses_anything_else():
    records = _records(first_offset=40)
    epoch = unpack_order(pack_epoch(12.5, "fp", len(records), input_ranges(raw_payload(records)), {0: 7, 2: 9}))
    assert (epoch.signed_at, epoch.fingerprint, epoch.count, epoch.homes) == (12.5, "fp", 6, {0: 7, 2: 9})
    assert sorted(epoch.ranges) == [("raw", 0, 40, 44), ("raw", 1, 41, 45)]
    assert epoch.fresh_after({("raw", 0): 44}) and not epoch.fresh_after({("raw", 0): 45, ("raw", 1): 46})
    assert unpack_order(pack_forget(["a", "b"])) == ForgetOrder(["a", "b"])
    with pytest.raises(ValueError, match="not an epoch"):
        unpack_order(pack_home([0], raw_payload(records[:1]), InputSpec()))


def test_a_rejected_record_belongs_to_the_vshard_its_place_names_wherever_it_is_in_the_batch():
    records = _records()
    alone = decode_raw(raw_payload(records[2:3]), InputSpec())
    later = decode_raw(raw_payload(records[1:4]), InputSpec())
    assert isinstance(alone[0], Rejected) and alone[0].id is None and isinstance(later[1], Rejected)
    for count in (2, 3, 5, 8):
        assert homes_of_items(alone, count)[0] == homes_of_items(later, count)[1]
    spread = {int(homes_of_items(decode_raw(raw_payload([r]), InputSpec()), 8)[0])
              for r in [RawRecord(b"{", Source("raw", 0, n)) for n in range(64)]}
    assert len(spread) > 4, "rejected records spread over the vshards"


def test_an_epoch_names_each_input_partition_it_read_with_its_first_and_last_offsets():
    records = [RawRecord(b"{}", Source(topic, partition, offset))
               for topic, partition, offset in [("raw", 1, 9), ("raw", 0, 4), ("raw", 1, 7), ("web", 1, 2),
                                                ("raw", 1, 12), ("raw", 0, 3)]]
    assert input_ranges(raw_payload(records)) == {("raw", 1): (7, 12), ("raw", 0): (3, 4), ("web", 1): (2, 2)}
    epoch = unpack_order(pack_epoch(1.0, "fp", len(records), input_ranges(raw_payload(records)), {}))
    assert sorted(epoch.ranges) == [("raw", 0, 3, 4), ("raw", 1, 7, 12), ("web", 1, 2, 2)]
    assert input_ranges(raw_payload(records[1:2] + records[5:6])) == {("raw", 0): (3, 4)}
    assert input_ranges(raw_payload(records[3:4])) == {("web", 1): (2, 2)}
    assert input_ranges(raw_payload([])) == {}


def test_an_epoch_of_the_format_before_runs_is_refused_naming_both_formats():
    """Format 5 sends a home its records' bytes alone (format 4 sent what the signer prepared too): a host of
    either cannot read the other's home messages, so their epochs refuse each other."""
    from streamdedup.runtime.vshards.messages import KEYS_FORMAT

    assert KEYS_FORMAT == 5
    older = msgpack.packb([4, "epoch", 1.0, "fp", 1, [["raw", 0, 0, 0]], [[0, 0]]], use_bin_type=True)
    with pytest.raises(ValueError, match=r"not an epoch of format 5: \[4, 'epoch'\]"):
        unpack_order(older)


def _html_records() -> list[RawRecord]:
    page = "<html><body><nav>home</nav><article><p>{}</p></article></body></html>"
    values = [json.dumps({"id": "p-0", "html": page.format("rivers and their bridges " * 20)}),
              json.dumps({"id": "p-1", "html": "<html><body><nav>only navigation</nav></body></html>"}),
              json.dumps({"id": "p-2", "html": 7}),
              json.dumps({"id": "p-3", "text": "a record without its HTML, read by its text field"}),
              json.dumps({"html": page.format("a page without an id")}), "{not json"]
    return [RawRecord(v.encode(), Source("raw", 0, n)) for n, v in enumerate(values)]


def test_placing_finds_every_records_id_without_extracting_its_main_content():
    spec = InputSpec(html_field="html")
    records = _html_records()
    whole = decode_raw(raw_payload(records), spec)
    placed = decode_raw(raw_payload(records), spec.placing())
    assert [i.id for i in placed] == [i.id for i in whole]
    assert isinstance(whole[0], Document) and whole[0].text and placed[0].text == ""
    assert [type(i) for i in whole[1:3]] == [Rejected, Rejected]
    for count in (2, 3, 8):
        assert homes_of_items(placed, count).tolist() == homes_of_items(whole, count).tolist()
    pages = [RawRecord(json.loads(r.value)["html"].encode(), r.source, f"https://site.example/{n}".encode())
             for n, r in enumerate(records[:2])]
    html = InputSpec(format="html")
    assert [i.id for i in decode_raw(raw_payload(pages), html.placing())] == \
        [i.id for i in decode_raw(raw_payload(pages), html)]
