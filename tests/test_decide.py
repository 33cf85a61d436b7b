"""Decisions: kept, near duplicate, exact copy, replay, new version, order within a batch."""

from __future__ import annotations

import pytest

from streamdedup import config as config_module
from streamdedup.core.records import Document, Rejected, Source
from streamdedup.core.verify import jaccard
from streamdedup.engine.engine import Engine

BASE = " ".join(f"word{i} filler{i % 7} term{i % 13}" for i in range(60))


def _edit(text, every):
    words = text.split()
    return " ".join("CHANGED" if i % every == 0 else w for i, w in enumerate(words))


@pytest.fixture(params=[100000, 1], ids=["recent-log", "merged-every-batch"])
def index(tmp_path, request):
    """An engine whose lookups come from the recent log, or from tables merged after every batch."""
    cfg = config_module.load(None, (f"index.merge_every={request.param}",), environ={})
    with Engine(cfg, str(tmp_path)) as engine:
        yield engine


def _run(engine, pairs):
    items = [Document(doc_id, text, Source("t", -1, n)) for n, (doc_id, text) in enumerate(pairs)]
    return engine.decide_batch(engine.prepare(items))


def test_kept_then_near_duplicate_then_exact_copy(index):
    near = _edit(BASE, 40)
    first = _run(index, [("a", BASE)])
    second = _run(index, [("b", near), ("c", BASE.upper() + " !!")])
    assert first[0].status == "kept" and first[0].cluster == "a"
    b, c = second
    assert (b.status, b.cluster, b.matched) == ("duplicate", "a", "a")
    assert b.similarity >= 0.7 and not b.exact
    assert (c.status, c.cluster, c.matched, c.similarity, c.exact) == ("duplicate", "a", "a", 1.0, True)


def test_look_alikes_inside_one_batch_are_found(index):
    decisions = _run(index, [("a", BASE), ("b", _edit(BASE, 40)), ("c", "entirely different words " * 20)])
    assert [d.status for d in decisions] == ["kept", "duplicate", "kept"]
    assert decisions[1].matched == "a"


def test_replay_returns_the_earlier_decision_not_a_duplicate_of_itself(index):
    first = _run(index, [("a", BASE), ("b", _edit(BASE, 40))])
    again = _run(index, [("a", BASE), ("b", _edit(BASE, 40))])
    assert [(d.status, d.cluster, d.matched) for d in again] == [(d.status, d.cluster, d.matched) for d in first]
    assert all(d.replayed for d in again)
    with index.index.read() as txn:
        assert txn.counters["documents"] == 2


def test_same_id_with_new_content_is_a_new_version(index):
    _run(index, [("a", BASE)])
    (version,) = _run(index, [("a", "completely new article text " * 10)])
    assert version.status == "kept" and not version.replayed
    with index.index.read() as txn:
        records = list(txn.records())
    assert [r.id for r in records] == ["a", "a"] and records[0].content != records[1].content


def test_duplicates_join_the_best_match_and_never_chain(index):
    a = BASE
    b = _edit(BASE, 9)  # below the threshold with a
    assert jaccard_of(a, b) < 0.7
    between = _edit(BASE, 18)
    decisions = _run(index, [("a", a), ("b", b), ("m", between)])
    assert [d.status for d in decisions][:2] == ["kept", "kept"]
    m = decisions[2]
    assert m.status == "duplicate"
    assert m.similarity == pytest.approx(max(jaccard_of(between, a), jaccard_of(between, b)))


def test_ties_go_to_the_earliest_kept_document(index):
    other = "alpha beta gamma delta " * 30
    _run(index, [("first", BASE), ("second", BASE + " " + other)])
    (d,) = _run(index, [("x", BASE.replace("word1 ", "word1 "))])
    assert d.exact and d.matched == "first"


