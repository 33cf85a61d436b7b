"""One shard's engine: its index, its evidence on a batch, and a batch decided together written into it."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ...config import Config
from ...core.prepare import PreparedBatch
from ...core.records import Document
from ...errors import ConfigError, IndexUnusableError
from ...store.index import IndexTxn
from ...store.lookup import write_documents
from ..engine import Bookkeeping, DecidedBatch, Engine
from .evidence import Evidence, ShardPlace, evidence_of
from .together import Together, decide_together

__all__ = ["ShardEngine", "unsupported_in_shards"]

PLACE = "shard"  # the index's position entry naming its shard: [number, count]


def unsupported_in_shards(config: Config) -> list[str]:
    """The settings a sharded deployment does not decide as one worker yet, as ``section.key = value``."""
    found = []
    if config.templates.enabled:
        found.append("templates.enabled = true")
    if config.excerpts.enabled:
        found.append("excerpts.enabled = true")
    if config.index.retention_days > 0:
        found.append(f"index.retention_days = {config.index.retention_days}")
    return found


class ShardEngine(Engine):
    """Shard ``place`` of a sharded index: an ordinary index holding the documents the shard owns."""

    def __init__(self, config: Config, place: ShardPlace, state: Optional[str] = None,
                 clock: Callable[[], float] = time.time):
        unsupported = unsupported_in_shards(config)
        if unsupported:
            raise ConfigError(f"a sharded deployment does not support {', '.join(unsupported)} yet: set "
                              f"{' and '.join(u.split(' =')[0] + ' to its off value' for u in unsupported)} "
                              "in the configuration of every role, or run the single worker")
        super().__init__(config, state, clock=clock)
        self.place = place
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

    def evidence(self, batch: PreparedBatch) -> Evidence:
        """This shard's evidence on ``batch``, against its last committed state."""
        self.bands.loaded_filter()
        settings = self.settings
        with self.index.read() as txn:
            return evidence_of(txn, self.mirror, self.bands, batch, self.place, settings.threshold,
                               settings.max_candidates, self.signing.min_shared)

    def owned(self, batch: PreparedBatch) -> list[bool]:
        """Which of the batch's items this shard stores and sends out: documents by their id hash, the
        rejected by their place in the batch."""
        place = self.place
        return [place.owns(batch.id_keys[row]) if isinstance(item, Document) else i % place.count == place.number
                for i, (item, row) in enumerate(zip(batch.items, batch.row))]

    def decide_together(self, batch: PreparedBatch, evidences: list[Evidence], now: float,
                        bookkeeping: Optional[Bookkeeping] = None) -> DecidedBatch:
        """Decide ``batch`` from every shard's evidence and write this shard's documents, in a prepared
        transaction (``Engine.commit`` commits it)."""
        self.bands.loaded_filter()
        settings = self.settings

        def work(txn: IndexTxn):
            together = decide_together(batch, evidences, settings.threshold, settings.max_candidates,
                                       self.signing.min_shared, txn.counters.get("next_serial", 0) + 1, now)
            txn.after_commit.append(self._write_own(txn, batch, together))
            if bookkeeping is not None:
                bookkeeping(txn, together.decisions)
            return together.decisions

        txn, decisions = self.index.prepare(work)
        return DecidedBatch(batch, decisions, txn, now, work)

    def _write_own(self, txn: IndexTxn, batch: PreparedBatch, together: Together):
        inserted, kept_rows, shingles = [], {}, {}
        for record, row in together.records:
            ident = batch.id_keys[row]
            if not self.place.owns(ident):
                continue
            inserted.append((record, ident))
            if record.kept:
                kept_rows[row] = record.serial
                shingles[record.serial] = batch.shingles.of(row)
        return write_documents(txn, self.mirror, inserted, kept_rows, shingles, batch.keys, together.serials)
