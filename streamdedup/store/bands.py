"""The band tables: where kept documents are found by their band keys, and every path that touches them.

One dupsort table, ``bands``, of large buckets: the key (4 bytes) is a
band number, the band key's high 7 bits and the serial's *run* (9 bits);
each value (6 bytes, packed by LMDB with the others of its bucket in pages
of their own) holds the band key's low 25 bits and the serial's offset from
its run's first serial (23 bits), all big-endian so that buckets sort by
band, then key, and values by key, then serial. A run is a stretch of
serials that merges fill (``run_bases``, the manifest in ``meta``): a merge
starts a new one, in its first slice's transaction, once the current run
would span more than ``RUN_SERIALS`` (about a million documents), so a
merge rewrites the pages of one run of that size at most, however large
the index (it rewrote the whole current epoch of up to 2^23 documents: 27
µs a document at 10M against 16 at 1M). An index made before runs has no
manifest: its runs are its *epochs* (serial >> 23, the run starting at
epoch << 23), read as they are, and its manifest is written by the first
merge that continues it. At a million documents a bucket holds ~5,500
entries, so an entry costs its 6 bytes over LMDB's page fill (format 4's
buckets of ~11 entries, keyed by the high 16 bits, paid LMDB's node and
sub-page header for every ~11 entries and filled their pages less). A lookup positions a cursor at
each asked key's first possible value in each run (MDB_GET_BOTH_RANGE)
and reads on to its last possible one; the filter below answers most keys
that are not stored without reading the table. A key's entries are its
places (``candidates.file_prober``): every kept document's, and the first
probers' that were duplicates, which hold their place and propose nothing.

``BandTables`` is the one way in. A lookup asks the table through the
writer's filter of stored keys (``bandfilter``) and the recent-keys mirror
(``mirror.RecentMirror``: kept documents not merged into the table yet).
Entries reach the table only in merges (``insert_slice``), and whatever a
merge's slice adds is added to the filter before the slice commits
(``holding``): a key missing from the filter would hide a stored document.
Removals (``remove``: forget, retention) delete exactly one kept document's
entries (a duplicate's places stay); their keys may stay set in the filter,
which is harmless.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from . import bandfilter, hashed
from .bandfilter import BandFilter
from ..core.lsh import band_keys
from ..core.shingle import ShingleBatch
from ..core.signing import sign_batch
from ..errors import IndexCorruptError, IndexFullError
from .index import DocRecord, Index, IndexTxn, rows_as_bytes
from ..core.lsh import KEY_MASK, band_slots
from .mirror import merged_thresholds
from .sites import rekeyed_may_hold

try:
    from ..core import _kernel
except ImportError:  # built without a C compiler: the cursor is walked from Python, with the same rows
    _kernel = None

__all__ = ["BandRows", "BandTables", "as_bytes_list", "band_entries", "put_rows", "stored_keys", "record_band_keys",
           "run_bases", "runs_after_merge", "run_problems", "start_runs", "KEY_ROW", "BAND_ROW", "BAND_KEY_BYTES",
           "RUN_SERIALS", "SHORT_RUNS", "RUNS_KEY"]

BAND_KEY_BYTES = 4  # a band key is 32 bits (``lsh.band_keys``): in records, the recent log and the table
KEY_ROW = np.dtype([("band", ">u2"), ("key", ">u8")])  # a key of the ``rekeyed`` table
BAND_ROW = np.dtype([("band", ">u2"), ("key", ">u8"), ("serial", ">u8")])  # a ``rekeyed`` key and one value
_KEY_BYTES, _VALUE_BYTES = 4, 6  # a ``bands`` row: key (band, bucket), value (band key's low bits, serial's)
_HIGH_BITS = 7  # a bucket holds band keys of the same high 7 bits...
_EPOCH_BITS = 23  # ...and serials of the same run, a value holding a serial's offset in its run: 23 bits
_RUN_LIMIT = 1 << (16 - _HIGH_BITS)  # runs an index may have (the bucket's 9 bits)
RUN_SERIALS = 1 << 20  # a merge starts a new run once the current one would span more serials (~1M documents)...
SHORT_RUNS = 256  # ...while the index has fewer runs; later runs span up to 2^23 serials (the index then holds
#                   at most 256 x 2^20 + 256 x 2^23 serials, about 2.4 billion documents)
RUNS_KEY = b"band_runs"  # the manifest in ``meta``: the first serial of every run, JSON
_LOW_BITS = 32 - _HIGH_BITS  # the band key's bits in a value, before the serial's 23
_U64 = np.uint64
HASH_FILTER_START = 32  # the hash filter (``hashed``) starts at 1/32 of the band filter's bytes...
HASH_FILTER_MAX = 16  # ...and grows to 1/16 of its cap: a document adds 2 hashes at most, ~23 band entries


@dataclass(frozen=True)
class BandRows:
    """How a bucketed band table holds its entries: the index's ``bands`` rows (6-byte values), or with
    ``home_bits`` a vshard's settled places (``store.vshardstate``), whose values carry the holder's home in
    their low bits after the serial's (8 bytes: ``home_bits`` 16). Buckets, order and lookups are the same."""

    table: str = "bands"
    home_bits: int = 0

    @property
    def value_bytes(self) -> int:
        return _VALUE_BYTES + self.home_bits // 8

    def words(self, bands: np.ndarray, keys: np.ndarray, serials: np.ndarray,
              homes: Optional[np.ndarray] = None, bases: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
        """(key, value) of table rows as integers, in the table's order: (band, key's high bits, serial's
        run), (key's low bits, serial's offset in its run, and the home's); ``bases``: the runs' first serials
        (``run_bases``), None for epochs."""
        keys, serials = keys.astype(np.uint64), serials.astype(np.uint64)
        run, offset = _run_offsets(serials, bases)
        bucket = ((bands.astype(np.uint64) << _U64(16)) | ((keys >> _U64(_LOW_BITS)) << _U64(16 - _HIGH_BITS))
                  | run)
        low_key = keys & _U64((1 << _LOW_BITS) - 1)
        value = (low_key << _U64(_EPOCH_BITS)) | offset
        if self.home_bits:
            value = (value << _U64(self.home_bits)) | homes.astype(np.uint64)
        order = _table_order(bucket, value)
        return bucket[order], value[order]

    def entries(self, bands: np.ndarray, keys: np.ndarray, serials: np.ndarray, homes: Optional[np.ndarray] = None,
                bases: Optional[np.ndarray] = None) -> tuple[list[bytes], list[bytes]]:
        """Table rows (key bytes, value bytes) of these (band, 32-bit band key, serial[, home]), in the table's
        order (``bases``: as ``words``)."""
        bucket, value = self.words(bands, keys, serials, homes, bases)
        return _big_endian(bucket, _KEY_BYTES), _big_endian(value, self.value_bytes)

    def decoded(self, rows: bytes, bases: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                                np.ndarray]:
        """(band, band key, serial, home) of table rows (key and value bytes, one after the other; home 0
        without ``home_bits``; ``bases``: as ``words``)."""
        raw = np.frombuffer(rows, dtype=np.uint8).reshape(-1, _KEY_BYTES + self.value_bytes).astype(np.uint64)
        bucket, value = _big_endian_int(raw, 0, _KEY_BYTES), _big_endian_int(raw, _KEY_BYTES, self.value_bytes)
        homes = (value & _U64((1 << self.home_bits) - 1)).astype(np.int64)
        value >>= _U64(self.home_bits)
        high = (bucket >> _U64(16 - _HIGH_BITS)) & _U64((1 << _HIGH_BITS) - 1)
        run = (bucket & _U64(_RUN_LIMIT - 1)).astype(np.int64)
        keys = (high << _U64(_LOW_BITS)) | (value >> _U64(_EPOCH_BITS))
        serials = _run_floors(run, bases) + (value & _U64((1 << _EPOCH_BITS) - 1))
        return (bucket >> _U64(16)).astype(np.int64), keys, serials.astype(np.int64), homes

    def stored_keys(self, txn: IndexTxn, chunk: int) -> Iterator[np.ndarray]:
        """Every band key stored in the table (once per entry), as uint64 arrays of at most ``chunk`` keys."""
        pairs = txn.txn.cursor(db=txn.dbs[self.table]).iternext(keys=True, values=True)
        while rows := list(itertools.islice(pairs, chunk)):
            yield self.decoded(b"".join(k + v for k, v in rows))[1]

    def stored_rows(self, txn: IndexTxn, bands: np.ndarray, keys: np.ndarray, last_serial: int,
                    asked: Optional[np.ndarray] = None, bases: Optional[np.ndarray] = None) -> bytes:
        """The table rows (key and value bytes) of these (band, band key) pairs, asked in table order (the
        table holds serials up to ``last_serial``, in the runs that start at ``bases``: ``run_bases``; None:
        epochs of 2^23 serials); ``asked``: the runs to ask for each key (a bool matrix, run by key:
        ``BandFilter.runs_to_ask``), else every run.

        A bucket holds thousands of entries, so each key is found by positioning
        the cursor at its first possible value (``set_range_dup``:
        MDB_GET_BOTH_RANGE) and reading on up to its last possible one, once in
        every run of serials asked. The kernel (``stored_walk``) makes the same
        calls of the cursor's methods without the loop's Python work between
        them (about a third of a key's cost); the loop below is its fallback.
        """
        runs = len(bases) if bases is not None else (last_serial >> _EPOCH_BITS) + 1
        if asked is None:
            asked = np.ones((runs, len(keys)), dtype=bool)
        run, which = np.nonzero(asked[:runs])  # run-major: each run's keys in table order
        floors = _run_floors(run, bases)
        bands, keys = bands[which], keys[which]
        bucket, first = self.words(bands, keys, floors, np.zeros(len(floors), dtype=np.uint64), bases)
        last = first | _U64((1 << (_EPOCH_BITS + self.home_bits)) - 1)  # the run's last serial and home
        cursor = txn.txn.cursor(db=txn.dbs[self.table])
        seek, value, next_value = cursor.set_range_dup, cursor.value, cursor.next_dup
        if _kernel is not None:  # the same calls of the cursor, without the loop's Python work between them
            return _kernel.stored_walk(seek, value, next_value, _big_endian_bytes(bucket, _KEY_BYTES),
                                       _big_endian_bytes(first, self.value_bytes),
                                       _big_endian_bytes(last, self.value_bytes), _KEY_BYTES, self.value_bytes)
        buckets = _big_endian(bucket, _KEY_BYTES)
        firsts, lasts = _big_endian(first, self.value_bytes), _big_endian(last, self.value_bytes)
        found = []
        for bucket, first, last in zip(buckets, firsts, lasts):
            if not seek(bucket, first):
                continue
            stored = value()
            while stored <= last:  # big-endian bytes of one width compare as their numbers
                found.append(bucket + stored)
                if not next_value():
                    break
                stored = value()
        return b"".join(found)


_INDEX_ROWS = BandRows()


def _run_offsets(serials: np.ndarray, bases: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(run, offset in it) of each serial (uint64): in the runs starting at ``bases``, else in epochs."""
    if bases is None:
        return serials >> _U64(_EPOCH_BITS), serials & _U64((1 << _EPOCH_BITS) - 1)
    run = (np.searchsorted(bases, serials, side="right") - 1).astype(np.uint64)
    return run, serials - bases[run.astype(np.int64)]


def _run_floors(runs: np.ndarray, bases: Optional[np.ndarray]) -> np.ndarray:
    """The first serial of each run (uint64): its base, else its epoch's."""
    if bases is None:
        return runs.astype(np.uint64) << _U64(_EPOCH_BITS)
    return bases[runs.astype(np.int64)]


def run_bases(txn: IndexTxn) -> np.ndarray:
    """The first serial of each run of the index's band table (uint64, ascending, from 0): the manifest, or for
    an index made before runs, its epochs up to its next serial."""
    raw = txn.txn.get(RUNS_KEY, db=txn.dbs["meta"])
    if raw is None:
        epochs = (txn.counters.get("next_serial", 0) >> _EPOCH_BITS) + 1
        return np.arange(epochs, dtype=np.uint64) << _U64(_EPOCH_BITS)
    return np.array(json.loads(raw), dtype=np.uint64)


def runs_after_merge(bases: list[int], first: int, upto: int) -> list[int]:
    """The runs' first serials once a merge of serials ``first`` .. ``upto`` begins: a new run at ``first`` if the
    current one would span more than ``RUN_SERIALS`` (while there are fewer than ``SHORT_RUNS``, and the
    generation spans fewer than 2^23 serials), then one every 2^23 serials while a run would span more (a
    generation that large, or the later runs: epochs); the same again once they are (a merge restarted)."""
    bases = list(bases)
    if upto - bases[-1] >= RUN_SERIALS and bases[-1] < first and upto - first < 1 << _EPOCH_BITS \
            and len(bases) < SHORT_RUNS:
        bases.append(first)
    while upto - bases[-1] >= 1 << _EPOCH_BITS:
        bases.append(bases[-1] + (1 << _EPOCH_BITS))
    if len(bases) > _RUN_LIMIT:
        raise IndexFullError(f"the band table has {_RUN_LIMIT} runs of serials, as many as it can (up to "
                             f"#{bases[_RUN_LIMIT] - 1:,}); start a new index (or shard the input)")
    return bases


def run_problems(txn: IndexTxn) -> list[str]:
    """What is wrong with the manifest of runs (``check``): runs from serial 0 up, each spanning at most 2^23
    serials, at most 512 of them."""
    bases = run_bases(txn).tolist()
    spans = [later - first for first, later in zip(bases, bases[1:])]
    if bases[:1] != [0] or len(bases) > _RUN_LIMIT or any(not 0 < span <= 1 << _EPOCH_BITS for span in spans):
        return [f"the band table's manifest of runs is damaged ({len(bases)} runs starting at {bases[:4]}...): "
                "run `streamdedup check --fix` to rebuild the tables"]
    return []


def start_runs(txn: IndexTxn, first: Optional[int], upto: int) -> np.ndarray:
    """In a merge slice's transaction: the runs the merge of band entries of serials ``first`` .. ``upto`` (None:
    none) writes into, written in the manifest if they changed (a new run, or an index made before runs); the
    runs' first serials."""
    bases = run_bases(txn)
    wanted = bases.tolist() if first is None else runs_after_merge(bases.tolist(), first, upto)
    if len(wanted) != len(bases) or txn.txn.get(RUNS_KEY, db=txn.dbs["meta"]) is None:
        txn.txn.put(RUNS_KEY, json.dumps(wanted).encode(), db=txn.dbs["meta"])
        txn.mark_current_format()
    return np.array(wanted, dtype=np.uint64)


def _table_order(bucket: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The order that sorts rows by bucket, then value. Rows mostly come sorted by band slot, then serial,
    which is that order within an epoch of serials: a stable sort by bucket then leaves the values in order
    (4 ns a row, where a lexsort takes 240), checked; else the lexsort."""
    order = np.argsort(bucket, kind="stable")
    bucket_sorted, value_sorted = bucket[order], value[order]
    if np.all((bucket_sorted[1:] != bucket_sorted[:-1]) | (value_sorted[1:] >= value_sorted[:-1])):
        return order
    return np.lexsort((value, bucket))


def _big_endian(words: np.ndarray, width: int) -> list[bytes]:
    """Each integer as its ``width`` low bytes, big-endian."""
    return rows_as_bytes(words.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width:])


def put_rows(keys: np.ndarray, key_width: int, values: np.ndarray, value_width: int) -> list[tuple[bytes, bytes]]:
    """The (key, value) rows a cursor's ``putmulti`` takes: each integer of ``keys`` as its ``key_width`` low bytes,
    big-endian, with the same row of ``values`` as its ``value_width`` (a merge's 2.3 million band entries: the
    kernel makes the rows in one pass, 0.25 s of a 1M index's merge in numpy's bytes lists and ``zip``)."""
    if _kernel is None:
        return list(zip(_big_endian(keys, key_width), _big_endian(values, value_width)))
    return _kernel.row_pairs(_big_endian_bytes(keys, key_width), _big_endian_bytes(values, value_width),
                             key_width, value_width)


def _big_endian_bytes(words: np.ndarray, width: int) -> bytes:
    """Each integer as its ``width`` low bytes, big-endian, one after the other."""
    return words.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width:].tobytes()


def _big_endian_int(raw: np.ndarray, first: int, width: int) -> np.ndarray:
    """The integers that columns ``first`` .. ``first + width - 1`` of a bytes matrix spell, big-endian."""
    value = np.zeros(len(raw), dtype=np.uint64)
    for column in range(first, first + width):
        value = (value << np.uint64(8)) | raw[:, column]
    return value


def band_entries(txn: IndexTxn) -> Iterator[tuple[int, bytes, int]]:
    """Every (band, band key bytes, serial) of the table, in table order; IndexCorruptError if the manifest of
    runs is damaged (``run_problems``: the serials cannot be read)."""
    if run_problems(txn):
        raise IndexCorruptError("the band table's manifest of runs is damaged: its serials cannot be read; run "
                                "`streamdedup check --fix` to rebuild the tables")
    bases = run_bases(txn)
    for key, value in txn.txn.cursor(db=txn.dbs["bands"]):
        band, keys, serials, _ = _INDEX_ROWS.decoded(key + value, bases)
        yield int(band[0]), int(keys[0]).to_bytes(BAND_KEY_BYTES, "big"), int(serials[0])


def stored_keys(txn: IndexTxn, chunk: int) -> Iterator[np.ndarray]:
    """Every band key stored in the index's table (once per entry), as uint64 arrays of at most ``chunk`` keys."""
    return _INDEX_ROWS.stored_keys(txn, chunk)


def stored_slot_keys(txn: IndexTxn, chunk: int) -> Iterator[tuple[np.ndarray, tuple[int, int]]]:
    """The band filter's key (``bandfilter.slot_keys``) of every entry of the index's table, a run of serials
    after another (the filter's layers then cover the runs in order, as merges fill them), as uint64 arrays of
    at most ``chunk`` keys, each with its run's first and last serial."""
    bases = run_bases(txn).tolist()
    last = max(bases[-1], txn.counters.get("next_serial", 0))
    for run, (first, end) in enumerate(zip(bases, bases[1:] + [last + 1])):
        serials = (first, end - 1)
        pairs = _run_entries(txn, run)
        while rows := list(itertools.islice(pairs, chunk)):
            bands, keys, _, _ = _INDEX_ROWS.decoded(b"".join(k + v for k, v in rows))
            yield bandfilter.slot_keys(band_slots(bands, keys)), serials


def _run_entries(txn: IndexTxn, run: int) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) row of the index's table whose bucket is of this run of serials, in table
    order (the buckets of other runs skipped by one positioning each)."""
    cursor = txn.txn.cursor(db=txn.dbs["bands"])
    run_mask = (1 << (16 - _HIGH_BITS)) - 1
    wanted = run
    while wanted < 1 << (8 * _KEY_BYTES) and cursor.set_range(wanted.to_bytes(_KEY_BYTES, "big")):
        bucket = int.from_bytes(cursor.key(), "big")
        if bucket & run_mask == run:
            yield from cursor.iternext_dup(keys=True, values=True)
            wanted = bucket + 1
        elif bucket & run_mask < run:
            wanted = (bucket & ~run_mask) | run
        else:
            wanted = (bucket | run_mask) + 1 + run


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
    """The band table of one index, with the writer's filter of its keys (``filter_bytes`` 0: none), and the
    writer's filter of the id and content tables' hashes (``hashed``), kept on the same terms."""

    def __init__(self, index: Index, filter_bytes: int = 0, filter_max_bytes: int = 0):
        self.index = index
        self.filter_bytes = filter_bytes
        self.filter_max_bytes = filter_max_bytes  # it grows in layers up to this (``bandfilter``)
        self._saving = []  # the threads writing the filters, if any are
        self._filter: Optional[BandFilter] = None
        self._hashes: Optional[BandFilter] = None
        self._run_base = 0  # the first serial of the last run a merge slice wrote into...
        self._run_serials = RUN_SERIALS  # ...and the serials it may span

    def loaded_filter(self) -> Optional[BandFilter]:
        """The filter of stored keys, loaded or built from the table on first use (None without one), and the
        filter of stored hashes with it (``hash_filter``).

        It reads the index in a transaction of its own: call it before a
        write transaction begins, not inside one.
        """
        if self._filter is None and self.filter_bytes:
            self._filter = bandfilter.load_or_build(self.index, self.filter_bytes,
                                                    lambda txn: stored_slot_keys(txn, bandfilter.SCAN_CHUNK),
                                                    self.filter_max_bytes)
        if self._hashes is None and self.filter_bytes:
            self._hashes = bandfilter.load_or_build(
                self.index, max(8, self.filter_bytes // HASH_FILTER_START),
                lambda txn: hashed.stored_filter_keys(txn, bandfilter.SCAN_CHUNK),
                self.filter_max_bytes // HASH_FILTER_MAX, hashed.FILTER_FILE)
        return self._filter

    @property
    def hash_filter(self) -> Optional[BandFilter]:
        """The filter of the id and content tables' hashes (``hashed.filter_keys``), once ``loaded_filter``."""
        return self._hashes

    # -- lookups -------------------------------------------------------

    def lookup(self, txn: IndexTxn, mirror, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(band slot, serial) of every entry, stored or mirrored, under these band slots.

        ``slots`` are sorted (``lsh.band_slots``: band and band key; each
        once is enough). Stored entries are read in the table's order, one
        cursor positioning per key and epoch (``_stored_rows``); keys the
        filter surely lacks are not asked.
        """
        runs = self.lookup_runs(txn, mirror, slots)
        return np.concatenate([k for k, _ in runs]), np.concatenate([s for _, s in runs])

    def holds_nothing(self, txn: IndexTxn) -> bool:
        """Whether the band table and the rekeyed one are empty (nothing merged yet): a lookup then finds nothing
        there, and needs neither the filter's keys nor the table's walk."""
        stat, dbs = txn.txn.stat, txn.dbs
        return not stat(dbs[_INDEX_ROWS.table])["entries"] and not stat(dbs["rekeyed"])["entries"]

    def lookup_runs(self, txn: IndexTxn, mirror, slots: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """``lookup``'s entries as the runs it joins: the table's (sorted by slot, then serial, while the
        table has one run), the rekeyed table's, the mirror's
        (``RecentMirror.band_runs``); ``candidates.earliest_of_runs`` merges such runs."""
        if self.holds_nothing(txn):  # an index's first ``index.merge_every`` documents: the mirror alone
            return [_NO_RUN, _NO_RUN, *mirror.band_runs(slots)]
        in_order_band, in_order_key, first = _walk_order(slots)
        request = np.empty(int(first.sum()), dtype=KEY_ROW)
        request["band"], request["key"] = in_order_band[first], in_order_key[first]
        everything = request  # the rekeyed table is not in the band filter (its own: ``sites.rekeyed_may_hold``)
        wanted_band, wanted_key = request["band"], request["key"]
        band_filter, last_serial, asked = self._filter, txn.counters.get("next_serial", 0), None
        bases = run_bases(txn)
        if band_filter is not None:
            filter_keys = bandfilter.slot_keys(band_slots(wanted_band, wanted_key))
            maybe = band_filter.may_hold(filter_keys)
            wanted_band, wanted_key = wanted_band[maybe], wanted_key[maybe]
            if len(bases) > 1:  # more than one run: those its layers cover
                asked = band_filter.runs_to_ask(filter_keys[maybe], bases)
        stored_bands, stored_keys_, stored_serials, _ = _INDEX_ROWS.decoded(
            _INDEX_ROWS.stored_rows(txn, wanted_band, wanted_key, last_serial, asked, bases), bases)
        rekeyed = np.zeros(0, dtype=BAND_ROW)  # sites' first pages by their settled content
        if txn.txn.stat(txn.dbs["rekeyed"])["entries"]:
            maybe = rekeyed_may_hold(txn, everything["band"], everything["key"])
            if maybe is not None:
                everything = everything[maybe]
            found = txn.txn.cursor(db=txn.dbs["rekeyed"]).getmulti(as_bytes_list(everything), dupdata=True,
                                                                   dupfixed_bytes=8, keyfixed=True)
            rekeyed = np.frombuffer(found, dtype=BAND_ROW)
        return [(band_slots(stored_bands, stored_keys_), stored_serials),
                (band_slots(rekeyed["band"], rekeyed["key"]), rekeyed["serial"].astype(np.int64)),
                *mirror.band_runs(slots)]

    # -- changes -------------------------------------------------------

    def insert_slice(self, txn: IndexTxn, mirror, number: int, slices: int,
                     bases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write slice ``number`` of ``slices`` of the mirror's band entries (split by band, then by the key's
        high bits: a range of its sorted slots) into the runs starting at ``bases`` (``start_runs``); returns
        their slots and serials (``holding`` takes them)."""
        self._writing(bases)
        slots, serials = mirror.slots, mirror.serials
        low, high = (merged_thresholds(part, slices, txn.index.signing.bands)[0] for part in (number, number + 1))
        begin, end = np.searchsorted(slots, np.array([low, high], dtype=np.uint64)).tolist()
        if begin == end:
            return slots[:0], serials[:0]
        slots, serials = slots[begin:end], serials[begin:end]
        buckets, values = _INDEX_ROWS.words(slots >> _U64(32), slots & KEY_MASK, serials, bases=bases)
        txn.txn.cursor(db=txn.dbs["bands"]).putmulti(put_rows(buckets, _KEY_BYTES, values, _VALUE_BYTES),
                                                     dupdata=True)
        return slots, serials

    def resuming(self, txn: IndexTxn, serials: tuple[int, int], upto: int) -> None:
        """Before the keys of a merge begun before a restart (its band entries' first and last serial ``serials``,
        the merge's ``upto``) are held again: the run it writes into, as its slices ask (``runs_after_merge``),
        so that those keys go into the run's own layer (else into the last run's, which then covers both)."""
        self._writing(np.array(runs_after_merge(run_bases(txn).tolist(), serials[0], upto), dtype=np.uint64))

    def _writing(self, bases: np.ndarray) -> None:
        """Merge slices write into the last of the runs starting at ``bases``."""
        self._run_base = int(bases[-1])
        self._run_serials = RUN_SERIALS if len(bases) <= SHORT_RUNS else 1 << _EPOCH_BITS

    def holding(self, slots: np.ndarray, hashes: Optional[np.ndarray] = None,
                serials: tuple[int, int] = bandfilter.EVERY_SERIAL) -> None:
        """Before entries under these band slots (of serials ``serials``: the first and last), and id and content
        entries of these hashes (their ``hashed.filter_keys``), commit into the tables: the filters must hold
        them (in memory: the saved files are the last finished merge's, ``saved``)."""
        band_filter = self._filter
        if band_filter is not None and len(slots):
            if band_filter.covers[-1][1] < self._run_base <= serials[0]:  # the first keys of a new run
                band_filter.start_run(bandfilter.run_keys(sum(band_filter.held), self._run_base, self._run_serials))
            band_filter.add(bandfilter.slot_keys(slots), serials)
        if self._hashes is not None and hashes is not None and len(hashes):
            self._hashes.add(hashes)

    def saved(self) -> None:
        """After a merge is recorded (every key of it ``holding``): the filters saved with the index's new
        stamp, in threads (the layers that changed; ``bandfilter.save``)."""
        self.wait_saved()
        if self._filter is not None:
            self._saving.append(bandfilter.save(self.index, self._filter, background=True))
        if self._hashes is not None:
            self._saving.append(bandfilter.save(self.index, self._hashes, background=True, name=hashed.FILTER_FILE))

    def wait_saved(self) -> None:
        """Until the filters saved last are written."""
        while self._saving:
            self._saving.pop().join()

    def remove(self, txn: IndexTxn, serial: int, keys: np.ndarray) -> None:
        """Delete a kept document's entries (``keys``: its band keys, ``record_band_keys``)."""
        table_keys, values = _INDEX_ROWS.entries(np.arange(len(keys)), keys, np.full(len(keys), serial),
                                                 bases=run_bases(txn))
        for key, value in zip(table_keys, values):
            txn.delete("bands", key, value)

    def rebuilding(self) -> None:
        """Before the tables are rebuilt from the records: no filter is trusted until one is built from them."""
        self.wait_saved()
        bandfilter.forget_saved(self.index)
        bandfilter.forget_saved(self.index, hashed.FILTER_FILE)
        self._filter = self._hashes = None


def as_bytes_list(rows: np.ndarray) -> list[bytes]:
    """Each row of a structured array as one bytes object (void fields keep trailing zero bytes)."""
    return rows.view(np.dtype((np.void, rows.dtype.itemsize))).tolist()


_NO_RUN = (np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64))  # (slots, serials) of an empty table


def _walk_order(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The band and key of each of ``slots`` in (band, key) order, the B-tree's, walked front to back, and which
    are the first of their slot. Slots sorted as a batch's are (``lsh.sorted_slots``) are in that order already."""
    band, key = (slots >> _U64(32)).astype(np.uint16), slots & KEY_MASK
    first = np.ones(len(slots), dtype=bool)
    if len(slots) < 2 or (slots[1:] >= slots[:-1]).all():
        first[1:] = slots[1:] != slots[:-1]
        return band, key, first
    order = np.argsort(band, kind="stable")
    band, key = band[order], key[order]
    first[1:] = (key[1:] != key[:-1]) | (band[1:] != band[:-1])
    return band, key, first
