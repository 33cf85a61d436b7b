"""The LMDB index: configuration refusal, one writer, map growth, read-only views."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import run_cli

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.records import Document, Source
from streamdedup.core.signing import SigningConfig, signing_config
from streamdedup.engine.engine import Engine
from streamdedup.errors import (
    IncompatibleIndexError,
    IndexLockedError,
    IndexUnusableError,
)
from streamdedup.store.index import DocRecord, Index, IndexSettings

SIGNING = SigningConfig(bands=20, rows=6)


def _docs(texts, start=0):
    return [Document(f"d{start + i}", t, Source("t", -1, start + i)) for i, t in enumerate(texts)]


def test_each_kind_of_record_names_its_fields_and_survives_packing():
    kept = DocRecord.new_cluster(3, Document("a", "", Source("t", 0, 7)), b"c" * 16, b"k" * 8, 100.0)
    exact = DocRecord.exact_copy_of(kept, 4, Document("b", "", Source("t", 1, 8)), b"c" * 16, 101.0)
    near = DocRecord.near_duplicate_of(kept, 0.75, 5, Document("e", "", Source("u", 2, 9)), b"d" * 16, 102.0)
    fields = ("serial", "id", "kept", "cluster", "cluster_id", "matched", "matched_id", "similarity", "exact",
              "content", "source", "band_keys", "time", "expired")
    assert [getattr(kept, f) for f in fields] == [3, "a", True, 3, "a", None, None, None, False, b"c" * 16,
                                                  ["t", 0, 7], b"k" * 8, 100.0, False]
    assert [getattr(exact, f) for f in fields] == [4, "b", False, 3, "a", 3, "a", 1.0, True, b"c" * 16,
                                                   ["t", 1, 8], b"", 101.0, False]
    assert [getattr(near, f) for f in fields] == [5, "e", False, 3, "a", 3, "a", 0.75, False, b"d" * 16,
                                                  ["u", 2, 9], b"", 102.0, False]
    echoed = DocRecord.near_duplicate_of(kept, 0.8, 6, Document("a", "", Source("t", 0, 10)), b"e" * 16, 103.0,
                                         site=9, containment=0.5)
    dissolved = dataclasses.replace(near, serial=7, cluster=0, cluster_id="", matched_id="x", expired=True)
    names = {7: "t", 8: "u"}
    numbers = {name: number for number, name in names.items()}
    unmatched = dataclasses.replace(near, serial=8, matched=4, matched_id="b")  # matched another than its cluster
    for record in (kept, exact, near, echoed, dissolved, unmatched):
        packed = record.pack(numbers[record.source[0]])
        assert DocRecord.unpack(record.serial, packed, names.__getitem__) == record
        assert record.source[0].encode() not in packed  # the source is stored as its number
    assert len(near.pack(8)) < len(dataclasses.replace(near, matched_id="other").pack(8))  # a name said once
    far = dataclasses.replace(near, serial=900_005, cluster=900_003, matched=900_003)
    assert len(far.pack(8)) < len(dataclasses.replace(far, matched=900_004).pack(8))  # a serial said once
    far_kept = dataclasses.replace(kept, serial=900_003, cluster=900_003)
    assert len(far_kept.pack(7)) < len(dataclasses.replace(far_kept, cluster=900_002).pack(7))  # its own cluster


def test_records_store_each_source_name_once_and_read_it_back(tmp_path):
    """Records name their source by number; a number given in a transaction that aborts is given again."""
    index = Index(IndexSettings(path=str(tmp_path)), SIGNING)
    record = DocRecord.new_cluster(1, Document("a", "", Source("topic-a", 0, 7)), b"c" * 16, b"", 100.0)
    other = DocRecord.new_cluster(2, Document("b", "", Source("topic-b", 1, 8)), b"d" * 16, b"", 101.0)

    def abandoned(txn):
        txn.put_record(other)
        raise RuntimeError("abandoned")

    with pytest.raises(RuntimeError):
        index.write(abandoned)
    index.write(lambda txn: (txn.put_record(record), txn.put_record(other)))
    with index.read() as txn:
        assert txn.record(1) == record and txn.record(2) == other
        assert [txn.source_number("topic-a"), txn.source_number("topic-b")] == [0, 1]
        assert txn.counters["source_names"] == 2
    index.close()


def test_reopening_with_other_signing_settings_names_each_difference(tmp_path):
    Index(IndexSettings(path=str(tmp_path)), SIGNING).close()
    other = dataclasses.replace(SIGNING, k=5, num_perm=64, seed=9)
    with pytest.raises(IncompatibleIndexError) as caught:
        Index(IndexSettings(path=str(tmp_path)), other)
    message = str(caught.value)
    for part in ("k: index has 3, configuration says 5", "num_perm: index has 128", "seed: index has 1"):
        assert part in message
    assert "bands" not in message
    assert "new folder" in message


def test_bands_may_be_adopted_from_the_index(tmp_path):
    Index(IndexSettings(path=str(tmp_path)), SIGNING).close()
    with Index(IndexSettings(path=str(tmp_path)), dataclasses.replace(SIGNING, bands=14, rows=9),
               adopt_bands=True) as index:
        assert (index.signing.bands, index.signing.rows) == (20, 6)


def test_an_index_made_before_shared_bands_keeps_one_shared_band_and_its_bands(tmp_path):
    import json

    import lmdb

    cfg = config_module.load(None, (), environ={})
    old = dataclasses.replace(signing_config(cfg), bands=20, rows=6, min_shared=1)
    Index(IndexSettings(path=str(tmp_path)), old).close()
    env = lmdb.open(str(tmp_path), max_dbs=32)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        meta = json.loads(txn.get(b"index"))
        del meta["config"]["min_shared"]
        txn.put(b"index", json.dumps(meta).encode())
    env.close()
    with Engine(cfg, str(tmp_path)) as engine:
        assert (engine.signing.bands, engine.signing.rows, engine.signing.min_shared) == (20, 6, 1)


def test_an_index_of_an_earlier_format_is_refused_with_how_to_rebuild_it(tmp_path):
    import json

    import lmdb

    Index(IndexSettings(path=str(tmp_path)), SIGNING).close()
    env = lmdb.open(str(tmp_path), max_dbs=32)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        meta = json.loads(txn.get(b"index"))
        meta["format"] = 2
        txn.put(b"index", json.dumps(meta).encode())
    env.close()
    with pytest.raises(IncompatibleIndexError, match="has format 2.*32 bits.*band table.*backfill --from-beginning"):
        Index(IndexSettings(path=str(tmp_path)), SIGNING)
    env = lmdb.open(str(tmp_path), max_dbs=32)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"index", json.dumps({**meta, "format": 4}).encode())
    env.close()
    with pytest.raises(IncompatibleIndexError, match="has format 4.*reads format 8.*numbered source names.*"
                                                     "8-byte hashes since format 5.*lsh.cap since format 6.*"
                                                     "runs since format 7.*recent_members until a merge.*chunks since "
                                                     "format 8.*"
                                                     "backfill --from-beginning"):
        Index(IndexSettings(path=str(tmp_path)), SIGNING)


@pytest.mark.system
def test_a_second_writer_is_refused_at_once_and_readers_are_not(tmp_path):
    with Index(IndexSettings(path=str(tmp_path)), SIGNING):
        with pytest.raises(IndexLockedError, match="one writer"):
            Index(IndexSettings(path=str(tmp_path)), SIGNING)
        refused = run_cli("dedup", "-", "--state", str(tmp_path), stdin=b"", check=False)
        assert refused.returncode == 1 and b"already open for writing" in refused.stderr
        reader = run_cli("stats", "--json", "--state", str(tmp_path))
        assert b'"documents": 0' in reader.stdout
    Index(IndexSettings(path=str(tmp_path)), SIGNING).close()  # free again once closed


def test_read_only_open_of_a_missing_index_says_what_to_do(tmp_path):
    with pytest.raises(IndexUnusableError, match="no index"):
        Index(IndexSettings(path=str(tmp_path / "nothing")), None, readonly=True)


def test_map_grows_by_itself_and_loses_nothing(tmp_path):
    cfg = config_module.load(None, ("index.map_size_mb=1", "index.merge_every=600"), environ={})  # fills quickly
    texts = [d.text for d in corpus.generate(1100, seed=3)][:2000]
    with Engine(cfg, str(tmp_path)) as engine:
        before = engine.index.env.info()["map_size"]
        for start in range(0, len(texts), 250):
            engine.decide_batch(engine.prepare(_docs(texts[start:start + 250], start)))
        assert engine.index.env.info()["map_size"] > before
        with engine.index.read() as txn:
            assert txn.counters["documents"] == 2000
    from streamdedup.store.check import check_index

    with Index(IndexSettings(path=str(tmp_path)), None, readonly=True) as reader:
        report = check_index(reader)
        assert report.ok, report.problems


def test_a_writer_reopening_an_index_that_outgrew_the_configured_map_starts_with_room(tmp_path):
    cfg = config_module.load(None, ("index.map_size_mb=1",), environ={})
    texts = [d.text for d in corpus.generate(1100, seed=3)][:2000]
    with Engine(cfg, str(tmp_path)) as engine:
        engine.decide_batch(engine.prepare(_docs(texts)))
        used, _ = engine.index.map_use()
    assert used > 1 << 20  # the file outgrew the configured map
    with Engine(cfg, str(tmp_path)) as engine:
        used, size = engine.index.map_use()
        assert size - used >= size // 4


def test_a_failed_transaction_leaves_nothing_behind(tmp_path):
    cfg = config_module.load(None, environ={})
    with Engine(cfg, str(tmp_path)) as engine:
        batch = engine.prepare(_docs(["some text here for the index", "other words entirely"]))

        def fail(txn, decisions):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            engine.decide(batch, fail)
        decided = engine.decide(batch)
        decided.abort()  # decided, then given up (a Kafka wait that timed out, say)
        with engine.index.read() as txn:
            assert txn.counters["documents"] == 0
            assert list(txn.records()) == []
        assert engine.mirror.documents == 0  # nothing of the failed batch reached the mirror
        decided = engine.decide_batch(batch)
        assert [d.status for d in decided] == ["kept", "kept"] and not any(d.replayed for d in decided)


def test_a_merge_spread_over_batches_is_consistent_at_every_commit_and_goes_on_after_a_restart(tmp_path,
                                                                                                monkeypatch):
    """A merge takes a slice a batch (``Engine._merge_along``): after every commit the index checks clean, a
    reader finds each entry once (the tables for the slices written, the mirror for the rest), a restart in the
    middle goes on from the next slice (or finishing step), and every decision is that of an index that never
    merges."""
    import numpy as np

    from streamdedup.store import merge as merge_module

    from streamdedup.core.lsh import band_slots
    from streamdedup.store.bands import BandTables, record_band_keys
    from streamdedup.store.check import check_index
    from streamdedup.store.mirror import RecentMirror

    texts = [d.text for d in corpus.generate(400, seed=8)]
    docs = _docs(texts)
    docs += docs[100:130]  # replays: the same ids and texts again, some found by the ids table, some in the mirror
    batches = [docs[at:at + 10] for at in range(0, len(docs), 10)]
    cfg = config_module.load(None, ("index.merge_every=150",), environ={})
    monkeypatch.setattr(merge_module, "FINISH_CHUNK", 40)  # a merge's ``recent`` entries deleted in 4 steps
    decided, restarts, steps_seen, slots_of = [], {"begun", "later", "finishing"}, set(), {}
    engine = Engine(cfg, str(tmp_path / "spread"))
    try:
        for number, batch in enumerate(batches):
            decided += engine.decide_batch(engine.prepare(batch))
            merge = engine._merge
            moment = None if merge is None else "begun" if merge.done == 1 and not engine.mirror.documents else \
                "finishing" if merge.done == merge.slices else "later" if merge.done > 1 else None
            if number % (3 if merge is not None else 7) and moment not in restarts:
                continue
            steps_seen.add(None if merge is None else merge.done)
            assert check_index(engine.index).ok
            with engine.index.read() as txn:
                for record in txn.records():
                    if record.kept and record.serial not in slots_of:
                        keys = record_band_keys(txn, record)
                        slots_of[record.serial] = band_slots(np.arange(len(keys)), keys).tolist()
                expected = [(slot, serial) for serial, slots in slots_of.items() for slot in slots]
                noise = np.random.default_rng(number).integers(0, 1 << 32, 500, dtype=np.uint64)
                asked = np.unique(np.concatenate([np.array([slot for slot, _ in expected], dtype=np.uint64), noise]))
                found = list(zip(*(part.tolist() for part in
                                   BandTables(engine.index).lookup(txn, RecentMirror.load(txn), asked))))
                writer = list(zip(*(part.tolist() for part in engine.bands.lookup(txn, engine.mirror, asked))))
            assert sorted(found) == sorted(writer), (moment, len(found), len(writer), len(expected))
            assert sorted(writer) == sorted(expected), (moment, len(found), len(writer), len(expected))  # each once
            if moment in restarts:  # once just after a merge began, once later on, once while it finishes
                restarts.remove(moment)
                engine.close()  # as a kill -9 would leave it: nothing is written between two commits
                engine = Engine(cfg, str(tmp_path / "spread"))
                assert engine._merge is not None and engine._merge.done == merge.done
    finally:
        engine.close()
    assert not restarts and len(steps_seen) > 4  # merges did go a slice at a time
    with Engine(config_module.load(None, ("index.merge_every=100000",), environ={}), str(tmp_path / "never")) as other:
        same = [d for batch in batches for d in other.decide_batch(other.prepare(batch))]
    assert [(d.status, d.cluster, d.matched, d.similarity, d.replayed) for d in decided] == \
        [(d.status, d.cluster, d.matched, d.similarity, d.replayed) for d in same]
    assert sum(d.replayed for d in decided) == 30 and sum(d.status == "duplicate" for d in decided) > 30


def test_mirror_band_rows_of_nothing_and_of_repeated_keys():
    import numpy as np

    from streamdedup.store.mirror import RecentMirror

    mirror = RecentMirror()
    mirror.add([(1, b"i" * 16, b"c" * 16), (2, b"j" * 16, b"d" * 16)], np.array([1, 2], dtype=np.int64),
               np.array([[5, 7], [7, 9]], dtype=np.uint64))
    keys, serials = mirror.band_rows(np.zeros(0, dtype=np.uint64))  # a batch of rejected records only
    assert len(keys) == len(serials) == 0
    band1 = 1 << 32
    keys, serials = mirror.band_rows(np.array([7, 7, band1 | 7, band1 | 9, band1 | 9, band1 | 11], dtype=np.uint64))
    assert sorted(zip(keys.tolist(), serials.tolist())) == [(7, 2), (band1 | 7, 1), (band1 | 9, 2)]


def test_mirror_lookups_span_both_levels(monkeypatch):
    """Entries in the small level, the large level and both at once are all found, and a fold loses none."""
    import numpy as np

    from streamdedup.core.lsh import KEY_MASK, band_slots
    from streamdedup.store import mirror as mirror_module

    monkeypatch.setattr(mirror_module, "FRESH_ENTRIES", 8)
    rng = np.random.default_rng(3)
    mirror = mirror_module.RecentMirror()
    every = []
    for serial in range(1, 40):
        keys = rng.integers(0, 30, size=(1, 3)).astype(np.uint64)  # small key space: many repeats
        mirror.add([(serial, serial.to_bytes(16, "big"), serial.to_bytes(16, "little"))],
                   np.array([serial], dtype=np.int64), keys)
        every += [((band << 32) | int(k), serial, band) for band, k in enumerate(keys[0])]
        asked = band_slots(rng.integers(0, 3, size=6), rng.integers(0, 30, size=6))
        found_slots, found_serials = mirror.band_rows(np.sort(asked))
        expected = sorted((k, s) for k, s, _ in every if k in set(asked.tolist()))
        assert sorted(zip(found_slots.tolist(), found_serials.tolist())) == expected
    assert sorted(zip(mirror.slots.tolist(), mirror.serials.tolist(), mirror.bands.tolist())) == sorted(every)
    assert mirror.slots.tolist() == sorted(mirror.slots.tolist())
    assert (mirror.keys == mirror.slots & KEY_MASK).all()


def test_a_band_key_is_found_in_its_own_band_only_in_the_mirror_as_in_the_table(tmp_path):
    """The same 32-bit value in two bands is two keys: the recent mirror and a batch's own rows match the
    band too, as the band table does, so a merge never changes what a document finds."""
    import numpy as np

    from streamdedup.core.lsh import band_slots, sorted_slots
    from streamdedup.store.candidates import keys_shared_within
    from streamdedup.store.mirror import RecentMirror

    mirror = RecentMirror()
    keys = np.array([[5, 6, 7]], dtype=np.uint64)
    mirror.add([(1, b"i" * 8, b"c" * 16)], np.array([1], dtype=np.int64), keys)
    found, serials = mirror.band_rows(np.sort(band_slots(np.array([1, 0, 2]), np.array([5, 6, 7]))))
    assert found.tolist() == [(2 << 32) | 7] and serials.tolist() == [1]  # 5 and 6 sit in other bands
    asked, rows, bands = sorted_slots(np.array([[9, 4], [4, 9]], dtype=np.uint64))
    assert len(keys_shared_within(asked, rows)) == 0  # the rows hold 4 and 9, each in the other's band
    asked, rows, bands = sorted_slots(np.array([[9, 4], [3, 4]], dtype=np.uint64))
    assert keys_shared_within(asked, rows).get(0) == [(1 << 32) | 4]


def test_the_mirror_presence_bits_never_miss_a_key_and_drop_most_others():
    """A key the mirror holds is always searched (a clear bit would hide a kept document); most others are not."""
    import numpy as np

    from streamdedup.store.mirror import _KeyBits

    rng = np.random.default_rng(5)
    held = np.sort(np.concatenate((rng.integers(0, 1 << 32, 30000, dtype=np.uint64),
                                   np.array([0, 63, 64, (1 << 32) - 1, 1 << 40], dtype=np.uint64))))
    bits = _KeyBits()
    bits.add(held[:10])
    bits.add(held[10:])  # set in two calls, as batches do
    bits.add(held[:0])
    assert bits.may_hold(held).all()
    others = rng.integers(0, 1 << 32, 100000, dtype=np.uint64)
    assert bits.may_hold(others).mean() < 0.05
    band = np.uint64(1 << 32)  # each band has bits of its own: a key held in band 0 is not held in the others
    assert not bits.may_hold(held[5:50] + band).any() and not bits.may_hold(held[5:50] + 31 * band).any()


def test_a_batch_transaction_is_checked_at_each_step(tmp_path):
    from streamdedup.store.index import TxnState

    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        decided = engine.decide(engine.prepare(_docs(["a text of several words for the index"])))
        assert decided.txn.state is TxnState.PREPARED
        with pytest.raises(IndexUnusableError, match="prepared: nothing may read or write"):
            decided.txn.set_position("late", 1)  # a write after the batch was sealed
        engine.commit(decided)
        assert decided.txn.state is TxnState.COMMITTED
        with pytest.raises(IndexUnusableError, match="committed cannot be committed"):
            decided.txn.commit()
        decided.abort()  # after the commit: nothing
        with engine.index.read() as txn:
            assert txn.counters["documents"] == 1 and txn.position("late") is None


def test_a_commit_that_fills_the_map_decides_the_batch_again_the_same(tmp_path, monkeypatch):
    from streamdedup import faults
    from streamdedup.store.check import check_index

    texts = [d.text for d in corpus.generate(300, seed=5)][:500]
    cfg = config_module.load(None, environ={})
    with Engine(cfg, str(tmp_path / "reference")) as engine:
        reference = [engine.decide_batch(engine.prepare(_docs(texts[s:s + 100], s))) for s in range(0, 500, 100)]
    monkeypatch.setenv(faults.FAIL_ENV, "index-commit-map-full:2,index-commit-map-full:4")
    monkeypatch.setattr(faults, "_reached", {})
    with Engine(cfg, str(tmp_path / "state")) as engine:
        before = engine.index.env.info()["map_size"]
        positions = []
        decided = []
        for s in range(0, 500, 100):
            batch = engine.decide(engine.prepare(_docs(texts[s:s + 100], s)),
                                  lambda txn, decisions, s=s: positions.append(s) or txn.set_position("p", s))
            decided.append(engine.commit(batch))
        assert engine.index.env.info()["map_size"] == 4 * before  # grown once for each failed commit
        assert positions == [0, 100, 100, 200, 200, 300, 400]  # the commits of batches 2 and 3 failed: decided again
        with engine.index.read() as txn:
            assert txn.counters["documents"] == 500 and txn.position("p") == 400
        report = check_index(engine.index)
        assert report.ok, report.problems
    assert [[(d.id, d.status, d.cluster, d.similarity) for d in b] for b in decided] == \
        [[(d.id, d.status, d.cluster, d.similarity) for d in b] for b in reference]


def test_the_mirror_names_every_id_and_content_it_answers_while_a_merge_is_under_way(tmp_path):
    """``RecentMirror.ids_held`` and ``contents_held`` (a batch's rows asked one by one are those they name)
    hold every id hash ``serials_of_id`` finds and every content hash ``first_of_content`` answers, of both
    generations, before, during and after a merge spread over batches."""
    from streamdedup.core.records import id_key

    texts = [d.text for d in corpus.generate(200, seed=11)]
    docs = _docs(texts) + _docs(texts[:40], start=1000) + _docs(texts[50:70], start=50)  # copies, replays
    cfg = config_module.load(None, ("index.merge_every=120",), environ={})
    seen_ids, seen_contents, during = [b"\x00" * 8], [b"\x00" * 16], 0
    with Engine(cfg, str(tmp_path / "held")) as engine:
        for at in range(0, len(docs), 10):
            batch = engine.prepare(docs[at:at + 10])
            engine.decide_batch(batch)
            seen_ids += batch.id_keys
            seen_contents += batch.contents
            mirror = engine.mirror
            during += mirror.merging is not None
            ids, contents = mirror.ids_held(seen_ids), mirror.contents_held(seen_contents)
            assert {i for i in seen_ids if mirror.serials_of_id(i)} <= ids
            assert {c for c in seen_contents if mirror.first_of_content(c) is not None} <= contents
    assert during > 2


def test_hash_tables_find_exactly_the_serials_of_a_hash_among_its_bucket(tmp_path):
    """ids and content entries share 2-byte buckets: a lookup gets its own hash's serials, ascending, no neighbour's."""
    from streamdedup.store.hashed import entries, entry, serials_of_many

    index = Index(IndexSettings(path=str(tmp_path)), SIGNING)
    a, b, c, other = b"\x01\x02aaaaaa", b"\x01\x02aaaaab", b"\x01\x02aaaaa`", b"\x01\x03aaaaaa"
    pairs = sorted([entry(a, 70_000), entry(a, 5), entry(b, 6), entry(c, 7), entry(other, 8)])
    index.write(lambda txn: txn.txn.cursor(db=txn.dbs["ids"]).putmulti(pairs, dupdata=True))
    with index.read() as txn:
        assert serials_of_many(txn, "ids", [b, a, a, b"\x01\x02aaaaac", other]) == {a: [5, 70_000], b: [6],
                                                                                     other: [8]}
        assert list(entries(txn, "ids")) == [(c, 7), (a, 5), (a, 70_000), (b, 6), (other, 8)]
    index.close()


def test_band_table_finds_exactly_the_asked_band_and_key_in_every_epoch_of_serials(tmp_path):
    """Keys that share a bucket (high byte) or low 24 bits, the same key in other bands, and serials in five
    epochs (2^23 documents each, up to the last serial an index numbers): a lookup returns exactly the
    entries of the asked (band, key), and removing one document removes its entries only."""
    import numpy as np

    from streamdedup.store.bands import BandTables, band_entries, run_bases, start_runs, stored_keys
    from streamdedup.store.index import MAX_SERIAL
    from streamdedup.store.mirror import RecentMirror

    near = [0xAB000001, 0xAB000002, 0xAA000001, 0xAB000101,  # one bucket (the high 7 bits)
            0xA9000001, 0xAC000001, 0x00000001]  # others (the first with the same low 25 bits)
    serials = [3, 4, (1 << 23) + 3, (1 << 24) + 3, (5 << 24) + 9, MAX_SERIAL]
    rng = np.random.default_rng(5)
    keys = rng.choice(near, size=(len(serials), 3)).astype(np.uint64)
    mirror = RecentMirror()
    mirror.add([(s, s.to_bytes(16, "big"), s.to_bytes(16, "little")) for s in serials],
               np.array(serials, dtype=np.int64), keys)
    index = Index(IndexSettings(path=str(tmp_path)), SIGNING)
    tables = BandTables(index)

    def merged(txn):
        tables.insert_slice(txn, mirror, 0, 1, start_runs(txn, min(serials), MAX_SERIAL))  # one run an epoch
        txn.count(next_serial=MAX_SERIAL)

    index.write(merged)
    with index.read() as txn:
        assert run_bases(txn).tolist() == [epoch << 23 for epoch in range(512)]
    every = {(band, int(keys[row, band]), serial) for row, serial in enumerate(serials) for band in range(3)}
    with index.read() as txn:
        assert {(band, int.from_bytes(key, "big"), serial) for band, key, serial in band_entries(txn)} == every
        assert sorted(np.concatenate(list(stored_keys(txn, 4))).tolist()) == sorted(k for _, k, _ in every)
        for band in range(3):
            for key in near:
                slot = (band << 32) | key
                found, owners = tables.lookup(txn, RecentMirror(), np.array([slot], dtype=np.uint64))
                expected = sorted(s for b, k, s in every if (b, k) == (band, key))
                assert sorted(owners.tolist()) == expected and set(found.tolist()) <= {slot}
    gone = 3
    index.write(lambda txn: tables.remove(txn, serials[gone], keys[gone]))
    with index.read() as txn:
        assert set((b, int.from_bytes(k, "big"), s) for b, k, s in band_entries(txn)) == {
            entry for entry in every if entry[2] != serials[gone]}
    index.close()


def test_band_table_rows_are_the_same_read_by_the_kernel_and_by_the_python_loop(tmp_path, monkeypatch):
    """``BandRows.stored_rows`` walks the cursor in the kernel (``stored_walk``) or, built without it, in Python:
    the same rows, byte for byte, for keys of many entries, of none, at a bucket's last values, in runs asked
    or not."""
    import numpy as np

    from streamdedup.store import bands as bands_module
    from streamdedup.store.bands import BandTables, run_bases, start_runs
    from streamdedup.store.mirror import RecentMirror

    assert bands_module._kernel is not None, "the kernel is built for the tests"
    near = [0xAB000001, 0xAB000002, 0xAB000003, 0xAB7FFFFF, 0xAAFFFFFF, 0x00000001]  # a bucket's first and last
    rng = np.random.default_rng(11)
    serials = np.unique(rng.integers(0, 3 << 23, 400)).astype(np.int64)
    keys = rng.choice(near, size=(len(serials), 4)).astype(np.uint64)
    mirror = RecentMirror()
    mirror.add([(int(s), int(s).to_bytes(16, "big"), int(s).to_bytes(16, "little")) for s in serials], serials, keys)
    index = Index(IndexSettings(path=str(tmp_path)), SIGNING)
    upto = (3 << 23) - 1

    def merged(txn):
        BandTables(index).insert_slice(txn, mirror, 0, 1, start_runs(txn, 0, upto))
        txn.count(next_serial=upto)

    index.write(merged)
    asked_keys = np.array(near + [0xAB000004, 0x12345678], dtype=np.uint64)
    bands = np.repeat(np.arange(5, dtype=np.uint64), len(asked_keys))  # band 4 holds nothing
    asked_keys = np.tile(asked_keys, 5)
    rows = bands_module._INDEX_ROWS
    with index.read() as txn:
        bases = run_bases(txn)
        assert len(bases) == 3
        some_runs = rng.random((3, len(asked_keys))) < 0.5
        by_kernel = [rows.stored_rows(txn, bands, asked_keys, upto, asked, bases) for asked in (None, some_runs)]
        with monkeypatch.context() as patched:
            patched.setattr(bands_module, "_kernel", None)
            by_python = [rows.stored_rows(txn, bands, asked_keys, upto, asked, bases) for asked in (None, some_runs)]
    index.close()
    assert by_kernel == by_python
    assert len(by_kernel[0]) == 10 * 4 * len(serials)  # every entry of the table, each a row of 10 bytes
    assert 0 < len(by_kernel[1]) < len(by_kernel[0])


def test_a_merge_slice_puts_the_same_band_rows_made_by_the_kernel_and_by_numpy(tmp_path, monkeypatch):
    """``bands.put_rows`` makes a merge's (key, value) rows in the kernel (``row_pairs``) or, built without it,
    from numpy's bytes: the same rows, so the same table; the kernel refuses keys and values of unequal rows."""
    import numpy as np

    from streamdedup.core import _kernel
    from streamdedup.store import bands as bands_module
    from streamdedup.store.bands import BandTables, put_rows, start_runs
    from streamdedup.store.mirror import RecentMirror

    rng = np.random.default_rng(5)
    keys, values = rng.integers(0, 1 << 32, 500, dtype=np.uint64), rng.integers(0, 1 << 48, 500, dtype=np.uint64)
    values[:3] = [0, (1 << 48) - 1, 1 << 40]  # the widths' first and last values
    by_kernel = put_rows(keys, 4, values, 6)
    monkeypatch.setattr(bands_module, "_kernel", None)
    assert put_rows(keys, 4, values, 6) == by_kernel
    assert by_kernel[1] == (int(keys[1]).to_bytes(4, "big"), b"\xff" * 6)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="as many rows"):
        _kernel.row_pairs(b"\x00" * 8, b"\x00" * 7, 4, 6)

    serials = np.unique(rng.integers(1, 5000, 300)).astype(np.int64)
    mirror = RecentMirror()
    mirror.add([(int(s), int(s).to_bytes(16, "big"), int(s).to_bytes(16, "little")) for s in serials], serials,
               rng.integers(0, 1 << 32, (len(serials), SIGNING.bands), dtype=np.uint64))

    def table(name: str) -> list[tuple[bytes, bytes]]:
        index = Index(IndexSettings(path=str(tmp_path / name)), SIGNING)
        index.write(lambda txn: BandTables(index).insert_slice(txn, mirror, 0, 1, start_runs(txn, 1, 5000)))
        with index.read() as txn:
            rows = list(txn.txn.cursor(db=txn.dbs["bands"]))
        index.close()
        return rows

    compiled = table("kernel")
    monkeypatch.setattr(bands_module, "_kernel", None)
    assert table("numpy") == compiled
    assert len(compiled) == len(serials) * SIGNING.bands


