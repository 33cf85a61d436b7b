"""The on-disk index: one LMDB environment, its named tables and transactions (only the store imports lmdb).

Named databases (integers are big-endian, so keys sort numerically):

============  =====================================  ================================
database      key                                    value
============  =====================================  ================================
meta          name                                   JSON (config, counters, ids; ``band_runs``:
                                                     the first serial of each run of ``bands``)
bands         band (2 B) + band key's high 7 bits +  its low 25 bits + a kept document's serial
              the serial's run (9 bits; 2 B          less its run's first serial (23 bits;
              together; an index made before runs:   dupsort, 6 B each; bands.py)
              serial >> 23, its epoch)
docs          serial (4 B)                           msgpack record of the decision
shingles      serial                                 sorted unique uint32 shingles of a kept
                                                     document, Elias-Fano coded (``eliasfano``)
ids           first 2 B of the id's BLAKE2b-64       its other 6 B + a serial (4 B) with that id
                                                     hash (dupsort, 10 B each; ``hashed``; a hit
                                                     is compared with the record's id)
content       first 2 B of the content hash          its next 6 B + the serial (4 B) of each
              (BLAKE2b-128 of the normalized text)   document with that content, the first first
                                                     (dupsort, 10 B each; a hit is compared with
                                                     the record's hash)
members       cluster serial (4 B)                   its duplicates' serials (4 B; dupsort; the
                                                     representative is the cluster serial): those
                                                     merged (``merge``)
recent_members  a duplicate's serial (4 B)           its cluster serial (4 B): a membership filed
                                                     by a batch, appended, until a merge moves it
                                                     into members (``IndexTxn.member_log``)
positions     source name                            JSON input position
source_names  b"n" + number (4 B) / b"s" + name      a record's source name / its number: a
                                                     record stores the number (``IndexTxn``)
recent        serial                                 id, content and band keys of a
                                                     document not yet merged into
                                                     ids / content / bands (mirror.py, merge.py)
============  =====================================  ================================

Unless said otherwise integers are 8 bytes; serials fit 32 bits (``MAX_SERIAL``).

A *serial* numbers documents in the order the index decided them. Every
change happens in an ``IndexTxn`` made by ``Index.write(fn)`` (written,
committed, retried whole after growing the map when it fills up) or
``Index.prepare(fn)`` (written and left prepared for the caller to commit,
after the steps that must come between: see ``checkpoint``).
Readers (``query``, ``stats``) use short read transactions and may run
while the worker writes.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import itertools
import json
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, TypeVar

import lmdb
import msgpack
import numpy as np

from ..core import eliasfano

try:
    from ..core import _kernel
except ImportError:  # built without a C compiler: msgpack packs each record
    _kernel = None
from ..core.records import id_key
from ..core.signing import SigningConfig
from ..core.templates import kept_rule
from ..errors import (
    DiskFullError,
    IncompatibleIndexError,
    IndexCorruptError,
    IndexLockedError,
    IndexUnusableError,
)
from ..faults import failing

if TYPE_CHECKING:
    from ..core.records import Document

__all__ = ["Index", "IndexSettings", "IndexTxn", "MapFull", "TxnState", "DocRecord", "FORMAT_VERSION", "MAX_SERIAL", "id_key",
           "member_slice_bounds",
           "u64", "from_u64", "serial_key", "content_key", "rows_as_bytes", "take_writer_lock"]

FORMAT_VERSION = 8
# 5: 6 with lsh.cap = "kept"; 6: 7 before its band table had runs; 7: 8 with every membership in members and each
# site's recent seen and repeated shingles sorted in one array (``store.sites``)
READABLE_FORMATS = (5, 6, 7, FORMAT_VERSION)
MAX_SERIAL = (1 << 32) - 1  # the band table stores serials in 32 bits (``bands``)
LOW_DISK_BYTES = 16 << 20  # 16 MiB: below this, a failed write is taken for a full disk
_DATABASES = {
    "meta": {},
    "bands": {"dupsort": True, "dupfixed": True},
    "docs": {},
    "shingles": {},
    "ids": {"dupsort": True, "dupfixed": True},
    "content": {"dupsort": True, "dupfixed": True},
    "members": {"dupsort": True, "dupfixed": True},
    "recent_members": {},
    "positions": {},
    "source_names": {},
    "recent": {},
    "anchors": {"dupsort": True, "dupfixed": True},
    "sites": {},
    "site_templates": {},
    "site_samples": {},
    "template_sites": {},
    "rekeyed": {"dupsort": True, "dupfixed": True},
    "rekeyed_of": {},
    "site_provisional": {},
}
_COUNTERS = ("next_serial", "documents", "kept", "duplicates", "exact", "merged_upto", "source_names", "merging",
             "merge_upto", "merge_slices")  # the last three: a merge under way (``merge``)
T = TypeVar("T")


@dataclass(frozen=True)
class IndexSettings:
    """The ``[index]`` section."""

    path: str = "state"
    map_size: int = 1 << 30  # 1 GiB to start; grows by itself
    sync: bool = True  # fsync on every commit: nothing committed is lost at power loss
    metasync: bool = True  # with sync, the meta page too (False: power loss may undo the last commit, never more)
    max_map_size: int = 1 << 40  # 1 TiB: never grow beyond (not a configuration key)


@dataclass(slots=True)
class DocRecord:
    """What the index knows of one decided document."""

    serial: int
    id: str
    kept: bool
    cluster: int  # serial of the cluster's representative
    cluster_id: str
    matched: Optional[int]
    matched_id: Optional[str]
    similarity: Optional[float]
    exact: bool
    content: bytes  # content hash
    source: list  # [name, partition, offset]
    band_keys: bytes  # a kept page whose lookup keys are not its shingles' (templates): them, bands x 4 B; else b""
    time: float  # when it was decided (seconds since the epoch)
    expired: bool = False  # kept, but past index.retention_days: out of the band tables, matches nothing
    site: int = 0  # key of the page's site (``core.sites``), whose template its content leaves out
    containment: Optional[float] = None  # an excerpt: the share of its content found in the matched document

    # The three kinds of decision, named: each fills the 13 fields positionally (keywords would cost
    # more, once per document) so that callers need not.

    @classmethod
    def new_cluster(cls, serial: int, doc: "Document", content: bytes, band_keys: bytes, now: float,
                    site: int = 0) -> "DocRecord":
        """A kept document: the representative of a new cluster named by its own id."""
        return cls(serial, doc.id, True, serial, doc.id, None, None, None, False, content, doc.source.as_list(),
                   band_keys, now, False, site)

    @classmethod
    def exact_copy_of(cls, twin: "DocRecord", serial: int, doc: "Document", content: bytes,
                      now: float, site: int = 0) -> "DocRecord":
        """A duplicate whose normalized text is the same as ``twin``'s: it joins ``twin``'s cluster."""
        return cls(serial, doc.id, False, twin.cluster, twin.cluster_id, twin.serial, twin.id, 1.0, True, content,
                   doc.source.as_list(), b"", now, False, site)

    @classmethod
    def near_duplicate_of(cls, representative: "DocRecord", similarity: float, serial: int, doc: "Document",
                          content: bytes, now: float, site: int = 0,
                          containment: Optional[float] = None) -> "DocRecord":
        """A duplicate of a kept document (``representative``), joining its cluster; with ``containment``, an excerpt of it."""
        return cls.near_duplicate(representative.serial, representative.id, similarity, serial, doc, content, now,
                                  site, containment)

    @classmethod
    def near_duplicate(cls, cluster: int, cluster_id: str, similarity: float, serial: int, doc: "Document",
                       content: bytes, now: float, site: int = 0,
                       containment: Optional[float] = None) -> "DocRecord":
        """``near_duplicate_of`` the kept document ``cluster`` whose id is ``cluster_id`` (no record of it made)."""
        return cls(serial, doc.id, False, cluster, cluster_id, cluster, cluster_id, similarity, False, content,
                   doc.source.as_list(), b"", now, False, site, containment)

    def pack(self, source_number: int, packer: Optional[msgpack.Packer] = None) -> bytes:
        """The stored form, with ``source_number`` standing for the source's name (``IndexTxn.source_number``);
        a batch passes one ``packer`` for all its records (one is not thread-safe).

        Values said twice are stored once: a kept document's cluster is
        itself (None) and its cluster id its own id, a duplicate's match is
        mostly its cluster's representative (-1 for the serial, None for the
        id); the last fields are left out while they hold their defaults.
        """
        cluster, matched = self.cluster, self.matched
        fields = [self.id, self.kept, None if cluster == self.serial else cluster,
                  None if self.cluster_id == self.id else self.cluster_id,
                  -1 if matched is not None and matched == cluster else matched,
                  None if self.matched_id == self.cluster_id else self.matched_id,
                  self.similarity, self.exact, self.content, [source_number, *self.source[1:]], self.band_keys,
                  self.time, self.expired, self.site, self.containment]
        while len(fields) > _REQUIRED_FIELDS and fields[-1] == _DEFAULTS[len(fields) - 1 - _REQUIRED_FIELDS]:
            fields.pop()
        return (packer or msgpack.Packer()).pack(fields)

    @classmethod
    def unpack(cls, serial: int, data: bytes, source_name: Callable[[int], str]) -> "DocRecord":
        """The record stored as ``data``; ``source_name`` gives the name of a source number."""
        record = cls(serial, *msgpack.unpackb(data, use_list=True))
        if record.cluster is None:
            record.cluster = serial
        if record.cluster_id is None:
            record.cluster_id = record.id
        if record.matched == -1:
            record.matched = record.cluster
        if record.matched_id is None and record.matched is not None:
            record.matched_id = record.cluster_id
        record.source[0] = source_name(record.source[0])
        return record


_REQUIRED_FIELDS = 12  # id .. time; then expired, site and containment, stored only when not their defaults
_DEFAULTS = (False, 0, None)
SERIAL_BYTES = 4  # serials in the docs, ids, content and members tables (``MAX_SERIAL``)
CONTENT_KEY_BYTES = 8  # of the content hash, keying the content table


_NO_LOG = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def member_slice_bounds(number: int, slices: int, upto: int) -> tuple[int, int]:
    """The cluster serials [low, high) whose recent memberships slice ``number`` of ``slices`` of the merge of the
    serials up to ``upto`` moves into ``members`` (a member's cluster is an earlier serial: all are below
    ``upto + 1``); consecutive slices take consecutive ranges of the table's keys."""
    return number * (upto + 1) // slices, (number + 1) * (upto + 1) // slices


