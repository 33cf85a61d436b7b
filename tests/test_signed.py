"""What the roles of a sharded deployment send each other: home messages (records whole and prepared), epochs and
forget orders in the order topic, and where each record lives."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from streamdedup import config as config_module
from streamdedup.core.decode import InputSpec
from streamdedup.core.prepare import prepare_raw, raw_payload
from streamdedup.core.records import RawRecord, Rejected, Source
from streamdedup.core.signed import ForgetOrder, joined, pack_forget, split, subset
from streamdedup.core.signing import signing_config
from streamdedup.engine.vshards.placement import item_homes
from streamdedup.runtime.vshards.messages import input_ranges, pack_epoch, pack_home, unpack_home, unpack_order

SIGNING = signing_config(config_module.load(None, (), environ={}))


def _records(first_offset: int = 0) -> list[RawRecord]:
    values = [json.dumps({"id": f"doc-{n}", "text": f"page {n} of a site about rivers and their bridges"}).encode()
              for n in range(6)]
    values[2] = b"{not json"  # rejected as it is decoded
    return [RawRecord(value, Source("raw", n % 2, first_offset + n), f"k{n}".encode(), (("h", b"v"),), 1_000 + n)
            for n, value in enumerate(values)]


def _prepared(records):
    return prepare_raw(raw_payload(records), InputSpec(), SIGNING)


def test_a_home_message_carries_its_records_whole_and_what_preparing_made_of_them():
    records = _records()
    prepared = _prepared(records)
    homes = item_homes(prepared, 3).tolist()
    for home in set(homes):
        keep = [h == home for h in homes]
        places = [i for i, k in enumerate(keep) if k]
        mine = subset(prepared, keep)
        got = unpack_home(pack_home(places, [records[i] for i in places], mine))
        assert got.places == places and got.records == [records[i] for i in places]
        assert [i.id for i in got.prepared.items] == [i.id for i in mine.items]
        assert got.prepared.contents == mine.contents and np.array_equal(got.prepared.keys, mine.keys)
        assert [i.source for i in got.prepared.items] == [records[i].source for i in places]


def test_a_home_message_carries_band_keys_in_four_bytes_and_gives_them_back_as_prepared():
    records = _records()
    prepared = _prepared(records)
    assert prepared.keys.dtype == np.uint64 and prepared.keys.size
    narrow = pack_home(list(range(len(records))), records, prepared)
    wide = dataclasses.replace(prepared, keys=prepared.keys | np.uint64(1 << 40))  # not a band key: sent whole
    assert len(pack_home(list(range(len(records))), records, wide)) - len(narrow) == 4 * prepared.keys.size
    got = unpack_home(narrow).prepared.keys
    assert got.dtype == np.uint64 and np.array_equal(got, prepared.keys)
    assert np.array_equal(unpack_home(pack_home(list(range(len(records))), records, wide)).prepared.keys, wide.keys)


@pytest.mark.parametrize("count", [1, 3, 8])
def test_an_epoch_split_by_home_gives_each_home_its_records_prepared_alone(count):
    records = _records() + _records(first_offset=6)
    prepared = _prepared(records)
    homes = item_homes(prepared, count).tolist()
    parts = split(prepared, homes)
    assert sorted(parts) == sorted(set(homes))
    for home, (places, part) in parts.items():
        assert places == [i for i, h in enumerate(homes) if h == home]
        alone = _prepared([records[i] for i in places])
        assert [(type(i), i.id) for i in part.items] == [(type(i), i.id) for i in alone.items]
        assert part.row == alone.row and part.contents == alone.contents and part.id_keys == alone.id_keys
        assert np.array_equal(part.shingles.hashes, alone.shingles.hashes)
        assert np.array_equal(part.shingles.offsets, alone.shingles.offsets)
        assert np.array_equal(part.keys, alone.keys) and np.array_equal(part.sites, alone.sites)


@pytest.mark.parametrize("cuts", [[3], [1, 4], [2, 3, 5]], ids=["halves", "thirds", "around-the-rejected"])
def test_batches_prepared_apart_and_joined_are_the_batch_prepared_whole(cuts):
    records = _records() + _records(first_offset=6)
    whole = _prepared(records)
    bounds = [0, *cuts, len(records)]
    parts = joined([_prepared(records[a:b]) for a, b in zip(bounds, bounds[1:])])
    assert [type(i) for i in parts.items] == [type(i) for i in whole.items]
    assert parts.row == whole.row and parts.contents == whole.contents and parts.id_keys == whole.id_keys
    assert np.array_equal(parts.shingles.hashes, whole.shingles.hashes)
    assert np.array_equal(parts.shingles.offsets, whole.shingles.offsets)
    assert np.array_equal(parts.keys, whole.keys) and np.array_equal(parts.sites, whole.sites)
    assert parts.hosts == whole.hosts


def test_the_order_topic_holds_epochs_and_forget_orders_and_refuses_anything_else():
    records = _records(first_offset=40)
    epoch = unpack_order(pack_epoch(12.5, "fp", records, {0: 7, 2: 9}))
    assert (epoch.signed_at, epoch.fingerprint, epoch.count, epoch.homes) == (12.5, "fp", 6, {0: 7, 2: 9})
    assert sorted(epoch.ranges) == [("raw", 0, 40, 44), ("raw", 1, 41, 45)]
    assert epoch.fresh_after({("raw", 0): 44}) and not epoch.fresh_after({("raw", 0): 45, ("raw", 1): 46})
    assert unpack_order(pack_forget(["a", "b"])) == ForgetOrder(["a", "b"])
    with pytest.raises(ValueError, match="not an epoch"):
        unpack_order(pack_home([0], records[:1], subset(_prepared(records), [True] + [False] * 5)))


def test_a_rejected_record_belongs_to_the_vshard_its_place_names_wherever_it_is_in_the_batch():
    records = _records()
    alone = _prepared(records[2:3])
    later = _prepared(records[1:4])
    assert isinstance(alone.items[0], Rejected) and isinstance(later.items[1], Rejected)
    for count in (2, 3, 5, 8):
        assert item_homes(alone, count)[0] == item_homes(later, count)[1]
    spread = {int(item_homes(_prepared([r]), 8)[0]) for r in [RawRecord(b"{", Source("raw", 0, n)) for n in range(64)]}
    assert len(spread) > 4, "rejected records spread over the vshards"


def test_an_epoch_names_each_input_partition_it_read_with_its_first_and_last_offsets():
    records = [RawRecord(b"{}", Source(topic, partition, offset))
               for topic, partition, offset in [("raw", 1, 9), ("raw", 0, 4), ("raw", 1, 7), ("web", 1, 2),
                                                ("raw", 1, 12), ("raw", 0, 3)]]
    assert input_ranges(records) == {("raw", 1): (7, 12), ("raw", 0): (3, 4), ("web", 1): (2, 2)}
    epoch = unpack_order(pack_epoch(1.0, "fp", records, {}))
    assert sorted(epoch.ranges) == [("raw", 0, 3, 4), ("raw", 1, 7, 12), ("web", 1, 2, 2)]
    assert input_ranges([]) == {}


def test_an_epoch_of_the_format_before_runs_is_refused_naming_both_formats():
    """Format 4 sends the probes' serials as runs (``vshard._runs``): a host of it cannot read the exchange of a
    host of format 3, so their epochs refuse each other."""
    import msgpack

    from streamdedup.runtime.vshards.messages import KEYS_FORMAT

    assert KEYS_FORMAT == 4
    older = msgpack.packb([3, "epoch", 1.0, "fp", 1, [["raw", 0, 0, 0]], [[0, 0]]], use_bin_type=True)
    with pytest.raises(ValueError, match=r"not an epoch of format 4: \[3, 'epoch'\]"):
        unpack_order(older)
