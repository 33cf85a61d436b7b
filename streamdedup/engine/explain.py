"""Why a document was decided as it was: its match, the exact similarity, the bands they share, the passages.

The index keeps no text (a kept document's shingle hashes, a duplicate's
decision record), so an explanation is built from what it has and from the
texts the caller hands in:

- always: the decision record (status, relation, cluster, match, the
  similarity and containment recorded when it was decided);
- with both documents' shingles, the exact similarity of their *content*
  (shingles without their sites' templates as the index knows them now,
  each less the other site's template too, as a decision verifies a pair) and
  the bands of the signatures they share. A kept document's shingles are
  stored; a duplicate's are not (the index stays small), so for a duplicate
  they come from its text;
- with both texts, the shared and differing passages: the normalized texts'
  words aligned with ``difflib``;
- with excerpts on and A's text, A's containment without the short lines'
  text its site repeats (``templates.lines``), as an excerpt of another
  site's page is measured.

A text that is not the one the index decided (its normalized content hash
differs from the record's) is not used; the explanation says so.
"""

from __future__ import annotations

import contextlib
import difflib
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from ..core.excerpts import containment
from ..core.lsh import band_keys
from ..core.prepare import prepare
from ..core.records import Document, Rejected, Source
from ..core.shingle import ShingleBatch, normalize
from ..core.signing import sign_batch
from ..core.templates import EMPTY, content_of, excerpt_text_of, own_text_of, without_repeats
from ..core.verify import jaccard
from ..errors import UnknownDocumentError
from ..store.bands import record_band_keys
from ..store.housekeeping import serials_with_id
from ..store.index import DocRecord, IndexTxn
from ..store.mirror import RecentMirror
from ..store.sites import load_site, shared_template
from .engine import Engine
from .query import Readable

__all__ = ["Explanation", "Passage", "Side", "explain", "explain_in"]


@dataclass
class Side:
    """One document of an explanation, as the index recorded it."""

    id: str
    status: str  # "kept" or "duplicate"
    cluster: Optional[str]  # None once its cluster's representative was forgotten
    source: list  # [name, partition, offset] it was read from
    time: float  # when it was decided (seconds since the epoch)
    shingles: Optional[int] = None  # its content shingles, when known (stored, or from its text)
    shingles_from: Optional[str] = None  # "index" (stored for kept documents) or "text"
    text_given: bool = False  # a text was handed in and is the one the index decided


@dataclass
class Passage:
    """A run of the two normalized texts: the same in both, changed, or only in one of them."""

    kind: str  # "same", "changed", "only_a" or "only_b"
    a: str  # the words of document A ("" for only_b)
    b: str  # the words of document B ("" for only_a)


@dataclass
class Explanation:
    """Why document ``a`` was decided as it was, against document ``b`` (its match, or the one asked about)."""

    a: Side
    b: Optional[Side]  # None: a kept document asked about alone
    relation: Optional[str]  # a duplicate's "exact", "near" or "excerpt"; None for a kept document
    matched: Optional[str]  # the kept document ``a`` was found to duplicate
    b_is_match: bool  # ``b`` is the document ``a`` was decided against (not one the caller chose)
    threshold: float  # lsh.threshold: the Jaccard at or above which a document is a duplicate
    decided_similarity: Optional[float]  # the similarity recorded with ``a``'s decision (against ``matched``)
    decided_containment: Optional[float]  # an excerpt's recorded share of its content inside ``matched``
    similarity: Optional[float] = None  # exact Jaccard of the two contents, computed now
    own_text_similarity: Optional[float] = None  # of ``a``'s own text and ``b``'s content, when ``a`` has one
    containment: Optional[float] = None  # the share of ``a``'s content inside ``b``'s, computed now
    excerpt_text_containment: Optional[float] = None  # that share without the short lines ``a``'s site repeats
    shared_shingles: Optional[int] = None
    bands: int = 0  # bands of a signature
    min_shared: int = 0  # bands a kept document must share with a document to be verified against it
    shared_bands: Optional[list[int]] = None  # the band numbers (from 0) whose keys ``a`` and ``b`` share
    members: Optional[int] = None  # a kept document asked about alone: the duplicates in its cluster
    passages: Optional[list[Passage]] = None  # the aligned texts, when both were given
    notes: list[str] = field(default_factory=list)  # what could not be said, and how to get it

    def as_dict(self) -> dict:
        return asdict(self)


