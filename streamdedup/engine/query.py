"""Read-only questions to the index: what does this text duplicate, what is in this cluster.

Both run in one short read transaction, so they are safe while the worker
writes, and see the index as of its last commit. A sharded deployment's
vshard states (``shardset`` opens them) are read by the same rules
(``near_matches`` and ``best_first`` for a query, ``cluster_in``), each in a
transaction of its own, their keys asked of their owners
(``vshards.reading``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional, Protocol, Sequence

import numpy as np

from ..core.excerpts import anchors_of, containment, likely_sources
from ..core.prepare import PreparedBatch, prepare
from ..core.records import Document, Rejected, Source
from ..core.signing import SigningConfig
from ..core.sites import site_host, site_key
from ..core.templates import TemplateSettings
from ..core.verify import jaccard
from ..errors import StreamdedupError, UnknownDocumentError
from ..store.anchors import BatchAnchors
from ..store.bands import BandTables
from ..store.housekeeping import serials_with_id
from ..store.index import DocRecord, Index, IndexTxn
from ..store.mirror import RecentMirror
from ..store.view import first_documents
from ..store.sites import shared_template, site_summaries
from .engine import Engine
from .settings import DedupSettings

__all__ = ["Match", "ClusterView", "Readable", "near_duplicates", "query_of", "best_first",
           "near_matches", "exact_copy", "cluster_of", "cluster_in", "templates_learned", "stats_of"]


class Readable(Protocol):
    """What the read-only questions take an index as: an ``Engine``, or a vshard's state opened to be read
    (``vshards.reading.VShardReader``), whose tables are one index's where they hold the same things."""

    index: Index
    signing: SigningConfig
    settings: DedupSettings
    template_settings: TemplateSettings


@dataclass
class Match:
    id: str
    cluster: str
    similarity: float
    kept: bool
    exact: bool
    source: list
    containment: Optional[float] = None  # set when the text is an excerpt of this document

    @property
    def relation(self) -> str:
        return "exact" if self.exact else "near" if self.containment is None else "excerpt"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ClusterView:
    representative: dict
    members: list[dict] = field(default_factory=list)  # the earliest ``limit`` of them
    asked: Optional[str] = None  # the id asked about, when it is a member
    members_total: int = 0  # all of them (a crawler trap's cluster may hold millions)

    def as_dict(self) -> dict:
        return asdict(self)


def near_duplicates(engine: Engine, text: str, min_similarity: Optional[float] = None, limit: int = 20) -> list[Match]:
    """Kept documents whose exact similarity to ``text`` is at least ``min_similarity`` (default: the
    threshold), plus the first document with the very same normalized text, best first; then the kept
    documents ``text`` is an excerpt of (whole texts: the query has no site, so no template is left out)."""
    floor, batch = query_of(engine, text, min_similarity)
    return best_first([_looked_up(engine, batch, floor)], limit)


def query_of(reader: Readable, text: str, min_similarity: Optional[float]) -> tuple[float, PreparedBatch]:
    """The similarity a match must reach (default: the threshold), and ``text`` prepared as the index
    prepares a document (its shingles, band keys and content)."""
    floor = reader.settings.threshold if min_similarity is None else min_similarity
    batch = prepare([Document("", text, Source("query", -1, 0))], reader.signing)
    if isinstance(batch.items[0], Rejected):
        raise StreamdedupError(f"nothing to look for: {batch.items[0].message()}")
    return floor, batch


def best_first(answers: list[tuple[dict, Optional[tuple], dict]], limit: int) -> list[Match]:
    """The answers of every index (``_looked_up``'s) merged as one index's, best first: near and exact
    matches by similarity, then the documents the text is an excerpt of; ties by serial."""
    found = _merged(answers)
    ranked = sorted(found.items(), key=lambda item: (item[1].containment is not None, -item[1].similarity, item[0]))
    return [match for _, match in ranked[:limit]]


