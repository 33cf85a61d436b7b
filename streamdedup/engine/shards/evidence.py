"""Step 1 of a sharded batch: what one shard's index says about each document of the batch.

Everything is read in one read transaction of the shard's last committed
state: the batch before has been applied everywhere before any shard looks
this batch up, so every shard answers against the same point of the order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import numpy as np

from ...core.prepare import PreparedBatch
from ...core.verify import jaccard
from ...store.bands import BandTables
from ...store.hashed import serials_of_many
from ...store.index import DocRecord, IndexTxn
from ...store.lookup import Hits, RecentMirror, earliest_of_each_key, first_documents

__all__ = ["ShardPlace", "Evidence", "evidence_of", "batch_band_keys", "row_ids"]


@dataclass(frozen=True)
class ShardPlace:
    """Shard ``number`` of ``count``."""

    number: int
    count: int

    def owns(self, ident: bytes) -> bool:
        """Whether the document with id hash ``ident`` lives in this shard (its last 4 bytes, modulo count)."""
        return owner_of(ident, self.count) == self.number


def owner_of(ident: bytes, count: int) -> int:
    """The shard holding the documents with id hash ``ident`` (every version of an id lives in one shard)."""
    return int.from_bytes(ident[-4:], "big") % count


@dataclass
class Evidence:
    """One shard's answers for one batch (rows are the batch's document rows).

    ``replays``: row -> the earlier decision of that very document (same id,
    same content), as (id, kept, cluster id, matched id, similarity, exact,
    containment); only the owner of the id answers. ``twins``: row -> the
    first stored document with the same content, as (serial, cluster serial,
    cluster id, id). ``found_keys``/``found_serials``: the stored (band key,
    serial) entries under the batch's band keys, the earliest
    ``max_candidates`` of each key. ``matches``: (row, serial, Jaccard) of
    every candidate at or above the threshold, and ``names`` their ids.
    """

    replays: dict = field(default_factory=dict)
    twins: dict = field(default_factory=dict)
    found_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    found_serials: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    matches: list = field(default_factory=list)
    names: dict = field(default_factory=dict)

    def pack(self) -> bytes:
        return msgpack.packb([self.replays, self.twins, self.found_keys.astype("<u8").tobytes(),
                              self.found_serials.astype("<i8").tobytes(), self.matches, self.names],
                             use_bin_type=True)

    @classmethod
    def unpack(cls, data: bytes) -> "Evidence":
        replays, twins, keys, serials, matches, names = msgpack.unpackb(data, strict_map_key=False)
        return cls(replays, twins, np.frombuffer(keys, "<u8").astype(np.uint64),
                   np.frombuffer(serials, "<i8").astype(np.int64), [tuple(m) for m in matches], names)


def row_ids(batch: PreparedBatch) -> list[str]:
    """The document id of each row of the batch."""
    ids: list = [None] * len(batch.contents)
    for item, row in zip(batch.items, batch.row):
        if row >= 0:
            ids[row] = item.id
    return ids


def batch_band_keys(batch: PreparedBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's band keys sorted, the row of each and its band (as ``lookup.BatchView`` asks them)."""
    keys = batch.keys
    by_key = np.argsort(keys.ravel())
    return keys.ravel()[by_key], by_key // keys.shape[1], (by_key % keys.shape[1]).astype(np.uint16)


def evidence_of(txn: IndexTxn, mirror: RecentMirror, bands: BandTables, batch: PreparedBatch, place: ShardPlace,
                threshold: float, max_candidates: int, min_shared: int) -> Evidence:
    """This shard's evidence on ``batch`` (see ``Evidence``)."""
    records: dict[int, DocRecord] = {}

    def record(serial: int) -> DocRecord:
        found = records.get(serial)
        if found is None:
            found = records[serial] = txn.record(serial)
        return found

    ids = row_ids(batch)
    evidence = Evidence(replays=_replays(txn, mirror, batch, ids, place, record),
                        twins=_twins(txn, mirror, batch.contents, record))
    asked, rows, band = batch_band_keys(batch)
    found_keys, found_serials = bands.lookup(txn, mirror, band, asked)
    if len(found_keys):
        found_keys, found_serials = earliest_of_each_key(found_keys, found_serials, max_candidates)
        evidence.found_keys, evidence.found_serials = found_keys, found_serials
        hits = Hits.found(asked, rows, len(batch.contents), found_keys, found_serials, max_candidates)
        evidence.matches = _verified(txn, batch, hits, threshold, min_shared)
        evidence.names = {serial: record(serial).id for _, serial, _ in evidence.matches}
    return evidence


def _replays(txn: IndexTxn, mirror: RecentMirror, batch: PreparedBatch, ids: list[str], place: ShardPlace,
             record) -> dict:
    """Row -> the earlier decision of that document, for the rows whose id this shard owns."""
    owned = [row for row, ident in enumerate(batch.id_keys) if place.owns(ident)]
    stored = serials_of_many(txn, "ids", [batch.id_keys[row] for row in owned])
    replays = {}
    for row in owned:
        ident = batch.id_keys[row]
        serials = sorted(set(stored.get(ident, ())) | set(mirror.serials_of_id(ident)))
        for serial in serials:
            earlier = record(serial)
            if earlier.content == batch.contents[row] and earlier.id == ids[row]:
                replays[row] = [earlier.id, earlier.kept, earlier.cluster_id, earlier.matched_id,
                                earlier.similarity, earlier.exact, earlier.containment]
                break
    return replays


def _twins(txn: IndexTxn, mirror: RecentMirror, contents: list[bytes], record) -> dict:
    """Row -> the first stored document with the row's content."""
    first = first_documents(txn, mirror, contents, record)
    twins = {}
    for row, content in enumerate(contents):
        serial = first.get(content)
        if serial is not None:
            twin = record(serial)
            twins[row] = [serial, twin.cluster, twin.cluster_id, twin.id]
    return twins


def _verified(txn: IndexTxn, batch: PreparedBatch, hits: Hits, threshold: float, min_shared: int) -> list:
    """(row, serial, Jaccard) of the candidates at or above the threshold.

    Every candidate sharing ``min_shared`` bands here is verified: the
    deployment keeps at most ``max_candidates`` of a key (and of a document)
    over all shards, a subset of each shard's own, so this covers them.
    """
    matches = []
    shingles: dict[int, np.ndarray] = {}
    for row in range(len(batch.contents)):
        serials, shared = hits.of(row)
        if not len(serials):
            continue
        own = batch.shingles.of(row)
        for serial, count in zip(serials.tolist(), shared.tolist()):
            if count < min_shared:
                continue
            stored = shingles.get(serial)
            if stored is None:
                stored = shingles[serial] = txn.shingles(serial)
            similarity = jaccard(own, stored)
            if similarity >= threshold:
                matches.append((row, serial, similarity))
    return matches
