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
   c. otherwise the band tables propose kept documents sharing at least
      ``min_shared`` bands (two of 32 by default: a cheap agreement test that
      drops chance matches of one band; a band key proposes its earliest
      ``max_candidates`` kept documents, wherever they are held:
      ``candidates.file_kept``); the ones sharing the most bands
      are verified first (at most ``max_candidates``) by
      exact Jaccard of *content* (shingles without site templates:
      ``core.templates``, ``sitelearning``); the most similar at or above
      the threshold wins (ties: the earliest): a *near* duplicate in that
      document's cluster;
   d. otherwise, with excerpts on, the anchors (``core.excerpts``) propose
      kept documents holding most of the document's anchors; the one
      containing the largest share of its content, at or above
      ``excerpts.containment``, makes it an *excerpt*, in that document's
      cluster;
   e. none: kept, a new cluster named by the document's own id, inserted
      into the band tables (and its anchors into the anchor table).

Only kept documents are in the band and anchor tables, so documents are
compared with kept documents only and clusters never chain. A long article
arriving after an excerpt of it is kept: decisions are never revised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.excerpts import anchors_of, containment, likely_sources, need_of
from ..core.prepare import PreparedBatch
from ..core.records import DUPLICATE, KEPT, Decision, Document, Rejected
from ..core.signing import SigningConfig
from ..core.verify import best_match, jaccard
from ..store.anchors import BatchAnchors
from ..store.bands import BandTables
from ..store.index import DocRecord, IndexTxn
from ..store.candidates import chosen_candidates
from ..store.mirror import RecentMirror
from ..store.view import BatchView
from .sitelearning import BatchContent, FirstPages, SiteTemplates

__all__ = ["DedupSettings", "ExcerptSettings", "decide"]


@dataclass(frozen=True)
class ExcerptSettings:
    """The ``[excerpts]`` section (``sampling`` 0: off)."""

    sampling: int = 0  # one content shingle in this many is an anchor
    containment: float = 0.8  # share of a document's content inside the earlier one
    min_shingles: int = 50  # documents with less content are never excerpts
    max_postings: int = 32  # documents an anchor holds
    anchor_share: float = 0.5  # candidates hold at least this share of the document's anchors
    max_sources: int = 10  # candidates verified per document


@dataclass(frozen=True)
class DedupSettings:
    signing: SigningConfig
    threshold: float = 0.7  # exact Jaccard at or above which a document is a duplicate
    max_candidates: int = 100  # verify at most this many candidates per document
    retention_s: float = 0.0  # kept documents older than this match nothing (0: forever)
    excerpts: ExcerptSettings = ExcerptSettings()


@dataclass
class _Batch:
    """What deciding one batch carries from document to document."""

    view: BatchView
    batch: PreparedBatch
    settings: DedupSettings
    now: float
    cutoff: Optional[float]
    content: Optional[BatchContent]
    anchors: Optional[BatchAnchors]
    first: Optional[FirstPages] = None
    sites: Optional[list] = None  # site key of each row, as Python ints (a numpy scalar costs more each time)

    def content_of(self, row: int) -> np.ndarray:
        if self.content is None:
            return self.batch.shingles.of(row)
        return self.content.shingles[row]

    def stored_content(self, serial: int) -> np.ndarray:
        """A kept document's content as it stands now (its site's template may have grown since)."""
        shingles = self.view.shingles(serial)
        if self.content is None:
            return shingles
        return self.content.content_of_stored(shingles, self.view.record(serial).site)


