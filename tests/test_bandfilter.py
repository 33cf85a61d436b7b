"""The writer's Bloom filter of band keys: no false negatives, saved and trusted only when current."""

from __future__ import annotations

import os

import numpy as np

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.records import Document, Source
from streamdedup.engine.engine import Engine
from streamdedup.store import bandfilter
from streamdedup.store.bandfilter import BandFilter


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


def test_decisions_are_the_same_with_and_without_the_filter_across_merges_and_restarts(tmp_path):
    texts = [d.text for d in corpus.generate(500, seed=21)]
    chunks = [texts[i:i + 100] for i in range(0, len(texts), 100)]
    with_filter, without = [], []
    for number, chunk in enumerate(chunks):  # a new engine per chunk: the saved filter is loaded each time
        with Engine(_config(), str(tmp_path / "on")) as engine:
            with_filter += engine.decide_batch(engine.prepare(_docs(chunk, 100 * number)))
            if number > 1:  # the first merge (in chunk 1) saved it
                assert engine.bands.loaded_filter().loaded, "the filter saved by the last merge should be loaded"
    with Engine(_config("index.band_filter_mb=0"), str(tmp_path / "off")) as engine:
        for number, chunk in enumerate(chunks):
            without += engine.decide_batch(engine.prepare(_docs(chunk, 100 * number)))
        assert engine.bands.loaded_filter() is None
    assert [(d.status, d.cluster) for d in with_filter] == [(d.status, d.cluster) for d in without]
    assert sum(d.status == "duplicate" and not d.exact for d in with_filter) > 20  # near-duplicates across merges


def test_a_saved_filter_that_is_not_current_is_rebuilt_from_the_tables(tmp_path):
    texts = [d.text for d in corpus.generate(300, seed=22)]
    state = str(tmp_path / "state")
    with Engine(_config(), state) as engine:
        engine.decide_batch(engine.prepare(_docs(texts[:200])))
        path = os.path.join(engine.index.path, bandfilter.FILE_NAME)
        stale = _read(path)  # saved by the merge after 150 documents
        engine.decide_batch(engine.prepare(_docs(texts[200:], 200)))  # another merge: a new stamp
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
        assert os.path.exists(os.path.join(engine.index.path, bandfilter.FILE_NAME))
        engine.rebuild()
        assert not os.path.exists(os.path.join(engine.index.path, bandfilter.FILE_NAME))
        assert not engine.bands.loaded_filter().loaded and engine.bands.loaded_filter().keys_added > 0
        again = engine.decide_batch(engine.prepare(_docs(texts, 1000)))
    assert all(d.status == "duplicate" for d in again)