def test_a_merge_starts_a_run_once_the_current_one_would_span_more_than_a_runs_serials():
    """Runs of ~2^20 serials, each begun at a merge's first band serial (again the same once begun: a restarted
    merge); a generation of 2^23 serials or more, and the runs past ``SHORT_RUNS``, go an epoch a run; past
    512 runs the index is full."""
    import pytest

    from streamdedup.errors import IndexFullError
    from streamdedup.store.bands import RUN_SERIALS, SHORT_RUNS, runs_after_merge

    epoch = 1 << 23
    assert runs_after_merge([0], 1, 100_000) == [0]
    assert runs_after_merge([0], RUN_SERIALS - 50_000, RUN_SERIALS + 50_000) == [0, RUN_SERIALS - 50_000]
    assert runs_after_merge([0, 7], 7, RUN_SERIALS + 50_000) == [0, 7]  # begun: the merge restarted
    assert runs_after_merge([0], 1, 3 * epoch) == [0, epoch, 2 * epoch, 3 * epoch]  # one generation, epochs
    late = [n * RUN_SERIALS for n in range(SHORT_RUNS)]
    first = late[-1] + RUN_SERIALS + 1
    assert runs_after_merge(late, first, first + 100) == late  # no more short runs...
    assert runs_after_merge(late, late[-1] + epoch - 5, late[-1] + epoch + 5) == late + [late[-1] + epoch]
    full = [n * epoch for n in range(512)]
    with pytest.raises(IndexFullError, match="start a new index"):
        runs_after_merge(full, full[-1] + 10, full[-1] + epoch)