def explain(engine: Engine, doc_id: str, other: Optional[str] = None,
            texts: Optional[Mapping[str, Union[str, Sequence[str]]]] = None) -> Explanation:
    """Explain the latest version of ``doc_id`` against ``other`` (default: the document it was matched to).

    ``texts`` maps ids to their texts (both, for the passages; a duplicate's,
    for the similarity and bands), or to several candidates: the one the
    index decided is used.
    Raises ``UnknownDocumentError`` for an id the index does not hold.
    """
    return explain_in([engine], doc_id, other, texts, lambda _: 0)


def explain_in(engines: Sequence[Readable], doc_id: str, other: Optional[str] = None,
               texts: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
               owner: Callable[[str], int] = lambda _: 0) -> Explanation:
    """``explain`` over the vshards of a sharded deployment (or one index): ``engines[owner(id)]`` holds that
    id's documents, so each record and its stored shingles are read from its home; one read transaction
    per vshard, all open together."""
    texts = texts or {}
    engine = engines[0]
    with contextlib.ExitStack() as stack:
        txns = [stack.enter_context(e.index.read()) for e in engines]
        mirrors: dict[int, RecentMirror] = {}

        def latest(an_id: str) -> DocRecord:
            number = owner(an_id)
            if number not in mirrors:
                mirrors[number] = RecentMirror.load(txns[number])
            return _latest(txns[number], mirrors[number], an_id)

        def txn_of(record: DocRecord) -> IndexTxn:
            return txns[owner(record.id)]

        record_a = latest(doc_id)
        record_b, notes = _other_record(latest, lambda r: txns[owner(r.matched_id)], record_a, other)
        result = Explanation(
            a=_side(record_a), b=None if record_b is None else _side(record_b),
            relation=_relation(record_a), matched=record_a.matched_id,
            b_is_match=record_b is not None and record_b.serial == record_a.matched,
            threshold=engine.settings.threshold, decided_similarity=record_a.similarity,
            decided_containment=record_a.containment, bands=engine.signing.bands,
            min_shared=engine.signing.min_shared, notes=notes)
        if record_b is None:
            if record_a.kept:
                result.members = sum(txn.member_count(record_a.serial) for txn in txns)
            return result
        read = {}
        contents = {}
        templates = {}
        for side, record in (("a", record_a), ("b", record_b)):
            read[side] = _shingles_of(engine, txn_of(record), record, texts.get(record.id), result.notes)
            described = getattr(result, side)
            described.text_given = read[side].words is not None
            if read[side].shingles is not None:
                templates[side] = _template(engine, txn_of(record), record)
                contents[side] = _content(engine, txn_of(record), templates[side], read[side].shingles)
                described.shingles, described.shingles_from = len(contents[side]), read[side].origin
        if len(contents) == 2:
            compared = engine.template_settings.pair_contents(contents["a"], contents["b"], templates["a"],
                                                              templates["b"])
            compared = _without_repeats(engine, txn_of, record_a, record_b, compared)
            _compare(engine, txn_of, result, record_a, record_b, contents["a"], contents["b"], compared)
            result.own_text_similarity = _own_text_similarity(engine, txn_of(record_a), record_a, compared)
            result.excerpt_text_containment = _excerpt_text_containment(
                engine, txn_of(record_a), record_a, record_b, contents["a"], compared[1], read["a"].short_lines)
            _note_a_changed_similarity(result)
        if read["a"].words is not None and read["b"].words is not None:
            result.passages = passages(read["a"].words, read["b"].words)
        else:
            missing = [r.id for side, r in (("a", record_a), ("b", record_b)) if read[side].words is None]
            result.notes.append(f"no text for {', '.join(map(repr, missing))}: the index keeps no text; give the "
                                "input file (--texts FILE.jsonl, or texts= in Python) to see the passages")
    return result


def _latest(txn: IndexTxn, mirror: RecentMirror, doc_id: str) -> DocRecord:
    serials = serials_with_id(txn, mirror, doc_id)
    if not serials:
        raise UnknownDocumentError(f"no document with id {doc_id!r} in the index (never decided, or forgotten); "
                                   "`streamdedup query` finds documents by their text")
    return txn.record(serials[-1])