def damaged_shingles(serial: int) -> IndexCorruptError:
    return IndexCorruptError(f"the stored shingles of #{serial} are damaged; run `streamdedup check`, "
                             "then restore a backup or rebuild the index")


def serial_key(n: int) -> bytes:
    """A serial as the docs, ids, content and members tables store it (4 bytes, big-endian)."""
    return n.to_bytes(SERIAL_BYTES, "big")


def content_key(content: bytes) -> bytes:
    """The content table's key of a content hash: its first 8 bytes (a hit is checked against the whole)."""
    return content[:CONTENT_KEY_BYTES]


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def rows_as_bytes(table: np.ndarray) -> list[bytes]:
    """Each row of a 2-D array, or each entry of a 1-D one, as a bytes object of its raw bytes (big-endian keys
    when its dtype is): made by numpy from a view of the rows as single values, not sliced one by one."""
    table = np.ascontiguousarray(table)
    width = table.dtype.itemsize * (table.shape[1] if table.ndim == 2 else 1)
    if not width:
        return [b""] * len(table)
    return table.view(f"V{width}").ravel().tolist()


def from_u64(b: bytes) -> int:
    """A big-endian integer of any width (8-byte keys, 4-byte serials)."""
    return int.from_bytes(b, "big")


def take_writer_lock(path: str):
    """The exclusive lock of the index folder ``path`` (made if need be), as an open file; closing it releases it.

    Every process that writes the folder holds it: a worker, ``dedup``, ``backfill``, ``restore``.
    """
    os.makedirs(path, exist_ok=True)
    handle = open(os.path.join(path, "writer.lock"), "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise IndexLockedError(
            f"the index at {path!r} is already open for writing by process {holder}; "
            "one index has exactly one writer: stop that process or use another state folder"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


class Index:
    """An LMDB environment holding one deduplication index."""

    tables: dict[str, dict] = _DATABASES  # name -> flags; a store of another shape (``vshardstate``) has its own

    def __init__(self, settings: IndexSettings, signing: Optional[SigningConfig], readonly: bool = False,
                 adopt_bands: bool = False):
        """Open (or create, with ``signing``) the index at ``settings.path``.

        An existing index refuses a different ``signing``; with ``adopt_bands``
        its own bands x rows are taken instead of those in ``signing``.
        """
        self.settings = settings
        self.path = settings.path
        self.readonly = readonly
        self._lock_file = None if readonly else self._take_writer_lock()
        self.env: Optional[lmdb.Environment] = None
        try:
            self.env = self._open_env()
            self.dbs = self._open_databases()
            self.meta = self._load_or_create_meta(signing, adopt_bands)
            if not readonly:
                self._make_headroom()
        except BaseException:
            self.close()
            raise
        self.signing = SigningConfig(**self.meta["config"])

    # -- opening -------------------------------------------------------

    def _take_writer_lock(self):
        return take_writer_lock(self.path)

    def _open_env(self) -> lmdb.Environment:
        data_file = os.path.join(self.path, "data.mdb")
        if self.readonly and not os.path.exists(data_file):
            raise IndexUnusableError(
                f"no index at {self.path!r}: run the worker or `streamdedup dedup` once to create it, "
                "or pass --state with the right folder"
            )
        try:
            return lmdb.open(
                self.path,
                map_size=max(self.settings.map_size, 1 << 20),
                max_dbs=len(self.tables) + 2,
                sync=self.settings.sync,
                metasync=self.settings.sync and self.settings.metasync,
                readonly=self.readonly,
                readahead=False,
                max_readers=256,
            )
        except lmdb.Error as exc:
            if "already open in this process" in str(exc):
                raise IndexUnusableError(f"the index at {self.path!r} is already open in this process: use the "
                                         "object that opened it (it answers queries too), or close it first") from exc
            raise IndexUnusableError(f"cannot open the index at {self.path!r}: {exc}") from exc

    def _open_databases(self) -> dict[str, Any]:
        if self.readonly:
            return {name: self._existing_db(name, flags) for name, flags in self.tables.items()}
        with self.env.begin(write=True) as txn:
            return {name: self.env.open_db(name.encode(), txn=txn, **flags) for name, flags in self.tables.items()}

    def _existing_db(self, name: str, flags: dict) -> Any:
        """A table of the index opened read-only; None for ``recent_members`` in an index made before it (format 7
        or earlier, not yet opened by a writer of format 8: its memberships are all in ``members``; ``read``
        asks again, before its transaction begins, so a writer's first memberships are seen at once)."""
        try:
            return self.env.open_db(name.encode(), create=False, **flags)
        except lmdb.NotFoundError:
            if name != "recent_members":
                raise
            return None

    def _load_or_create_meta(self, signing: Optional[SigningConfig], adopt_bands: bool) -> dict:
        with self.env.begin(db=self.dbs["meta"]) as txn:
            raw = txn.get(b"index")
        if raw is not None:
            meta = json.loads(raw)
            if meta.get("format", 1) not in READABLE_FORMATS:
                raise IncompatibleIndexError(
                    f"the index at {self.path!r} has format {meta.get('format', 1)}, this streamdedup reads format "
                    f"{FORMAT_VERSION} (site templates and excerpts since format 2, shingles stored in 32 bits since "
                    "format 3, the band table in large buckets keyed by a band key's high 7 bits, records with "
                    "numbered source names and 4-byte serials and id and content tables keyed by 8-byte hashes "
                    "since format 5, lsh.cap since format 6, the band table in runs since format 7, and a batch's "
                    "memberships filed in recent_members until a merge and the sites' recent shingles in chunks "
                    "since format 8); rebuild it: "
                    "replay the input into a new index (`streamdedup backfill --from-beginning` or `streamdedup "
                    "dedup` with --state pointing at a new folder), then use that folder"
                )
            meta["config"].setdefault("min_shared", 1)  # indexes made before it was a setting
            meta["config"].setdefault("cap", "kept")
            if signing is not None:
                wanted = signing.as_dict()
                wanted["templates"] = kept_rule(meta["config"].get("templates", "off"), wanted["templates"])
                if adopt_bands:
                    stored = meta["config"]
                    wanted.update(bands=stored["bands"], rows=stored["rows"], min_shared=stored["min_shared"])
                self._refuse_other_config(meta["config"], wanted)
            return meta
        if self.readonly or signing is None:
            raise IndexCorruptError(f"the index at {self.path!r} has no metadata; it was never initialized")
        meta = {
            "format": FORMAT_VERSION,
            "index_id": uuid.uuid4().hex,
            "created": time.time(),
            "config": signing.as_dict(),
        }
        with self.env.begin(write=True, db=self.dbs["meta"]) as txn:
            txn.put(b"index", json.dumps(meta).encode())
        return meta

    def _refuse_other_config(self, stored: dict, wanted: dict) -> None:
        differences = [
            f"{key}: index has {stored.get(key)!r}, configuration says {wanted.get(key)!r}"
            for key in sorted(set(stored) | set(wanted))
            if stored.get(key) != wanted.get(key)
        ]
        if differences:
            raise IncompatibleIndexError(
                f"the index at {self.path!r} was built with other signing, template or excerpt settings:\n  "
                + "\n  ".join(differences)
                + "\nrun with the index's settings, or build another index with these: point --state at a new "
                "folder and replay the input into it (`streamdedup backfill --from-beginning`, or `streamdedup dedup`)"
            )

    # -- transactions --------------------------------------------------

    def write(self, fn: Callable[["IndexTxn"], T]) -> T:
        """Run ``fn`` in one write transaction and commit it durably.

        If the map fills up (while ``fn`` writes or while the commit writes),
        the transaction is thrown away, the map grows and ``fn`` runs again
        from the start. So ``fn`` must only change the index: a batch whose
        outcomes leave the process uses ``prepare`` and ``commit`` instead.
        """
        while True:
            txn, result = self.prepare(fn)
            try:
                txn.commit()
                return result
            except MapFull:
                self.grow_map()

    def prepare(self, fn: Callable[["IndexTxn"], T]) -> tuple["IndexTxn", T]:
        """Run ``fn`` in a write transaction and leave it open, *prepared*: written, not committed.

        A full map while ``fn`` writes throws the transaction away, grows the
        map and runs ``fn`` again. The caller then commits (``IndexTxn.commit``,
        which raises ``MapFull`` if the commit itself fills the map) or aborts.
        """
        if self.readonly:
            raise IndexUnusableError("this index was opened read-only")
        while True:
            txn = self._begin_write()
            try:
                result = fn(txn)
                txn.seal()
                return txn, result
            except lmdb.MapFullError:
                txn.abort()
                self.grow_map()
            except lmdb.Error as exc:
                txn.abort()
                raise _translated(exc, self.path) from exc
            except BaseException:
                txn.abort()
                raise

    def _begin_write(self) -> "IndexTxn":
        try:
            return IndexTxn(self, self.env.begin(write=True), TxnState.OPEN)
        except lmdb.Error as exc:
            raise _translated(exc, self.path) from exc

    @contextmanager
    def read(self) -> Iterator["IndexTxn"]:
        """A short read-only view of the last committed state."""
        if self.readonly and self.dbs.get("recent_members", False) is None:
            self.dbs["recent_members"] = self._existing_db("recent_members", {})  # made by a writer since?
        try:
            txn = self.env.begin()
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)  # another process grew the map: adopt its size
            txn = self.env.begin()
        try:
            yield IndexTxn(self, txn, TxnState.READ)
        finally:
            txn.abort()

    def _make_headroom(self) -> None:
        """Grow the map at once if less than a quarter of it is free.

        LMDB opens an index whose file outgrew ``index.map_size`` with a map of
        exactly the file's size, so without this the first batch after every
        restart of a large index fills the map, is thrown away and written again.
        """
        used, size = self.map_use()
        if size - used < size // 4:
            self.grow_map()

    def grow_map(self) -> None:
        """Double the map (no transaction of this process may be open)."""
        current = self.env.info()["map_size"]
        if current >= self.settings.max_map_size:
            raise IndexUnusableError(
                f"the index map is full at {current} bytes, the most an index may grow to (a fixed limit); "
                "the index is intact as of its last commit. Compact it with `streamdedup backup DEST` "
                "(that drops the pages `forget` and retention sweeps freed) and run with --state DEST, "
                "or start a new index in another --state folder"
            )
        self.env.set_mapsize(min(current * 2, self.settings.max_map_size))

    def backup(self, dest: str) -> None:
        """A consistent, compacted copy of the index into the folder ``dest`` (taken in one read transaction)."""
        self.env.copy(dest, compact=True)

    def map_use(self) -> tuple[int, int]:
        """(bytes in use, map size)."""
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"], info["map_size"]

    def database_bytes(self) -> dict[str, int]:
        """Pages used by each named database, in bytes."""
        result = {}
        with self.env.begin() as txn:
            for name, db in self.dbs.items():
                st = txn.stat(db)
                result[name] = (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
        return result

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _translated(exc: lmdb.Error, path: str) -> Exception:
    """LMDB's error as ours. A failed write on a full disk may surface as EIO, so free space is checked too."""
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc) or _disk_nearly_full(path):
        return DiskFullError(
            f"the disk holding the index at {path!r} is full; the index is intact as of its last commit: "
            "free space and start again"
        )
    return IndexUnusableError(f"LMDB error on the index at {path!r}: {exc}")


