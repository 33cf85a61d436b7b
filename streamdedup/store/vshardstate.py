"""A vshard's state in LMDB (``engine.vshards``), changed one epoch at a time, each epoch in one transaction.

One LMDB environment a vshard, in its own folder (``Index``'s opening,
locking, map growth and record and shingle coding, with these tables):

============  ==================================  ===================================================
database      key                                 value
============  ==================================  ===================================================
meta          ``vshard``                          JSON: the vshard's number and count, the settings'
                                                  fingerprint (refused if another opens it)
              ``epoch``                           JSON: epochs done and the caller's metadata of the
                                                  last commit (input positions)
              ``places``                          JSON: the last serial the settled places hold
docs          serial (4 B)                        the record, as one index stores it (``DocRecord``)
shingles      serial (8 B)                        a kept document's shingles, Elias-Fano coded
ids           id hash's first 2 B (``hashed``)    its other 6 B + a serial (dupsort, 10 B each)
members       cluster serial (4 B)                its duplicates living here (dupsort, 4 B each)
source_names  as one index's                      a record stores its source name's number
firsts        content hash (16 B)                 every document with that content, in order: serial
                                                  (4 B), home (2 B), still in a cluster (1 B)
                                                  (dupsort, 7 B each)
places        band (2 B) + band key's high 7 bits   the settled places: the key's low 25 bits, the
              + the serial's epoch (``bands``)    holder's serial's low 23 bits and its home (16
                                                  bits; dupsort, 8 B each: ``bands.BandRows``)
recent_places run number (8 B)                    the places one call took since the last merge:
                                                  (band slot, holder) 16 B each, sorted by slot
closed        order cached (8 B)                  a closed key the home answers itself: its slot (8 B)
                                                  and holders (8 B each), as ``ClosedKeys`` holds it
============  ==================================  ===================================================

The caller begins an epoch (``begin``) before it reads anything, and every
read and write of the epoch goes through that one write transaction, so the
epoch's stages read what its earlier stages wrote, as in memory.
``commit`` writes the epochs done and the caller's metadata into it and
commits: a process that dies before that leaves the state of the epoch
before, and running the epoch again from the same messages does the same.

Places take the single index's shape (``mirror``, ``bands``): an epoch's
new places are one sequential write (a run appended to ``recent_places``)
and are held in memory too (``mirror.KeyPlaces``, read back at open), until ``RECENT_PLACES`` of them are merged, sorted, into the
bucketed ``places`` table in the epoch's transaction. Random inserts into
a B-tree keyed by the slot dirtied a page each, all written again at every
commit. An epoch's lookups search the recent places in numpy and ask the
settled table only for keys a Bloom filter of its keys may hold
(``bandfilter``, built at open); a place costs 8 B there. Nothing else is
cached in Python but the closed keys (bounded): LMDB's pages are the cache.

The ids and firsts tables are asked through a filter of the hashes they
hold (``bandfilter.BandFilter`` of ``hashed.filter_keys``, built at open
and added to as they are written), as one index asks its ids and content
tables: nearly every document of an epoch has a new id and a new content,
and each such question was a cursor positioned in a table that grows with
the state (``serials_of_ids``, ``firsts_of``). A hash the filter keeps
after its entries went (``forget``, an epoch not committed) costs a
lookup, never a decision.

With ``sync``, commits sync the data but not the meta page
(``metasync=False``: one flush a commit, not two): power loss may undo the
last commit, never more and never corrupting the state. A vshard that lost
its last epoch so is where a crash between its Kafka transaction and its
commit leaves it (``checkpoint.VShardCommit``): it decides the epoch again
from its messages, sending the same ones, and emits nothing Kafka has.

``StoredVShard`` opens a state read-only, to answer questions across a
deployment (``stats``, ``query``, ``cluster``, ``explain``): each in short
read transactions, so it is safe while the vshard runs.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from typing import Any, Optional

import lmdb
import numpy as np

from ..core import eliasfano
from ..core.lsh import KEY_MASK, band_slots
from ..core.shingle import ShingleBatch
from ..core.signing import SigningConfig
from ..core.verify import all_code_together, jaccard, jaccards_coded
from ..errors import IncompatibleIndexError, IndexUnusableError
from .bandfilter import SCAN_CHUNK, BandFilter
from .bands import BandRows
from .hashed import BUCKET_BYTES, HASH_BYTES, entry, filter_keys, salted, serials_of
from .index import (DocRecord, Index, IndexSettings, IndexTxn, MapFull, damaged_shingles, from_u64, rows_as_bytes,
                    serial_key, u64)
from .mirror import KeyPlaces

__all__ = ["LmdbState", "RECENT_PLACES", "StoredVShard", "VSHARD_FORMAT", "holder", "holder_homes", "holder_serials",
           "is_vshard_state"]

VSHARD_FORMAT = 2  # 2: places settled in buckets with a recent level (1: one entry a place, keyed by the slot)
RECENT_PLACES = 1 << 20  # recent places (16 B each in memory) merged into the settled table past this many
FILTER_BYTES = 4 << 20  # the filter of the settled table's keys (fixed: a larger state has more false positives)
HASH_FILTER_BYTES = 1 << 20  # the filter of the ids' and contents' hashes at first (700,000 keys), then in layers...
HASH_FILTER_MAX_BYTES = 64 << 20  # ...up to this
_HOME_BITS = 16  # a holder is its serial and its home in one number: serial << 16 | home
_SETTLED = BandRows("places", home_bits=_HOME_BITS)
_RUN = np.dtype([("slot", ">u8"), ("holder", ">i8")])  # a recent run's entry
_FIRST_VALUE = struct.Struct(">IH?")  # a firsts value: serial, home, still in a cluster (``_first_value``)
_TABLES = {
    "meta": {},
    "docs": {},
    "shingles": {},
    "ids": {"dupsort": True, "dupfixed": True},
    "members": {"dupsort": True, "dupfixed": True},
    "source_names": {},
    "firsts": {"dupsort": True, "dupfixed": True},
    "places": {"dupsort": True, "dupfixed": True},
    "recent_places": {},
    "closed": {},
}


def holder(serials: np.ndarray, homes: np.ndarray) -> np.ndarray:
    return (np.asarray(serials, dtype=np.int64) << _HOME_BITS) | np.asarray(homes, dtype=np.int64)


def holder_serials(holders: np.ndarray) -> np.ndarray:
    return holders >> _HOME_BITS


def holder_homes(holders: np.ndarray) -> np.ndarray:
    return holders & ((1 << _HOME_BITS) - 1)


class _VShardIndex(Index):
    """``Index``'s environment with a vshard's tables, and its identity in place of an index's metadata."""

    tables = _TABLES

    def __init__(self, path: str, identity: Optional[dict], signing: Optional[SigningConfig], sync: bool,
                 readonly: bool = False):
        self.identity = identity  # None: read whichever vshard the folder holds (read-only)
        super().__init__(IndexSettings(path=path, sync=sync, metasync=False), signing, readonly=readonly)

    def _load_or_create_meta(self, signing: Optional[SigningConfig], adopt_bands: bool) -> dict:
        with self.env.begin(db=self.dbs["meta"]) as txn:
            raw, index = txn.get(b"vshard"), txn.get(b"index")
        if index is not None:
            raise IndexUnusableError(f"{self.path!r} holds a single worker's index, not a vshard's state: give "
                                     "each vshard a folder of its own")
        if raw is None and self.readonly:
            raise IndexUnusableError(f"{self.path!r} holds no vshard's state (its metadata names no vshard): give "
                                     "the folders of a deployment's vshards, vshard-0 ... vshard-N, or their parent")
        if raw is None:
            meta = {"format": VSHARD_FORMAT, "created": time.time(), "config": signing.as_dict(),
                    "vshard": self.identity}
            with self.env.begin(write=True, db=self.dbs["meta"]) as txn:
                txn.put(b"vshard", json.dumps(meta).encode())
            return meta
        meta = json.loads(raw)
        if meta.get("format") != VSHARD_FORMAT:
            raise IncompatibleIndexError(f"the vshard state at {self.path!r} has format {meta.get('format')}, this "
                                         f"streamdedup reads format {VSHARD_FORMAT}: start the deployment over in "
                                         "new folders and replay its input (or run the streamdedup that made it)")
        if self.identity is not None:
            self._refuse_another_vshard(meta["vshard"])
        return meta

    def _refuse_another_vshard(self, stored: dict) -> None:
        differences = [f"{key}: the state has {stored.get(key)!r}, this vshard {self.identity.get(key)!r}"
                       for key in sorted(set(stored) | set(self.identity)) if stored.get(key) != self.identity.get(key)]
        if differences:
            raise IncompatibleIndexError(
                f"the vshard state at {self.path!r} belongs to another vshard or other settings:\n  "
                + "\n  ".join(differences)
                + "\nopen each vshard's own folder with the deployment's settings (a deployment's vshard count is "
                "fixed when it is made); to change either, start a deployment in new folders and replay the input")

    def begin_epoch(self) -> IndexTxn:
        """A write transaction for one epoch, with a quarter of the map free at least."""
        self._make_headroom()
        return self._begin_write()


