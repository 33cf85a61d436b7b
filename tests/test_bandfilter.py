"""The writer's Bloom filter of band keys: no false negatives, saved and trusted only when current."""

from __future__ import annotations

import json
import os

import numpy as np

from streamdedup import config as config_module
from streamdedup.core import corpus, lsh
from streamdedup.core.records import Document, Source
from streamdedup.engine.engine import Engine
from streamdedup.store import bandfilter
from streamdedup.store.bandfilter import BandFilter
from streamdedup.store.index import FORMAT_VERSION


def _docs(texts, start=0):
    return [Document(f"d{start + i}", t, Source("t", -1, start + i)) for i, t in enumerate(texts)]


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _config(*overrides):
    return config_module.load(None, ("index.merge_every=150", *overrides), environ={})


def test_added_keys_are_always_held_and_others_mostly_not():
    rng = np.random.default_rng(11)
    stored = rng.integers(0, 2**64, size=200_000, dtype=np.uint64)
    others = rng.integers(0, 2**64, size=200_000, dtype=np.uint64)
    band_filter = BandFilter(1 << 20)  # 8.4 million bits: 42 per key
    band_filter.add(stored)
    assert band_filter.may_hold(stored).all()
    assert band_filter.may_hold(others).mean() < 0.01
    assert 0.05 < band_filter.fill_ratio() < 0.15
    assert not BandFilter(1 << 20).may_hold(stored).any()


def test_a_filter_grows_in_layers_keeps_every_key_and_its_false_positives_low_up_to_its_cap(tmp_path):
    """Past a key for every ``BITS_PER_KEY`` bits a layer twice as large takes the next keys: every key added is
    held, random keys mostly are not, and memory stops at the cap (the last layer then fills on)."""
    rng = np.random.default_rng(12)
    stored = rng.integers(0, 2**32, size=600_000, dtype=np.uint64)
    others = rng.integers(0, 2**32, size=200_000, dtype=np.uint64)
    grown = BandFilter(1 << 16, 1 << 20)  # 64 KiB, then 128, 256, 512: 43,690 keys, then 87,381 ...
    for chunk in np.array_split(stored, 7):
        grown.add(chunk)
    assert [len(layer) * 8 for layer in grown.layers] == [1 << 16, 1 << 17, 1 << 18, 1 << 19]
    assert sum(grown.held) == grown.keys_added == len(stored) and grown.may_hold(stored).all()
    assert grown.may_hold(others).mean() < 0.05  # about 1% a full layer
    fixed = BandFilter.of_keys(np.array_split(stored, 7), 1 << 16)  # no cap given: one layer, as before
    assert len(fixed.layers) == 1 and fixed.may_hold(stored).all() and fixed.may_hold(others).mean() > 0.5
    capped = BandFilter.of_keys(np.array_split(stored, 7), 1 << 16, 1 << 18)  # room for 64 + 128 KiB only
    assert [len(layer) * 8 for layer in capped.layers] == [1 << 16, 1 << 17] and capped.may_hold(stored).all()


def test_each_later_layer_takes_more_bits_a_key_so_false_positives_stay_bounded_as_layers_are_added():
    """A layer's false-positive rate when full falls by about 0.62 from one layer to the next (``TIGHTEN``), so
    the filter's, their sum, stays under 3% however many layers it grows (each full layer at 12 bits a key
    would add its 1.1%)."""
    rng = np.random.default_rng(13)
    grown = BandFilter(1 << 16, 1 << 20)  # 64 KiB, then 128, 256, 512
    capacity = sum(bandfilter.layer_capacity(8192 << n, n) for n in range(4))
    grown.add(rng.integers(0, 2**64, size=capacity, dtype=np.uint64))
    assert [len(layer) * 8 for layer in grown.layers] == [1 << 16, 1 << 17, 1 << 18, 1 << 19]
    others = rng.integers(0, 2**64, size=1 << 20, dtype=np.uint64)
    own = []
    for layer in grown.layers:
        alone = BandFilter(8)
        alone.layers = [layer]
        own.append(alone.may_hold(others).mean())
    assert all(later < 0.75 * earlier for earlier, later in zip(own, own[1:])), own
    assert grown.may_hold(others).mean() < 0.03


