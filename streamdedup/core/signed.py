"""A signed batch as it travels from a signing process to the shards: its records and what preparing made of them.

One Kafka message per batch (Kafka's cost is per message). It carries the
records' bytes (a shard sends its own documents' records out unchanged) and
the prepared batch (content and id hashes, shingles, band keys, sites), so
no shard signs again. ``signed_at`` is the batch's decision time, the same
on every shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import msgpack
import numpy as np

from .prepare import PreparedBatch, raw_payload, raw_records, restore_items
from .records import Document, RawRecord
from .shingle import ShingleBatch

__all__ = ["SignedBatch", "ForgetOrder", "pack_signed", "pack_forget", "unpack_signed", "SIGNED_FORMAT"]

SIGNED_FORMAT = 1  # bumped when the message changes; a shard refuses other formats


@dataclass
class SignedBatch:
    records: list[RawRecord]  # in the canonical order (topic, partition, offset)
    prepared: PreparedBatch
    signed_at: float  # seconds since the epoch
    fingerprint: str  # of the signing settings (``SigningConfig.fingerprint``): the shards' must be the same

    def taken(self, keep: list[bool]) -> "SignedBatch":
        """The batch without the records where ``keep`` is False (seen before, from a signing process that
        read them again)."""
        return SignedBatch([r for r, k in zip(self.records, keep) if k], subset(self.prepared, keep),
                           self.signed_at, self.fingerprint)


@dataclass
class ForgetOrder:
    """Ids to forget, at their place in the decision order (``streamdedup forget`` on a sharded deployment)."""

    ids: list[str]


def pack_forget(ids: list[str]) -> bytes:
    return msgpack.packb([SIGNED_FORMAT, "forget", list(ids)], use_bin_type=True)


def pack_signed(records: list[RawRecord], prepared: PreparedBatch, signed_at: float, fingerprint: str) -> bytes:
    items = [["d", i.id] if isinstance(i, Document) else ["r", i.reason, i.detail, i.id] for i in prepared.items]
    shingles = prepared.shingles
    return msgpack.packb([
        SIGNED_FORMAT, "batch", signed_at, fingerprint, list(raw_payload(records)), items, prepared.row, prepared.contents,
        prepared.id_keys, _array(shingles.hashes), _array(shingles.offsets), _array(prepared.keys),
        _array(prepared.sites), list(prepared.hosts.items()),
    ], use_bin_type=True)


def unpack_signed(data: bytes) -> Union[SignedBatch, ForgetOrder]:
    """The batch ``pack_signed`` packed (or the order ``pack_forget`` did); ValueError for another format."""
    fields = msgpack.unpackb(data, use_list=True)
    if fields[0] != SIGNED_FORMAT:
        raise ValueError(f"signed batch format {fields[0]}, this version reads {SIGNED_FORMAT}")
    if fields[1] == "forget":
        return ForgetOrder(fields[2])
    _, _, signed_at, fingerprint, payload, items, row, contents, id_keys, hashes, offsets, keys, sites, hosts = fields
    payload[2] = [tuple(tuple(h) for h in headers) for headers in payload[2]]
    records = raw_records(tuple(payload))
    prepared = PreparedBatch([tuple(i) for i in items], row, contents, id_keys,
                             ShingleBatch(_from_array(hashes), _from_array(offsets)), _from_array(keys),
                             _from_array(sites), dict(hosts))
    return SignedBatch(records, restore_items(prepared, [r.source for r in records]), signed_at, fingerprint)


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
