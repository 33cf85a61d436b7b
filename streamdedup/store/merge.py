"""Merging the recent mirror into the hash-keyed tables (``mirror``), a bounded slice at a time."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from .index import IndexTxn, from_u64
from .mirror import RecentMirror

if TYPE_CHECKING:
    from .bands import BandTables

__all__ = ["merge_slices", "merge_slice", "finish_merge", "merge_recent", "MERGE_SLICE_BYTES"]


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
