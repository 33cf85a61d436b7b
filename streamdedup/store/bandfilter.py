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
Its size is fixed (``index.band_filter_mb``), so memory does not grow with
the index; a larger index only raises the false-positive rate, which costs
lookups, never decisions.

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
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Callable, Iterator, Optional

import numpy as np

__all__ = ["BandFilter", "SCAN_CHUNK", "FILE_NAME", "forget_saved", "load_or_build", "save"]

FILE_NAME = "band-filter.bin"
_HEADER = struct.Struct("<8s32sQQI")  # magic, index id, merged_upto, words, crc32 of the bits
_MAGIC = b"SDBFLT01"

_PROBES = 4  # bits per key
_SPREAD = 0x9E3779B97F4A7C15  # odd: a bijection of the 64-bit words
_SHIFTS = tuple(np.uint64(64 - 6 * (i + 1)) for i in range(_PROBES))  # bit positions from the top 24 bits
SCAN_CHUNK = 1 << 20  # table keys read per step when building from the tables


class BandFilter:
    """May the band tables hold this key? False is certain, True is probable."""

    def __init__(self, size_bytes: int):
        words = max(1, size_bytes // 8)
        self.words = 1 << (words.bit_length() - 1)  # a power of two: the word is a mask of the low bits
        self.bits = np.zeros(self.words, dtype=np.uint64)
        self.keys_added = 0  # by this process
        self.loaded = False  # read from the saved file (else built from the tables, or new)

    @classmethod
    def of_keys(cls, chunks: Iterator[np.ndarray], size_bytes: int) -> "BandFilter":
        """A filter holding every key of ``chunks`` (arrays of band keys: memory stays flat)."""
        made = cls(size_bytes)
        for keys in chunks:
            made.add(keys)
        return made

    def add(self, keys: np.ndarray) -> None:
        """Set the bits of these band keys (uint64)."""
        word, mask = self._slots(keys)
        np.bitwise_or.at(self.bits, word, mask)
        self.keys_added += len(keys)

    def may_hold(self, keys: np.ndarray) -> np.ndarray:
        """For each key (uint64): False if the tables surely lack it."""
        word, mask = self._slots(keys)
        return (self.bits[word] & mask) == mask

    def _slots(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(over="ignore"):
            keys = np.asarray(keys, dtype=np.uint64) * np.uint64(_SPREAD)  # 32-bit keys over all 64 bits
        word = (keys & np.uint64(self.words - 1)).astype(np.int64)
        mask = np.zeros(len(keys), dtype=np.uint64)
        for shift in _SHIFTS:
            mask |= np.left_shift(np.uint64(1), (keys >> shift) & np.uint64(63))
        return word, mask

    def fill_ratio(self) -> float:
        """Fraction of bits set (the false-positive rate is about this to the fourth power)."""
        ones = sum(int(np.unpackbits(part.view(np.uint8)).sum()) for part in np.array_split(self.bits, 64))
        return ones / (64 * self.words)


def load_or_build(index, size_bytes: int, stored_keys: Callable[..., Iterator[np.ndarray]]) -> BandFilter:
    """The saved filter if it is this index's current one, else one built from ``stored_keys(txn)`` (and saved)."""
    with index.read() as txn:
        stamp = _stamp(index, txn)
        loaded = _load(os.path.join(index.path, FILE_NAME), stamp, size_bytes)
        if loaded is not None:
            return loaded
        built = BandFilter.of_keys(stored_keys(txn), size_bytes)
    if built.keys_added:  # an empty one is made again in no time
        save(index, built)
    return built


def save(index, band_filter: BandFilter) -> bool:
    """Write the filter with the index's current stamp: a new file, flushed, then renamed over the old one.

    Best effort: the file only saves building the filter at the next start,
    so a full disk leaves the old file (whose stamp no longer matches) and
    says False.
    """
    with index.read() as txn:
        stamp = _stamp(index, txn)
    path = os.path.join(index.path, FILE_NAME)
    header = _HEADER.pack(_MAGIC, *stamp, band_filter.words, zlib.crc32(band_filter.bits.view(np.uint8)))
    try:
        with open(path + ".new", "wb") as handle:
            handle.write(header)
            handle.write(band_filter.bits.tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".new", path)
        return True
    except OSError:
        forget_saved(index, FILE_NAME + ".new")
        return False


def forget_saved(index, name: str = FILE_NAME) -> None:
    """Remove the saved filter (before the tables are rebuilt: until it is saved again, none is trusted)."""
    try:
        os.remove(os.path.join(index.path, name))
    except FileNotFoundError:
        pass


def _stamp(index, txn) -> tuple[bytes, int]:
    return index.meta["index_id"].encode()[:32], txn.counters["merged_upto"]


def _load(path: str, stamp: tuple[bytes, int], size_bytes: int) -> Optional[BandFilter]:
    """The filter saved at ``path`` if it carries ``stamp``, has the configured size and is intact; else None."""
    made = BandFilter(size_bytes)
    try:
        with open(path, "rb") as handle:
            header = handle.read(_HEADER.size)
            if len(header) != _HEADER.size:
                return None
            magic, index_id, merged_upto, words, crc = _HEADER.unpack(header)
            if (magic, index_id.rstrip(b"\0"), merged_upto, words) != (_MAGIC, stamp[0], stamp[1], made.words):
                return None
            if handle.readinto(made.bits.view(np.uint8)) != made.words * 8 or handle.read(1):
                return None
    except FileNotFoundError:
        return None
    if zlib.crc32(made.bits.view(np.uint8)) != crc:
        return None
    made.loaded = True
    return made