class LmdbState:
    """A vshard's state in the LMDB environment at ``path`` (made if need be), for the vshard ``identity``
    names (its number, count and settings: another one is refused)."""

    def __init__(self, path: str, identity: dict, signing: SigningConfig, sync: bool = True):
        self.index = _VShardIndex(path, identity, signing, sync)
        self._txn: Optional[IndexTxn] = None
        self._cursors: dict[str, Any] = {}  # of the epoch's transaction, by table
        with self.index.read() as txn:
            raw = txn.get("meta", b"epoch")
            self._closed_order = {int.from_bytes(value[:8], "big"): int.from_bytes(key, "big")
                                  for key, value in txn.table_entries("closed")}  # slot -> its key
            self.places = _StoredPlaces(self, txn)
            self._hashes = BandFilter.of_keys(_stored_hash_keys(txn), HASH_FILTER_BYTES, HASH_FILTER_MAX_BYTES)
        committed = json.loads(raw) if raw else {"epochs_done": 0, "meta": {}}
        self.epochs_done: int = committed["epochs_done"]
        self._meta: dict = committed["meta"]

    # -- epochs ------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Start an epoch's transaction: every read and write until ``commit`` goes through it."""
        if self._txn is not None:
            raise IndexUnusableError(f"the vshard state at {self.index.path!r} began an epoch twice (a bug in "
                                     "streamdedup: please report it)")
        self._txn = self.index.begin_epoch()

    def commit(self, epochs_done: int, meta: dict[str, Any]) -> None:
        """Commit the epoch's changes with ``meta`` (JSON-able): all of them or none (see the module on power loss)."""
        txn = self.txn
        if self.places.recent() > RECENT_PLACES:
            self.places.settle()
        txn.txn.put(b"epoch", json.dumps({"epochs_done": epochs_done, "meta": meta}, sort_keys=True).encode(),
                    db=txn.dbs["meta"])
        txn.seal()
        self._txn, self._cursors = None, {}
        try:
            txn.commit()
        except MapFull:
            self.index.grow_map()
            with self.index.read() as committed:
                self.places = _StoredPlaces(self, committed)  # the recent places in memory went past the state
            raise IndexUnusableError(f"the vshard state at {self.index.path!r} filled its map while committing; "
                                     "the map has grown and the state is as of the epoch before: reopen the vshard "
                                     "and run the epoch again from its messages") from None
        self.epochs_done, self._meta = epochs_done, json.loads(json.dumps(meta))

    def meta(self) -> dict[str, Any]:
        """The metadata of the last commit."""
        return json.loads(json.dumps(self._meta))

    def records(self) -> list[DocRecord]:
        """Every document this vshard is home to, as of the last commit, in serial order (what it decided)."""
        with self.index.read() as txn:
            return list(txn.records())

    def close(self) -> None:
        """Close the environment; an epoch not committed is thrown away (as when the process dies)."""
        if self._txn is not None:
            self._txn.abort()
            self._txn, self._cursors = None, {}
        self.index.close()

    @property
    def txn(self) -> IndexTxn:
        if self._txn is None:
            raise IndexUnusableError(f"the vshard state at {self.index.path!r} was read or written outside an "
                                     "epoch (a bug in streamdedup: please report it)")
        return self._txn

    def cursor(self, table: str):
        """The cursor of ``table`` in the epoch's transaction (one a table: every use positions it anew)."""
        cursor = self._cursors.get(table)
        if cursor is None:
            txn = self.txn
            cursor = self._cursors[table] = txn.txn.cursor(db=txn.dbs[table])
        return cursor

    def _put(self, table: str, key: bytes, value: bytes) -> None:
        txn = self.txn
        txn.txn.put(key, value, db=txn.dbs[table])

    # -- home: records, shingles, ids, members -----------------------------------------------------------

    def record(self, serial: int) -> DocRecord:
        return self.txn.record(serial)

    def put_record(self, record: DocRecord) -> None:
        self.txn.put_record(record)

    def put_documents(self, records: list[DocRecord], ids: list[bytes], shingles: ShingleBatch,
                      kept: dict[int, int], members: list[tuple[int, int]]) -> None:
        """File an epoch's own decided documents at once: their ``records`` in serial order (with each one's id
        hash in ``ids``), the kept ones' shingles (``kept``: serial -> its row of ``shingles``, the epoch's
        batch) and the duplicates' places in their clusters ((cluster, serial) each). One ``putmulti`` a table,
        in key order, keys and values made in numpy: a home's serials only grow, so the records and shingles
        are appended (``_appended``); the ids are sorted once."""
        serials = np.fromiter((record.serial for record in records), dtype=np.int64, count=len(records))
        if ids:
            self._hashes.add(filter_keys("ids", ids))
        self._appended("docs", _fixed(serials, ">u4"), self.txn.pack_records(records))
        self.cursor("ids").putmulti(_id_entries(ids, serials), dupdata=True)
        self._appended("shingles", *_coded_shingles(shingles, kept))
        if members:
            self.cursor("members").putmulti(_member_entries(members), dupdata=True)

    def _appended(self, table: str, keys: list[bytes], values: list[bytes]) -> None:
        """Rows of ``table`` (not dupsort) with ascending keys past every key it holds, appended: LMDB neither
        searches for their places nor leaves pages half full. A key that is not past the last (none is, while
        a home's serials only grow) is not written by an append, so then every row is put in its place."""
        rows = list(zip(keys, values))
        cursor = self.cursor(table)
        consumed, added = cursor.putmulti(rows, append=True)
        if added < consumed:
            cursor.putmulti(rows)

    def delete_record(self, serial: int) -> None:
        self.txn.delete("docs", serial_key(serial))

    def shingles(self, serial: int) -> Optional[np.ndarray]:
        """A kept document's shingles; None for a duplicate."""
        return self.txn.stored_shingles(serial)

    def similarities(self, owns: list[np.ndarray], serials: list[int]) -> list[Optional[float]]:
        """The Jaccard of each of ``owns`` with the stored shingles of the document at the same place of
        ``serials``; None where that one has none (a duplicate). The codings read in one pass in the table's
        order and compared without decoding, in one kernel call (``verify.jaccards_coded``), as one index
        verifies a batch's stored candidates."""
        if not serials:
            return []
        coded = self.txn.stored_codings(sorted(set(serials)))
        at = [i for i, serial in enumerate(serials) if serial in coded]
        found: list[Optional[float]] = [None] * len(serials)
        if all_code_together([owns[i] for i in at]):
            similarities, bad = jaccards_coded([owns[i] for i in at], [coded[serials[i]] for i in at])
            if bad >= 0:
                raise damaged_shingles(serials[at[bad]])
            for i, similarity in zip(at, similarities.tolist()):
                found[i] = similarity
            return found
        for i in at:
            found[i] = jaccard(owns[i], self.shingles(serials[i]))
        return found

    def record_ids(self, serials: list[int]) -> dict[int, str]:
        """The id of each of these documents' records (serial -> id)."""
        return self.txn.record_ids(serials) if serials else {}

    def pop_shingles(self, serial: int) -> np.ndarray:
        shingles = self.txn.shingles(serial)
        self.txn.delete("shingles", u64(serial))
        return shingles

    def serials_of_id(self, ident: bytes) -> list[int]:
        """The serials of the documents with this id hash, ascending."""
        return serials_of(self.cursor("ids"), ident)

    def serials_of_ids(self, idents: list[bytes]) -> list[list[int]]:
        """``serials_of_id`` of each of ``idents``: those the filter of stored hashes surely lacks are not asked."""
        cursor, found = self.cursor("ids"), [[] for _ in idents]
        for at in _maybe_held(self._hashes, "ids", idents):
            found[at] = serials_of(cursor, idents[at])
        return found

    def remove_id(self, ident: bytes, serial: int) -> None:
        self.txn.delete("ids", *entry(ident, serial))

    def remove_member(self, cluster: int, serial: int) -> None:
        self.txn.delete("members", serial_key(cluster), serial_key(serial))

    def pop_members(self, cluster: int) -> list[int]:
        """A cluster's members living here, ascending; the cluster has none here after."""
        members = list(self.txn.member_serials(cluster))
        if members:
            self.txn.delete("members", serial_key(cluster))
        return members

    # -- owner: each content's documents -----------------------------------------------------------------

    def first_of(self, content: bytes) -> Optional[tuple[int, int, bool]]:
        """(serial, home, still in a cluster) of the first stored document with ``content``, if any."""
        return _first_in(self.cursor("firsts"), content)

    def firsts_of(self, contents: list[bytes]) -> list[Optional[tuple[int, int, bool]]]:
        """``first_of`` of each of ``contents``: those the filter of stored hashes surely lacks are not asked."""
        cursor, found = self.cursor("firsts"), [None] * len(contents)
        for at in _maybe_held(self._hashes, "content", contents):
            found[at] = _first_in(cursor, contents[at])
        return found

    def add_contents(self, contents: dict[bytes, list[list]]) -> None:
        """File documents after those stored with the same content: content -> [serial, home, still in a
        cluster] of each (in serial order), in key order."""
        if contents:
            self._hashes.add(filter_keys("content", list(contents)))
        self.cursor("firsts").putmulti(_content_entries(contents), dupdata=True)

    def drop_content(self, content: bytes, serial: int) -> None:
        """A forgotten document out of its content's documents (the next one is the first then)."""
        cursor = self._found_content(content, serial)
        if cursor is not None:
            cursor.delete()

    def leave_cluster(self, content: bytes, serial: int) -> None:
        """The document ``serial`` with ``content`` is in no cluster now (its own was dissolved)."""
        cursor = self._found_content(content, serial)
        if cursor is not None:
            serial_, home, _ = _first(cursor.value())
            cursor.delete()
            self._put("firsts", content, _first_value(serial_, home, False))

    def _found_content(self, content: bytes, serial: int):
        """A cursor on the entry of ``serial`` under ``content``, or None."""
        cursor = self.cursor("firsts")
        if cursor.set_range_dup(content, serial_key(serial)) and cursor.value()[:4] == serial_key(serial):
            return cursor
        return None

    # -- a home's closed keys ----------------------------------------------------------------------------

    def closed_keys(self) -> dict[int, np.ndarray]:
        """The closed keys cached at the last commit, slot -> holders, in the order they were cached."""
        with self.index.read() as txn:
            return {int.from_bytes(value[:8], "big"): np.frombuffer(value[8:], dtype=">i8").astype(np.int64)
                    for _, value in txn.table_entries("closed")}

    def closed_changed(self, added: dict[int, np.ndarray], dropped: list[int]) -> None:
        """Keep the cache's changes: ``added`` keys cached (in order), then ``dropped`` ones out of it."""
        at = max(self._closed_order.values(), default=-1) + 1
        for slot, holders in added.items():
            self._put("closed", u64(at), u64(slot) + np.asarray(holders, dtype=">i8").tobytes())
            self._closed_order[slot] = at
            at += 1
        for slot in dropped:
            self.txn.delete("closed", u64(self._closed_order.pop(slot)))


