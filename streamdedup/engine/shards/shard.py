"""One shard's engine: its index, its evidence on a batch, and a batch decided together written into it."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ...config import Config
from ...core.prepare import PreparedBatch
from ...core.records import id_key
from ...errors import IndexUnusableError
from ...store.anchors import BatchAnchors
from ...store.housekeeping import ForgetReport, dissolve, forget, serials_with_id
from ...store.index import IndexTxn
from ...store.view import write_documents
from ...store.sites import provisional_pages, remove_rekeyed, set_provisional_pages, write_rekeyed
from ..engine import Bookkeeping, DecidedBatch, Engine
from .evidence import (Asking, Evidence, OwnFirstPages, ShardPlace, band_evidence, content_evidence, item_owners,
                       row_anchors)
from .together import Rules, Together, decide_together

__all__ = ["ShardEngine"]

PLACE = "shard"  # the index's position entry naming its shard: [number, count]


Exchange = Callable[[Evidence], list[Evidence]]  # publish this shard's evidence, return every shard's


class ShardEngine(Engine):
    """Shard ``place`` of a sharded index: an ordinary index holding the documents the shard owns."""

    def __init__(self, config: Config, place: ShardPlace, state: Optional[str] = None,
                 clock: Callable[[], float] = time.time):
        super().__init__(config, state, clock=clock)
        self.place = place
        excerpts = self.settings.excerpts if self.settings.excerpts.sampling else None
        self.rules = Rules(self.signing, self.settings.threshold, self.settings.max_candidates, excerpts)
        self._batch_time = 0.0
        self._owned: Optional[tuple] = None  # (batch, owned(batch)) of the last batch asked
        self.clock = lambda: self._batch_time or clock()  # the retention sweep follows the batches' time
        try:
            self.index.write(self._claim)
        except BaseException:
            self.close()
            raise

    def _claim(self, txn: IndexTxn) -> None:
        """Name the index as this shard at its first start; refuse it as another shard or a single index."""
        wanted = [self.place.number, self.place.count]
        held = txn.position(PLACE)
        if held is None and txn.counters.get("documents", 0):
            raise IndexUnusableError(f"{self.index.path} is a single worker's index, not a shard's: give each "
                                     "shard a new index folder (backfill the input into the sharded deployment)")
        if held is not None and list(held) != wanted:
            raise IndexUnusableError(f"{self.index.path} holds shard {held[0]} of {held[1]}, not shard "
                                     f"{wanted[0]} of {wanted[1]}: give each shard its own folder, and keep "
                                     "shards.count as the deployment was made with")
        if held is None:
            txn.set_position(PLACE, wanted)

    @property
    def two_rounds(self) -> bool:
        """Whether a batch needs a second round of evidence: with site templates, pages are looked up by their
        content, which depends on which contents every shard has seen (round one); with retention, whether
        the first round's twins still match is asked of their representatives' shards."""
        return self.templates is not None or self.settings.retention_s > 0

    def evidence(self, batch: PreparedBatch) -> Evidence:
        """This shard's first-round evidence on ``batch``, against its last committed state (with the band
        lookups too when there is no second round)."""
        self.bands.loaded_filter()
        with self.index.read() as txn:
            evidence = content_evidence(txn, self.mirror, batch, self.place)
            if self.two_rounds:
                return evidence
            found = self._band_evidence(txn, batch, batch.keys, None, None)
        found.replays, found.twins = evidence.replays, evidence.twins
        return found

    def _band_evidence(self, txn: IndexTxn, batch: PreparedBatch, lookup_keys, content, first,
                       now: Optional[float] = None, first_round: list = ()) -> Evidence:
        settings = self.settings
        cutoff = now - settings.retention_s if settings.retention_s > 0 and now is not None else None
        representatives = frozenset(twin[1] for e in first_round for twin in e.twins.values())
        asking = Asking(settings.threshold, settings.max_candidates, self.signing.min_shared, cutoff,
                        representatives, self.rules.excerpts)
        return band_evidence(txn, self.mirror, self.bands, batch, lookup_keys, content, first, asking)

    def forget_evidence(self, ids: list[str]) -> list:
        """Forgetting across shards, round one: [serial, kept] of every version of the ids this shard holds."""
        with self.index.read() as txn:
            own = [doc_id for doc_id in ids if self.place.owns(id_key(doc_id))]
            return [[serial, txn.record(serial).kept] for doc_id in own
                    for serial in serials_with_id(txn, self.mirror, doc_id)]

    def forget_together(self, ids: list[str], found: list, bookkeeping: Optional[Callable[[IndexTxn], None]] = None
                        ) -> ForgetReport:
        """Forget ``ids`` everywhere: this shard's versions of them, and its members of the clusters whose
        representative another shard forgets (``found``: every shard's ``forget_evidence``)."""
        mine = [doc_id for doc_id in ids if self.place.owns(id_key(doc_id))]
        elsewhere = sorted(serial for serial, kept in found if kept and not self._holds(serial))

        def work(txn: IndexTxn) -> ForgetReport:
            report = forget(txn, self.mirror, self.bands, mine)
            for serial in elsewhere:
                report.released += dissolve(txn, serial)
                report.dissolved += 1
            if bookkeeping is not None:
                bookkeeping(txn)
            return report

        return self.index.write(work)

    def _holds(self, serial: int) -> bool:
        with self.index.read() as txn:
            return txn.has_record(serial)

    def owned(self, batch: PreparedBatch) -> list[bool]:
        """Which of the batch's items this shard stores and sends out (``item_owners``; the answer for the last
        batch asked is kept)."""
        if self._owned is None or self._owned[0] is not batch:
            self._owned = (batch, (item_owners(batch, self.place.count) == self.place.number).tolist())
        return self._owned[1]

    def decide_together(self, batch: PreparedBatch, evidences: list[Evidence], now: float,
                        exchange: Optional[Exchange] = None, bookkeeping: Optional[Bookkeeping] = None) -> DecidedBatch:
        """Decide ``batch`` from every shard's evidence and write this shard's documents, in a prepared
        transaction (``Engine.commit`` commits it); the decisions of the items it does not own may be None
        (``decide_together``). With two rounds, ``exchange`` publishes this shard's second-round evidence
        and returns every shard's (it may be called again for the same batch)."""
        self.bands.loaded_filter()
        self._batch_time = max(self._batch_time, now)
        owned = self.owned(batch)

        def work(txn: IndexTxn):
            lookup_keys, content, first, every = batch.keys, None, None, evidences
            if self.templates is not None:
                seen = _SeenContents(evidences).for_batch(batch)
                content = self.templates.content(txn, seen, batch)
                lookup_keys = seen.keys if seen.keys is not None else batch.keys
                first = OwnFirstPages(txn, self.signing)
            if self.two_rounds:
                every = evidences + exchange(self._band_evidence(txn, batch, lookup_keys, content, first, now,
                                                                 evidences))
            together = decide_together(batch, every, self.rules, txn.counters.get("next_serial", 0) + 1, now,
                                       lookup_keys, content, lambda site: provisional_pages(txn, site), owned)
            for site, pages in together.provisional.items():
                set_provisional_pages(txn, site, pages)
            self._write_rekeyed(txn, batch, together)
            self._write_anchors(txn, batch, together, content)
            txn.after_commit.append(self._write_own(txn, batch, together, lookup_keys))
            if bookkeeping is not None:
                bookkeeping(txn, together.decisions)
            return together.decisions

        txn, decisions = self.index.prepare(work)
        return DecidedBatch(batch, decisions, txn, now, work)

    def _write_anchors(self, txn: IndexTxn, batch: PreparedBatch, together: Together, content) -> None:
        """Excerpts: the anchors of this shard's kept documents of the batch."""
        if self.rules.excerpts is None:
            return
        anchors = BatchAnchors(txn, self.rules.excerpts.max_postings, row_anchors(batch, content, self.rules.excerpts))
        for record, row in together.records.values():
            if record is not None and record.kept and self.place.owns(batch.id_keys[row]):
                anchors.kept(row, record.serial)
        anchors.flush()

    def _write_rekeyed(self, txn: IndexTxn, batch: PreparedBatch, together: Together) -> None:
        """The band keys of this shard's own first pages of the batch, rekeyed in it."""
        for serial, keys in together.rekeyed.items():
            if self.place.owns(batch.id_keys[together.records[serial][1]]):
                remove_rekeyed(txn, serial)
                write_rekeyed(txn, serial, keys)

    def _write_own(self, txn: IndexTxn, batch: PreparedBatch, together: Together, lookup_keys):
        inserted, kept_rows, shingles = [], {}, {}
        for record, row in together.records.values():
            ident = batch.id_keys[row]
            if not self.place.owns(ident):
                continue
            inserted.append((record, ident))
            if record.kept:
                kept_rows[row] = record.serial
                shingles[record.serial] = batch.shingles.of(row)
        return write_documents(txn, self.mirror, inserted, kept_rows, shingles, lookup_keys, together.serials)


class _SeenContents:
    """What ``SiteTemplates.content`` asks of a batch view: whether a content was decided before (in any
    shard, from the first round's twins), and the lookup keys it settles on."""

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
