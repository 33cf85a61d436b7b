"""One batch's view of the index: tables and mirror read in bulk, the batch's own writes on top.

A lookup asks the tables (``bands``, ``hashed``), the recent mirror
(``mirror``) and the documents of its own batch; what the batch decided is
written back in one ``putmulti`` per table (``write_documents``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import msgpack
import numpy as np

from ..core import eliasfano
from ..core.lsh import sorted_slots
from ..errors import IndexFullError
from .candidates import Hits, file_kept, keys_shared_within, room_under, with_extra_candidates
from .hashed import serials_of_many
from .index import MAX_SERIAL, DocRecord, IndexTxn, content_key, serial_key, u64
from .mirror import RecentMirror, pack_recent

if TYPE_CHECKING:
    from .bands import BandTables

__all__ = ["BatchView", "write_documents", "first_documents"]


def _coded(shingles: list[np.ndarray]) -> list[bytes]:
    """The stored form of each kept document's shingles (``eliasfano``), coded in one call."""
    if not shingles:
        return []
    offsets = np.zeros(len(shingles) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in shingles], out=offsets[1:])
    return eliasfano.encode_many(np.concatenate(shingles), offsets)


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
            asked, rows, _ = sorted_slots(band_keys)  # the batch's slots sorted, once for every lookup
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
            shared = self._shared_keys.get(row, ())  # most rows share no key with a later one
            if shared:
                file_kept(self._kept_by_key, shared, serial, self._room, self.per_key)

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


def _rows_differing(keys: np.ndarray, signed: np.ndarray) -> frozenset:
    """The rows whose lookup keys are not their signed ones (content keys of pages with a template left out)."""
    if keys is signed:
        return frozenset()
    return frozenset(np.flatnonzero((keys != signed).any(axis=1)).tolist())
