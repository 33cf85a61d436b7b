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
docs          serial (4 B)                        the record, as one index stores it (``DocRecord``)
shingles      serial (8 B)                        a kept document's shingles, Elias-Fano coded
ids           id hash's first 2 B (``hashed``)    its other 6 B + a serial (dupsort, 10 B each)
members       cluster serial (4 B)                its duplicates living here (dupsort, 4 B each)
source_names  as one index's                      a record stores its source name's number
firsts        content hash (16 B)                 every document with that content, in order: serial
                                                  (4 B), home (2 B), still in a cluster (1 B)
                                                  (dupsort, 7 B each)
places        band slot (8 B)                     a holder of one of the key's places (serial << 16 |
                                                  home, 8 B; dupsort, so in serial order: the order
                                                  the places were taken in)
closed        order cached (8 B)                  a closed key the home answers itself: its slot (8 B)
                                                  and holders (8 B each), as ``ClosedKeys`` holds it
============  ==================================  ===================================================

The caller begins an epoch (``begin``) before it reads anything, and every
read and write of the epoch goes through that one write transaction, so the
epoch's stages read what its earlier stages wrote, as in memory.
``commit`` writes the epochs done and the caller's metadata into it and
commits: a process that dies before that leaves the state of the epoch
before, and running the epoch again from the same messages does the same.

The places table is one LMDB entry a place (dupsort keyed by the slot): an
epoch's lookups are one ``getmulti`` call, its new places one ``putmulti``,
and a place costs about 16 B of entry and LMDB's node and sub-page headers
(single index: buckets of thousands, ``bands``). Nothing is cached in
Python but the closed keys (bounded): LMDB's pages are the cache.

``StoredVShard`` opens a state read-only, to answer questions across a
deployment (``stats``, ``query``, ``cluster``, ``explain``): each in short
read transactions, so it is safe while the vshard runs.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import lmdb
import numpy as np

from ..core import eliasfano
from ..core.signing import SigningConfig
from ..errors import IncompatibleIndexError, IndexUnusableError
from .bands import as_bytes_list
from .hashed import entry, serials_of
from .index import DocRecord, Index, IndexSettings, IndexTxn, MapFull, serial_key, u64

__all__ = ["LmdbState", "StoredVShard", "VSHARD_FORMAT", "is_vshard_state"]

VSHARD_FORMAT = 1
_TABLES = {
    "meta": {},
    "docs": {},
    "shingles": {},
    "ids": {"dupsort": True, "dupfixed": True},
    "members": {"dupsort": True, "dupfixed": True},
    "source_names": {},
    "firsts": {"dupsort": True, "dupfixed": True},
    "places": {"dupsort": True, "dupfixed": True},
    "closed": {},
}
_PLACE = np.dtype([("slot", ">u8"), ("holder", ">i8")])  # a places row as ``getmulti`` returns it


