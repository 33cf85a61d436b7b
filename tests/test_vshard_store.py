"""A vshard's state in LMDB (``store.vshardstate``): the same decisions as a single worker, whatever dies when.

The key-split deployment of ``test_vshards`` with each vshard's state in
LMDB under ``tmp_path`` (real files), committed after each epoch; vshards
die and start again from their folders in the middle of an epoch, at its
end before the commit, and between epochs, and must send again, byte for
byte, what they sent, and decide the same.
"""

from __future__ import annotations

import json

import pytest
from test_vshards import (
    NOW,
    _assert_forget_in_the_middle_as_by_one_worker,
    _assert_same_as_single_worker,
    _chains_and_ties,
    _config,
    _items,
)

from streamdedup.core import corpus
from streamdedup.core.signing import signing_config
from streamdedup.engine.engine import Engine
from streamdedup.engine.settings import DedupSettings
from streamdedup.engine.vshards import VShard
from streamdedup.errors import IncompatibleIndexError, IndexUnusableError
from streamdedup.store import vshardstate


def _settings(config):
    return DedupSettings.of(config, signing_config(config))


def _assert_restarts_changed_nothing(run):
    assert not run.differences, run.differences
    assert all(run.restarts[when] for when in ("mid-epoch", "uncommitted", "committed")), run.restarts


@pytest.mark.parametrize("vshards, processes", [(1, 1), (3, 2), (8, 4)])
def test_vshards_in_lmdb_decide_as_one_worker(tmp_path, vshards, processes):
    items = _items((doc.id, doc.text) for doc in corpus.generate(150, seed=vshards))
    run, expected = _assert_same_as_single_worker(tmp_path, items, vshards, processes, seed=vshards,
                                                  state=str(tmp_path / "vshards"), sync=False)
    assert sum(d.status == "duplicate" for d in expected) > 50


@pytest.mark.parametrize("vshards, largest, partitions", [(1, 8, 3), (3, 48, 1), (5, 200, 2)])
def test_vshards_dying_anywhere_decide_as_one_worker(tmp_path, vshards, largest, partitions):
    """Chains, ties, copies, replays and versions, with vshards dying in the middle of epochs, before their
    commits and between epochs: each, given its epoch's slice and messages again, sends what it sent."""
    items = _items(_chains_and_ties(seed=largest))
    run, _ = _assert_same_as_single_worker(tmp_path, items, vshards, 2, seed=vshards, largest=largest,
                                           partitions=partitions, state=str(tmp_path / "vshards"), sync=False,
                                           restarts=0.15)
    _assert_restarts_changed_nothing(run)


@pytest.mark.parametrize("max_candidates", [1, 3])
def test_hot_keys_and_the_closed_keys_cache_survive_restarts(tmp_path, max_candidates):
    """With a small cap most keys close and are answered from each home's cache, which decides what the home
    sends: the cache comes back with the state, so a restarted home sends the same probes."""
    items = _items((doc.id, doc.text) for doc in corpus.hot_keys(300, seed=5))
    run, _ = _assert_same_as_single_worker(tmp_path, items, 4, 2, seed=max_candidates,
                                           extra=[f"lsh.max_candidates={max_candidates}"],
                                           state=str(tmp_path / "vshards"), sync=False, restarts=0.15)
    _assert_restarts_changed_nothing(run)


@pytest.mark.parametrize("vshards", [1, 3])
def test_forget_in_the_middle_with_vshards_in_lmdb(tmp_path, vshards):
    run = _assert_forget_in_the_middle_as_by_one_worker(tmp_path, vshards, 2, state=str(tmp_path / "vshards"),
                                                        sync=False, restarts=0.15)
    assert not run.differences, run.differences
    assert sum(run.restarts.values()) > 0


