"""Index housekeeping: forgetting documents, the retention sweep, and rebuilding lookup tables.

Forgetting (takedown and privacy requests) removes a document's record, its
shingles, its band entries and its id, content and membership lookups. When
the document is a cluster's representative the cluster is *dissolved*: its
other members stay in the index (so their replays are still recognized) but
belong to no cluster any more (cluster id empty), and the next look-alike of
the forgotten text is decided against the remaining kept documents; finding
none, it is kept and starts a new cluster.

Retention (``index.retention_days``): a kept document older than that stops
matching at once (decisions ignore it), and a sweep that runs between
batches, a bounded slice at a time, takes it out of the band tables and
drops its shingles. Its record stays, marked expired.

Rebuilding (``check --fix``) re-derives every lookup table (ids, content,
members, bands, the recent log) and the counters from the document records,
which are the source of truth.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.excerpts import anchors_of
from ..core.records import id_key
from ..errors import IndexCorruptError
from .anchors import remove_anchors
from .bands import RUNS_KEY, BandTables, band_entries, record_band_keys
from .hashed import entry, serials_of
from .index import DocRecord, IndexTxn, content_key, from_u64, serial_key, u64
from .merge import merge_recent
from .mirror import RecentMirror, pack_recent, unpack_recent
from .sites import remove_rekeyed

__all__ = ["ForgetReport", "ForgetRequests", "forget", "dissolve", "serials_with_id", "sweep_expired", "rebuild_tables", "RETENTION_POSITION"]

RETENTION_POSITION = "retention:next-serial"


@dataclass
class ForgetReport:
    forgotten: list[str] = field(default_factory=list)  # ids removed
    unknown: list[str] = field(default_factory=list)  # ids the index does not hold
    dissolved: int = 0  # clusters dissolved (a representative was forgotten)
    released: int = 0  # members those clusters had

    def as_dict(self) -> dict:
        return {"forgotten": self.forgotten, "unknown": self.unknown, "dissolved": self.dissolved,
                "released": self.released}


def serials_with_id(txn: IndexTxn, mirror: RecentMirror, doc_id: str) -> list[int]:
    """Every serial (every version) recorded under a document id (not those of another id of the same hash)."""
    key = id_key(doc_id)
    found = serials_of(txn.txn.cursor(db=txn.dbs["ids"]), key)
    return sorted(s for s in set(found) | set(mirror.serials_of_id(key)) if txn.has_record(s) and txn.record(s).id == doc_id)


def forget(txn: IndexTxn, mirror: RecentMirror, bands: BandTables, ids: list[str]) -> ForgetReport:
    """Remove every version of these documents; the mirror follows once the transaction commits."""
    report = ForgetReport()
    removed: set[int] = set()
    kept: set[int] = set()
    for doc_id in ids:
        serials = serials_with_id(txn, mirror, doc_id)
        if not serials:
            report.unknown.append(doc_id)
            continue
        for serial in serials:
            record = txn.record(serial)
            _forget_one(txn, bands, record, report)
            removed.add(serial)
            if record.kept:
                kept.add(serial)
        report.forgotten.append(doc_id)
    if removed:
        txn.after_commit.append(lambda: mirror.remove(removed, kept))
    return report


def _forget_one(txn: IndexTxn, bands: BandTables, record: DocRecord, report: ForgetReport) -> None:
    key, serial = u64(record.serial), serial_key(record.serial)
    live = record.kept and not record.expired
    if live:
        bands.remove(txn, record.serial, record_band_keys(txn, record))  # signed from its shingles: first
        _remove_anchors(txn, record.serial)
        remove_rekeyed(txn, record.serial)
    txn.delete("docs", serial)
    txn.delete("shingles", key)
    _forget_recent(txn, key, record.kept)
    txn.delete("ids", *entry(id_key(record.id), record.serial))
    txn.delete("content", *entry(content_key(record.content), record.serial))  # if its content's first document
    if record.cluster and not record.kept:  # merged, or still in the log (no merge is under way: ``Engine.forget``)
        txn.delete("members", serial_key(record.cluster), serial)
        txn.drop_logged_membership(record.serial)
    if record.kept:
        report.released += dissolve(txn, record.serial)
        report.dissolved += 1
    txn.count(documents=-1, kept=-int(record.kept), duplicates=-int(not record.kept), exact=-int(record.exact))


def _places_found(txn: IndexTxn) -> list[tuple[int, int, int]]:
    """(serial, band, band key) of every entry of the band table and place of the recent log (the table's none if
    its manifest of runs is damaged: its serials cannot be read, so duplicates' places there are lost)."""
    try:
        found = [(serial, band, int.from_bytes(key, "big")) for band, key, serial in band_entries(txn)]
    except IndexCorruptError:
        found = []
    bands = txn.index.signing.bands
    for key, value in txn.table_entries("recent"):
        _, _, keys, places = unpack_recent(value, bands)
        if places is not None:
            found += [(from_u64(key), band, int(keys[band])) for band in range(bands) if places >> band & 1]
    return found


def _forget_recent(txn: IndexTxn, key: bytes, kept: bool) -> None:
    """A forgotten document out of the ``recent`` log: a duplicate's places under band keys stay taken
    (as in the band table, where its entries stay: forgetting frees a kept document's places only)."""
    value = txn.get("recent", key)
    if value is None:
        return
    _, _, keys, places = unpack_recent(value, txn.index.signing.bands)
    if kept or places is None:
        txn.delete("recent", key)
    else:
        txn.txn.put(key, pack_recent(b"", b"", keys.astype(">u4").tobytes(), places), db=txn.dbs["recent"])


def dissolve(txn: IndexTxn, cluster: int) -> int:
    """Release every remaining member of a cluster whose representative is gone (merged or recent)."""
    members = list(txn.member_serials(cluster))
    for serial in members:
        record = txn.record(serial)
        record.cluster, record.cluster_id = 0, ""
        txn.put_record(record)
        txn.drop_logged_membership(serial)
    txn.txn.delete(serial_key(cluster), db=txn.dbs["members"])
    return len(members)


def sweep_expired(txn: IndexTxn, mirror: RecentMirror, bands: BandTables, cutoff: float,
                  budget: int) -> tuple[int, bool]:
    """Expire kept documents decided before ``cutoff``, at most ``budget`` records looked at.

    Returns (documents expired, whether the sweep reached documents newer than the cutoff).
    """
    start = txn.position(RETENTION_POSITION) or 1
    cursor = txn.txn.cursor(db=txn.dbs["docs"])
    expired: set[int] = set()
    looked, done, next_serial = 0, True, start
    if cursor.set_range(serial_key(start)):
        for key, raw in cursor:
            record = txn.unpack_record(from_u64(key), raw)
            if record.time >= cutoff:
                break
            if looked >= budget:
                done = False
                break
            looked += 1
            next_serial = record.serial + 1
            if record.kept and not record.expired:
                _expire(txn, bands, record)
                expired.add(record.serial)
    txn.set_position(RETENTION_POSITION, next_serial)
    if expired:
        txn.after_commit.append(lambda: mirror.drop_band_entries(expired))
    return len(expired), done


def _expire(txn: IndexTxn, bands: BandTables, record: DocRecord) -> None:
    key = u64(record.serial)
    recent = txn.get("recent", key)
    if recent is not None:
        ident, content, _, _ = unpack_recent(recent, txn.index.signing.bands)
        txn.txn.put(key, pack_recent(ident, content), db=txn.dbs["recent"])
    else:
        bands.remove(txn, record.serial, record_band_keys(txn, record))
    _remove_anchors(txn, record.serial)
    remove_rekeyed(txn, record.serial)
    txn.delete("shingles", key)
    record.expired = True
    txn.put_record(record)


def rebuild_tables(txn: IndexTxn, bands: BandTables) -> dict:
    """Re-derive ids, content, members, bands, the recent log and the counters from the records; the places
    duplicates took under band keys (``candidates.file_prober``), which no record holds, are kept as found."""
    held = _places_found(txn)
    for name in ("ids", "content", "members", "recent_members", "bands", "recent"):
        txn.txn.drop(txn.dbs[name], delete=False)
    txn.forget_member_log()
    txn.txn.delete(RUNS_KEY, db=txn.dbs["meta"])  # the band table's runs start again with its entries
    mirror = RecentMirror()
    counters = {"documents": 0, "kept": 0, "duplicates": 0, "exact": 0}
    entries, kept_serials, kept_keys, last = [], [], [], 0
    for record in txn.records():
        last = record.serial
        counters["documents"] += 1
        counters["kept" if record.kept else "duplicates"] += 1
        counters["exact"] += record.exact
        entries.append((record.serial, id_key(record.id), record.content))
        if record.cluster and not record.kept:
            txn.txn.put(serial_key(record.cluster), serial_key(record.serial), db=txn.dbs["members"], dupdata=True)
        if record.kept and not record.expired:
            kept_serials.append(record.serial)
            kept_keys.append(record_band_keys(txn, record))
    live = set(kept_serials)
    taken = [place for place in held if place[0] not in live]
    places = (np.array([p[0] for p in taken], dtype=np.int64), np.array([p[1] for p in taken], dtype=np.uint16),
              np.array([p[2] for p in taken], dtype=np.uint64))
    mirror.add(entries, np.array(kept_serials, dtype=np.int64),
               np.array(kept_keys, dtype=np.uint64).reshape(len(kept_keys), txn.index.signing.bands), places)
    merge_recent(txn, mirror, bands)
    previous = txn.counters
    fixed = {k: counters[k] - previous[k] for k in counters}
    txn.count(**fixed, next_serial=max(last - previous["next_serial"], 0))
    return {"documents": counters["documents"], "counters_changed": {k: v for k, v in fixed.items() if v}}


class ForgetRequests:
    """Forget requests handed to the process that writes the index (one writer per index).

    ``streamdedup forget`` applies the request itself when it can take the
    writer lock; while a worker (or backfill, or offline run) holds it, the
    command drops a request file into ``STATE/requests/`` and waits: the
    writer applies pending requests between batches, in their own
    transaction, and answers with a ``.done.json`` file.
    """

    def __init__(self, state: str):
        self.folder = os.path.join(state, "requests")

    def submit(self, ids: list[str]) -> str:
        os.makedirs(self.folder, exist_ok=True)
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        temporary = os.path.join(self.folder, name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"forget": ids}, handle)
        os.rename(temporary, os.path.join(self.folder, name + ".forget.json"))  # appears whole or not at all
        return name

    def wait(self, name: str, timeout_s: float) -> Optional[dict]:
        answer = os.path.join(self.folder, name + ".done.json")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(answer):
                with open(answer, encoding="utf-8") as handle:
                    result = json.load(handle)
                os.remove(answer)
                return result
            time.sleep(0.1)
        return None

    def pending(self) -> list[str]:
        try:
            return sorted(n[: -len(".forget.json")] for n in os.listdir(self.folder) if n.endswith(".forget.json"))
        except FileNotFoundError:
            return []

    def serve(self, apply) -> int:
        """Apply every pending request with ``apply(ids) -> ForgetReport``; returns how many were served."""
        served = 0
        for name in self.pending():
            path = os.path.join(self.folder, name + ".forget.json")
            with open(path, encoding="utf-8") as handle:
                ids = json.load(handle)["forget"]
            report = apply(ids)
            temporary = os.path.join(self.folder, name + ".done.tmp")
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(report.as_dict(), handle)
            os.rename(temporary, os.path.join(self.folder, name + ".done.json"))
            os.remove(path)
            served += 1
        return served


def _remove_anchors(txn: IndexTxn, serial: int) -> None:
    """Take a kept document out of the excerpt anchors (its anchors are among its stored shingles)."""
    sampling = txn.index.signing.excerpt_sampling
    stored = txn.stored_shingles(serial) if sampling else None
    if stored is not None:
        remove_anchors(txn, serial, anchors_of(stored, sampling))