def _disk_nearly_full(path: str) -> bool:
    try:
        stat = os.statvfs(path)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < LOW_DISK_BYTES


class MapFull(Exception):
    """A prepared transaction's commit filled the map; nothing of it was written.

    Grow the map (``Index.grow_map``) and write the transaction again.
    """


class TxnState(enum.Enum):
    """Where an index transaction is in its life; each step checks it at the door."""

    READ = "read"  # a read-only view
    OPEN = "open"  # writes allowed
    PREPARED = "prepared"  # written: no more writes, waiting to be committed or aborted
    COMMITTED = "committed"
    ABORTED = "aborted"


class IndexTxn:
    """The index as one transaction sees it; reads see the transaction's own writes.

    A write transaction is ``OPEN``, then ``PREPARED`` (``seal``: no more
    writes), then ``COMMITTED`` or ``ABORTED``; using it out of order raises
    at once. Readers are ``READ`` from the start.
    """

    def __init__(self, index: Index, txn: lmdb.Transaction, state: TxnState = TxnState.READ):
        self.index = index
        self._lmdb = txn
        self.state = state
        self.dbs = index.dbs
        self._counters: Optional[dict[str, int]] = None
        self.after_commit: list[Callable[[], None]] = []  # run once the transaction has committed
        self._source_names: dict[int, str] = {}
        self._source_numbers: dict[str, int] = {}
        self._member_log: Optional[tuple[np.ndarray, np.ndarray]] = None  # read once (``member_log``)

    @property
    def txn(self) -> lmdb.Transaction:
        """The LMDB transaction, while it may be used: read (``READ``), or read and written (``OPEN``)."""
        if self.state is not TxnState.OPEN and self.state is not TxnState.READ:
            raise IndexUnusableError(f"the index transaction is {self.state.value}: nothing may read or write "
                                     "through it now (a bug in streamdedup: please report it)")
        return self._lmdb

    def mark_current_format(self) -> None:
        """Marks the index with this version's format, in this transaction: an index whose band table has runs
        (``bands.start_runs``) would be misread by a streamdedup of format 6, which takes its runs for epochs, and
        one with memberships in ``recent_members`` (``view.write_documents``) or sites' shingles in chunks
        (``sites.save_site``) by one of format 7, which reads ``members`` only and a site's recent shingles as one
        sorted array; marked, it is refused there with how to rebuild."""
        if self.index.meta.get("format") == FORMAT_VERSION:  # as read at opening, or marked by a commit since
            return
        meta = json.loads(self.txn.get(b"index", db=self.dbs["meta"]))
        if meta.get("format") != FORMAT_VERSION:
            self.txn.put(b"index", json.dumps({**meta, "format": FORMAT_VERSION}).encode(), db=self.dbs["meta"])
        self.after_commit.append(lambda: self.index.meta.update(format=FORMAT_VERSION))

    def seal(self) -> None:
        """``OPEN`` -> ``PREPARED``: everything of this transaction is written."""
        self._expect(TxnState.OPEN, "prepared")
        self.state = TxnState.PREPARED

    def commit(self) -> None:
        """``PREPARED`` -> ``COMMITTED``, durably; then the ``after_commit`` steps run.

        Raises ``MapFull`` (the transaction is then aborted) if writing the
        commit filled the map.
        """
        self._expect(TxnState.PREPARED, "committed")
        try:
            if failing("index-commit-map-full"):
                self._lmdb.abort()
                raise lmdb.MapFullError("injected by a test: the commit filled the map")
            self._lmdb.commit()
        except lmdb.MapFullError:
            self.state = TxnState.ABORTED
            raise MapFull() from None
        except lmdb.Error as exc:
            self.state = TxnState.ABORTED
            raise _translated(exc, self.index.path) from exc
        self.state = TxnState.COMMITTED
        steps, self.after_commit = self.after_commit, []  # run once, and what they hold freed now: not left to
        for after in steps:  # the collector when a batch's pause ends (``engine.collector_paused``)
            after()

    def abort(self) -> None:
        """Throw the transaction away (again: nothing)."""
        if self.state in (TxnState.COMMITTED, TxnState.ABORTED):
            return
        self._lmdb.abort()
        self.state = TxnState.ABORTED

    def _expect(self, state: TxnState, becoming: str) -> None:
        if self.state is not state:
            raise IndexUnusableError(f"an index transaction that is {self.state.value} cannot be {becoming} "
                                     "(a bug in streamdedup: please report it)")

    # -- counters ------------------------------------------------------

    @property
    def counters(self) -> dict[str, int]:
        if self._counters is None:
            raw = self.txn.get(b"counters", db=self.dbs["meta"])
            self._counters = {**dict.fromkeys(_COUNTERS, 0), **(json.loads(raw) if raw else {})}
        return self._counters

    def count(self, **changes: int) -> None:
        """Add to the counters, written at once into the transaction."""
        counters = self.counters
        for name, delta in changes.items():
            counters[name] += delta
        self.txn.put(b"counters", json.dumps(counters).encode(), db=self.dbs["meta"])

    # -- lookups -------------------------------------------------------

    def shingles(self, serial: int) -> np.ndarray:
        found = self.stored_shingles(serial)
        if found is None:
            raise IndexCorruptError(f"kept document #{serial} has no stored shingles; run `streamdedup check`")
        return found

    def stored_shingles(self, serial: int) -> Optional[np.ndarray]:
        """A kept document's stored shingles (sorted uint32), or None if it has none."""
        raw = self.txn.get(u64(serial), db=self.dbs["shingles"])
        if raw is None:
            return None
        try:
            return eliasfano.decode(raw)
        except ValueError:
            raise damaged_shingles(serial) from None

    def stored_coding(self, serial: int) -> Optional[bytes]:
        """A kept document's stored shingles as the table holds them (``eliasfano``), or None if it has none."""
        return self.txn.get(u64(serial), db=self.dbs["shingles"])

    def stored_codings(self, serials: list[int]) -> dict[int, bytes]:
        """``stored_coding`` of each of these ascending serials that has one, read in one pass in the table's
        order."""
        if _kernel is None:
            found = self.txn.cursor(db=self.dbs["shingles"]).getmulti([u64(serial) for serial in serials])
            return {from_u64(key): value for key, value in found}
        found = self.txn.cursor(db=self.dbs["shingles"]).getmulti(_kernel.big_endian_keys(serials, 8))
        return _kernel.by_serial(found)  # the same dict, its keys and values made in one pass

    def record(self, serial: int) -> DocRecord:
        raw = self.txn.get(serial_key(serial), db=self.dbs["docs"])
        if raw is None:
            raise IndexCorruptError(f"document #{serial} is referenced but has no record; run `streamdedup check`")
        return self.unpack_record(serial, raw)

    def record_id(self, serial: int) -> str:
        """``record(serial).id``, read without unpacking the rest of the record (``_kernel.record_id``)."""
        raw = self.txn.get(serial_key(serial), db=self.dbs["docs"])
        found = _kernel.record_id(raw) if _kernel is not None and raw is not None else None
        return found if found is not None else self.record(serial).id

    def record_ids(self, serials: list[int]) -> dict[int, str]:
        """``record_id`` of each of these serials, the records read in one pass in the table's order; their ids
        read in one kernel pass (``_kernel.record_ids``) when every one is there and of the kernel's layout."""
        wanted = sorted(set(serials))
        if _kernel is not None:
            fetched = self.txn.cursor(db=self.dbs["docs"]).getmulti(_kernel.big_endian_keys(wanted, SERIAL_BYTES))
            ids = _kernel.record_ids(fetched)
            if len(ids) == len(wanted) and None not in ids.values():  # most batches: in ``wanted``'s order
                return ids
        else:
            fetched = self.txn.cursor(db=self.dbs["docs"]).getmulti([serial_key(serial) for serial in wanted])
        found = dict(fetched)
        ids = {}
        for serial in wanted:
            raw = found.get(serial_key(serial))
            read = _kernel.record_id(raw) if _kernel is not None and raw is not None else None
            ids[serial] = read if read is not None else self.record_id(serial)  # msgpack's, or the missing one's error
        return ids

    def has_record(self, serial: int) -> bool:
        return self.txn.get(serial_key(serial), db=self.dbs["docs"]) is not None

    def unpack_record(self, serial: int, raw: bytes) -> DocRecord:
        """A record as the docs table stores it (``DocRecord.unpack``), its source name looked up."""
        return DocRecord.unpack(serial, raw, self.source_name)

    def pack_record(self, record: DocRecord, packer: Optional[msgpack.Packer] = None) -> bytes:
        """A record as the docs table stores it, its source name numbered (a new name is numbered now)."""
        return record.pack(self.source_number(record.source[0]), packer)

    def pack_records(self, records: list[DocRecord]) -> list[bytes]:
        """``pack_record`` of each record, in order (sources numbered in that order): in one kernel call
        (``_kernel.pack_records``, the same bytes), else, or for a record of other types, by msgpack."""
        known, number_of = self._source_numbers, self.source_number  # most records: a name numbered already
        numbers = [known[name] if (name := record.source[0]) in known else number_of(name) for record in records]
        if _kernel is None:
            packer = msgpack.Packer()
            return [record.pack(number, packer) for record, number in zip(records, numbers)]
        packed = _kernel.pack_records(records, numbers)
        if None in packed:  # a record the kernel does not lay out (other types): msgpack's
            for at, value in enumerate(packed):
                if value is None:
                    packed[at] = records[at].pack(numbers[at])
        return packed

    def put_record(self, record: DocRecord) -> None:
        self.txn.put(serial_key(record.serial), self.pack_record(record), db=self.dbs["docs"])

    def source_name(self, number: int) -> str:
        """The source name a record stores as ``number``."""
        name = self._source_names.get(number)
        if name is None:
            raw = self.txn.get(b"n" + serial_key(number), db=self.dbs["source_names"])
            if raw is None:
                raise IndexCorruptError(f"a record names source #{number}, which the index does not hold; "
                                        "run `streamdedup check`, then restore a backup or rebuild the index")
            name = self._source_names[number] = raw.decode("utf-8")
        return name

    def source_number(self, name: str) -> int:
        """The number records store for the source ``name`` (a file path or a topic), given one if it has none.

        A name is stored once, not in every record; numbers are cached per
        transaction only, so one given by a transaction that aborts is never
        reused by mistake.
        """
        number = self._source_numbers.get(name)
        if number is None:
            encoded = name.encode("utf-8")
            raw = self.txn.get(b"s" + encoded, db=self.dbs["source_names"])
            if raw is None:
                number = self.counters["source_names"]
                self.txn.put(b"s" + encoded, serial_key(number), db=self.dbs["source_names"])
                self.txn.put(b"n" + serial_key(number), encoded, db=self.dbs["source_names"])
                self.count(source_names=1)
            else:
                number = from_u64(raw)
            self._source_numbers[name] = number
            self._source_names[number] = name
        return number

    def delete(self, name: str, key: bytes, value: Optional[bytes] = None) -> bool:
        """Remove a key (or one value of a dupsort key) from a table; False if it was not there."""
        if value is None:
            return self.txn.delete(key, db=self.dbs[name])
        return self.txn.delete(key, value, db=self.dbs[name])

    def get(self, name: str, key: bytes) -> Optional[bytes]:
        return self.txn.get(key, db=self.dbs[name])

    def table_entries(self, name: str) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of a named table, in key order."""
        return iter(self.txn.cursor(db=self.dbs[name]))

    def records(self) -> Iterator[DocRecord]:
        for key, raw in self.txn.cursor(db=self.dbs["docs"]):
            yield self.unpack_record(from_u64(key), raw)

    def records_from(self, start: int, limit: int) -> list[DocRecord]:
        """At most ``limit`` records, in serial order from serial ``start`` on."""
        cursor = self.txn.cursor(db=self.dbs["docs"])
        if not cursor.set_range(serial_key(start)):
            return []
        return [self.unpack_record(from_u64(key), raw) for key, raw in itertools.islice(cursor, limit)]

    def first_and_last_records(self) -> Optional[tuple[DocRecord, DocRecord]]:
        """The records of the lowest and the highest serial (None: no record)."""
        cursor = self.txn.cursor(db=self.dbs["docs"])
        if not cursor.first():
            return None
        first = self.unpack_record(from_u64(cursor.key()), cursor.value())
        cursor.last()
        return first, self.unpack_record(from_u64(cursor.key()), cursor.value())

    def member_count(self, representative: int) -> int:
        """How many members a cluster's kept document has: those the members table lists, and its recent ones."""
        cursor = self.txn.cursor(db=self.dbs["members"])
        merged = cursor.count() if cursor.set_key(serial_key(representative)) else 0
        _, clusters = self.member_log()
        return merged + int(np.count_nonzero(clusters == representative)) if len(clusters) else merged

    def member_serials(self, representative: int) -> Iterator[int]:
        """The serials of a cluster's members, ascending (the merged ones, then the recent ones: later)."""
        cursor = self.txn.cursor(db=self.dbs["members"])
        if cursor.set_key(serial_key(representative)):
            yield from (from_u64(value) for value in cursor.iternext_dup())
        members, clusters = self.member_log()
        if len(clusters):
            yield from members[clusters == representative].tolist()

    def clusters_with_members(self) -> Iterator[tuple[int, int]]:
        """(kept document's serial, how many members) of every cluster with members, in serial order: the members
        table's clusters, each with its recent members added, and the clusters with recent members only."""
        _, clusters = self.member_log()
        recent, counts = (part.tolist() for part in np.unique(clusters, return_counts=True))
        at, cursor = 0, self.txn.cursor(db=self.dbs["members"])
        for key in cursor.iternext_nodup(keys=True, values=False):
            serial, count = from_u64(key), cursor.count()
            while at < len(recent) and recent[at] < serial:
                yield recent[at], counts[at]
                at += 1
            if at < len(recent) and recent[at] == serial:
                count += counts[at]
                at += 1
            yield serial, count
        yield from zip(recent[at:], counts[at:])

    def memberships(self) -> list[tuple[int, int]]:
        """(cluster serial, member serial) of every membership, merged or recent."""
        found = [(from_u64(key), from_u64(value)) for key, value in self.txn.cursor(db=self.dbs["members"])]
        members, clusters = self.member_log()
        return found + list(zip(clusters.tolist(), members.tolist()))

    def member_log(self) -> tuple[np.ndarray, np.ndarray]:
        """(member serials, their cluster serials) of the memberships ``recent_members`` holds that no merge
        has moved into ``members`` yet, in member order; read once a read transaction.

        A batch appends its duplicates' memberships there; a merge slice moves those of its generation (serials
        up to ``merge_upto``) whose cluster is in its range (``member_slice_bounds``) into ``members``, in the
        transaction that counts it (``merging``), and its finishing steps delete them from the log. So an entry
        of the log is already merged when its serial is at most ``merged_upto``, or at most ``merge_upto`` with
        its cluster below the slices committed; every membership is counted once at every commit.

        A write transaction keeps it too: ``forget`` asks it for each cluster it dissolves, and changes it only
        through ``drop_logged_membership``; a batch's own appends (``view.write_documents``) drop it.
        """
        if self._member_log is not None:
            return self._member_log
        members, clusters = self.logged_memberships()
        found = _NO_LOG
        if len(members):
            merged = (members <= self.counters["merged_upto"]) | \
                ((members <= self.counters.get("merge_upto", 0)) & (clusters < self._members_moved_below()))
            found = (members[~merged], clusters[~merged])
        self._member_log = found
        return found

    def forget_member_log(self) -> None:
        """``member_log`` is read again at its next call (``recent_members`` was appended to)."""
        self._member_log = None

    def drop_logged_membership(self, serial: int) -> None:
        """Delete a duplicate's membership from ``recent_members`` (if there), and from ``member_log``'s view."""
        self.txn.delete(serial_key(serial), db=self.dbs["recent_members"])
        if self._member_log is not None and len(self._member_log[0]):
            members, clusters = self._member_log
            kept = members != serial
            self._member_log = (members[kept], clusters[kept])

    def logged_memberships(self) -> tuple[np.ndarray, np.ndarray]:
        """(member serials, their cluster serials) of the entries of ``recent_members`` past ``merged_upto`` (those
        up to it wait for a finishing step to delete them), in member order, read in two passes of the table
        (none: an index of format 7 opened read-only, or a vshard's)."""
        db = self.dbs.get("recent_members")
        if db is None:
            return _NO_LOG
        cursor, first = self.txn.cursor(db=db), serial_key(self.counters["merged_upto"] + 1)
        if not cursor.set_range(first):
            return _NO_LOG
        members = np.frombuffer(b"".join(cursor.iternext(keys=True, values=False)), dtype=">u4")
        cursor.set_range(first)
        clusters = np.frombuffer(b"".join(cursor.iternext(keys=False, values=True)), dtype=">u4")
        return members.astype(np.int64), clusters.astype(np.int64)

    def _members_moved_below(self) -> int:
        """The first cluster serial whose memberships of the generation being merged are not in ``members`` yet
        (0: no merge under way, or none of its slices committed)."""
        counters = self.counters
        committed = counters["merging"] - 1
        upto, slices = counters.get("merge_upto", 0), counters.get("merge_slices", 0)
        if committed <= 0 or not upto or not slices:
            return 0
        return member_slice_bounds(committed - 1, slices, upto)[1]

    def position(self, name: str) -> Optional[Any]:
        raw = self.txn.get(name.encode(), db=self.dbs["positions"])
        return None if raw is None else json.loads(raw)

    def set_position(self, name: str, value: Any) -> None:
        self.txn.put(name.encode(), json.dumps(value, sort_keys=True).encode(), db=self.dbs["positions"])

    def positions(self) -> dict[str, Any]:
        return {k.decode(): json.loads(v) for k, v in self.txn.cursor(db=self.dbs["positions"])}