def test_a_vshard_reopens_at_its_next_epoch_with_its_metadata(tmp_path):
    """A commit keeps the epoch and the caller's metadata; an epoch is refused until the one before is
    committed; a vshard closed before its commit comes back as of the epoch before."""
    config = _config(tmp_path)
    settings, folder = _settings(config), str(tmp_path / "v0")
    items = _items((f"doc-{i}", f"words of document number {i} and some more words") for i in range(30))
    vshard = VShard(0, 1, settings, folder, sync=False)
    assert vshard.epochs_done == 0 and vshard.meta() == {}
    for epoch, begin in enumerate((0, 10)):
        sent = vshard.slice(epoch, items[begin:begin + 10], list(range(begin + 1, begin + 11)),
                            (begin + 1, begin + 11), NOW)
        _deliver(vshard, sent)
        assert vshard.epochs_done == epoch + 1
        with pytest.raises(ValueError, match="commit"):
            vshard.slice(epoch + 1, [], [], (begin + 11, begin + 11), NOW)
        vshard.commit({"in": [{"partition": 0, "offset": begin + 10}]})
    with pytest.raises(ValueError, match="nothing to commit"):
        vshard.commit({})
    _deliver(vshard, vshard.slice(2, items[20:], list(range(21, 31)), (21, 31), NOW))
    third = vshard.decided[2]
    vshard.close()  # epoch 2 done, not committed: as if the process died
    vshard = VShard(0, 1, settings, folder, sync=False)
    assert vshard.epochs_done == 2 and vshard.meta() == {"in": [{"partition": 0, "offset": 20}]}
    _deliver(vshard, vshard.slice(2, items[20:], list(range(21, 31)), (21, 31), NOW))
    assert vshard.decided[2] == third
    vshard.close()


def test_a_vshard_state_refuses_another_vshard_count_or_settings(tmp_path):
    config = _config(tmp_path)
    folder = str(tmp_path / "v1")
    VShard(1, 4, _settings(config), folder, sync=False).close()
    for number, count, other in [(2, 4, config), (1, 8, config), (1, 4, _config(tmp_path, "lsh.threshold=0.9")),
                                 (1, 4, _config(tmp_path, "signing.k=4"))]:
        with pytest.raises(IncompatibleIndexError, match="open each vshard's own folder") as refused:
            VShard(number, count, _settings(other), folder, sync=False)
        assert "vshard count is fixed" in str(refused.value)
    Engine(config).close()  # a single worker's index in tmp_path / "single"
    with pytest.raises(IndexUnusableError, match="single worker's index"):
        VShard(0, 1, _settings(config), str(tmp_path / "single"), sync=False)


def test_a_vshard_in_lmdb_keeps_no_record_in_python(tmp_path):
    """The point of the LMDB form: a state larger than memory. Its records, shingles, ids and places are read
    from the environment; only the bounded cache of closed keys is in Python."""
    config = _config(tmp_path, "lsh.max_candidates=1")
    items = _items((doc.id, doc.text) for doc in corpus.hot_keys(200, seed=2))
    vshard = VShard(0, 1, _settings(config), str(tmp_path / "v0"), sync=False)
    _deliver(vshard, vshard.slice(0, items, list(range(1, 201)), (1, 201), NOW))
    vshard.commit({})
    state = vshard.state
    assert not [name for name, value in vars(state).items() if isinstance(value, (dict, list, set))
                and len(value) > vshard.closed.keys and name != "_meta"]
    with state.index.read() as txn:
        assert sum(1 for _ in txn.table_entries("docs")) == 200
    vshard.close()


def _deliver(vshard, messages):
    """Every message a one-vshard deployment sends, delivered to itself in order."""
    while messages:
        messages = [sent for message in messages for sent in vshard.receive(message)]


