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
"""

from __future__ import annotations

from typing import Iterable, Iterator

from .index import IndexTxn, from_u64, serial_key

__all__ = ["each_serial_of", "HASH_BYTES", "entry", "serials_of", "serials_of_many", "entries"]

HASH_BYTES = 8
_BUCKET_BYTES = 2
_FIRST = b"\x00" * 4  # the smallest serial: where a hash's entries begin


def entry(digest: bytes, serial: int) -> tuple[bytes, bytes]:
    """The (key, value) of the entry saying that ``serial`` has the 8-byte hash ``digest``."""
    return digest[:_BUCKET_BYTES], digest[_BUCKET_BYTES:HASH_BYTES] + serial_key(serial)


def serials_of(cursor, digest: bytes) -> list[int]:
    """The serials with the 8-byte hash ``digest`` (ascending), read through a cursor of the table."""
    return list(each_serial_of(cursor, digest))


def each_serial_of(cursor, digest: bytes) -> Iterator[int]:
    """``serials_of``, read as they are asked for: a caller after the first of many (the first document of
    a content copied a hundred thousand times) reads one."""
    bucket, rest = digest[:_BUCKET_BYTES], digest[_BUCKET_BYTES:HASH_BYTES]
    if cursor.set_range_dup(bucket, rest + _FIRST):
        value = cursor.value()
        while value[:-4] == rest:
            yield from_u64(value[-4:])
            if not cursor.next_dup():
                break
            value = cursor.value()


def serials_of_many(txn: IndexTxn, table: str, digests: Iterable[bytes]) -> dict[bytes, list[int]]:
    """The serials of each of these 8-byte hashes that the table holds (hashes it does not hold are left out)."""
    db = txn.dbs[table]
    found = {}
    if not txn.txn.stat(db)["entries"]:  # nothing merged into it yet (an index's first ``index.merge_every``)
        return found
    cursor = txn.txn.cursor(db=db)
    for digest in sorted(set(digests)):  # in table order: the pages read stay in cache
        serials = serials_of(cursor, digest)
        if serials:
            found[digest] = serials
    return found


def entries(txn: IndexTxn, table: str) -> Iterator[tuple[bytes, int]]:
    """Every (8-byte hash, serial) of the table, in table order."""
    for key, value in txn.txn.cursor(db=txn.dbs[table]):
        yield key + value[:-4], from_u64(value[-4:])
