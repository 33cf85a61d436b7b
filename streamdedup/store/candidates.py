"""Candidates from band keys: which kept documents a batch's rows find, and the cap on a key's answer.

Pure functions over arrays of band slots (``core.lsh.band_slots``) and the
serials found under them, shared by the single index (``view``) and the
vshards (``engine.vshards``): a rule about candidates is written once.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import numpy as np

try:
    from ..core import _kernel
except ImportError:  # built by ``pip install`` when a C compiler is there; numpy gives the same below
    _kernel = None

__all__ = ["Hits", "SharedKeys", "RekeyedKeys", "keys_shared_within", "chosen_candidates", "file_prober", "filed_places",
           "with_extra_candidates", "earliest_of_each_key", "earliest_of_runs", "room_under", "ranges"]


def with_extra_candidates(serials: np.ndarray, shared: np.ndarray, extra: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Candidates (ascending serials, shared bands of each) with ``extra`` serials added, each one band more."""
    if not len(extra):
        return serials, shared
    counts = dict(zip(serials.tolist(), shared.tolist()))
    for serial in extra:
        counts[serial] = counts.get(serial, 0) + 1
    ordered = sorted(counts)
    return np.array(ordered, dtype=np.int64), np.array([counts[s] for s in ordered], dtype=np.int64)


class RekeyedKeys:
    """The band keys of the pages rekeyed in a batch (serial -> its latest keys, in the order first rekeyed),
    and which of them a row's keys find: a look-up a band, in the pages' (band, key) slots.

    A site that settles rekeys every kept page it had while learning, and
    every later row of the batch asks which of them its keys meet: compared
    with all of them at once, that cost the rekeyed pages times the bands a
    row; looked up by slot, it costs the bands.
    """

    def __init__(self):
        self._keys: dict[int, list[int]] = {}  # serial -> its latest keys, in the order first rekeyed
        self._order: dict[int, int] = {}  # serial -> its place in that order
        self._serials: dict[tuple[int, int], dict[int, None]] = {}  # (band, key) -> serials whose latest keys hold it
        self._held: dict[int, int] = {}  # key -> in how many of those slots: most rows meet none of them

    def __setitem__(self, serial: int, keys: np.ndarray) -> None:
        """A page's keys, rekeyed (again): only the bands whose key changed move (a page is rekeyed once by the
        evidence and again by the decision with the same keys, and keeps most of them when its template moves;
        which serials a slot holds, not their order in it, makes ``candidates``)."""
        held, serials = self._held, self._serials
        before, keys = self._keys.get(serial, ()), keys.tolist()
        self._keys[serial] = keys
        self._order.setdefault(serial, len(self._order))
        if keys == before:
            return
        for slot in enumerate(before):
            if slot[0] < len(keys) and keys[slot[0]] == slot[1]:
                continue
            del serials[slot][serial]
            held[slot[1]] -= 1
            if not held[slot[1]]:
                del held[slot[1]]
        for slot in enumerate(keys):
            if slot[0] < len(before) and before[slot[0]] == slot[1]:
                continue
            serials.setdefault(slot, {})[serial] = None
            held[slot[1]] = held.get(slot[1], 0) + 1

    def __bool__(self) -> bool:
        return bool(self._keys)

    def candidates(self, keys: np.ndarray, also: Optional[np.ndarray] = None) -> list[int]:
        """The rekeyed pages, each once per band whose key it shares with ``keys`` (or, given ``also``, a second
        key of each band: with either), in the order first rekeyed."""
        keys = keys.tolist()
        seconds = also.tolist() if also is not None else None
        held = self._held.keys()
        if held.isdisjoint(keys) and (seconds is None or held.isdisjoint(seconds)):
            return []
        found: dict[int, int] = {}
        get = self._serials.get
        for band, key in enumerate(keys):
            for serial in get((band, key), ()):
                found[serial] = found.get(serial, 0) + 1
            if seconds is not None and seconds[band] != key:  # a page has one key a band: never both
                for serial in get((band, seconds[band]), ()):
                    found[serial] = found.get(serial, 0) + 1
        if len(found) > 1:
            order = self._order
            found = {serial: found[serial] for serial in sorted(found, key=order.__getitem__)}
        return [serial for serial, bands in found.items() for _ in range(bands)]