def test_rejected_items_pass_through_in_order(index):
    items = [Rejected("invalid_json", "bad", Source("t", -1, 1)), Document("a", BASE, Source("t", -1, 2)),
             Document("p", "!!! ... ???", Source("t", -1, 3))]
    decisions = index.decide_batch(index.prepare(items))
    assert [d.status for d in decisions] == ["rejected", "kept", "rejected"]
    assert decisions[0].id == "t:1" and decisions[2].reason.startswith("empty_text")


def jaccard_of(x, y):
    from streamdedup.core.shingle import normalize_batch, shingle_batch

    batch = shingle_batch(normalize_batch([x, y]))
    return jaccard(batch.of(0), batch.of(1))


def test_merging_recent_keys_into_the_tables_changes_no_decision(tmp_path, crawl):
    """The same crawl with merges after every batch, every 7 batches, and never: the same decisions."""
    results = []
    for every in (1, 700, 10 ** 6):
        cfg = config_module.load(None, (f"index.merge_every={every}",), environ={})
        with Engine(cfg, str(tmp_path / str(every))) as engine:
            items = [Document(d.id, d.text, Source("c", -1, i)) for i, d in enumerate(crawl)]
            decided = []
            for start in range(0, len(items), 100):
                decided += engine.decide_batch(engine.prepare(items[start:start + 100]))
            results.append([(d.status, d.cluster, d.matched, d.exact) for d in decided])
            from streamdedup.store.check import check_index

            report = check_index(engine.index)
            assert report.ok, report.problems
    assert results[0] == results[1] == results[2]


def _trap_pages(count, start=0):
    """Pages of one 60-word template with 8 words changed per page: pairs near Jaccard 0.45, most bands shared."""
    import random

    rng = random.Random(5)
    template = BASE.split()[:60]
    slots = sorted(rng.sample(range(60), 8))
    pages = []
    for n in range(start + count):
        words = list(template)
        for slot in slots:
            words[slot] = f"w{rng.randrange(10**9)}"
        pages.append((f"trap-{n}", " ".join(words)))
    return pages[start:]


@pytest.mark.parametrize("merge_every", [100000, 1], ids=["recent-log", "merged-every-batch"])
def test_a_band_key_held_by_many_kept_documents_gives_each_document_at_most_max_candidates_of_them(
        tmp_path, merge_every):
    """A hot key (a crawler trap's template) proposes its earliest ``lsh.max_candidates`` holders, not all:
    what a document reads and counts stays bounded however large the trap grows, in the batch and after it."""
    cfg = config_module.load(None, (f"index.merge_every={merge_every}", "lsh.max_candidates=2"), environ={})
    with Engine(cfg, str(tmp_path)) as engine:
        first = _run(engine, _trap_pages(150))
        later = _run(engine, _trap_pages(150, start=150))
        bands = engine.signing.bands
    decided = first + later
    assert sum(d.status == "kept" for d in decided) > 150, "the trap's pages are mostly below the threshold"
    assert max(d.candidates for d in decided) <= 2 * bands
    assert max(d.candidates for d in later) > 2, "committed holders are proposed too"
    assert all(d.verified <= 2 for d in decided)


def _one_id_hash(monkeypatch):
    """Every document id hashed to the same 8-byte key, as two ids of a real collision are."""
    import streamdedup.core.prepare
    import streamdedup.store.check
    import streamdedup.store.housekeeping

    for module in (streamdedup.core.prepare, streamdedup.store.check, streamdedup.store.housekeeping):
        monkeypatch.setattr(module, "id_key", lambda doc_id: b"\x07" * 8)
    monkeypatch.setattr(streamdedup.core.prepare, "id_keys_of", lambda ids: [b"\x07" * 8] * len(ids))


def test_ids_sharing_a_hash_stay_two_documents(index, monkeypatch):
    """The ids table is keyed by 8-byte hashes: a hit whose record has another id is not a replay of it."""
    from streamdedup.store.check import check_index

    _one_id_hash(monkeypatch)
    a, b = _run(index, [("a", BASE)]) + _run(index, [("b", BASE)])
    assert (a.status, a.replayed) == ("kept", False)
    assert (b.status, b.exact, b.matched, b.replayed) == ("duplicate", True, "a", False)
    again = _run(index, [("b", BASE), ("a", BASE)])
    assert [(d.id, d.status, d.replayed) for d in again] == [("b", "duplicate", True), ("a", "kept", True)]
    assert check_index(index.index).ok
    report = index.forget(["a"])
    assert report.forgotten == ["a"] and report.released == 1
    assert _run(index, [("b", BASE)])[0].replayed  # b is still there


