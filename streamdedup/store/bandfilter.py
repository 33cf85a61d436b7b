"""A Bloom filter over the band tables' keys, held by the writer.

Most band keys a batch asks for were never stored: a new document's bands
are new. In a large index each such question is a B-tree descent through
pages spread over hundreds of megabytes (about a microsecond each, mostly
cache and TLB misses), and a batch asks ``bands x batch_size`` of them. The
filter answers most of them from memory; only keys it may hold go to LMDB.

It is blocked: the bits of one key all sit in one 64-bit word, so a key
costs one memory access. The word comes from a key's low bits, the bit
positions from its high bits, after one multiplication by an odd constant
spreads the 32-bit band keys (``fmix64`` outputs) over the word.
It starts at ``index.band_filter_mb`` and grows in layers as keys fill it:
a layer takes keys until it holds one for every ``BITS_PER_KEY`` of its bits
(the first layer; each later one ``TIGHTEN`` times as many bits a key, so
its false-positive rate when full is about 0.62 times the one before),
then a layer twice as large takes the next ones, up to
``index.band_filter_max_mb`` in all (past that the last layer fills on, and
only the false-positive rate rises, which costs lookups, never decisions).
The next layer is made ahead, its pages faulted in a share at a time from
half of the last one's keys on, so no merge step waits for them (``_ahead``).
A key may be held if any layer may hold it, so the false-positive rate is
about the sum of the layers' (1.1%, 0.7%, 0.5%, 0.3% ... when full: under
3% however many layers), and memory follows the keys held (a band entry
takes 1.5 bytes in the first layer, 3 in the fifth), never more than the
cap. A fixed 32 MiB filter was 80% false positives at 10M documents (227M
band entries): almost every key asked went to the B-tree again, once per
epoch of serials.

Its keys are band slots (``slot_keys``: the band key salted by its band),
not the 32-bit band keys alone: a band key is stored in some band far more
often than in the band asked (at 10M documents 5% of all 32-bit values are
some band's key), and a filter of the bare keys said "may hold" for all of
those (7.9% of random keys at 10M, of which 5 points were such keys).

The filter is derived data. The writer adds the keys of each merge and
saves it next to the index (``band-filter.bin``, written whole and renamed
into place), stamped with the index id and ``merged_upto``: the tables gain
keys only in merges, so a file with the index's current stamp holds every
key. Any other file is ignored and the filter is built again from the tables
(seconds per million documents). Keys removed from the tables (``forget``,
retention) stay set, which is harmless. A key missing from it would hide a
stored document, so every path that adds band entries (merges and ``check
--fix``) goes through ``bands.BandTables``, which adds them here as well.
Deleting the file is always safe.

Each layer knows the serials of the entries whose keys it took
(``covers``: merges fill the layers in serial order, a generation at a time,
so their ranges barely overlap). A key the filter may hold is asked of the
table only in the runs of serials (``bands``) that the layers which may
hold it cover (``runs_to_ask``): a key the early layers alone may hold is
positioned in the early runs only, not in every run. Each run after the
first starts a layer of its own, sized to the keys it is expected to hold
(``start_run``: as many a serial as the runs before, at the ``TIGHTEST``
layer's bits a key, rounded up to a power of two words), so memory follows
the runs (64 MiB a run of 2^20 serials of the synthetic crawl) and each run
adds the same small share of false positives (0.2-0.3%): the filter's rate
rises by that much a run, and the cap is reached after about
``band_filter_max_mb`` / 64 runs. Past it, two neighbouring layers of one
size are folded into one (``_fold``) to make room for each new run's layer:
the rate then rises by about 0.9% a run (the last layer filling on with
every later run's keys let 47% of random keys through at 20M documents).

The same class, saved under another name, is the writer's filter of the id
and content tables' hashes (``hashed.FILTER_FILE``), kept on these terms.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from typing import Callable, Iterator, Optional

import numpy as np

try:
    from ..core import _kernel
except ImportError:  # built without a C compiler: numpy does it, with the same bits and answers
    _kernel = None

__all__ = ["BandFilter", "SCAN_CHUNK", "FILE_NAME", "forget_saved", "load_or_build", "save", "slot_keys"]

FILE_NAME = "band-filter.bin"
_HEADER = struct.Struct("<8s32sQQI")  # magic, index id, merged_upto, layers, crc32 of the layers' records
_LAYER = struct.Struct("<QQIQQ")  # a layer's words, the keys it took, the crc32 of its file (FILE_NAME.number),
#                                   the first and last serial it covers
_MAGIC = b"SDBFLT05"  # 01: one layer, its bits after the header; 03: bare band keys, 12 bits a key in every layer;
#                       04: layers without the serials they cover
EVERY_SERIAL = (0, (1 << 32) - 1)  # what keys added without their serials may belong to
_NO_SERIAL = (1 << 32, 0)  # what an empty layer covers: nothing (first > last)
BITS_PER_KEY = 12  # the first layer is full when it holds a key for every this many of its bits (1.1% false positives)
TIGHTEN = 2 ** 0.25  # each later layer takes this many times the bits a key of the one before (x0.62 false positives)
TIGHTEST = 3  # up to the fourth layer (20.2 bits a key, 0.3%), where a run's layer (``start_run``) is full too

_PROBES = 4  # bits per key
_SPREAD = 0x9E3779B97F4A7C15  # odd: a bijection of the 64-bit words
_SHIFTS = tuple(np.uint64(64 - 6 * (i + 1)) for i in range(_PROBES))  # bit positions from the top 24 bits
SCAN_CHUNK = 1 << 20  # table keys read per step when building from the tables
_WRITE_CHUNK = 1 << 20  # bytes of a layer read and written at a time when saving
AHEAD_FROM = 2  # the next layer is made once the last one holds 1/AHEAD_FROM of its keys...
_CATCH_UP = 4 << 20  # ...and its pages touched as keys come, at most this many bytes at a time
KERNEL_LAYERS = 64  # layers ``_kernel.bloom_may_hold`` reads in one call (more: asked in groups, OR-ed)


class BandFilter:
    """May the band tables hold this key? False is certain, True is probable."""

    def __init__(self, size_bytes: int, max_bytes: int = 0):
        words = max(1, size_bytes // 8)
        self.words = 1 << (words.bit_length() - 1)  # a power of two: the word is a mask of the low bits
        self.max_words = max(self.words, max_bytes // 8)  # of every layer together
        self.layers = [np.zeros(self.words, dtype=np.uint64)]  # each a power of two words: twice the one before,
        #                                                           or sized to a new run's keys (``start_run``)
        self.held = [0]  # keys each layer took
        self.covers = [_NO_SERIAL]  # (first, last) serial of the entries whose keys each layer took
        self.for_run = [False]  # whether each layer was sized for a run's keys (``start_run``: none made ahead)
        self.keys_added = 0  # by this process
        self.loaded = False  # read from the saved file (else built from the tables, or new)
        self.saved: list[tuple[int, ...]] = []  # (words, keys taken, crc32, first, last) of each layer as last saved
        self.ahead: Optional[np.ndarray] = None  # the next layer, made before it is needed (``_ahead``)
        self.ahead_touched = 0  # bytes of it written so far (its pages faulted in)
        self.folds = 0  # layers folded (``_fold``): a save begun before one must not record its shapes after it
        self.saved_lock = threading.Lock()

    @property
    def bits(self) -> np.ndarray:
        """Every layer's words, one after the other."""
        return self.layers[0] if len(self.layers) == 1 else np.concatenate(self.layers)

    @property
    def size_bytes(self) -> int:
        return 8 * sum(len(layer) for layer in self.layers)

    @classmethod
    def of_keys(cls, chunks: Iterator, size_bytes: int, max_bytes: int = 0) -> "BandFilter":
        """A filter holding every key of ``chunks`` (arrays of band keys, or (keys, (first, last) serial of their
        entries) pairs: memory stays flat)."""
        made, run = cls(size_bytes, max_bytes), None
        for chunk in chunks:
            if not isinstance(chunk, tuple):
                made.add(chunk)
                continue
            keys, serials = chunk
            if run is not None and serials != run:  # the next run of serials (``bands.stored_slot_keys``)
                made.start_run(run_keys(sum(made.held), serials[0], serials[1] - serials[0] + 1))
            made.add(keys, serials)
            run = serials
        return made

    def add(self, keys: np.ndarray, serials: tuple[int, int] = EVERY_SERIAL) -> None:
        """Set the bits of these band keys (uint64), in the last layer, or a new one once it is full; ``serials``:
        the first and last serial of their entries (the layers taking them cover those)."""
        keys = np.asarray(keys, dtype=np.uint64)
        self.keys_added += len(keys)
        while len(keys):
            room = self._capacity() - self.held[-1]
            if room <= 0 and self._may_grow():
                self._touch_ahead(len(self.ahead) * 8 if self.ahead is not None else 0)
                self.layers.append(self.ahead if self.ahead is not None else
                                   np.zeros(2 * len(self.layers[-1]), dtype=np.uint64))
                self.held.append(0)
                self.covers.append(_NO_SERIAL)
                self.for_run.append(False)
                self.ahead, self.ahead_touched = None, 0
                continue
            taken = keys if room <= 0 else keys[:room]
            _set(self.layers[-1], taken)
            self.held[-1] += len(taken)
            first, last = self.covers[-1]
            self.covers[-1] = (min(first, serials[0]), max(last, serials[1]))
            keys = keys[len(taken):]
            self._ahead()

    def start_run(self, keys: int) -> None:
        """The keys added next, those of a new run of serials (``bands.run_bases``) expected to hold about ``keys``
        keys, go into a new layer sized for them (``run_layer_words``), if the last holds keys; where the cap leaves
        no room for it, layers are folded first (``_fold``), and if none can be, the layer is as large as the
        room left (none: the last layer fills on). A key that layer alone may hold is then
        asked in that run alone (``runs_to_ask``), and each run's layer lets through about the same share of keys
        (0.2-0.3%) whatever the run's number, in memory that follows the keys (a layer as large as the last, as
        before, took ever more bits a key: 928 MiB at 10M documents, the cap reached at about 11M)."""
        if not self.held[-1]:
            return
        wanted = run_layer_words(keys, len(self.layers))
        while self.max_words - self.size_bytes // 8 < wanted and self._fold():
            pass
        room = self.max_words - self.size_bytes // 8
        if room < 1:
            return
        words = min(wanted, 1 << (room.bit_length() - 1))
        self.layers.append(np.zeros(words, dtype=np.uint64))
        self.held.append(0)
        self.covers.append(_NO_SERIAL)
        self.for_run.append(True)
        self.ahead, self.ahead_touched = None, 0

    def _fold(self) -> bool:
        """Make room under the cap for a new run's layer: two neighbouring layers of one size become one, their
        words OR-ed (every key either held is held: its bits are in the same word of both), covering both runs;
        the pair holding the fewest keys, the oldest of equals. Whether a pair was found.

        Past the cap, the last layer filling on with every later run's keys let through 8.8% of random keys at
        15M documents and 47% at 20M (the cap reached at about 15M: "The filter's layers sized to their runs");
        a folded pair of run layers lets through about 1.4% (twice the keys in the bits of one), and each run
        keeps a layer of its own."""
        pairs = [number for number in range(len(self.layers) - 1)
                 if len(self.layers[number]) == len(self.layers[number + 1])]
        if not pairs:
            return False
        number = min(pairs, key=lambda n: (self.held[n] + self.held[n + 1], n))
        self.layers[number] |= self.layers[number + 1]
        self.held[number] += self.held[number + 1]
        (first, last), (later_first, later_last) = self.covers[number], self.covers[number + 1]
        self.covers[number] = (min(first, later_first), max(last, later_last))
        for kept in (self.layers, self.held, self.covers, self.for_run):
            del kept[number + 1]
        with self.saved_lock:  # the layers from the folded one on are saved again, whole
            self.saved = self.saved[:number]
            self.folds += 1
        return True

    def _capacity(self) -> int:
        """Keys the last layer takes before the next one does: fewer a bit in each later layer, so the layers'
        false-positive rates, whose sum is the filter's, fall as a geometric series (measured, a layer full:
        1.1%, 0.7%, 0.5%, 0.3%, 0.2%)."""
        return layer_capacity(len(self.layers[-1]), len(self.layers) - 1)

    def _ahead(self) -> None:
        """Once the last layer holds 1/``AHEAD_FROM`` of its keys, the next one is made and its pages written
        (faulted in) as keys come, so that it is whole when the last is full: a layer twice as large faulted
        in by its first keys took ~0.8 s in the step that made it (64 MiB at 1M documents, ``bench.growth``).
        Memory: the next layer is there a little sooner, within ``index.band_filter_max_mb``. A layer sized for
        its run's keys (``start_run``) is not expected to fill: none is made after it."""
        capacity, held = self._capacity(), self.held[-1]
        begin = capacity // AHEAD_FROM
        if held <= begin or self.for_run[-1] or not self._may_grow():
            return
        if self.ahead is None:
            self.ahead, self.ahead_touched = np.empty(2 * len(self.layers[-1]), dtype=np.uint64), 0
        size = len(self.ahead) * 8
        due = min(size, -(-size * (held - begin) // max(1, capacity - begin)))
        self._touch_ahead(min(due, self.ahead_touched + _CATCH_UP))

    def _touch_ahead(self, upto: int) -> None:
        """Zero the next layer up to byte ``upto`` (its pages written: faulted in now, not by its first keys)."""
        if self.ahead is not None and upto > self.ahead_touched:
            self.ahead.view(np.uint8)[self.ahead_touched:upto] = 0
            self.ahead_touched = upto

    def _may_grow(self) -> bool:
        return self.size_bytes // 8 + 2 * len(self.layers[-1]) <= self.max_words

    def may_hold(self, keys: np.ndarray) -> np.ndarray:
        """For each key (uint64): False if the tables surely lack it. In the kernel, a key's words in every
        layer are fetched while earlier keys are tested (with a layer more each time the index doubles, the
        numpy passes below cost a layer's cache misses each)."""
        if _kernel is not None:
            keys = np.ascontiguousarray(keys, dtype=np.uint64)
            held = np.empty(len(keys), dtype=np.bool_)
            _kernel.bloom_may_hold(keys, tuple(self.layers[:KERNEL_LAYERS]), held.view(np.uint8))
            for first in range(KERNEL_LAYERS, len(self.layers), KERNEL_LAYERS):
                more = np.empty(len(keys), dtype=np.bool_)
                _kernel.bloom_may_hold(keys, tuple(self.layers[first:first + KERNEL_LAYERS]), more.view(np.uint8))
                held |= more
            return held
        spread, mask = _spread(keys)
        found = None
        for layer in self.layers:
            held = (layer[(spread & np.uint64(len(layer) - 1)).astype(np.int64)] & mask) == mask
            found = held if found is None else found | held
        return found

    def runs_to_ask(self, keys: np.ndarray, bases: np.ndarray) -> np.ndarray:
        """For each of these keys (which ``may_hold``), the runs of serials (starting at ``bases``, ascending from
        0: ``bands.run_bases``) where its entries may be, as a bool matrix (run, key): those the layers that may
        hold the key cover (each layer asked alone: a few keys, those past ``may_hold``)."""
        asked = np.zeros((len(bases), len(keys)), dtype=bool)
        for layer, (first, last) in zip(self.layers, self.covers):
            if first > last or not len(keys):
                continue
            held = self._layer_may_hold(layer, keys)
            runs = np.searchsorted(bases, np.array([first, last], dtype=np.uint64), side="right") - 1
            asked[runs[0]:runs[1] + 1] |= held
        return asked

    def _layer_may_hold(self, layer: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """``may_hold`` of one layer alone."""
        if _kernel is not None:
            held = np.empty(len(keys), dtype=np.bool_)
            _kernel.bloom_may_hold(np.ascontiguousarray(keys, dtype=np.uint64), (layer,), held.view(np.uint8))
            return held
        spread, mask = _spread(keys)
        return (layer[(spread & np.uint64(len(layer) - 1)).astype(np.int64)] & mask) == mask

    def fill_ratio(self) -> float:
        """Fraction of bits set, over every layer (a layer's false-positive rate is about its own to the fourth
        power, the filter's about their sum)."""
        ones = sum(int(np.unpackbits(part.view(np.uint8)).sum()) for layer in self.layers
                   for part in np.array_split(layer, 64))
        return ones / (64 * self.size_bytes // 8)


def layer_capacity(words: int, number: int) -> int:
    """Keys layer ``number`` (0 first) of ``words`` 64-bit words takes when full."""
    return int(words * 64 / layer_bits(number))


def layer_bits(number: int) -> float:
    """Bits a key layer ``number`` (0 first) takes when full: ``TIGHTEN`` times more each layer up to the
    ``TIGHTEST``'s."""
    return BITS_PER_KEY * TIGHTEN ** min(number, TIGHTEST)


def run_layer_words(keys: int, number: int) -> int:
    """Words of a layer ``number`` made for a run's ``keys``: the least power of two that takes them all (20-40
    bits a key past the fourth layer: 64 MiB for a run of 2^20 serials of the synthetic crawl, 24M keys)."""
    words = max(1, -(-int(keys * layer_bits(number)) // 64))
    return 1 << (words - 1).bit_length()


def run_keys(keys: int, first_serial: int, serials: int) -> int:
    """Keys a run of ``serials`` serials starting at ``first_serial`` is expected to hold, with ``keys`` the keys of
    the runs before it: as many a serial as they held."""
    return -(-keys * serials // max(1, first_serial))


_SALT = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # splitmix64's finaliser


def slot_keys(slots: np.ndarray) -> np.ndarray:
    """The filter's key of each band slot (``lsh.band_slots``: band << 32 | band key): the band key XOR a 64-bit
    salt made from its band (splitmix64's finaliser of band + 1), so that the same band key in two bands is two
    unrelated keys (their low bits, which choose the word, differ too). Fixed forever: saved filters hold these."""
    slots = np.asarray(slots, dtype=np.uint64)
    with np.errstate(over="ignore"):
        salt = (slots >> np.uint64(32)) + np.uint64(1)
        salt = (salt ^ (salt >> np.uint64(30))) * np.uint64(_SALT[0])
        salt = (salt ^ (salt >> np.uint64(27))) * np.uint64(_SALT[1])
        salt ^= salt >> np.uint64(31)
    return (slots & np.uint64(0xFFFFFFFF)) ^ salt


def _spread(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each key spread over 64 bits, its mask of bits to set in its word)."""
    with np.errstate(over="ignore"):
        keys = np.asarray(keys, dtype=np.uint64) * np.uint64(_SPREAD)  # 32-bit keys over all 64 bits
    mask = np.zeros(len(keys), dtype=np.uint64)
    for shift in _SHIFTS:
        mask |= np.left_shift(np.uint64(1), (keys >> shift) & np.uint64(63))
    return keys, mask


def _set(layer: np.ndarray, keys: np.ndarray) -> None:
    """Set the bits of ``keys`` in one layer: sorted by word, each word's masks OR-ed together (``ufunc.at``
    is several times slower)."""
    if not len(keys):
        return
    if _kernel is not None:
        _kernel.bloom_set(np.ascontiguousarray(keys, dtype=np.uint64), (layer,))
        return
    spread, mask = _spread(keys)
    word = (spread & np.uint64(len(layer) - 1)).astype(np.int64)
    order = np.argsort(word, kind="stable")
    word, mask = word[order], mask[order]
    starts = np.flatnonzero(np.concatenate(([True], word[1:] != word[:-1])))
    layer[word[starts]] |= np.bitwise_or.reduceat(mask, starts)


def load_or_build(index, size_bytes: int, stored_keys: Callable[..., Iterator],
                  max_bytes: int = 0, name: str = FILE_NAME) -> BandFilter:
    """The saved filter if it is this index's current one, else one built from ``stored_keys(txn)`` (arrays of
    keys, or (keys, serials) pairs as ``BandFilter.of_keys`` takes them), and saved. ``name``: its file (another
    filter of the same kind: ``hashed.FILTER_FILE``)."""
    with index.read() as txn:
        stamp = _stamp(index, txn)
        loaded = _load(index.path, stamp, size_bytes, max_bytes, name)
        if loaded is not None:
            return loaded
        built = BandFilter.of_keys(stored_keys(txn), size_bytes, max_bytes)
    if built.keys_added:  # an empty one is made again in no time
        save(index, built, name=name)
    return built


def save(index, band_filter: BandFilter, background: bool = False,
         name: str = FILE_NAME) -> Optional[threading.Thread]:
    """Write the filter with the index's current stamp: each layer that changed since it was last saved (a
    file of its own: a full layer never changes, so it is written once), then the header naming every layer
    with its checksum, each file new, flushed, then renamed over the old one.

    With ``background``, the writing happens in a thread, which is returned: join it before the next save. It
    reads the layers as they are (a copy of a large layer faulted in as many new pages as the layer has, 0.3 s
    at 64 MiB here): the writer only sets bits meanwhile, so the file holds every key held at the stamp and
    perhaps a few more, which is harmless; each layer's checksum is of the bytes written. Best effort: the
    files only save building the filter at the next start, so a full disk leaves the old header (whose stamp
    no longer matches).
    """
    with index.read() as txn:
        stamp = _stamp(index, txn)
    saved = band_filter.saved
    changed = {number: layer for number, (layer, held) in enumerate(zip(band_filter.layers, band_filter.held))
               if number >= len(saved) or saved[number][:2] != (len(layer), held)}
    shapes = [(len(layer), held) for layer, held in zip(band_filter.layers, band_filter.held)]
    covers = list(band_filter.covers)  # as of the stamp: keys added later are held again after a restart
    folds = band_filter.folds

    def write() -> None:
        crcs = [saved[number][2] if number not in changed else 0 for number in range(len(shapes))]
        try:
            for number, layer in changed.items():
                crcs[number] = _write(os.path.join(index.path, f"{name}.{number}"), layer.view(np.uint8))
            records = b"".join(_LAYER.pack(words, held, crc, *covered)
                               for (words, held), crc, covered in zip(shapes, crcs, covers))
            header = _HEADER.pack(_MAGIC, *stamp, len(shapes), zlib.crc32(records))
            _write(os.path.join(index.path, name), header + records)
        except OSError:
            return
        with band_filter.saved_lock:  # not if layers were folded meanwhile: their numbers changed
            if band_filter.folds == folds:
                band_filter.saved = [(words, held, crc, *covered)
                                     for (words, held), crc, covered in zip(shapes, crcs, covers)]

    if not background:
        write()
        return None
    thread = threading.Thread(target=write, name="band-filter-save", daemon=True)
    thread.start()
    return thread


def _write(path: str, data) -> int:
    """Write ``data`` (bytes, or a uint8 array read a chunk at a time) into a new file renamed over ``path``;
    the crc32 of what was written."""
    crc = 0
    try:
        with open(path + ".new", "wb") as handle:
            for at in range(0, len(data), _WRITE_CHUNK):
                chunk = bytes(data[at:at + _WRITE_CHUNK])  # one read of the bytes: checksummed as written
                crc = zlib.crc32(chunk, crc)
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".new", path)
        return crc
    except OSError:
        try:
            os.remove(path + ".new")
        except OSError:
            pass
        raise


def forget_saved(index, name: str = FILE_NAME) -> None:
    """Remove the saved filter (before the tables are rebuilt: until it is saved again, none is trusted): its
    header, which names its layers' files (those are left: a header written later names them again)."""
    try:
        os.remove(os.path.join(index.path, name))
    except FileNotFoundError:
        pass


def _stamp(index, txn) -> tuple[bytes, int]:
    return index.meta["index_id"].encode()[:32], txn.counters["merged_upto"]


def _load(folder: str, stamp: tuple[bytes, int], size_bytes: int, max_bytes: int = 0,
          name: str = FILE_NAME) -> Optional[BandFilter]:
    """The filter saved in ``folder`` if it carries ``stamp``, starts at the configured size, fits the configured
    cap and every layer's file is intact; else None."""
    made = BandFilter(size_bytes, max_bytes)
    try:
        with open(os.path.join(folder, name), "rb") as handle:
            header = handle.read(_HEADER.size)
            if len(header) != _HEADER.size:
                return None
            magic, index_id, merged_upto, layers, records_crc = _HEADER.unpack(header)
            if (magic, index_id.rstrip(b"\0"), merged_upto) != (_MAGIC, stamp[0], stamp[1]) or not 0 < layers < 64:
                return None
            records = handle.read(_LAYER.size * layers)
            if handle.read(1) or zlib.crc32(records) != records_crc:  # the serials covered are trusted too
                return None
            shapes = list(_LAYER.iter_unpack(records))
        sizes = [shape[0] for shape in shapes]
        if sizes[0] != made.words or any(size < 1 or size & (size - 1) for size in sizes) \
                or sum(sizes) > made.max_words:
            return None
        made.layers = [np.zeros(shape[0], dtype=np.uint64) for shape in shapes]
        made.held = [shape[1] for shape in shapes]
        made.covers = [(first, last) for _, _, _, first, last in shapes]
        made.for_run = [False] + [later != 2 * size for size, later in zip(sizes, sizes[1:])]  # growth doubles
        for number, (layer, (_, _, crc, _, _)) in enumerate(zip(made.layers, shapes)):
            with open(os.path.join(folder, f"{name}.{number}"), "rb") as handle:
                if handle.readinto(layer.view(np.uint8)) != len(layer) * 8 or handle.read(1):
                    return None
            if zlib.crc32(layer.view(np.uint8)) != crc:
                return None
    except (FileNotFoundError, struct.error):
        return None
    made.saved = list(shapes)
    made.loaded = True
    return made
