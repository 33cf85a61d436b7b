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
from ``recent``. A merge takes a slice after each batch: meanwhile the
generation being merged (``merging``, frozen) answers for what its slices
not written yet hold, and a new generation takes the new documents. A
lookup asks the tables, the mirror, and the documents of its own batch
(``view``), and finds each entry once.

The ``recent`` table is the source of truth for the mirror: after a crash
the mirror is read back from it; readers (``query``) load their own.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..core.lsh import KEY_MASK, band_slots
from .candidates import ranges
from .hashed import entry
from .index import IndexTxn, content_key, from_u64, u64

try:
    from ..core import _kernel
except ImportError:  # built without a C compiler: numpy does it
    _kernel = None

__all__ = ["KeyPlaces", "RecentMirror", "merged_thresholds", "SortedEntries", "pack_recent", "unpack_recent", "place_masks", "placed_entries", "FRESH_ENTRIES",
           "KEY_BITS_LOG2"]


def pack_recent(ident: bytes, content: bytes, band_keys: bytes = b"", places: Optional[int] = None) -> bytes:
    """A ``recent`` value: id hash (8 B), content hash (16 B), band keys (4 B each big-endian), and for a
    duplicate the bands whose keys it took a place under (8 B, bit ``band``; ``candidates.file_prober``).
    A kept document has every band's entry; a forgotten duplicate keeps its places alone (no hashes)."""
    if places is None:
        return ident + content + band_keys
    return ident + content + band_keys + places.to_bytes(8, "big")


def unpack_recent(value: bytes, bands: int) -> tuple[Optional[bytes], Optional[bytes], np.ndarray, Optional[int]]:
    """(id hash, content hash, band keys, places) of a ``recent`` value (``pack_recent``): hashes None for a
    forgotten duplicate's places, places None for a kept document's entries (and for no band keys)."""
    width = 4 * bands
    if len(value) == width + 8:
        return None, None, _keys(value[:width]), int.from_bytes(value[width:], "big")
    places = int.from_bytes(value[24 + width:], "big") if len(value) == 24 + width + 8 else None
    return value[:8], value[8:24], _keys(value[24:24 + width]), places


def _keys(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=">u4").astype(np.uint64)


def place_masks(filed: np.ndarray) -> list[int]:
    """The bands each row of ``candidates.filed_places`` (rows x bands, at most 64) takes places under, as
    bits (band 0: the lowest)."""
    if not filed.any():
        return [0] * len(filed)
    weights = np.left_shift(np.uint64(1), np.arange(filed.shape[1], dtype=np.uint64))
    return np.bitwise_or.reduce(np.where(filed, weights, np.uint64(0)), axis=1).tolist()


def placed_entries(serials: list[int], keys: list[np.ndarray], masks: list[int]) -> tuple[np.ndarray, ...]:
    """(serials, bands, band keys) of the places of duplicates: ``keys`` each's band keys, ``masks`` its bands."""
    if not serials:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint16), np.zeros(0, dtype=np.uint64)
    bands = len(keys[0])
    bits = np.array(masks, dtype=np.uint64)[:, None] >> np.arange(bands, dtype=np.uint64)[None, :]
    rows, band = np.nonzero(bits & np.uint64(1))
    matrix = np.array(keys, dtype=np.uint64).reshape(len(keys), bands)
    return (np.asarray(serials, dtype=np.int64)[rows], band.astype(np.uint16), matrix[rows, band])