def chosen_candidates(serials: Sequence[int], shared: Sequence[int], extra: Iterable[int], min_shared: int,
                      matchable: Optional[Callable[[int], bool]], limit: int) -> tuple[list[int], int]:
    """The candidates a document verifies, and how many it has before ``limit``.

    ``serials`` (sharing ``shared`` bands each) and the ``extra`` serials
    (each one band more every time it comes), those sharing at least
    ``min_shared`` bands and ``matchable`` (None: all), the ``limit``
    sharing the most (ties: the earliest), ascending unless cut to
    ``limit``. In plain Python: a document has a handful, and numpy's cost
    per call on arrays that small is several times the work.
    """
    counts = dict(zip(serials, shared))
    for serial in extra:
        counts[serial] = counts.get(serial, 0) + 1
    if min_shared > 1:
        counts = {serial: n for serial, n in counts.items() if n >= min_shared}
    if matchable is not None:
        counts = {serial: n for serial, n in counts.items() if matchable(serial)}
    chosen = sorted(counts)
    if len(chosen) > limit:
        chosen = sorted(chosen, key=lambda serial: -counts[serial])[:limit]  # stable: the earliest of a tie first
    return chosen, len(counts)


class Hits:
    """The committed kept documents sharing band keys with each document of a batch."""

    _NONE = np.zeros(0, np.int64)

    def __init__(self, serials: np.ndarray, shared: np.ndarray, bounds: list[int]):
        self.serials, self.shared, self.bounds = serials, shared, bounds
        self._at_least: dict[int, "Hits"] = {}  # ``at_least``'s answers: the evidence and the decision ask alike
        self._lists: Optional[tuple[list[int], list[int]]] = None  # serials and shared as lists (``listed``)

    def of(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Serials sharing a band with document ``row`` (ascending), and how many bands each."""
        begin, end = self.bounds[row], self.bounds[row + 1]
        if begin == end:
            return self._NONE, self._NONE
        return self.serials[begin:end], self.shared[begin:end]

    def listed(self, row: int) -> tuple[list[int], list[int]]:
        """``of(row)`` as lists: parts of the batch's made once (rows are decided one by one, in Python)."""
        if self._lists is None:
            self._lists = (self.serials.tolist(), self.shared.tolist())
        begin, end = self.bounds[row], self.bounds[row + 1]
        return self._lists[0][begin:end], self._lists[1][begin:end]

    def at_least(self, shared: int) -> "Hits":
        """These hits without the documents that share fewer than ``shared`` bands with their row.

        Most hits of a row are such chance meetings (one band of many); a
        row left with none is then surely kept without a look, unless other
        candidates come and add a band to them (pages rekeyed in the batch).
        """
        if shared <= 1 or len(self.shared) == 0:
            return self
        found = self._at_least.get(shared)
        if found is None:
            keep = self.shared >= shared
            before = np.zeros(len(keep) + 1, dtype=np.int64)
            np.cumsum(keep, out=before[1:])
            found = Hits(self.serials[keep], self.shared[keep], before[np.asarray(self.bounds)].tolist())
            self._at_least[shared] = found
        return found

    @classmethod
    def found(cls, asked: np.ndarray, rows: np.ndarray, n: int, found_keys: np.ndarray, found_serials: np.ndarray,
              per_key: Optional[int] = None):
        """From the batch's sorted keys ``asked`` (each of document ``rows[i]``) and the (key, serial) rows found.

        ``per_key`` keeps only the earliest so many serials of each key (None: all). A key that many kept
        documents hold (a crawler trap's template, a hot bucket) would otherwise hand each document of
        the batch all of them, and the work per document would grow with the trap.
        """
        if len(found_keys) == 0:
            return cls(cls._NONE, cls._NONE, [0] * (n + 1))
        if _kernel is not None:
            return cls._found_by_kernel(asked, rows, n, found_keys, found_serials, per_key)
        lo, counts = _places(asked, found_keys)
        if per_key is not None and _most_of_one_key(lo, counts) > per_key:
            found_keys, found_serials = earliest_of_each_key(found_keys, found_serials, per_key)
            lo, counts = _places(asked, found_keys)
        doc = rows[ranges(lo, counts)]
        serial = np.repeat(found_serials, counts)
        pairs, shared = np.unique((doc << 40) | serial, return_counts=True)
        bounds = np.searchsorted(pairs >> 40, np.arange(n + 1)).tolist()
        return cls(pairs & ((1 << 40) - 1), shared, bounds)


    @classmethod
    def _found_by_kernel(cls, asked, rows, n, found_keys, found_serials, per_key):
        """``found`` by the compiled kernel (``_kernel.hits``): the same pairs, counted per row in one pass."""
        arrays = (np.ascontiguousarray(asked, dtype=np.uint64), np.ascontiguousarray(rows, dtype=np.int64))
        found = (np.ascontiguousarray(found_keys, dtype=np.uint64), np.ascontiguousarray(found_serials, dtype=np.int64))
        serials, shared, bounds, most = _kernel.hits(arrays[0], arrays[1], n, *found)
        if per_key is not None and most > per_key:
            found = earliest_of_each_key(found[0], found[1], per_key)
            serials, shared, bounds, _ = _kernel.hits(arrays[0], arrays[1], n, *found)
        return cls(np.frombuffer(serials, dtype=np.int64), np.frombuffer(shared, dtype=np.int64),
                   np.frombuffer(bounds, dtype=np.int64).tolist())


def _places(asked: np.ndarray, found_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each found key is in the sorted ``asked`` keys: its first place and how many places (0: not
    asked). Searched this way round, as found keys are a few of those asked."""
    lo = np.searchsorted(asked, found_keys, "left")
    return lo, np.searchsorted(asked, found_keys, "right") - lo


def _most_of_one_key(lo: np.ndarray, counts: np.ndarray) -> int:
    """The most (key, serial) rows found of any one asked key (``_places``)."""
    asked = lo[counts > 0]
    return int(np.bincount(asked).max()) if len(asked) else 0


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1`` for every i, concatenated."""
    return np.repeat(starts, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))


def room_under(slots: np.ndarray, found_slots: np.ndarray, per_key: int) -> dict[int, int]:
    """How many more documents may probe each of ``slots`` and be filed under it: ``per_key`` less the
    committed entries found under it (``found_slots``, one per entry), for the slots some found ones hold."""
    if not len(slots) or not len(found_slots):
        return {}
    shared = np.sort(slots)  # few, made unique: each found entry is placed among them (found ones are many)
    shared = shared[np.concatenate(([True], shared[1:] != shared[:-1]))]  # np.unique imports numpy.ma at first
    place = np.minimum(np.searchsorted(shared, found_slots), len(shared) - 1)
    hit = shared[place] == found_slots
    count = np.bincount(place[hit], minlength=len(shared))
    held = np.flatnonzero(count)
    return dict(zip(shared[held].tolist(), np.maximum(per_key - count[held], 0).tolist()))


def file_prober(kept_by_key: dict[int, list[int]], slots, serial: int, kept: bool, room: dict[int, int],
                per_key: int) -> None:
    """A document of the batch probes its ``slots`` that later rows share: under each slot still open
    (``room`` left, else ``per_key``) it takes a place, and a kept one is proposed to the later rows.

    This is the one meaning of the per-key limit, whatever the batch. With
    ``lsh.cap = "kept"`` only kept documents probe (the caller files no
    other): a key proposes its earliest ``per_key`` kept documents. With
    ``"probes"`` every document that looks the key up probes (all but
    replays and exact copies, decided by their id and content first),
    whatever it is then decided, and the key proposes the kept ones among
    its first ``per_key``: which those are depends on the order alone, not
    on a decision still to be made, so a key's owner in a deployment that
    splits the band tables can answer before the decisions before it are
    known.
    """
    for slot in slots:
        left = room.get(slot, per_key)
        if left > 0:
            room[slot] = left - 1
            if kept:
                kept_by_key.setdefault(slot, []).append(serial)


def filed_places(asked: np.ndarray, rows: np.ndarray, bands: np.ndarray, shape: tuple[int, int],
                 probers: np.ndarray, found_slots: np.ndarray, per_key: int) -> np.ndarray:
    """Which band slots of a batch take a place (``file_prober``), as a rows x bands mask: those of the
    ``probers`` rows still open when the row probes them, counting the committed entries found under each
    (``found_slots``, one per entry) and the batch's earlier probers. ``asked``, ``rows``, ``bands``: the
    batch's band slots sorted (``lsh.sorted_slots``), the row and band of each."""
    filed = np.zeros(shape, dtype=bool)
    probing = probers[rows]
    asked, rows, bands = asked[probing], rows[probing], bands[probing]
    if not len(asked):
        return filed
    rank = np.zeros(len(asked), dtype=np.int64)
    same = asked[1:] == asked[:-1]
    if same.any():  # a slot several rows probe: its places go in row order (few: sort those alone)
        in_run = np.zeros(len(asked), dtype=bool)
        in_run[1:] |= same
        in_run[:-1] |= same
        shared = np.flatnonzero(in_run)
        order = shared[np.lexsort((rows[shared], asked[shared]))]
        ordered = asked[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        rank[order] = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    if len(found_slots):
        held, counts = np.unique(found_slots, return_counts=True)
        place = np.minimum(np.searchsorted(held, asked), len(held) - 1)
        rank += np.where(held[place] == asked, counts[place], 0)
    filed[rows, bands] = rank < per_key
    return filed


def keys_shared_within(asked: np.ndarray, rows: np.ndarray) -> "SharedKeys":
    """For each row, its band keys that another row of the batch has too (``asked``: the batch's keys
    sorted, ``rows[i]`` the row of ``asked[i]``); most rows of a batch have none."""
    same = asked[1:] == asked[:-1]
    in_run = np.zeros(len(asked), dtype=bool)
    in_run[1:] |= same
    in_run[:-1] |= same
    return SharedKeys(rows[in_run], asked[in_run])


class SharedKeys:
    """Rows and the band keys each shares with another row of its batch (``keys_shared_within``), read as
    a dict row -> keys; a row's list is made when asked for, as few rows are looked at one by one."""

    def __init__(self, rows: np.ndarray, keys: np.ndarray):
        order = np.argsort(rows, kind="stable")
        rows, self._keys = rows[order], keys[order]
        starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1]))) if len(rows) else order
        ends = np.append(starts[1:], len(rows))
        self._at = dict(zip(rows[starts].tolist(), zip(starts.tolist(), ends.tolist())))

    @classmethod
    def none(cls) -> "SharedKeys":
        """No row shares a key (a batch whose candidates were gathered outside it)."""
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64))

    def __contains__(self, row: int) -> bool:
        return row in self._at

    def __iter__(self):
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def get(self, row: int, default=()):
        at = self._at.get(row)
        return default if at is None else self._keys[at[0]:at[1]].tolist()

    def slots(self) -> np.ndarray:
        """Every band slot some row shares with another (with repeats)."""
        return self._keys


