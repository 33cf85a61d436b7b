"""The engine every front end shares: the index, the signing settings, and batch decisions.

A batch is decided in two calls with the front end's own step between them
(see ``checkpoint``): ``Engine.decide`` writes the decisions and the caller's
bookkeeping (input positions, checkpoints) into one index transaction and
leaves it prepared; ``Engine.commit`` commits it. So a batch's decisions and
the positions after it are committed together or not at all, and what the
batch sends out happens once, between the two.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional

from ..config import Config
from ..core.memory import return_freed_memory
from ..core.prepare import PreparedBatch, prepare
from ..core.records import Decision, Item
from ..core.signing import signing_config
from ..errors import IndexCorruptError
from ..faults import reached
from ..store.bands import BandTables
from ..store.housekeeping import ForgetRequests, forget, rebuild_tables, sweep_expired
from ..store.index import Index, IndexSettings, IndexTxn, MapFull
from ..store.merge import finish_merge, merge_slice, merge_slices
from ..store.mirror import RecentMirror
from ..core.templates import TemplateSettings
from .decide import DedupSettings, ExcerptSettings, decide
from .sitelearning import SiteTemplates, templates_in_advance

__all__ = ["Engine", "DecidedBatch", "collector_paused", "index_settings"]

Bookkeeping = Callable[[IndexTxn, list[Decision]], None]  # the front end's own writes: positions, checkpoints


@dataclass
class DecidedBatch:
    """A batch decided in a prepared index transaction: final once ``Engine.commit`` commits it."""

    batch: PreparedBatch
    decisions: list[Decision]
    txn: IndexTxn
    now: float  # the decision time, the same if the batch has to be decided again
    work: Callable[[IndexTxn], list[Decision]]  # what the transaction does: run again after the map grew

    def abort(self) -> None:
        """Throw the batch's transaction away: the index stays as before the batch."""
        self.txn.abort()


def index_settings(config: Config, path: Optional[str] = None) -> IndexSettings:
    return IndexSettings(
        path=os.path.abspath(path or config.index.path),
        map_size=config.index.map_size_mb << 20,
        sync=config.index.sync,
    )


