"""A vshard's state in memory (``MemoryState``), and the parts of it both forms share.

A vshard reads and changes its state through one interface, which two
classes have: ``MemoryState`` here (the simulator's, fast, lost with the
process) and ``store.vshardstate.LmdbState`` (durable: each epoch's changes
in one LMDB transaction, committed with the caller's input positions). Both
hold the same things: as home, records, kept documents' shingles, id hashes
and clusters' members; as owner, each band key's place holders
(``store.mirror.KeyPlaces``: shaped as the single index holds its recent
keys, sorted arrays a sorted run is merged into, looked up for a whole
epoch at once, so no Python work is done per key of a document)
and each content's documents in order. A home's cache of closed keys
(``ClosedKeys``) is in memory in both; the LMDB form keeps a copy of it
too, since what it holds decides which probes a home sends.
"""

from __future__ import annotations

import numpy as np

from typing import Any, Optional

from ...core.shingle import ShingleBatch
from ...core.verify import jaccard
from ...store.index import DocRecord
from ...store.mirror import KeyPlaces
from ...store.vshardstate import holder, holder_homes, holder_serials

__all__ = ["ClosedKeys", "KeyPlaces", "MemoryState", "holder", "holder_serials", "holder_homes"]

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

    def add(self, closed: dict[int, np.ndarray]) -> tuple[dict[int, np.ndarray], list[int]]:
        """Cache closed keys: slot -> its holders. The keys cached now (those not cached yet), and the slots
        dropped to make room."""
        added = {slot: holders for slot, holders in closed.items() if slot not in self._holders}
        for slot, holders in added.items():
            self._holders[slot] = holders
            self._size += len(holders)
        dropped = []
        while self._size > self.limit or len(self._holders) > self.keys:
            dropped.append(next(iter(self._holders)))
            self._size -= len(self._holders.pop(dropped[-1]))
        self._slots = np.array(sorted(self._holders), dtype=np.uint64)
        return added, dropped

    def cached(self, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` are cached."""
        if not len(self._slots):
            return np.zeros(len(slots), dtype=bool)
        at = np.minimum(np.searchsorted(self._slots, slots), len(self._slots) - 1)
        return self._slots[at] == slots

    def holders(self, slot: int) -> np.ndarray:
        return self._holders[slot]

    def reopened(self, slots: np.ndarray) -> list[int]:
        """Forget these keys: places of theirs were freed (``forget``), so they are open again. The slots that
        were cached."""
        dropped = [slot for slot in np.asarray(slots, dtype=np.uint64).tolist() if slot in self._holders]
        for slot in dropped:
            self._size -= len(self._holders.pop(slot))
        if dropped:
            self._slots = np.array(sorted(self._holders), dtype=np.uint64)
        return dropped


class MemoryState:
    """A vshard's state in Python containers (``store.vshardstate.LmdbState`` has the same methods). Epochs
    change it as they run; ``commit`` only counts them and keeps the caller's metadata."""

    def __init__(self) -> None:
        self._records: dict[int, DocRecord] = {}
        self._shingles: dict[int, np.ndarray] = {}
        self._ids: dict[bytes, list[int]] = {}
        self._members: dict[int, list[int]] = {}
        self._firsts: dict[bytes, list[list]] = {}  # content -> [serial, home, still in a cluster] of each
        self.places = KeyPlaces()
        self.epochs_done = 0
        self._meta: dict[str, Any] = {}

    def begin(self) -> None:
        """Nothing to do: changes are made in place."""

    def commit(self, epochs_done: int, meta: dict[str, Any]) -> None:
        self.epochs_done, self._meta = epochs_done, dict(meta)

    def meta(self) -> dict[str, Any]:
        return dict(self._meta)

    def close(self) -> None:
        """Nothing to do: the state goes with the object."""

    def record(self, serial: int) -> DocRecord:
        return self._records[serial]

    def put_record(self, record: DocRecord) -> None:
        self._records[record.serial] = record

    def put_documents(self, records: list[DocRecord], ids: list[bytes], shingles: ShingleBatch,
                      kept: dict[int, int], members: list[tuple[int, int]]) -> None:
        for record, ident in zip(records, ids):
            self._records[record.serial] = record
            self._ids.setdefault(ident, []).append(record.serial)
        self._shingles.update((serial, shingles.of(row)) for serial, row in kept.items())
        for cluster, serial in members:
            self._members.setdefault(cluster, []).append(serial)

    def delete_record(self, serial: int) -> None:
        del self._records[serial]

    def shingles(self, serial: int) -> Optional[np.ndarray]:
        return self._shingles.get(serial)

    def similarities(self, owns: list[np.ndarray], serials: list[int]) -> list[Optional[float]]:
        found: list[Optional[float]] = []
        for own, serial in zip(owns, serials):
            stored = self._shingles.get(serial)
            found.append(None if stored is None else jaccard(own, stored))
        return found

    def record_ids(self, serials: list[int]) -> dict[int, str]:
        return {serial: self._records[serial].id for serial in serials}

    def pop_shingles(self, serial: int) -> np.ndarray:
        return self._shingles.pop(serial)

    def serials_of_id(self, ident: bytes) -> list[int]:
        return sorted(self._ids.get(ident, ()))

    def serials_of_ids(self, idents: list[bytes]) -> list[list[int]]:
        return [self.serials_of_id(ident) for ident in idents]

    def remove_id(self, ident: bytes, serial: int) -> None:
        self._ids[ident].remove(serial)
        if not self._ids[ident]:
            del self._ids[ident]

    def remove_member(self, cluster: int, serial: int) -> None:
        self._members[cluster].remove(serial)

    def pop_members(self, cluster: int) -> list[int]:
        return self._members.pop(cluster, [])

    def first_of(self, content: bytes) -> Optional[tuple[int, int, bool]]:
        held = self._firsts.get(content)
        return tuple(held[0]) if held else None

    def firsts_of(self, contents: list[bytes]) -> list[Optional[tuple[int, int, bool]]]:
        return [self.first_of(content) for content in contents]

    def add_contents(self, contents: dict[bytes, list[list]]) -> None:
        for content, entries in contents.items():
            self._firsts.setdefault(content, []).extend(list(entry) for entry in entries)

    def drop_content(self, content: bytes, serial: int) -> None:
        held = self._firsts.get(content)
        if held is None:
            return
        held[:] = [entry for entry in held if entry[0] != serial]
        if not held:
            del self._firsts[content]

    def leave_cluster(self, content: bytes, serial: int) -> None:
        for entry in self._firsts.get(content, ()):
            if entry[0] == serial:
                entry[2] = False

    def closed_keys(self) -> dict[int, np.ndarray]:
        return {}

    def closed_changed(self, added: dict[int, np.ndarray], dropped: list[int]) -> None:
        """Nothing to do: the cache itself is the vshard's."""
