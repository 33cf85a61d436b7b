"""The worker's metrics and health: what ``/metrics``, ``/healthz`` and ``/readyz`` say.

Every metric is described once here (docs/pages/operating.md's table is checked against
``METRIC_NAMES`` by a test). Updates happen on the worker thread, after a
batch commits or while idle; a scrape (on the server thread) only reads
numbers, never the index: LMDB must not be read while the worker grows its map.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from typing import Callable, Optional

from ..core.records import REJECTED, Decision
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

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
        self.candidates = BatchHistogram("streamdedup_candidates_per_document",
                                         "Kept documents proposed by the band tables, per document.",
                                         _PER_DOCUMENT_BUCKETS, r)
        self.verifications = BatchHistogram("streamdedup_verifications_per_document",
                                            "Exact Jaccard computations, per document.", _PER_DOCUMENT_BUCKETS, r)
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
        candidates: dict[int, int] = {}
        verified: dict[int, int] = {}
        replayed = 0
        for d in decisions:
            if d.replayed:
                replayed += 1
                continue
            outcome = "exact_duplicate" if d.exact else d.status
            counts[outcome] = counts.get(outcome, 0) + 1
            if d.status == REJECTED:
                self.rejected.labels(reason=(d.reason or "").split(":")[0]).inc()
            else:
                candidates[d.candidates] = candidates.get(d.candidates, 0) + 1
                verified[d.verified] = verified.get(d.verified, 0) + 1
        for outcome, count in counts.items():
            self.documents.labels(outcome=outcome).inc(count)
        if replayed:
            self.replayed.inc(replayed)
        self.candidates.observe_counted(candidates)
        self.verifications.observe_counted(verified)

    def set_lag(self, lag: dict) -> None:
        for partition, records in lag.items():
            self.lag.labels(topic=partition.topic, partition=str(partition.partition)).set(records)


class BatchHistogram:
    """A histogram exposed as prometheus_client's ``Histogram`` exposes one, but observed a batch at a time.

    ``Histogram.observe`` takes a lock and walks the buckets for every value:
    two such calls a document cost a worker's deciding process 4-7 µs a
    document. A batch's values are counted in a dict first, and each
    distinct value is added once here (``observe_counted``).
    """

    def __init__(self, name: str, documentation: str, buckets: tuple, registry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = [float(b) for b in buckets] + [float("inf")]
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.created = time.time()
        self._lock = threading.Lock()
        registry.register(self)

    def observe_counted(self, counted: dict) -> None:
        """Observe each value of ``counted`` (value -> how many times)."""
        with self._lock:
            for value, times in counted.items():
                self.counts[bisect.bisect_left(self.bounds, value)] += times
                self.total += value * times

    def collect(self):
        """The histogram's samples: cumulative buckets, count, sum, and when it was made (as ``Histogram``'s)."""
        with self._lock:
            counts, total = list(self.counts), self.total
        metric = Metric(self.name, self.documentation, "histogram")
        seen = 0
        for bound, count in zip(self.bounds, counts):
            seen += count
            metric.add_sample(self.name + "_bucket", {"le": floatToGoString(bound)}, seen)
        metric.add_sample(self.name + "_count", {}, seen)
        metric.add_sample(self.name + "_sum", {}, total)
        if os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1"):
            metric.add_sample(self.name + "_created", {}, self.created)
        yield metric


METRIC_NAMES = (
    "streamdedup_documents_total", "streamdedup_rejected_total", "streamdedup_replayed_total",
    "streamdedup_batch_duration_seconds", "streamdedup_candidates_per_document",
    "streamdedup_verifications_per_document", "streamdedup_consumer_lag_records",
    "streamdedup_last_commit_age_seconds", "streamdedup_index_documents", "streamdedup_index_clusters",
    "streamdedup_index_bytes", "streamdedup_index_map_used_bytes", "streamdedup_index_map_size_bytes",
    "streamdedup_index_map_limit_bytes", "streamdedup_ready",
)