class Engine:
    """One index and the settings to decide documents against it."""

    def __init__(self, config: Config, state: Optional[str] = None, readonly: bool = False,
                 clock: Callable[[], float] = time.time):
        wanted = None if readonly else signing_config(config)
        self.index = Index(index_settings(config, state), wanted, readonly=readonly, adopt_bands=not config.lsh.bands)
        self.signing = self.index.signing
        excerpts = config.excerpts
        self.settings = DedupSettings(self.signing, config.lsh.threshold, config.lsh.max_candidates,
                                      config.index.retention_days * 86400.0,
                                      ExcerptSettings(self.signing.excerpt_sampling, excerpts.containment,
                                                      excerpts.min_shingles, excerpts.max_postings))
        self.template_settings = TemplateSettings.from_fingerprint(self.signing.templates)
        self.templates = SiteTemplates(self.template_settings, self.signing) if self.template_settings.enabled else None
        self.sweep_interval_s = config.index.sweep_interval_s
        self._next_sweep = 0.0
        self.requests = ForgetRequests(self.index.path)
        self.clock = clock
        self.merge_every = config.index.merge_every
        self.bands = BandTables(self.index, 0 if readonly else config.index.band_filter_mb << 20)
        with self.index.read() as txn:
            self.mirror = RecentMirror.load(txn)
            interrupted = txn.counters["merging"]
        if interrupted and not readonly:  # a crash between a merge's slices: entries both merged and mirrored
            self.merge_recent()

    def prepare(self, items: list[Item]) -> PreparedBatch:
        return prepare(items, self.signing)

    def decide(self, batch: PreparedBatch, bookkeeping: Optional[Bookkeeping] = None) -> DecidedBatch:
        """Decide a prepared batch in a new index transaction, with ``bookkeeping`` in it; leave it prepared."""
        return self._decided(batch, self.clock(), bookkeeping)

    def _decided(self, batch: PreparedBatch, now: float, bookkeeping: Optional[Bookkeeping]) -> DecidedBatch:
        self.bands.loaded_filter()  # before the transaction: building it reads the index

        def work(txn: IndexTxn) -> list[Decision]:
            decisions = decide(txn, batch, self.settings, now, self.mirror, self.bands, self.templates)
            if bookkeeping is not None:
                bookkeeping(txn, decisions)
            return decisions

        txn, decisions = self.index.prepare(work)
        return DecidedBatch(batch, decisions, txn, now, work)

    def commit(self, decided: DecidedBatch) -> list[Decision]:
        """Commit a decided batch durably; returns its decisions.

        A commit that fills the map is recovered as a restart recovers a batch
        whose index commit never happened: the map grows, and the same batch
        is decided again against the same index state, which gives the same
        decisions, and committed. Nothing the caller did between ``decide``
        and this call is done again.
        """
        while True:
            try:
                decided.txn.commit()
                break
            except MapFull:
                self.index.grow_map()
                decided = self._decided_again(decided)
        if self.mirror.documents >= self.merge_every:
            self.merge_recent()
        return decided.decisions

    def _decided_again(self, decided: DecidedBatch) -> DecidedBatch:
        self.bands.loaded_filter()
        txn, decisions = self.index.prepare(decided.work)
        again = DecidedBatch(decided.batch, decisions, txn, decided.now, decided.work)
        if again.decisions != decided.decisions:
            again.abort()
            raise IndexCorruptError("a batch decided again after the map grew came out differently; the index "
                                    "is as of the batch before: run `streamdedup check` and report this")
        return again

    def decide_batch(self, batch: PreparedBatch) -> list[Decision]:
        """Decide a batch and commit it at once (nothing leaves the process in between)."""
        with collector_paused():
            return self.commit(self.decide(batch))

    def forget(self, ids: list[str]):
        """Remove documents (every version of each id); see ``housekeeping``."""
        return self.index.write(lambda txn: forget(txn, self.mirror, self.bands, ids))

    def between_batches(self) -> None:
        """What the writer does between batches: pending forget requests, a slice of the retention sweep."""
        self.requests.serve(self.forget)
        self.sweep()

    def sweep(self, budget: int = 20000) -> int:
        """One bounded slice of the retention sweep, if retention is on and one is due; documents expired."""
        if self.settings.retention_s <= 0 or self.clock() < self._next_sweep:
            return 0
        cutoff = self.clock() - self.settings.retention_s
        expired, done = self.index.write(lambda txn: sweep_expired(txn, self.mirror, self.bands, cutoff, budget))
        if done:
            self._next_sweep = self.clock() + self.sweep_interval_s
        return expired

    def learn_templates_first(self, batches) -> int:
        """Settle the sites of ``batches`` (all of an offline run's input) before deciding any; see
        ``sitelearning.templates_in_advance``. Returns how many sites were settled so."""
        if self.templates is None:
            return 0
        learned, hosts = templates_in_advance(batches, self.template_settings)
        return self.index.write(lambda txn: self.templates.seed(txn, learned, hosts))

    def rebuild(self) -> dict:
        """Re-derive the lookup tables from the records (``check --fix``)."""
        self.bands.rebuilding()
        result = self.index.write(lambda txn: rebuild_tables(txn, self.bands))
        if self.templates is not None:
            self.templates.forget_cache()
        with self.index.read() as txn:
            self.mirror = RecentMirror.load(txn)
        return result

    def merge_recent(self) -> None:
        """Move the recent documents' lookup keys into the hash-keyed tables (see ``lookup``)."""
        if not self.mirror.documents:
            return
        self.bands.loaded_filter()  # loaded (or built) before the tables change
        slices = merge_slices(self.index.database_bytes()["bands"], self.signing.bands)
        for number in range(slices):
            self.index.write(lambda txn: merge_slice(txn, self.mirror, self.bands, number, slices))
            reached("merge-slice")
        self.index.write(lambda txn: finish_merge(txn, self.mirror))
        self.bands.inserted(self.mirror.keys)
        self.mirror.clear()
        return_freed_memory()  # the mirror and the merge's page buffers (measured in ``bench/growth.py``)

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def collector_paused():
    """Python's cycle collector off while a batch is decided and committed, on again after.

    A batch makes tens of thousands of short-lived containers (records,
    decisions, rows of table writes), which set the collector off dozens of
    times per batch, and each full pass walks every object the process holds:
    12-15% of the offline loop's time, measured. None of them form cycles;
    refcounting frees them. Pausing is process-wide, for one batch at a time.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
