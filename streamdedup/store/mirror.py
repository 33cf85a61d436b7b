"""The recent mirror: in memory, the lookup keys of documents decided since the last merge.

Inserting random keys into a B-tree dirties one page per key once the tree
is larger than a batch, and LMDB writes every dirty page at commit: at a
million documents a batch of 2,000 would rewrite ~100 MB of band table.
So a batch appends each new document's lookup keys (id hash, content hash,
band keys) to the ``recent`` table, keyed by serial: a sequential write.
The writer keeps the same entries in memory (``RecentMirror``, bounded by
``index.merge_every`` documents, with a bitmap of the keys it may hold that
answers most lookups) and every so many documents merges them (``merge``),
sorted, into the ``ids``, ``content`` and ``bands`` tables, then drops them
from ``recent``. A lookup asks the tables, the mirror, and the documents of
its own batch (``view``).

The ``recent`` table is the source of truth for the mirror: after a crash
the mirror is read back from it; readers (``query``) load their own.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..core.lsh import KEY_MASK, band_slots
from .candidates import ranges
from .hashed import entry
from .index import IndexTxn, content_key, from_u64

__all__ = ["RecentMirror", "pack_recent", "unpack_recent", "FRESH_ENTRIES", "KEY_BITS_LOG2"]


def pack_recent(ident: bytes, content: bytes, band_keys: bytes = b"") -> bytes:
    """A ``recent`` value: id hash (8 B), content hash (16 B), band keys (4 B each big-endian, kept documents only)."""
    return ident + content + band_keys


def unpack_recent(value: bytes) -> tuple[bytes, bytes, np.ndarray]:
    return value[:8], value[8:24], np.frombuffer(value[24:], dtype=">u4").astype(np.uint64)


class RecentMirror:
    """In memory: the lookup keys of documents decided since the last merge into the tables."""

    def __init__(self) -> None:
        self._first_of_id: dict[bytes, int] = {}  # ints, not lists: the garbage collector skips such a dict
        self._more_of_id: dict[bytes, list[int]] = {}  # later serials of the few ids seen more than once
        self.content: dict[bytes, int] = {}  # content hash -> its first mirrored document
        self._more_of_content: dict[bytes, list[int]] = {}  # later documents of the few contents seen again
        self._settled = _band_entries()  # (band slots sorted, serial of each, band of each)
        self._fresh: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # the same, one per latest batch
        self._fresh_entries = 0
        self._present = _KeyBits()  # which keys the mirror may hold: most asked keys are answered by it
        self.documents = 0
        self.last_serial = 0
        self._sorted: Optional[tuple[list, list]] = None  # (ids, content) as table entries, for merges

    @classmethod
    def load(cls, txn: IndexTxn) -> "RecentMirror":
        """Read the ``recent`` table back (at start, after a crash, or for a reader)."""
        mirror = cls()
        entries, kept_serials, kept_keys = [], [], []
        for key, value in txn.txn.cursor(db=txn.dbs["recent"]):
            serial = from_u64(key)
            ident, content, keys = unpack_recent(value)
            entries.append((serial, ident, content))
            if len(keys):
                kept_serials.append(serial)
                kept_keys.append(keys)
        bands = txn.index.signing.bands
        mirror.add(entries, np.array(kept_serials, dtype=np.int64),
                   np.array(kept_keys, dtype=np.uint64).reshape(len(kept_keys), bands))
        return mirror

    def add(self, entries: list[tuple[int, bytes, bytes]], kept_serials: np.ndarray, kept_keys: np.ndarray) -> None:
        """Take in committed documents: (serial, id hash, content hash) each, and the kept ones' band keys."""
        self._sorted = None
        first, content = self._first_of_id, self.content
        for serial, ident, digest in entries:
            if first.setdefault(ident, serial) != serial:
                self._more_of_id.setdefault(ident, []).append(serial)
            if content.setdefault(digest, serial) != serial:
                self._more_of_content.setdefault(digest, []).append(serial)
        if entries:
            self.last_serial = max(self.last_serial, entries[-1][0])
        self.documents += len(entries)
        if len(kept_serials):
            bands = np.tile(np.arange(kept_keys.shape[1], dtype=np.uint16), len(kept_serials))
            self._insert_sorted(band_slots(bands, kept_keys.ravel()), np.repeat(kept_serials, kept_keys.shape[1]),
                                bands)

    def serials_of_id(self, ident: bytes) -> list[int]:
        """The mirrored documents with this id hash, oldest first."""
        first = self._first_of_id.get(ident)
        if first is None:
            return []
        return [first, *self._more_of_id.get(ident, ())]

    def id_serials(self):
        """(id hash, its serials) of every mirrored document."""
        return ((ident, self.serials_of_id(ident)) for ident in self._first_of_id)

    @property
    def slots(self) -> np.ndarray:
        """(band, band key) of every mirrored kept document's entries (``band_slots``), sorted."""
        return self._folded()[0]

    @property
    def keys(self) -> np.ndarray:
        """The band key of each of ``slots``."""
        return self._folded()[0] & KEY_MASK

    @property
    def serials(self) -> np.ndarray:
        """The kept document of each of ``slots``."""
        return self._folded()[1]

    @property
    def bands(self) -> np.ndarray:
        """The band of each of ``slots``."""
        return self._folded()[2]

    def _insert_sorted(self, keys: np.ndarray, serials: np.ndarray, bands: np.ndarray) -> None:
        """File a batch's entries as one more small sorted run, and fold the runs in now and then.

        Inserting into one array as large as the mirror would move all of it
        for every batch; the large one moves once per ``FRESH_ENTRIES``
        entries, and a batch's own run is not moved until then.
        """
        order = np.argsort(keys)  # equal keys may come in any order: lookups and merges order them
        self._fresh.append((keys[order], serials[order], bands[order]))
        self._fresh_entries += len(keys)
        self._present.add(self._fresh[-1][0])
        if self._fresh_entries >= FRESH_ENTRIES:
            self._folded()

    def _folded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fresh runs merged into the settled entries (which are returned)."""
        if self._fresh:
            self._settled = _inserted(self._settled, _merged_runs(self._fresh))
            self._fresh, self._fresh_entries = [], 0
        return self._settled

    def band_rows(self, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, serial) of every mirrored band entry whose slot is in ``asked`` (``band_slots``, sorted,
        repeats allowed).

        Keys the mirror surely lacks (``_KeyBits``: most of them, the keys
        of new documents) are dropped first; each other key is searched
        once, in sorted order, which keeps the binary searches in cache.
        """
        if len(self._settled[0]) + self._fresh_entries == 0:
            return self._settled[0], self._settled[1]
        first = np.ones(len(asked), dtype=bool)
        first[1:] = asked[1:] != asked[:-1]
        first &= self._present.may_hold(asked)
        asked = asked[first]  # each key once (np.unique, which hashes, is slower here)
        found = [_rows_with_keys(keys, serials, asked) for keys, serials, _ in (self._settled, *self._fresh)]
        return np.concatenate([k for k, _ in found]), np.concatenate([s for _, s in found])

    def remove(self, serials: set[int]) -> None:
        """Forget these documents (after a commit that removed them from ``recent``)."""
        self._sorted = None
        remaining = {ident: [s for s in found if s not in serials] for ident, found in self.id_serials()}
        self._first_of_id = {ident: found[0] for ident, found in remaining.items() if found}
        self._more_of_id = {ident: found[1:] for ident, found in remaining.items() if len(found) > 1}
        for digest in [d for d, s in self.content.items() if s in serials]:
            later = [s for s in self._more_of_content.pop(digest, ()) if s not in serials]
            if later:  # the next document of that content becomes its first
                self.content[digest] = later[0]
                if later[1:]:
                    self._more_of_content[digest] = later[1:]
            else:
                del self.content[digest]
        for digest, later in list(self._more_of_content.items()):
            self._more_of_content[digest] = [s for s in later if s not in serials]
        self.drop_band_entries(serials)

    def drop_band_entries(self, serials: set[int]) -> None:
        """Take documents out of the mirrored band keys only (expired by retention)."""
        keys, owners, bands = self._folded()
        keep = ~np.isin(owners, np.fromiter(serials, dtype=np.int64, count=len(serials)))
        self._settled = keys[keep], owners[keep], bands[keep]

    def clear(self) -> None:
        self.__init__()

    def table_pairs(self) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes, bytes]]]:
        """The ids entries as sorted (key, value) pairs of their table (``hashed``), and the content entries
        as sorted (key, value, whole content hash) triples, made once per merge."""
        if self._sorted is None:
            ids = sorted(entry(ident, serial) for ident, serials in self.id_serials() for serial in serials)
            contents = sorted((*entry(content_key(c), serial), c) for c, first in self.content.items()
                              for serial in (first, *self._more_of_content.get(c, ())))
            self._sorted = ids, contents
        return self._sorted