class RecentMirror:
    """In memory: the lookup keys of documents decided since the last merge into the tables."""

    def __init__(self) -> None:
        self._first_of_id: dict[bytes, int] = {}  # ints, not lists: the garbage collector skips such a dict
        self._more_of_id: dict[bytes, list[int]] = {}  # later serials of the few ids seen more than once
        self.content: dict[bytes, int] = {}  # content hash -> its first mirrored document
        self._more_of_content: dict[bytes, list[int]] = {}  # later documents of the few contents seen again
        self._settled = SortedEntries()  # (band slot, serial) of the entries folded in, sorted by slot
        self._middle = SortedEntries()  # the same, of the runs folded in since it last went into ``_settled``
        self._fresh: list[tuple[np.ndarray, np.ndarray]] = []  # the same, one sorted run per latest batch
        self._fresh_entries = 0
        self._present = _KeyBits()  # which keys the mirror may hold: most asked keys are answered by it
        self.documents = 0
        self.last_serial = 0
        self._sorted: Optional[tuple[list, list]] = None  # (ids, content) as table entries, for merges
        self.merging: Optional["RecentMirror"] = None  # the generation before, while it is merged (``merge``)
        self._merged_slots = 0  # its band slots below this are in the tables (``merged_below``)...
        self._merged_prefix = 0  # ...and its id and content hashes whose first two bytes are below this

    @classmethod
    def load(cls, txn: IndexTxn) -> "RecentMirror":
        """Read the ``recent`` table back (at start, after a crash, or for a reader). A vshard's state
        (``vshardstate``) has none: every entry of it is in its tables, so nothing is mirrored."""
        mirror = cls()
        if "recent" not in txn.dbs:
            return mirror
        counters = txn.counters
        merged, upto = counters["merged_upto"], counters.get("merge_upto", 0)
        if counters["merging"] and upto > merged:  # a merge spread over batches, under way (``merge``)
            mirror.merging = cls._loaded(txn, merged + 1, upto)
            mirror.merged_below(*merged_thresholds(counters["merging"] - 1, counters["merge_slices"],
                                                   txn.index.signing.bands))
            return mirror._loaded_into(txn, upto + 1, None)
        return mirror._loaded_into(txn, merged + 1, None)  # entries up to ``merged_upto``: merged, being deleted

    @classmethod
    def _loaded(cls, txn: IndexTxn, first: int, last: Optional[int]) -> "RecentMirror":
        return cls()._loaded_into(txn, first, last)

    def _loaded_into(self, txn: IndexTxn, first: int, last: Optional[int]) -> "RecentMirror":
        """This mirror with the ``recent`` entries of serials ``first`` .. ``last`` (None: the newest) added."""
        mirror = self
        entries, kept_serials, kept_keys, placed = [], [], [], ([], [], [])
        bands = txn.index.signing.bands
        cursor = txn.txn.cursor(db=txn.dbs["recent"])
        for key, value in (cursor if cursor.set_range(u64(first)) else ()):  # unpositioned, it would start over
            serial = from_u64(key)
            if last is not None and serial > last:
                break
            ident, content, keys, places = unpack_recent(value, bands)
            if ident is not None:
                entries.append((serial, ident, content))
            if places is not None:
                for part, item in zip(placed, (serial, keys, places)):
                    part.append(item)
            elif len(keys):
                kept_serials.append(serial)
                kept_keys.append(keys)
        mirror.add(entries, np.array(kept_serials, dtype=np.int64),
                   np.array(kept_keys, dtype=np.uint64).reshape(len(kept_keys), bands), placed_entries(*placed))
        return mirror

    def add(self, entries: list[tuple[int, bytes, bytes]], kept_serials: np.ndarray, kept_keys: np.ndarray,
            places: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None,
            kept_entries: Optional[tuple[np.ndarray, np.ndarray]] = None) -> None:
        """Take in committed documents: (serial, id hash, content hash) each, the kept ones' band keys, and
        the places duplicates took under band keys (``placed_entries``: serials, bands, keys); or, with no
        places, ``kept_entries``: the kept ones' (slots, serials) sorted as ``_sorted_entries`` sorts them."""
        self._sorted = None
        self._file_hashes(entries)
        if entries:
            self.last_serial = max(self.last_serial, entries[-1][0])
        self.documents += len(entries)
        if kept_entries is not None:
            if len(kept_entries[0]):
                self._insert_run(kept_entries)
            return
        slots, serials = [], []
        if len(kept_serials):
            bands = np.tile(np.arange(kept_keys.shape[1], dtype=np.uint16), len(kept_serials))
            slots.append(band_slots(bands, kept_keys.ravel()))
            serials.append(np.repeat(kept_serials, kept_keys.shape[1]))
        if places is not None and len(places[0]):
            slots.append(band_slots(places[1], places[2]))
            serials.append(places[0])
        if slots:
            self._insert_sorted(np.concatenate(slots), np.concatenate(serials).astype(np.int64, copy=False))

    def _file_hashes(self, entries: list[tuple[int, bytes, bytes]]) -> None:
        """Each entry's id and content hash filed: its serial the first of a hash, or one more
        (``_kernel.file_firsts`` when there is one: the same dicts)."""
        first, content = self._first_of_id, self.content
        if _kernel is not None and isinstance(entries, list):
            _kernel.file_firsts(entries, first, self._more_of_id, content, self._more_of_content)
            return
        for serial, ident, digest in entries:
            if first.setdefault(ident, serial) != serial:
                self._more_of_id.setdefault(ident, []).append(serial)
            if content.setdefault(digest, serial) != serial:
                self._more_of_content.setdefault(digest, []).append(serial)

    def serials_of_id(self, ident: bytes) -> list[int]:
        """The mirrored documents with this id hash, oldest first (of the generation being merged, those whose
        slice is not in the ids table yet)."""
        older = self.merging
        found = older.serials_of_id(ident) if older is not None and _prefix(ident) >= self._merged_prefix else []
        first = self._first_of_id.get(ident)
        if first is None:
            return found
        return [*found, first, *self._more_of_id.get(ident, ())]

    def first_of_content(self, content: bytes) -> Optional[int]:
        """The first mirrored document with this content hash (None: none), as ``serials_of_id`` chooses."""
        older = self.merging
        if older is not None and _prefix(content_key(content)) >= self._merged_prefix:
            found = older.content.get(content)
            if found is not None:
                return found
        return self.content.get(content)

    # -- a merge spread over batches (``merge.SpreadMerge``) ---------------------------------------------

    def freeze(self) -> "RecentMirror":
        """Hand this generation over to be merged: the mirror starts a new, empty one and keeps answering for
        the older one (``merging``) until ``merged``, without what ``merged_below`` says the tables hold."""
        if self.merging is not None:
            raise RuntimeError("a merge is under way already: finish it first (a bug in streamdedup)")
        older = RecentMirror()
        older.__dict__, self.__dict__ = self.__dict__, older.__dict__
        self.merging = older
        self.last_serial = older.last_serial
        return older

    def merged_below(self, slot: int, prefix: int) -> None:
        """The generation being merged is in the tables for band slots below ``slot`` and for id and content
        hashes whose first two bytes are below ``prefix``: those entries are no longer answered from memory
        (the tables answer them, once each)."""
        self._merged_slots, self._merged_prefix = slot, prefix

    def merged(self) -> None:
        """The generation being merged is all in the tables (and its ``recent`` entries are gone)."""
        self.merging = None
        self._merged_slots = self._merged_prefix = 0

    def id_firsts(self) -> dict[bytes, int]:
        """Id hash -> the first mirrored document with it (read only)."""
        return self._first_of_id

    def ids_held(self, idents: list[bytes]) -> set[bytes]:
        """Those of ``idents`` that a mirrored document has, of this generation or the one being merged: among
        them every id hash ``serials_of_id`` finds serials of. Most of a batch's ids are new, and asked this way
        they cost a set operation, not a call each (a merge is under way in most batches)."""
        held = self._first_of_id.keys() & idents
        if self.merging is not None:
            held |= self.merging._first_of_id.keys() & idents
        return held

    def contents_held(self, contents: list[bytes]) -> set[bytes]:
        """Those of ``contents`` that a mirrored document has, of this generation or the one being merged: among
        them every content hash ``first_of_content`` answers (as ``ids_held``)."""
        held = self.content.keys() & contents
        if self.merging is not None:
            held |= self.merging.content.keys() & contents
        return held

    def id_more(self) -> dict[bytes, list[int]]:
        """Id hash -> the later mirrored documents with it, for the few ids seen more than once (read only)."""
        return self._more_of_id

    def content_more(self) -> dict[bytes, list[int]]:
        """Content hash -> the later mirrored documents with it (read only; ``content`` has the first)."""
        return self._more_of_content

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
        return (self._folded()[0] >> np.uint64(32)).astype(np.uint16)

    def _insert_sorted(self, keys: np.ndarray, serials: np.ndarray) -> None:
        """File a batch's entries as one more small sorted run, and fold the runs in now and then.

        Inserting into one array as large as the mirror would move all of it
        for every batch. A batch's own run is not moved until ``FRESH_ENTRIES``
        entries are fresh; they are then folded into a middle level, which
        goes into the large one once it holds a quarter as many entries (so an
        entry moves a few times over a generation, not once per
        ``FRESH_ENTRIES``: the large level grows to ``index.merge_every``
        documents' entries).
        """
        self._insert_run(_sorted_entries(keys, serials))

    def _insert_run(self, run: tuple[np.ndarray, np.ndarray]) -> None:
        """``_insert_sorted`` of entries sorted already."""
        self._fresh.append(run)
        self._fresh_entries += len(run[0])
        self._present.add(self._fresh[-1][0])
        if self._fresh_entries >= FRESH_ENTRIES:
            if len(self._middle) or self._fresh_entries <= max(FRESH_ENTRIES, len(self._settled) // 4):
                self._fold_fresh()
            else:  # the middle level would go into the settled one at once: the fresh runs go there themselves
                self._settled.merge(self._fresh_run(), owned=True)
            if len(self._middle) > max(FRESH_ENTRIES, len(self._settled) // 4):
                self._settled.merge(self._middle.entries())
                self._middle.clear()

    def _fold_fresh(self) -> None:
        if self._fresh:
            self._middle.merge(self._fresh_run(), owned=True)

    def _fresh_run(self) -> tuple[np.ndarray, np.ndarray]:
        """The fresh runs as one, taken out of the fresh level: arrays the mirror alone holds."""
        run = _merged_runs(self._fresh)
        self._fresh, self._fresh_entries = [], 0
        return run

    def _folded(self) -> tuple[np.ndarray, np.ndarray]:
        """Every level merged into the settled entries (which are returned), equal slots in the order taken."""
        self._fold_fresh()
        if len(self._middle):
            self._settled.merge(self._middle.entries())
            self._middle.clear()
        return self._settled.entries()

    def band_rows(self, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, serial) of every mirrored band entry whose slot is in ``asked`` (``band_slots``, sorted,
        repeats allowed).

        Keys the mirror surely lacks (``_KeyBits``: most of them, the keys
        of new documents) are dropped first; each other key is searched
        once, in sorted order, which keeps the binary searches in cache.
        """
        runs = self.band_runs(asked)
        if len(runs) == 1:
            return runs[0]
        return np.concatenate([k for k, _ in runs]), np.concatenate([s for _, s in runs])

    def band_runs(self, asked: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """``band_rows`` as the runs it joins: the generation being merged's, then this one's, each sorted by
        slot (and by serial within a slot, as entries are taken in serial order but for the places of a
        batch's duplicates, which follow its kept documents' entries)."""
        older = self.merging
        if older is not None:
            rest = asked[int(np.searchsorted(asked, np.uint64(self._merged_slots))):]
            return [older._own_band_rows(rest), self._own_band_rows(asked)]
        return [self._own_band_rows(asked)]

    def _own_band_rows(self, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self._settled) and not len(self._middle) and not self._fresh:
            none = _band_entries()
            return none[0], none[1]
        levels = [self._settled.entries(), self._middle.entries(), *self._fresh]
        if _kernel is not None:  # every level searched in one pass, slot by slot (the same entries, sorted)
            slots, serials = _kernel.level_rows(levels, np.ascontiguousarray(asked, dtype=np.uint64),
                                                self._present.bits, int(self._present.SHIFT))
            return np.frombuffer(slots, dtype=np.uint64), np.frombuffer(serials, dtype=np.int64)
        first = np.ones(len(asked), dtype=bool)
        first[1:] = asked[1:] != asked[:-1]
        first &= self._present.may_hold(asked)
        asked = asked[first]  # each key once (np.unique, which hashes, is slower here)
        found = [_rows_with_keys(keys, serials, asked) for keys, serials in levels]
        return np.concatenate([k for k, _ in found]), np.concatenate([s for _, s in found])

    def remove(self, serials: set[int], kept: set[int]) -> None:
        """Forget these documents (after a commit that removed them from ``recent``): every one's hashes, the
        ``kept`` ones' band entries (a duplicate's places stay taken)."""
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
        if kept:
            self.drop_band_entries(kept)

    def drop_band_entries(self, serials: set[int]) -> None:
        """Take documents out of the mirrored band keys only (expired by retention)."""
        keys, owners = self._folded()
        keep = ~np.isin(owners, np.fromiter(serials, dtype=np.int64, count=len(serials)))
        self._settled.keep(keep)

    def clear(self) -> None:
        settled, middle = self._settled, self._middle
        self.__init__()
        settled.clear()  # their memory is written already: the next mirror reuses it
        middle.clear()
        self._settled, self._middle = settled, middle

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


def merged_thresholds(done: int, slices: int, bands: int) -> tuple[int, int]:
    """(band slot, first two bytes of a hash) below which the first ``done`` of ``slices`` slices of a merge
    lie (``merge``: slices split the band table by band, then by the key's high 7 bits, in table order, and
    the id and content tables by their hashes' first two bytes)."""
    done = min(done, slices)
    return (done * (bands << 7) // slices) << 25, (done << 16) // slices


def _prefix(digest: bytes) -> int:
    return (digest[0] << 8) | digest[1]


def _band_entries() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)


_NO_STARTS = np.zeros(0, dtype=np.int64)


class SortedEntries:
    """(band slot, serial) entries sorted by slot, in arrays with room to spare: a sorted run is merged in
    place (``_kernel.merge_into``, from the end), into memory written before. A new array as large as the
    mirror for every run merged cost more in page faults than in the merge (a fifth of the writer's time)."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, dtype=np.uint64)
        self._serials = np.zeros(0, dtype=np.int64)
        self._size = 0
        self._distinct: Optional[tuple[np.ndarray, np.ndarray]] = None  # ``distinct``'s, till the entries change

    def __len__(self) -> int:
        return self._size

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        return self._keys[:self._size], self._serials[:self._size]

    def distinct(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct slots, sorted, and where each one's entries start (one more bound: the end): a slot is
        then found with one binary search among the distinct ones, not two among every entry."""
        if self._distinct is None:
            keys = self._keys[:self._size]
            first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1]))) if len(keys) else _NO_STARTS
            self._distinct = keys[first], np.append(first, self._size).astype(np.int64)
        return self._distinct

    def merge(self, run: tuple[np.ndarray, np.ndarray], owned: bool = False) -> None:
        """Take in a sorted run, its entries after equal slots. ``owned``: nothing else holds or changes the run's
        arrays (uint64 slots, int64 serials), which an empty level without the room for them then takes as they
        are, not copied into new memory."""
        size, added = self._size, len(run[0])
        if owned and size == 0 and added > len(self._keys):
            self._keys, self._serials = run
            self._size = added
            self._distinct = None
            return
        if size + added > len(self._keys):
            room = max(2 * len(self._keys), size + added)
            self._grow(size, room)
        if _kernel is not None:
            _kernel.merge_into(self._keys, self._serials, size, run[0], run[1])
        else:
            merged = _inserted(self.entries(), run)
            self._keys[:size + added], self._serials[:size + added] = merged
        self._size = size + added
        self._distinct = None

    def _grow(self, size: int, room: int) -> None:
        """Room for ``room`` entries, the first ``size`` kept: each array enlarged where it lies (``ndarray.resize``:
        a large block is remapped by ``realloc``, its pages neither copied nor faulted in again) when nothing
        else refers to it, else copied into new memory."""
        for name in ("_keys", "_serials"):
            try:
                getattr(self, name).resize(room, refcheck=True)  # refused when a view or another name holds it
            except ValueError:
                setattr(self, name, _grown(getattr(self, name), size, room))

    def clear(self) -> None:
        self._size = 0
        self._distinct = None

    def keep(self, which: np.ndarray) -> None:
        """Keep the entries ``which`` is true of, in order."""
        keys, serials = self.entries()
        kept = int(np.count_nonzero(which))
        self._keys[:kept], self._serials[:kept] = keys[which], serials[which]
        self._size = kept
        self._distinct = None


