"""Excerpt anchors: a sample of each kept document's content shingles, to find what a document is an excerpt of.

One dupsort table, ``anchors``: key a content shingle hash (8 B) chosen by
``core.excerpts.anchors_of``, value the serial of a kept document (8 B).
Choosing by hash keeps the choice independent of the document: an excerpt
and its source choose the same anchors among the shingles they share, so
a document whose content is mostly inside an earlier one shares most of
its anchors with it, however long that one is.

A batch writes its kept documents' anchors in its own transaction (sorted,
one ``putmulti``) and sees those of its own earlier documents through
``BatchAnchors``.
"""

from __future__ import annotations

import itertools

import numpy as np

from .index import IndexTxn, u64

__all__ = ["BatchAnchors", "remove_anchors", "anchor_entries"]


class BatchAnchors:
    """The anchor postings one batch reads, and the anchors its kept documents add."""

    def __init__(self, txn: IndexTxn, max_postings: int):
        self.txn = txn
        self.max_postings = max_postings
        self._added: dict[int, list[int]] = {}  # anchor -> serials kept earlier in this batch
        self._pairs: list[tuple[bytes, bytes]] = []

    def postings(self, anchors: np.ndarray) -> np.ndarray:
        """The kept documents holding each anchor (the earliest ``max_postings`` per anchor), one per pair."""
        cursor = self.txn.txn.cursor(db=self.txn.dbs["anchors"])
        serials: list[int] = []
        cap = self.max_postings
        for anchor in anchors.tolist():
            found = []
            if cursor.set_key(u64(anchor)):
                found = [int.from_bytes(v, "big") for v in itertools.islice(cursor.iternext_dup(), cap)]
            found.extend(self._added.get(anchor, ())[: max(0, cap - len(found))])
            serials.extend(found)
        return np.array(serials, dtype=np.int64)

    def add(self, serial: int, anchors: np.ndarray) -> None:
        value = u64(serial)
        for anchor in anchors.tolist():
            self._added.setdefault(anchor, []).append(serial)
            self._pairs.append((u64(anchor), value))

    def flush(self) -> None:
        """Write the batch's anchors into its transaction."""
        if self._pairs:
            self.txn.txn.cursor(db=self.txn.dbs["anchors"]).putmulti(sorted(self._pairs), dupdata=True)
            self._pairs = []


def remove_anchors(txn: IndexTxn, serial: int, candidates: np.ndarray) -> None:
    """Delete a document's anchors; ``candidates`` holds them (its stored shingles chosen as anchors)."""
    value = u64(serial)
    for anchor in candidates.tolist():
        txn.delete("anchors", u64(anchor), value)


def anchor_entries(txn: IndexTxn):
    """Every (anchor, serial) of the table."""
    for key, value in txn.table_entries("anchors"):
        yield int.from_bytes(key, "big"), int.from_bytes(value, "big")