FRESH_ENTRIES = 1 << 17  # band entries the small level of the mirror holds before it is folded in
KEY_BITS_LOG2 = 26  # the mirror's key presence map: 2^26 bits (8 MiB)


def _band_entries() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint16)


def _inserted(into: tuple, new: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted (keys, serials, bands) ``into`` with the sorted ``new`` ones merged in, after equal keys.

    ``np.insert`` with the same positions, for the three arrays at once: the
    positions are worked out once, not once per array.
    """
    at = np.searchsorted(into[0], new[0], "right")
    size = len(into[0]) + len(new[0])
    where = at + np.arange(len(at))  # where each new entry lands
    old = np.ones(size, dtype=bool)
    old[where] = False
    merged = []
    for before, added in zip(into, new):
        out = np.empty(size, dtype=before.dtype)
        out[where] = added
        out[old] = before
        merged.append(out)
    return tuple(merged)


def _merged_runs(runs: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted runs of (keys, serials, bands) as one, equal keys in run order (a stable sort merges the runs)."""
    if len(runs) == 1:
        return runs[0]
    order = np.argsort(np.concatenate([run[0] for run in runs]), kind="stable")
    return tuple(np.concatenate([run[field] for run in runs])[order] for field in range(3))


class _KeyBits:
    """Whether the mirror may hold a band key: one bit for each run of 64 of the 2^32 keys (8 MiB).

    A key whose bit is clear is surely not mirrored; bits stay set when
    entries leave (``remove``, retention), which only costs a search. At
    ``index.merge_every`` = 100,000 documents about 3% of the bits are set.
    Band slots (``band_slots``) are taken by their band key.
    """

    SHIFT = np.uint64(32 - KEY_BITS_LOG2)
    MASK = np.uint64((1 << KEY_BITS_LOG2) - 1)

    def __init__(self) -> None:
        self._bits = np.zeros(1 << (KEY_BITS_LOG2 - 3), dtype=np.uint8)

    def add(self, keys: np.ndarray) -> None:
        """Set the bits of ``keys`` (sorted by bit first, so that a byte's bits are OR-ed together: ``ufunc.at``
        is slow)."""
        numbers = np.sort(self._bit_numbers(keys))
        places = numbers >> 3
        starts = np.flatnonzero(np.concatenate(([True], places[1:] != places[:-1]))) if len(places) else places
        bits = np.left_shift(np.uint8(1), (numbers & 7).astype(np.uint8))
        self._bits[places[starts]] |= np.bitwise_or.reduceat(bits, starts) if len(starts) else bits

    def may_hold(self, keys: np.ndarray) -> np.ndarray:
        numbers = self._bit_numbers(keys)
        return ((self._bits[numbers >> 3] >> (numbers & 7).astype(np.uint8)) & 1).astype(bool)

    def _bit_numbers(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64, copy=False) >> self.SHIFT) & self.MASK).astype(np.int64)


def _rows_with_keys(keys: np.ndarray, serials: np.ndarray, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key, serial) of the entries of sorted ``keys`` that are in sorted, unique ``asked``."""
    if len(keys) == 0:
        return keys, serials
    lo = np.searchsorted(keys, asked, "left")
    found = keys[np.minimum(lo, len(keys) - 1)] == asked
    if not found.any():
        return keys[:0], serials[:0]
    lo = lo[found]
    index = ranges(lo, np.searchsorted(keys, asked[found], "right") - lo)
    return keys[index], serials[index]
