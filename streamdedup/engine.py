"""The engine every front end shares: the index, the signing settings, and batch decisions.

``Engine.decide_batch`` runs ``decide`` and the caller's own bookkeeping (input
positions, checkpoints) in the *same* index write transaction, so a batch's
decisions and the positions after it are committed together or not at all.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from .config import Config
from .decide import DedupSettings, PreparedBatch, decide, prepare
from .index import Index, IndexSettings, IndexTxn
from .lsh import optimal_params
from .records import Decision, Item
from .signing import SigningConfig

__all__ = ["Engine", "signing_config"]

Bookkeeping = Callable[[IndexTxn, list[Decision]], None]


def signing_config(config: Config) -> SigningConfig:
    """The signing configuration a new index gets: bands x rows as configured, else chosen."""
    signing, lsh = config.signing, config.lsh
    if lsh.bands:
        bands, rows = lsh.bands, lsh.rows
    else:
        bands, rows = optimal_params(lsh.threshold, signing.num_perm, lsh.fp_weight, lsh.fn_weight)
    return SigningConfig(shingle=signing.shingle, k=signing.k, num_perm=signing.num_perm, seed=signing.seed,
                         bands=bands, rows=rows)


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
        self.settings = DedupSettings(self.signing, config.lsh.threshold, config.lsh.max_candidates)
        self.clock = clock

    def prepare(self, items: list[Item]) -> PreparedBatch:
        return prepare(items, self.signing)

    def decide_batch(self, batch: PreparedBatch, bookkeeping: Optional[Bookkeeping] = None) -> list[Decision]:
        """Decide a prepared batch and commit it, with ``bookkeeping`` in the same transaction."""
        now = self.clock()

        def work(txn: IndexTxn) -> list[Decision]:
            decisions = decide(txn, batch, self.settings, now)
            if bookkeeping is not None:
                bookkeeping(txn, decisions)
            return decisions

        return self.index.write(work)

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
