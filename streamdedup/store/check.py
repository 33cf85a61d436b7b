"""The index consistency check: every table agrees with the document records.

Members released by ``forget`` (cluster 0) and kept documents expired by
retention (no band entries, no shingles) are consistent states.

Used by ``streamdedup check`` and as the oracle of the crash tests. Reads one
snapshot (one read transaction), so it is safe while the worker runs. A
document's lookup keys live either in the ``recent`` log (serials after
``merged_upto``) or in the ``ids`` / ``content`` / ``bands`` tables (up to it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.records import id_key
from ..errors import IndexCorruptError
from .bands import band_entries, record_band_keys, run_problems
from .hashed import entries
from .index import Index, IndexTxn, content_key, from_u64
from .mirror import unpack_recent

__all__ = ["CheckReport", "check_index"]

_NO_KEYS = np.zeros(0, dtype=np.uint64)

MAX_PROBLEMS = 200  # listed; the rest are counted


@dataclass
class CheckReport:
    documents: int = 0
    kept: int = 0
    band_entries: int = 0
    places: int = 0  # band entries of duplicates (and forgotten ones): places taken, proposing nothing
    recent: int = 0
    problems: list[str] = field(default_factory=list)
    more: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.more += 1


def check_index(index: Index) -> CheckReport:
    """Check counters, lookup tables, the recent log and clusters against the document records."""
    report = CheckReport()
    with index.read() as txn:
        merged = txn.counters["merged_upto"]
        bands = txn.index.signing.bands
        recent = {from_u64(k): unpack_recent(v, bands) for k, v in txn.table_entries("recent")}
        report.recent = len(recent)
        kept_keys = _check_records(txn, report, recent, merged)
        unmerged = {serial: {(b, int(k)) for b, k in enumerate(entry[2].tolist())} for serial, entry in recent.items()}
        _check_bands(txn, kept_keys, merged, report, unmerged)
        _check_tables(txn, report)
        _check_counters(txn, report)
    return report


def _check_records(txn: IndexTxn, report: CheckReport, recent: dict, merged: int) -> dict[int, set[tuple[int, int]]]:
    """Each record against its cluster, its lookup keys and its shingles; returns merged kept documents' band keys."""
    bands = txn.index.signing.bands
    ids = set(entries(txn, "ids"))
    contents = {txn.record(serial).content for _, serial in entries(txn, "content") if txn.has_record(serial)}
    members = set(txn.memberships())
    kept_serials = set()
    merged_keys: dict[int, set[tuple[int, int]]] = {}
    for record in txn.records():
        report.documents += 1
        name = f"document #{record.serial} ({record.id})"
        live = record.kept and not record.expired  # in the band tables
        keys = _NO_KEYS
        if record.kept:
            report.kept += 1
            kept_serials.add(record.serial)
            if live and _check_shingles(txn, record.serial, name, report):
                keys = record_band_keys(txn, record)
                if len(keys) != bands:
                    report.problem(f"kept {name} has {len(keys)} band keys, not {bands}")
            if record.cluster != record.serial:
                report.problem(f"kept {name} names cluster #{record.cluster}, not itself")
        if record.cluster and not record.kept and (record.cluster, record.serial) not in members:
            report.problem(f"{name} is missing from the members of cluster #{record.cluster}")
        if record.serial > merged:
            _check_recent_entry(record, name, keys if live else keys[:0], recent.get(record.serial), report)
        else:
            if (id_key(record.id), record.serial) not in ids:
                report.problem(f"{name} cannot be found by its id")
            if record.content not in contents:
                report.problem(f"{name} cannot be found by its content hash")
            if live:
                merged_keys[record.serial] = {(b, int(k)) for b, k in enumerate(keys.tolist())}
    counters = txn.counters
    finishing = counters["merging"] and counters["merge_upto"] == merged  # merged, ``recent`` being emptied
    for serial in recent:
        if serial <= merged and not finishing:
            report.problem(f"recent log still holds #{serial}, already merged (up to #{merged})")
    for record in txn.records():
        if not record.kept and record.cluster and record.cluster not in kept_serials:
            report.problem(f"duplicate #{record.serial} ({record.id}) joins cluster #{record.cluster}, "
                           "which is not a kept document")
    return merged_keys


