"""A sharded index decides as one index does: shards' evidence, decisions together, each shard's own documents.

These run the shards in one process over real LMDB folders, the evidence
packed and unpacked as it travels between shards; the Kafka roles around
them are tested in ``test_sharded_kafka.py``.
"""

from __future__ import annotations

import random
import threading

import pytest

from streamdedup import config as config_module
from streamdedup.core.corpus import generate, hot_keys
from streamdedup.core.records import Document, Source
from streamdedup.engine.engine import Engine
from streamdedup.engine.evidence import Evidence, ShardPlace, owner_of
from streamdedup.engine.shards.shard import ShardEngine
from streamdedup.errors import IndexUnusableError

OFF = ("templates.enabled=false",)

NOW = 1_700_000_000.0


def _config(*overrides):
    return config_module.load(None, OFF + overrides, environ={})


def _crawl_batches(articles=260, seed=7, batch=97):
    """The synthetic crawl with replays, exact copies under new ids, new versions of an id, and rejections."""
    rng = random.Random(seed)
    docs = [(d.id, d.text) for d in generate(articles, seed)]
    extra = []
    for doc_id, text in rng.sample(docs, min(40, len(docs) // 2)):
        extra.append((doc_id, text))  # a replay
        extra.append((doc_id + "-copy", text))  # an exact copy
        extra.append((doc_id, text + " and a new closing sentence of the article"))  # a new version
    extra.append(("punct", "!!! ... ???"))  # rejected: nothing left after normalization
    stream = docs + extra
    rng.shuffle(stream)
    items = [Document(doc_id, text, Source("raw", 0, n)) for n, (doc_id, text) in enumerate(stream)]
    return [items[i:i + batch] for i in range(0, len(items), batch)]


def _fields(decision):
    return (decision.id, decision.status, decision.cluster, decision.matched, decision.similarity,
            decision.exact, decision.replayed, decision.reason)


def _single(cfg, path, batches, times=None, forgets=None):
    """One index deciding ``batches`` (the n-th at ``times[n]``, default: all at NOW), sweeping between them
    (and forgetting ``forgets[n]`` after the n-th)."""
    times = times or [NOW] * len(batches)
    clock = [times[0]]
    decided = []
    with Engine(cfg, str(path), clock=lambda: clock[0]) as engine:
        for n, (items, now) in enumerate(zip(batches, times)):
            clock[0] = now
            decided += [_fields(d) for d in engine.decide_batch(engine.prepare(items))]
            engine.sweep()
            if forgets and n in forgets:
                engine.forget(forgets[n])
    return decided


def _next_serial(engine) -> int:
    with engine.index.read() as txn:
        return txn.counters.get("next_serial", 0)


def _sharded(cfg, path, batches, count, times=None, forgets=None):
    """Decide ``batches`` with ``count`` shards, each in a thread of its own (a shard waits for the others'
    evidence in the middle of its batch), evidence packed and unpacked as it travels."""
    shards = [ShardEngine(cfg, ShardPlace(i, count), str(path / f"shard-{i}")) for i in range(count)]
    decided = []
    times = times or [NOW] * len(batches)
    try:
        for items, now in zip(batches, times):
            prepared = shards[0].prepare(items)
            first = [Evidence.unpack(shard.evidence(prepared).pack()) for shard in shards]
            board, barrier, each, errors = [None] * count, threading.Barrier(count, timeout=60), [None] * count, []

            def run(n):
                def exchange(evidence):
                    board[n] = evidence.pack()
                    barrier.wait()
                    return [Evidence.unpack(packed) for packed in board]

                try:
                    each[n] = shards[n].commit(shards[n].decide_together(prepared, first, now, exchange))
                    shards[n].sweep()
                except BaseException as exc:
                    errors.append(exc)
                    barrier.abort()

            threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            assert len({_next_serial(shard) for shard in shards}) == 1, "shards disagree on the serials a batch took"
            for position in range(len(items)):  # a shard leaves out the decisions of others' kept documents
                found = [d[position] for d in each if d[position] is not None]
                assert found and all(f == found[0] for f in found), "shards disagree on a batch"
                decided.append(_fields(found[0]))
            if forgets and len(decided) and batches.index(items) in forgets:
                ids = forgets[batches.index(items)]
                found = [pair for shard in shards for pair in shard.forget_evidence(ids)]
                for shard in shards:
                    shard.forget_together(ids, found)
    finally:
        for shard in shards:
            shard.close()
    return decided, shards


@pytest.mark.parametrize("count", [1, 3, 4])
def test_shards_decide_as_one_index(tmp_path, count):
    cfg = _config()
    batches = _crawl_batches()
    single = _single(cfg, tmp_path / "single", batches)
    sharded, _ = _sharded(cfg, tmp_path / "sharded", batches, count)
    assert sharded == single
    statuses = {f[1] for f in single}
    assert {"kept", "duplicate", "rejected"} <= statuses and any(f[6] for f in single)  # the cases are there


def _hot_batches(documents=1500, seed=5, batch=60):
    """Documents filled into a few boilerplate templates, and near copies (``corpus.hot_keys``)."""
    items = [Document(d.id, d.text, Source("raw", 0, n)) for n, d in enumerate(hot_keys(documents, seed))]
    return [items[i:i + batch] for i in range(0, len(items), batch)]


def test_merged_tables_and_tight_candidate_caps_decide_as_one_index(tmp_path):
    """Lookups from merged tables, and one candidate per key and per document: caps that change decisions."""
    batches = _hot_batches()
    capped = _config("index.merge_every=150", "lsh.max_candidates=1", "lsh.min_shared_bands=1")
    single = _single(capped, tmp_path / "single", batches)
    assert single != _single(_config("index.merge_every=150", "lsh.min_shared_bands=1"), tmp_path / "free", batches)
    assert _sharded(capped, tmp_path / "sharded", batches, 3)[0] == single


@pytest.mark.parametrize("cap", ["kept", "probes"])
@pytest.mark.parametrize("max_candidates", [1, 2, 3, 5])
def test_on_hot_keys_shards_decide_as_one_index_cut_into_other_batches(tmp_path, max_candidates, cap):
    """Where the per-key limit bites on most keys, the deployment's batches, its merges and its number of
    shards change nothing: the same decisions as one index fed the same order in batches of another size
    (with ``lsh.cap = "probes"``, each shard holding its own duplicates' places)."""
    cfg = _config(f"lsh.max_candidates={max_candidates}", "index.merge_every=200", f'lsh.cap="{cap}"')
    single = _single(_config(f"lsh.max_candidates={max_candidates}", f'lsh.cap="{cap}"'), tmp_path / "single",
                     _hot_batches(batch=400))
    count = 2 + max_candidates % 3
    sharded, _ = _sharded(cfg, tmp_path / "sharded", _hot_batches(batch=23), count)
    assert sharded == single


def test_each_document_is_stored_in_its_shard_only(tmp_path):
    cfg = _config()
    batches = _crawl_batches(articles=80)
    decided, shards = _sharded(cfg, tmp_path, batches, 3)
    stored = {}
    for number in range(3):
        with ShardEngine(cfg, ShardPlace(number, 3), str(tmp_path / f"shard-{number}")) as shard:
            with shard.index.read() as txn:
                for record in txn.records():
                    assert owner_of(_ident(record.id), 3) == number
                    stored.setdefault(record.id, []).append(number)
                counters = txn.counters
                assert counters["next_serial"] == sum(1 for f in decided if f[1] != "rejected" and not f[6])
    decided_ids = {f[0] for f in decided if f[1] != "rejected"}
    assert set(stored) == decided_ids


def _ident(doc_id):
    from streamdedup.core.records import id_key

    return id_key(doc_id)


def test_a_shard_index_is_refused_as_another_shard_and_a_single_index_as_a_shard(tmp_path):
    cfg = _config()
    ShardEngine(cfg, ShardPlace(1, 3), str(tmp_path / "s")).close()
    with pytest.raises(IndexUnusableError, match="holds shard 1 of 3"):
        ShardEngine(cfg, ShardPlace(2, 3), str(tmp_path / "s"))
    with pytest.raises(IndexUnusableError, match="holds shard 1 of 3"):
        ShardEngine(cfg, ShardPlace(1, 4), str(tmp_path / "s"))
    _single(cfg, tmp_path / "one", _crawl_batches(articles=5))
    with pytest.raises(IndexUnusableError, match="single worker's index"):
        ShardEngine(cfg, ShardPlace(0, 3), str(tmp_path / "one"))


def _web_batches(pages=900, sites=12, seed=5, batch=83, relearn=0):
    """Pages of a few sites with their templates (and republished articles), with replays mixed in."""
    from streamdedup.core.webcrawl import generate_web

    rng = random.Random(seed)
    made = generate_web(pages, sites, seed)
    stream = [(p.id, p.text, p.url) for p in made]
    stream += [rng.choice(stream) for _ in range(25)]
    items = [Document(doc_id, text, Source("raw", 0, n), url) for n, (doc_id, text, url) in enumerate(stream)]
    return [items[i:i + batch] for i in range(0, len(items), batch)]


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("overrides", [(), ("templates.relearn_every=40", "templates.sample_pages=4")],
                         ids=["defaults", "relearning"])
def test_shards_with_site_templates_decide_as_one_index(tmp_path, count, overrides):
    cfg = config_module.load(None, overrides, environ={})
    batches = _web_batches()
    single = _single(cfg, tmp_path / "single", batches)
    assert _sharded(cfg, tmp_path / "sharded", batches, count)[0] == single
    assert sum(f[1] == "duplicate" and not f[5] for f in single) > 20  # near duplicates found through content


def test_first_pages_rekeyed_across_shards_decide_as_one_index(tmp_path):
    """Sites that settle in the middle of batches, their first pages kept while learning and republished later."""
    cfg = config_module.load(None, ("templates.sample_pages=6",), environ={})
    batches = _web_batches(pages=700, sites=30, seed=9, batch=41)
    single = _single(cfg, tmp_path / "single", batches)
    assert _sharded(cfg, tmp_path / "sharded", batches, 3)[0] == single
    with Engine(cfg, str(tmp_path / "single")) as engine, engine.index.read() as txn:
        assert txn.txn.stat(txn.dbs["rekeyed"])["entries"] > 0  # the case is there


@pytest.mark.parametrize("templates", ["true", "false"])
def test_retention_across_shards_decides_as_one_index(tmp_path, templates):
    """A day of retention while batches arrive a third of a day apart: old documents stop matching."""
    cfg = config_module.load(None, ("index.retention_days=1", "index.sweep_interval_s=1",
                                    f"templates.enabled={templates}"), environ={})
    batches = _crawl_batches(articles=300, batch=60)
    times = [NOW + n * 28800.0 for n in range(len(batches))]
    single = _single(cfg, tmp_path / "single", batches, times)
    assert single != _single(_config(f"templates.enabled={templates}"), tmp_path / "forever", batches, times)
    assert _sharded(cfg, tmp_path / "sharded", batches, 3, times)[0] == single


def test_forgetting_across_shards_decides_later_documents_as_one_index(tmp_path):
    """Representatives (their clusters dissolve, members in other shards), duplicates and unknown ids forgotten
    in the middle of the stream; their look-alikes and exact copies come later."""
    cfg = _config()
    batches = _crawl_batches(articles=300, batch=60)
    early = _single(cfg, tmp_path / "probe", batches[:3])
    representatives = sorted({f[2] for f in early if f[1] == "duplicate"})[:15]
    duplicates = [f[0] for f in early if f[1] == "duplicate"][:10]
    forgets = {2: representatives + duplicates + ["no-such-document"]}
    single = _single(cfg, tmp_path / "single", batches, forgets=forgets)
    assert single != _single(cfg, tmp_path / "kept", batches)
    assert _sharded(cfg, tmp_path / "sharded", batches, 3, forgets=forgets)[0] == single


@pytest.mark.parametrize("templates", ["true", "false"])
def test_excerpts_across_shards_decide_as_one_index(tmp_path, templates):
    """Excerpts of republished articles found through anchors every shard holds a part of."""
    cfg = config_module.load(None, ("excerpts.enabled=true", f"templates.enabled={templates}"), environ={})
    batches = _web_batches(pages=900, sites=12, seed=13)
    single = _single(cfg, tmp_path / "single", batches)
    assert sum(f[1] == "duplicate" for f in single) > sum(f[1] == "duplicate" for f in _single(
        config_module.load(None, (f"templates.enabled={templates}",), environ={}), tmp_path / "none", batches))
    assert _sharded(cfg, tmp_path / "sharded", batches, 3)[0] == single


def test_evidence_of_a_shard_of_the_version_before_is_read():
    """A shard's evidence packed without ``unkept`` (before duplicates could hold places) reads as none unkept."""
    import msgpack

    fields = msgpack.unpackb(Evidence(replays={1: ["a"]}).pack(), strict_map_key=False)
    evidence = Evidence.unpack(msgpack.packb(fields[:11], use_bin_type=True))
    assert evidence.replays == {1: ["a"]} and evidence.unkept == []
