"""Lookups by id, content and band key: hash-keyed tables plus a write-behind log of recent documents.

Inserting random keys into a B-tree dirties one page per key once the tree
is larger than a batch, and LMDB writes every dirty page at commit: at a
million documents a batch of 2,000 would rewrite ~100 MB of band table.
So a batch appends each new document's lookup keys (id hash, content hash,
band keys) to the ``recent`` table, keyed by serial: a sequential write.
The writer keeps the same entries in memory (``RecentMirror``, bounded by
``index.merge_every`` documents, with a bitmap of the keys it may hold that
answers most lookups) and every so many documents merges them,
sorted, into the ``ids``, ``content`` and ``bands`` tables in one
transaction, then drops them from ``recent``. A lookup asks the tables, the
mirror, and the documents of its own batch.

The ``recent`` table is the source of truth for the mirror: after a crash
the mirror is read back from it; readers (``query``) load their own.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

import msgpack
import numpy as np

from ..core import eliasfano
from ..errors import IndexFullError
from .hashed import entry, serials_of_many
from .index import MAX_SERIAL, DocRecord, IndexTxn, content_key, from_u64, serial_key, u64

if TYPE_CHECKING:
    from .bands import BandTables

__all__ = ["RecentMirror", "BatchView", "Hits", "SharedKeys", "write_documents", "first_documents", "keys_shared_within",
           "batch_band_keys", "room_under", "file_kept", "chosen_candidates", "with_extra_candidates", "earliest_of_each_key", "merge_recent",
           "merge_slice", "merge_slices", "finish_merge", "pack_recent", "unpack_recent", "band_slots", "KEY_MASK"]

KEY_MASK = np.uint64(0xFFFFFFFF)


def band_slots(bands: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each (band, 32-bit band key) as one number, ``band << 32 | key``: what a lookup matches.

    A band key's value is unique to its band only up to chance (one pair of
    bands in 2^32), and the band table files keys under their band: every
    lookup in memory (the recent mirror, the batch's own rows) matches the
    pair too, so that where a document is filed never changes what it finds.
    """
    return (bands.astype(np.uint64) << np.uint64(32)) | keys.astype(np.uint64)


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
    index = _ranges(lo, np.searchsorted(keys, asked[found], "right") - lo)
    return keys[index], serials[index]


def _coded(shingles: list[np.ndarray]) -> list[bytes]:
    """The stored form of each kept document's shingles (``eliasfano``), coded in one call."""
    if not shingles:
        return []
    offsets = np.zeros(len(shingles) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in shingles], out=offsets[1:])
    return eliasfano.encode_many(np.concatenate(shingles), offsets)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1`` for every i, concatenated."""
    return np.repeat(starts, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))


MERGE_SLICE_BYTES = 32 << 20  # 32 MiB: table pages one merge transaction may dirty, about


def merge_slices(bands_table_bytes: int, bands: int) -> int:
    """How many transactions a merge is split into, so each dirties a bounded part of the tables.

    LMDB keeps a transaction's dirty pages in memory until it commits: one
    transaction merging into a large band table would hold most of it.
    """
    per_band = -(-bands_table_bytes // (bands * MERGE_SLICE_BYTES))
    return bands * max(1, per_band)


def merge_slice(txn: IndexTxn, mirror: RecentMirror, bands: "BandTables", number: int, slices: int) -> None:
    """Merge slice ``number`` of ``slices`` of the mirrored entries into the ids, content and bands tables.

    Slices split the band tables by band, then by key, and the id and content
    tables by their first two bytes. Merging an entry twice changes nothing,
    so a merge interrupted by a crash is simply done again from ``recent``.
    """
    low, high = (number << 16) // slices, ((number + 1) << 16) // slices  # of the first two key bytes
    raw, dbs = txn.txn, txn.dbs
    if not txn.counters["merging"]:  # until ``finish_merge``: the mirror's entries may be in the tables too
        txn.count(merging=1)
    ids, contents = mirror.table_pairs()
    raw.cursor(db=dbs["ids"]).putmulti(_prefix_range(ids, low, high), dupdata=True)
    raw.cursor(db=dbs["content"]).putmulti([(key, value) for key, value, _ in _prefix_range(contents, low, high)],
                                           dupdata=True)
    bands.insert_slice(txn, mirror, number, slices)


def _stored_first_documents(txn: IndexTxn, contents: list[bytes],
                           record: Callable[[int], DocRecord]) -> dict[bytes, int]:
    """The content table's document of each of these whole content hashes it holds.

    The table is keyed by 8 bytes of the hash, which two contents may share:
    each hit's record (read by ``record``) must have the whole hash.
    """
    held = serials_of_many(txn, "content", [content_key(c) for c in contents])
    found = {}
    for c in contents:
        serial = next((s for s in held.get(content_key(c), ()) if record(s).content == c), None)
        if serial is not None:
            found[c] = serial
    return found


def first_documents(txn: IndexTxn, mirror: RecentMirror, contents: list[bytes],
                    record: Callable[[int], DocRecord]) -> dict[bytes, int]:
    """The first document of each content hash: the content table's, else the mirror's."""
    found = _stored_first_documents(txn, contents, record)
    for c in contents:
        if c not in found and c in mirror.content:
            found[c] = mirror.content[c]
    return found


def finish_merge(txn: IndexTxn, mirror: RecentMirror) -> None:
    """After every slice: empty ``recent`` up to the mirror's last document and record how far merges went."""
    cursor = txn.txn.cursor(db=txn.dbs["recent"])
    while cursor.first() and from_u64(cursor.key()) <= mirror.last_serial:
        cursor.delete()
    txn.count(merged_upto=mirror.last_serial - txn.counters.get("merged_upto", 0), merging=-txn.counters["merging"])