def test_a_run_s_layer_is_sized_to_its_keys_so_memory_follows_the_runs_and_each_lets_as_few_through(tmp_path):
    """A layer started with a run (``start_run``) is sized to the keys expected of it (as many a serial as the
    runs before): every later run's layer is as large as the second's, none made ahead of it, each lets about
    the same share of random keys through (a layer as large as the last took ever more bits a key, and doubled
    every few runs), the cap still holds, and a filter built from the tables run after run (as
    ``bands.stored_slot_keys`` gives them) and saved is laid out the same and loaded as it is."""
    rng = np.random.default_rng(15)
    run_serials, keys_a_serial = 1000, 20  # 20,000 keys a run: 20.2 bits a key take 6,313 words, so 8,192
    grown = BandFilter(1 << 14, 1 << 20)  # 16 KiB to start (10,922 keys at 12 bits), then 32 KiB
    chunks, others = [], rng.integers(0, 2**64, size=1 << 19, dtype=np.uint64)
    for run, added in _added_run_after_run(grown, 12, rng, run_serials, keys_a_serial):
        chunks += added
        assert grown.ahead is None or run == 0  # none made ahead (only start_run drops one)
    sizes = [len(layer) for layer in grown.layers]
    assert sizes == [2048, 4096] + [8192] * 11, sizes  # main's: 2048, 4096, 4096, 8192 x 3, 16384 x 5 (912 KiB)
    own = []
    for layer in grown.layers[2:]:
        alone = BandFilter(8)
        alone.layers = [layer]
        own.append(alone.may_hold(others).mean())
    assert max(own) < 0.005 and max(own) < 1.5 * min(own), own
    bases = np.arange(12, dtype=np.uint64) * np.uint64(run_serials)
    asked = grown.runs_to_ask(others[grown.may_hold(others)], bases)
    assert asked.sum(axis=0).mean() < 1.1  # a random key past the filter is asked in about one run
    capped = BandFilter.of_keys(iter(chunks), 1 << 14, 1 << 18)  # built from the tables, room for 256 KiB
    assert [len(layer) for layer in capped.layers] == [2048, 4096, 8192, 8192, 8192]  # past it, pairs folded
    assert capped.may_hold(np.concatenate([keys for keys, _ in chunks])).all()
    built = BandFilter.of_keys(iter(chunks), 1 << 14, 1 << 20)
    assert [len(layer) for layer in built.layers] == sizes and built.covers == grown.covers
    bandfilter.save(_FakeIndex(tmp_path), capped)
    loaded = bandfilter._load(str(tmp_path), (b"x", 7), 1 << 14, 1 << 18)
    assert loaded is not None and [len(layer) for layer in loaded.layers] == [2048, 4096, 8192, 8192, 8192]
    assert loaded.covers == capped.covers and loaded.may_hold(np.concatenate([keys for keys, _ in chunks])).all()
    assert loaded.for_run[-1] and loaded.held == capped.held  # a layer not twice the one before: a run's


def test_past_its_cap_the_filter_folds_two_run_layers_into_one_so_each_new_run_still_has_a_layer(tmp_path):
    """Once the cap leaves no room for a run's layer, two neighbouring layers of one size are OR-ed into one
    (``_fold``: the pair holding the fewest keys) and the run gets a layer of its own: every key stays held, the
    folded layer covers both runs, random keys mostly pass neither (the last layer filling on with every later
    run's keys let most of them through), a key past the filter is asked in few runs, and the layers saved
    after folds load with every key (the layers from the first folded one on written again)."""
    rng = np.random.default_rng(16)
    run_serials, keys_a_serial = 1000, 20  # 20,000 keys a run: a layer of 8,192 words (as in the test above)
    folded = BandFilter(1 << 14, 1 << 18)  # 16 + 32 KiB for the first run, then room for three runs' layers
    others = rng.integers(0, 2**64, size=1 << 18, dtype=np.uint64)
    stored, runs = [], 12
    for run, added in _added_run_after_run(folded, runs, rng, run_serials, keys_a_serial):
        stored += [keys for keys, _ in added]
        if run == 5:  # saved once layers were folded, then folded again: saved again from the first fold on
            assert len(folded.saved) == 0 or len(folded.layers) == 5
            bandfilter.save(_FakeIndex(tmp_path), folded)
    stored = np.concatenate(stored)
    assert folded.may_hold(stored).all()
    assert folded.size_bytes <= 1 << 18 and [len(layer) for layer in folded.layers] == [2048, 4096, 8192, 8192, 8192]
    assert folded.covers[-1] == (11000, 11999) and folded.held[-1] == 20000  # the last run's own layer
    assert all(later[0] == earlier[1] + 1 for earlier, later in zip(folded.covers[1:], folded.covers[2:]))
    rate = folded.may_hold(others).mean()
    assert rate < 0.4, rate  # 0.28 (at run 5: 0.03); the last layer filling on with 8 runs' keys: 0.97
    bases = np.arange(runs, dtype=np.uint64) * np.uint64(run_serials)
    asked = folded.runs_to_ask(others[folded.may_hold(others)], bases)
    assert asked.sum() / len(others) < 3  # positionings a random key: 2.1 (the last layer filling on: 7.7)
    bandfilter.save(_FakeIndex(tmp_path), folded)
    loaded = bandfilter._load(str(tmp_path), (b"x", 7), 1 << 14, 1 << 18)
    assert loaded is not None and loaded.covers == folded.covers and loaded.may_hold(stored).all()