class _StoredPlaces:
    """``KeyPlaces`` (``mirror``) on LMDB, read and written by the epoch's transaction: the recent places in
    ``recent_places`` and in memory, the settled ones in the bucketed ``places`` table (``bands.BandRows``)
    behind a filter of its keys. Every place of a key settled was taken before any of its recent ones."""

    def __init__(self, state: "LmdbState", txn: IndexTxn):
        """The places as committed, read through ``txn``."""
        self._state = state
        self._recent, self._runs = _recent_places(txn)  # and the next run's number
        self._filter = BandFilter.of_keys(_SETTLED.stored_keys(txn, SCAN_CHUNK), FILTER_BYTES)
        self._last_serial = _last_settled_serial(txn)

    def recent(self) -> int:
        """How many places are recent (not settled yet)."""
        return len(self._recent)

    def holders(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sorted unique ``slots``: where each slot's holders start in the returned array, how many it has,
        and the holders (slot by slot, each slot's in the order its places were taken)."""
        slots = np.asarray(slots, dtype=np.uint64)
        asked = slots[self._filter.may_hold(slots & KEY_MASK)] if self._last_serial is not None else slots[:0]
        return _both_levels(slots, _settled_places(self._state.txn, asked, self._last_serial),
                            self._recent.holders(slots))

    def add(self, slots: np.ndarray, holders: np.ndarray) -> None:
        """Take in places given after every one held (``slots`` sorted, a slot's holders in order): a run
        appended to ``recent_places``."""
        if not len(slots):
            return
        run = np.empty(len(slots), dtype=_RUN)
        run["slot"], run["holder"] = slots, holders
        txn = self._state.txn
        txn.txn.put(u64(self._runs), run.tobytes(), db=txn.dbs["recent_places"], append=True)
        self._runs += 1
        self._recent.add(np.asarray(slots, dtype=np.uint64), np.asarray(holders, dtype=np.int64))

    def settle(self) -> None:
        """Merge the recent places into the settled table, sorted, and empty ``recent_places``, in the epoch's
        transaction (committed with it, or neither)."""
        slots, holders = self._recent.entries()
        if not len(slots):
            return
        txn = self._state.txn
        keys, values = _SETTLED.entries(slots >> np.uint64(32), slots & KEY_MASK, holder_serials(holders),
                                        holder_homes(holders))
        self._state.cursor("places").putmulti(zip(keys, values), dupdata=True)
        txn.txn.drop(txn.dbs["recent_places"], delete=False)
        self._last_serial = max(self._last_serial or 0, int(holder_serials(holders).max()))
        txn.txn.put(b"places", json.dumps({"last_serial": self._last_serial}).encode(), db=txn.dbs["meta"])
        self._filter.add(slots & KEY_MASK)  # a key the filter lacks would hide its places
        self._recent.clear()
        self._runs = 0

    def remove(self, slots: np.ndarray, holders: np.ndarray) -> np.ndarray:
        """Free the places of these (slot, holder) entries (``forget``); the slots freed, sorted. The recent
        places are settled first (forget orders are rare; a run is never rewritten)."""
        self.settle()
        slots, holders = np.asarray(slots, dtype=np.uint64), np.asarray(holders, dtype=np.int64)
        keys, values = _SETTLED.entries(slots >> np.uint64(32), slots & KEY_MASK, holder_serials(holders),
                                        holder_homes(holders))
        txn = self._state.txn
        deleted = [key + value for key, value in zip(keys, values) if txn.delete("places", key, value)]
        if not deleted:
            return np.zeros(0, dtype=np.uint64)
        bands, found_keys, _, _ = _SETTLED.decoded(b"".join(deleted))
        return np.unique(band_slots(bands, found_keys))


def _stored_hash_keys(txn: IndexTxn):
    """The filter key (``hashed.filter_keys``) of every id hash of the ids table and every content of the
    firsts table, as uint64 arrays of at most ``SCAN_CHUNK``."""
    ids = txn.txn.cursor(db=txn.dbs["ids"]).iternext(keys=True, values=True)
    while rows := list(itertools.islice(ids, SCAN_CHUNK)):
        yield salted("ids", np.frombuffer(b"".join((k + v)[:HASH_BYTES] for k, v in rows), dtype=">u8").astype(np.uint64))
    contents = txn.txn.cursor(db=txn.dbs["firsts"]).iternext_nodup(keys=True, values=False)
    while keys := list(itertools.islice(contents, SCAN_CHUNK)):
        yield filter_keys("content", keys)


def _maybe_held(hashes: BandFilter, table: str, digests: list[bytes]) -> list[int]:
    """The places in ``digests`` of those the filter ``hashes`` may hold (``table``'s ``filter_keys``), in the
    digests' order."""
    if not digests:
        return []
    return np.flatnonzero(hashes.may_hold(filter_keys(table, digests))).tolist()


def _recent_places(txn: IndexTxn) -> tuple[KeyPlaces, int]:
    """The recent places as committed (every run, sorted by slot, then holder: the order taken), and the next
    run's number."""
    runs = [(from_u64(key), np.frombuffer(value, dtype=_RUN)) for key, value in txn.table_entries("recent_places")]
    recent = KeyPlaces()
    if runs:
        every = np.concatenate([run for _, run in runs])
        slots, holders = every["slot"].astype(np.uint64), every["holder"].astype(np.int64)
        order = np.lexsort((holders, slots))
        recent.add(slots[order], holders[order])
    return recent, (runs[-1][0] + 1 if runs else 0)


def _last_settled_serial(txn: IndexTxn) -> Optional[int]:
    """The highest serial of the settled places (None: none are settled)."""
    raw = txn.get("meta", b"places")
    return json.loads(raw)["last_serial"] if raw else None


def _settled_places(txn: IndexTxn, slots: np.ndarray, last_serial: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """(slot, holder) of the settled places under these band slots."""
    if last_serial is None or not len(slots):
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    rows = _SETTLED.stored_rows(txn, slots >> np.uint64(32), slots & KEY_MASK, last_serial)
    bands, keys, serials, homes = _SETTLED.decoded(rows)
    return band_slots(bands, keys), holder(serials, homes)


def _both_levels(slots: np.ndarray, settled: tuple[np.ndarray, np.ndarray],
                 recent: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``holders`` of sorted unique ``slots`` from the settled places ((slot, holder) each) and the recent ones
    (``KeyPlaces.holders``): each slot's in the order taken, which a holder's serial gives."""
    starts, counts, found = recent
    settled_slots, settled = settled
    if not len(settled):
        return starts, counts, found
    every_slot = np.concatenate((settled_slots, np.repeat(slots, counts)))
    every = np.concatenate((settled, found))
    order = np.lexsort((every, every_slot))
    every_slot = every_slot[order]
    begin = np.searchsorted(every_slot, slots, "left")
    return begin.astype(np.int64), (np.searchsorted(every_slot, slots, "right") - begin).astype(np.int64), \
        every[order]


def _coded_shingles(shingles: ShingleBatch, kept: dict[int, int]) -> tuple[list[bytes], list[bytes]]:
    """The ``shingles`` table's keys and values of the kept documents (``kept``: serial -> its row of
    ``shingles``), in key order: coded straight from the batch's rows in one call of ``eliasfano.encode_many``
    (a call a document cost a home more than filing them; gathering the rows into a batch of their own first,
    a fifth of the coding)."""
    if not kept:
        return [], []
    serials = np.fromiter(kept, dtype=np.int64, count=len(kept))
    rows = np.fromiter(kept.values(), dtype=np.int64, count=len(kept))
    order = np.argsort(serials, kind="stable")
    return _fixed(serials[order], ">u8"), eliasfano.encode_many(shingles.hashes, shingles.offsets, rows[order])


def _fixed(values: np.ndarray, dtype: str) -> list[bytes]:
    """Each of ``values`` (not negative) as bytes of the fixed-width ``dtype`` (``">u4"``: ``serial_key``,
    ``">u8"``: ``u64``), made by numpy: a bytes object a value, not a Python call. A value too wide is refused
    as ``int.to_bytes`` refuses it, not cut to its low bytes."""
    values = np.asarray(values)
    if len(values) and int(values.max()) >> (8 * np.dtype(dtype).itemsize):
        raise OverflowError(f"{int(values.max())} does not fit the {np.dtype(dtype).itemsize} bytes it is stored in")
    return rows_as_bytes(values.astype(dtype))


def _id_entries(ids: list[bytes], serials: np.ndarray) -> list[tuple[bytes, bytes]]:
    """The ids table's (key, value) of each (id hash, serial) (``hashed.entry``'s, made in numpy), in key
    order: inserts in order find their pages in the cache (the order is LMDB's to keep: a speed, not a
    rule; ``serials`` ascending put a hash's entries in order too)."""
    digests = np.frombuffer(b"".join(ident[:HASH_BYTES] for ident in ids), dtype=np.uint8).reshape(-1, HASH_BYTES)
    order = np.argsort(digests.view(">u8").ravel(), kind="stable")
    table = np.concatenate((digests, serials.astype(">u4").view(np.uint8).reshape(-1, 4)), axis=1)[order]
    return list(zip(rows_as_bytes(table[:, :BUCKET_BYTES]), rows_as_bytes(table[:, BUCKET_BYTES:])))


def _member_entries(members: list[tuple[int, int]]) -> list[tuple[bytes, bytes]]:
    """The members table's (key, value) of each (cluster, serial), sorted, made in numpy."""
    pairs = np.array(members, dtype=np.int64).reshape(-1, 2)
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    return list(zip(_fixed(pairs[:, 0], ">u4"), _fixed(pairs[:, 1], ">u4")))


def _content_entries(contents: dict[bytes, list[list]]) -> list[tuple[bytes, bytes]]:
    """The firsts table's (key, value) of each content's documents ([serial, home, still in a cluster] each),
    in their order. Not sorted: a content hash's entries are nearly all of a new content, and sorting them
    in Python cost more than LMDB's inserts in order saved."""
    return [(content, _FIRST_VALUE.pack(*entry)) for content, entries in contents.items() for entry in entries]


def _first_in(cursor, content: bytes) -> Optional[tuple[int, int, bool]]:
    """``LmdbState.first_of`` read through ``cursor``, a cursor of the firsts table."""
    if not cursor.set_key(content):
        return None
    return _first(cursor.value())


def _first_value(serial: int, home: int, in_cluster: bool) -> bytes:
    """A firsts value: serial (4 B), home (2 B), still in a cluster (1 B)."""
    return _FIRST_VALUE.pack(serial, home, in_cluster)


def _first(value: bytes) -> tuple[int, int, bool]:
    """(serial, home, still in a cluster) of a firsts value (``_first_value``)."""
    return int.from_bytes(value[:4], "big"), int.from_bytes(value[4:6], "big"), value[6] == 1


class StoredVShard:
    """A vshard's state opened read-only, whichever vshard it is (``identity`` says: its number, count and
    settings). Each question is asked in a read transaction the caller holds (``index.read()``), so answers
    are as of the vshard's last commit, and the running vshard is never held up."""

    def __init__(self, path: str):
        self.index = _VShardIndex(path, None, None, sync=False, readonly=True)
        self.identity: dict = self.index.meta["vshard"]

    @property
    def path(self) -> str:
        return self.index.path

    def holders(self, txn: IndexTxn, slots: np.ndarray) -> np.ndarray:
        """The holders (serial << 16 | home) of the places under these sorted unique band slots, which this
        vshard owns: slot by slot, each slot's in the order its places were taken. The recent places are read
        whole (a reader keeps none in memory): at most ``RECENT_PLACES``."""
        slots = np.asarray(slots, dtype=np.uint64)
        recent, _ = _recent_places(txn)
        return _both_levels(slots, _settled_places(txn, slots, _last_settled_serial(txn)), recent.holders(slots))[2]

    def first_of(self, txn: IndexTxn, content: bytes) -> Optional[tuple[int, int, bool]]:
        """(serial, home, still in a cluster) of the first document with ``content``, which this vshard owns."""
        return _first_in(txn.txn.cursor(db=txn.dbs["firsts"]), content)

    def sizes(self, txn: IndexTxn) -> dict[str, int]:
        """How many documents live here, how many of them are kept (they alone have shingles), and how many
        places the band keys owned here hold (LMDB counts the settled ones; the recent runs are measured)."""
        entries = {name: txn.txn.stat(txn.dbs[name])["entries"] for name in ("docs", "shingles", "places")}
        recent = sum(len(run) for _, run in txn.table_entries("recent_places")) // _RUN.itemsize
        return {"documents": entries["docs"], "kept": entries["shingles"], "places": entries["places"] + recent}

    def committed(self, txn: IndexTxn) -> dict[str, Any]:
        """The epochs committed and the metadata of the last commit (the host's input positions)."""
        raw = txn.get("meta", b"epoch")
        return json.loads(raw) if raw else {"epochs_done": 0, "meta": {}}

    def close(self) -> None:
        self.index.close()


def is_vshard_state(path: str) -> bool:
    """Whether the LMDB environment in the folder ``path`` holds a vshard's state (its metadata names a
    vshard), not an index of a single worker or of a shard."""
    try:
        with lmdb.open(path, readonly=True, max_dbs=len(_TABLES) + 2, readahead=False) as env:
            with env.begin() as txn:
                if txn.get(b"meta") is None:
                    return False
            with env.begin(db=env.open_db(b"meta", create=False)) as txn:
                return txn.get(b"vshard") is not None
    except lmdb.Error as exc:
        raise IndexUnusableError(f"cannot open the LMDB environment at {path!r}: {exc}") from exc