def test_a_batchs_kept_keys_packed_a_row_at_once_are_each_rows_big_endian_bytes():
    """``index.rows_as_bytes`` of the keys as ``">u4"`` (how ``view`` packs a batch's kept keys): each row's band
    keys as ``astype(">u4").tobytes()`` gives them, zero bytes at the end of a row kept (a void view's values are
    not cut there), no rows, and rows of no keys."""
    import numpy as np

    from streamdedup.store.index import rows_as_bytes

    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**32, size=(300, 32), dtype=np.uint64)
    keys[3, -2:] = 0
    keys[4] = 0
    for case in (keys, keys[:1], keys[:0], keys[:, :5], np.zeros((4, 0), dtype=np.uint64)):
        assert rows_as_bytes(case.astype(">u4")) == [row.astype(">u4").tobytes() for row in case]


def test_lookups_before_the_first_merge_find_what_the_whole_walk_finds(tmp_path, monkeypatch):
    """While nothing is merged into the band tables (``BandTables.holds_nothing``) a lookup asks the mirror
    alone: the same entries, run by run, as the filter and the table's walk find, and once a merge has
    written the tables the walk is taken again."""
    import numpy as np

    from streamdedup.store.bands import BandTables

    cfg = config_module.load(None, ("index.merge_every=200",), environ={})
    docs = _docs([d.text for d in corpus.generate(300, seed=5)])
    rng = np.random.default_rng(5)
    with Engine(cfg, str(tmp_path / "state")) as engine:
        held = []
        for at in range(0, len(docs), 50):
            engine.decide_batch(engine.prepare(docs[at:at + 50]))
            with engine.index.read() as txn:
                asked = np.unique(np.concatenate([engine.mirror.slots, rng.integers(0, 1 << 37, 300, dtype=np.uint64)]))
                empty = engine.bands.holds_nothing(txn)
                runs = engine.bands.lookup_runs(txn, engine.mirror, asked)
                with monkeypatch.context() as patched:
                    patched.setattr(BandTables, "holds_nothing", lambda self, txn: False)
                    walked = engine.bands.lookup_runs(txn, engine.mirror, asked)
            held.append(empty)
            assert len(runs) == len(walked)
            for (slots, serials), (walked_slots, walked_serials) in zip(runs, walked):
                assert slots.dtype == walked_slots.dtype and serials.dtype == walked_serials.dtype
                assert slots.tolist() == walked_slots.tolist() and serials.tolist() == walked_serials.tolist()
            assert sum(len(slots) for slots, _ in runs) >= len(np.unique(engine.mirror.slots))
    assert held[0] and not held[-1]  # the mirror alone at first, the tables once merged