def _added_run_after_run(band_filter: BandFilter, runs: int, rng, run_serials: int, keys_a_serial: int):
    """Random keys added to ``band_filter`` run after run of ``run_serials`` serials, in four parts a run, each run
    after the first started (``start_run``) as a merge does; yields each run's number and its (keys, serials)
    once they are added."""
    for run in range(runs):
        first = run * run_serials
        if run:
            band_filter.start_run(bandfilter.run_keys(sum(band_filter.held), first, run_serials))
        added = []
        for _ in range(4):
            keys = rng.integers(0, 2**64, size=run_serials * keys_a_serial // 4, dtype=np.uint64)
            band_filter.add(keys, (first, first + run_serials - 1))
            added.append((keys, (first, first + run_serials - 1)))
        yield run, added


class _FakeIndex:
    """What ``bandfilter.save`` asks of an index: its folder, id and ``merged_upto``."""

    def __init__(self, folder) -> None:
        self.path, self.meta = str(folder), {"index_id": "x"}

    def read(self):
        import contextlib
        return contextlib.nullcontext(type("Txn", (), {"counters": {"merged_upto": 7}})())


def test_a_band_key_held_under_one_band_is_not_held_under_the_others():
    """The filter holds band slots (``slot_keys``), not bare band keys: a key stored in one band says nothing of
    the others (at 10M documents 5% of all 32-bit keys are some band's)."""
    rng = np.random.default_rng(14)
    keys = rng.integers(0, 2**32, size=100_000, dtype=np.uint64)
    band_filter = BandFilter(1 << 20)
    band_filter.add(bandfilter.slot_keys(lsh.band_slots(np.full(len(keys), 2), keys)))
    assert band_filter.may_hold(bandfilter.slot_keys(lsh.band_slots(np.full(len(keys), 2), keys))).all()
    for band in (0, 1, 3, 19):
        assert band_filter.may_hold(bandfilter.slot_keys(lsh.band_slots(np.full(len(keys), band), keys))).mean() < 0.01


def test_the_next_layer_is_made_and_faulted_in_ahead_as_keys_come_and_changes_no_bit(monkeypatch):
    """From half of a layer's keys on, the next layer is made and its pages written a share at a time, as keys
    come (never more than ``_CATCH_UP`` bytes at once), so that it is whole when the last layer is full; the
    layers hold the same bits as without it, and no layer is made ahead past the cap."""
    rng = np.random.default_rng(13)
    stored = rng.integers(0, 2**32, size=600_000, dtype=np.uint64)
    monkeypatch.setattr(bandfilter, "_CATCH_UP", 1 << 12)
    ahead = BandFilter(1 << 16, 1 << 20)
    capacity = (1 << 16) * 8 // bandfilter.BITS_PER_KEY  # keys of the first layer
    ahead.add(stored[:capacity // 2])
    assert ahead.ahead is None  # not before half of it
    touched = []
    for chunk in np.array_split(stored[capacity // 2:capacity], 40):
        ahead.add(chunk)
        touched.append(ahead.ahead_touched)
    assert len(ahead.layers) == 1 and len(ahead.ahead) == 2 * len(ahead.layers[0])
    assert touched == sorted(touched) and touched[0] > 0 and touched[-1] == len(ahead.ahead) * 8  # whole when full
    assert max(np.diff(touched)) <= 1 << 12
    for chunk in np.array_split(stored[capacity:], 9):
        ahead.add(chunk)
    assert ahead.ahead is None  # 64 + 128 + 256 + 512 KiB: a fifth layer would pass the cap
    monkeypatch.setattr(BandFilter, "_ahead", lambda self: None)
    plain = BandFilter.of_keys(np.array_split(stored, 13), 1 << 16, 1 << 20)
    assert ahead.held == plain.held and all(np.array_equal(a, b) for a, b in zip(ahead.layers, plain.layers))


def test_a_grown_filter_is_saved_and_loaded_whole(tmp_path):
    texts = [d.text for d in corpus.generate(300, seed=24)]
    state = str(tmp_path / "state")
    settings = ("index.band_filter_mb=0", "index.band_filter_max_mb=1")  # starts at one word: grows at once
    with Engine(_config(*settings), state) as engine:
        engine.bands.filter_bytes = 8 << 10  # 8 KiB (the settings count MiB)
        engine.decide_batch(engine.prepare(_docs(texts)))
        engine.merge_recent()
        written = engine.bands.loaded_filter()
        assert len(written.layers) > 1
        layers = [layer.copy() for layer in written.layers]
    with Engine(_config(*settings), state) as engine:
        engine.bands.filter_bytes = 8 << 10
        loaded = engine.bands.loaded_filter()
        assert loaded.loaded and len(loaded.layers) == len(layers)
        assert all((a == b).all() for a, b in zip(loaded.layers, layers)) and loaded.held == written.held
        assert loaded.covers == written.covers and loaded.covers[0][0] <= loaded.covers[-1][1]


def test_decisions_are_the_same_with_and_without_the_filter_across_merges_and_restarts(tmp_path):
    texts = [d.text for d in corpus.generate(500, seed=21)]
    chunks = [texts[i:i + 100] for i in range(0, len(texts), 100)]
    with_filter, without = [], []
    loaded = 0
    for number, chunk in enumerate(chunks):  # a new engine per chunk: the saved filter is loaded each time
        with Engine(_config(), str(tmp_path / "on")) as engine:
            with engine.index.read() as txn:
                merged = txn.counters["merged_upto"]
            if merged:  # a merge finished (and saved it); one may be under way since, in slices
                assert engine.bands.loaded_filter().loaded, "the filter saved by the last merge should be loaded"
                loaded += 1
            for at in range(0, len(chunk), 20):  # merges go a slice a batch: they span restarts
                with_filter += engine.decide_batch(engine.prepare(_docs(chunk[at:at + 20], 100 * number + at)))
    assert loaded >= 2
    with Engine(_config("index.band_filter_mb=0"), str(tmp_path / "off")) as engine:
        for number, chunk in enumerate(chunks):
            without += engine.decide_batch(engine.prepare(_docs(chunk, 100 * number)))
        assert engine.bands.loaded_filter() is None
    assert [(d.status, d.cluster) for d in with_filter] == [(d.status, d.cluster) for d in without]
    assert sum(d.status == "duplicate" and not d.exact for d in with_filter) > 20  # near-duplicates across merges


def test_decisions_are_the_same_with_a_filter_growing_in_layers_made_ahead_across_merges_and_restarts(tmp_path,
                                                                                                   monkeypatch):
    """A filter of 2 KiB to start grows a layer every few merges, each made ahead and taken over in a merge's
    slices, across restarts (some in the middle of a merge: the saved layers loaded, the slices written added,
    the next layer made ahead again): the same decisions as without a filter."""
    from streamdedup.engine import engine as engine_module
    from streamdedup.store.bands import BandTables

    texts = [d.text for d in corpus.generate(500, seed=25)]
    chunks = [texts[i:i + 100] for i in range(0, len(texts), 100)]
    with_filter, without, made_ahead, restarted_in_merges = [], [], 0, 0
    with monkeypatch.context() as patched:  # 2 KiB to start, 1 MiB at most (the settings count MiB)
        patched.setattr(engine_module, "BandTables", lambda index, start, most: BandTables(index, 2 << 10, 1 << 20))
        for number, chunk in enumerate(chunks):
            with Engine(_config(), str(tmp_path / "on")) as engine:
                restarted_in_merges += engine._merge is not None
                for at in range(0, len(chunk), 20):
                    with_filter += engine.decide_batch(engine.prepare(_docs(chunk[at:at + 20], 100 * number + at)))
                    made_ahead += engine.bands.loaded_filter().ahead is not None
                layers = len(engine.bands.loaded_filter().layers)
    assert layers >= 3 and made_ahead and restarted_in_merges
    with Engine(_config("index.band_filter_mb=0"), str(tmp_path / "off")) as engine:
        for number, chunk in enumerate(chunks):
            without += engine.decide_batch(engine.prepare(_docs(chunk, 100 * number)))
    assert [(d.status, d.cluster) for d in with_filter] == [(d.status, d.cluster) for d in without]


def test_past_two_to_the_23_documents_a_key_is_asked_only_in_the_epochs_its_filter_layers_cover(tmp_path,
                                                                                                monkeypatch):
    """An index whose serials cross 2^23 (the band table's second epoch) with a filter of 2 KiB to start, grown in
    layers across merges and restarts: each layer knows the serials it covers (saved with it), a key past the
    filter is positioned only in the epochs of the layers that may hold it, and the decisions are those made
    without a filter (every epoch asked). A filter built from the tables covers the epochs in order."""
    from streamdedup.engine import engine as engine_module
    from streamdedup.store import bands as bands_module
    from streamdedup.store.bands import BandTables

    epoch = 1 << bands_module._EPOCH_BITS
    texts = [d.text for d in corpus.generate(600, seed=27)]
    chunks = [texts[i:i + 100] for i in range(0, len(texts), 100)]
    asked = []
    original_rows = bands_module.BandRows.stored_rows

    def counting_rows(rows, txn, bands, keys, last_serial, runs=None, bases=None):
        every = len(bases) if bases is not None else (last_serial >> bands_module._EPOCH_BITS) + 1
        asked.append((int(runs.sum()) if runs is not None else every * len(keys), every * len(keys)))
        return original_rows(rows, txn, bands, keys, last_serial, runs, bases)

    decided = {}
    for name, start in (("on", 2 << 10), ("off", 0)):
        state = str(tmp_path / name)
        with Engine(_config(), state) as engine:
            engine.index.write(lambda txn: txn.count(next_serial=epoch - 250))  # the 251st document opens epoch 1
        with monkeypatch.context() as patched:
            patched.setattr(engine_module, "BandTables", lambda index, _, most: BandTables(index, start, 1 << 20))
            patched.setattr(bands_module.BandRows, "stored_rows", counting_rows)
            decided[name] = []
            for number, chunk in enumerate(chunks):
                with Engine(_config(), state) as engine:
                    for at in range(0, len(chunk), 20):
                        decided[name] += engine.decide_batch(engine.prepare(_docs(chunk[at:at + 20],
                                                                                  100 * number + at)))
                    held = engine.bands.loaded_filter()
                    with engine.index.read() as txn:
                        last_serial = txn.counters["next_serial"]
        if name == "on":
            with_filter = asked[:]
            covers = held.covers
    assert [(d.status, d.cluster) for d in decided["on"]] == [(d.status, d.cluster) for d in decided["off"]]
    assert last_serial >= epoch + 300
    assert sum(d.status == "duplicate" and not d.exact for d in decided["on"]) > 20
    assert len(covers) >= 3 and covers[0][1] < epoch <= covers[-1][0]  # the first layers' keys are epoch 0's
    positioned, every = (sum(column) for column in zip(*with_filter))
    assert 0 < positioned < every  # some keys past the filter asked in epoch 0 only
    os.remove(os.path.join(str(tmp_path / "on"), bandfilter.FILE_NAME))
    with Engine(_config(), str(tmp_path / "on")) as engine:
        engine.bands.filter_bytes = 2 << 10
        built = engine.bands.loaded_filter()
        with engine.index.read() as txn:
            bases = bands_module.run_bases(txn).tolist()
        assert not built.loaded and bases == [0, epoch - 249]  # the run the first merge started
        assert built.covers[0][0] == epoch - 249 and built.covers[-1][1] >= last_serial


class _Crash(Exception):
    pass


def _decide_in_runs(state: str, chunks, monkeypatch, crash: tuple = (0, ""), first: int = 0) -> list:
    """Decide ``chunks[first:]`` (of 100 texts) in batches of 20, an engine a chunk (restarts, some in a merge's
    middle), with a 2 KiB filter growing in layers; ``crash``: (n, "inside") the process dies in the transaction
    of the merge slice that starts the n-th new run, (n, "after") once it committed, and the chunk goes on from
    where the index stands. Returns what the index decided (id, kept, cluster of each record)."""
    from streamdedup.engine import engine as engine_module
    from streamdedup.store import bands as bands_module
    from streamdedup.store import merge as merge_module
    from streamdedup.store.bands import BandTables

    started, crashed = [0], [False]
    original_start = merge_module.start_runs

    def start_runs(txn, first, upto):
        runs = len(bands_module.run_bases(txn))
        bases = original_start(txn, first, upto)
        started[0] += len(bases) > runs
        if crash == (started[0], "inside") and len(bases) > runs and not crashed[0]:
            crashed[0] = True
            raise _Crash()
        return bases

    def reached(step):
        if step == "merge-slice" and crash == (started[0], "after") and not crashed[0]:
            crashed[0] = True
            raise _Crash()

    with monkeypatch.context() as patched:
        patched.setattr(engine_module, "BandTables", lambda index, _, most: BandTables(index, 2 << 10, 1 << 20))
        patched.setattr(engine_module, "reached", reached)
        patched.setattr(merge_module, "start_runs", start_runs)
        for number, chunk in enumerate(chunks[first:], start=first):
            batches = [(at, chunk[at:at + 20]) for at in range(0, len(chunk), 20)]
            while batches:
                try:
                    with Engine(_config(), state) as engine:
                        while batches:
                            at, texts = batches[0]
                            engine.decide_batch(engine.prepare(_docs(texts, 100 * number + at)))
                            batches.pop(0)
                except _Crash:
                    with Engine(_config(), state) as engine:
                        with engine.index.read() as txn:
                            documents = txn.counters["documents"]
                    batches = [(at, texts) for at, texts in batches if 100 * number + at >= documents]
    assert crashed[0] or not crash[0], "the crash asked for did not happen"
    with Engine(_config(), state) as engine:
        with engine.index.read() as txn:
            return [(record.id, record.kept, record.cluster) for record in txn.records()]


def test_a_merge_starts_a_new_run_of_serials_in_its_first_slice_and_decisions_do_not_change(tmp_path, monkeypatch):
    """With runs of 200 serials (merges every 150 documents), the band table holds many runs, each started in
    its merge's first slice (a crash just after that slice committed goes on with the run); a key past the filter
    is positioned only in the runs its layers cover, the decisions are those of one run and no filter, and
    ``check`` finds the index consistent. An index made before runs (its epochs, no manifest) continues the same."""
    from streamdedup.store import bands as bands_module
    from streamdedup.store import merge as merge_module
    from streamdedup.store.check import check_index

    texts = [d.text for d in corpus.generate(800, seed=29)]
    chunks = [texts[i:i + 100] for i in range(0, len(texts), 100)]
    with Engine(_config("index.band_filter_mb=0"), str(tmp_path / "one")) as engine:
        for number, chunk in enumerate(chunks):
            engine.decide_batch(engine.prepare(_docs(chunk, 100 * number)))
        with engine.index.read() as txn:
            assert bands_module.run_bases(txn).tolist() == [0]
            decided = [(record.id, record.kept, record.cluster) for record in txn.records()]
    asked = []
    original_rows = bands_module.BandRows.stored_rows

    def counting_rows(rows, txn, bands, keys, last_serial, runs=None, bases=None):
        every = len(bases) if bases is not None else 1
        asked.append((int(runs.sum()) if runs is not None else every * len(keys), every * len(keys)))
        return original_rows(rows, txn, bands, keys, last_serial, runs, bases)

    monkeypatch.setattr(bands_module, "RUN_SERIALS", 200)
    monkeypatch.setattr(bands_module.BandRows, "stored_rows", counting_rows)
    for crash in ((0, ""), (2, "inside"), (3, "after")):
        state = str(tmp_path / f"runs-{crash[0]}")
        in_runs = _decide_in_runs(state, chunks, monkeypatch, crash)
        assert in_runs == decided
        with Engine(_config(), state) as engine:
            with engine.index.read() as txn:
                bases = bands_module.run_bases(txn).tolist()
                serials = [serial for _, _, serial in bands_module.band_entries(txn)]
                merged = txn.counters["merged_upto"]
            assert check_index(engine.index).ok
            firsts = {first for first, _ in engine.bands.loaded_filter().covers}
            assert {base for base in bases[1:] if base <= merged} <= firsts  # each run a layer, restarts or not
        assert len(bases) >= 3 and all(200 // 2 < b - a <= 200 + 150 for a, b in zip(bases[1:], bases[2:]))
        assert max(serials) > bases[-1]
    positioned, every = (sum(column) for column in zip(*asked))
    assert 0 < positioned < every  # keys past the filter asked only in some runs
    assert sum(not kept and cluster for _, kept, cluster in decided) > 100  # duplicates across runs
    state = str(tmp_path / "runs-0")
    with Engine(_config(), state) as engine:  # a damaged manifest: ``check`` says so, ``check --fix`` rebuilds
        engine.index.write(lambda txn: txn.txn.put(bands_module.RUNS_KEY, b"[0, 500, 400]", db=txn.dbs["meta"]))
        assert any("manifest of runs" in problem for problem in check_index(engine.index).problems)
        engine.rebuild()
        assert check_index(engine.index).ok
        with engine.index.read() as txn:
            assert bands_module.run_bases(txn).tolist()[0] == 0
    again = _decide_in_runs(state, chunks + [texts[:100]], monkeypatch, first=len(chunks))  # copies, new ids
    assert again[:len(decided)] == decided and not any(kept for _, kept, _ in again[len(decided):])

    def epochs(txn, first, upto):  # what an index made before runs holds: epochs of 2^23 serials, no manifest
        return bands_module.run_bases(txn)

    old = str(tmp_path / "old")
    with monkeypatch.context() as patched:
        patched.setattr(merge_module, "start_runs", epochs)
        _decide_in_runs(old, chunks[:8], monkeypatch)
    with Engine(_config(), old) as engine:
        with engine.index.read() as txn:
            assert txn.txn.get(bands_module.RUNS_KEY, db=txn.dbs["meta"]) is None
        engine.index.write(lambda txn: _set_format(txn, 6))  # as a streamdedup before runs made it
    assert _decide_in_runs(old, chunks, monkeypatch, first=8) == decided
    with Engine(_config(), old) as engine:
        with engine.index.read() as txn:
            assert bands_module.run_bases(txn).tolist()[0] == 0 and len(bands_module.run_bases(txn)) >= 2
            assert json.loads(txn.txn.get(b"index", db=txn.dbs["meta"]))["format"] == FORMAT_VERSION  # refused before
        assert check_index(engine.index).ok


def test_a_merge_is_sliced_by_the_bytes_of_the_run_it_writes_into_not_the_whole_table(tmp_path, monkeypatch):
    """With runs of 200 serials, a merge counts its slices from the bytes of the run it writes into (the table's
    bytes a serial times the run's serials), so the later merges of an index of many runs take fewer slices than
    the whole table would ask, and decide as those do."""
    from streamdedup.engine import engine as engine_module
    from streamdedup.store import bands as bands_module
    from streamdedup.store import merge as merge_module

    texts = [d.text for d in corpus.generate(900, seed=31)]
    original = merge_module.merge_slices
    monkeypatch.setattr(bands_module, "RUN_SERIALS", 200)
    monkeypatch.setattr(merge_module, "MERGE_SLICE_BYTES", 1024)  # a slice a band for each KiB a band

    def decide(name):
        asked = []
        monkeypatch.setattr(engine_module, "merge_slices",
                            lambda table_bytes, bands: asked.append(table_bytes) or original(table_bytes, bands))
        with Engine(_config(), str(tmp_path / name)) as engine:
            decided = [(d.status, d.cluster) for at in range(0, len(texts), 50)
                       for d in engine.decide_batch(engine.prepare(_docs(texts[at:at + 50], at)))]
            with engine.index.read() as txn:
                bases, merged = bands_module.run_bases(txn).tolist(), txn.counters["merged_upto"]
                whole = engine.index.database_bytes()["bands"]
                share = merge_module.rewritten_bytes(txn, whole, merged + 1, merged + 150)
        assert len(bases) >= 3 and share < whole // 2
        return decided, asked

    by_runs, asked = decide("runs")
    with monkeypatch.context() as patched:
        patched.setattr(engine_module, "rewritten_bytes", lambda txn, table_bytes, first, upto: table_bytes)
        by_table, whole_asked = decide("whole")
    assert by_runs == by_table
    assert len(asked) == len(whole_asked) and asked[0] == whole_asked[0] == 0  # the first merge: an empty table
    assert asked[-1] < whole_asked[-1] // 2


def _set_format(txn, number):
    meta = json.loads(txn.txn.get(b"index", db=txn.dbs["meta"]))
    txn.txn.put(b"index", json.dumps({**meta, "format": number}).encode(), db=txn.dbs["meta"])


def test_a_saved_filter_that_is_not_current_is_rebuilt_from_the_tables(tmp_path):
    texts = [d.text for d in corpus.generate(300, seed=22)]
    state = str(tmp_path / "state")
    with Engine(_config(), state) as engine:
        engine.decide_batch(engine.prepare(_docs(texts[:200])))
        engine.merge_recent()  # the merge begun after 150 documents, finished now
        path = os.path.join(engine.index.path, bandfilter.FILE_NAME)
        stale = _read(path)  # saved by that merge
        engine.decide_batch(engine.prepare(_docs(texts[200:], 200)))
        engine.merge_recent()  # another merge: a new stamp
        assert _read(path) != stale
        keys = engine.bands.loaded_filter().bits.copy()
    with open(path, "wb") as handle:  # as after a crash between a merge's commit and saving the filter
        handle.write(stale)
    with Engine(_config(), state) as engine:
        rebuilt = engine.bands.loaded_filter()
        assert not rebuilt.loaded and rebuilt.keys_added > 0  # built from the tables
        assert (rebuilt.bits & keys == keys).all()  # holds every key the writer had
    damaged = bytearray(_read(path))
    damaged[-1] ^= 0xFF
    with open(path, "wb") as handle:
        handle.write(damaged)
    with Engine(_config(), state) as engine:
        assert not engine.bands.loaded_filter().loaded
    with Engine(_config("index.band_filter_mb=1"), state) as engine:  # another size: not the saved one
        assert not engine.bands.loaded_filter().loaded and engine.bands.loaded_filter().words == 1 << 17


def test_rebuilding_the_tables_drops_the_saved_filter(tmp_path):
    texts = [d.text for d in corpus.generate(200, seed=23)]
    with Engine(_config(), str(tmp_path)) as engine:
        engine.decide_batch(engine.prepare(_docs(texts)))
        engine.merge_recent()  # the merge begun after the batch, finished: it saves the filter
        assert os.path.exists(os.path.join(engine.index.path, bandfilter.FILE_NAME))
        engine.rebuild()
        assert not os.path.exists(os.path.join(engine.index.path, bandfilter.FILE_NAME))
        assert not engine.bands.loaded_filter().loaded and engine.bands.loaded_filter().keys_added > 0
        again = engine.decide_batch(engine.prepare(_docs(texts, 1000)))
    assert all(d.status == "duplicate" for d in again)


def test_the_kernel_sets_and_answers_exactly_as_numpy(monkeypatch):
    """``_kernel.bloom_set`` and ``bloom_may_hold`` are the numpy definitions: the same bits in every layer,
    the same answer for every key (held keys, random ones, in layers of every size up to the cap)."""
    if bandfilter._kernel is None:
        import pytest

        pytest.skip("built without the kernel")
    rng = np.random.default_rng(14)
    stored = rng.integers(0, 2**32, size=300_000, dtype=np.uint64)
    asked = np.concatenate((stored[::7], rng.integers(0, 2**64, size=100_000, dtype=np.uint64), stored[:0]))
    compiled = BandFilter.of_keys(np.array_split(stored, 5), 1 << 15, 1 << 19)
    answers = compiled.may_hold(asked)
    monkeypatch.setattr(bandfilter, "_kernel", None)
    plain = BandFilter.of_keys(np.array_split(stored, 5), 1 << 15, 1 << 19)
    assert len(plain.layers) == len(compiled.layers) > 2
    assert all(np.array_equal(a, b) for a, b in zip(compiled.layers, plain.layers))
    assert np.array_equal(answers, plain.may_hold(asked)) and answers[:len(stored[::7])].all()
    assert 0 < answers.mean() < 0.5 and compiled.may_hold(asked[:0]).shape == (0,)


def test_the_id_and_content_tables_are_asked_through_a_filter_that_holds_every_hash_they_hold(tmp_path, monkeypatch):
    """The writer's filter of the id and content tables' hashes (``hashed``), tiny so that it grows layers,
    across merges and restarts (some in a merge's middle, the saved file loaded): it holds every hash the tables
    hold, and replays (a document sent again) and exact copies (new ids, the same text) are found as without
    filters, which also keeps most new hashes from the tables."""
    from streamdedup.engine import engine as engine_module
    from streamdedup.store import hashed
    from streamdedup.store.bands import BandTables

    texts = [d.text for d in corpus.generate(400, seed=26)]
    batches = [_docs(texts[i:i + 20], i) for i in range(0, len(texts), 20)]
    batches += [batches[2], _docs(texts[40:60], 5000), batches[15], _docs(texts[300:320], 6000)]  # again, copied
    with_filter, without, loaded, restarted_in_merges, checked = [], [], 0, 0, 0
    with monkeypatch.context() as patched:  # 2 KiB to start: the hash filter 64 bytes, 64 KiB at most
        patched.setattr(engine_module, "BandTables", lambda index, start, most: BandTables(index, 2 << 10, 1 << 20))
        for number in range(0, len(batches), 4):
            with Engine(_config(), str(tmp_path / "on")) as engine:
                restarted_in_merges += engine._merge is not None
                engine.bands.loaded_filter()
                loaded += engine.bands.hash_filter.loaded
                for batch in batches[number:number + 4]:
                    with_filter += engine.decide_batch(engine.prepare(batch))
                hashes = engine.bands.hash_filter
                with engine.index.read() as txn:
                    stored = list(hashed.stored_filter_keys(txn, 1000))
                if stored:  # once a merge wrote some
                    assert hashes.may_hold(np.concatenate(stored)).all()
                    checked += 1
                unknown = hashed.filter_keys("ids", [os.urandom(8) for _ in range(2000)])
                assert hashes.may_hold(unknown).mean() < 0.1
    assert len(hashes.layers) >= 3 and loaded >= 2 and restarted_in_merges and checked >= 4
    with Engine(_config("index.band_filter_mb=0"), str(tmp_path / "off")) as engine:
        for batch in batches:
            without += engine.decide_batch(engine.prepare(batch))
        assert engine.bands.hash_filter is None
    assert [(d.status, d.cluster, d.exact, d.replayed) for d in with_filter] == \
        [(d.status, d.cluster, d.exact, d.replayed) for d in without]
    assert sum(d.replayed for d in with_filter[-80:]) == 40  # the batches sent again, found by id
    assert sum(d.exact for d in with_filter[-80:]) >= 30  # the copies, found by content


def test_a_filter_of_more_layers_than_the_kernel_takes_at_once_holds_every_key(monkeypatch):
    """An index whose cap leaves every run its own layer goes past the kernel's ``KERNEL_LAYERS`` a call
    (about 67M documents at the default runs): ``may_hold`` asks the layers in groups, and answers as the numpy
    path does, every key added held."""
    rng = np.random.default_rng(16)
    grown = BandFilter(1 << 10, 1 << 30)
    chunks = [added for _, run in _added_run_after_run(grown, 80, rng, 40, 4) for added in run]
    assert len(grown.layers) > bandfilter.KERNEL_LAYERS
    stored = np.concatenate([keys for keys, _ in chunks])
    others = rng.integers(0, 2**64, size=1 << 16, dtype=np.uint64)
    assert grown.may_hold(stored).all()
    with_kernel = grown.may_hold(others)
    monkeypatch.setattr(bandfilter, "_kernel", None)
    assert grown.may_hold(stored).all()
    assert np.array_equal(grown.may_hold(others), with_kernel)