def decide(txn: IndexTxn, batch: PreparedBatch, settings: DedupSettings, now: float,
           mirror: RecentMirror, bands: BandTables, templates: Optional[SiteTemplates] = None) -> list[Decision]:
    """Decide every item of the batch, in order, recording documents in the index."""
    view = BatchView(txn, mirror, batch.id_keys, batch.contents, batch.keys, bands, settings.max_candidates,
                     settings.signing.min_shared)
    content = templates.content(txn, view, batch) if templates is not None else None
    anchors = _batch_anchors(txn, batch, settings.excerpts, content) if settings.excerpts.sampling else None
    state = _Batch(view, batch, settings, now, now - settings.retention_s if settings.retention_s > 0 else None,
                   content, anchors, FirstPages(txn, settings.signing) if content is not None else None,
                   batch.sites.tolist())
    decisions = []
    for i, item in enumerate(batch.items):
        if isinstance(item, Rejected):
            decisions.append(Decision.rejected(item))
        else:
            if content is not None:
                _templates_at(state, batch.row[i])
            decisions.append(_decide_one(state, item, batch.row[i]))
    if anchors is not None:
        anchors.flush()
    if state.first is not None:
        state.first.write()
    txn.after_commit.append(view.flush())
    return decisions


def _batch_anchors(txn: IndexTxn, batch: PreparedBatch, settings: ExcerptSettings,
                   content: Optional[BatchContent]) -> BatchAnchors:
    """The anchor postings of every document of the batch, read at once."""
    rows = range(len(batch.contents))
    shingles = content.shingles if content is not None else [batch.shingles.of(r) for r in rows]
    none = np.zeros(0, dtype=np.uint64)
    return BatchAnchors(txn, settings.max_postings, [anchors_of(s, settings.sampling) if len(s) >= settings.min_shingles
                                                     else none for s in shingles])


def _templates_at(state: _Batch, row: int) -> None:
    """The templates as they stand at ``row``; learning sites changing there have their first pages rekeyed."""
    content = state.content
    content.timeline.at(row)
    for site in content.settles.get(row, ()):
        state.first.rekey(site, state.stored_content, row not in content.provisional)


def _decide_one(state: _Batch, doc: Document, row: int) -> Decision:
    view, batch, settings, now, cutoff = state.view, state.batch, state.settings, state.now, state.cutoff
    content, ident = batch.contents[row], batch.id_keys[row]
    if _alone(state, view, ident, content, row):  # most documents: new, and nothing to compare them with
        return _kept(state, doc, row, content, ident, 0, 0)
    earlier = _same_document(view, ident, doc.id, content)
    if earlier is not None:
        return _as_decision(earlier, replayed=True)
    serial = view.next_serial()
    identical = view.serial_of_content(content)
    twin = None if identical is None else view.record(identical)
    site = state.sites[row]
    if twin is not None and twin.cluster and _matchable(view, twin, cutoff):  # cluster 0: dissolved by forget
        record = DocRecord.exact_copy_of(twin, serial, doc, content, now, site)
        view.insert(record, ident, row)
        return _as_decision(record)
    own = state.content_of(row)
    # most documents share no band key with anything: their candidates are not gathered at all
    rekeyed = state.first is not None and state.first.rekeyed  # pages that may add a band to a weak candidate
    serials, shared, extra = (view.candidate_parts(row, rekeyed) if view.may_have_candidates(row, rekeyed)
                              else (_NONE, _NONE, []))
    if rekeyed:
        extra = [*extra, *state.first.candidates(view.band_keys_of(row)).tolist()]
    live = None if cutoff is None else (lambda s: _matchable(view, view.record(s), cutoff))
    chosen, candidates = chosen_candidates(serials, shared, extra, settings.signing.min_shared, live,
                                           settings.max_candidates)
    match, similarity, compared = None, None, 0
    if chosen:
        match, similarity, compared = best_match(own, ((s, state.stored_content(s)) for s in chosen),
                                                 settings.threshold)
    if match is not None:
        record = DocRecord.near_duplicate_of(view.record(match), similarity, serial, doc, content, now, site)
        view.insert(record, ident, row)
        return _as_decision(record, candidates=candidates, verified=compared)
    found = _anchored_match(state, own, row) if state.anchors is not None else None
    if found is not None:
        source, similarity, share, checked = found
        record = DocRecord.near_duplicate_of(view.record(source), similarity, serial, doc, content, now, site, share)
        view.insert(record, ident, row)
        return _as_decision(record, candidates=candidates, verified=compared + checked)
    return _kept(state, doc, row, content, ident, candidates, compared)


_NONE = np.zeros(0, dtype=np.int64)


