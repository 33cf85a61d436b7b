"""A batch against the index: the first document of each content, read in bulk, and what the batch decided
written back in one ``putmulti`` per table (``write_documents``)."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..core import eliasfano
from ..core.shingle import ShingleBatch
from ..errors import IndexFullError
from .hashed import each_serial_of, maybe_held
from .index import MAX_SERIAL, DocRecord, IndexTxn, content_key, rows_as_bytes, serial_key, u64
from .mirror import RecentMirror, pack_recent, placed_entries

try:
    from ..core import _kernel
except ImportError:  # built without a C compiler: each record's values made here
    _kernel = None

__all__ = ["write_documents", "first_documents"]


def _coded(shingles: ShingleBatch, rows: np.ndarray) -> list[bytes]:
    """The stored form of the shingles of each of these rows (``eliasfano``), coded in one call."""
    if not len(rows):
        return []
    return eliasfano.encode_many(shingles.hashes, shingles.offsets, rows)


def _stored_first_documents(txn: IndexTxn, contents: list[bytes], record: Callable[[int], DocRecord],
                            hash_filter=None) -> dict[bytes, int]:
    """The content table's document of each of these whole content hashes it holds (``hash_filter``: the
    writer's filter of the table's hashes, ``hashed.maybe_held``).

    The table is keyed by 8 bytes of the hash, which two contents may share:
    each hit's record (read by ``record``) must have the whole hash.
    """
    db = txn.dbs["content"]
    found = {}
    if not txn.txn.stat(db)["entries"]:  # nothing merged into it yet (an index's first ``index.merge_every``)
        return found
    cursor = txn.txn.cursor(db=db)
    asked = sorted(set(contents))  # in table order (a key is a hash's first bytes): the pages read stay in cache
    for c in maybe_held("content", asked, hash_filter, content_key):
        serial = next((s for s in each_serial_of(cursor, content_key(c)) if record(s).content == c), None)
        if serial is not None:
            found[c] = serial
    return found


def first_documents(txn: IndexTxn, mirror: RecentMirror, contents: list[bytes],
                    record: Callable[[int], DocRecord], hash_filter=None) -> dict[bytes, int]:
    """The first document of each content hash: the content table's, else the mirror's (``hash_filter``: the
    writer's filter of the table's hashes)."""
    found = _stored_first_documents(txn, contents, record, hash_filter)
    for c in mirror.contents_held(contents):  # the few the mirror holds
        if c not in found:
            serial = mirror.first_of_content(c)
            if serial is not None:
                found[c] = serial
    return found


def write_documents(txn: IndexTxn, mirror: RecentMirror, records: list[DocRecord], idents: list[bytes],
                    kept_rows: dict[int, int], shingles: ShingleBatch, band_keys: np.ndarray,
                    numbered: Optional[int] = None, placed: Optional[dict[int, tuple[int, int]]] = None,
                    slots: Optional[tuple[np.ndarray, np.ndarray]] = None) -> Callable[[], None]:
    """Write decided documents into the transaction; returns what to do to the mirror once it commits.

    ``records`` in serial order, ``idents`` their id hashes; ``kept_rows``: batch row -> serial of the kept
    ones, in serial order, ``shingles`` the batch's (each row's stored), ``band_keys`` its lookup keys (rows x
    bands). ``numbered``: how many serials the batch used (default: one per document; a shard stores only its
    own documents of a batch numbered for the whole deployment). ``placed``: serial -> (row, bands as bits) of
    the duplicates that took places under band keys (``candidates.file_prober``): entries of theirs, proposing
    nothing. ``slots``: the batch's ``lsh.sorted_slots`` of ``band_keys`` (slots, rows), from which the kept
    documents' mirror entries are taken in the order the mirror sorts them into.
    """
    if records and records[-1].serial > MAX_SERIAL:
        raise IndexFullError(f"the index has numbered {MAX_SERIAL:,} documents, as many as it can; start a new "
                             "index (or shard the input) and keep this one for lookups")
    kept = len(kept_rows)
    kept_row_array = np.fromiter(kept_rows.keys(), dtype=np.int64, count=kept)
    kept_serials = np.fromiter(kept_rows.values(), dtype=np.int64, count=kept)
    kept_keys = band_keys[kept_row_array]
    recent_keys = dict(zip(kept_serials.tolist(), rows_as_bytes(kept_keys.astype(">u4"))))
    placed = placed or {}
    for serial, (row, bands) in placed.items():
        recent_keys[serial] = band_keys[row].astype(">u4").tobytes()
    keys, recent, members, exact, entries = _rows_filed(records, idents, recent_keys, placed)
    writes = {  # every table gets serials in increasing order: appended (memberships by the member's serial)
        "docs": list(zip(keys, txn.pack_records(records))),
        "recent": recent,
        "shingles": list(zip(rows_as_bytes(kept_serials.astype(">u8")), _coded(shingles, kept_row_array))),
        "recent_members": [(member, cluster) for cluster, member in members],  # to ``members`` at a merge
    }
    if members:
        txn.mark_current_format()  # a release of format 7 would not see them: it refuses the index instead
        txn.forget_member_log()
    raw, dbs = txn.txn, txn.dbs
    for name, items in writes.items():
        if items:
            cursor = raw.cursor(db=dbs[name])
            cursor.putmulti(items, dupdata=True, append=True)
    txn.count(next_serial=len(records) if numbered is None else numbered, documents=len(records), kept=kept,
              duplicates=len(records) - kept, exact=exact)
    places = placed_entries(list(placed), [band_keys[row] for row, _ in placed.values()],
                            [bands for _, bands in placed.values()])
    if slots is None or len(places[0]):
        return lambda: mirror.add(entries, kept_serials, kept_keys, places)
    kept_entries = _kept_entries(slots, kept_row_array, kept_serials, len(band_keys))
    return lambda: mirror.add(entries, kept_serials, kept_keys, kept_entries=kept_entries)


def _kept_entries(slots: tuple[np.ndarray, np.ndarray], kept_rows: np.ndarray, kept_serials: np.ndarray,
                  rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept documents' band entries (slot, serial) sorted by slot, equal slots by serial: the batch's
    sorted slots are sorted so (equal slots in row order, and serials follow rows), and the kept rows' are
    taken from them instead of sorted again (``RecentMirror.add``)."""
    serial_of = np.full(rows, -1, dtype=np.int64)
    serial_of[kept_rows] = kept_serials
    if _kernel is not None:  # in one pass (``_kernel.kept_entries``), the same entries
        values, rows_of = np.ascontiguousarray(slots[0], dtype=np.uint64), np.ascontiguousarray(slots[1], np.int64)
        out_slots, out_serials = np.empty(len(values), dtype=np.uint64), np.empty(len(values), dtype=np.int64)
        n = _kernel.kept_entries(values, rows_of, serial_of, out_slots, out_serials)
        return out_slots[:n].copy(), out_serials[:n].copy()  # the mirror keeps them: not views of the whole
    serials = serial_of[slots[1]]
    held = serials >= 0
    return slots[0][held], serials[held]


def _rows_filed(records: list[DocRecord], idents: list[bytes], recent_keys: dict[int, bytes],
                placed: dict[int, tuple[int, int]]) -> tuple[list, list, list, int, list]:
    """What each record files: its docs table key, its ``recent`` entry (``pack_recent``, with
    ``recent_keys`` its band keys and ``placed`` its places), (cluster key, key) of each duplicate, how many
    are exact, and (serial, id hash, content) of each for the mirror; in one kernel call
    (``_kernel.index_rows``, the same values) when there is one."""
    if _kernel is not None:
        return _kernel.index_rows(records, idents, recent_keys, placed)
    keys = [serial_key(record.serial) for record in records]
    recent = [(u64(record.serial), pack_recent(ident, record.content, recent_keys.get(record.serial, b""),
                                               placed[record.serial][1] if record.serial in placed else None))
              for record, ident in zip(records, idents)]
    members = [(serial_key(record.cluster), key) for key, record in zip(keys, records) if not record.kept]
    exact = sum(record.exact for record in records)
    entries = [(record.serial, ident, record.content) for record, ident in zip(records, idents)]
    return keys, recent, members, exact, entries
