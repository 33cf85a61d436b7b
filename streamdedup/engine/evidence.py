"""What an index says about each document of a batch: the evidence ``decide.decide_together`` decides on.

A single worker gathers it from its index inside the batch's write
transaction. A deployment whose band tables are split by key gathers the
same answers from its vshards (``engine.vshards``): ``Evidence`` for what
they know of stored documents, ``Gathered`` for each row's candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.excerpts import anchors_of, containment, need_of
from ..core.lsh import sorted_slots
from ..core.prepare import PreparedBatch
from ..core.signing import band_keys_of
from ..core.templates import EMPTY, contents_of
from ..core.verify import all_code_together, codes_together, jaccard, jaccard_coded, jaccards, jaccards_coded
from ..store.anchors import BatchAnchors
from ..store.bands import BandTables
from ..store.hashed import serials_of_many
from ..store.index import DocRecord, IndexTxn, damaged_shingles
from ..store.candidates import Hits, RekeyedKeys, earliest_of_runs, with_extra_candidates
from ..store.mirror import RecentMirror
from ..store.view import first_documents
from ..store.sites import provisional_pages, write_rekeyed_many
from .settings import ExcerptSettings
from .sitelearning import BatchContent

__all__ = ["Evidence", "Gathered", "Asking", "content_evidence", "band_evidence", "rows_settled", "OwnFirstPages",
           "slots_looked_up",
           "row_anchors", "row_items", "replay_of", "twin_of", "probe_slots", "own_keys_of",
           "pair_similarity", "pair_containment", "excerpt_anchors"]

_NO_ANCHORS = np.zeros(0, dtype=np.uint64)


@dataclass
class Evidence:
    """One index's answers for one batch (rows are the batch's document rows).

    ``replays``: row -> the earlier decision of that very document (same id,
    same content), as (id, kept, cluster id, matched id, similarity, exact,
    containment); only the owner of the id answers. ``twins``: row -> the
    first stored document with the same content, as (serial, cluster serial,
    cluster id, id). ``found_keys``/``found_serials``: the stored (band slot,
    serial) entries under the batch's band keys, the earliest
    ``max_candidates`` of each key (a duplicate's entry holds a place and
    proposes nothing: ``unkept`` names those among the candidates verified
    here). ``matches``: (row, serial, Jaccard) of
    every candidate at or above the threshold, and ``names`` their ids.
    ``rekeys``: (row, serial, band keys) of the index's first pages rekeyed at
    that row (site templates). ``unmatchable``: the kept documents among
    them, and among the first round's twins' representatives, past
    retention. Excerpts: ``anchor_keys``/``anchor_serials``, the stored
    (anchor, serial) postings under the batch's anchors, and ``sources``,
    (row, serial, Jaccard, containment) of every document holding enough of
    a row's anchors. Round one fills the first two, round two the rest.
    """

    replays: dict = field(default_factory=dict)
    twins: dict = field(default_factory=dict)
    found_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    found_serials: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    matches: list = field(default_factory=list)
    names: dict = field(default_factory=dict)
    rekeys: list = field(default_factory=list)
    unmatchable: list = field(default_factory=list)
    anchor_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    anchor_serials: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sources: list = field(default_factory=list)
    unkept: list = field(default_factory=list)
    hits: Optional[tuple] = field(default=None, repr=False, compare=False)  # (asked, per key, Hits) of found_*

    def hits_of(self, asked: np.ndarray, per_key: int) -> Optional[Hits]:
        """``Hits.found`` of this evidence's found entries under ``asked`` (the batch's sorted slots), if
        ``band_evidence`` made it already for the same keys and cap (else None)."""
        made = self.hits
        return made[2] if made is not None and made[0] is asked and made[1] == per_key else None


@dataclass
class Gathered:
    """A batch's candidates gathered outside it, for ``decide.decide_together``: by a deployment whose band
    tables are split by key (``engine.vshards``), where no process holds the batch's shingles and keys.

    ``hits``: each row's candidates, the holders of places before it under
    its band keys (stored documents and earlier rows of the batch alike, as
    the keys' owners answered: ``lsh.cap = "probes"``) and how many bands
    each shares with it; ``serial_of``: the serial each row takes (a replay
    takes none: its number is never read). The similarities of the batch's
    own candidates come as ``Evidence.matches``, like the stored ones'.
    """

    hits: Hits
    serial_of: list[int]


def row_items(batch: PreparedBatch) -> np.ndarray:
    """The item of each row of the batch (its place in ``batch.items``)."""
    return np.flatnonzero(np.asarray(batch.row, dtype=np.int64) >= 0)


def content_evidence(txn: IndexTxn, mirror: RecentMirror, batch: PreparedBatch, hash_filter=None) -> Evidence:
    """Round one: replays and twins (what site templates must know before any band key is looked up);
    ``hash_filter``: the writer's filter of the id and content tables' hashes (``hashed``)."""
    records = _RecordCache(txn)
    return Evidence(replays=_replays(txn, mirror, batch, records.get, hash_filter),
                    twins=_twins(txn, mirror, batch.contents, records.get, hash_filter))


@dataclass(frozen=True)
class Asking:
    """What the second-round lookups need besides the batch."""

    threshold: float
    max_candidates: int
    min_shared: int
    cutoff: Optional[float] = None  # retention: kept documents decided before it match nothing
    representatives: frozenset = frozenset()  # of the first round's twins (retention asks after them)
    excerpts: Optional[ExcerptSettings] = None
    settled: frozenset = frozenset()  # rows the first round decides (``rows_settled``): nothing to verify


def pair_similarity(content: Optional[BatchContent], row: int, own: np.ndarray, other: np.ndarray) -> float:
    """The Jaccard of row ``row`` and a candidate, ``own`` and ``other`` their contents as their pair is compared
    (``BatchContent.pair_contents``), or, for a row with an own text (``BatchContent.own_texts``), that of its
    own text and ``other`` if higher: a short body in a host page whose navigation, on other pages of its
    site, is several times its size is a near duplicate of its source by its own text alone."""
    similarity = jaccard(own, other)
    text = None if content is None else content.own_texts.get(row)
    return similarity if text is None else max(similarity, jaccard(text, other))


def pair_similarities(content: Optional[BatchContent], rows: list[int], owns: list[np.ndarray],
                      others: list[np.ndarray]) -> list[float]:
    """``pair_similarity`` of each pair (``rows[p]``, ``owns[p]``, ``others[p]``), the same values: a batch's
    templated pairs gathered and compared at once (``verify.jaccards``: one kernel call for the pairs, one for
    the own texts of the rows that have one)."""
    similarities = jaccards(owns, others).tolist()
    texts = {} if content is None else content.own_texts
    with_text = [p for p, row in enumerate(rows) if texts.get(row) is not None] if texts else []
    if with_text:
        by_text = jaccards([texts[rows[p]] for p in with_text], [others[p] for p in with_text]).tolist()
        for p, similarity in zip(with_text, by_text):
            similarities[p] = max(similarities[p], similarity)
    return similarities


def excerpt_text(content: Optional[BatchContent], row: int, settings: ExcerptSettings) -> Optional[np.ndarray]:
    """Row ``row``'s content without the text its site repeats in its short lines (``BatchContent.excerpt_texts``),
    if it has one of at least ``excerpts.min_shingles``."""
    text = None if content is None else content.excerpt_texts.get(row)
    return text if text is not None and len(text) >= settings.min_shingles else None


def pair_containment(content: Optional[BatchContent], row: int, own: np.ndarray, other: np.ndarray,
                     settings: ExcerptSettings, other_site: bool) -> float:
    """The containment of row ``row`` in a candidate, ``own`` and ``other`` their contents as their pair is
    compared, or, for a row with an ``excerpt_text`` and a candidate of another site (``other_site``), that of
    the text in ``other`` if higher: an excerpt in a host page keeps the host's navigation, which its source
    lacks (``templates.excerpt_text_of``). Pages of one site are compared as before: what a reference repeats
    in its short lines (a family's members) is body text to its own pages."""
    share = containment(own, other)
    text = excerpt_text(content, row, settings) if other_site else None
    return share if text is None else max(share, containment(text, other))


def excerpt_anchors(content: Optional[BatchContent], row: int, anchors: int, settings: ExcerptSettings) -> int:
    """How many anchors of row ``row`` a candidate source must hold half of (``excerpts.anchor_share``): its
    ``anchors``, or those of its ``excerpt_text`` when it has one (fewer: they are among them)."""
    text = excerpt_text(content, row, settings)
    return anchors if text is None else min(anchors, len(anchors_of(text, settings.sampling)))


def row_anchors(batch: PreparedBatch, content: Optional[BatchContent], settings: ExcerptSettings) -> list:
    """Each row's excerpt anchors (``decide._batch_anchors``): none for a row with too little content."""
    rows = range(len(batch.contents))
    shingles = content.shingles if content is not None else [batch.shingles.of(r) for r in rows]
    return [anchors_of(s, settings.sampling) if len(s) >= settings.min_shingles else _NO_ANCHORS for s in shingles]


def probe_slots(batch: PreparedBatch, lookup_keys: np.ndarray, content: Optional[BatchContent]) -> tuple:
    """The band slots a batch's rows look candidates up by, sorted, and the row of each: their lookup keys' and,
    with site templates, the keys of the own text of the rows that have one (``BatchContent.own_keys``),
    each slot of a row once (a candidate shares a band with a row when either key of the band is its).
    Only lookup keys are filed: ``batch.sorted_slots(lookup_keys)``."""
    asked, rows, _ = batch.sorted_slots(lookup_keys)
    if content is None or not content.own_keys:
        return asked, rows
    if content.probe is None or content.probe[0] is not lookup_keys:
        own_rows = np.fromiter(content.own_keys, dtype=np.int64, count=len(content.own_keys))
        own_slots, at, _ = sorted_slots(np.stack(list(content.own_keys.values())))
        content.probe = (lookup_keys, *_slots_and_rows_merged(asked, rows, own_slots, own_rows[at]))
    return content.probe[1], content.probe[2]


def _slots_and_rows_merged(slots: np.ndarray, rows: np.ndarray, more_slots: np.ndarray,
                           more_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (slot, row) pairs of both, each once, sorted by slot then row: as one sort of machine words
    (``slot << bits | row``; two runs sorted already, which a stable sort merges in one pass) when they fit in
    64 bits, as they do (slots of 48 bits, rows of a few thousand), else by ``np.lexsort``."""
    slots, rows = np.concatenate((slots, more_slots)), np.concatenate((rows, more_rows))
    bits = max(1, int(rows.max(initial=0)).bit_length())
    if int(slots.max(initial=0)) >> (64 - bits) == 0 and int(rows.min(initial=0)) >= 0:
        keyed = (slots << np.uint64(bits)) | rows.astype(np.uint64)
        keyed.sort(kind="stable")
        keyed = keyed[np.concatenate(([True], keyed[1:] != keyed[:-1]))]
        return keyed >> np.uint64(bits), (keyed & np.uint64((1 << bits) - 1)).astype(np.int64)
    order = np.lexsort((rows, slots))
    slots, rows = slots[order], rows[order]
    first = np.concatenate(([True], (slots[1:] != slots[:-1]) | (rows[1:] != rows[:-1])))
    return slots[first], rows[first]


def own_keys_of(content: Optional[BatchContent], row: int) -> Optional[np.ndarray]:
    """The band keys of row ``row``'s own text, if it is looked up by them too (``probe_slots``)."""
    return None if content is None else content.own_keys.get(row)


def band_evidence(txn: IndexTxn, mirror: RecentMirror, bands: BandTables, batch: PreparedBatch,
                  lookup_keys: np.ndarray, content: Optional[BatchContent], first: Optional["OwnFirstPages"],
                  asking: Asking) -> Evidence:
    """Round two: the stored band entries under the batch's lookup keys and this index's matches.

    With site templates (``content``), a row's content and each candidate's
    are as the templates stand at that row, and ``first`` rekeys this
    index's first pages of sites that settle in the batch (as
    ``decide._FirstPages`` does), which makes them candidates of later rows.
    With retention (``asking.cutoff``), the index's kept documents among the
    candidates and the first round's twins' representatives decided before
    it are named unmatchable. With excerpts, the anchor postings it holds
    and the Jaccard and containment of every possible source it holds.
    """
    records = _RecordCache(txn)
    evidence = Evidence()
    asked, rows = probe_slots(batch, lookup_keys, content)
    runs = bands.lookup_runs(txn, mirror, slots_looked_up(asked, rows, asking, content))
    if asking.cutoff is not None:
        runs = [_unexpired(keys, serials, records, asking.cutoff) for keys, serials in runs if len(keys)]
    found_keys, found_serials = earliest_of_runs(runs, asking.max_candidates)
    if len(found_keys):
        evidence.found_keys, evidence.found_serials = found_keys, found_serials
    hits = Hits.found(asked, rows, len(batch.contents), found_keys, found_serials, asking.max_candidates)
    evidence.hits = (asked, asking.max_candidates, hits)  # the batch's decision asks for the same
    matches = _Matches(txn, records, batch, content, asking.threshold)
    sources = _Sources(txn, batch, content, asking.excerpts, evidence) if asking.excerpts else None
    timeline = content.timeline.rewound() if content is not None else None
    verified_by = None if timeline is None or _no_template(txn, timeline) else timeline
    strong = hits.at_least(asking.min_shared)
    strong_serials, strong_bounds = strong.serials.tolist(), strong.bounds
    to_verify = _rows_to_verify(hits, asking, content, sources is not None)
    if verified_by is None:  # candidates compared with their stored codings: read at once
        matches.read_codings(_serials_of_rows(strong_serials, strong_bounds, to_verify))
    if (verified_by is None and sources is None and (content is None or not content.settles)
            and (first is None or not first.rekeyed)
            and matches.verify_listed(to_verify, strong_serials, strong_bounds)):
        to_verify = []  # most batches: no row rekeys or takes another candidate, every row verified at once
    for row in to_verify:
        if timeline is not None:
            timeline.at(row)
            for site in content.settles.get(row, ()):
                evidence.rekeys += first.rekey(site, row, lambda serial: matches.stored_content(serial, timeline),
                                               row not in content.provisional)
        rekeyed = first is not None and first.rekeyed
        extra = first.candidates(lookup_keys[row], own_keys_of(content, row)) if rekeyed else None
        if extra:
            serials, shared = with_extra_candidates(*hits.of(row), extra)
            least = asking.min_shared
            matches.verify_row(row, [serial for serial, count in zip(serials.tolist(), shared.tolist())
                                     if count >= least], verified_by)
        else:  # most rows, none of the batch's rekeyed pages among them: the hits sharing ``min_shared`` bands,
            # listed once for the batch
            matches.verify_row(row, strong_serials[strong_bounds[row]:strong_bounds[row + 1]], verified_by)
        if sources is not None:
            sources.verify(row, matches, timeline)
    if first is not None:
        first.write()
    evidence.matches = matches.verified()
    evidence.unkept = sorted(matches.unkept)
    named = [serial for _, serial, _ in evidence.matches] + [serial for _, serial, _, _ in evidence.sources]
    evidence.names = records.ids_of(named)
    if asking.cutoff is not None:
        held = {serial for serial in found_serials.tolist() if serial not in matches.unkept and records.holds(serial)}
        held |= {serial for _, serial, _ in evidence.rekeys}
        held |= {serial for _, serial, _, _ in evidence.sources}
        held |= {serial for serial in asking.representatives if records.holds(serial)}
        evidence.unmatchable = sorted(s for s in held
                                      if records.get(s).expired or records.get(s).time < asking.cutoff)
    return evidence


def _no_template(txn: IndexTxn, timeline) -> bool:
    """Whether every site's template and the shared one are empty all through the batch: none committed (the
    table of templates holds none, this batch's writes included), none changing in it. Pairs are then verified
    on their whole shingles (``content_of`` leaves them whole), without reading a stored candidate's record
    for its site."""
    return (timeline.changes == 0 and len(timeline.shared) == 0
            and txn.txn.stat(txn.dbs["site_templates"])["entries"] == 0)


def _unexpired(keys: np.ndarray, serials: np.ndarray, records: "_RecordCache",
               cutoff: float) -> tuple[np.ndarray, np.ndarray]:
    """The (key, serial) entries found, without those of kept documents past retention.

    The retention sweep (``housekeeping.sweep_expired``) takes such entries
    out of the tables whenever it runs, which the clock decides; left in
    until then, they would count towards a key's ``max_candidates`` (its
    earliest kept documents, or its places), and a decision would depend on
    when the sweep last ran. Taken out here, sweeping changes nothing a look-up
    sees. A duplicate's places never expire (the sweep keeps them too).
    """
    gone = [serial for serial in set(serials.tolist()) if records.holds(serial) and _past(records.get(serial), cutoff)]
    if not gone:
        return keys, serials
    keep = ~np.isin(serials, np.array(gone, dtype=np.int64))
    return keys[keep], serials[keep]


def _past(record: DocRecord, cutoff: float) -> bool:
    """Whether a kept document is past retention: swept already, or decided before the cutoff."""
    return record.kept and (record.expired or record.time < cutoff)


def _rows_to_verify(hits: Hits, asking: Asking, content: Optional[BatchContent], every: bool) -> list[int]:
    """The rows ``band_evidence`` takes one by one, in order: those sharing ``min_shared`` bands with a stored
    document, and with site templates every row from the first where a site settles (first pages rekeyed
    there may add a band to any hit); ``every``: all rows."""
    n = len(hits.bounds) - 1
    if every:
        look = np.ones(n, dtype=bool)
    else:
        look = np.diff(np.asarray(hits.at_least(asking.min_shared).bounds)) > 0
    if content is not None and content.settles:  # rows a site settles at rekey pages, whatever the rows decide
        look[min(content.settles):] = True
    if asking.settled and (content is None or _settled_apart(asking, content)):
        look[list(asking.settled)] = False
    return np.flatnonzero(look).tolist()


def _settled_apart(asking: Asking, content: Optional[BatchContent]) -> bool:
    """Whether nothing the second round finds for the rows the first round settles (``Asking.settled``) reaches
    a decision: their decisions read no band key (``decide``: a replay, or an exact copy of its twin), and other
    rows read only their own slots' entries. Not so with retention (the entries found, all of them, name the
    documents past it: ``Evidence.unmatchable``) nor where a site settles (every row from there is verified,
    its hits counted with the pages rekeyed: ``_rows_to_verify``)."""
    return asking.cutoff is None and (content is None or not content.settles)


def slots_looked_up(asked: np.ndarray, rows: np.ndarray, asking: Asking,
                    content: Optional[BatchContent]) -> np.ndarray:
    """The batch's probed slots (``probe_slots``: sorted, ``rows`` the row of each) that the band lookups ask:
    without those only settled rows probe (``_settled_apart``), when that holds. Late in a 1M-document crawl an
    exact copy's 32 band keys nearly all reach the band table (its first copy is far back: 29% of the table's
    positionings at 900,000 in ``bench.offline``'s), and what they find decides nothing: a replay or an exact
    copy takes no place under a key (``decide._places_taken``) and is decided before any candidate is looked
    at. A slot another row probes too is asked as before, so that row's entries, counts and places are the
    same."""
    if not asking.settled or not _settled_apart(asking, content):
        return asked
    settled = np.fromiter(asking.settled, dtype=np.int64, count=len(asking.settled))
    unsettled = np.ones(max(int(rows.max(initial=-1)), int(settled.max())) + 1, dtype=bool)
    unsettled[settled] = False
    return asked[unsettled[rows]]


def _serials_of_rows(serials: list[int], bounds: list[int], rows: list[int]) -> list[int]:
    """The listed ``serials`` of these rows (``serials[bounds[row]:bounds[row + 1]]`` of each), all of them when
    every row is among them."""
    if len(rows) == len(bounds) - 1:
        return serials
    return [serial for row in rows for serial in serials[bounds[row]:bounds[row + 1]]]


def rows_settled(first_round: list[Evidence], retention: bool) -> frozenset:
    """The rows the first round's evidence decides without a band: replays, and, without retention (which
    may find a twin's cluster expired), copies of a content whose first document is still in a cluster."""
    rows = set()
    first: dict[int, list] = {}
    for evidence in first_round:
        rows.update(evidence.replays)
        for row, twin in evidence.twins.items():
            if row not in first or twin[0] < first[row][0]:
                first[row] = twin
    if not retention:
        rows.update(row for row, twin in first.items() if twin[1])
    return frozenset(rows)


class _Sources:
    """Excerpts: this index's anchor postings under the batch's anchors, and its possible sources verified."""

    def __init__(self, txn: IndexTxn, batch: PreparedBatch, content: Optional[BatchContent],
                 settings: ExcerptSettings, evidence: Evidence):
        self.settings = settings
        self.content = content  # a row's own text counts in its similarity (``pair_similarity``)
        self.evidence = evidence
        self.anchors = row_anchors(batch, content, settings)
        stored = BatchAnchors(txn, settings.max_postings, self.anchors)
        evidence.anchor_keys, evidence.anchor_serials = stored.postings()
        self.stored = stored

    def verify(self, row: int, matches: "_Matches", timeline) -> None:
        anchors = len(self.anchors[row])
        if anchors == 0:
            return
        need = need_of(excerpt_anchors(self.content, row, anchors, self.settings), self.settings.anchor_share)
        serials, shared = self.stored.holders(row, need)
        for serial, count in zip(serials.tolist(), shared.tolist()):
            if count < need:
                continue
            own, whole = matches.pair(row, serial, timeline)
            self.evidence.sources.append((row, serial, pair_similarity(self.content, row, own, whole),
                                          pair_containment(self.content, row, own, whole, self.settings,
                                                           matches.other_site(row, serial))))


class _RecordCache:
    def __init__(self, txn: IndexTxn):
        self.txn = txn
        self._records: dict[int, Optional[DocRecord]] = {}

    def get(self, serial: int) -> DocRecord:
        found = self._records.get(serial)
        if found is None:
            found = self._records[serial] = self.txn.record(serial)
        return found

    def id_of(self, serial: int) -> str:
        """``get(serial).id``, without unpacking a record not read yet (``IndexTxn.record_id``)."""
        found = self._records.get(serial)
        return found.id if found is not None else self.txn.record_id(serial)

    def ids_of(self, serials: list[int]) -> dict[int, str]:
        """``id_of`` of each of ``serials`` (in their order), those not read yet read in one pass
        (``IndexTxn.record_ids``)."""
        cached = self._records
        if not cached:  # most batches: no record read whole
            read = self.txn.record_ids(serials)
            return {serial: read[serial] for serial in serials}
        read = self.txn.record_ids([serial for serial in serials if cached.get(serial) is None])
        return {serial: read[serial] if cached.get(serial) is None else cached[serial].id for serial in serials}

    def holds(self, serial: int) -> bool:
        """Whether the index holds a record of ``serial`` (a duplicate's entry outlives its forgotten record)."""
        if serial in self._records:
            return True
        return self.txn.has_record(serial)


class _Matches:
    """This index's candidates verified: (row, serial, Jaccard) at or above the threshold."""

    def __init__(self, txn: IndexTxn, records: _RecordCache, batch: PreparedBatch, content: Optional[BatchContent],
                 threshold: float):
        self.txn, self.records, self.batch, self.content, self.threshold = txn, records, batch, content, threshold
        self._shingles: dict[int, np.ndarray] = {}
        self._contents: dict[int, tuple] = {}  # serial -> (template, shared template, its content under them)
        self._coded: dict[int, bytes] = {}  # stored codings of candidates verified without templates
        self.found: list = []
        self.unkept: set[int] = set()  # candidates' entries that are duplicates': no candidates
        self._later: list = []  # (place in found, row, serial, own content, stored coding): verified together
        self._pairs: list = []  # (place in found, row, serial, its content, the candidate's shingles, the templates
        # as they stand at the row: ``_templates_of``) of templated pairs
        self._uncoded: set[int] = set()  # candidates read ahead (``read_codings``) that have no stored coding

    def stored_content(self, serial: int, timeline) -> np.ndarray:
        """A stored document's content as the templates stand now (its whole shingles without templates)."""
        shingles = self._shingles.get(serial)
        if shingles is None:
            shingles = self._shingles[serial] = self.txn.shingles(serial)
        return self._templated(serial, shingles, timeline)

    def _templated(self, serial: int, shingles: np.ndarray, timeline) -> np.ndarray:
        """A stored candidate's content under the templates as ``timeline`` has them, made again only when its
        site's template or the shared one changed since it was last made (a candidate of many rows)."""
        if timeline is None:
            return shingles
        return self.content.content_of_stored(shingles, self.records.get(serial).site, self._contents, serial,
                                              timeline, committed=True)

    def _row_templates(self, row: int, timeline) -> tuple:
        """What row ``row``'s templated pairs are made under at ``timeline``'s row: the row's site and its
        template, the shared template, and the row the timeline stands at (a pair adds its candidate's site and
        that site's template)."""
        own_site = int(self.batch.sites[row])
        return own_site, timeline.template(own_site), timeline.shared, timeline.row

    def _pair_similarities(self, pairs: list) -> list[float]:
        """``pair_similarity`` of each of ``_pairs``: the candidates' contents made in one kernel call
        (``BatchContent.contents_of_stored``), each pair's contents as ``_paired`` makes them (the pages
        without the other site's template in one more: ``TemplateSettings.pair_contents``), then every Jaccard
        in one more."""
        content = self.content
        others = content.contents_of_stored([(shingles, other_template, shared, serial) for
                                             _, _, serial, _, shingles, _, _, _, other_template, shared, _ in pairs],
                                            self._contents)
        owns = [entry[3] for entry in pairs]
        apart = [p for p, entry in enumerate(pairs) if entry[6] is not entry[8]] if content.settings.neither else []
        if apart:  # each page of a pair of two templates without the other's too
            made = contents_of([owns[p] for p in apart] + [others[p] for p in apart],
                               [pairs[p][8] for p in apart] + [pairs[p][6] for p in apart],
                               [EMPTY] * (2 * len(apart)), content.settings.min_content_share)
            for p, own, other in zip(apart, made[:len(apart)], made[len(apart):]):
                owns[p], others[p] = own, other
        repeats = content.repeats
        if repeats is not None:
            for p, (_, _, _, _, _, own_site, _, other_site, _, _, at) in enumerate(pairs):
                if own_site != other_site:
                    owns[p], others[p] = content.repeats_left_out(owns[p], own_site, others[p], other_site, at)
        return pair_similarities(content, [entry[1] for entry in pairs], owns, others)

    def other_site(self, row: int, serial: int) -> bool:
        """Whether the stored ``serial`` is a page of another site than row ``row``'s."""
        return self.records.get(serial).site != int(self.batch.sites[row])

    def own(self, row: int) -> np.ndarray:
        return self.batch.shingles.of(row) if self.content is None else self.content.shingles[row]

    def pair(self, row: int, serial: int, timeline) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row``'s content and the stored ``serial``'s, as the pair is verified (``decide._State.pair_with_batch``
        for a stored candidate)."""
        return self._paired(row, self.own(row), serial, self.stored_content(serial, timeline), timeline)

    def _paired(self, row: int, own: np.ndarray, serial: int, other: np.ndarray, timeline) -> tuple:
        if timeline is None:
            return own, other
        return self.content.pair_contents(own, int(self.batch.sites[row]), other, self.records.get(serial).site,
                                          timeline)

    def verify_row(self, row: int, serials: list[int], timeline) -> None:
        """``verify`` of each of ``serials`` (in order) for row ``row``, its content looked up once."""
        if not serials:
            return
        own, unkept, stored, found, threshold = self.own(row), self.unkept, self._shingles, self.found, self.threshold
        coded, mine = self._coded, None  # mine: the row's ``_row_templates``, once it has a templated pair
        for serial in serials:
            if serial in unkept:
                continue
            shingles = stored.get(serial)
            if shingles is None and timeline is None:  # compared with the stored coding as it is, if it can be
                coding = coded.get(serial)
                if coding is None:
                    coding = None if serial in self._uncoded else self.txn.stored_coding(serial)
                    if coding is None:  # a duplicate's place
                        unkept.add(serial)
                        continue
                    coded[serial] = coding
                if codes_together(own):  # its place in found kept, verified with the batch's others
                    self._later.append((len(found), row, serial, own, coding))
                    found.append(None)
                    continue
                try:
                    similarity = jaccard_coded(own, coding)
                except ValueError:
                    raise damaged_shingles(serial) from None
                if similarity is not None:
                    if similarity >= threshold:
                        found.append((row, serial, similarity))
                    continue
            if shingles is None:
                shingles = self.txn.stored_shingles(serial)
                if shingles is None:  # a duplicate's place (only live kept documents have their shingles stored)
                    unkept.add(serial)
                    continue
                stored[serial] = shingles
            if timeline is not None:  # with the templates as they stand here, made and compared with the batch's
                if mine is None:
                    mine = self._row_templates(row, timeline)
                other_site = self.records.get(serial).site
                self._pairs.append((len(found), row, serial, own, shingles, mine[0], mine[1], other_site,
                                    timeline.template(other_site), mine[2], mine[3]))
                found.append(None)  # other templated pairs (``verified``), its place in found kept
                continue
            similarity = jaccard(own, shingles)
            if similarity >= threshold:
                found.append((row, serial, similarity))

    def verify_listed(self, rows: list[int], serials: list[int], bounds: list[int]) -> bool:
        """``verify_row`` of each of ``rows`` (ascending) with its candidates ``serials[bounds[row]:bounds[row +
        1]]``, every pair compared with the candidate's coding read ahead (``read_codings``) in one kernel call,
        the matches found in the same order; False, with nothing done, if a row's content cannot be compared so
        (not ``codes_together``), or matches were found before: then row by row."""
        if self.found or self._later or self._pairs:
            return False
        owns = [self.own(row) for row in rows]
        if not all_code_together(owns):
            return False
        coded, uncoded = self._coded, self._uncoded
        pair_owns, pair_rows, pair_serials = [], [], []
        for row, own in zip(rows, owns):
            listed = serials[bounds[row]:bounds[row + 1]]
            if uncoded:
                self.unkept.update(serial for serial in listed if serial in uncoded)  # a duplicate's place
                listed = [serial for serial in listed if serial not in uncoded]
            pair_owns += [own] * len(listed)
            pair_rows += [row] * len(listed)
            pair_serials += listed
        if not pair_serials:
            return True
        similarities, bad = jaccards_coded(pair_owns, [coded[serial] for serial in pair_serials])
        if bad >= 0:
            raise damaged_shingles(pair_serials[bad])
        threshold = self.threshold
        self.found = [(row, serial, similarity) for row, serial, similarity
                      in zip(pair_rows, pair_serials, similarities.tolist()) if similarity >= threshold]
        return True

    def read_codings(self, serials: list[int]) -> None:
        """The stored codings of these candidates read ahead, in one pass in the table's order, for
        ``verify_row`` to find (a candidate without one is named unkept only when a row meets it)."""
        wanted = sorted(set(serials).difference(self._coded, self._shingles))
        read = self.txn.stored_codings(wanted)
        self._coded.update(read)
        if len(read) < len(wanted):  # duplicates' places
            self._uncoded.update(serial for serial in wanted if serial not in read)

    def verified(self) -> list:
        """``found``, the pairs put off by ``verify_row`` verified (coded ones in one kernel call, templated
        ones in another: ``pair_similarities``) and kept in their places if at or above the threshold."""
        later, pairs, found = self._later, self._pairs, self.found
        if not later and not pairs:
            return found
        threshold = self.threshold
        if later:
            similarities, bad = jaccards_coded([entry[3] for entry in later], [entry[4] for entry in later])
            if bad >= 0:
                raise damaged_shingles(later[bad][2])
            for (at, row, serial, _, _), similarity in zip(later, similarities.tolist()):
                if similarity >= threshold:
                    found[at] = (row, serial, similarity)
        if pairs:
            for (at, row, serial, *_), similarity in zip(pairs, self._pair_similarities(pairs)):
                if similarity >= threshold:
                    found[at] = (row, serial, similarity)
        self.found = found = [entry for entry in found if entry is not None]
        self._later, self._pairs = [], []
        return found


class OwnFirstPages:
    """This index's part of ``decide._FirstPages``: its stored first pages of learning sites, rekeyed
    when their site's template changes, written into its ``rekeyed`` table and kept for the batch's later rows."""

    def __init__(self, txn: IndexTxn, signing):
        self.txn = txn
        self.signing = signing
        self._pages: dict[int, list[int]] = {}
        self._keys = RekeyedKeys()  # serial -> its keys rekeyed in this batch
        self._written: dict[int, np.ndarray] = {}  # serial -> its latest keys, not yet in the table (``write``)

    def _of(self, site: int) -> list[int]:
        pages = self._pages.get(site)
        if pages is None:
            pages = self._pages[site] = [s for s in provisional_pages(self.txn, site) if self.txn.has_record(s)]
        return pages

    def rekey(self, site: int, row: int, content_now, settled: bool) -> list:
        """The site's template changed at ``row``: (row, serial, band keys) of each own page rekeyed."""
        pages = [serial for serial in self._of(site) if self.txn.stored_shingles(serial) is not None]
        self._pages[site] = [] if settled else list(pages)
        if not pages:
            return []
        keys = band_keys_of([content_now(serial) for serial in pages], self.signing)
        for serial, serial_keys in zip(pages, keys):
            self._written[serial] = serial_keys
            self._keys[serial] = serial_keys
        return [(row, serial, serial_keys.tolist()) for serial, serial_keys in zip(pages, keys)]

    def write(self) -> None:
        """Write the pages rekeyed so far, each with its latest keys, into the ``rekeyed`` table (once the
        batch's look-ups are done: nothing reads the table after them)."""
        if self._written:
            write_rekeyed_many(self.txn, self._written)
            self._written = {}

    @property
    def rekeyed(self) -> bool:
        return bool(self._keys)

    def candidates(self, keys: np.ndarray, also: Optional[np.ndarray] = None) -> list[int]:
        """Own pages rekeyed in this batch, once per band whose key they share with ``keys`` (or ``also``)."""
        return self._keys.candidates(keys, also)


def _replays(txn: IndexTxn, mirror: RecentMirror, batch: PreparedBatch, record, hash_filter=None) -> dict:
    """Row -> the earlier decision of that document (same id, same content)."""
    stored = serials_of_many(txn, "ids", batch.id_keys, hash_filter)
    items = row_items(batch)
    replays = {}
    held = mirror.ids_held(batch.id_keys)  # only ids the tables or the mirror hold need a closer look
    rows = [row for row, ident in enumerate(batch.id_keys) if ident in held or ident in stored]
    for row in rows:
        ident = batch.id_keys[row]
        earlier, recent = stored.get(ident), mirror.serials_of_id(ident)
        if not earlier and not recent:  # most documents: a new id
            continue
        for serial in sorted({*(earlier or ()), *recent}):
            earlier = record(serial)
            if earlier.content == batch.contents[row] and earlier.id == batch.items[items[row]].id:
                replays[row] = replay_of(earlier)
                break
    return replays


def replay_of(earlier: DocRecord) -> list:
    """A replayed document's evidence: the earlier decision (``Evidence.replays``)."""
    return [earlier.id, earlier.kept, earlier.cluster_id, earlier.matched_id, earlier.similarity, earlier.exact,
            earlier.containment]


def twin_of(twin: DocRecord) -> list:
    """The first document of a content as evidence (``Evidence.twins``)."""
    return [twin.serial, twin.cluster, twin.cluster_id, twin.id]


def _twins(txn: IndexTxn, mirror: RecentMirror, contents: list[bytes], record, hash_filter=None) -> dict:
    """Row -> the first stored document with the row's content."""
    first = first_documents(txn, mirror, contents, record, hash_filter)
    twins = {}
    for row in [row for row, content in enumerate(contents) if content in first] if first else ():
        twins[row] = twin_of(record(first[contents[row]]))
    return twins
