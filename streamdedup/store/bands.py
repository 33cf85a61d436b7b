"""The band tables: where kept documents are found by their band keys, and every path that touches them.

One dupsort table, ``bands``, of buckets: the key is a band number (2 bytes)
and the high 16 bits of a 32-bit band key (2 bytes); each value (6 bytes,
packed by LMDB with the others of its bucket) holds the key's low 16 bits
and a kept document's serial (32 bits: an index numbers at most 2^32
documents), all big-endian so that buckets sort by band, then key. A bucket
holds about documents / 65,536 entries, so an entry costs its 6 bytes (a
table keyed by whole band keys paid ~28 bytes an entry for LMDB's node of
each). A lookup reads the buckets of its keys
and keeps the entries whose key is one it asked for. Only kept documents
are in it, so documents are compared with kept documents only.

``BandTables`` is the one way in. A lookup asks the table through the
writer's filter of stored keys (``bandfilter``) and the recent-keys mirror
(``lookup.RecentMirror``: kept documents not merged into the table yet).
Entries reach the table only in merges (``insert_slice``), and whatever a
merge adds is added to the filter once the merge has committed
(``inserted``): a key missing from the filter would hide a stored document.
Removals (``remove``: forget, retention) delete exactly one kept document's
entries; their keys may stay set in the filter, which is harmless.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional

import numpy as np

from . import bandfilter
from .bandfilter import BandFilter
from ..core.lsh import band_keys
from ..core.shingle import ShingleBatch
from ..core.signing import sign_batch
from .index import DocRecord, Index, IndexTxn

__all__ = ["BandTables", "band_entries", "stored_keys", "record_band_keys", "KEY_ROW", "BAND_ROW", "BAND_KEY_BYTES"]

BAND_KEY_BYTES = 4  # a band key is 32 bits (``lsh.band_keys``): in records, the recent log and the table
KEY_ROW = np.dtype([("band", ">u2"), ("key", ">u8")])  # a key of the ``rekeyed`` table
BAND_ROW = np.dtype([("band", ">u2"), ("key", ">u8"), ("serial", ">u8")])  # a ``rekeyed`` key and one value
_BUCKET = np.dtype([("band", ">u2"), ("high", ">u2")])  # a ``bands`` key
_ENTRY = np.dtype([("band", ">u2"), ("high", ">u2"), ("low", ">u2"), ("serial", ">u4")])  # key, one value
_ENTRY_PAIR = np.dtype([("key", "V4"), ("value", "V6")])  # the same row as LMDB key and value bytes
_VALUE_BYTES = 6  # serials fit 32 bits: ``index.MAX_SERIAL``


def _entries(bands: np.ndarray, keys: np.ndarray, serials: np.ndarray) -> np.ndarray:
    """Table rows (``_ENTRY``) of these (band, 32-bit band key, serial), in the table's order."""
    rows = np.empty(len(keys), dtype=_ENTRY)
    keys = keys.astype(np.uint64)
    rows["band"], rows["high"], rows["low"] = bands, keys >> np.uint64(16), keys & np.uint64(0xFFFF)
    rows["serial"] = serials
    return rows[np.lexsort((rows["serial"], rows["low"], rows["high"], rows["band"]))]