def test_contents_sharing_a_hash_prefix_change_no_decision(tmp_path, crawl, monkeypatch):
    """The content table is keyed by 8 bytes of the content hash: with contents under 256 keys (a
    collision every few documents), exact copies, merges, forget and check come out as with the real keys."""
    import streamdedup.store.check
    import streamdedup.store.housekeeping
    import streamdedup.store.merge
    import streamdedup.store.mirror
    import streamdedup.store.view
    from streamdedup.store.check import check_index

    def decisions(folder, every):
        cfg = config_module.load(None, (f"index.merge_every={every}",), environ={})
        with Engine(cfg, str(tmp_path / folder)) as engine:
            items = [Document(d.id, d.text, Source("c", -1, i)) for i, d in enumerate(crawl)]
            decided = []
            for start in range(0, len(items), 100):
                decided += engine.decide_batch(engine.prepare(items[start:start + 100]))
            report = check_index(engine.index)
            assert report.ok, report.problems
            engine.forget([items[0].id, items[500].id])
            decided += engine.decide_batch(engine.prepare(items[:200]))
        return [(d.status, d.cluster, d.matched, d.exact, d.replayed) for d in decided]

    real = decisions("real", 700)
    assert sum(d[3] for d in real) > 20  # exact copies were decided
    for module in (streamdedup.store.check, streamdedup.store.housekeeping, streamdedup.store.merge,
                   streamdedup.store.mirror, streamdedup.store.view):
        monkeypatch.setattr(module, "content_key", lambda content: content[:1] * 8)
    assert decisions("one-key-merged", 1) == real
    assert decisions("one-key-merged-every-7", 700) == real


def _places(engine):
    """(band entries, duplicates' places among them) of the index once its recent keys are merged."""
    from streamdedup.store.check import check_index

    engine.merge_recent()
    report = check_index(engine.index)
    assert report.ok, report.problems
    return report.band_entries, report.places


@pytest.mark.parametrize("together", [False, True], ids=["batch by batch", "one batch"])
def test_a_band_key_gives_its_places_to_its_first_probers_and_exact_copies_probe_nothing(tmp_path, together):
    """With ``lsh.max_candidates`` 2 a page's keys have two places. Exact copies look no key up and take none;
    a near copy takes a place under each key, as a duplicate (proposing nothing), which closes the keys it
    shares with the page; a later near copy still finds the page, the first of the places."""
    cfg = config_module.load(None, ("lsh.max_candidates=2", 'lsh.cap="probes"'), environ={})
    pairs = [("a", BASE)] + [(f"copy{n}", BASE) for n in range(3)] + [("near", _edit(BASE, 40))]
    with Engine(cfg, str(tmp_path)) as engine:
        decided = _run(engine, pairs) if together else [d for pair in pairs for d in _run(engine, [pair])]
        assert [d.status for d in decided] == ["kept"] + ["duplicate"] * 4
        assert [d.exact for d in decided[1:]] == [True, True, True, False]
        bands = engine.signing.bands
        assert _places(engine) == (2 * bands, bands)
        later = _run(engine, [("later", _edit(BASE, 30))])[0]
    assert (later.status, later.matched) == ("duplicate", "a")


@pytest.mark.parametrize("merge_every", [100000, 1], ids=["recent-log", "merged-every-batch"])
def test_a_forgotten_duplicate_keeps_its_places_and_check_fix_keeps_them_too(tmp_path, merge_every):
    """Forgetting frees a kept document's places only: a duplicate's stay taken, in the recent log and in the
    tables alike (where merges happened changes nothing), and ``check --fix`` rebuilds them as they were."""
    cfg = config_module.load(None, (f"index.merge_every={merge_every}", 'lsh.cap="probes"'), environ={})
    with Engine(cfg, str(tmp_path)) as engine:
        _forget_and_rebuild(engine)


