"""Where a document is decided: kept, duplicate, or the earlier decision replayed.

One decision function, ``decide_together``, for the single worker and for
every vshard of a sharded deployment (``engine.vshards``). It reads no
index: it is a pure function of the batch (prepared by ``core.prepare``:
normalized, hashed, shingled, signed, cut into band keys) and of the
*evidence* gathered for it (``evidence``: what the index, or the vshards,
say about each of its documents), so a rule changes in one place. ``engine.Engine`` gathers
the evidence from its index, calls it, and writes the outcome.

Document by document in batch order, each seeing the decisions before it:

   a. same id and same content as a decided document: that decision again
      (``replayed``), nothing written;
   b. same normalized text as a decided document that still belongs to a
      cluster: an *exact* duplicate of it, joining its cluster, no band lookup;
   c. otherwise the band tables propose kept documents sharing at least
      ``min_shared`` bands (two of 32 by default: a cheap agreement test that
      drops chance matches of one band; a band key proposes at most
      ``max_candidates`` kept documents wherever they are held: its earliest,
      or with ``lsh.cap = "probes"`` those among its first ``max_candidates``
      probers, every document that looks it up: ``candidates.file_prober``);
      the ones sharing the most bands
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

Only kept documents are proposed (a duplicate's band entries only hold its
places) and only kept documents are in the anchor table, so documents are
compared with kept documents only and clusters never chain. A long article
arriving after an excerpt of it is kept: decisions are never revised.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Callable, Optional

import numpy as np

from ..core.excerpts import likely_sources, need_of
from ..core.lsh import band_slots
from ..core.prepare import PreparedBatch
from ..core.records import DUPLICATE, KEPT, Decision, Rejected, Source
from ..core.signing import band_keys_of
from ..store.index import DocRecord
from ..store.anchors import BatchAnchors
from ..store.candidates import (Hits, RekeyedKeys, SharedKeys, chosen_candidates, earliest_of_each_key, file_prober,
                                 filed_places, keys_shared_within, room_under)
from .settings import DedupSettings, ExcerptSettings
from .sitelearning import BatchContent
from .evidence import (Evidence, Gathered, excerpt_anchors, own_keys_of, pair_containment, pair_similarity,
                       probe_slots, row_anchors)

try:
    from ..core import _kernel
except ImportError:  # built without a C compiler: rows surely kept are kept one by one here
    _kernel = None

__all__ = ["Together", "decide_together"]


@dataclass
class Together:
    """A batch's decisions (one per item; None: kept, not asked for), the records of the documents it looked
    at, by serial in order (record, row; record None: not made, see ``decide_together``), and the first pages
    each learning site it touched has now (to write into the index)."""

    decisions: list[Optional[Decision]]
    records: dict[int, tuple[Optional[DocRecord], int]]
    first_serial: int
    serials: int  # serials the batch used
    filed: np.ndarray  # rows x bands: the band keys each row takes a place under (``candidates.file_prober``)
    provisional: dict = field(default_factory=dict)
    rekeyed: dict = field(default_factory=dict)  # serial -> band keys: the batch's own first pages rekeyed


def decide_together(batch: PreparedBatch, evidences: list[Evidence], rules: DedupSettings, first_serial: int, now: float,
                    lookup_keys: Optional[np.ndarray] = None, content: Optional[BatchContent] = None,
                    provisional_pages: Callable[[int], list[int]] = lambda site: [],
                    mine: Optional[list[bool]] = None, gathered: Optional[Gathered] = None) -> Together:
    """Decide ``batch`` from the evidence of every index holding documents (one, for a single worker); its
    documents are numbered from ``first_serial``.

    ``lookup_keys``: the band keys rows are looked up by (default: their
    signed keys); with site templates, ``content`` (``SiteTemplates.content``)
    and the committed first pages of a site (``provisional_pages``).
    ``mine``: the items whose decisions and records the caller wants
    (default: all; with ``gathered`` only). The others get no decision
    (None, but for replays): one surely kept (``alone_rows``) only takes its
    serial, the rest are decided as usual, and the record of one kept is
    made only if a later document names it.

    ``gathered``: the batch's candidates, in-batch ones included, with their
    similarities and each row's serial, gathered outside it (``Gathered``:
    the key owners and homes of a deployment that splits the band tables);
    the batch then needs no shingles or band keys, and every item is looked at.
    """
    lookup_keys = batch.keys if lookup_keys is None else lookup_keys
    if gathered is None:
        filed_slots = batch.sorted_slots(lookup_keys)
        asked, rows = probe_slots(batch, lookup_keys, content)
        found_keys = np.concatenate([e.found_keys for e in evidences])
        holding = [e for e in evidences if len(e.found_keys)]
        hits = holding[0].hits_of(asked, rules.max_candidates) if len(holding) == 1 else None
        if hits is None:  # several indexes' entries (or none): made here
            hits = Hits.found(asked, rows, len(batch.contents), found_keys,
                              np.concatenate([e.found_serials for e in evidences]), rules.max_candidates)
        shared_within = keys_shared_within(asked, rows)
        room = room_under(shared_within.slots(), found_keys, rules.max_candidates)
        following = _rows_following(asked, rows, len(batch.contents))
    else:
        hits, shared_within, room, following = gathered.hits, SharedKeys.none(), {}, None
    state = _State(batch, evidences, hits, shared_within, room, rules, first_serial, now, lookup_keys, content,
                   provisional_pages, gathered, following)
    decisions: list[Optional[Decision]] = [None] * len(batch.items)
    alone_rows = state.alone_rows()
    alone = alone_rows.tolist()
    quick = gathered is None and mine is None  # alone rows kept on the short path (``_State.keep_alone``)
    for i in _others(batch.row, state.quick_rows(alone_rows)) if quick else range(len(batch.items)):
        if quick:
            state.keep_alone(decisions, i)  # the items before ``i`` not kept yet: most rows
            if i == len(batch.items):
                break
        item, row = batch.items[i], batch.row[i]
        if isinstance(item, Rejected):
            decisions[i] = Decision.rejected(item)
            continue
        if gathered is not None:
            state.next_serial = gathered.serial_of[row]
        if content is not None:
            state.templates_at(row)
        wanted = mine is None or mine[i]
        if not wanted and alone[row]:
            state.kept_unwanted(item, row)
        elif gathered is not None and alone[row]:  # most rows: kept on the quick path, their serials given
            state.keep_alone_at(decisions, i, state.next_serial)
        else:
            decisions[i] = state.decide(item, row, wanted)
    first, state.first = state.first, None  # it refers to the state: refcounting frees both, not the collector
    if gathered is not None:  # the key owners filed the places, and the serials are the caller's
        return Together(decisions, state.records, first_serial, 0, np.zeros((len(batch.contents), 0), dtype=bool))
    serials = state.next_serial - first_serial
    filed = _places_taken(state, *filed_slots, lookup_keys.shape, found_keys)
    if first is None:
        return Together(decisions, state.records, first_serial, serials, filed)
    return Together(decisions, state.records, first_serial, serials, filed, first.pages, first.rekeyed_here)


def _rows_following(asked: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """Which of ``n`` rows look up a band slot an earlier row of the batch looks up too (``asked``: the slots
    sorted, equal ones in row order, ``rows`` the row of each: ``evidence.probe_slots``)."""
    return _rows_in(rows[1:][asked[1:] == asked[:-1]].tolist(), n)


def _rows_in(rows, n: int) -> np.ndarray:
    """Which of ``n`` rows are among ``rows`` (a collection of row numbers)."""
    marked = np.zeros(n, dtype=bool)
    if rows:
        marked[np.fromiter(rows, dtype=np.int64, count=len(rows))] = True
    return marked


def _others(rows: list[int], alone: np.ndarray) -> list[int]:
    """The items the quick path does not keep (rejected ones, and documents of rows not ``alone``), then one
    past the last item."""
    row = np.asarray(rows, dtype=np.int64)
    quick = np.zeros(len(row), dtype=bool)
    documents = row >= 0
    quick[documents] = alone[row[documents]]
    return [*np.flatnonzero(~quick).tolist(), len(row)]


class _State:
    """What deciding one batch carries from document to document."""

    def __init__(self, batch: PreparedBatch, evidences: list[Evidence], hits: Hits, shared_within: SharedKeys,
                 room: dict[int, int], rules: DedupSettings, first_serial: int, now: float, lookup_keys: np.ndarray,
                 content: Optional[BatchContent], provisional_pages: Callable[[int], list[int]],
                 gathered: Optional[Gathered] = None, following: Optional[np.ndarray] = None):
        self.batch, self.hits, self.shared_within, self.room, self.rules = batch, hits, shared_within, room, rules
        self.gathered = gathered
        self.following = following  # the rows sharing a band slot with an earlier row (``_rows_following``)
        self.strong = hits.at_least(rules.signing.min_shared)  # the hits that can be candidates by themselves
        self.strong_counts = np.diff(np.asarray(self.strong.bounds))  # how many of them each row has
        self.first_serial, self.now, self.lookup_keys, self.content = first_serial, now, lookup_keys, content
        self.rekeyed_rows = frozenset() if lookup_keys is batch.keys else \
            frozenset(np.flatnonzero((lookup_keys != batch.keys).any(axis=1)).tolist())
        self.alike_ids, self.alike_contents = _Alike(batch.id_keys, 8), _Alike(batch.contents, 16)
        self.sites = batch.sites.tolist()
        self.replays: dict = {}
        self.twins: dict = {}
        self.similarity: dict = {}
        self.names: dict = {}
        rekeys: dict = {}
        self.unmatchable: set = set()  # stored kept documents past retention
        self.unkept: set = set()  # stored entries found under the batch's keys that propose nothing: duplicates
        self.unprobed_rows: set = set()  # replays and exact copies: they take no place under a band key
        self.probes = rules.signing.cap == "probes"  # a duplicate takes places (``candidates.file_prober``)
        for evidence in evidences:
            self.unmatchable.update(evidence.unmatchable)
            self.unkept.update(evidence.unkept)
            self.replays.update(evidence.replays)
            for row, twin in evidence.twins.items():  # the first document of a content, over every shard
                if row not in self.twins or twin[0] < self.twins[row][0]:
                    self.twins[row] = twin
            self.similarity.update({(row, serial): sim for row, serial, sim in evidence.matches})
            self.names.update(evidence.names)
            rekeys.update({(row, serial): keys for row, serial, keys in evidence.rekeys})
        self.records: dict[int, tuple[Optional[DocRecord], int]] = {}  # serial -> (record, row), in order
        self.next_serial = first_serial
        self.by_id: dict[bytes, list[int]] = {}  # the batch's documents, as the index files them
        self.by_content: dict[bytes, int] = {}
        self.kept_by_key: dict[int, list[int]] = {}
        self._unwanted: dict[int, object] = {}  # serial -> document: kept at once, record not made yet
        self.sources: dict = {}
        for evidence in evidences:
            self.sources.update(((row, serial), (jac, share)) for row, serial, jac, share in evidence.sources)
        self.anchors = _UnionAnchors(rules.excerpts, row_anchors(batch, content, rules.excerpts), evidences) \
            if rules.excerpts.sampling else None
        self.first = _FirstPages(self, rekeys, provisional_pages) if content is not None else None
        self.kept_upto = 0  # the items before it are decided (``keep_alone``)
        self._alone_context: Optional[tuple] = None
        n = len(batch.contents)  # each row's outcome on the quick path (``quick_rows``): kept alone by default
        self.quick_counts: list[int] = [0] * n
        self.quick_matches: list[Optional[int]] = [None] * n
        self.quick_similarities: list[Optional[float]] = [None] * n
        self.quick_twins: list[Optional[tuple]] = [None] * n  # (cluster, its id, twin, its id): an exact copy
        self._untouched: Optional[np.ndarray] = None
        self._apart: Optional[np.ndarray] = None
        self._leading: Optional[np.ndarray] = None  # ``_leading_noted``
        self._contents: dict[int, tuple] = {}  # serial -> its content as last made (``batch_content``)
        self._leading_items: Optional[list[int]] = None  # the items of ``_rows_leading``, in order (``keep_alone``)

    def record(self, serial: int) -> DocRecord:
        record, row = self.records[serial]
        if record is None:  # kept at once, and not the caller's: made now that a later document names it
            record = self._new_cluster(self._unwanted.pop(serial), row, serial)
            self.records[serial] = (record, row)
        return record

    def _take(self, record: Optional[DocRecord], row: int) -> int:
        """The next serial, for ``record`` of row ``row`` (None: not made, yet)."""
        serial = self.next_serial
        self.records[serial] = (record, row)
        self.next_serial += 1
        return serial

    def own_content(self, row: int) -> np.ndarray:
        return self.batch.shingles.of(row) if self.content is None else self.content.shingles[row]

    def batch_content(self, serial: int) -> np.ndarray:
        """A kept document of this batch's content as the templates stand now."""
        shingles = self.batch.shingles.of(self.records[serial][1])
        if self.content is None:
            return shingles
        return self.content.content_of_stored(shingles, self.record(serial).site, self._contents, serial)

    def pair_with_batch(self, row: int, own: np.ndarray, serial: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s content ``own`` and this batch's kept document ``serial``'s, as the pair is verified
        (``BatchContent.pair_contents``)."""
        other = self.batch_content(serial)
        if self.content is None:
            return own, other
        return self.content.pair_contents(own, self.sites[row], other, self.record(serial).site)

    def templates_at(self, row: int) -> None:
        """The templates as they stand at ``row``; learning sites changing there have their first pages rekeyed."""
        content = self.content
        content.timeline.at(row)
        for site in content.settles.get(row, ()):
            self.first.rekey(site, row, row not in content.provisional)

    def decide(self, doc, row: int, wanted: bool = True) -> Optional[Decision]:
        batch = self.batch
        ident, content = batch.id_keys[row], batch.contents[row]
        if self._alone(row, ident, content):  # most documents: new, and nothing to compare them with
            return self._kept(doc, row, self.next_serial, ident, content, self.sites[row], wanted)
        replayed = self._replayed(row, ident, content, doc.id)
        if replayed is not None:  # a replay looks no band key up
            self.unprobed_rows.add(row)
            return replayed
        serial = self.next_serial
        site = self.sites[row]
        twin = self._twin(row, content)
        if twin is not None and twin.cluster and self._matchable(twin.cluster):  # cluster 0: dissolved by forget
            self.unprobed_rows.add(row)  # an exact copy looks no band key up
            return self._insert(DocRecord.exact_copy_of(twin, serial, doc, content, self.now, site), ident, row,
                                wanted, probed=False)
        match, similarity, candidates, verified = self._best_match(row)
        if match is not None:
            record = DocRecord.near_duplicate(match, self._representative_id(match), similarity, serial, doc,
                                              content, self.now, site)
            return self._insert(record, ident, row, wanted, candidates, verified)
        found = self._anchored_match(self.own_content(row), row) if self.anchors is not None else None
        if found is not None:
            source, similarity, share, checked = found
            record = DocRecord.near_duplicate(source, self._representative_id(source), similarity, serial, doc,
                                              content, self.now, site, share)
            return self._insert(record, ident, row, wanted, candidates, verified + checked)
        return self._kept(doc, row, serial, ident, content, site, wanted, candidates, verified)

    def _anchored_match(self, own: np.ndarray, row: int) -> Optional[tuple[int, float, Optional[float], int]]:
        """The kept document the anchors find for row ``row`` (``decide._anchored_match``): (serial, Jaccard,
        containment or None); stored ones by their shard's figures."""
        settings = self.rules.excerpts
        anchors = len(self.anchors.anchors(row))
        if len(own) < settings.min_shingles or anchors == 0:
            return None
        anchors = excerpt_anchors(self.content, row, anchors, settings)
        serials, shared = self.anchors.holders(row, need_of(anchors, settings.anchor_share))
        if len(serials) == 0:
            return None
        near: Optional[tuple[int, float]] = None
        part: Optional[tuple[int, float, float]] = None
        sources = likely_sources(serials, shared, anchors, settings.anchor_share, settings.max_sources)
        for serial in sources:
            if not self._matchable(serial):
                continue
            if serial >= self.first_serial:
                compared, whole = self.pair_with_batch(row, own, serial)
                similarity = pair_similarity(self.content, row, compared, whole)
                share = pair_containment(self.content, row, compared, whole, settings,
                                         self.record(serial).site != self.sites[row])
            else:
                similarity, share = self.sources[(row, serial)]
            if similarity >= self.rules.threshold:
                if near is None or (similarity, -serial) > (near[1], -near[0]):
                    near = (serial, similarity)
                continue
            if share >= settings.containment and (part is None or (share, -serial) > (part[1], -part[0])):
                part = (serial, share, similarity)
        if near is not None:
            return near[0], near[1], None, len(sources)
        if part is not None:
            return part[0], part[2], part[1], len(sources)
        return None

    def alone_rows(self) -> np.ndarray:
        """Which rows are surely kept, and need nothing of the batch's state but their number (most rows):
        ``_alone`` for the whole batch at once, without the rows whose keeping touches more (first pages of
        learning sites, and every row once a site may have rekeyed its pages)."""
        n = len(self.batch.contents)
        alone = self.strong_counts == 0
        if self.anchors is not None:
            alone[:] = False
        alone &= self._rows_untouched()
        return alone[:n]

    def _rows_untouched(self) -> np.ndarray:
        """The rows no other row of the batch touches: no replay or twin, sharing no band key, id or content
        with another row, and whose keeping touches no site template."""
        if self._untouched is None:
            n = len(self.batch.contents)
            self._untouched = self._rows_apart() & ~_rows_in(self.twins, n) & ~_rows_in(self.shared_within, n)
        return self._untouched

    def _rows_apart(self) -> np.ndarray:
        """``_rows_untouched``, twins or not, sharing band keys or not."""
        if self._apart is None:
            apart = ~_rows_in(self.replays, len(self.batch.contents))
            apart &= ~self._rows_templates_touch() & self.alike_ids.first_of_each()
            self._apart = apart & self.alike_contents.first_of_each()
        return self._apart

    def _rows_leading(self) -> np.ndarray:
        """The rows sharing band slots with later rows of the batch only (``following``): no candidate of the
        batch is filed under their slots before them, so ``decide`` finds their stored ones alone, as for
        ``_rows_untouched``; kept (or with ``lsh.cap = "probes"``, whatever they are) they file those slots
        (``file_prober``) before the later rows look them up."""
        n = len(self.batch.contents)
        if self.following is None or not len(self.shared_within):
            return np.zeros(n, dtype=bool)
        shared = _rows_in(self.shared_within, n)
        return shared & ~self.following & self._rows_apart() & ~_rows_in(self.twins, n)

    def _rows_twinned(self) -> np.ndarray:
        """The rows ``decide`` makes exact copies of a stored document at once (its twin step): a stored twin
        whose cluster is not dissolved, and nothing else (``_rows_apart``); the batch has no excerpts or
        candidates gathered elsewhere, and nothing past retention."""
        n = len(self.batch.contents)
        if not self.twins or self.anchors is not None or self.gathered is not None or self.unmatchable:
            return np.zeros(n, dtype=bool)
        shared = _rows_in(self.shared_within, n)
        return _rows_in([row for row, twin in self.twins.items() if twin[1]], n) & self._rows_apart() & ~shared

    def quick_rows(self, alone: np.ndarray) -> np.ndarray:
        """The rows the quick path decides (``keep_alone``): those surely kept (``alone``), the exact copies of a
        stored twin (``_twins_noted``), and those decided by the stored candidates' similarities alone
        (``_rows_by_stored``), whose outcomes it notes: how many
        candidates, the best match at or above the threshold (ties: the earliest) and its Jaccard, as
        ``_best_match`` finds them."""
        strong = self.strong
        counts = self.strong_counts
        alone = alone | self._twins_noted() | (self._leading_noted() & (counts == 0))
        by_stored = self._rows_by_stored()
        if not by_stored.any():
            return alone
        for row, count in zip(np.flatnonzero(by_stored).tolist(), counts[by_stored].tolist()):
            self.quick_counts[row] = count
        similarity = self.similarity  # (row, serial) -> Jaccard of the stored candidates verified
        if similarity:
            pairs = np.fromiter(chain.from_iterable(similarity), dtype=np.int64,
                                count=2 * len(similarity)).reshape(len(similarity), 2)
            values = np.fromiter(similarity.values(), dtype=np.float64, count=len(similarity))
            listed = (np.repeat(np.arange(len(counts), dtype=np.int64), counts) << 40) | strong.serials  # sorted
            asked = (pairs[:, 0] << 40) | pairs[:, 1]
            at = np.minimum(np.searchsorted(listed, asked), max(len(listed) - 1, 0))
            take = by_stored[pairs[:, 0]] & (values >= self.rules.threshold) & (listed[at] == asked)
            rows, serials, values = pairs[take, 0], pairs[take, 1], values[take]
            order = np.lexsort((serials, -values, rows))  # by row, the most similar first, then the earliest
            rows, serials = rows[order], serials[order]
            best = np.ones(len(rows), dtype=bool)
            best[1:] = rows[1:] != rows[:-1]
            for row, serial in zip(rows[best].tolist(), serials[best].tolist()):
                self.quick_matches[row] = serial
                self.quick_similarities[row] = similarity[(row, serial)]
        return alone | by_stored

    def _leading_noted(self) -> np.ndarray:
        """``_rows_leading`` on the quick path when ``_rows_by_stored`` would take them but for the slots they
        share (at most ``max_candidates`` stored candidates, none gathered elsewhere...), their items noted
        for the filing after them (``keep_alone``)."""
        if self.anchors is not None or self.gathered is not None or self.unmatchable or self.unkept:
            self._leading = np.zeros(len(self.batch.contents), dtype=bool)
        else:
            counts = self.strong_counts
            self._leading = self._rows_leading() & (counts <= self.rules.max_candidates)
        row = np.asarray(self.batch.row, dtype=np.int64)
        documents = row >= 0
        items = np.zeros(len(row), dtype=bool)
        items[documents] = self._leading[row[documents]]
        self._leading_items = np.flatnonzero(items).tolist()
        return self._leading

    def _twins_noted(self) -> np.ndarray:
        """``_rows_twinned``, each with its twin's cluster and ids noted for the quick path (``decided_quick``);
        none of them looks a band key up (``_places_taken``)."""
        twinned = self._rows_twinned()
        rows = np.flatnonzero(twinned).tolist()
        for row in rows:
            serial, cluster, cluster_id, doc_id = self.twins[row]
            self.quick_twins[row] = (cluster, cluster_id, serial, doc_id)
        self.unprobed_rows.update(rows)
        return twinned

    def _rows_by_stored(self) -> np.ndarray:
        """The rows whose decision the stored candidates' similarities make alone: they share ``min_shared``
        bands with at most ``max_candidates`` stored documents, all proposed and verified by the evidence, and
        no other row touches them (``_rows_untouched``: with site templates, rows before the first where a
        site settles, and not a learning site's first page); the batch has no excerpts or candidates gathered
        elsewhere, no entry that proposes nothing and none past retention. ``decide`` takes such a row's
        candidates as listed (``_best_match``: no page is rekeyed before it), and keeps it or makes it a near
        duplicate of the most similar, filing nothing else."""
        counts = self.strong_counts
        if self.anchors is not None or self.gathered is not None or self.unmatchable or self.unkept:
            return np.zeros(len(counts), dtype=bool)
        leading = self._leading if self._leading is not None else False
        return (counts > 0) & (counts <= self.rules.max_candidates) & (self._rows_untouched() | leading)

    def _rows_templates_touch(self) -> np.ndarray:
        """The rows whose keeping touches the site templates: learning sites' first pages, and every row from
        where a site settles (it may rekey first pages)."""
        touched = np.zeros(len(self.batch.contents), dtype=bool)
        if self.content is not None:
            if self.content.provisional:
                touched[list(self.content.provisional)] = True
            if self.content.settles:
                touched[min(self.content.settles):] = True
        return touched

    def keep_alone(self, decisions: list, stop: int) -> None:
        """The items from ``kept_upto`` to ``stop``, documents of ``quick_rows``, decided (``decided_quick``); in
        one kernel call when there is one (``_kernel.kept_alone``: the same records, decisions and filing)."""
        start, self.kept_upto = self.kept_upto, stop + 1
        if start >= stop:
            return
        if _kernel is None:
            items, rows = self.batch.items, self.batch.row
            for i in range(start, stop):
                decisions[i] = self.decided_quick(items[i], rows[i])
            return
        if self._alone_context is None:
            self._alone_context = self.alone_context(decisions)
        first = self.next_serial
        self.next_serial = _kernel.kept_alone(self._alone_context, start, stop, first)
        if self._leading_items:
            self._file_leading(start, stop, first)

    def _file_leading(self, start: int, stop: int, first: int) -> None:
        """The items of ``_rows_leading`` from ``start`` to ``stop`` (decided by the kernel as serials from
        ``first`` on) file their slots as ``_kept`` and ``_insert`` do."""
        items, rows = self._leading_items, self.batch.row
        for i in items[bisect_left(items, start):bisect_left(items, stop)]:
            serial, row = first + i - start, rows[i]
            kept = self.records[serial][0].kept
            if kept or self.probes:
                shared = self._filed_within(row)
                if shared:
                    file_prober(self.kept_by_key, shared, serial, kept, self.room, self.rules.max_candidates)

    def alone_context(self, decisions: list) -> tuple:
        """What ``_kernel.kept_alone`` reads and fills, in its order."""
        batch = self.batch
        rekeyed = {row: self.lookup_keys[row].astype(">u4").tobytes() for row in self.rekeyed_rows}
        return (batch.items, batch.row, batch.id_keys, batch.contents, self.sites, rekeyed, self.now, self.records,
                self.by_id, self.by_content, decisions, _RECORD_SETTERS, _DECISION_SETTERS, KEPT, self.quick_matches,
                self.quick_similarities, self.quick_counts, self.names, DUPLICATE, self.quick_twins, Source)

    def decided_quick(self, doc, row: int) -> Decision:
        """Row ``row``, one of ``quick_rows``, decided as ``decide`` decides it: an exact copy of its stored twin,
        kept alone, or by its stored candidates' outcome (``quick_rows``), a near duplicate of its best match or
        kept."""
        batch = self.batch
        if self.quick_twins[row] is not None:
            content = batch.contents[row]
            record = DocRecord.exact_copy_of(self._twin(row, content), self.next_serial, doc, content, self.now,
                                             self.sites[row])
            return self._insert(record, batch.id_keys[row], row, True, probed=False)
        count = self.quick_counts[row]
        if count == 0 and row not in self.shared_within:
            return self.kept_alone(doc, row)
        serial, site, match = self.next_serial, self.sites[row], self.quick_matches[row]
        ident, content = batch.id_keys[row], batch.contents[row]
        if match is None:
            return self._kept(doc, row, serial, ident, content, site, True, count, count)
        record = DocRecord.near_duplicate(match, self.names[match], self.quick_similarities[row], serial, doc,
                                          content, self.now, site)
        return self._insert(record, ident, row, True, count, count)

    def kept_alone(self, doc, row: int) -> Decision:
        """Row ``row``, one of ``alone_rows``, kept as the next serial: what ``decide`` makes of it (``_alone``,
        then ``_kept``, which for such a row files no key, no first page and no anchor), in fewer steps."""
        serial = self.next_serial
        self.next_serial = serial + 1
        keys = self.lookup_keys[row].astype(">u4").tobytes() if row in self.rekeyed_rows else b""
        batch = self.batch
        content = batch.contents[row]
        self.records[serial] = (DocRecord.new_cluster(serial, doc, content, keys, self.now, self.sites[row]), row)
        self.by_id.setdefault(batch.id_keys[row], []).append(serial)
        self.by_content.setdefault(content, serial)
        return Decision(doc.id, KEPT, doc.id, None, None, None, False, False, 0, 0, None)  # ``_as_decision``'s

    def keep_alone_at(self, decisions: list, i: int, serial: int) -> None:
        """Item ``i``, a document of ``alone_rows``, kept as ``serial`` (``kept_alone``), in the kernel when there
        is one: with ``gathered`` the rows' serials are the caller's, not consecutive, so one item a call."""
        if _kernel is None:
            self.next_serial = serial
            decisions[i] = self.kept_alone(self.batch.items[i], self.batch.row[i])
            return
        if self._alone_context is None:
            self._alone_context = self.alone_context(decisions)
        self.next_serial = _kernel.kept_alone(self._alone_context, i, i + 1, serial)

    def kept_unwanted(self, doc, row: int) -> None:
        """Row ``row``, one of ``alone_rows``, kept as the next serial without a decision or record (made if a
        later document names it)."""
        serial = self._take(None, row)
        self._unwanted[serial] = doc
        self.by_id[self.batch.id_keys[row]] = [serial]
        self.by_content[self.batch.contents[row]] = serial

    def _alone(self, row: int, ident: bytes, content: bytes) -> bool:
        """Whether row ``row`` is surely kept without a look at anything (``decide._alone``): no shard knows
        its id or content, nor holds a document sharing a band key, no earlier row shares one either."""
        bounds = self.strong.bounds
        return (self.anchors is None and bounds[row] == bounds[row + 1] and row not in self.shared_within and row not in self.replays
                and row not in self.twins and ident not in self.by_id and content not in self.by_content
                and (self.first is None or not self.first.rekeyed))

    def _filed_within(self, row: int) -> list:
        """The row's band slots another row of the batch looks up, that the row files (``file_prober``): not those
        of its own text, which are looked up only (``evidence.probe_slots``)."""
        shared = self.shared_within.get(row, ())  # most rows share no key with a later one
        if not shared or own_keys_of(self.content, row) is None:
            return shared
        keys = self.lookup_keys[row].astype(np.uint64)
        filed = set(band_slots(np.arange(len(keys), dtype=np.uint64), keys).tolist())
        return [slot for slot in shared if slot in filed]

    def _kept(self, doc, row: int, serial: int, ident: bytes, content: bytes, site: int,
              wanted: bool = True, candidates: int = 0, verified: int = 0) -> Optional[Decision]:
        shared = self._filed_within(row)
        if shared:
            file_prober(self.kept_by_key, shared, serial, True, self.room, self.rules.max_candidates)
        if self.content is not None and row in self.content.provisional:
            self.first.kept(site, serial)
        if self.anchors is not None:
            self.anchors.kept(row, serial)
        if wanted:
            return self._insert(self._new_cluster(doc, row, serial), ident, row, True, candidates, verified)
        self._unwanted[self._take(None, row)] = doc
        self.by_id.setdefault(ident, []).append(serial)
        self.by_content.setdefault(content, serial)
        return None

    def _new_cluster(self, doc, row: int, serial: int) -> DocRecord:
        keys = self.lookup_keys[row].astype(">u4").tobytes() if row in self.rekeyed_rows else b""
        return DocRecord.new_cluster(serial, doc, self.batch.contents[row], keys, self.now, self.sites[row])

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

    def _representative_id(self, serial: int) -> str:
        """The id of the kept document ``serial``, of this batch or stored."""
        return self.record(serial).id if serial >= self.first_serial else self.names[serial]

    def _best_match(self, row: int) -> tuple[Optional[int], Optional[float], int, int]:
        """The most similar candidate at or above the threshold (ties: the earliest) and its Jaccard, how many
        candidates the row has and how many it verifies (step c above); stored ones by their index's Jaccard,
        and with ``gathered`` the batch's own too."""
        rules = self.rules
        rekeyed = self.first is not None and self.first.rekeyed  # pages that may add a band to a weak hit
        serials, shared = (self.hits if rekeyed else self.strong).listed(row)
        within = self.shared_within.get(row, ())
        proposed = self._proposed if self.unmatchable or self.unkept or self.gathered is not None else None
        if not rekeyed and not within and proposed is None and len(serials) <= rules.max_candidates:
            chosen, candidates = serials, len(serials)  # ``chosen_candidates``' answer: strong hits, ascending
        else:
            extra = [serial for key in within for serial in self.kept_by_key.get(key, ())]
            if rekeyed:
                extra += self.first.candidates(self.lookup_keys[row], own_keys_of(self.content, row))
            chosen, candidates = chosen_candidates(serials, shared, extra, rules.signing.min_shared, proposed,
                                                   rules.max_candidates)
        best, best_similarity = None, -1.0
        own = self.own_content(row) if self.gathered is None else None
        for serial in chosen:
            if own is not None and serial >= self.first_serial:
                similarity = pair_similarity(self.content, row, *self.pair_with_batch(row, own, serial))
            else:
                similarity = self.similarity.get((row, serial), -1.0)
            if similarity >= rules.threshold and (
                    similarity > best_similarity or (similarity == best_similarity and serial < best)):
                best, best_similarity = serial, similarity
        return best, (best_similarity if best is not None else None), candidates, len(chosen)

    def _proposed(self, serial: int) -> bool:
        """Whether an entry is a candidate: a kept document (a duplicate's entry only holds its place), still
        matchable. Entries of the batch's own rows are there only with ``gathered`` (places, not proposals)."""
        if serial >= self.first_serial:
            record = self.records[serial][0]
            return record is None or record.kept  # None: kept, its record not made yet
        return serial not in self.unkept and serial not in self.unmatchable

    def _matchable(self, representative: int) -> bool:
        """Whether the kept document ``representative`` may still be matched (retention: see ``decide``)."""
        return representative not in self.unmatchable

    def _insert(self, record: DocRecord, ident: bytes, row: int, wanted: bool = True, candidates: int = 0,
                verified: int = 0, probed: bool = True) -> Optional[Decision]:
        self._take(record, row)
        self.by_id.setdefault(ident, []).append(record.serial)
        self.by_content.setdefault(record.content, record.serial)
        if probed and self.probes and not record.kept:
            shared = self._filed_within(row)
            if shared:
                file_prober(self.kept_by_key, shared, record.serial, False, self.room, self.rules.max_candidates)
        return _as_decision(record, False, candidates, verified) if wanted else None


def _places_taken(state: "_State", asked: np.ndarray, rows: np.ndarray, bands: np.ndarray, shape: tuple,
                  found_keys: np.ndarray) -> np.ndarray:
    """Rows x bands: the band keys where each row takes a place (``candidates.filed_places``): with ``lsh.cap``
    "probes", every row but replays and exact copies, while places are left; with "kept" none is asked for (a
    kept document files all its keys, a duplicate none)."""
    if not state.probes:
        return np.zeros(shape, dtype=bool)
    probers = np.ones(shape[0], dtype=bool)
    if state.unprobed_rows:
        probers[list(state.unprobed_rows)] = False
    return filed_places(asked, rows, bands, shape, probers, found_keys, state.rules.max_candidates)


class _Alike:
    """A batch's hashes (ids or contents) sorted once by their first 8 bytes (``_heads``; two hashes alike
    there count as equal, which only costs a closer look): the first of each kind."""

    def __init__(self, values: list[bytes], width: int):
        heads = _heads(values, width)
        self._order = np.argsort(heads, kind="stable")  # equal hashes in row order
        ordered = heads[self._order]
        self._later = self._order[1:][ordered[1:] == ordered[:-1]]

    def first_of_each(self) -> np.ndarray:
        first = np.ones(len(self._order), dtype=bool)
        first[self._later] = False
        return first



def _heads(values: list[bytes], width: int) -> np.ndarray:
    """The first 8 bytes of each hash (all ``width`` bytes long, normally) as a number."""
    joined = b"".join(values)
    if len(joined) == width * len(values) and width % 8 == 0:
        return np.frombuffer(joined, dtype=np.uint64)[::width // 8]
    return np.array([int.from_bytes(value[:8].ljust(8, b"\0"), "little") for value in values], dtype=np.uint64)


class _UnionAnchors(BatchAnchors):
    """``store.anchors.BatchAnchors`` over every shard's postings: the earliest ``max_postings`` of each anchor."""

    def __init__(self, settings: ExcerptSettings, anchors: list, evidences: list[Evidence]):
        keys = np.concatenate([e.anchor_keys for e in evidences])
        serials = np.concatenate([e.anchor_serials for e in evidences])
        self._union = earliest_of_each_key(keys, serials, settings.max_postings) if len(keys) else (keys, serials)
        super().__init__(None, settings.max_postings, anchors)

    def _fetched(self, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._union


class _FirstPages:
    """A batch's kept pages of learning sites, looked up again by their content once their site settles.

    A page kept while its site was learning is in the band tables under
    what was known then (for a site's first page: its whole text, template
    included). Each time the learning site's template changes, at that very
    page, each such page gets band keys of its content under the template
    as it now stands (table ``rekeyed``, replacing the earlier ones), seen
    from that document on, in this batch too; once the site settles they
    keep their last keys. Stored first pages are rekeyed by the index
    holding them (evidence ``rekeys``, ``evidence.OwnFirstPages``), the
    batch's own here.
    """

    def __init__(self, state: _State, rekeys: dict, provisional_pages: Callable[[int], list[int]]):
        self.state = state
        self.rekeys = rekeys
        self.provisional_pages = provisional_pages
        self.pages: dict[int, list[int]] = {}  # site -> first pages (as this batch left them)
        self._keys = RekeyedKeys()  # serial -> its keys rekeyed in this batch
        self.rekeyed_here: dict[int, np.ndarray] = {}  # the same, of the batch's own pages (their shards write them)

    def _of(self, site: int) -> list[int]:
        pages = self.pages.get(site)
        if pages is None:
            pages = self.pages[site] = list(self.provisional_pages(site))
        return pages

    def kept(self, site: int, serial: int) -> None:
        self._of(site).append(serial)

    def rekey(self, site: int, row: int, settled: bool) -> None:
        first_serial = self.state.first_serial
        pages = [serial for serial in self._of(site) if serial >= first_serial or (row, serial) in self.rekeys]
        self.pages[site] = [] if settled else list(pages)
        here = [serial for serial in pages if serial >= first_serial]
        for serial in pages:
            if serial < first_serial:
                self._keys[serial] = np.array(self.rekeys[(row, serial)], dtype=np.uint64)
        if here:
            keys = band_keys_of([self.state.batch_content(serial) for serial in here], self.state.rules.signing)
            for serial, serial_keys in zip(here, keys):
                self._keys[serial] = self.rekeyed_here[serial] = serial_keys

    @property
    def rekeyed(self) -> bool:
        return bool(self._keys)

    def candidates(self, keys: np.ndarray, also: Optional[np.ndarray] = None) -> list[int]:
        """Pages rekeyed in this batch, once per band whose key they share with ``keys`` (or ``also``)."""
        return self._keys.candidates(keys, also)


def _setters(cls: type, names: tuple[str, ...]) -> tuple:
    """``_kernel.slotted``'s setters of a slots dataclass whose fields are ``names``, in that order (the order
    the kernel gives their values in)."""
    if tuple(f.name for f in fields(cls)) != names:
        raise TypeError(f"{cls.__name__}'s fields are not the ones the kernel fills")
    return (cls, *(cls.__dict__[name] for name in names))


_RECORD_SETTERS = _setters(DocRecord, ("serial", "id", "kept", "cluster", "cluster_id", "matched", "matched_id",
                                       "similarity", "exact", "content", "source", "band_keys", "time", "expired",
                                       "site", "containment"))
_DECISION_SETTERS = _setters(Decision, ("id", "status", "cluster", "matched", "similarity", "reason", "exact",
                                        "replayed", "candidates", "verified", "containment"))


def _as_decision(record: DocRecord, replayed: bool = False, candidates: int = 0, verified: int = 0) -> Decision:
    # positional (id, status, cluster, matched, similarity, reason, exact, replayed, candidates, verified):
    # one per document, and keywords cost twice as much
    status = KEPT if record.kept else DUPLICATE
    if _kernel is not None:  # one per document: made through its slots (``_kernel.slotted``), the same decision
        return _kernel.slotted(_DECISION_SETTERS, record.id, status, record.cluster_id, record.matched_id,
                               record.similarity, None, record.exact, replayed, candidates, verified,
                               record.containment)
    return Decision(record.id, status, record.cluster_id, record.matched_id, record.similarity, None, record.exact,
                    replayed, candidates, verified, record.containment)
