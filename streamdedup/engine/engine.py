"""The engine every front end shares: the index, the signing settings, and batch decisions.

A batch is decided in two calls with the front end's own step between them
(see ``checkpoint``): ``Engine.decide`` writes the decisions and the caller's
bookkeeping (input positions, checkpoints) into one index transaction and
leaves it prepared; ``Engine.commit`` commits it. So a batch's decisions and
the positions after it are committed together or not at all, and what the
batch sends out happens once, between the two.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..config import Config
from ..core.memory import collector_paused, return_freed_memory
from ..core.prepare import PreparedBatch, prepare
from ..core.records import Decision, Item
from ..core.signing import signing_config
from ..errors import IndexCorruptError
from ..faults import reached
from ..store.anchors import BatchAnchors
from ..store.bands import BandTables
from ..store.housekeeping import ForgetRequests, forget, rebuild_tables, sweep_expired
from ..store.index import Index, IndexSettings, IndexTxn, MapFull
from ..store.merge import SpreadMerge, generation_hash_keys, merge_slices, rewritten_bytes, serial_span
from ..store.mirror import RecentMirror, place_masks
from ..store.sites import provisional_pages, set_provisional_pages, write_rekeyed_many
from ..store.view import write_documents
from ..core.templates import TemplateSettings
from .decide import Together, decide_together
from .evidence import Asking, Evidence, OwnFirstPages, band_evidence, content_evidence, row_anchors, rows_settled
from .settings import DedupSettings
from .sitelearning import SiteTemplates, templates_in_advance

__all__ = ["Engine", "DecidedBatch", "index_settings", "MERGE_PACE"]

MERGE_PACE = 0.75  # a merge's steps are spread over this share of ``index.merge_every`` documents after it

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
    """One index and the settings to decide documents against it.

    A batch is decided in three steps (a vshard of a sharded deployment
    gathers from other vshards, and decides with the same function):

    1. *gather* (``evidence``): what the index says about each document of
       the batch: the earlier decision of a replay, the first document of
       each content, the kept documents under its band keys and their exact
       Jaccard;
    2. *decide* (``decide.decide_together``): a pure function of the batch
       and the evidence, in input order;
    3. *write* the batch's documents and their band keys.
    """

    def __init__(self, config: Config, state: Optional[str] = None, readonly: bool = False,
                 clock: Callable[[], float] = time.time):
        wanted = None if readonly else signing_config(config)
        self.index = Index(index_settings(config, state), wanted, readonly=readonly, adopt_bands=not config.lsh.bands)
        self.signing = self.index.signing
        self.settings = DedupSettings.of(config, self.signing)
        self.template_settings = TemplateSettings.from_fingerprint(self.signing.templates)
        self.templates = SiteTemplates(self.template_settings, self.signing) if self.template_settings.enabled else None
        self.sweep_interval_s = config.index.sweep_interval_s
        self._next_sweep = 0.0
        self.requests = ForgetRequests(self.index.path)
        self.clock = clock
        self.merge_every = config.index.merge_every
        self.bands = BandTables(self.index, 0 if readonly else config.index.band_filter_mb << 20,
                                config.index.band_filter_max_mb << 20)
        self._merge: Optional[SpreadMerge] = None  # the merge under way, a step after each batch (``_merge_along``)
        with self.index.read() as txn:
            self.mirror = RecentMirror.load(txn)
            counters = dict(txn.counters)
        if counters["merging"] and not readonly:  # a merge was under way: entries both merged and mirrored
            if counters.get("merge_upto"):  # spread over batches: it goes on from the next slice or step
                self._merge = SpreadMerge(self.mirror, counters["merge_upto"], counters["merge_slices"],
                                          self.signing.bands, done=counters["merging"] - 1,
                                          sealed=counters["merged_upto"] >= counters["merge_upto"])
                self.bands.loaded_filter()  # as saved by the merge before (or, once sealed, by this one)
                if self.mirror.merging is not None:  # the slices written
                    span = serial_span(self.mirror.merging.serials)
                    with self.index.read() as txn:
                        self.bands.resuming(txn, span, counters["merge_upto"])
                    self.bands.holding(self.mirror.merging.slots, generation_hash_keys(self.mirror.merging), span)
            else:  # an earlier version's merge, in one go: done again whole
                self.merge_recent()

    def prepare(self, items: list[Item]) -> PreparedBatch:
        return prepare(items, self.signing)

    def decide(self, batch: PreparedBatch, bookkeeping: Optional[Bookkeeping] = None) -> DecidedBatch:
        """Decide a prepared batch in a new index transaction, with ``bookkeeping`` in it; leave it prepared.

        ``bookkeeping`` is called with the decisions before the batch's documents are written (again if the
        batch is decided again into a grown map, with the same decisions).
        """
        return self._decided(batch, self.clock(), bookkeeping)

    def _decided(self, batch: PreparedBatch, now: float, bookkeeping: Optional[Bookkeeping]) -> DecidedBatch:
        """``batch`` decided at ``now`` in a prepared transaction."""
        self.bands.loaded_filter()  # before the transaction: building it reads the index

        def work(txn: IndexTxn) -> list[Decision]:
            return self._decide_in(txn, batch, now, [self._first_round(txn, batch)], bookkeeping)

        txn, decisions = self.index.prepare(work)
        return DecidedBatch(batch, decisions, txn, now, work)

    @property
    def two_rounds(self) -> bool:
        """Whether a batch needs a second round of evidence: with site templates, pages are looked up by their
        content, which depends on which contents were seen before (round one); with retention, whether the
        first round's twins still match is asked after the look-ups by content."""
        return self.templates is not None or self.settings.retention_s > 0

    def _first_round(self, txn: IndexTxn, batch: PreparedBatch) -> Evidence:
        evidence = content_evidence(txn, self.mirror, batch, self.bands.hash_filter)
        if self.two_rounds:
            return evidence
        found = self._band_evidence(txn, batch, batch.keys, None, None, first_round=[evidence])
        found.replays, found.twins = evidence.replays, evidence.twins
        return found

    def _band_evidence(self, txn: IndexTxn, batch: PreparedBatch, lookup_keys, content, first,
                       now: Optional[float] = None, first_round: list = ()) -> Evidence:
        settings = self.settings
        cutoff = now - settings.retention_s if settings.retention_s > 0 and now is not None else None
        representatives = frozenset(twin[1] for e in first_round for twin in e.twins.values())
        asking = Asking(settings.threshold, settings.max_candidates, self.signing.min_shared, cutoff,
                        representatives, settings.excerpts if settings.excerpts.sampling else None,
                        rows_settled(first_round, settings.retention_s > 0))
        return band_evidence(txn, self.mirror, self.bands, batch, lookup_keys, content, first, asking)

    def _decide_in(self, txn: IndexTxn, batch: PreparedBatch, now: float, evidences: list[Evidence],
                   bookkeeping: Optional[Bookkeeping] = None) -> list[Decision]:
        """Decide ``batch`` from ``evidences`` (and the second round's) and write its documents in ``txn``.

        ``bookkeeping`` is called as soon as the decisions are made, before the documents are written: what
        it starts (the offline outputs' append) overlaps the writes.
        """
        lookup_keys, content, first = batch.keys, None, None
        if self.templates is not None:
            seen = _SeenContents(evidences).for_batch(batch)
            content = self.templates.content(txn, seen, batch)
            lookup_keys = seen.keys if seen.keys is not None else batch.keys
            first = OwnFirstPages(txn, self.signing)
        if self.two_rounds:
            own = self._band_evidence(txn, batch, lookup_keys, content, first, now, evidences)
            evidences = evidences + [own]
        together = decide_together(batch, evidences, self.settings, txn.counters.get("next_serial", 0) + 1, now,
                                   lookup_keys, content, lambda site: provisional_pages(txn, site))
        if bookkeeping is not None:
            bookkeeping(txn, together.decisions)
        for site, pages in together.provisional.items():
            set_provisional_pages(txn, site, pages)
        self._write_rekeyed(txn, together)
        self._write_anchors(txn, batch, together, content)
        txn.after_commit.append(self._write_own(txn, batch, together, lookup_keys))
        return together.decisions

    def _write_anchors(self, txn: IndexTxn, batch: PreparedBatch, together: Together, content) -> None:
        """Excerpts: the anchors of the batch's kept documents."""
        excerpts = self.settings.excerpts
        if not excerpts.sampling:
            return
        anchors = BatchAnchors(txn, excerpts.max_postings, row_anchors(batch, content, excerpts))
        for record, row in together.records.values():
            if record is not None and record.kept:
                anchors.kept(row, record.serial)
        anchors.flush()

    def _write_rekeyed(self, txn: IndexTxn, together: Together) -> None:
        """The band keys of the batch's first pages, rekeyed in it."""
        write_rekeyed_many(txn, together.rekeyed)

    def _write_own(self, txn: IndexTxn, batch: PreparedBatch, together: Together, lookup_keys):
        pairs = list(together.records.values())
        records = [record for record, _ in pairs]
        id_keys = batch.id_keys
        idents = [id_keys[row] for _, row in pairs]
        kept_rows = {row: record.serial for record, row in pairs if record.kept}
        masks = place_masks(together.filed)
        placed = {record.serial: (row, masks[row]) for record, row in pairs if not record.kept and masks[row]} \
            if any(masks) else {}
        slots, rows, _ = batch.sorted_slots(lookup_keys)  # the decision's, kept
        return write_documents(txn, self.mirror, records, idents, kept_rows, batch.shingles, lookup_keys,
                               together.serials, placed, (slots, rows))

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
        self._merge_along()
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
        self._finish_merge()  # forget changes the mirror: no generation of it half merged
        return self.index.write(lambda txn: forget(txn, self.mirror, self.bands, ids))

    def between_batches(self) -> None:
        """What the writer does between batches: pending forget requests, a slice of the retention sweep."""
        self.requests.serve(self.forget)
        self.sweep()

    def sweep(self, budget: int = 20000) -> int:
        """One bounded slice of the retention sweep, if retention is on and one is due; documents expired."""
        if self.settings.retention_s <= 0 or self.clock() < self._next_sweep or self._merge is not None:
            return 0  # during a merge, not yet: what a sweep expires changes no lookup (``evidence._unexpired``)
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
        counted: dict = {}
        learned, hosts = templates_in_advance(batches, self.template_settings, counted)
        return self.index.write(lambda txn: self.templates.seed(txn, learned, hosts, counted))

    def rebuild(self) -> dict:
        """Re-derive the lookup tables from the records (``check --fix``)."""
        self._finish_merge()
        self.bands.rebuilding()
        result = self.index.write(lambda txn: rebuild_tables(txn, self.bands))
        if self.templates is not None:
            self.templates.forget_cache()
        with self.index.read() as txn:
            self.mirror = RecentMirror.load(txn)
        return result

    def merge_recent(self) -> None:
        """Move every recent document's lookup keys into the hash-keyed tables now (see ``store.merge``)."""
        self._finish_merge()
        if self.mirror.documents:
            self._start_merge()
            self._finish_merge()
        self.bands.wait_saved()

    def _merge_along(self) -> None:
        """After a batch committed: the merge under way a step further, as far as the documents decided since it
        began say (its steps spread over ``MERGE_PACE`` of ``index.merge_every`` documents), and a new one begun
        once ``index.merge_every`` documents are mirrored. Lookups find the same whatever the pace."""
        merge = self._merge
        if merge is not None:
            steps = merge.steps
            pace = max(1, int(MERGE_PACE * self.merge_every))
            due = min(steps, -(-steps * self.mirror.documents // pace))
            while self._merge is not None and steps - self._merge.steps_left < due:
                self._merge_step()
            if self.mirror.documents >= self.merge_every:
                self._finish_merge()  # the next generation is full (batches larger than the pace allows)
        if self._merge is None and self.mirror.documents >= self.merge_every:
            self._start_merge()
            self._merge_step()  # its first slice says on disk that it began: a restart goes on with it

    def _start_merge(self) -> None:
        self.bands.loaded_filter()  # loaded (or built) before the tables change
        upto, serials = self.mirror.last_serial, self.mirror.serials
        table_bytes = self.index.database_bytes()["bands"]
        if len(serials):  # the bytes of the run it writes into
            with self.index.read() as txn:
                table_bytes = rewritten_bytes(txn, table_bytes, int(serials.min()), upto)
        slices = merge_slices(table_bytes, self.signing.bands)
        self.mirror.freeze()
        self._merge = SpreadMerge(self.mirror, upto, slices, self.signing.bands)

    def _finish_merge(self) -> None:
        """Every step left of the merge under way, now."""
        while self._merge is not None:
            self._merge_step()

    def _merge_step(self) -> None:
        """One transaction of the merge under way: its next slice, or its finish."""
        merge = self._merge
        if merge.done < merge.slices:
            def work(txn: IndexTxn) -> None:
                self.bands.holding(*merge.write_slice(txn, self.bands))  # before lookups can meet them

            self.index.write(work)
            merge.slice_committed()
            reached("merge-slice")
            return
        done = self.index.write(lambda txn: merge.finish(txn, merge.chunk))
        if not merge.sealed:  # the generation is merged (``merged_upto``): out of memory, the filter saved
            merge.sealed = True
            self.mirror.merged()
            self.bands.saved()
            return_freed_memory()  # the generation merged and the merge's page buffers (``bench/growth.py``)
        if done:
            self._merge = None

    def close(self) -> None:
        self.bands.wait_saved()
        self.index.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SeenContents:
    """What ``SiteTemplates.content`` asks of a batch: whether a content was decided before (in any index, from
    the first round's twins), and the lookup keys it settles on."""

    def __init__(self, evidences: list[Evidence]):
        self._first: dict[int, int] = {}
        for evidence in evidences:
            for row, twin in evidence.twins.items():
                self._first[row] = min(self._first.get(row, twin[0]), twin[0])
        self._rows: dict[bytes, int] = {}
        self.keys = None

    def for_batch(self, batch: PreparedBatch) -> "_SeenContents":
        self._rows = {content: row for row, content in enumerate(batch.contents) if row in self._first}
        return self

    def serial_of_content(self, content: bytes) -> Optional[int]:
        row = self._rows.get(content)
        return None if row is None else self._first[row]

    def use_band_keys(self, keys) -> None:
        self.keys = keys
