"""A band key's places: its first ``lsh.max_candidates`` probers, whatever each is decided (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from streamdedup.core.lsh import band_slots
from streamdedup.store.candidates import RekeyedKeys, file_prober, filed_places, room_under


def _batch(rng, rows, bands, values):
    """Band slots of ``rows`` documents whose keys are drawn from few ``values`` (keys shared a lot)."""
    keys = rng.integers(0, values, size=(rows, bands), dtype=np.uint64)
    return band_slots(np.arange(bands, dtype=np.uint64)[None, :], keys)


@pytest.mark.parametrize("seed", range(12))
def test_the_batch_at_once_files_the_same_places_as_document_by_document(seed):
    """``filed_places`` (every row of a batch at once, for writing) takes the places ``file_prober`` takes row by
    row while deciding: the committed entries first, then the batch's probers in order, kept or not; a replay
    takes none; and only the kept probers that took a place are proposed."""
    rng = np.random.default_rng(seed)
    per_key = int(rng.integers(1, 5))
    slots = _batch(rng, 60, 4, 6)
    probers = rng.random(60) > 0.1
    kept = rng.random(60) > 0.5
    committed = rng.choice(np.unique(slots), size=20)  # entries already stored, some slots more than once
    room = room_under(slots.ravel(), committed, per_key)
    proposed: dict[int, list[int]] = {}
    expected = np.zeros(slots.shape, dtype=bool)
    for row in range(len(slots)):
        if not probers[row]:
            continue
        before = dict(room)
        file_prober(proposed, slots[row].tolist(), row, bool(kept[row]), room, per_key)
        for band, slot in enumerate(slots[row].tolist()):
            expected[row, band] = before.get(slot, per_key) > 0
    assert np.array_equal(_filed(slots, probers, committed, per_key), expected)
    for slot, rows in proposed.items():
        assert rows == [r for r in range(len(slots)) if expected[r][slots[r] == slot].any() and kept[r]]
    stored = {s: int(np.count_nonzero(committed == s)) for s in np.unique(committed).tolist()}
    for slot in np.unique(slots).tolist():
        taken = int(np.count_nonzero(expected[slots == slot]))
        assert taken == max(0, min(per_key - stored.get(slot, 0), int(np.count_nonzero(probers[(slots == slot).any(1)]))))


def test_a_closed_key_files_nobody_and_a_duplicate_holds_its_place():
    slots = np.array([[5], [5], [5], [5]], dtype=np.uint64)
    room = room_under(slots.ravel(), np.array([5], dtype=np.uint64), 3)  # one committed entry: two places left
    proposed: dict[int, list[int]] = {}
    for row, kept in enumerate([False, True, True, True]):
        file_prober(proposed, [5], row, kept, room, 3)
    assert proposed == {5: [1]}  # row 0, a duplicate, took a place; row 1 the last; rows 2 and 3 none
    assert _filed(slots, np.ones(4, dtype=bool), np.array([5], dtype=np.uint64), 3)[:, 0].tolist() == \
        [True, True, False, False]


def _filed(slots, probers, committed, per_key):
    """``filed_places`` of a batch whose band slots are ``slots`` (rows x bands)."""
    order = np.argsort(slots.ravel())
    rows, bands = order // slots.shape[1], order % slots.shape[1]
    return filed_places(slots.ravel()[order], rows, bands, slots.shape, probers, committed, per_key)



def test_rekeyed_pages_are_found_once_per_shared_band_with_their_latest_keys():
    rng = np.random.default_rng(5)
    rekeyed, latest = RekeyedKeys(), {}
    assert not rekeyed
    for step in range(40):
        serial = int(rng.integers(1, 12))  # some serials rekeyed again: their latest keys count, in their first place
        keys = rng.integers(0, 4, 8).astype(np.uint64)
        rekeyed[serial] = latest[serial] = keys
        if step % 3 == 0:  # rekeyed again with the same keys (the decision after the evidence): nothing moves
            rekeyed[serial] = keys.copy()
        row = rng.integers(0, 4, 8).astype(np.uint64)
        expected = [s for s, own in latest.items() for _ in range(int(np.count_nonzero(own == row)))]
        assert rekeyed.candidates(row) == expected
    assert rekeyed