@pytest.mark.parametrize("vshards, max_candidates", [(1, 3), (3, 1), (4, 20)])
def test_places_settled_every_few_epochs_decide_as_one_worker(tmp_path, monkeypatch, vshards, max_candidates):
    """With a tiny recent level the places are merged into the settled table every epoch or two: lookups of
    both levels, through the filter, find what memory finds, and restarts send the same bytes."""
    monkeypatch.setattr(vshardstate, "RECENT_PLACES", 40)
    items = _items(_chains_and_ties(seed=vshards))
    run, _ = _assert_same_as_single_worker(tmp_path, items, vshards, 2, seed=vshards, largest=24,
                                           extra=[f"lsh.max_candidates={max_candidates}"],
                                           state=str(tmp_path / "vshards"), sync=False, restarts=0.15)
    _assert_restarts_changed_nothing(run)


def test_forget_with_places_settled(tmp_path, monkeypatch):
    monkeypatch.setattr(vshardstate, "RECENT_PLACES", 40)
    run = _assert_forget_in_the_middle_as_by_one_worker(tmp_path, 3, 2, state=str(tmp_path / "vshards"),
                                                        sync=False, restarts=0.15)
    assert not run.differences, run.differences


def test_a_vshard_state_of_another_format_is_refused_saying_what_to_do(tmp_path):
    config = _config(tmp_path)
    folder = str(tmp_path / "v0")
    VShard(0, 1, _settings(config), folder, sync=False).close()
    index = vshardstate._VShardIndex(folder, VShard(0, 1, _settings(config)).identity(), _settings(config).signing,
                                     sync=False)
    with index.env.begin(write=True, db=index.dbs["meta"]) as txn:
        meta = json.loads(txn.get(b"vshard"))
        txn.put(b"vshard", json.dumps({**meta, "format": 1}).encode())
    index.close()
    with pytest.raises(IncompatibleIndexError, match="start the deployment over in new folders and replay"):
        VShard(0, 1, _settings(config), folder, sync=False)


def test_an_epochs_kept_shingles_are_coded_from_its_batch_as_one_document_is():
    import numpy as np

    from streamdedup.core import eliasfano
    from streamdedup.core.shingle import ShingleBatch
    from streamdedup.store.index import u64

    draw = np.random.default_rng(3)
    sets = [np.unique(draw.integers(0, 1 << 32, size, dtype=np.uint64)).astype(np.uint32)
            for size in (200, 0, 1, 57, 33)]
    batch = ShingleBatch.of_sets(sets)
    kept = {40: 0, 7: 1, 12: 2, 900: 3}  # serial -> row; row 4 is not kept
    assert list(zip(*vshardstate._coded_shingles(batch, kept))) == sorted(
        (u64(serial), eliasfano.encode(sets[row])) for serial, row in kept.items())
    assert vshardstate._coded_shingles(batch, {}) == ([], [])


def test_a_serial_too_wide_for_its_key_is_refused_not_cut():
    import numpy as np

    from streamdedup.store.index import serial_key, u64

    assert vshardstate._fixed(np.array([0, 7, (1 << 32) - 1]), ">u4") == [serial_key(n) for n in (0, 7, (1 << 32) - 1)]
    assert vshardstate._fixed(np.array([1 << 40]), ">u8") == [u64(1 << 40)]
    with pytest.raises(OverflowError):
        vshardstate._fixed(np.array([5, 1 << 32]), ">u4")



