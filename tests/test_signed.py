"""Signed batches and values messages as they travel between the roles of a sharded deployment."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from streamdedup import config as config_module
from streamdedup.core.decode import InputSpec
from streamdedup.core.prepare import prepare_raw, raw_payload
from streamdedup.core.records import Document, RawRecord, Rejected, Source
from streamdedup.core.signed import pack_signed, pack_values, records_with_values, unpack_signed
from streamdedup.core.signing import signing_config
from streamdedup.engine.evidence import item_owners

SIGNING = signing_config(config_module.load(None, (), environ={}))


def _records(first_offset: int = 0) -> list[RawRecord]:
    values = [json.dumps({"id": f"doc-{n}", "text": f"page {n} of a site about rivers and their bridges"}).encode()
              for n in range(6)]
    values[2] = b"{not json"  # rejected as it is decoded
    return [RawRecord(value, Source("raw", n % 2, first_offset + n), f"k{n}".encode(), (("h", b"v"),), 1_000 + n)
            for n, value in enumerate(values)]


def _prepared(records):
    return prepare_raw(raw_payload(records), InputSpec(), SIGNING)


def test_a_signed_batch_leaves_the_record_bytes_to_the_values_messages_that_make_them_whole():
    records = _records()
    prepared = _prepared(records)
    owners = item_owners(prepared, 3).tolist()
    values = {shard: pack_values([r for r, o in zip(records, owners) if o == shard]) for shard in set(owners)}
    signed = unpack_signed(pack_signed(records, prepared, 12.5, "fp", {shard: 40 + shard for shard in values}))
    assert [r.source for r in signed.records] == [r.source for r in records]
    assert all(r.value is None for r in signed.records), "no record's bytes travel in the signed batch"
    assert signed.values_at == {shard: 40 + shard for shard in values}
    for shard, packed in values.items():
        mine = [r for r, o in zip(signed.records, owners) if o == shard]
        assert records_with_values(mine, packed) == [r for r, o in zip(records, owners) if o == shard]
    other = next(s for s in values if s != owners[0])
    with pytest.raises(ValueError, match="lacks the record"):
        records_with_values(signed.records[:1], values[other])


def test_a_signed_batch_of_the_format_before_is_read_with_its_records_whole():
    records = _records()
    prepared = _prepared(records)
    items = [["d", i.id] if isinstance(i, Document) else ["r", i.reason, i.detail, i.id]
             for i in prepared.items]
    array = lambda a: [a.dtype.str, list(a.shape), a.tobytes()]  # noqa: E731
    old = msgpack.packb([1, "batch", 12.5, "fp", list(raw_payload(records)), items, prepared.row, prepared.contents,
                         prepared.id_keys, array(prepared.shingles.hashes), array(prepared.shingles.offsets),
                         array(prepared.keys), array(prepared.sites), list(prepared.hosts.items())],
                        use_bin_type=True)
    signed = unpack_signed(old)
    assert signed.records == records and signed.values_at == {}
    assert np.array_equal(signed.prepared.keys, prepared.keys)
    with pytest.raises(ValueError, match="format 9"):
        unpack_signed(msgpack.packb([9, "batch"]))


def test_a_rejected_record_belongs_to_the_shard_its_place_names_wherever_it_is_in_the_batch():
    records = _records()
    alone = _prepared(records[2:3])
    later = _prepared(records[1:4])
    assert isinstance(alone.items[0], Rejected) and isinstance(later.items[1], Rejected)
    for count in (2, 3, 5, 8):
        assert item_owners(alone, count)[0] == item_owners(later, count)[1]
    spread = {int(item_owners(_prepared([r]), 8)[0]) for r in [RawRecord(b"{", Source("raw", 0, n)) for n in range(64)]}
    assert len(spread) > 4, "rejected records spread over the shards"
