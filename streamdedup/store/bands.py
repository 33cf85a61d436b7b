"""The band tables: where kept documents are found by their band keys, and every path that touches them.

One dupsort table, ``bands``: the key is a band number (2 bytes) and a band
key (8 bytes), the value the serial of a kept document (8 bytes), all
big-endian so that keys sort by band, then band key. Only kept documents
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
from .index import Index, IndexTxn, from_u64

__all__ = ["BandTables", "band_entries", "stored_keys", "table_key", "KEY_ROW", "BAND_ROW"]

KEY_ROW = np.dtype([("band", ">u2"), ("key", ">u8")])  # a table key
BAND_ROW = np.dtype([("band", ">u2"), ("key", ">u8"), ("serial", ">u8")])  # a table key and one value
_BAND_PAIR = np.dtype([("key", "V10"), ("value", "V8")])  # the same row as LMDB key and value bytes


def table_key(band: int, key: int) -> bytes:
    """The table key of band key ``key`` in band ``band``."""
    return band.to_bytes(2, "big") + key.to_bytes(8, "big")


def band_entries(txn: IndexTxn) -> Iterator[tuple[int, bytes, int]]:
    """Every (band, band key bytes, serial) of the table, in table order."""
    for key, value in txn.txn.cursor(db=txn.dbs["bands"]):
        yield int.from_bytes(key[:2], "big"), key[2:], from_u64(value)


def stored_keys(txn: IndexTxn, chunk: int) -> Iterator[np.ndarray]:
    """Every band key stored in the table, each once per band, as uint64 arrays of at most ``chunk`` keys."""
    keys = txn.txn.cursor(db=txn.dbs["bands"]).iternext_nodup(keys=True, values=False)
    while rows := list(itertools.islice(keys, chunk)):
        yield np.frombuffer(b"".join(rows), dtype=KEY_ROW)["key"].astype(np.uint64)


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
        band_filter = self._filter
        if band_filter is not None:
            request = request[band_filter.may_hold(in_order_key[first])]
        cursor = txn.txn.cursor(db=txn.dbs["bands"])
        stored = cursor.getmulti(_as_bytes_list(request), dupdata=True, dupfixed_bytes=8, keyfixed=True)
        stored = np.frombuffer(stored, dtype=BAND_ROW)
        rekeyed = np.zeros(0, dtype=BAND_ROW)  # sites' first pages by their settled content
        if txn.txn.stat(txn.dbs["rekeyed"])["entries"]:
            found = txn.txn.cursor(db=txn.dbs["rekeyed"]).getmulti(_as_bytes_list(everything), dupdata=True,
                                                                   dupfixed_bytes=8, keyfixed=True)
            rekeyed = np.frombuffer(found, dtype=BAND_ROW)
        recent_keys, recent_serials = mirror.band_rows(key)
        return (np.concatenate((stored["key"].astype(np.uint64), rekeyed["key"].astype(np.uint64), recent_keys)),
                np.concatenate((stored["serial"].astype(np.int64), rekeyed["serial"].astype(np.int64),
                                recent_serials)))

    # -- changes -------------------------------------------------------

    def insert_slice(self, txn: IndexTxn, mirror, number: int, slices: int) -> None:
        """Write slice ``number`` of ``slices`` of the mirror's band entries (split by band, then by key)."""
        if not len(mirror.keys):
            return
        span = txn.index.signing.bands << 16  # (band, first two key bytes), in table order
        where = (mirror.bands.astype(np.int64) << 16) | (mirror.keys >> np.uint64(48)).astype(np.int64)
        chosen = (where >= number * span // slices) & (where < (number + 1) * span // slices)
        pairs = _band_pairs(mirror.bands[chosen], mirror.keys[chosen], mirror.serials[chosen])
        txn.txn.cursor(db=txn.dbs["bands"]).putmulti(pairs, dupdata=True)

    def inserted(self, keys: np.ndarray) -> None:
        """After a merge committed: its keys are in the table, so the filter must hold them (and is saved)."""
        band_filter = self._filter
        if band_filter is not None:
            band_filter.add(keys)
            bandfilter.save(self.index, band_filter)

    def remove(self, txn: IndexTxn, serial: int, band_keys: bytes) -> None:
        """Delete a kept document's entries (``band_keys``: its record's band keys)."""
        value = serial.to_bytes(8, "big")
        for band, key in enumerate(np.frombuffer(band_keys, dtype=">u8").tolist()):
            txn.delete("bands", table_key(band, key), value)

    def rebuilding(self) -> None:
        """Before the table is rebuilt from the records: no filter is trusted until one is built from it."""
        bandfilter.forget_saved(self.index)
        self._filter = None


def _band_pairs(bands: np.ndarray, keys: np.ndarray, serials: np.ndarray) -> list[tuple[bytes, bytes]]:
    """Table (key, value) bytes, in the table's order (band, key, serial)."""
    entries = np.empty(len(keys), dtype=BAND_ROW)
    entries["band"], entries["key"], entries["serial"] = bands, keys, serials
    entries = entries[np.lexsort((entries["serial"], entries["key"], entries["band"]))]
    pairs = entries.view(_BAND_PAIR)
    return list(zip(pairs["key"].tolist(), pairs["value"].tolist()))


def _as_bytes_list(rows: np.ndarray) -> list[bytes]:
    """Each row of a structured array as one bytes object (void fields keep trailing zero bytes)."""
    return rows.view(np.dtype((np.void, rows.dtype.itemsize))).tolist()