class _VShardIndex(Index):
    """``Index``'s environment with a vshard's tables, and its identity in place of an index's metadata."""

    tables = _TABLES

    def __init__(self, path: str, identity: Optional[dict], signing: Optional[SigningConfig], sync: bool,
                 readonly: bool = False):
        self.identity = identity  # None: read whichever vshard the folder holds (read-only)
        super().__init__(IndexSettings(path=path, sync=sync), signing, readonly=readonly)

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
                                         "new folders and replay its input")
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
        with self.index.read() as txn:
            raw = txn.get("meta", b"epoch")
            self._closed_order = {int.from_bytes(value[:8], "big"): int.from_bytes(key, "big")
                                  for key, value in txn.table_entries("closed")}  # slot -> its key
        committed = json.loads(raw) if raw else {"epochs_done": 0, "meta": {}}
        self.epochs_done: int = committed["epochs_done"]
        self._meta: dict = committed["meta"]
        self.places = _StoredPlaces(self)

    # -- epochs ------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Start an epoch's transaction: every read and write until ``commit`` goes through it."""
        if self._txn is not None:
            raise IndexUnusableError(f"the vshard state at {self.index.path!r} began an epoch twice (a bug in "
                                     "streamdedup: please report it)")
        self._txn = self.index.begin_epoch()

    def commit(self, epochs_done: int, meta: dict[str, Any]) -> None:
        """Commit the epoch's changes with ``meta`` (JSON-able), durably: all of them or none."""
        txn = self.txn
        txn.txn.put(b"epoch", json.dumps({"epochs_done": epochs_done, "meta": meta}, sort_keys=True).encode(),
                    db=txn.dbs["meta"])
        txn.seal()
        self._txn = None
        try:
            txn.commit()
        except MapFull:
            self.index.grow_map()
            raise IndexUnusableError(f"the vshard state at {self.index.path!r} filled its map while committing; "
                                     "the map has grown and the state is as of the epoch before: reopen the vshard "
                                     "and run the epoch again from its messages") from None
        self.epochs_done, self._meta = epochs_done, json.loads(json.dumps(meta))

    def meta(self) -> dict[str, Any]:
        """The metadata of the last commit."""
        return json.loads(json.dumps(self._meta))

    def close(self) -> None:
        """Close the environment; an epoch not committed is thrown away (as when the process dies)."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        self.index.close()

    @property
    def txn(self) -> IndexTxn:
        if self._txn is None:
            raise IndexUnusableError(f"the vshard state at {self.index.path!r} was read or written outside an "
                                     "epoch (a bug in streamdedup: please report it)")
        return self._txn

    def cursor(self, table: str):
        """A cursor of ``table`` in the epoch's transaction."""
        txn = self.txn
        return txn.txn.cursor(db=txn.dbs[table])

    def _put(self, table: str, key: bytes, value: bytes) -> None:
        txn = self.txn
        txn.txn.put(key, value, db=txn.dbs[table])

    # -- home: records, shingles, ids, members -----------------------------------------------------------

    def record(self, serial: int) -> DocRecord:
        return self.txn.record(serial)

    def put_record(self, record: DocRecord) -> None:
        self.txn.put_record(record)

    def delete_record(self, serial: int) -> None:
        self.txn.delete("docs", serial_key(serial))

    def shingles(self, serial: int) -> Optional[np.ndarray]:
        """A kept document's shingles; None for a duplicate."""
        return self.txn.stored_shingles(serial)

    def put_shingles(self, serial: int, shingles: np.ndarray) -> None:
        self._put("shingles", u64(serial), eliasfano.encode(shingles))

    def pop_shingles(self, serial: int) -> np.ndarray:
        shingles = self.txn.shingles(serial)
        self.txn.delete("shingles", u64(serial))
        return shingles

    def serials_of_id(self, ident: bytes) -> list[int]:
        """The serials of the documents with this id hash, ascending."""
        return serials_of(self.cursor("ids"), ident)

    def add_id(self, ident: bytes, serial: int) -> None:
        self._put("ids", *entry(ident, serial))

    def remove_id(self, ident: bytes, serial: int) -> None:
        self.txn.delete("ids", *entry(ident, serial))

    def add_member(self, cluster: int, serial: int) -> None:
        self._put("members", serial_key(cluster), serial_key(serial))

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

    def add_contents(self, contents: dict[bytes, list[list]]) -> None:
        """File documents after those stored with the same content: content -> [serial, home, still in a
        cluster] of each."""
        rows = [(content, _first_value(*entry)) for content, entries in contents.items() for entry in entries]
        self.cursor("firsts").putmulti(rows, dupdata=True)

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
    """``KeyPlaces`` (``engine.vshards.stores``) on the places table, read and written by the epoch's transaction."""

    def __init__(self, state: LmdbState):
        self._state = state

    def holders(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sorted unique ``slots``: where each slot's holders start in the returned array, how many it has,
        and the holders (slot by slot, each slot's in the order its places were taken)."""
        return _holders_in(self._state.cursor("places"), slots)

    def add(self, slots: np.ndarray, holders: np.ndarray) -> None:
        """Take in places given after every one held."""
        if len(slots):
            rows = zip(as_bytes_list(np.ascontiguousarray(slots, dtype=">u8")),
                       as_bytes_list(np.ascontiguousarray(holders, dtype=">i8")))
            self._state.cursor("places").putmulti(list(rows), dupdata=True)

    def remove(self, slots: np.ndarray, holders: np.ndarray) -> np.ndarray:
        """Free the places of these (slot, holder) entries (``forget``); the slots freed, sorted."""
        freed = {slot for slot, key, value in zip(np.asarray(slots, dtype=np.uint64).tolist(),
                                                  as_bytes_list(np.ascontiguousarray(slots, dtype=">u8")),
                                                  as_bytes_list(np.ascontiguousarray(holders, dtype=">i8")))
                 if self._state.txn.delete("places", key, value)}
        return np.array(sorted(freed), dtype=np.uint64)


def _holders_in(cursor, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_StoredPlaces.holders`` read through ``cursor``, a cursor of the places table."""
    slots = np.asarray(slots, dtype=np.uint64)
    asked = as_bytes_list(np.ascontiguousarray(slots, dtype=">u8"))
    raw = cursor.getmulti(asked, dupdata=True, dupfixed_bytes=8, keyfixed=True) if len(slots) else b""
    found = np.frombuffer(raw, dtype=_PLACE)
    found_slots = found["slot"].astype(np.uint64)
    counts = (np.searchsorted(found_slots, slots, "right") - np.searchsorted(found_slots, slots, "left"))
    counts = counts.astype(np.int64)
    return (np.cumsum(counts) - counts).astype(np.int64), counts, found["holder"].astype(np.int64)


def _first_in(cursor, content: bytes) -> Optional[tuple[int, int, bool]]:
    """``LmdbState.first_of`` read through ``cursor``, a cursor of the firsts table."""
    if not cursor.set_key(content):
        return None
    return _first(cursor.value())


def _first_value(serial: int, home: int, in_cluster: bool) -> bytes:
    """A firsts value: serial (4 B), home (2 B), still in a cluster (1 B)."""
    return serial_key(serial) + home.to_bytes(2, "big") + (b"\1" if in_cluster else b"\0")


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
        vshard owns: slot by slot, each slot's in the order its places were taken."""
        return _holders_in(txn.txn.cursor(db=txn.dbs["places"]), slots)[2]

    def first_of(self, txn: IndexTxn, content: bytes) -> Optional[tuple[int, int, bool]]:
        """(serial, home, still in a cluster) of the first document with ``content``, which this vshard owns."""
        return _first_in(txn.txn.cursor(db=txn.dbs["firsts"]), content)

    def sizes(self, txn: IndexTxn) -> dict[str, int]:
        """How many documents live here, how many of them are kept (they alone have shingles), and how many
        places the band keys owned here hold (LMDB counts them: nothing is read)."""
        entries = {name: txn.txn.stat(txn.dbs[name])["entries"] for name in ("docs", "shingles", "places")}
        return {"documents": entries["docs"], "kept": entries["shingles"], "places": entries["places"]}

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