def _alone(state: _Batch, view: BatchView, ident: bytes, content: bytes, row: int) -> bool:
    """Whether row ``row`` is surely kept without a look at anything: an id and a text the index has not
    decided, no band key shared with a kept document or another row, and no excerpt or rekeyed-page lookup."""
    return (state.anchors is None and view.unseen(ident, content) and not view.may_have_candidates(row)
            and (state.first is None or not state.first.rekeyed))


def _kept(state: _Batch, doc: Document, row: int, content: bytes, ident: bytes, candidates: int,
          verified: int) -> Decision:
    """Row ``row`` kept: a new cluster, in the band tables (and the anchor table)."""
    view, site = state.view, state.sites[row]
    serial = view.next_serial()
    record = DocRecord.new_cluster(serial, doc, content, view.record_band_keys(row), state.now, site)
    view.insert(record, ident, row, state.batch.shingles.of(row))
    if state.content is not None and row in state.content.provisional:
        state.first.kept(site, serial)
    if state.anchors is not None:
        state.anchors.kept(row, serial)
    return Decision(doc.id, KEPT, doc.id, None, None, None, False, False, candidates, verified, None)


def _anchored_match(state: _Batch, own: np.ndarray, row: int) -> Optional[tuple[int, float, Optional[float], int]]:
    """The kept document the anchors find for ``own``: (serial, Jaccard, containment or None, verified).

    A candidate at or above the Jaccard threshold is a near duplicate the
    band keys missed (the most similar wins); otherwise the one containing
    the largest share of ``own``, at or above ``excerpts.containment``, makes
    it an excerpt (ties: the earliest).
    """
    settings = state.settings.excerpts
    if len(own) < settings.min_shingles:
        return None
    anchors = len(state.anchors.anchors(row))
    if anchors == 0:
        return None
    serials, shared = state.anchors.holders(row, need_of(anchors, settings.anchor_share))
    if len(serials) == 0:
        return None
    near: Optional[tuple[int, float]] = None
    part: Optional[tuple[int, float, float]] = None
    sources = likely_sources(serials, shared, anchors, settings.anchor_share, settings.max_sources)
    for serial in sources:
        if state.cutoff is not None and not _matchable(state.view, state.view.record(serial), state.cutoff):
            continue
        whole = state.stored_content(serial)
        similarity = jaccard(own, whole)
        if similarity >= state.settings.threshold:
            if near is None or (similarity, -serial) > (near[1], -near[0]):
                near = (serial, similarity)
            continue
        share = containment(own, whole)
        if share >= settings.containment and (part is None or (share, -serial) > (part[1], -part[0])):
            part = (serial, share, similarity)
    if near is not None:
        return near[0], near[1], None, len(sources)
    if part is not None:
        return part[0], part[2], part[1], len(sources)
    return None


def _matchable(view: BatchView, record: DocRecord, cutoff: Optional[float]) -> bool:
    """Whether a decided document may still be matched: not past retention (its cluster's kept document)."""
    if cutoff is None:
        return True
    representative = record if record.kept else (view.record(record.cluster) if record.cluster else None)
    return representative is not None and not representative.expired and representative.time >= cutoff


def _same_document(view: BatchView, ident: bytes, doc_id: str, content: bytes) -> Optional[DocRecord]:
    """The decided document with this id (``ident`` its hash, shared by another id once in a great while)
    and this content, if any."""
    serials = view.serials_of_id(ident)
    if not serials:  # most documents: a new id
        return None
    for serial in serials:
        record = view.record(serial)
        if record.content == content and record.id == doc_id:
            return record
    return None


def _as_decision(record: DocRecord, replayed: bool = False, candidates: int = 0, verified: int = 0) -> Decision:
    # positional (id, status, cluster, matched, similarity, reason, exact, replayed, candidates, verified):
    # one per document, and keywords cost twice as much
    return Decision(record.id, KEPT if record.kept else DUPLICATE, record.cluster_id, record.matched_id,
                    record.similarity, None, record.exact, replayed, candidates, verified, record.containment)