def _looked_up(engine: Readable, batch, floor: float) -> tuple[dict, Optional[tuple], dict]:
    """One index's answers for the query ``batch``: serial -> Match of its candidates at or above ``floor``,
    its first document with the same content as (serial, Match) or None, and the documents the text is an
    excerpt of."""
    shingles = batch.shingles.of(0)
    with engine.index.read() as txn:
        mirror = RecentMirror.load(txn)
        _, found = BandTables(engine.index).lookup(txn, mirror, batch.sorted_slots()[0])
        near = near_matches(np.unique(found).tolist(), lambda _: txn, shingles, floor)
        serial = first_documents(txn, mirror, batch.contents, txn.record).get(batch.contents[0])
        twin = None if serial is None else exact_copy(serial, txn.record(serial))
        seen = near if twin is None else {**near, twin[0]: twin[1]}
        return near, twin, _sources_containing(engine, txn, shingles, seen)


def near_matches(serials: list[int], txn_of: Callable[[int], IndexTxn], shingles: np.ndarray,
                 floor: float) -> dict[int, Match]:
    """Serial -> Match of the documents among ``serials`` (every one sharing a band key with the query, not
    only the first of a key) that are kept and at least ``floor`` like ``shingles``: a duplicate's place
    proposes nothing, a forgotten or expired document matches nothing. ``txn_of(serial)``: the read
    transaction of the index holding that document."""
    near: dict[int, Match] = {}
    for serial in serials:
        txn = txn_of(serial)
        record = txn.record(serial) if txn.has_record(serial) else None
        if record is None or not record.kept or record.expired:
            continue
        similarity = jaccard(shingles, txn.shingles(serial))
        if similarity >= floor:
            near[serial] = _match(record, similarity, False)
    return near


def exact_copy(serial: int, record: DocRecord) -> tuple[int, Match]:
    """The first document with the query's very content, as an answer: (serial, its Match)."""
    return serial, _match(record, 1.0, True)


def _merged(answers: list[tuple[dict, Optional[tuple], dict]]) -> dict[int, Match]:
    """Every index's answers as one index's: the candidates, then the earliest twin, then the sources."""
    found: dict[int, Match] = {}
    for near, _, _ in answers:
        found.update(near)
    twins = [twin for _, twin, _ in answers if twin is not None]
    if twins:
        serial, match = min(twins, key=lambda twin: twin[0])
        found[serial] = match
    for _, _, sources in answers:
        found.update({serial: match for serial, match in sources.items() if serial not in found})
    return found


def _sources_containing(engine: Readable, txn, shingles, found: dict) -> dict[int, Match]:
    """Kept documents the text is an excerpt of (containment at least ``excerpts.containment``)."""
    settings = engine.settings.excerpts
    if not settings.sampling or len(shingles) < settings.min_shingles:
        return {}
    anchors = anchors_of(shingles, settings.sampling)
    serials, shared = BatchAnchors(txn, settings.max_postings, [anchors]).holders(0)
    sources = {}
    for serial in likely_sources(serials, shared, len(anchors), settings.anchor_share, settings.max_sources):
        record = txn.record(serial)
        if serial in found or record.expired:
            continue
        whole = txn.shingles(serial)
        share = containment(shingles, whole)
        if share >= settings.containment:
            sources[serial] = _match(record, jaccard(shingles, whole), False, share)
    return sources


def _match(record: DocRecord, similarity: float, exact: bool, share: Optional[float] = None) -> Match:
    return Match(record.id, record.cluster_id, round(similarity, 6), record.kept, exact, record.source,
                 None if share is None else round(share, 6))


def cluster_of(engine: Engine, doc_id: str, limit: Optional[int] = None) -> ClusterView:
    """The cluster named by ``doc_id`` (its representative), or the cluster ``doc_id`` belongs to, with its
    earliest ``limit`` members (None: all) and how many it has (counted by LMDB, none read)."""
    return cluster_in([engine], doc_id, limit, lambda _: 0)


