"""Where a document is decided: kept, duplicate, or the earlier decision replayed.

A batch goes through two steps:

1. ``prepare.prepare`` (pure, no index): normalize, hash the content, shingle, sign
   and cut band keys for every document of the batch at once;
2. ``decide`` (inside one index write transaction), document by document in
   batch order, each seeing the decisions before it:

   a. same id and same content as a decided document: that decision again
      (``replayed``), nothing written;
   b. same normalized text as a decided document that still belongs to a
      cluster: an *exact* duplicate of it, joining its cluster, no band lookup;
   c. otherwise the band tables propose kept documents; the ones sharing
      the most bands are verified first (at most ``max_candidates``) by
      exact Jaccard; the most similar at or above the threshold wins (ties:
      the earliest). Found: a duplicate in that document's cluster. None:
      kept, a new cluster named by the document's own id, inserted into
      the band tables.

Only kept documents are in the band tables, so documents are compared with
kept documents only and clusters never chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.prepare import PreparedBatch
from ..core.records import DUPLICATE, KEPT, Decision, Document, Rejected
from ..core.signing import SigningConfig
from ..core.verify import best_match
from ..store.bands import BandTables
from ..store.index import DocRecord, IndexTxn
from ..store.lookup import BatchView, RecentMirror

__all__ = ["DedupSettings", "decide"]


@dataclass(frozen=True)
class DedupSettings:
    signing: SigningConfig
    threshold: float = 0.7  # exact Jaccard at or above which a document is a duplicate
    max_candidates: int = 100  # verify at most this many candidates per document
    retention_s: float = 0.0  # kept documents older than this match nothing (0: forever)


def decide(txn: IndexTxn, batch: PreparedBatch, settings: DedupSettings, now: float,
           mirror: RecentMirror, bands: BandTables) -> list[Decision]:
    """Decide every item of the batch, in order, recording documents in the index."""
    view = BatchView(txn, mirror, batch.id_keys, batch.contents, batch.keys, bands)
    cutoff = now - settings.retention_s if settings.retention_s > 0 else None
    decisions = []
    for i, item in enumerate(batch.items):
        if isinstance(item, Rejected):
            decisions.append(Decision.rejected(item))
        else:
            decisions.append(_decide_one(view, item, batch.row[i], batch, settings, now, cutoff))
    txn.after_commit.append(view.flush())
    return decisions


def _decide_one(
    view: BatchView, doc: Document, row: int, batch: PreparedBatch, settings: DedupSettings, now: float,
    cutoff: Optional[float] = None,
) -> Decision:
    content, ident = batch.contents[row], batch.id_keys[row]
    earlier = _same_document(view, ident, content)
    if earlier is not None:
        return _as_decision(earlier, replayed=True)
    serial = view.next_serial()
    identical = view.serial_of_content(content)
    twin = None if identical is None else view.record(identical)
    if twin is not None and twin.cluster and _matchable(view, twin, cutoff):  # cluster 0: dissolved by forget
        record = DocRecord.exact_copy_of(twin, serial, doc, content, now)
        view.insert(record, ident, row)
        return _as_decision(record)
    shingles = batch.shingles.of(row)
    serials, shared = view.candidates(row)
    if cutoff is not None:
        live = np.array([_matchable(view, view.record(s), cutoff) for s in serials.tolist()], dtype=bool)
        serials, shared = serials[live], shared[live]
    if len(serials) > settings.max_candidates:
        serials = serials[np.lexsort((serials, -shared))[: settings.max_candidates]]
    match, similarity, compared = None, None, 0
    if len(serials):
        match, similarity, compared = best_match(
            shingles, ((s, view.shingles(s)) for s in serials.tolist()), settings.threshold
        )
    if match is None:
        record = DocRecord.new_cluster(serial, doc, content, view.band_key_bytes(row), now)
        view.insert(record, ident, row, shingles)
    else:
        record = DocRecord.near_duplicate_of(view.record(match), similarity, serial, doc, content, now)
        view.insert(record, ident, row)
    return _as_decision(record, candidates=len(shared), verified=compared)


def _matchable(view: BatchView, record: DocRecord, cutoff: Optional[float]) -> bool:
    """Whether a decided document may still be matched: not past retention (its cluster's kept document)."""
    if cutoff is None:
        return True
    representative = record if record.kept else (view.record(record.cluster) if record.cluster else None)
    return representative is not None and not representative.expired and representative.time >= cutoff


def _same_document(view: BatchView, ident: bytes, content: bytes) -> Optional[DocRecord]:
    """The decided document with this id and this content, if any."""
    serials = view.serials_of_id(ident)
    if not serials:  # most documents: a new id
        return None
    for serial in serials:
        record = view.record(serial)
        if record.content == content:
            return record
    return None


def _as_decision(record: DocRecord, replayed: bool = False, candidates: int = 0, verified: int = 0) -> Decision:
    # positional (id, status, cluster, matched, similarity, reason, exact, replayed, candidates, verified):
    # one per document, and keywords cost twice as much
    return Decision(record.id, KEPT if record.kept else DUPLICATE, record.cluster_id, record.matched_id,
                    record.similarity, None, record.exact, replayed, candidates, verified)
