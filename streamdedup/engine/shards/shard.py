"""One shard's engine: its index, its evidence on a batch, and a batch decided together written into it."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ...config import Config
from ...core.prepare import PreparedBatch
from ...core.records import id_key
from ...errors import IndexUnusableError
from ...store.housekeeping import ForgetReport, dissolve, forget, serials_with_id
from ...store.index import IndexTxn
from ..engine import Bookkeeping, DecidedBatch, Engine, Exchange
from ..evidence import Evidence, ShardPlace, item_owners

__all__ = ["ShardEngine"]

PLACE = "shard"  # the index's position entry naming its shard: [number, count]


class ShardEngine(Engine):
    """Shard ``place`` of a sharded index: an ordinary index holding the documents the shard owns."""

    def __init__(self, config: Config, place: ShardPlace, state: Optional[str] = None,
                 clock: Callable[[], float] = time.time):
        super().__init__(config, state, clock=clock)
        self.place = place
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
        (``decide.decide_together``). With two rounds, ``exchange`` publishes this shard's second-round
        evidence and returns every shard's (it may be called again for the same batch)."""
        self._batch_time = max(self._batch_time, now)
        return self._decided(batch, now, bookkeeping, evidences, exchange)
