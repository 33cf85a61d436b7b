"""What a vshard holds for the keys it owns: each band key's place holders, each content's first document.

In memory here (the LMDB form comes with the Kafka runtime), shaped as the
single index holds its recent keys (``store.mirror``): sorted arrays a
sorted run is merged into, looked up for a whole epoch at once, so no
Python work is done per key of a document.
"""

from __future__ import annotations

import numpy as np

from ...store.candidates import ranges
from ...store.mirror import SortedEntries

__all__ = ["KeyPlaces", "holder", "holder_serials", "holder_homes"]

_HOME_BITS = 16  # a holder is its serial and its home in one number: serial << 16 | home
_SETTLE_AT = 1 << 20  # recent entries folded into the settled ones past this many (amortized: each moves twice)


def holder(serials: np.ndarray, homes: np.ndarray) -> np.ndarray:
    return (np.asarray(serials, dtype=np.int64) << _HOME_BITS) | np.asarray(homes, dtype=np.int64)


def holder_serials(holders: np.ndarray) -> np.ndarray:
    return holders >> _HOME_BITS


def holder_homes(holders: np.ndarray) -> np.ndarray:
    return holders & ((1 << _HOME_BITS) - 1)


class KeyPlaces:
    """(band slot, holder) entries of the keys a vshard owns, sorted by slot, then by serial (the order the
    places were taken in). Two levels, so that taking in an epoch's places costs what the epoch brings, not
    what the store holds: recent entries merged in place, folded into the settled ones now and then."""

    def __init__(self) -> None:
        self._settled = SortedEntries()
        self._recent = SortedEntries()

    def __len__(self) -> int:
        return len(self._settled) + len(self._recent)

    def holders(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sorted unique ``slots``: where each slot's holders start in the returned array, how many it has,
        and the holders (slot by slot, each slot's in the order its places were taken)."""
        settled = _found(self._settled.entries(), slots)
        recent = _found(self._recent.entries(), slots)
        counts = settled[1] + recent[1]
        starts = (np.cumsum(counts) - counts).astype(np.int64)
        found = np.empty(int(counts.sum()), dtype=np.int64)
        found[ranges(starts, settled[1])] = self._settled.entries()[1][ranges(settled[0], settled[1])]
        found[ranges(starts + settled[1], recent[1])] = self._recent.entries()[1][ranges(recent[0], recent[1])]
        return starts, counts, found

    def remove(self, slots: np.ndarray, holders: np.ndarray) -> np.ndarray:
        """Free the places of these (slot, holder) entries (``forget``); the slots freed, sorted."""
        gone = set(zip(np.asarray(slots, dtype=np.uint64).tolist(), np.asarray(holders, dtype=np.int64).tolist()))
        freed = set()
        asked = np.array(sorted({slot for slot, _ in gone}), dtype=np.uint64)
        for level in (self._settled, self._recent):
            keys, values = level.entries()
            lo, hi = np.searchsorted(keys, asked, "left"), np.searchsorted(keys, asked, "right")
            keep = np.ones(len(keys), dtype=bool)
            for begin, end in zip(lo.tolist(), hi.tolist()):
                for at in range(begin, end):
                    if (int(keys[at]), int(values[at])) in gone:
                        keep[at] = False
                        freed.add(int(keys[at]))
            if not keep.all():
                level.keep(keep)
        return np.array(sorted(freed), dtype=np.uint64)

    def add(self, slots: np.ndarray, holders: np.ndarray) -> None:
        """Take in places given after every one held (``slots`` sorted, a slot's holders in order)."""
        if not len(slots):
            return
        self._recent.merge((np.asarray(slots, dtype=np.uint64), np.asarray(holders, dtype=np.int64)))
        if len(self._recent) > max(_SETTLE_AT, len(self._settled) // 4):
            self._settled.merge(self._recent.entries())
            self._recent.clear()


def _found(entries: tuple[np.ndarray, np.ndarray], slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``slots`` starts among sorted ``entries``, and how many entries it has."""
    keys = entries[0]
    if not len(keys):
        return np.zeros(len(slots), dtype=np.int64), np.zeros(len(slots), dtype=np.int64)
    begin = np.searchsorted(keys, slots, "left")
    return begin.astype(np.int64), (np.searchsorted(keys, slots, "right") - begin).astype(np.int64)


class ClosedKeys:
    """A home's copy of band keys that are closed (their ``max_candidates`` places all taken, so their
    holders never change): probes of them are answered here, not sent to their owner. A key in half the
    documents then costs its owner nothing once closed, and its holders cross the network once per home.

    Bounded: past ``keys`` keys or ``limit`` holders, the keys cached first are dropped (they are asked of
    the owner again, and the answer is the same, so what is cached never changes a decision). Hot keys are
    few; with a small ``max_candidates`` most keys close, and are probed too rarely to be worth more room.
    """

    def __init__(self, keys: int = 4096, limit: int = 1 << 20):
        self.keys, self.limit = keys, limit
        self._holders: dict[int, np.ndarray] = {}  # in the order cached
        self._size = 0
        self._slots = np.zeros(0, dtype=np.uint64)  # sorted, for lookups of a whole epoch at once

    def add(self, closed: dict[int, np.ndarray]) -> None:
        """Cache closed keys: slot -> its holders."""
        for slot, holders in closed.items():
            if slot not in self._holders:
                self._holders[slot] = holders
                self._size += len(holders)
        while self._size > self.limit or len(self._holders) > self.keys:
            first = next(iter(self._holders))
            self._size -= len(self._holders.pop(first))
        self._slots = np.array(sorted(self._holders), dtype=np.uint64)

    def cached(self, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` are cached."""
        if not len(self._slots):
            return np.zeros(len(slots), dtype=bool)
        at = np.minimum(np.searchsorted(self._slots, slots), len(self._slots) - 1)
        return self._slots[at] == slots

    def holders(self, slot: int) -> np.ndarray:
        return self._holders[slot]

    def reopened(self, slots: np.ndarray) -> None:
        """Forget these keys: places of theirs were freed (``forget``), so they are open again."""
        dropped = [slot for slot in np.asarray(slots, dtype=np.uint64).tolist() if slot in self._holders]
        for slot in dropped:
            self._size -= len(self._holders.pop(slot))
        if dropped:
            self._slots = np.array(sorted(self._holders), dtype=np.uint64)
