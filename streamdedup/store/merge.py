"""Merging the recent mirror into the hash-keyed tables (``mirror``), a bounded slice at a time.

A merge takes one generation of the mirror (``RecentMirror.freeze``: the
documents decided up to ``merge_upto``) and writes it into the ``ids``,
``content`` and ``bands`` tables in ``slices`` transactions, in table order
(the band table by band, then by the band key's high 7 bits; the id and
content tables by their hashes' first two bytes), then empties ``recent`` up
to ``merge_upto`` in a few more (``finish``: the first records the
generation as merged, ``merged_upto``, after which the filter is saved with
that stamp; each deletes ``FINISH_CHUNK`` entries; the last one records the
merge as done). The writer spreads these steps
over the batches that follow (``engine.Engine``), so no batch waits for a
whole merge; meanwhile the next generation is mirrored as before.

The generation's cluster memberships (``recent_members``, appended by its
batches) move into the ``members`` table in the slices' transactions too,
each slice those of a range of cluster serials (``member_slice_bounds``),
sorted: a leaf page of the table is dirtied once a merge rather than once a
duplicate. The finishing steps delete them from the log with ``recent``'s
entries; until then readers take the counters for which are merged
(``IndexTxn.member_log``), so each membership is listed once at every commit.

The band entries go into the band table's current run of serials
(``bands.run_bases``); a merge whose generation would take that run past
``bands.RUN_SERIALS`` starts a new one at the generation's first serial,
recorded in the manifest in the transaction of its first slice (every
slice asks again and finds it begun), so a merge rewrites the pages of
about a million documents' entries at most, however large the index.

A lookup meanwhile finds every entry once: the tables answer for the slices
written, the generation being merged for the others, the new generation for
its own documents (``RecentMirror.merged_below``). So what a document finds
never depends on how far a merge went, and decisions are the same whatever
the batches and the merge's pace.

On disk, the counters say how far a merge went (``merging``: 1 + the slices
committed; ``merge_upto``; ``merge_slices``), each slice's transaction
writing them with its entries. ``recent`` keeps every document of the
generation until ``merged_upto`` reaches ``merge_upto``, so after a crash
anywhere the mirror is read back from it, the slices committed are taken as
written (``RecentMirror.load``) and the merge goes on from the next one; past
that, ``recent``'s entries up to ``merged_upto`` are only waiting to be
deleted and nothing reads them. Merging an entry twice changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from .bands import run_bases, runs_after_merge, start_runs
from .hashed import filter_keys, salted
from .index import IndexTxn, content_key, from_u64, member_slice_bounds, rows_as_bytes
from .mirror import RecentMirror, merged_thresholds

if TYPE_CHECKING:
    from .bands import BandTables

__all__ = ["SpreadMerge", "generation_hash_keys", "serial_span", "merge_slices", "merge_recent", "rewritten_bytes",
           "MERGE_SLICE_BYTES", "FINISH_CHUNK"]


MERGE_SLICE_BYTES = 32 << 20  # 32 MiB: table pages one merge transaction may dirty, about
FINISH_CHUNK = 25000  # ``recent`` entries a finishing step deletes (one at a time: ~3 us each)


def merge_slices(bands_table_bytes: int, bands: int) -> int:
    """How many transactions a merge is split into, so each dirties a bounded part of the tables.

    LMDB keeps a transaction's dirty pages in memory until it commits: one
    transaction merging into a large band table would hold most of it.
    """
    per_band = -(-bands_table_bytes // (bands * MERGE_SLICE_BYTES))
    return bands * max(1, per_band)


def rewritten_bytes(txn: IndexTxn, bands_table_bytes: int, first: int, upto: int) -> int:
    """The band table's bytes a merge of the serials ``first`` .. ``upto`` rewrites (``merge_slices`` takes them):
    those of the run it writes into (``bands.runs_after_merge``), as many a serial as the table holds, not the
    whole table's (at 10M documents 64 slices a merge where the run needs 32, a durable commit each)."""
    base = runs_after_merge(run_bases(txn).tolist(), first, upto)[-1]
    if base == 0:  # the run is the table: as before runs
        return bands_table_bytes
    return -(-bands_table_bytes * (upto - base + 1) // (txn.counters.get("merged_upto", 0) + 1))


class SpreadMerge:
    """The merge of ``mirror.merging`` (the generation frozen up to ``upto``) in ``slices`` slices, ``done`` of
    them committed: ``write_slice`` in a transaction, ``slice_committed`` once it committed; then ``finish``."""

    def __init__(self, mirror: RecentMirror, upto: int, slices: int, bands: int, done: int = 0,
                 sealed: bool = False):
        self.mirror = mirror
        self.upto = upto
        self.slices = slices
        self.bands = bands
        self.done = done
        self.sealed = sealed  # ``merged_upto`` is ``upto``: what is left is deleting ``recent``'s entries
        self.chunk = FINISH_CHUNK  # ``recent`` entries a finishing step deletes
        self.finish_steps = max(1, -(-(mirror.merging.documents if mirror.merging is not None else 0) // self.chunk))
        self.finished = 0  # finishing steps done
        self._ids: Optional[_Pairs] = None
        self._contents: Optional[_Pairs] = None
        self._first_serial: Optional[int] = None  # of the generation's band entries (-1: none)
        self._members: Optional[_Memberships] = None  # the generation's memberships (``_move_members``)

    @property
    def generation(self) -> RecentMirror:
        return self.mirror.merging

    @property
    def steps(self) -> int:
        """Transactions in all: the slices, then the finishing ones."""
        return self.slices + self.finish_steps

    @property
    def steps_left(self) -> int:
        """Transactions still to come (a finishing step may find nothing left to delete and end the merge)."""
        return self.slices - self.done + max(1, self.finish_steps - self.finished)

    def write_slice(self, txn: IndexTxn, tables: "BandTables") -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """Write the next slice of the generation into the tables, with the counters saying so; returns the
        band slots, the id and content hashes' filter keys, and the first and last serial of the band entries
        it wrote (``BandTables.holding``: the filters must hold them before the slice commits)."""
        number, generation = self.done, self.generation
        counters = txn.counters
        txn.count(merging=number + 2 - counters["merging"], merge_upto=self.upto - counters.get("merge_upto", 0),
                  merge_slices=self.slices - counters.get("merge_slices", 0))
        low, high = (number << 16) // self.slices, ((number + 1) << 16) // self.slices
        if self._ids is None:
            firsts, contents = generation.id_firsts(), generation.content
            self._ids = _Pairs(firsts, firsts.values(), len(firsts),
                               [(ident, serial) for ident, later in generation.id_more().items() for serial in later])
            self._contents = _Pairs([content_key(c) for c in contents], contents.values(), len(contents),
                                    [(content_key(c), serial) for c, later in generation.content_more().items()
                                     for serial in later])
        raw, dbs = txn.txn, txn.dbs
        hashes = []
        for name, pairs in (("ids", self._ids), ("content", self._contents)):
            rows = pairs.with_prefix(low, high)
            if rows:
                raw.cursor(db=dbs[name]).putmulti(rows, dupdata=True)
                hashes.append(pairs.filter_keys(name, low, high))
        hash_keys = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        self._move_members(txn, number)
        bases = start_runs(txn, self._first_band_serial(), self.upto)  # a new run: the first slice's transaction
        slots, serials = tables.insert_slice(txn, generation, number, self.slices, bases)
        return slots, hash_keys, serial_span(serials)

    def _move_members(self, txn: IndexTxn, number: int) -> None:
        """Slice ``number``'s memberships into ``members``: those of the generation whose cluster is in its
        range (``member_slice_bounds``), sorted as the table holds them, so a leaf page is dirtied once a merge,
        not once a duplicate. They stay in ``recent_members`` until ``finish``; the counters this transaction
        writes (``merging``) tell readers they are merged (``IndexTxn.member_log``)."""
        if self._members is None:  # the log as this merge's first transaction (or the first since a restart) finds
            self._members = _Memberships(txn, self.upto)
        rows = self._members.in_clusters(*member_slice_bounds(number, self.slices, self.upto))
        if rows:
            txn.txn.cursor(db=txn.dbs["members"]).putmulti(rows, dupdata=True)

    def _first_band_serial(self) -> Optional[int]:
        """The first serial of the generation's band entries (None: it has none)."""
        if self._first_serial is None:
            serials = self.generation.serials
            self._first_serial = int(serials.min()) if len(serials) else -1
        return self._first_serial if self._first_serial >= 0 else None

    def slice_committed(self) -> None:
        """The slice written last has committed: lookups take its entries from the tables now."""
        self.done += 1
        self.mirror.merged_below(*merged_thresholds(self.done, self.slices, self.bands))

    def finish(self, txn: IndexTxn, chunk: int = 0) -> bool:
        """After every slice: record the generation as merged (``merged_upto``: the first finishing step; the
        caller then drops it from the mirror and saves the filter, ``sealed``), empty ``recent`` and
        ``recent_members`` up to ``upto`` (at most ``chunk`` entries of each a step, 0: all) and, once they are,
        record the merge as done; whether it is."""
        counters = txn.counters
        if counters["merged_upto"] < self.upto:
            txn.count(merged_upto=self.upto - counters["merged_upto"])
        emptied = [_deleted_through(txn.txn.cursor(db=txn.dbs[name]), self.upto, chunk)
                   for name in ("recent_members", "recent")]
        if not all(emptied):
            self.finished += 1
            return False
        txn.count(merging=-counters["merging"],
                  merge_upto=-counters.get("merge_upto", 0), merge_slices=-counters.get("merge_slices", 0))
        self.finished = self.finish_steps
        return True


def merge_recent(txn: IndexTxn, mirror: RecentMirror, tables: "BandTables") -> None:
    """The whole mirror merged in one transaction (``check --fix``), its keys and hashes held by the tables'
    filters (``BandTables.holding``) as a spread merge's are."""
    upto = mirror.last_serial
    mirror.freeze()
    merge = SpreadMerge(mirror, upto, 1, txn.index.signing.bands)
    tables.holding(*merge.write_slice(txn, tables))
    merge.slice_committed()
    merge.finish(txn)
    mirror.merged()


def _deleted_through(cursor, upto: int, chunk: int) -> bool:
    """Delete a serial-keyed table's first entries, those up to ``upto``, at most ``chunk`` of them (0: all);
    whether none of them is left."""
    deleted, positioned = 0, cursor.first()
    while positioned and from_u64(cursor.key()) <= upto:
        if chunk and deleted == chunk:
            return False
        cursor.delete()
        deleted += 1
        positioned = bool(cursor.key())
    return True


def serial_span(serials: np.ndarray) -> tuple[int, int]:
    """The first and last of these serials (of band entries: ``BandTables.holding``); (0, 0) for none."""
    return (int(serials.min()), int(serials.max())) if len(serials) else (0, 0)


def generation_hash_keys(generation: RecentMirror) -> np.ndarray:
    """The hash filter's keys of every id and content hash of a mirrored generation (``hashed.filter_keys``):
    what a merge of it writes into the id and content tables (its later serials of a hash add no key)."""
    return np.concatenate((filter_keys("ids", list(generation.id_firsts())),
                           filter_keys("content", [content_key(c) for c in generation.content])))


class _Pairs:
    """(8-byte hash, serial) entries of the id or content table, sorted as the table holds them, written a range
    of first two bytes at a time (each as its (key, value): ``hashed.entry``). Made from ``count`` hashes and
    their serials (read in C: no Python call an entry), and ``extra`` (hash, serial) pairs: the later serials
    of the few hashes seen more than once."""

    def __init__(self, hashes, serials, count: int, extra: list[tuple[bytes, int]]) -> None:
        joined = b"".join(hashes)
        if len(joined) != 8 * count:  # hashes of another width (tests): their first 8 bytes
            joined = b"".join(digest[:8] for digest in hashes)
        words = np.frombuffer(joined, dtype=">u8").astype(np.uint64)
        serials = np.fromiter(serials, dtype=np.uint64, count=count)
        if extra:
            extra = [(digest[:8], serial) for digest, serial in extra]
            words = np.concatenate((words, np.frombuffer(b"".join(d for d, _ in extra), dtype=">u8").astype(np.uint64)))
            serials = np.concatenate((serials, np.array([s for _, s in extra], dtype=np.uint64)))
        order = np.lexsort((serials, words))
        self._words, self._serials = words[order], serials[order]
        self._prefixes = self._words >> np.uint64(48)

    def filter_keys(self, table: str, low: int, high: int) -> np.ndarray:
        """The hash filter's keys (``hashed.filter_keys``) of the hashes whose first two bytes are in [low, high)."""
        begin, end = np.searchsorted(self._prefixes, np.array([low, high], dtype=np.uint64)).tolist()
        return salted(table, self._words[begin:end])

    def with_prefix(self, low: int, high: int) -> list[tuple[bytes, bytes]]:
        """The (key, value) rows of the hashes whose first two bytes are in [low, high), in table order."""
        begin, end = np.searchsorted(self._prefixes, np.array([low, high], dtype=np.uint64)).tolist()
        if begin == end:
            return []
        rows = np.empty((end - begin, 12), dtype=np.uint8)
        rows[:, :8] = self._words[begin:end].astype(">u8").view(np.uint8).reshape(-1, 8)
        rows[:, 8:] = self._serials[begin:end].astype(">u4").view(np.uint8).reshape(-1, 4)
        keys = np.ascontiguousarray(rows[:, :2]).view(np.dtype((np.void, 2))).ravel().tolist()
        values = np.ascontiguousarray(rows[:, 2:]).view(np.dtype((np.void, 10))).ravel().tolist()
        return list(zip(keys, values))


class _Memberships:
    """The memberships ``recent_members`` holds of the serials up to ``upto`` (a merge's generation), sorted by
    cluster, then member: the members table's order, taken a range of clusters at a time."""

    def __init__(self, txn: IndexTxn, upto: int) -> None:
        members, clusters = txn.logged_memberships()
        generation = members <= upto
        members, clusters = members[generation], clusters[generation]
        order = np.lexsort((members, clusters))
        self._members, self._clusters = members[order], clusters[order]

    def in_clusters(self, low: int, high: int) -> list[tuple[bytes, bytes]]:
        """The members table's (key, value) of the memberships of the clusters in [low, high), in table order."""
        begin, end = np.searchsorted(self._clusters, np.array([low, high], dtype=np.int64)).tolist()
        if begin == end:
            return []
        return list(zip(rows_as_bytes(self._clusters[begin:end].astype(">u4")),
                        rows_as_bytes(self._members[begin:end].astype(">u4"))))