def test_with_the_cap_on_kept_documents_a_duplicate_takes_no_place(index):
    _run(index, [("a", BASE), ("b", _edit(BASE, 40)), ("c", _edit(BASE, 30))])
    assert _places(index) == (index.signing.bands, 0)


def _forget_and_rebuild(index):
    _run(index, [("a", BASE), ("b", _edit(BASE, 40)), ("other", "entirely different words " * 20)])
    _run(index, [("c", BASE)])
    index.forget(["b", "c"])
    bands = index.signing.bands
    entries, places = _places(index)
    assert places >= bands  # b's and c's places, though neither has a record now
    index.rebuild()
    assert _places(index) == (entries, places)
    index.forget(["a"])
    assert _places(index) == (entries - bands, places)


@pytest.mark.parametrize("cap", ["kept", "probes"])
@pytest.mark.parametrize("max_candidates", [2, 100])
def test_with_retention_decisions_do_not_depend_on_when_the_sweep_ran(tmp_path, cap, max_candidates):
    """Kept documents past retention count towards no key's ``max_candidates``, swept or not yet: the same
    decisions whether the sweep runs after every batch or never (it runs when the clock says it is due)."""
    from streamdedup.core import corpus

    items = [Document(d.id, d.text, Source("t", -1, n)) for n, d in enumerate(corpus.hot_keys(500, seed=5))]

    def decided(sweep: bool, folder: str) -> list:
        cfg = config_module.load(None, (f'lsh.cap="{cap}"', f"lsh.max_candidates={max_candidates}",
                                        "index.retention_days=1", "templates.enabled=false"), environ={})
        now = [1.7e9]
        out = []
        with Engine(cfg, str(tmp_path / folder), clock=lambda: now[0]) as engine:
            for begin in range(0, len(items), 50):
                out += engine.decide_batch(engine.prepare(items[begin:begin + 50]))
                now[0] += 40000.0  # documents leave retention two batches after being kept
                if sweep:
                    assert engine.sweep(budget=10 ** 9) >= 0
        return out

    swept, never = decided(True, "swept"), decided(False, "never")
    assert swept == never
    assert sum(d.status == "duplicate" for d in swept) > 50


def test_a_decided_batch_leaves_nothing_for_the_cycle_collector(tmp_path):
    """A batch's decision state (``decide._State``, its records) is freed by refcounting as the batch ends: the
    collector, which runs after each batch, would otherwise walk every record of it (a tenth of deciding)."""
    import gc

    pages = [(f"p{n}", f"shared words of every page number {n} " + _edit(BASE, 40 + n)) for n in range(60)]
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        _run(engine, pages[:20])
        _run(engine, pages[20:40])  # whatever a first batch makes once
        gc.collect()
        gc.disable()
        try:
            _run(engine, pages[40:] + [("again", BASE)])
            assert gc.collect() == 0
        finally:
            gc.enable()


def test_stored_codings_read_at_once_are_those_read_one_by_one(tmp_path):
    """``IndexTxn.stored_codings`` (a batch's candidates' codings read in one pass): what ``stored_coding``
    gives each serial, and nothing for a duplicate's serial or one never numbered."""
    pages = [("a", BASE), ("b", _edit(BASE, 40)), ("c", "entirely different words " * 20), ("d", BASE)]
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        _run(engine, pages)
        with engine.index.read() as txn:
            serials = [1, 2, 3, 4, 99]
            one_by_one = {serial: txn.stored_coding(serial) for serial in serials}
            assert txn.stored_codings(serials) == {s: c for s, c in one_by_one.items() if c is not None}
            assert 0 < len(txn.stored_codings(serials)) < 4