def merge_recent(txn: IndexTxn, mirror: RecentMirror, bands: "BandTables") -> None:
    """The whole merge in one transaction (for small indexes and ``check --fix``)."""
    merge_slice(txn, mirror, bands, 0, 1)
    finish_merge(txn, mirror)


def _prefix_range(pairs: list[tuple[bytes, bytes]], low: int, high: int) -> list[tuple[bytes, bytes]]:
    """The sorted pairs whose key starts with two bytes in [low, high)."""
    begin = bisect.bisect_left(pairs, (low.to_bytes(2, "big"),))
    end = len(pairs) if high > 0xFFFF else bisect.bisect_left(pairs, (high.to_bytes(2, "big"),))
    return pairs[begin:end]


class BatchView:
    """One batch's view of the index: tables and mirror read in bulk, the batch's own writes on top.

    Everything a batch needs is read with one ``getmulti`` per table, and
    written with one ``putmulti`` per table by ``flush``; look-alikes within
    the batch come from one vectorized pass over its band keys.
    """

    def __init__(self, txn: IndexTxn, mirror: RecentMirror, id_keys: list[bytes], contents: list[bytes],
                 band_keys: np.ndarray, bands: "BandTables", per_key: Optional[int] = None, min_shared: int = 1):
        """``per_key``: a band key proposes at most this many kept documents, the earliest (committed ones
        first, then the batch's own: ``room_under``). ``min_shared``: fewer shared bands make no candidate
        (``candidate_parts``)."""
        self.per_key = per_key
        self.min_shared = min_shared
        self._strong: Optional["Hits"] = None  # the hits sharing at least min_shared bands
        self.txn = txn
        self.mirror = mirror
        self.bands = bands
        self._raw = txn.txn
        self.dbs = txn.dbs
        self._band_keys = self._signed_keys = band_keys
        self._committed_records: dict[int, DocRecord] = {}  # records of committed documents read by this batch
        self._ids = self._fetch_ids(id_keys)
        self._content = self._fetch_content(contents)
        self._hits: Optional["Hits"] = None  # fetched at the first ``candidates``
        self._rekeyed_rows: frozenset = frozenset()  # rows looked up by other keys than their signed ones
        self._kept_by_key: dict[int, list[int]] = {}  # band slot -> serials of the batch's kept documents
        self._shared_keys: dict[int, list[int]] = {}  # row -> its band slots another row of the batch has too
        self._room: dict[int, int] = {}  # band slot shared within the batch -> kept documents it may still propose
        self._shingles: dict[int, np.ndarray] = {}  # serial -> shingles: the batch's kept documents
        self._committed_shingles: dict[int, np.ndarray] = {}  # and those of committed ones read by this batch
        self._kept_rows: dict[int, int] = {}  # batch row -> serial, for the batch's kept documents
        self._inserted: list[tuple[DocRecord, bytes]] = []  # (record, id hash) in decision order = serial order
        self._first_serial = txn.counters["next_serial"] + 1

    # -- bulk reads ----------------------------------------------------

    def _fetch_ids(self, keys: list[bytes]) -> dict[bytes, list[int]]:
        found = serials_of_many(self.txn, "ids", keys)
        for k in keys:
            recent = self.mirror.serials_of_id(k)
            if recent:
                found[k] = sorted(set(found.get(k, [])) | set(recent))
        return found

    def _fetch_content(self, contents: list[bytes]) -> dict[bytes, int]:
        return first_documents(self.txn, self.mirror, contents, self._committed_record)

    def use_band_keys(self, band_keys: np.ndarray) -> None:
        """Look documents up by these band keys instead (before the first ``candidates``): content keys."""
        if self._hits is not None:
            raise ValueError("band keys are fixed once candidates were asked for")
        self._band_keys = band_keys

    def _band_hits(self) -> "Hits":
        """Committed candidates of the whole batch, fetched once, per row."""
        if self._hits is None:
            band_keys = self._band_keys
            asked, rows, _ = batch_band_keys(band_keys)  # the batch's slots sorted, once for every lookup
            self._shared_keys = keys_shared_within(asked, rows)
            self._hits = self._fetch_candidates(asked, rows)
            self._strong = self._hits.at_least(self.min_shared)
            self._band_key_bytes = band_keys.astype(">u4")
            self._rekeyed_rows = _rows_differing(band_keys, self._signed_keys)
        return self._hits

    def _fetch_candidates(self, asked: np.ndarray, rows: np.ndarray) -> "Hits":
        """Per document: serials of committed kept documents sharing a band, and how many bands each.

        ``asked`` is the batch's band slots sorted (searching sorted keys is
        several times faster than searching them in batch order), ``rows``
        the row of each. Also how many more kept documents each slot shared
        within the batch may propose (``room_under``).
        """
        found_keys, found_serials = self.bands.lookup(self.txn, self.mirror, asked)
        if self.per_key is not None:
            self._room = room_under(self._shared_keys.slots(), found_keys, self.per_key)
        return Hits.found(asked, rows, len(self._band_keys), found_keys, found_serials, self.per_key)

    # -- what the batch sees -------------------------------------------

    def serials_of_id(self, key: bytes) -> Sequence[int]:
        return self._ids.get(key, ())

    def unseen(self, ident: bytes, content: bytes) -> bool:
        """Neither this id hash nor this content hash was decided before (in the index or this batch)."""
        return ident not in self._ids and content not in self._content

    def serial_of_content(self, content: bytes) -> Optional[int]:
        return self._content.get(content)

    def candidates(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Kept documents (committed, or earlier in this batch) sharing a band with row ``row``, and how many.

        The batch's own kept documents are found through the band keys they
        share with other rows (``_shared_keys``, found once for the batch;
        most rows share none), filed as they are decided (``_kept_by_key``):
        a row's cost is one look-up per shared key and the kept documents
        found there, however many earlier rows of the batch share them (a
        crawler trap's pages share nearly every key); a key gives at most
        ``per_key`` of them.
        """
        return with_extra_candidates(*self.candidate_parts(row, weak=True))

    def candidate_parts(self, row: int, weak: bool = False) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """``candidates`` before they are put together: the committed ones (ascending serials, shared bands of
        each) and the batch's own, once for each band key they share (``chosen_candidates`` takes these).

        Committed ones sharing fewer than ``min_shared`` bands are left out
        unless ``weak``: say so when more candidates will be added that may
        be among them (the batch's own never are).
        """
        serials, shared = (self._band_hits() if weak else self._strong_hits()).of(row)
        kept_by_key = self._kept_by_key
        extra = [serial for key in self._shared_keys.get(row, ()) for serial in kept_by_key.get(key, ())]
        return serials, shared, extra

    def may_have_candidates(self, row: int, weak: bool = False) -> bool:
        """False when row ``row`` surely has no candidate: no committed kept document shares ``min_shared``
        band keys with it (any, if ``weak``) and no other row of the batch has one of its keys (most rows);
        ``candidate_parts`` then gives none."""
        bounds = (self._band_hits() if weak else self._strong_hits()).bounds
        return bounds[row] != bounds[row + 1] or row in self._shared_keys

    def _strong_hits(self) -> "Hits":
        self._band_hits()
        return self._strong

    def band_keys_of(self, row: int) -> np.ndarray:
        """The band keys row ``row`` is looked up by."""
        return self._band_keys[row]

    def record_band_keys(self, row: int) -> bytes:
        """The band keys of batch row ``row`` as a kept document's record stores them: none when they are
        those of its shingles (``bands.record_band_keys`` signs them again)."""
        self._band_hits()
        if row not in self._rekeyed_rows:
            return b""
        return self._band_key_bytes[row].tobytes()

    def record(self, serial: int) -> DocRecord:
        """A decided document's record; a committed one is read once per batch (a match is read again to name it)."""
        position = serial - self._first_serial  # the batch's documents have consecutive serials
        if 0 <= position < len(self._inserted):
            return self._inserted[position][0]
        return self._committed_record(serial)

    def _committed_record(self, serial: int) -> DocRecord:
        found = self._committed_records.get(serial)
        if found is None:
            found = self._committed_records[serial] = self.txn.record(serial)
        return found

    def shingles(self, serial: int) -> np.ndarray:
        """A kept document's stored shingles (decoded once per batch)."""
        found = self._shingles.get(serial)
        if found is None:
            found = self._committed_shingles.get(serial)
        if found is None:
            found = self._committed_shingles[serial] = self.txn.shingles(serial)
        return found

    # -- the batch's writes --------------------------------------------

    def next_serial(self) -> int:
        return self._first_serial + len(self._inserted)

    def insert(self, record: DocRecord, ident: bytes, row: int, shingles: Optional[np.ndarray] = None) -> None:
        """Record a decided document of batch row ``row``; a kept one also becomes a band candidate."""
        serial = record.serial
        self._inserted.append((record, ident))
        same_id = self._ids.get(ident)
        if same_id is None:
            self._ids[ident] = [serial]
        else:
            same_id.append(serial)
        self._content.setdefault(record.content, serial)
        if record.kept:
            self._kept_rows[row] = serial
            self._shingles[serial] = shingles
            self._band_hits()
            file_kept(self._kept_by_key, self._shared_keys.get(row, ()), serial, self._room, self.per_key)

    def flush(self) -> Callable[[], None]:
        """Write the batch into the transaction; returns what to do to the mirror once it commits."""
        self._band_hits()
        return write_documents(self.txn, self.mirror, self._inserted, self._kept_rows, self._shingles,
                               self._band_keys)


def write_documents(txn: IndexTxn, mirror: RecentMirror, inserted: list[tuple[DocRecord, bytes]],
                    kept_rows: dict[int, int], shingles: dict[int, np.ndarray], band_keys: np.ndarray,
                    numbered: Optional[int] = None) -> Callable[[], None]:
    """Write decided documents into the transaction; returns what to do to the mirror once it commits.

    ``inserted``: (record, id hash) in serial order; ``kept_rows``: batch row -> serial of the kept ones,
    ``shingles`` theirs by serial, ``band_keys`` the batch's lookup keys (rows x bands). ``numbered``: how
    many serials the batch used (default: one per document; a shard stores only its own documents of a
    batch numbered for the whole deployment).
    """
    packer = msgpack.Packer()
    if inserted and inserted[-1][0].serial > MAX_SERIAL:
        raise IndexFullError(f"the index has numbered {MAX_SERIAL:,} documents, as many as it can; start a new "
                             "index (or shard the input) and keep this one for lookups")
    keys = [serial_key(record.serial) for record, _ in inserted]
    kept = len(kept_rows)
    kept_row_array = np.fromiter(kept_rows.keys(), dtype=np.int64, count=kept)
    kept_serials = np.fromiter(kept_rows.values(), dtype=np.int64, count=kept)
    kept_keys = band_keys[kept_row_array]
    recent_keys = dict(zip(kept_serials.tolist(), (row.tobytes() for row in kept_keys.astype(">u4"))))
    pack = txn.pack_record
    writes = {  # every table but members gets serials in increasing order: appended
        "docs": [(key, pack(record, packer)) for key, (record, _) in zip(keys, inserted)],
        "recent": [(u64(record.serial), pack_recent(ident, record.content, recent_keys.get(record.serial, b"")))
                   for record, ident in inserted],
        "shingles": list(zip(map(u64, shingles), _coded(list(shingles.values())))),
        "members": sorted((serial_key(record.cluster), key) for key, (record, _) in zip(keys, inserted)
                          if not record.kept),
    }
    raw, dbs = txn.txn, txn.dbs
    for name, items in writes.items():
        if items:
            cursor = raw.cursor(db=dbs[name])
            cursor.putmulti(items, dupdata=True, append=name != "members")
    exact = sum(record.exact for record, _ in inserted)
    txn.count(next_serial=len(inserted) if numbered is None else numbered, documents=len(inserted), kept=kept,
              duplicates=len(inserted) - kept, exact=exact)
    entries = [(record.serial, ident, record.content) for record, ident in inserted]
    return lambda: mirror.add(entries, kept_serials, kept_keys)


def with_extra_candidates(serials: np.ndarray, shared: np.ndarray, extra: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Candidates (ascending serials, shared bands of each) with ``extra`` serials added, each one band more."""
    if not len(extra):
        return serials, shared
    counts = dict(zip(serials.tolist(), shared.tolist()))
    for serial in extra:
        counts[serial] = counts.get(serial, 0) + 1
    ordered = sorted(counts)
    return np.array(ordered, dtype=np.int64), np.array([counts[s] for s in ordered], dtype=np.int64)


def chosen_candidates(serials: np.ndarray, shared: np.ndarray, extra: Iterable[int], min_shared: int,
                      matchable: Optional[Callable[[int], bool]], limit: int) -> tuple[list[int], int]:
    """The candidates a document verifies, and how many it has before ``limit``.

    ``serials`` (sharing ``shared`` bands each) and the ``extra`` serials
    (each one band more every time it comes), those sharing at least
    ``min_shared`` bands and ``matchable`` (None: all), the ``limit``
    sharing the most (ties: the earliest), ascending unless cut to
    ``limit``. In plain Python: a document has a handful, and numpy's cost
    per call on arrays that small is several times the work.
    """
    counts = dict(zip(serials.tolist(), shared.tolist()))
    for serial in extra:
        counts[serial] = counts.get(serial, 0) + 1
    if min_shared > 1:
        counts = {serial: n for serial, n in counts.items() if n >= min_shared}
    if matchable is not None:
        counts = {serial: n for serial, n in counts.items() if matchable(serial)}
    chosen = sorted(counts)
    if len(chosen) > limit:
        chosen = sorted(chosen, key=lambda serial: -counts[serial])[:limit]  # stable: the earliest of a tie first
    return chosen, len(counts)


class Hits:
    """The committed kept documents sharing band keys with each document of a batch."""

    _NONE = np.zeros(0, np.int64)

    def __init__(self, serials: np.ndarray, shared: np.ndarray, bounds: list[int]):
        self.serials, self.shared, self.bounds = serials, shared, bounds

    def of(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Serials sharing a band with document ``row`` (ascending), and how many bands each."""
        begin, end = self.bounds[row], self.bounds[row + 1]
        if begin == end:
            return self._NONE, self._NONE
        return self.serials[begin:end], self.shared[begin:end]

    def at_least(self, shared: int) -> "Hits":
        """These hits without the documents that share fewer than ``shared`` bands with their row.

        Most hits of a row are such chance meetings (one band of many); a
        row left with none is then surely kept without a look, unless other
        candidates come and add a band to them (pages rekeyed in the batch).
        """
        if shared <= 1 or len(self.shared) == 0:
            return self
        keep = self.shared >= shared
        before = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=before[1:])
        return Hits(self.serials[keep], self.shared[keep], before[np.asarray(self.bounds)].tolist())

    @classmethod
    def found(cls, asked: np.ndarray, rows: np.ndarray, n: int, found_keys: np.ndarray, found_serials: np.ndarray,
              per_key: Optional[int] = None):
        """From the batch's sorted keys ``asked`` (each of document ``rows[i]``) and the (key, serial) rows found.

        ``per_key`` keeps only the earliest so many serials of each key (None: all). A key that many kept
        documents hold (a crawler trap's template, a hot bucket) would otherwise hand each document of
        the batch all of them, and the work per document would grow with the trap.
        """
        if len(found_keys) == 0:
            return cls(cls._NONE, cls._NONE, [0] * (n + 1))
        lo, counts = _places(asked, found_keys)
        if per_key is not None and _most_of_one_key(lo, counts) > per_key:
            found_keys, found_serials = earliest_of_each_key(found_keys, found_serials, per_key)
            lo, counts = _places(asked, found_keys)
        doc = rows[_ranges(lo, counts)]
        serial = np.repeat(found_serials, counts)
        pairs, shared = np.unique((doc << 40) | serial, return_counts=True)
        bounds = np.searchsorted(pairs >> 40, np.arange(n + 1)).tolist()
        return cls(pairs & ((1 << 40) - 1), shared, bounds)


def _places(asked: np.ndarray, found_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each found key is in the sorted ``asked`` keys: its first place and how many places (0: not
    asked). Searched this way round, as found keys are a few of those asked."""
    lo = np.searchsorted(asked, found_keys, "left")
    return lo, np.searchsorted(asked, found_keys, "right") - lo


def _most_of_one_key(lo: np.ndarray, counts: np.ndarray) -> int:
    """The most (key, serial) rows found of any one asked key (``_places``)."""
    asked = lo[counts > 0]
    return int(np.bincount(asked).max()) if len(asked) else 0


def _rows_differing(keys: np.ndarray, signed: np.ndarray) -> frozenset:
    """The rows whose lookup keys are not their signed ones (content keys of pages with a template left out)."""
    if keys is signed:
        return frozenset()
    return frozenset(np.flatnonzero((keys != signed).any(axis=1)).tolist())


def batch_band_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's lookup keys (rows x bands) as band slots (``band_slots``) sorted, the row of each and its band.

    The answer for the last array asked is kept: a shard asks for the same
    batch's in its evidence and again in its decision (the sort is a tenth
    of each).
    """
    global _last_sorted
    last = _last_sorted  # one read: threads (shards in one process, in tests) may replace it meanwhile
    if last is not None and last[0] is keys:
        return last[1]
    slots = band_slots(np.arange(keys.shape[1], dtype=np.uint64)[None, :], keys).ravel()
    by_slot = np.argsort(slots)
    answer = slots[by_slot], by_slot // keys.shape[1], (by_slot % keys.shape[1]).astype(np.uint16)
    _last_sorted = (keys, answer)
    return answer


_last_sorted: Optional[tuple] = None  # (keys, batch_band_keys(keys)) of the last keys asked


def room_under(slots: np.ndarray, found_slots: np.ndarray, per_key: int) -> dict[int, int]:
    """How many more kept documents each of ``slots`` may propose: ``per_key`` less the committed ones found
    under it (``found_slots``, one per entry), for the slots some found ones hold."""
    if not len(slots) or not len(found_slots):
        return {}
    held, count = np.unique(found_slots[np.isin(found_slots, slots)], return_counts=True)
    return dict(zip(held.tolist(), np.maximum(per_key - count, 0).tolist()))


def file_kept(kept_by_key: dict[int, list[int]], slots, serial: int, room: dict[int, int],
              per_key: Optional[int]) -> None:
    """File a kept document of the batch under its ``slots`` that later rows share, each while the slot may
    propose more (``room``, else ``per_key``; None: no limit).

    This is the one meaning of the per-key limit, whatever the batch: a band
    key proposes its earliest ``per_key`` kept documents, the committed ones
    (found, cut to the earliest ``per_key``: ``Hits.found``) before the
    batch's own. The batch's own are held only while room is left, so a
    document finds what it would find had the batch been cut anywhere else.
    """
    for slot in slots:
        holders = kept_by_key.setdefault(slot, [])
        if per_key is None or len(holders) < room.get(slot, per_key):
            holders.append(serial)


def keys_shared_within(asked: np.ndarray, rows: np.ndarray) -> "SharedKeys":
    """For each row, its band keys that another row of the batch has too (``asked``: the batch's keys
    sorted, ``rows[i]`` the row of ``asked[i]``); most rows of a batch have none."""
    same = asked[1:] == asked[:-1]
    in_run = np.zeros(len(asked), dtype=bool)
    in_run[1:] |= same
    in_run[:-1] |= same
    return SharedKeys(rows[in_run], asked[in_run])


class SharedKeys:
    """Rows and the band keys each shares with another row of its batch (``keys_shared_within``), read as
    a dict row -> keys; a row's list is made when asked for, as few rows are looked at one by one."""

    def __init__(self, rows: np.ndarray, keys: np.ndarray):
        order = np.argsort(rows, kind="stable")
        rows, self._keys = rows[order], keys[order]
        starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1]))) if len(rows) else order
        ends = np.append(starts[1:], len(rows))
        self._at = dict(zip(rows[starts].tolist(), zip(starts.tolist(), ends.tolist())))

    def __contains__(self, row: int) -> bool:
        return row in self._at

    def __iter__(self):
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def get(self, row: int, default=()):
        at = self._at.get(row)
        return default if at is None else self._keys[at[0]:at[1]].tolist()

    def slots(self) -> np.ndarray:
        """Every band slot some row shares with another (with repeats)."""
        return self._keys


def earliest_of_each_key(keys: np.ndarray, serials: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(key, serial) pairs sorted by key, then serial, each key keeping its first ``limit`` (the smallest serials)."""
    order = np.lexsort((serials, keys))
    keys, serials = keys[order], serials[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    rank = np.arange(len(keys)) - np.repeat(starts, np.diff(np.append(starts, len(keys))))
    kept = rank < limit
    return keys[kept], serials[kept]
