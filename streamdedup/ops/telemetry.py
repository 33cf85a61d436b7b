"""The worker's metrics and health: what ``/metrics``, ``/healthz`` and ``/readyz`` say.

Every metric is described once here (docs/pages/operating.md's table is checked against
``METRIC_NAMES`` by a test). Updates happen on the worker thread, after a
batch commits or while idle; a scrape (on the server thread) only reads
numbers, never the index: LMDB must not be read while the worker grows its map.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from ..core.records import REJECTED, Decision
from prometheus_client import Counter, Gauge, Histogram

from .metrics import MetricsServer, new_registry

__all__ = ["WorkerTelemetry", "METRIC_NAMES"]

MAP_FULL = "the index map is full at its fixed limit: compact it (streamdedup backup) or start a new index"
_PER_DOCUMENT_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100)
_BATCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WorkerTelemetry:
    """The worker's metrics registry, its HTTP server, and the readiness state behind ``/readyz``."""

    def __init__(self, index, address: Optional[str], clock: Callable[[], float] = time.time):
        self.index = index
        self.clock = clock
        self.registry = r = new_registry()
        self.documents = Counter("streamdedup_documents_total",
                                 "Documents decided, by outcome (kept, duplicate, exact_duplicate, rejected).",
                                 ("outcome",), registry=r)
        self.rejected = Counter("streamdedup_rejected_total", "Rejected records, by reason.", ("reason",), registry=r)
        self.replayed = Counter("streamdedup_replayed_total",
                                "Records the index had already decided (their earlier decision was repeated).",
                                registry=r)
        self.batch_seconds = Histogram("streamdedup_batch_duration_seconds", "Time to decide and commit one batch.",
                                       buckets=_BATCH_BUCKETS, registry=r)
        self.candidates = Histogram("streamdedup_candidates_per_document",
                                    "Kept documents proposed by the band tables, per document.",
                                    buckets=_PER_DOCUMENT_BUCKETS, registry=r)
        self.verifications = Histogram("streamdedup_verifications_per_document",
                                       "Exact Jaccard computations, per document.", buckets=_PER_DOCUMENT_BUCKETS,
                                       registry=r)
        self.lag = Gauge("streamdedup_consumer_lag_records",
                         "Records between the worker's position and the end of each input partition.",
                         ("topic", "partition"), registry=r)
        self.last_commit = 0.0
        Gauge("streamdedup_last_commit_age_seconds", "Seconds since the last batch committed "
              "(since start, before the first).", registry=r).set_function(self._commit_age)
        self.index_documents = Gauge("streamdedup_index_documents", "Documents in the index.", registry=r)
        self.index_clusters = Gauge("streamdedup_index_clusters", "Clusters (kept documents) in the index.",
                                    registry=r)
        self.index_bytes = Gauge("streamdedup_index_bytes", "Size of the index file on disk.", registry=r)
        self.map_used = Gauge("streamdedup_index_map_used_bytes", "Bytes of the LMDB map in use.", registry=r)
        self.map_size = Gauge("streamdedup_index_map_size_bytes", "Current LMDB map size (it grows by itself).",
                              registry=r)
        self.map_limit = Gauge("streamdedup_index_map_limit_bytes",
                               "The largest size the LMDB map may grow to (index.max_map_size).", registry=r)
        if index is not None:  # a signing process has none
            self.map_limit.set(index.settings.max_map_size)
        self._map = (0, 1)
        Gauge("streamdedup_ready", "1 while the worker consumes, else 0.", registry=r).set_function(
            lambda: 1.0 if self.readiness()[0] else 0.0)
        self.started = clock()
        self.assigned = False
        self.waiting_for: Optional[str] = None
        self.stopping = False
        self.stall_timeout_s = 0.0  # see ``health``
        self.current_step: Callable[[], tuple[Optional[str], float]] = lambda: (None, 0.0)  # (step, seconds in it)
        self.server = MetricsServer(r, address, ready=self.readiness, healthy=self.health) if address else None

    def start(self) -> None:
        if self.server is not None:
            self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def url(self) -> Optional[str]:
        """Where /metrics is served (with the real port when the address said 0)."""
        if self.server is None:
            return None
        host = self.server.address.rsplit(":", 1)[0]
        return f"http://{host}:{self.server.port}/metrics"

    def refresh_index(self) -> None:
        """Read the index's size and counts (on the worker thread)."""
        with self.index.read() as txn:
            counters = txn.counters
        self.index_documents.set(counters["documents"])
        self.index_clusters.set(counters["kept"])
        self.index_bytes.set(os.path.getsize(os.path.join(self.index.path, "data.mdb")))
        self._map = self.index.map_use()
        self.map_used.set(self._map[0])
        self.map_size.set(self._map[1])

    def _commit_age(self) -> float:
        return self.clock() - (self.last_commit or self.started)

    def readiness(self) -> tuple[bool, str]:
        """Ready while consuming: assigned partitions, broker answering, index not full, not stopping."""
        if self.stopping:
            return False, "stopping"
        if not self.assigned:
            return False, "no partitions assigned yet"
        if self.waiting_for:
            return False, f"waiting for the broker: {self.waiting_for}"
        used, size = self._map
        if self.index is not None and size >= self.index.settings.max_map_size and used >= 0.95 * size:
            return False, MAP_FULL
        return True, "consuming"

    def health(self) -> tuple[bool, str]:
        """Alive unless one step has waited longer than ``worker.stall_timeout_s`` (then a restart may help)."""
        step, waited = self.current_step()
        if step is not None and self.stall_timeout_s and waited > self.stall_timeout_s:
            return False, (f"stalled: waiting {waited:.0f} s for {step}, over worker.stall_timeout_s "
                           f"({self.stall_timeout_s:g} s)")
        return True, "stopping" if self.stopping else "ok"

    def batch_sent(self, seconds: float) -> None:
        """Count a batch a signing process sent on (its offsets committed)."""
        self.last_commit = self.clock()
        self.batch_seconds.observe(seconds)

    def batch_done(self, decisions: list[Decision], seconds: float) -> None:
        """Count a committed batch."""
        self.last_commit = self.clock()
        self.batch_seconds.observe(seconds)
        counts: dict[str, int] = {}
        for d in decisions:
            if d.replayed:
                self.replayed.inc()
                continue
            outcome = "exact_duplicate" if d.exact else d.status
            counts[outcome] = counts.get(outcome, 0) + 1
            if d.status == REJECTED:
                self.rejected.labels(reason=(d.reason or "").split(":")[0]).inc()
            else:
                self.candidates.observe(d.candidates)
                self.verifications.observe(d.verified)
        for outcome, count in counts.items():
            self.documents.labels(outcome=outcome).inc(count)

    def set_lag(self, lag: dict) -> None:
        for partition, records in lag.items():
            self.lag.labels(topic=partition.topic, partition=str(partition.partition)).set(records)


METRIC_NAMES = (
    "streamdedup_documents_total", "streamdedup_rejected_total", "streamdedup_replayed_total",
    "streamdedup_batch_duration_seconds", "streamdedup_candidates_per_document",
    "streamdedup_verifications_per_document", "streamdedup_consumer_lag_records",
    "streamdedup_last_commit_age_seconds", "streamdedup_index_documents", "streamdedup_index_clusters",
    "streamdedup_index_bytes", "streamdedup_index_map_used_bytes", "streamdedup_index_map_size_bytes",
    "streamdedup_index_map_limit_bytes", "streamdedup_ready",
)