def test_the_mirrors_sorted_entries_grow_where_they_lie_unless_something_else_holds_them(monkeypatch):
    """``SortedEntries`` enlarges its arrays in place when nothing else refers to them (no copy), and copies them
    when a view is held, which keeps reading the entries it was taken from; either way the entries are the runs
    merged as a stable sort would."""
    import numpy as np

    from streamdedup.store import mirror

    copies = []
    grown = mirror._grown
    monkeypatch.setattr(mirror, "_grown", lambda values, size, room: copies.append(room) or grown(values, size, room))
    rng = np.random.default_rng(11)
    runs = []
    for size in (300, 700, 2000, 5000):
        keys = np.sort(rng.integers(0, 900, size).astype(np.uint64))
        runs.append((keys, rng.integers(0, 1 << 40, size).astype(np.int64)))
    entries = mirror.SortedEntries()
    entries.merge(runs[0])
    entries.merge(runs[1])
    assert not copies  # grown in place
    view = entries.entries()
    before = (view[0].copy(), view[1].copy())
    entries.merge(runs[2])
    assert len(copies) == 2  # the view holds the arrays: both copied into new memory
    assert np.array_equal(view[0], before[0]) and np.array_equal(view[1], before[1])
    del view
    entries.merge(runs[3])
    assert len(copies) == 2
    keys = np.concatenate([run[0] for run in runs])
    order = np.argsort(keys, kind="stable")
    found = entries.entries()
    assert np.array_equal(found[0], keys[order])
    assert np.array_equal(found[1], np.concatenate([run[1] for run in runs])[order])