def _decoded(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(band, band key, serial) of table rows."""
    keys = (rows["high"].astype(np.uint64) << np.uint64(16)) | rows["low"].astype(np.uint64)
    return rows["band"].astype(np.int64), keys, rows["serial"].astype(np.int64)


def band_entries(txn: IndexTxn) -> Iterator[tuple[int, bytes, int]]:
    """Every (band, band key bytes, serial) of the table, in table order."""
    for key, value in txn.txn.cursor(db=txn.dbs["bands"]):
        row = np.frombuffer(key + value, dtype=_ENTRY)
        band, keys, serials = _decoded(row)
        yield int(band[0]), int(keys[0]).to_bytes(BAND_KEY_BYTES, "big"), int(serials[0])


def stored_keys(txn: IndexTxn, chunk: int) -> Iterator[np.ndarray]:
    """Every band key stored in the table (once per entry), as uint64 arrays of at most ``chunk`` keys."""
    pairs = txn.txn.cursor(db=txn.dbs["bands"]).iternext(keys=True, values=True)
    while rows := list(itertools.islice(pairs, chunk)):
        yield _decoded(np.frombuffer(b"".join(k + v for k, v in rows), dtype=_ENTRY))[1]


def record_band_keys(txn: IndexTxn, record: DocRecord) -> np.ndarray:
    """A live kept document's band keys (uint64, one per band).

    Its record stores them only when they are not those of its stored
    shingles (a page whose content leaves its site's template out is looked
    up by its content's signature); otherwise they are signed again from the
    shingles, which is how they were made.
    """
    if record.band_keys:
        return np.frombuffer(record.band_keys, dtype=">u4").astype(np.uint64)
    signing = txn.index.signing
    shingles = txn.shingles(record.serial)
    signature = sign_batch(ShingleBatch(shingles, np.array([0, len(shingles)], dtype=np.int64)),
                           signing.num_perm, signing.seed)
    return band_keys(signature, signing.bands, signing.rows)[0]


class BandTables:
    """The band table of one index, with the writer's filter of its keys (``filter_bytes`` 0: none)."""

    def __init__(self, index: Index, filter_bytes: int = 0):
        self.index = index
        self.filter_bytes = filter_bytes
        self._filter: Optional[BandFilter] = None

    def loaded_filter(self) -> Optional[BandFilter]:
        """The filter of stored keys, loaded or built from the table on first use (None without one).

        It reads the index in a transaction of its own: call it before a
        write transaction begins, not inside one.
        """
        if self._filter is None and self.filter_bytes:
            self._filter = bandfilter.load_or_build(self.index, self.filter_bytes,
                                                    lambda txn: stored_keys(txn, bandfilter.SCAN_CHUNK))
        return self._filter

    # -- lookups -------------------------------------------------------

    def lookup(self, txn: IndexTxn, mirror, band: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(band key, serial) of every entry, stored or mirrored, under these (band, key) pairs.

        ``key`` is sorted (each key once per band is enough), ``band`` the
        band of each. Stored entries are read in the table's order with one
        ``getmulti``; keys the filter surely lacks are not asked.
        """
        order = np.argsort(band, kind="stable")  # (band, key): the B-tree's order, walked front to back
        in_order_band, in_order_key = band[order], key[order]
        first = np.ones(len(in_order_key), dtype=bool)
        first[1:] = (in_order_key[1:] != in_order_key[:-1]) | (in_order_band[1:] != in_order_band[:-1])
        request = np.empty(int(first.sum()), dtype=KEY_ROW)
        request["band"], request["key"] = in_order_band[first], in_order_key[first]
        everything = request  # the rekeyed table is small and not in the filter
        wanted_band, wanted_key = request["band"], request["key"]
        band_filter = self._filter
        if band_filter is not None:
            maybe = band_filter.may_hold(in_order_key[first])
            wanted_band, wanted_key = wanted_band[maybe], wanted_key[maybe]
        buckets = np.empty(len(wanted_key), dtype=_BUCKET)
        buckets["band"], buckets["high"] = wanted_band, wanted_key >> np.uint64(16)
        buckets = np.unique(buckets)  # in table order
        cursor = txn.txn.cursor(db=txn.dbs["bands"])
        found = cursor.getmulti(_as_bytes_list(buckets), dupdata=True, dupfixed_bytes=_VALUE_BYTES,
                                keyfixed=True)
        _, stored_keys_, stored_serials = _decoded(np.frombuffer(found, dtype=_ENTRY))
        rekeyed = np.zeros(0, dtype=BAND_ROW)  # sites' first pages by their settled content
        if txn.txn.stat(txn.dbs["rekeyed"])["entries"]:
            found = txn.txn.cursor(db=txn.dbs["rekeyed"]).getmulti(_as_bytes_list(everything), dupdata=True,
                                                                   dupfixed_bytes=8, keyfixed=True)
            rekeyed = np.frombuffer(found, dtype=BAND_ROW)
        recent_keys, recent_serials = mirror.band_rows(key)
        return (np.concatenate((stored_keys_, rekeyed["key"].astype(np.uint64), recent_keys)),
                np.concatenate((stored_serials, rekeyed["serial"].astype(np.int64), recent_serials)))

    # -- changes -------------------------------------------------------

    def insert_slice(self, txn: IndexTxn, mirror, number: int, slices: int) -> None:
        """Write slice ``number`` of ``slices`` of the mirror's band entries (split by band, then by key)."""
        if not len(mirror.keys):
            return
        span = txn.index.signing.bands << 16  # (band, bucket), in table order
        where = (mirror.bands.astype(np.int64) << 16) | (mirror.keys >> np.uint64(16)).astype(np.int64)
        chosen = (where >= number * span // slices) & (where < (number + 1) * span // slices)
        pairs = _entries(mirror.bands[chosen], mirror.keys[chosen], mirror.serials[chosen]).view(_ENTRY_PAIR)
        txn.txn.cursor(db=txn.dbs["bands"]).putmulti(list(zip(pairs["key"].tolist(), pairs["value"].tolist())),
                                                      dupdata=True)

    def inserted(self, keys: np.ndarray) -> None:
        """After a merge committed: its keys are in the table, so the filter must hold them (and is saved)."""
        band_filter = self._filter
        if band_filter is not None:
            band_filter.add(keys)
            bandfilter.save(self.index, band_filter)

    def remove(self, txn: IndexTxn, serial: int, keys: np.ndarray) -> None:
        """Delete a kept document's entries (``keys``: its band keys, ``record_band_keys``)."""
        rows = _entries(np.arange(len(keys)), keys, np.full(len(keys), serial)).view(_ENTRY_PAIR)
        for key, value in zip(rows["key"].tolist(), rows["value"].tolist()):
            txn.delete("bands", key, value)

    def rebuilding(self) -> None:
        """Before the table is rebuilt from the records: no filter is trusted until one is built from it."""
        bandfilter.forget_saved(self.index)
        self._filter = None


def _as_bytes_list(rows: np.ndarray) -> list[bytes]:
    """Each row of a structured array as one bytes object (void fields keep trailing zero bytes)."""
    return rows.view(np.dtype((np.void, rows.dtype.itemsize))).tolist()
