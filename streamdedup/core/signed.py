"""A signed batch as it travels from a signing process to the shards: its records and what preparing made of them.

One Kafka message per batch (Kafka's cost is per message), read by every
shard. It carries the prepared batch (content and id hashes, shingles, band
keys, sites), so no shard signs again, and where each record came from.
The records' own bytes, which only the shard that sends a record out needs,
travel apart: one values message per shard owning records of the batch
(``pack_values``), on a topic with a partition per shard, named in the
signed message by offset (``values_at``), so a shard reads its records'
bytes only. ``signed_at`` is the batch's decision time, the same on every
shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import msgpack
import numpy as np

from .prepare import PreparedBatch, raw_payload, raw_records, restore_items
from .records import Document, RawRecord, Source
from .shingle import ShingleBatch

__all__ = ["SignedBatch", "ForgetOrder", "pack_signed", "pack_values", "pack_forget", "unpack_signed",
           "records_with_values", "packed_prepared", "prepared_of", "SIGNED_FORMAT"]

SIGNED_FORMAT = 2  # bumped when the message changes; a shard reads this one and the one before (1: values inline)


@dataclass
class SignedBatch:
    records: list[RawRecord]  # in the canonical order (topic, partition, offset); bytes as ``values_at`` says
    prepared: PreparedBatch
    signed_at: float  # seconds since the epoch
    fingerprint: str  # of the signing settings (``SigningConfig.fingerprint``): the shards' must be the same
    values_at: dict = field(default_factory=dict)  # shard -> offset of its values message (empty: records whole)

    def taken(self, keep: list[bool]) -> "SignedBatch":
        """The batch without the records where ``keep`` is False (seen before, from a signing process that
        read them again)."""
        return SignedBatch([r for r, k in zip(self.records, keep) if k], subset(self.prepared, keep),
                           self.signed_at, self.fingerprint, self.values_at)


@dataclass
class ForgetOrder:
    """Ids to forget, at their place in the decision order (``streamdedup forget`` on a sharded deployment)."""

    ids: list[str]


def pack_forget(ids: list[str]) -> bytes:
    return msgpack.packb([SIGNED_FORMAT, "forget", list(ids)], use_bin_type=True)


def pack_signed(records: list[RawRecord], prepared: PreparedBatch, signed_at: float, fingerprint: str,
                values_at: dict[int, int]) -> bytes:
    """The signed message of ``records`` (prepared as ``prepared``), whose bytes went to the values messages
    at ``values_at`` (shard -> offset)."""
    sources = [[r.source.name for r in records], [r.source.partition for r in records],
               [r.source.offset for r in records]]
    return msgpack.packb([SIGNED_FORMAT, "batch", signed_at, fingerprint, sources, sorted(values_at.items()),
                          *packed_prepared(prepared)], use_bin_type=True)


def packed_prepared(prepared: PreparedBatch) -> list:
    """What preparing made of a batch as msgpack-ready fields (items, rows, hashes, shingles, keys, sites,
    hosts); ``prepared_of`` turns them back."""
    items = [["d", i.id] if isinstance(i, Document) else ["r", i.reason, i.detail, i.id] for i in prepared.items]
    shingles = prepared.shingles
    return [items, prepared.row, prepared.contents, prepared.id_keys, _array(shingles.hashes),
            _array(shingles.offsets), _array(prepared.keys), _array(prepared.sites), list(prepared.hosts.items())]


def prepared_of(fields: list, sources: list[Source]) -> PreparedBatch:
    """The prepared batch of ``packed_prepared`` fields, its items placed at ``sources``."""
    items, row, contents, id_keys, hashes, offsets, keys, sites, hosts = fields
    batch = PreparedBatch([tuple(i) for i in items], row, contents, id_keys,
                          ShingleBatch(_from_array(hashes), _from_array(offsets)), _from_array(keys),
                          _from_array(sites), dict(hosts))
    return restore_items(batch, sources)


def pack_values(records: list[RawRecord]) -> bytes:
    """The values message of one shard's records of a signed batch: each whole."""
    return msgpack.packb([SIGNED_FORMAT, "values", list(raw_payload(records))], use_bin_type=True)


def records_with_values(records: list[RawRecord], packed: bytes) -> list[RawRecord]:
    """``records`` (of a signed batch, where only their sources are) whole, from their values message;
    ValueError if it does not hold one of them."""
    fields = msgpack.unpackb(packed, use_list=True)
    if fields[0] != SIGNED_FORMAT or fields[1] != "values":
        raise ValueError(f"not a values message of format {SIGNED_FORMAT}: {fields[:2]!r}")
    payload = fields[2]
    payload[2] = [tuple(tuple(h) for h in headers) for headers in payload[2]]
    whole = {tuple(r.source.as_list()): r for r in raw_records(tuple(payload))}
    try:
        return [whole[tuple(r.source.as_list())] for r in records]
    except KeyError as missing:
        raise ValueError(f"the values message lacks the record at {missing}") from None


def unpack_signed(data: bytes) -> Union[SignedBatch, ForgetOrder]:
    """The batch ``pack_signed`` packed (or the order ``pack_forget`` did); ValueError for another format."""
    fields = msgpack.unpackb(data, use_list=True)
    if fields[0] not in (SIGNED_FORMAT, 1):
        raise ValueError(f"signed batch format {fields[0]}, this version reads {SIGNED_FORMAT} and 1")
    if fields[1] == "forget":
        return ForgetOrder(fields[2])
    if fields[0] == 1:  # the records whole in the signed message
        _, _, signed_at, fingerprint, payload, *prepared = fields
        payload[2] = [tuple(tuple(h) for h in headers) for headers in payload[2]]
        records, values_at = raw_records(tuple(payload)), {}
    else:
        _, _, signed_at, fingerprint, (names, partitions, offsets), values_at, *prepared = fields
        records = [RawRecord(None, Source(*where)) for where in zip(names, partitions, offsets)]
        values_at = dict(values_at)
    return SignedBatch(records, prepared_of(prepared, [r.source for r in records]), signed_at, fingerprint,
                       values_at)


def subset(batch: PreparedBatch, keep: list[bool]) -> PreparedBatch:
    """``batch`` with only the items where ``keep`` is True, its rows renumbered."""
    rows = [row for row, k in zip(batch.row, keep) if k and row >= 0]
    items, row, next_row = [], [], 0
    for item, old, k in zip(batch.items, batch.row, keep):
        if k:
            items.append(item)
            row.append(next_row if old >= 0 else -1)
            next_row += old >= 0
    shingles = batch.shingles
    parts = [shingles.of(r) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    hashes = np.concatenate(parts) if parts else shingles.hashes[:0]
    return PreparedBatch(items, row, [batch.contents[r] for r in rows], [batch.id_keys[r] for r in rows],
                         ShingleBatch(hashes, offsets), batch.keys[rows], batch.sites[rows], batch.hosts)


def _array(a: np.ndarray) -> list:
    return [a.dtype.str, list(a.shape), a.tobytes()]


def _from_array(packed: list) -> np.ndarray:
    dtype, shape, data = packed
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