def _other_record(latest: Callable[[str], DocRecord], match_txn: Callable[[DocRecord], IndexTxn], record: DocRecord,
                  other: Optional[str]) -> tuple[Optional[DocRecord], list[str]]:
    """The document to compare with, and notes on why there is none (``latest(id)``: an id's latest version;
    ``match_txn(record)``: the transaction of the index holding ``record``'s match)."""
    if other is not None:
        return latest(other), []
    if record.kept:
        return None, ["kept: no earlier kept document was at or above the threshold when it was decided; name "
                      "another id to compare it with"]
    matched = record.matched
    txn = None if matched is None else match_txn(record)
    if txn is None or not txn.has_record(matched):
        return None, [f"its match {record.matched_id!r} was forgotten since: only the recorded decision is left"]
    return txn.record(matched), []


def _side(record: DocRecord) -> Side:
    return Side(record.id, "kept" if record.kept else "duplicate", record.cluster_id if record.cluster else None,
                record.source, record.time)


def _relation(record: DocRecord) -> Optional[str]:
    if record.kept:
        return None
    return "exact" if record.exact else "near" if record.containment is None else "excerpt"


class _Read(NamedTuple):
    """What is known of one side's text: None where it is not (a duplicate's shingles without its text, the words
    and short lines without a text)."""

    shingles: Optional[np.ndarray]  # its whole shingles
    origin: Optional[str]  # where they came from: "index" or "text"
    words: Optional[list[str]] = None  # its normalized words
    short_lines: Optional[np.ndarray] = None  # its shingles within runs of short lines, if the index reads them


def _shingles_of(engine: Readable, txn: IndexTxn, record: DocRecord, text: Union[str, Sequence[str], None],
                 notes: list[str]) -> _Read:
    """A document's whole shingles, where they came from, its normalized words and its short lines' shingles.

    ``text`` may be several candidates (an id found on several lines: its
    versions); the one whose normalized content the index decided is used.
    """
    stored = txn.stored_shingles(record.serial) if record.kept else None
    origin = None if stored is None else "index"
    if text is None:
        if stored is None:
            notes.append(f"{record.id!r} is a duplicate, whose shingles the index does not keep: give its text for "
                         "the exact similarity and the shared bands")
        return _Read(stored, origin)
    given = [text] if isinstance(text, str) else list(text)
    batch = prepare([Document(record.id, t, Source("explain", -1, n)) for n, t in enumerate(given)], engine.signing)
    for n, item in enumerate(batch.items):
        row = batch.row[n]
        if row >= 0 and batch.contents[row] == record.content:
            lines = None if batch.short_lines is None else batch.short_lines.of(row)
            if stored is None:
                return _Read(batch.shingles.of(row), "text", normalize(given[n]).split(), lines)
            return _Read(stored, origin, normalize(given[n]).split(), lines)
    problems = [item.message() if isinstance(item, Rejected) else "not the text the index decided (its normalized "
                "content differs)" for item in batch.items]
    notes.append(f"the text given for {record.id!r} was not used: {'; '.join(sorted(set(problems)))}")
    return _Read(stored, origin)


def _template(engine: Readable, txn: IndexTxn, record: DocRecord) -> np.ndarray:
    """A document's site template as the index knows it now (EMPTY: none learned, or templates off)."""
    settings = engine.template_settings
    if not settings.enabled or not settings.learns(record.site):
        return EMPTY
    return load_site(txn, record.site).template