def _check_recent_entry(record, name: str, keys: np.ndarray, entry, report: CheckReport) -> None:
    if entry is None:
        report.problem(f"{name} is newer than the last merge but missing from the recent log")
        return
    ident, content, recent_keys, places = entry
    if ident != id_key(record.id) or content != record.content:
        report.problem(f"{name} has other id or content hashes in the recent log")
    if places is not None:  # a duplicate's places: its own lookup keys, which no record holds
        if record.kept:
            report.problem(f"kept {name} has a duplicate's places in the recent log")
    elif not np.array_equal(recent_keys, keys):
        report.problem(f"{name} has other band keys in the recent log")


def _check_bands(txn: IndexTxn, merged_keys: dict[int, set[tuple[int, int]]], merged: int,
                 report: CheckReport, unmerged_keys: dict) -> None:
    seen: dict[int, int] = {}
    problems = run_problems(txn)
    for problem in problems:
        report.problem(problem)
    if problems:
        return  # the entries' serials cannot be read
    for band, key, serial in band_entries(txn):
        report.band_entries += 1
        wanted = merged_keys.get(serial)
        if wanted is None and serial > merged and (band, int.from_bytes(key, "big")) in unmerged_keys.get(serial, ()):
            continue  # a merge that was interrupted: it is done again from the recent log
        if wanted is None and not (txn.has_record(serial) and txn.record(serial).kept):
            report.places += 1  # a duplicate's place (``candidates.file_prober``)
        elif wanted is None:
            report.problem(f"band {band} entry points at #{serial}, a kept document not merged or expired")
        elif (band, int.from_bytes(key, "big")) not in wanted:
            report.problem(f"band {band} entry for #{serial} does not match its band keys")
        else:
            seen[serial] = seen.get(serial, 0) + 1
    for serial, keys in merged_keys.items():
        if seen.get(serial, 0) != len(keys):
            report.problem(f"kept document #{serial} has {seen.get(serial, 0)} band entries, not {len(keys)}")


def _check_tables(txn: IndexTxn, report: CheckReport) -> None:
    """Every lookup entry points at a record that has that id, content or cluster."""
    for key, serial in entries(txn, "ids"):
        if not txn.has_record(serial) or id_key(txn.record(serial).id) != key:
            report.problem(f"id entry points at #{serial}, which has another id or no record")
    for key, serial in entries(txn, "content"):
        if not txn.has_record(serial) or content_key(txn.record(serial).content) != key:
            report.problem(f"content entry points at #{serial}, which has other content or no record")
    for cluster, serial in txn.memberships():
        member = txn.record(serial) if txn.has_record(serial) else None
        if member is None or member.cluster != cluster or member.kept:
            report.problem(f"member #{serial} of cluster #{cluster} has no record, another cluster or is kept")
    _check_anchors(txn, report)


def _check_shingles(txn: IndexTxn, serial: int, name: str, report: CheckReport) -> bool:
    """Whether a live kept document's shingles are stored and decode (a problem is reported if not)."""
    try:
        if txn.stored_shingles(serial) is not None:
            return True
        report.problem(f"kept {name} has no stored shingles")
    except IndexCorruptError as damaged:
        report.problem(f"kept {name}: {damaged}")
    return False


def _check_anchors(txn: IndexTxn, report: CheckReport) -> None:
    """Every excerpt anchor belongs to a kept, unexpired document whose stored shingles hold it."""
    for key, value in txn.table_entries("anchors"):
        serial = from_u64(value)
        stored = txn.stored_shingles(serial)
        record = txn.record(serial) if txn.has_record(serial) else None
        if record is None or not record.kept or record.expired or stored is None:
            report.problem(f"excerpt anchor points at #{serial}, which is not a kept, unexpired document")
        elif not _holds(stored, int.from_bytes(key, "big")):
            report.problem(f"excerpt anchor of #{serial} is not among its shingles")


def _check_counters(txn: IndexTxn, report: CheckReport) -> None:
    counters = txn.counters
    if counters["documents"] != report.documents or counters["kept"] != report.kept:
        report.problem(f"counters say {counters['documents']} documents / {counters['kept']} kept; "
                       f"the records say {report.documents} / {report.kept}")
    if counters["duplicates"] != report.documents - report.kept:
        report.problem(f"counters say {counters['duplicates']} duplicates; records say "
                       f"{report.documents - report.kept}")


def _holds(sorted_hashes: np.ndarray, value: int) -> bool:
    at = int(np.searchsorted(sorted_hashes, np.uint64(value)))
    return at < len(sorted_hashes) and int(sorted_hashes[at]) == value