def test_documents_filed_below_a_stored_serial_are_filed_all_the_same(tmp_path):
    """An epoch's records and kept shingles are appended, their serials being past every stored one; one that
    is not (none is, while a home's serials grow) must still be filed, with its neighbours, not dropped."""
    import numpy as np

    from streamdedup.core.records import Document, Source, id_key
    from streamdedup.core.shingle import ShingleBatch
    from streamdedup.store.index import DocRecord

    config = _config(tmp_path)
    state = vshardstate.LmdbState(str(tmp_path / "v0"), {"number": 0}, _settings(config).signing, sync=False)
    sets = [np.arange(10 * row, 10 * row + 5, dtype=np.uint32) for row in range(3)]
    for epoch, serials in enumerate(([10, 11, 20], [5, 12, 30])):
        records = [DocRecord.new_cluster(serial, Document(f"doc-{serial}", "", Source("t", 0, serial)),
                                         serial.to_bytes(16, "big"), b"", NOW) for serial in serials]
        state.begin()
        state.put_documents(records, [id_key(r.id) for r in records], ShingleBatch.of_sets(sets),
                            {serial: row for row, serial in enumerate(serials)}, [])
        state.add_contents({r.content: [[r.serial, 0, True]] for r in records})
        state.commit(epoch + 1, {})
    assert [r.serial for r in state.records()] == [5, 10, 11, 12, 20, 30]
    state.begin()
    for row, serial in enumerate([5, 12, 30]):
        assert state.serials_of_id(id_key(f"doc-{serial}")) == [serial]
        assert state.shingles(serial).tolist() == sets[row].tolist()
        assert state.first_of(serial.to_bytes(16, "big")) == (serial, 0, True)
    state.close()

@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_key_places_holders_are_every_entry_of_each_slot_through_merges_folds_and_removals(seed, kernel,
                                                                                            monkeypatch):
    """``KeyPlaces.holders`` finds a slot among each level's distinct slots, kept until the level changes:
    after every merge, fold, removal and clear, each asked slot's holders are those a scan of every entry
    gives, in the order taken; the kernel's search (``sorted_matches``) and numpy's alike."""
    import numpy as np

    from streamdedup.store import mirror
    from streamdedup.store.mirror import KeyPlaces

    if kernel and mirror._kernel is None:
        pytest.skip("the C kernel is not built")
    if not kernel:
        monkeypatch.setattr(mirror, "_kernel", None)

    draw = np.random.default_rng(seed)
    places, taken = KeyPlaces(), []
    for step in range(40):
        width = 40 if step % 2 else 4000
        slots = np.sort(draw.integers(0, width, int(draw.integers(0, 300))).astype(np.uint64))
        holders = draw.integers(0, 1 << 40, len(slots)).astype(np.int64)
        places._recent.merge((slots, holders))
        taken += zip(slots.tolist(), holders.tolist())
        if step % 7 == 3:
            places.entries()
        if step % 9 == 5 and taken:
            gone = [taken[int(i)] for i in draw.integers(0, len(taken), 20)]
            places.remove(np.array([s for s, _ in gone], dtype=np.uint64), np.array([h for _, h in gone]))
            taken = [entry for entry in taken if entry not in set(gone)]
        if step == 30:
            places.clear()
            taken = []
        asked = np.unique(draw.integers(0, width, int(draw.integers(0, 200))).astype(np.uint64))
        starts, counts, found = places.holders(asked)
        by_slot = {}
        for slot, holder in sorted(taken, key=lambda entry: entry[0]):
            by_slot.setdefault(slot, []).append(holder)
        for slot, start, count in zip(asked.tolist(), starts.tolist(), counts.tolist()):
            assert found[start:start + count].tolist() == by_slot.get(slot, []), (step, slot)