def _without_repeats(engine: Readable, txn_of: Callable[[DocRecord], IndexTxn], record_a: DocRecord,
                     record_b: DocRecord, compared: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """With ``templates.repeats``, a pair of two sites' pages without what each site repeats
    (``templates.without_repeats``), by what the index knows of the sites now."""
    settings = engine.template_settings
    sites = record_a.site, record_b.site
    if not (settings.enabled and settings.repeats) or sites[0] == sites[1] or not all(map(settings.learns, sites)):
        return compared
    states = [load_site(txn_of(record), record.site) for record in (record_a, record_b)]

    def on_two_pages(state):
        return state.repeated.contains

    return without_repeats(*compared, on_two_pages(states[0]), on_two_pages(states[1]))


def _content(engine: Readable, txn: IndexTxn, template: np.ndarray, shingles: np.ndarray) -> np.ndarray:
    """A document's shingles without its site's ``template`` and the shared one (its content)."""
    settings = engine.template_settings
    if not settings.enabled:
        return shingles
    return content_of(shingles, template, shared_template(txn, settings.min_sites), settings.min_content_share)


def _compare(engine: Readable, txn_of: Callable[[DocRecord], IndexTxn], result: Explanation, record_a: DocRecord,
             record_b: DocRecord, content_a: np.ndarray, content_b: np.ndarray,
             compared: tuple[np.ndarray, np.ndarray]) -> None:
    """The similarity, containment and shared shingles of the pair as a decision verifies it (``compared``:
    ``TemplateSettings.pair_contents`` of the two contents), and the bands their contents share."""
    part, whole = compared
    at = np.searchsorted(whole, part)
    at[at == len(whole)] = 0
    result.shared_shingles = int(np.count_nonzero(whole[at] == part)) if len(whole) else 0
    similarity = jaccard(part, whole)
    result.similarity = round(similarity, 6)
    result.containment = round(containment(part, whole), 6)
    keys_a = _keys(engine, txn_of(record_a), record_a, content_a)
    keys_b = _keys(engine, txn_of(record_b), record_b, content_b)
    result.shared_bands = np.flatnonzero(keys_a == keys_b).tolist()


def _own_text_similarity(engine: Readable, txn: IndexTxn, record: DocRecord,
                         compared: tuple[np.ndarray, np.ndarray]) -> Optional[float]:
    """With ``templates.own_text``, the Jaccard of ``record``'s own text (its compared content without what its
    site repeats, as the index knows the site now) and the other side of the pair, as ``evidence.pair_similarity``
    takes it; None when the page has no own text (its site's repeats are a minor part of it)."""
    settings = engine.template_settings
    if not (settings.enabled and settings.repeats and settings.own_text and settings.learns(record.site)):
        return None
    part, whole = compared
    own = own_text_of(part, load_site(txn, record.site).repeated.contains(part), settings.min_content_share)
    return None if own is None else round(jaccard(own, whole), 6)


def _excerpt_text_containment(engine: Readable, txn: IndexTxn, record: DocRecord, other: DocRecord,
                              content: np.ndarray, whole: np.ndarray,
                              short_lines: Optional[np.ndarray]) -> Optional[float]:
    """With excerpts and ``templates.lines``, the share inside ``whole`` (the other page's content as the pair is
    compared) of ``record``'s ``content`` without the text its site repeats in its short lines
    (``templates.excerpt_text_of``, as the index knows the site now), as ``evidence.pair_containment`` takes it
    against a page of another site; None when the rule does not apply, or leaves out nothing."""
    settings = engine.template_settings
    if short_lines is None or record.site == other.site or not (settings.enabled and settings.repeats
                                                                 and settings.learns(record.site)):
        return None
    repeated = load_site(txn, record.site).repeated.contains(content)
    text = excerpt_text_of(content, repeated, short_lines, engine.settings.excerpts.min_shingles)
    return None if text is None else round(containment(text, whole), 6)


def _note_a_changed_similarity(result: Explanation) -> None:
    """Say so when the similarity computed now (the higher of the pair's and its own text's, as a decision takes
    it) is not the one recorded with the decision."""
    decided = result.decided_similarity
    now = max(result.similarity, result.own_text_similarity or 0.0)
    if result.b_is_match and decided is not None and abs(now - decided) > 1e-6:
        result.notes.append("the similarity computed now differs from the decision's: a site template learned since "
                            "changed what counts as content (the decision stands)")


def _keys(engine: Readable, txn: IndexTxn, record: DocRecord, content: np.ndarray) -> np.ndarray:
    """The band keys a document is looked up by: a live kept one's as indexed, else its content's signature's."""
    if record.kept and not record.expired:
        return record_band_keys(txn, record)
    signing = engine.signing
    signature = sign_batch(ShingleBatch(content, np.array([0, len(content)], dtype=np.int64)),
                           signing.num_perm, signing.seed)
    return band_keys(signature, signing.bands, signing.rows)[0]


def passages(a: list[str], b: list[str]) -> list[Passage]:
    """The two word sequences aligned: runs the same in both, changed, or only in one (``difflib``, no junk)."""
    found = []
    for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        kind = {"equal": "same", "replace": "changed", "delete": "only_a", "insert": "only_b"}[op]
        found.append(Passage(kind, " ".join(a[a0:a1]), " ".join(b[b0:b1])))
    return found
