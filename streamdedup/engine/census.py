"""What an index holds, counted for the report: decisions over time, cluster sizes, similarities, largest clusters.

Everything comes from what the index stores already: each document's
record (decision time, kept or duplicate, cluster, similarity, exact copy,
excerpt) and the members table (a cluster's duplicates). Nothing is added
to the index for it.

The counting reads the document records in slices of ``SLICE`` records,
each in its own short read transaction, so it is safe while the worker
writes and does not hold old pages from the writer on a large index
(the figures then mix slices of slightly different moments, which a report
can afford). Memory stays bounded: fixed histogram bins, one counter per
time bucket and per distinct cluster size, and the ``top`` largest clusters.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Optional

from ..store.index import DocRecord, IndexTxn
from .engine import Engine

__all__ = ["Census", "ClusterSummary", "Bucket", "take_census", "bucket_width", "BUCKET_LADDER", "ORDER_BUCKETS",
           "SIMILARITY_BINS", "SLICE"]

SLICE = 50_000  # document records read in one read transaction
MAX_BUCKETS = 120  # time buckets at most: the bucket is the first width of the ladder that keeps within it
BUCKET_LADDER = (1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400)
ORDER_BUCKETS = 100  # slices of the decision order (a backfill decides months of crawl within hours)
SIMILARITY_BINS = 50  # bins of width 0.02 over [0, 1]


@dataclass
class Bucket:
    """Decisions made in one stretch: of time (``start`` in seconds since the epoch), or of serials."""

    start: float
    decided: int = 0
    duplicates: int = 0

    @property
    def duplicate_rate(self) -> float:
        return self.duplicates / self.decided if self.decided else 0.0


@dataclass
class ClusterSummary:
    """One cluster: its representative, its size, and its first members in the order they were decided."""

    representative: dict
    size: int  # representative and members
    members: list[dict] = field(default_factory=list)

    @property
    def members_left_out(self) -> int:
        return self.size - 1 - len(self.members)


@dataclass
class Census:
    """The figures of one index, as of the moment they were read."""

    path: str
    fingerprint: str
    bands: int
    rows: int
    min_shared: int
    num_perm: int
    threshold: float  # from the configuration the report ran with (the index stores bands and rows, not it)
    taken_at: float
    documents: int = 0
    kept: int = 0
    duplicates: int = 0
    exact: int = 0
    excerpts: int = 0
    near: int = 0
    expired: int = 0  # kept documents past index.retention_days
    unclustered: int = 0  # duplicates whose representative was forgotten
    first_time: Optional[float] = None
    last_time: Optional[float] = None
    bucket_seconds: int = BUCKET_LADDER[0]
    timeline: list[Bucket] = field(default_factory=list)
    order_width: int = 1  # serials in one bucket of ``by_order``
    by_order: list[Bucket] = field(default_factory=list)  # the same in decision order: ``ORDER_BUCKETS`` slices
    near_similarity: list[int] = field(default_factory=lambda: [0] * SIMILARITY_BINS)  # Jaccard of near duplicates
    excerpt_similarity: list[int] = field(default_factory=lambda: [0] * SIMILARITY_BINS)  # Jaccard of excerpts
    cluster_sizes: dict[int, int] = field(default_factory=dict)  # size -> clusters of that size
    largest: list[ClusterSummary] = field(default_factory=list)

    @property
    def duplicate_rate(self) -> float:
        return self.duplicates / self.documents if self.documents else 0.0

    @property
    def clusters(self) -> int:
        return sum(self.cluster_sizes.values())


def take_census(engine: Engine, top: int = 10, members: int = 20, clock=time.time) -> Census:
    """Count what ``engine``'s index holds; ``top`` largest clusters with at most ``members`` members each."""
    index, signing = engine.index, engine.signing
    census = Census(index.path, signing.fingerprint(), signing.bands, signing.rows, signing.min_shared,
                    signing.num_perm, engine.settings.threshold, clock())
    span = _span(engine)
    if span is not None:
        census.first_time, census.last_time, last_serial = span
        census.bucket_seconds = bucket_width(census.last_time - census.first_time)
        census.order_width = last_serial // ORDER_BUCKETS + 1
    _count_records(engine, census)
    _count_clusters(engine, census, top, members)
    return census