def earliest_of_runs(runs: list[tuple[np.ndarray, np.ndarray]], limit: int) -> tuple[np.ndarray, np.ndarray]:
    """``earliest_of_each_key`` of the (keys, serials) runs' entries together: merged by the kernel when every
    run is sorted by key, then serial already (``_kernel.earliest_runs``: the same pairs), else sorted."""
    runs = [(np.ascontiguousarray(k, dtype=np.uint64), np.ascontiguousarray(s, dtype=np.int64))
            for k, s in runs if len(k)]
    if _kernel is not None and runs:
        merged = _kernel.earliest_runs(runs, limit)
        if merged is not None:
            return np.frombuffer(merged[0], dtype=np.uint64), np.frombuffer(merged[1], dtype=np.int64)
    if not runs:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    return earliest_of_each_key(np.concatenate([k for k, _ in runs]), np.concatenate([s for _, s in runs]), limit)


def earliest_of_each_key(keys: np.ndarray, serials: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(key, serial) pairs sorted by key, then serial, each key keeping its first ``limit`` (the smallest serials)."""
    if _kernel is not None and len(keys) and int(serials.min()) >= 0:  # two stable radix sorts: lexsort's order
        keys, serials = np.array(keys, dtype=np.uint64), np.array(serials, dtype=np.int64)
        _kernel.sort_entries(serials, keys)
        _kernel.sort_entries(keys, serials)
    else:
        order = np.lexsort((serials, keys))
        keys, serials = keys[order], serials[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    rank = np.arange(len(keys)) - np.repeat(starts, np.diff(np.append(starts, len(keys))))
    kept = rank < limit
    return keys[kept], serials[kept]