def cluster_in(engines: Sequence[Readable], doc_id: str, limit: Optional[int], owner: Callable[[str], int]
               ) -> ClusterView:
    """``cluster_of`` over the vshards of a sharded deployment (or one index): ``engines[owner(id)]`` holds
    that id's documents; the members are every vshard's own, listed under the representative's serial,
    merged in serial order. One read transaction per vshard, all open together."""
    with contextlib.ExitStack() as stack:
        txns = [stack.enter_context(engine.index.read()) for engine in engines]
        txn = txns[owner(doc_id)]
        serials = serials_with_id(txn, RecentMirror.load(txn), doc_id)
        if not serials:
            raise UnknownDocumentError(f"no document with id {doc_id!r} in the index")
        record = txn.record(serials[-1])  # the latest version
        if not record.cluster:
            raise StreamdedupError(f"{doc_id!r} belongs to no cluster: its representative was forgotten")
        representative = txns[owner(record.cluster_id)].record(record.cluster)
        lists = [_members_of(txn, record.cluster) for txn in txns]
        total = sum(count for count, _ in lists)
        merged = heapq.merge(*(serials for _, serials in lists), key=lambda pair: pair[0])
        members = [_member(txn.record(serial)) for serial, txn in itertools.islice(merged, limit)]
    return ClusterView(_member(representative), members, None if record.kept else doc_id, total)


def _members_of(txn, representative: int) -> tuple[int, Iterator[tuple[int, object]]]:
    """How many members one index lists under ``representative``, and (serial, txn) of each, in serial order."""
    return txn.member_count(representative), ((serial, txn) for serial in txn.member_serials(representative))


def _member(record: DocRecord) -> dict:
    relation = None if record.kept else ("exact" if record.exact else
                                         "near" if record.containment is None else "excerpt")
    return {"id": record.id, "kept": record.kept, "matched": record.matched_id, "similarity": record.similarity,
            "exact": record.exact, "relation": relation, "containment": record.containment,
            "source": record.source, "time": record.time, "expired": record.expired}


def templates_learned(engine: Engine, host: Optional[str] = None, top: int = 10) -> dict:
    """What the index learned of site templates: totals, the largest sites (or the one site ``host``)."""
    with engine.index.read() as txn:
        sites = list(site_summaries(txn))
        shared = shared_template(txn, engine.template_settings.min_sites)
    if host is not None:
        wanted = site_key(host)
        found = [s for s in sites if s["site"] == wanted]
        if not found:
            raise StreamdedupError(f"the index has learned nothing of the site {site_host(host)!r}: no page of it "
                                   "was decided (or templates are off)")
        return found[0]
    sites.sort(key=lambda s: (-s["pages"], s["host"]))
    return {
        "enabled": engine.template_settings.enabled,
        "sites": len(sites),
        "settled": sum(s["settled"] for s in sites),
        "template_shingles": sum(s["template_shingles"] for s in sites),
        "shared_template_shingles": len(shared),
        "largest": sites[:top],
    }


def stats_of(engine: Engine) -> dict:
    """Counts, sizes, positions and configuration of one index (or one shard's): ``Index.stats``."""
    index = engine.index
    with index.read() as txn:
        counters = dict(txn.counters)
        positions = txn.positions()
    used, map_size = index.map_use()
    documents = counters["documents"]
    return {
        "path": index.path,
        "documents": documents,
        "clusters": counters["kept"],
        "kept": counters["kept"],
        "duplicates": counters["duplicates"],
        "exact_duplicates": counters["exact"],
        "duplicate_rate": counters["duplicates"] / documents if documents else 0.0,
        "next_serial": counters["next_serial"],
        "index_bytes": os.path.getsize(os.path.join(index.path, "data.mdb")),
        "map_used_bytes": used,
        "map_size_bytes": map_size,
        "positions": positions,
        "fingerprint": index.signing.fingerprint(),
        "config": index.signing.as_dict(),
        "index_id": index.meta["index_id"],
        "templates": templates_learned(engine),
    }