def test_record_ids_read_at_once_are_those_read_one_by_one(tmp_path, monkeypatch):
    """``IndexTxn.record_ids`` (the ids of a batch's matches, read in one pass, in the kernel when there is one):
    what ``record_id`` gives each serial, with the kernel and without, and a missing record says so;
    ``stored_codings`` the same with the kernel and without."""
    from streamdedup.errors import IndexCorruptError
    from streamdedup.store import index as index_module

    pages = [("a", BASE), ("b", _edit(BASE, 40)), ("c", "entirely different words " * 20), ("é-d", BASE)]
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        _run(engine, pages)
        with engine.index.read() as txn:
            serials = [4, 2, 1, 3, 2]
            one_by_one = {serial: txn.record_id(serial) for serial in sorted(set(serials))}
            codings = txn.stored_codings([1, 2, 3, 4, 99])
            for kernel in (index_module._kernel, None):
                monkeypatch.setattr(index_module, "_kernel", kernel)
                assert list(txn.record_ids(serials).items()) == list(one_by_one.items())
                assert txn.record_ids([]) == {}
                with pytest.raises(IndexCorruptError):
                    txn.record_ids([1, 99])
                assert txn.stored_codings([1, 2, 3, 4, 99]) == codings
            assert one_by_one[4] == "é-d"


@pytest.mark.parametrize("settings", [(), ("templates.enabled=false",), ('lsh.cap="probes"', "lsh.max_candidates=2")],
                         ids=["defaults", "no-templates", "probes-cap-2"])
def test_rows_the_first_round_settles_decide_the_same_without_their_band_lookups(tmp_path, crawl, monkeypatch,
                                                                                    settings):
    """Replays and exact copies of documents far back (in the band table, merged) are decided by the first round:
    the slots only they probe are not looked up (``evidence.slots_looked_up``), and the batch decides and files
    exactly as with every slot looked up, its later batches too; a slot such a row shares with a near copy of the
    same document is still asked."""
    from streamdedup.engine import evidence as evidence_module
    from streamdedup.store.check import check_index

    docs = [(d.id, d.text) for d in crawl[:600]]
    originals = docs[:200]
    mixed = ([(f"copy-{i}", text) for i, text in originals[:40]] + docs[300:320]  # exact copies, replays
             + [(f"near-{i}", _edit(text, 25)) for i, text in originals[:10]]  # near copies of copied originals
             + [(f"new-{i}", f"unrelated {i} " + BASE) for i in range(3)])
    later = [(f"later-{i}", text) for i, text in originals[40:60]] + [(f"edit-{i}", _edit(t, 20)) for i, t in docs[:20]]

    def outcomes(path, apart):
        monkeypatch.setattr(evidence_module, "_settled_apart",
                            apart if apart is not None else lambda asking, content: False)
        cfg = config_module.load(None, ("index.merge_every=200", *settings), environ={})
        with Engine(cfg, str(tmp_path / path)) as engine:
            for start in range(0, len(docs), 100):
                _run(engine, docs[start:start + 100])
            decided = [_run(engine, mixed), _run(engine, later)]
            report = check_index(engine.index)
            assert report.ok, report.problems
            return [[(d.status, d.cluster, d.matched, d.similarity, d.exact, d.replayed, d.candidates, d.verified)
                     for d in batch] for batch in decided], _places(engine)

    asked_and_looked_up = []
    real_slots = evidence_module.slots_looked_up

    def recording(asked, rows, asking, content):
        looked_up = real_slots(asked, rows, asking, content)
        asked_and_looked_up.append((len(set(asked.tolist())), len(set(looked_up.tolist()))))
        return looked_up

    monkeypatch.setattr(evidence_module, "slots_looked_up", recording)
    skipping = outcomes("skipping", evidence_module._settled_apart)
    assert any(looked_up < asked for asked, looked_up in asked_and_looked_up)
    everything = outcomes("everything", None)
    assert skipping == everything
    statuses = [d[0] for d in skipping[0][0]]
    assert statuses[:40] == ["duplicate"] * 40 and all(d[4] for d in skipping[0][0][:40])
    assert all(d[5] for d in skipping[0][0][40:60])
