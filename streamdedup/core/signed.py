"""What preparing made of a batch as it travels between the roles of a sharded deployment, and forget orders.

A signing process sends each vshard the records it is home to with what
preparing made of them (content and id hashes, shingles, band keys, sites:
``packed_prepared``, read back with ``prepared_of``), so no vshard signs
again; ``split`` cuts it into a part a home (``subset``: one part), ``joined``
makes one of batches prepared apart. A forget
order (``pack_forget``) travels in the decision order, between epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

from .prepare import PreparedBatch, restore_items
from .records import Document, Source
from .shingle import ShingleBatch

__all__ = ["ForgetOrder", "joined", "pack_forget", "packed_prepared", "prepared_of", "split", "subset"]

_FORGET_FORMAT = 2  # the first field of a forget order, as the deployments before wrote it too


@dataclass
class ForgetOrder:
    """Ids to forget, at their place in the decision order (``streamdedup forget`` on a sharded deployment)."""

    ids: list[str]


def pack_forget(ids: list[str]) -> bytes:
    return msgpack.packb([_FORGET_FORMAT, "forget", list(ids)], use_bin_type=True)


def packed_prepared(prepared: PreparedBatch) -> list:
    """What preparing made of a batch as msgpack-ready fields (items, rows, hashes, shingles, keys, sites,
    hosts); ``prepared_of`` turns them back."""
    items = [["d", i.id] if isinstance(i, Document) else ["r", i.reason, i.detail, i.id] for i in prepared.items]
    shingles = prepared.shingles
    return [items, prepared.row, prepared.contents, prepared.id_keys, _array(shingles.hashes),
            _array(shingles.offsets), _array(_narrowed_keys(prepared.keys)), _array(prepared.sites),
            list(prepared.hosts.items())]


def prepared_of(fields: list, sources: list[Source]) -> PreparedBatch:
    """The prepared batch of ``packed_prepared`` fields, its items placed at ``sources``."""
    items, row, contents, id_keys, hashes, offsets, keys, sites, hosts = fields
    batch = PreparedBatch([tuple(i) for i in items], row, contents, id_keys,
                          ShingleBatch(_from_array(hashes), _from_array(offsets)),
                          _from_array(keys).astype(np.uint64, copy=False),
                          _from_array(sites), dict(hosts))
    return restore_items(batch, sources)


def subset(batch: PreparedBatch, keep: list[bool]) -> PreparedBatch:
    """``batch`` with only the items where ``keep`` is True, its rows renumbered."""
    places = [place for place, k in enumerate(keep) if k]
    return _part(batch, places)


def split(batch: PreparedBatch, labels: list[int]) -> dict[int, tuple[list[int], PreparedBatch]]:
    """``batch``'s items by label (one a item): label -> (the places of its items, ``subset`` of them), in
    one pass over the batch (a signing process cuts each epoch into a part a home)."""
    places: dict[int, list[int]] = {}
    for place, label in enumerate(labels):
        places.setdefault(label, []).append(place)
    return {label: (at, _part(batch, at)) for label, at in sorted(places.items())}


def _part(batch: PreparedBatch, places: list[int]) -> PreparedBatch:
    """The items of ``batch`` at ``places`` (ascending), their rows renumbered."""
    items, row, rows = [], [], []
    for place in places:
        items.append(batch.items[place])
        old = batch.row[place]
        if old >= 0:
            row.append(len(rows))
            rows.append(old)
        else:
            row.append(-1)
    return PreparedBatch(items, row, [batch.contents[r] for r in rows], [batch.id_keys[r] for r in rows],
                         _shingles_of(batch.shingles, rows), batch.keys[rows], batch.sites[rows], batch.hosts)


def _shingles_of(shingles: ShingleBatch, rows: list[int]) -> ShingleBatch:
    """The shingles of documents ``rows``, in that order, gathered at once."""
    at = np.asarray(rows, dtype=np.int64)
    starts, sizes = shingles.offsets[at], shingles.offsets[at + 1] - shingles.offsets[at]
    offsets = _offsets(sizes)
    gather = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], sizes)
    return ShingleBatch(shingles.hashes[gather], offsets)


def joined(batches: list[PreparedBatch]) -> PreparedBatch:
    """One prepared batch of ``batches``' items in turn, rows renumbered: the same as preparing their items
    together (preparing is per document), in pieces whose arrays stay in the caches."""
    if len(batches) == 1:
        return batches[0]
    items, row, before = [], [], 0
    for batch in batches:
        items += batch.items
        row += [r + before if r >= 0 else -1 for r in batch.row]
        before += len(batch.contents)
    offsets = _offsets(np.concatenate([np.diff(b.shingles.offsets) for b in batches]))
    hosts: dict = {}
    for batch in batches:
        hosts.update(batch.hosts)
    return PreparedBatch(items, row, [c for b in batches for c in b.contents], [k for b in batches for k in b.id_keys],
                         ShingleBatch(np.concatenate([b.shingles.hashes for b in batches]), offsets),
                         np.concatenate([b.keys for b in batches]), np.concatenate([b.sites for b in batches]), hosts)


def _offsets(sizes) -> np.ndarray:
    """A ``ShingleBatch``'s offsets of documents with ``sizes`` shingles each, in turn."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _narrowed_keys(keys: np.ndarray) -> np.ndarray:
    """Band keys in 4 bytes each where they fit, as they do (a band key is 32 bits, ``lsh.KEY_MASK``): 128
    bytes a document less in a home message (of some 2,700), which every role pays for by the byte (made,
    carried by the broker, fetched). ``prepared_of`` widens them back (an array carries its type: either
    width reads)."""
    if keys.size and int(keys.max()) > 0xFFFFFFFF:
        return keys
    return keys.astype(np.uint32)


def _array(a: np.ndarray) -> list:
    return [a.dtype.str, list(a.shape), a.tobytes()]


def _from_array(packed: list) -> np.ndarray:
    dtype, shape, data = packed
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
