"""Step 2 of a sharded batch: the decisions, from the batch and every shard's evidence.

A pure function: every shard runs it on the same input and reaches the same
decisions. It follows ``engine.decide`` step for step (replay, exact copy,
near duplicate, kept), with the shards' evidence where the single index
would be read, and the batch's own earlier documents as the single index
holds them: so a sharded deployment decides as one worker does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.prepare import PreparedBatch
from ...core.records import DUPLICATE, KEPT, Decision, Rejected
from ...core.verify import jaccard
from ...store.index import DocRecord
from ...store.lookup import Hits, keys_shared_within, with_extra_candidates
from .evidence import Evidence, batch_band_keys, row_ids

__all__ = ["Together", "decide_together"]


@dataclass
class Together:
    """A batch's decisions (one per item) and the records of its documents, in serial order: (record, row)."""

    decisions: list[Decision]
    records: list[tuple[DocRecord, int]]
    serials: int  # serials the batch used


def decide_together(batch: PreparedBatch, evidences: list[Evidence], threshold: float, max_candidates: int,
                    min_shared: int, first_serial: int, now: float) -> Together:
    """Decide ``batch`` from every shard's evidence; its documents are numbered from ``first_serial``."""
    asked, rows, _ = batch_band_keys(batch)
    hits = Hits.found(asked, rows, len(batch.contents),
                      np.concatenate([e.found_keys for e in evidences]),
                      np.concatenate([e.found_serials for e in evidences]), max_candidates)
    state = _State(batch, evidences, hits, keys_shared_within(asked, rows), threshold, max_candidates,
                   min_shared, first_serial, now)
    decisions = [Decision.rejected(item) if isinstance(item, Rejected) else state.decide(item, row)
                 for item, row in zip(batch.items, batch.row)]
    return Together(decisions, state.records, len(state.records))


class _State:
    """What deciding one batch carries from document to document."""

    def __init__(self, batch: PreparedBatch, evidences: list[Evidence], hits: Hits, shared_within: dict,
                 threshold: float, max_candidates: int, min_shared: int, first_serial: int, now: float):
        self.batch, self.hits, self.shared_within = batch, hits, shared_within
        self.threshold, self.max_candidates, self.min_shared = threshold, max_candidates, min_shared
        self.first_serial, self.now = first_serial, now
        self.ids = row_ids(batch)
        self.sites = batch.sites.tolist()
        self.replays: dict = {}
        self.twins: dict = {}
        self.similarity: dict = {}
        self.names: dict = {}
        for evidence in evidences:
            self.replays.update(evidence.replays)
            for row, twin in evidence.twins.items():  # the first document of a content, over every shard
                if row not in self.twins or twin[0] < self.twins[row][0]:
                    self.twins[row] = twin
            self.similarity.update(((row, serial), sim) for row, serial, sim in evidence.matches)
            self.names.update(evidence.names)
        self.records: list[tuple[DocRecord, int]] = []
        self.by_id: dict[bytes, list[int]] = {}  # the batch's documents, as the index files them
        self.by_content: dict[bytes, int] = {}
        self.kept_by_key: dict[int, list[int]] = {}
        self.shingles: dict[int, np.ndarray] = {}

    def record(self, serial: int) -> DocRecord:
        return self.records[serial - self.first_serial][0]

    def decide(self, doc, row: int) -> Decision:
        batch = self.batch
        ident, content = batch.id_keys[row], batch.contents[row]
        replayed = self._replayed(row, ident, content, doc.id)
        if replayed is not None:
            return replayed
        serial = self.first_serial + len(self.records)
        site = self.sites[row]
        twin = self._twin(row, content)
        if twin is not None and twin.cluster:  # cluster 0: dissolved by forget
            return self._insert(DocRecord.exact_copy_of(twin, serial, doc, content, self.now, site), ident, row)
        own = batch.shingles.of(row)
        match, similarity = self._best_match(row, own)
        if match is not None:
            record = DocRecord.near_duplicate_of(self._representative(match), similarity, serial, doc, content,
                                                 self.now, site)
            return self._insert(record, ident, row)
        record = DocRecord.new_cluster(serial, doc, content, b"", self.now, site)
        self.shingles[serial] = own
        for key in self.shared_within.get(row, ()):  # only keys a later row may ask for
            holders = self.kept_by_key.setdefault(key, [])
            if len(holders) < self.max_candidates:  # the earliest, as for stored documents
                holders.append(serial)
        return self._insert(record, ident, row)

    def _replayed(self, row: int, ident: bytes, content: bytes, doc_id: str):
        earlier = self.replays.get(row)
        if earlier is not None:
            doc, kept, cluster, matched, similarity, exact, containment = earlier
            return Decision(doc, KEPT if kept else DUPLICATE, cluster, matched, similarity, None, exact, True, 0, 0,
                            containment)
        for serial in self.by_id.get(ident, ()):
            record = self.record(serial)
            if record.content == content and record.id == doc_id:
                return _as_decision(record, replayed=True)
        return None

    def _twin(self, row: int, content: bytes):
        """The first document with this content: a stored one (any shard), else one of this batch."""
        stored = self.twins.get(row)
        if stored is not None:
            serial, cluster, cluster_id, doc_id = stored
            return DocRecord(serial, doc_id, cluster == serial, cluster, cluster_id, None, None, None, False,
                             content, [], b"", 0.0)
        serial = self.by_content.get(content)
        return None if serial is None else self.record(serial)

    def _representative(self, serial: int) -> DocRecord:
        if serial >= self.first_serial:
            return self.record(serial)
        doc_id = self.names[serial]
        return DocRecord(serial, doc_id, True, serial, doc_id, None, None, None, False, b"", [], b"", 0.0)

    def _best_match(self, row: int, own: np.ndarray):
        """The most similar candidate at or above the threshold (ties: the earliest), as ``engine.decide``
        chooses and verifies them; stored ones by their shard's Jaccard."""
        serials, shared = self.hits.of(row)
        extra = [serial for key in self.shared_within.get(row, ()) for serial in self.kept_by_key.get(key, ())]
        serials, shared = with_extra_candidates(serials, shared, extra)
        if self.min_shared > 1 and len(serials):
            enough = shared >= self.min_shared
            serials, shared = serials[enough], shared[enough]
        if len(serials) > self.max_candidates:
            serials = serials[np.lexsort((serials, -shared))[: self.max_candidates]]
        best, best_similarity = None, -1.0
        for serial in serials.tolist():
            if serial >= self.first_serial:
                similarity = jaccard(own, self.shingles[serial])
            else:
                similarity = self.similarity.get((row, serial), -1.0)
            if similarity >= self.threshold and (
                    similarity > best_similarity or (similarity == best_similarity and serial < best)):
                best, best_similarity = serial, similarity
        return best, (best_similarity if best is not None else None)

    def _insert(self, record: DocRecord, ident: bytes, row: int) -> Decision:
        self.records.append((record, row))
        self.by_id.setdefault(ident, []).append(record.serial)
        self.by_content.setdefault(record.content, record.serial)
        return _as_decision(record)


def _as_decision(record: DocRecord, replayed: bool = False) -> Decision:
    return Decision(record.id, KEPT if record.kept else DUPLICATE, record.cluster_id, record.matched_id,
                    record.similarity, None, record.exact, replayed, 0, 0, record.containment)
