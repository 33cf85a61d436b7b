"""The ids and content tables: serials found by an 8-byte hash, kept in buckets.

Each table is dupsort, dupfixed: the key is the hash's first 2 bytes (a
bucket), each value (10 bytes, packed by LMDB with the others of its bucket)
the hash's other 6 bytes and a serial (4 bytes, ``index.serial_key``), all
big-endian, so entries sort by hash, then serial. A bucket holds about
entries / 65,536 of them, so an entry costs its 10 bytes and little more
(keyed by the whole hash, each paid LMDB's 8-byte node header and
the free space of pages filled by random inserts, ~32 bytes).

An 8-byte hash may be shared by two ids or contents (about once in 2^64 / n^2
for n of them): a hit is compared with the record before it counts
(``decide``, ``housekeeping``, ``lookup``).

The writer asks both tables through a filter of the hashes they hold (a
``bandfilter.BandFilter`` of ``filter_keys``, saved as ``FILTER_FILE``, kept
by ``bands.BandTables`` with the band filter and on the same terms: every
merge slice's hashes held before it commits, a file trusted only with the
index's current stamp). Most documents have a new id and a new content, and
each such question was a cursor positioning at a random place of a table
that grows with the index (``bench.growth``: about half of what deciding
gained from 10k to 1M documents, 5.5 us a document).
"""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import numpy as np

from .index import IndexTxn, from_u64, serial_key

__all__ = ["BUCKET_BYTES", "each_serial_of", "HASH_BYTES", "entry",
           "serials_of", "serials_of_many", "entries", "FILTER_FILE",
           "filter_keys", "maybe_held", "salted", "stored_filter_keys"]

HASH_BYTES = 8
BUCKET_BYTES = 2
_FIRST = b"\x00" * 4  # the smallest serial: where a hash's entries begin
FILTER_FILE = "hash-filter.bin"
_TABLE_SALT = {"ids": 0x6A09E667F3BCC908, "content": 0xBB67AE8584CAA73B}  # one filter for both tables' hashes


def filter_keys(table: str, digests: list[bytes]) -> np.ndarray:
    """The hash filter's key of each of these hashes of ``table`` (``ids`` or ``content``): its first 8 bytes
    (the table's entry) as a number, XOR a salt of the table, so an id and a content of the same hash are two
    keys. Fixed forever: saved filters hold these."""
    return salted(table, _words(b"".join(digest[:HASH_BYTES] for digest in digests)))


def salted(table: str, words: np.ndarray) -> np.ndarray:
    """``filter_keys`` of hashes given as their first 8 bytes read as big-endian numbers (uint64)."""
    return words ^ np.uint64(_TABLE_SALT[table])


def stored_filter_keys(txn: IndexTxn, chunk: int) -> Iterator[np.ndarray]:
    """The filter key of every entry of the ids and content tables, as uint64 arrays of at most ``chunk``."""
    for table in ("ids", "content"):
        pairs = txn.txn.cursor(db=txn.dbs[table]).iternext(keys=True, values=True)
        while rows := list(itertools.islice(pairs, chunk)):
            yield salted(table, _words(b"".join((k + v)[:HASH_BYTES] for k, v in rows)))


def _words(joined: bytes) -> np.ndarray:
    """8-byte hashes laid end to end, as big-endian numbers (uint64)."""
    return np.frombuffer(joined, dtype=">u8").astype(np.uint64)


def entry(digest: bytes, serial: int) -> tuple[bytes, bytes]:
    """The (key, value) of the entry saying that ``serial`` has the 8-byte hash ``digest``."""
    return digest[:BUCKET_BYTES], digest[BUCKET_BYTES:HASH_BYTES] + serial_key(serial)


def serials_of(cursor, digest: bytes) -> list[int]:
    """The serials with the 8-byte hash ``digest`` (ascending), read through a cursor of the table."""
    return list(each_serial_of(cursor, digest))


def each_serial_of(cursor, digest: bytes) -> Iterator[int]:
    """``serials_of``, read as they are asked for: a caller after the first of many (the first document of
    a content copied a hundred thousand times) reads one."""
    bucket, rest = digest[:BUCKET_BYTES], digest[BUCKET_BYTES:HASH_BYTES]
    if cursor.set_range_dup(bucket, rest + _FIRST):
        value = cursor.value()
        while value[:-4] == rest:
            yield from_u64(value[-4:])
            if not cursor.next_dup():
                break
            value = cursor.value()


def serials_of_many(txn: IndexTxn, table: str, digests: Iterable[bytes],
                    hash_filter=None) -> dict[bytes, list[int]]:
    """The serials of each of these 8-byte hashes that the table holds (hashes it does not hold are left out);
    ``hash_filter`` (the writer's, of ``filter_keys``): hashes it surely lacks are not asked."""
    db = txn.dbs[table]
    found = {}
    if not txn.txn.stat(db)["entries"]:  # nothing merged into it yet (an index's first ``index.merge_every``)
        return found
    cursor = txn.txn.cursor(db=db)
    for digest in maybe_held(table, sorted(set(digests)), hash_filter):  # in table order: pages stay in cache
        serials = serials_of(cursor, digest)
        if serials:
            found[digest] = serials
    return found


def entries(txn: IndexTxn, table: str) -> Iterator[tuple[bytes, int]]:
    """Every (8-byte hash, serial) of the table, in table order."""
    for key, value in txn.txn.cursor(db=txn.dbs[table]):
        yield key + value[:-4], from_u64(value[-4:])


def maybe_held(table: str, digests: list[bytes], hash_filter=None, key=None) -> list[bytes]:
    """Those of ``digests`` that ``table`` may hold, by ``hash_filter`` (None: all of them); ``key``: a digest's
    key in the table (``index.content_key``; default the digest)."""
    if hash_filter is None or not digests:
        return digests
    held = hash_filter.may_hold(filter_keys(table, digests if key is None else [key(d) for d in digests]))
    return [digest for digest, maybe in zip(digests, held.tolist()) if maybe]