def bucket_width(span_seconds: float) -> int:
    """The narrowest width of ``BUCKET_LADDER`` that covers ``span_seconds`` in at most ``MAX_BUCKETS`` buckets."""
    for width in BUCKET_LADDER:
        if span_seconds / width < MAX_BUCKETS:
            return width
    return BUCKET_LADDER[-1]


def _span(engine: Engine) -> Optional[tuple[float, float, int]]:
    """Decision times of the first and last records (serials follow decision order), and the last serial."""
    with engine.index.read() as txn:
        ends = txn.first_and_last_records()
    if ends is None:
        return None
    first, last = ends
    return min(first.time, last.time), max(first.time, last.time), last.serial


def _count_records(engine: Engine, census: Census) -> None:
    """One pass over the document records, ``SLICE`` at a time."""
    buckets: dict[int, Bucket] = {}
    slices: dict[int, Bucket] = {}
    origin = census.first_time or 0.0
    last_bucket = int(((census.last_time or 0.0) - origin) // census.bucket_seconds)
    after = 0
    while True:
        with engine.index.read() as txn:
            records = txn.records_from(after, SLICE)
        if not records:
            break
        for record in records:
            number = min(max(int((record.time - origin) // census.bucket_seconds), 0), last_bucket)
            _count_one(census, record, _bucket(buckets, number, origin, census.bucket_seconds),
                       _bucket(slices, record.serial // census.order_width, 0, census.order_width))
        after = records[-1].serial + 1
    census.timeline = [buckets[n] for n in sorted(buckets)]
    census.by_order = [slices[n] for n in sorted(slices)]


def _bucket(buckets: dict[int, Bucket], number: int, origin: float, width: float) -> Bucket:
    bucket = buckets.get(number)
    if bucket is None:
        bucket = buckets[number] = Bucket(origin + number * width)
    return bucket


def _count_one(census: Census, record: DocRecord, *buckets: Bucket) -> None:
    census.documents += 1
    for bucket in buckets:
        bucket.decided += 1
        bucket.duplicates += not record.kept
    if record.kept:
        census.kept += 1
        census.expired += record.expired
        return
    census.duplicates += 1
    census.unclustered += not record.cluster
    if record.exact:
        census.exact += 1
    elif record.containment is not None:
        census.excerpts += 1
        census.excerpt_similarity[_similarity_bin(record.similarity)] += 1
    else:
        census.near += 1
        census.near_similarity[_similarity_bin(record.similarity)] += 1


def _similarity_bin(similarity: Optional[float]) -> int:
    return min(int((similarity or 0.0) * SIMILARITY_BINS), SIMILARITY_BINS - 1)


def _count_clusters(engine: Engine, census: Census, top: int, members: int) -> None:
    """Cluster sizes from the members table; every kept document without members is a cluster of one."""
    sizes: dict[int, int] = {}
    largest: list[tuple[int, int]] = []  # (size, -serial): a min-heap of the ``top`` largest, earlier first on ties
    with engine.index.read() as txn:
        with_members = 0
        for serial, count in txn.clusters_with_members():
            size = count + 1
            with_members += 1
            sizes[size] = sizes.get(size, 0) + 1
            entry = (size, -serial)
            if len(largest) < top:
                heapq.heappush(largest, entry)
            elif entry > largest[0]:
                heapq.heapreplace(largest, entry)
        ranked = sorted(largest, reverse=True)
        census.largest = [_summary(txn, -negative, size, members) for size, negative in ranked]
    singles = census.kept - with_members
    if singles > 0:
        sizes[1] = singles
    census.cluster_sizes = dict(sorted(sizes.items()))


def _summary(txn: IndexTxn, serial: int, size: int, limit: int) -> ClusterSummary:
    listed = [_row(txn.record(member)) for member in itertools.islice(txn.member_serials(serial), limit)]
    return ClusterSummary(_row(txn.record(serial)), size, listed)


def _row(record: DocRecord) -> dict:
    relation = "kept" if record.kept else "exact" if record.exact else "excerpt" if record.containment is not None \
        else "near"
    return {"id": record.id, "relation": relation, "similarity": record.similarity, "containment": record.containment,
            "time": record.time, "source": record.source, "expired": record.expired}