class KeyPlaces:
    """(band slot, holder) entries of the keys a vshard owns, sorted by slot, then by serial (the order the
    places were taken in): a vshard's places in memory (``engine.vshards.stores``), or the recent ones of its
    LMDB state (``store.vshardstate``). Two levels, so that taking in an epoch's places costs what the epoch
    brings, not what the store holds: recent entries merged in place, folded into the settled ones now and
    then."""

    def __init__(self) -> None:
        self._settled = SortedEntries()
        self._recent = SortedEntries()

    def __len__(self) -> int:
        return len(self._settled) + len(self._recent)

    def holders(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sorted unique ``slots``: where each slot's holders start in the returned array, how many it has,
        and the holders (slot by slot, each slot's in the order its places were taken)."""
        settled = _found(self._settled, slots)
        recent = _found(self._recent, slots)
        counts = settled[1] + recent[1]
        starts = (np.cumsum(counts) - counts).astype(np.int64)
        found = np.empty(int(counts.sum()), dtype=np.int64)
        for level, (begin, count), at in ((self._settled, settled, starts),
                                          (self._recent, recent, starts + settled[1])):
            if len(level):
                found[ranges(at, count)] = level.entries()[1][ranges(begin, count)]
        return starts, counts, found

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (slot, holder) entry, sorted by slot, then in the order taken (the levels folded into one)."""
        if len(self._recent):
            self._settled.merge(self._recent.entries())
            self._recent.clear()
        return self._settled.entries()

    def clear(self) -> None:
        self._settled.clear()
        self._recent.clear()

    def remove(self, slots: np.ndarray, holders: np.ndarray) -> np.ndarray:
        """Free the places of these (slot, holder) entries (``forget``); the slots freed, sorted."""
        gone = set(zip(np.asarray(slots, dtype=np.uint64).tolist(), np.asarray(holders, dtype=np.int64).tolist()))
        freed = set()
        asked = np.array(sorted({slot for slot, _ in gone}), dtype=np.uint64)
        for level in (self._settled, self._recent):
            keys, values = level.entries()
            lo, hi = np.searchsorted(keys, asked, "left"), np.searchsorted(keys, asked, "right")
            keep = np.ones(len(keys), dtype=bool)
            for begin, end in zip(lo.tolist(), hi.tolist()):
                for at in range(begin, end):
                    if (int(keys[at]), int(values[at])) in gone:
                        keep[at] = False
                        freed.add(int(keys[at]))
            if not keep.all():
                level.keep(keep)
        return np.array(sorted(freed), dtype=np.uint64)

    def add(self, slots: np.ndarray, holders: np.ndarray) -> None:
        """Take in places given after every one held (``slots`` sorted, a slot's holders in order)."""
        if not len(slots):
            return
        self._recent.merge((np.asarray(slots, dtype=np.uint64), np.asarray(holders, dtype=np.int64)))
        if len(self._recent) > max(FRESH_ENTRIES, len(self._settled) // 4):
            self._settled.merge(self._recent.entries())
            self._recent.clear()


def _found(level: SortedEntries, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of sorted unique ``slots`` starts among the ``level``'s entries, and how many entries it has
    (a slot it does not hold: none, from 0). With the kernel, each slot is searched for among the distinct ones
    from where the one before was (``sorted_matches``), and only the held ones are placed back among the slots;
    without, the shorter of the slots and the level's distinct ones is searched for in the other: both are
    sorted, so every way finds the same pairs."""
    distinct, bounds = level.distinct()
    begin, counts = np.zeros(len(slots), dtype=np.int64), np.zeros(len(slots), dtype=np.int64)
    if not len(distinct) or not len(slots):
        return begin, counts
    if _kernel is not None:  # the held slots by a search from the last one found (``sorted_matches``): few are held
        asked = np.ascontiguousarray(slots, dtype=np.uint64)
        held = np.frombuffer(_kernel.sorted_matches(distinct, asked), dtype=np.int64)
        at = np.searchsorted(asked, distinct[held])
        begin[at] = bounds[held]
        counts[at] = bounds[held + 1] - bounds[held]
        return begin, counts
    if len(distinct) < len(slots):
        at = np.minimum(np.searchsorted(slots, distinct), len(slots) - 1)
        held = slots[at] == distinct
        begin[at[held]] = bounds[:-1][held]
        counts[at[held]] = np.diff(bounds)[held]
        return begin, counts
    at = np.minimum(np.searchsorted(distinct, slots), len(distinct) - 1)
    held = distinct[at] == slots
    begin[held] = bounds[at[held]]
    counts[held] = bounds[at[held] + 1] - begin[held]
    return begin, counts


def _grown(values: np.ndarray, size: int, room: int) -> np.ndarray:
    grown = np.empty(room, dtype=values.dtype)
    grown[:size] = values[:size]
    return grown


def _inserted(into: tuple, new: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (keys, serials) ``into`` with the sorted ``new`` ones merged in, after equal keys."""
    size = len(into[0]) + len(new[0])
    keys, serials = np.empty(size, dtype=np.uint64), np.empty(size, dtype=np.int64)
    at = np.searchsorted(into[0], new[0], "right")
    where = at + np.arange(len(at))  # where each new entry lands
    old = np.ones(size, dtype=bool)
    old[where] = False
    keys[where], serials[where] = new
    keys[old], serials[old] = into
    return keys, serials


def _sorted_entries(keys: np.ndarray, serials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keys, serials) sorted by key, equal keys in the order given (``_kernel.sort_entries``, a radix sort, or
    numpy's stable sort: the same order)."""
    if _kernel is None:
        order = np.argsort(keys, kind="stable")
        return keys[order], serials[order]
    keys = np.array(keys, dtype=np.uint64, copy=True)
    serials = np.array(serials, dtype=np.int64, copy=True)
    _kernel.sort_entries(keys, serials)
    return keys, serials


def _merged_runs(runs: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted runs of (keys, serials) as one, equal keys in run order (a stable sort merges the runs; the
    kernel merges them one after another, in place, to the same order)."""
    if len(runs) == 1:
        return runs[0]
    if _kernel is not None:
        size = sum(len(run[0]) for run in runs)
        keys, serials = np.empty(size, dtype=np.uint64), np.empty(size, dtype=np.int64)
        done = 0
        for run_keys, run_serials in runs:
            _kernel.merge_into(keys, serials, done, run_keys, run_serials)
            done += len(run_keys)
        return keys, serials
    order = np.argsort(np.concatenate([run[0] for run in runs]), kind="stable")
    return np.concatenate([run[0] for run in runs])[order], np.concatenate([run[1] for run in runs])[order]


class _KeyBits:
    """Whether the mirror may hold a band slot (``band_slots``): 8 MiB of bits, a 32nd of them for each band
    (bands 32 apart share theirs), one bit for each run of 2,048 of the band's 2^32 keys.

    A slot whose bit is clear is surely not mirrored; bits stay set when
    entries leave (``remove``, retention), which only costs a search. At
    ``index.merge_every`` = 100,000 documents about 3% of the bits are set
    (with 32 bands; fewer bands fill their parts more). A batch's slots come
    sorted by band, then key: each band's bits are set and tested in one
    sweep through its 256 KiB, not through all 8 MiB, band after band.
    """

    SHIFT = np.uint64(32 - KEY_BITS_LOG2 + 5)  # the slot's band (its low 5 bits) on top of its key's top bits
    MASK = np.uint64((1 << KEY_BITS_LOG2) - 1)

    def __init__(self) -> None:
        self._bits = np.zeros(1 << (KEY_BITS_LOG2 - 3), dtype=np.uint8)

    @property
    def bits(self) -> np.ndarray:
        """The map itself (read only): ``_kernel.level_rows`` tests it as ``may_hold`` does."""
        return self._bits

    def add(self, keys: np.ndarray) -> None:
        """Set the bits of ``keys`` (in the kernel; in numpy sorted by bit first, so that a byte's bits are
        OR-ed together: ``ufunc.at`` is slow)."""
        if _kernel is not None:
            _kernel.key_bits_set(self._bits, np.ascontiguousarray(keys, dtype=np.uint64), int(self.SHIFT))
            return
        numbers = np.sort(self._bit_numbers(keys))
        places = numbers >> 3
        starts = np.flatnonzero(np.concatenate(([True], places[1:] != places[:-1]))) if len(places) else places
        bits = np.left_shift(np.uint8(1), (numbers & 7).astype(np.uint8))
        self._bits[places[starts]] |= np.bitwise_or.reduceat(bits, starts) if len(starts) else bits

    def may_hold(self, keys: np.ndarray) -> np.ndarray:
        if _kernel is not None:
            held = np.empty(len(keys), dtype=bool)
            _kernel.key_bits_test(self._bits, np.ascontiguousarray(keys, dtype=np.uint64), int(self.SHIFT), held)
            return held
        numbers = self._bit_numbers(keys)
        return ((self._bits[numbers >> 3] >> (numbers & 7).astype(np.uint8)) & 1).astype(bool)

    def _bit_numbers(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64, copy=False) >> self.SHIFT) & self.MASK).astype(np.int64)


def _rows_with_keys(keys: np.ndarray, serials: np.ndarray, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key, serial) of the entries of sorted ``keys`` that are in sorted, unique ``asked``."""
    if len(keys) == 0:
        return keys, serials
    if _kernel is not None:
        index = np.frombuffer(_kernel.sorted_matches(keys, np.ascontiguousarray(asked, dtype=np.uint64)),
                              dtype=np.int64)
        return keys[index], serials[index]
    lo = np.searchsorted(keys, asked, "left")
    found = keys[np.minimum(lo, len(keys) - 1)] == asked
    if not found.any():
        return keys[:0], serials[:0]
    lo = lo[found]
    index = ranges(lo, np.searchsorted(keys, asked[found], "right") - lo)
    return keys[index], serials[index]