@pytest.mark.parametrize("filter_bytes", [64, 1 << 20])
def test_ids_and_contents_are_asked_through_a_filter_that_holds_every_stored_hash(tmp_path, monkeypatch,
                                                                                    filter_bytes):
    """``serials_of_ids`` and ``firsts_of`` find every id and content filed: in the epoch that filed them, and
    after the state is opened again (the filter then built from the tables), through the filter's layers (64
    bytes: many); most hashes never filed are not asked of LMDB (the filter lacks them)."""
    import numpy as np

    from streamdedup.core.records import Document, Source, id_key
    from streamdedup.core.shingle import ShingleBatch
    from streamdedup.store.index import DocRecord

    monkeypatch.setattr(vshardstate, "HASH_FILTER_BYTES", filter_bytes)
    config = _config(tmp_path)
    signing = _settings(config).signing
    state = vshardstate.LmdbState(str(tmp_path / "v0"), {"number": 0}, signing, sync=False)
    filed = list(range(1, 2001))
    for epoch in range(2):
        serials = filed[epoch * 1000:(epoch + 1) * 1000]
        records = [DocRecord.new_cluster(serial, Document(f"doc-{serial}", "", Source("t", 0, serial)),
                                         serial.to_bytes(16, "big"), b"", NOW) for serial in serials]
        state.begin()
        state.put_documents(records, [id_key(r.id) for r in records], ShingleBatch.of_sets([]), {}, [])
        state.add_contents({r.content: [[r.serial, 3, True]] for r in records})
        assert state.serials_of_ids([id_key(f"doc-{s}") for s in serials]) == [[s] for s in serials]
        assert state.firsts_of([s.to_bytes(16, "big") for s in serials]) == [(s, 3, True) for s in serials]
        state.commit(epoch + 1, {})
    state.close()

    state = vshardstate.LmdbState(str(tmp_path / "v0"), {"number": 0}, signing, sync=False)
    absent = list(range(10_001, 12_001))
    asked_ids = [id_key(f"doc-{s}") for s in filed + absent]
    asked_contents = [s.to_bytes(16, "big") for s in filed + absent]
    state.begin()
    assert state.serials_of_ids(asked_ids) == [[s] for s in filed] + [[]] * len(absent)
    assert state.firsts_of(asked_contents) == [(s, 3, True) for s in filed] + [None] * len(absent)
    if filter_bytes > 64:
        maybe = vshardstate._maybe_held(state._hashes, "ids", asked_ids[len(filed):])
        assert len(maybe) < len(absent) // 20
    assert len(vshardstate._maybe_held(state._hashes, "content", asked_contents[:len(filed)])) == len(filed)
    state.close()


def test_stored_candidates_verified_at_once_as_one_by_one(tmp_path):
    """``similarities`` (the codings read in one pass, compared in one kernel call) gives each pair the Jaccard
    of its stored shingles decoded, and None for a document with none; ``record_ids`` each record's id; the
    memory state the same."""
    import numpy as np

    from streamdedup.core.records import Document, Source, id_key
    from streamdedup.core.shingle import ShingleBatch
    from streamdedup.core.verify import jaccard
    from streamdedup.engine.vshards.stores import MemoryState
    from streamdedup.store.index import DocRecord

    draw = np.random.default_rng(3)
    sets = [np.unique(draw.integers(0, 400, size=size, dtype=np.uint32)) for size in (0, 5, 80, 200, 150)]
    serials = [3, 4, 7, 9, 12]
    records = [DocRecord.new_cluster(serial, Document(f"doc-{serial}", "", Source("t", 0, serial)),
                                     serial.to_bytes(16, "big"), b"", NOW) for serial in serials]
    kept = {serial: row for row, serial in enumerate(serials) if serial != 7}  # 7: a duplicate, no shingles
    owns = [np.unique(draw.integers(0, 400, size=size, dtype=np.uint32)) for size in (0, 3, 120, 190)]
    asked_owns = [own for own in owns for _ in serials]
    asked = serials * len(owns)
    expected = [None if serial == 7 else jaccard(own, sets[serials.index(serial)])
                for own, serial in zip(asked_owns, asked)]
    assert any(value is not None and 0 < value < 1 for value in expected)
    lmdb_state = vshardstate.LmdbState(str(tmp_path / "v0"), {"number": 0}, _settings(_config(tmp_path)).signing,
                                       sync=False)
    for state in (lmdb_state, MemoryState()):
        state.begin()
        state.put_documents(records, [id_key(r.id) for r in records], ShingleBatch.of_sets(sets), kept, [])
        assert state.similarities(asked_owns, asked) == expected
        assert state.similarities([], []) == []
        assert state.record_ids([12, 3, 12]) == {3: "doc-3", 12: "doc-12"}
        state.commit(1, {})
    lmdb_state.close()
