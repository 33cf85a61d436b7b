"""The index consistency check: every table agrees with the document records.

Used by ``streamdedup check`` and as the oracle of the crash tests. Reads one
snapshot (one read transaction), so it is safe while the worker runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .index import Index, IndexTxn, from_u64, id_key

__all__ = ["CheckReport", "check_index"]

MAX_LISTED = 20  # problems listed per kind; the rest are counted


@dataclass
class CheckReport:
    documents: int = 0
    kept: int = 0
    band_entries: int = 0
    problems: list[str] = field(default_factory=list)
    more: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_LISTED * 8:
            self.problems.append(text)
        else:
            self.more += 1


def check_index(index: Index) -> CheckReport:
    """Check counters, band tables, ids, contents and clusters against the document records."""
    report = CheckReport()
    with index.read() as txn:
        kept_bands = _check_records(txn, report)
        _check_bands(txn, kept_bands, report)
        _check_lookups(txn, report)
        _check_counters(txn, report)
    return report


def _check_records(txn: IndexTxn, report: CheckReport) -> dict[int, set[tuple[int, int]]]:
    """Each record against its cluster, its match and its stored shingles; returns kept documents' band keys."""
    bands = txn.index.signing.bands
    kept_bands: dict[int, set[tuple[int, int]]] = {}
    kinds = {}
    for record in txn.records():
        report.documents += 1
        kinds[record.serial] = record.kept
        if record.kept:
            report.kept += 1
            keys = np.frombuffer(record.band_keys, dtype=">u8")
            if len(keys) != bands:
                report.problem(f"kept document #{record.serial} ({record.id}) has {len(keys)} band keys, not {bands}")
            kept_bands[record.serial] = {(b, int(k)) for b, k in enumerate(keys.tolist())}
            if txn.txn.get(record.serial.to_bytes(8, "big"), db=txn.dbs["shingles"]) is None:
                report.problem(f"kept document #{record.serial} ({record.id}) has no stored shingles")
            if record.cluster != record.serial:
                report.problem(f"kept document #{record.serial} names cluster #{record.cluster}, not itself")
    memberships = {(from_u64(k), from_u64(v)) for k, v in txn.txn.cursor(db=txn.dbs["members"])}
    for record in txn.records():
        if not record.kept and not kinds.get(record.cluster, False):
            report.problem(f"duplicate #{record.serial} ({record.id}) joins cluster #{record.cluster}, "
                           "which is not a kept document")
        if (record.cluster, record.serial) not in memberships:
            report.problem(f"document #{record.serial} is missing from the members of cluster #{record.cluster}")
        if record.serial not in txn.serials_of_id(record.id):
            report.problem(f"document #{record.serial} cannot be found by its id {record.id!r}")
        if txn.serial_of_content(record.content) is None:
            report.problem(f"document #{record.serial} cannot be found by its content hash")
    return kept_bands


def _check_bands(txn: IndexTxn, kept_bands: dict[int, set[tuple[int, int]]], report: CheckReport) -> None:
    seen: dict[int, int] = {}
    for band, key, serial in txn.band_entries():
        report.band_entries += 1
        wanted = kept_bands.get(serial)
        if wanted is None:
            report.problem(f"band {band} entry points at #{serial}, which is not a kept document")
        elif (band, int.from_bytes(key, "big")) not in wanted:
            report.problem(f"band {band} entry for #{serial} does not match its band keys")
        else:
            seen[serial] = seen.get(serial, 0) + 1
    for serial, keys in kept_bands.items():
        if seen.get(serial, 0) != len(keys):
            report.problem(f"kept document #{serial} has {seen.get(serial, 0)} band entries, not {len(keys)}")


def _check_lookups(txn: IndexTxn, report: CheckReport) -> None:
    for key, value in txn.txn.cursor(db=txn.dbs["ids"]):
        serial = from_u64(value)
        raw = txn.txn.get(value, db=txn.dbs["docs"])
        if raw is None or id_key(txn.record(serial).id) != key:
            report.problem(f"id entry points at #{serial}, which has another id or no record")
    for key, value in txn.txn.cursor(db=txn.dbs["content"]):
        serial = from_u64(value)
        if txn.txn.get(value, db=txn.dbs["docs"]) is None or txn.record(serial).content != key:
            report.problem(f"content entry points at #{serial}, which has other content or no record")
    for key, value in txn.txn.cursor(db=txn.dbs["members"]):
        cluster, serial = from_u64(key), from_u64(value)
        if txn.txn.get(value, db=txn.dbs["docs"]) is None or txn.record(serial).cluster != cluster:
            report.problem(f"member #{serial} of cluster #{cluster} has no record or another cluster")


def _check_counters(txn: IndexTxn, report: CheckReport) -> None:
    counters = txn.counters
    if counters["documents"] != report.documents or counters["kept"] != report.kept:
        report.problem(f"counters say {counters['documents']} documents / {counters['kept']} kept; "
                       f"the records say {report.documents} / {report.kept}")
    if counters["duplicates"] != report.documents - report.kept:
        report.problem(f"counters say {counters['duplicates']} duplicates; records say "
                       f"{report.documents - report.kept}")
