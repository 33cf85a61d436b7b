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

import numpy as np

from .index import IndexTxn, u64
from .candidates import Hits, with_extra_candidates

__all__ = ["BatchAnchors", "remove_anchors", "anchor_entries"]

_NONE = np.zeros(0, dtype=np.int64)


class BatchAnchors:
    """The anchor postings of one batch's documents, read at once, and the anchors its kept documents add.

    An anchor holds at most ``max_postings`` documents (the earliest): one
    found on more pages than that is common text, and tells nothing of where
    an excerpt comes from; no more documents are written under it.
    """

    def __init__(self, txn: IndexTxn, max_postings: int, anchors: list[np.ndarray]):
        self.txn = txn
        self.max_postings = max_postings
        self._anchors = anchors
        lengths = np.array([len(a) for a in anchors], dtype=np.int64)
        flat = np.concatenate(anchors) if anchors else np.zeros(0, np.uint64)
        by_key = np.argsort(flat, kind="stable")
        asked, rows = flat[by_key], np.repeat(np.arange(len(anchors)), lengths)[by_key]
        self._keys, self._serials = self._fetched(asked)
        self._committed = Hits.found(asked, rows, len(anchors), self._keys, self._serials)
        self._earlier = self._earlier_holders(asked, rows)
        self._kept: dict[int, int] = {}  # batch row -> serial, for the batch's kept documents

    def _fetched(self, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(anchor, serial) of every stored posting of the sorted ``asked`` anchors, in table order."""
        unique = asked[np.concatenate(([True], asked[1:] != asked[:-1]))] if len(asked) else asked
        if len(unique) == 0:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        cursor = self.txn.txn.cursor(db=self.txn.dbs["anchors"])
        keys = unique.astype(">u8").view(np.dtype((np.void, 8))).tolist()
        found = cursor.getmulti(keys, dupdata=True, dupfixed_bytes=8, keyfixed=True)
        rows = np.frombuffer(found, dtype=[("key", ">u8"), ("serial", ">u8")])
        return rows["key"].astype(np.uint64), rows["serial"].astype(np.int64)

    def _earlier_holders(self, asked: np.ndarray, rows: np.ndarray) -> dict[int, list[tuple[list[int], int, int]]]:
        """For each row, the runs of rows sharing one of its anchors: (run, its place in it, room left).

        Room is what ``max_postings`` leaves of an anchor after its stored
        postings: the first kept rows of a run that fit are its holders, as
        if each had been committed alone (so batch boundaries change nothing).
        """
        earlier: dict[int, list[tuple[list[int], int, int]]] = {}
        if len(asked) < 2:
            return earlier
        same = asked[1:] == asked[:-1]
        if not same.any():
            return earlier
        edges = np.flatnonzero(np.diff(np.concatenate(([False], same, [False])).astype(np.int8)))
        firsts, lasts = edges[::2], edges[1::2]
        stored = (np.searchsorted(self._keys, asked[firsts], "right")
                  - np.searchsorted(self._keys, asked[firsts], "left"))
        for first, last, room in zip(firsts.tolist(), lasts.tolist(), (self.max_postings - stored).tolist()):
            if room <= 0:
                continue
            run = sorted(rows[first : last + 1].tolist())
            for place in range(1, len(run)):
                earlier.setdefault(run[place], []).append((run, place, room))
        return earlier

    def postings(self) -> tuple[np.ndarray, np.ndarray]:
        """The stored (anchor, serial) postings under the batch's anchors."""
        return self._keys, self._serials

    def holders(self, row: int, need: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Kept documents (stored, or earlier in this batch) holding anchors of row ``row``, and how many.

        Empty when none can hold ``need`` of them (most rows: asked without a look at each holder).
        """
        serials, shared = self._committed.of(row)
        runs = self._earlier.get(row)
        if not runs:
            return (serials, shared) if len(shared) and shared.max() >= need else (_NONE, _NONE)
        if len(runs) + (shared.max() if len(shared) else 0) < need:
            return _NONE, _NONE
        kept = self._kept
        extra = []
        for run, place, room in runs:
            extra.extend([kept[r] for r in run[:place] if r in kept][:room])
        return with_extra_candidates(serials, shared, extra)

    def anchors(self, row: int) -> np.ndarray:
        return self._anchors[row]

    def kept(self, row: int, serial: int) -> None:
        """Row ``row`` was kept as ``serial``: its anchors are written (on those not yet full)."""
        self._kept[row] = serial

    def flush(self) -> None:
        """Write the kept documents' anchors into the batch's transaction."""
        if not self._kept:
            return
        rows = list(self._kept)
        anchors = np.concatenate([self._anchors[r] for r in rows])
        serials = np.repeat(np.array([self._kept[r] for r in rows], dtype=np.int64),
                            [len(self._anchors[r]) for r in rows])
        order = np.lexsort((serials, anchors))  # per anchor, in decision order
        anchors, serials = anchors[order], serials[order]
        stored = np.searchsorted(self._keys, anchors, "right") - np.searchsorted(self._keys, anchors, "left")
        starts = np.flatnonzero(np.concatenate(([True], anchors[1:] != anchors[:-1])))
        rank = np.arange(len(anchors)) - np.repeat(starts, np.diff(np.append(starts, len(anchors))))
        fits = stored + rank < self.max_postings
        anchors, serials = anchors[fits], serials[fits]
        order = np.arange(len(anchors))
        pairs = np.empty(len(order), dtype=[("key", ">u8"), ("serial", ">u8")])
        pairs["key"], pairs["serial"] = anchors[order], serials[order]
        rows8 = pairs.view(np.dtype([("key", "V8"), ("value", "V8")]))
        self.txn.txn.cursor(db=self.txn.dbs["anchors"]).putmulti(
            list(zip(rows8["key"].tolist(), rows8["value"].tolist())), dupdata=True)
        self._kept = {}


def remove_anchors(txn: IndexTxn, serial: int, candidates: np.ndarray) -> None:
    """Delete a document's anchors; ``candidates`` holds them (its stored shingles chosen as anchors)."""
    value = u64(serial)
    for anchor in candidates.tolist():
        txn.delete("anchors", u64(anchor), value)


def anchor_entries(txn: IndexTxn):
    """Every (anchor, serial) of the table."""
    for key, value in txn.table_entries("anchors"):
        yield int.from_bytes(key, "big"), int.from_bytes(value, "big")
