"""Band tables split by key (``engine.vshards``): the same decisions as a single worker, whatever happens.

Every test runs a key-split deployment in one process (``vshards.simulator``)
with messages delivered in an order drawn from a seed, some twice, over
epochs cut at sizes drawn from a seed, and compares each outcome, record
for record, with a single worker (a real ``Engine`` on an LMDB index) fed
the same input in the deployment's order.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from streamdedup import config as configuration
from streamdedup.core import corpus
from streamdedup.core.records import Document, Source
from streamdedup.engine.engine import Engine
from streamdedup.engine.vshards import Message, VShard, check_supported
from streamdedup.engine.vshards.simulator import Forget, Simulator, cut_epochs
from streamdedup.errors import ConfigError

NOW = 1.75e9
LAYOUTS = [(1, 1), (2, 2), (3, 2), (8, 4), (16, 4), (16, 1)]  # (vshards, processes)


def _config(tmp_path, *extra):
    return configuration.load(None, ('lsh.cap="probes"', "templates.enabled=false",
                                     f'index.path="{tmp_path / "single"}"', *extra), environ={})


def _items(texts):
    return [Document(doc_id, text, Source("in", 0, offset)) for offset, (doc_id, text) in enumerate(texts)]


def _single_worker(config, order, batch=89):
    decisions = []
    with Engine(config, clock=lambda: NOW) as engine:
        for begin in range(0, len(order), batch):
            decisions += engine.decide_batch(engine.prepare(order[begin:begin + batch]))
    return decisions


def _assert_same_as_single_worker(tmp_path, items, vshards, processes, seed, extra=(), largest=48, duplicates=0.1,
                                  partitions=1, **options):
    """The deployment on ``items`` (one input partition, or dealt into several) against a single worker fed the
    deployment's order: on one partition, the partition's own order. ``options`` go to the simulator."""
    config = _config(tmp_path, *extra)
    with Simulator(config, vshards, processes, seed=seed, duplicates=duplicates, clock=lambda: NOW,
                   **options) as simulator:
        run = simulator.decide(cut_epochs([items[p::partitions] for p in range(partitions)], seed=seed,
                                          largest=largest))
    if partitions == 1:
        assert run.order == items
    assert sorted(item.source.offset for item in run.order) == list(range(len(items)))
    expected = _single_worker(config, run.order)
    assert len(run.decisions) == len(expected)
    for item, got, want in zip(run.order, run.decisions, expected):
        assert got == want, item.id
    return run, expected


def _words(rng, n):
    return [f"w{rng.randrange(10 ** 9)}" for _ in range(n)]


def _edited(words, rng, changes):
    """``words`` with ``changes`` words replaced, at places far apart (each changes three shingles)."""
    words = list(words)
    for at in rng.sample(range(0, len(words), 5), changes):
        words[at] = _words(rng, 1)[0]
    return words


def _chains_and_ties(seed, families=40):
    """Chains (A like B, B like C, A unlike C), ties (D as like A as B, A unlike B), exact copies of
    duplicates, replays and new versions, and blank records, shuffled so that a family falls inside one
    epoch or across several."""
    rng = random.Random(seed)
    texts = []
    for family in range(families):
        a = _words(rng, 100)
        b = _edited(a, rng, 4)
        c = _edited(b, rng, 4)
        texts += [(f"chain{family}-a", a), (f"chain{family}-b", b), (f"chain{family}-c", c)]
        x, y, z = _words(rng, 100), _words(rng, 35), _words(rng, 35)
        texts += [(f"tie{family}-a", x + y), (f"tie{family}-b", x + z), (f"tie{family}-d", x)]
    rng.shuffle(texts)
    texts = [(doc_id, " ".join(words)) for doc_id, words in texts]
    later = []
    for doc_id, text in rng.sample(texts, 30):
        later.append((doc_id, text))  # a replay
        later.append((doc_id, text + " " + " ".join(_words(rng, 3))))  # a new version
        later.append((doc_id + "-copy", text))  # an exact copy (of a duplicate, for some)
    later += [(f"blank{i}", "   ") for i in range(5)]
    rng.shuffle(later)
    return texts + later


@pytest.mark.parametrize("vshards, processes", LAYOUTS)
def test_the_synthetic_crawl_is_decided_as_by_one_worker(tmp_path, vshards, processes):
    items = _items((doc.id, doc.text) for doc in corpus.generate(150, seed=vshards))
    run, expected = _assert_same_as_single_worker(tmp_path, items, vshards, processes, seed=vshards)
    assert sum(d.status == "duplicate" for d in expected) > 50


@pytest.mark.parametrize("max_candidates", [1, 2, 3, 100])
@pytest.mark.parametrize("vshards, processes", [(1, 1), (3, 2), (8, 4), (16, 4)])
def test_hot_keys_are_decided_as_by_one_worker(tmp_path, vshards, processes, max_candidates):
    items = _items((doc.id, doc.text) for doc in corpus.hot_keys(400, seed=5))
    _assert_same_as_single_worker(tmp_path, items, vshards, processes, seed=max_candidates,
                                  extra=[f"lsh.max_candidates={max_candidates}"])


CUTS = [(1, 1), (8, 3), (200, 1), (400, 2)]  # (largest epoch a partition, partitions)


@pytest.mark.parametrize("vshards, processes, largest, partitions",
                         [(*layout, *cut) for layout in LAYOUTS for cut in CUTS
                          if not (layout[0] >= 8 and cut[0] == 1)]  # a record an epoch: 8 x 8 x 16^2 messages
                         + [(8, 4, 3, 1), (16, 4, 5, 1)])
def test_chains_ties_copies_replays_and_versions_within_and_across_epochs(tmp_path, vshards, processes, largest,
                                                                          partitions):
    items = _items(_chains_and_ties(seed=largest))
    run, expected = _assert_same_as_single_worker(tmp_path, items, vshards, processes, seed=vshards,
                                                  largest=largest, partitions=partitions)
    by_id = {}
    for item, decision in zip(run.order, expected):
        by_id.setdefault(item.id, []).append(decision)
    assert any(d.replayed for d in expected) and any(d.exact for d in expected)
    assert sum(d.status == "rejected" for d in expected) == 5
    chained = [f for f in range(40) if by_id[f"chain{f}-c"][0].status == "kept"
               and by_id[f"chain{f}-b"][0].status == "duplicate"]
    assert chained, "some chain has B a duplicate and C kept (A unlike C)"
    ties = [f for f in range(40) if all(by_id[f"tie{f}-{x}"][0].status == "kept" for x in "ab")
            and by_id[f"tie{f}-d"][0].status == "duplicate"]
    assert ties, "some D is as like A as B, both kept"


@pytest.mark.parametrize("seed", range(6))
def test_any_delivery_order_and_any_cut_gives_the_same_outcomes(tmp_path, seed):
    items = _items((doc.id, doc.text) for doc in corpus.hot_keys(300, seed=11))
    config = _config(tmp_path, "lsh.max_candidates=2")
    for vshards in (2, 5):
        epochs = cut_epochs([items[0::2], items[1::2]], seed=seed, largest=30)
        outcomes = set()
        for delivery in range(3):
            simulator = Simulator(config, vshards, seed=seed * 10 + delivery, duplicates=0.3, clock=lambda: NOW)
            run = simulator.decide(epochs)
            outcomes.add(repr([(item.id, decision) for item, decision in zip(run.order, run.decisions)]))
        assert len(outcomes) == 1, "a change of delivery order changed an outcome"


def test_what_cannot_be_split_by_key_yet_is_refused_by_name(tmp_path):
    for setting, named in [('lsh.cap="kept"', "lsh.cap"), ("templates.enabled=true", "templates"),
                           ("excerpts.enabled=true", "excerpts"), ("index.retention_days=30", "retention")]:
        config = configuration.load(None, ('lsh.cap="probes"', "templates.enabled=false", setting), environ={})
        with pytest.raises(ConfigError, match=named):
            check_supported(config)
    config = configuration.load(None, ('lsh.cap="kept"',), environ={})
    from streamdedup.core.signing import signing_config
    from streamdedup.engine.settings import DedupSettings

    with pytest.raises(ConfigError, match="probes"):
        VShard(0, 2, DedupSettings.of(config, signing_config(config)))


def test_the_cache_of_closed_keys_changes_no_outcome(tmp_path):
    """Homes answer closed keys from a bounded cache; whatever it holds or drops, the outcomes are the same
    (and with ``max_candidates`` 1, most keys close)."""
    from streamdedup.engine.vshards.stores import ClosedKeys

    items = _items((doc.id, doc.text) for doc in corpus.hot_keys(300, seed=3))
    config = _config(tmp_path, "lsh.max_candidates=1")
    epochs = cut_epochs([items], seed=4, largest=40)
    outcomes = []
    for keys, limit in [(4096, 1 << 20), (2, 3), (0, 0)]:
        simulator = Simulator(config, 4, seed=9, clock=lambda: NOW)
        for vshard in simulator.vshards:
            vshard.closed = ClosedKeys(keys, limit)
        run = simulator.decide(epochs)
        outcomes.append(repr(run.decisions))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    cache = ClosedKeys(keys=2, limit=100)
    cache.add({5: np.array([1, 2]), 3: np.array([4])})
    cache.add({9: np.array([7])})
    assert cache.cached(np.array([3, 5, 9], dtype=np.uint64)).tolist() == [True, False, True]


@pytest.mark.parametrize("vshards, processes", [(1, 1), (3, 2), (8, 4)])
def test_forget_in_the_middle_is_decided_as_by_one_worker(tmp_path, vshards, processes):
    """A forget order between two epochs: kept documents with members elsewhere (their clusters dissolved,
    their places freed, hot keys reopened), duplicates (their places stay), first documents of a content,
    every version of an id, and an unknown id; then more of the same input, exact copies of the forgotten
    and of dissolved members among it."""
    _assert_forget_in_the_middle_as_by_one_worker(tmp_path, vshards, processes)


def _assert_forget_in_the_middle_as_by_one_worker(tmp_path, vshards, processes, **options):
    """``test_forget_in_the_middle_is_decided_as_by_one_worker``; ``options`` go to the simulator. The run."""
    rng = random.Random(vshards)
    texts = _chains_and_ties(seed=7)
    first, rest = texts[:200], texts[200:]
    rest += [(f"again-{doc_id}", text) for doc_id, text in rng.sample(first, 60)]
    rng.shuffle(rest)
    items = _items(first + rest)
    forgotten = sorted({doc_id for doc_id, _ in rng.sample(first, 40)}) + ["never-seen"]
    config = _config(tmp_path, "lsh.max_candidates=3")
    epochs = cut_epochs([items[:200]], seed=vshards, largest=30) + [Forget(tuple(forgotten))] \
        + cut_epochs([items[200:]], seed=vshards + 1, largest=30)
    with Simulator(config, vshards, processes, seed=vshards, duplicates=0.1, clock=lambda: NOW,
                   **options) as simulator:
        run = simulator.decide(epochs)
    assert run.order == items
    expected = []
    with Engine(config, clock=lambda: NOW) as engine:
        expected += engine.decide_batch(engine.prepare(items[:200]))
        report = engine.forget(forgotten)
        for begin in range(200, len(items), 50):
            expected += engine.decide_batch(engine.prepare(items[begin:begin + 50]))
    assert report.dissolved and report.released, "the forget dissolves clusters with members"
    for item, got, want in zip(run.order, run.decisions, expected):
        assert got == want, item.id
    assert any(d.status == "kept" for item, d in zip(items, expected) if item.id.startswith("again-"))
    return run


def test_forgetting_reopens_closed_keys_in_every_home(tmp_path):
    """Keys closed (two places each, hot keys) and cached by the homes probing them: forgetting kept
    documents frees places in them, and the next probers take those places, as in one index."""
    items = _items((doc.id, doc.text) for doc in corpus.hot_keys(500, seed=21))
    config = _config(tmp_path, "lsh.max_candidates=2")
    with Engine(config, clock=lambda: NOW) as engine:
        expected = engine.decide_batch(engine.prepare(items[:250]))
        forgotten = [item.id for item, d in zip(items[:60], expected) if d.status == "kept"]
        engine.forget(forgotten)
        expected += engine.decide_batch(engine.prepare(items[250:]))
    epochs = cut_epochs([items[:250]], seed=2, largest=25) + [Forget(tuple(forgotten))] \
        + cut_epochs([items[250:]], seed=3, largest=25)
    simulator = Simulator(config, 4, seed=6, clock=lambda: NOW)
    run = simulator.decide(epochs)
    for item, got, want in zip(run.order, run.decisions, expected):
        assert got == want, item.id
    assert len(forgotten) > 10


def test_a_vshard_refuses_records_it_is_not_home_to_and_epochs_out_of_order(tmp_path):
    from streamdedup.core.signing import signing_config
    from streamdedup.engine.settings import DedupSettings
    from streamdedup.engine.vshards.simulator import homes_of_items

    config = _config(tmp_path)
    vshard = VShard(0, 4, DedupSettings.of(config, signing_config(config)))
    items = _items((f"doc-{i}", f"some words of document {i} here") for i in range(40))
    elsewhere = [item for item, home in zip(items, homes_of_items(items, 4)) if home != 0]
    with pytest.raises(ValueError, match="not home to"):
        vshard.slice(0, elsewhere, list(range(1, len(elsewhere) + 1)), (1, len(elsewhere) + 1), NOW)
    with pytest.raises(ValueError, match="one after the other"):
        vshard.slice(1, [], [], (1, 1), NOW)


@pytest.mark.parametrize("vshards", [1, 3])
def test_a_forgotten_first_document_of_a_content_hands_on_to_the_next(tmp_path, vshards):
    """As in one index's content table: forgetting the first document of a content makes the next one with
    that content its first, and a copy made later is an exact copy of it, or not when that one's cluster was
    dissolved (its representative forgotten)."""
    rng = random.Random(5)
    base = _words(rng, 120)
    near = " ".join(_edited(base, rng, 3))
    lone = " ".join(_words(rng, 120))
    texts = [("k", " ".join(base)), ("a", near), ("b", near), ("x", lone), ("y", lone)]
    later = [("c", near), ("z", lone)]
    items = _items(texts + later)
    forgotten = ("a", "x")  # a duplicate first of its content; a kept one, first of its content, with a member
    config = _config(tmp_path)
    with Engine(config, clock=lambda: NOW) as engine:
        expected = engine.decide_batch(engine.prepare(items[:5]))
        engine.forget(list(forgotten))
        expected += engine.decide_batch(engine.prepare(items[5:]))
    run = Simulator(config, vshards, seed=1, clock=lambda: NOW).decide([items[:5], Forget(forgotten), items[5:]])
    assert run.decisions == expected
    c, z = expected[5], expected[6]
    assert c.exact and c.matched == "b" and c.cluster == "k"  # b is first now, still in k's cluster
    assert not z.exact and z.status == "kept"  # y is first now, its cluster (x's) dissolved


def _host_of(vshard_number: int, epochs_done: int, stages: list, position: int):
    """A ``VShardHost`` with one hosted vshard and an inbound of ``stages`` polled but not taken: no broker."""
    from types import SimpleNamespace

    from streamdedup.runtime.vshards.host import VShardHost, _Hosted

    host = object.__new__(VShardHost)
    host.inbound = SimpleNamespace(stages=stages, exchange_position=lambda number: position)
    h = _Hosted(SimpleNamespace(number=vshard_number, epochs_done=epochs_done))
    host.hosted = {vshard_number: h}
    return host, h


def test_the_exchange_position_committed_with_an_epoch_passes_no_message_still_to_be_delivered():
    """An epoch committed while messages of the next are polled but not delivered (in the batch being
    delivered, or polled while an epoch started) must keep them for a restart: its exchange floor is the
    lowest of them, else the first of a later epoch read, else the consumer's position."""
    from streamdedup.runtime.vshards.messages import pack_message

    host, h = _host_of(3, 5, [(3, 17, b""), (4, 2, b"")], position=40)
    h.floors = {5: 12, 6: 20}
    assert host._exchange_floor(h, 5) == 17
    host.inbound.stages = []
    assert host._exchange_floor(h, 5) == 20
    h.floors = {}
    assert host._exchange_floor(h, 6) == 40

    floors_at_delivery = []
    host._deliver = lambda hosted, message: floors_at_delivery.append(dict(hosted.floors))
    host._receive([(3, 30, pack_message(Message(5, "contents", 1, 3, b""))),
                   (3, 31, pack_message(Message(6, "contents", 1, 3, b"")))])
    assert floors_at_delivery[0] == {5: 30, 6: 31}  # epoch 6's message counts before epoch 5 may commit


@pytest.mark.parametrize("kernel", [True, False])
def test_rows_surely_kept_take_the_quick_path_in_a_vshard_and_are_decided_as_by_one_worker(tmp_path, monkeypatch,
                                                                                          kernel):
    """A vshard decides its rows surely kept (``decide._State.alone_rows``) as the single worker's quick path
    does, one row a call since the gathered serials are not consecutive (``_State.keep_alone_at``: the kernel's
    ``kept_alone``, or ``kept_alone`` without it), and the outcomes are the single worker's."""
    from streamdedup.engine import decide

    if not kernel:
        monkeypatch.setattr(decide, "_kernel", None)
    keep_alone_at, kept = decide._State.keep_alone_at, []

    def noted(state, decisions, i, serial):
        kept.append(serial)
        return keep_alone_at(state, decisions, i, serial)

    monkeypatch.setattr(decide._State, "keep_alone_at", noted)
    items = _items((doc.id, doc.text) for doc in corpus.generate(150, seed=4))
    _, expected = _assert_same_as_single_worker(tmp_path, items, 8, 4, seed=4)
    assert len(set(kept)) > len(items) // 3
    assert sum(d.status == "duplicate" for d in expected) > 50


def test_band_slots_and_serials_sort_by_slot_then_serial_in_epochs_of_any_size():
    """``vshard._slotted`` sorts (slot, offset in the epoch) pairs by one key: the slot's 40 bits and the
    offset's 24; in an epoch of 2^24 records or more, by the pairs' ranks. Either way, ``np.lexsort``'s order."""
    from streamdedup.engine.vshards.vshard import _slot_then_offset

    rng = np.random.default_rng(7)
    slots = (rng.integers(0, 256, 4000).astype(np.uint64) << np.uint64(32)) | rng.integers(0, 2 ** 32, 4000).astype(
        np.uint64)
    slots[:50] = slots[50:100]  # keys probed by several documents
    for largest in (1000, 1 << 24, 1 << 30):
        offsets = rng.integers(0, largest, 4000).astype(np.uint64)
        want = np.lexsort((offsets, slots))
        got = np.argsort(_slot_then_offset(slots, offsets))
        assert (slots[got] == slots[want]).all() and (offsets[got] == offsets[want]).all()


def test_serials_beside_band_slots_travel_as_runs_and_come_back_one_a_slot():
    """``vshard._runs``: a probing document's slots to one owner go together, so its serial goes once with a
    length; any sequence comes back as it was, runs longer than 2-byte lengths hold included."""
    from types import SimpleNamespace

    from streamdedup.engine.vshards.vshard import _from_runs, _runs

    epoch = SimpleNamespace(first=1_000)
    rng = np.random.default_rng(3)
    probing = np.repeat(np.sort(rng.integers(1_000, 60_000, 300)), rng.integers(1, 33, 300))
    for serials in (probing, rng.integers(1_000, 2_000, 500), np.full(70_000, 1_005), np.zeros(0, dtype=np.int64)):
        body = _runs(epoch, np.asarray(serials, dtype=np.int64))
        assert np.array_equal(_from_runs(body).astype(np.int64) + epoch.first, serials)
    body = _runs(epoch, probing)
    assert len(body["at"]) == 4 * len(np.unique(probing)) and len(body["runs"]) == 2 * len(np.unique(probing))


def test_a_verify_message_carries_each_rows_shingles_as_their_own_slice_made_bytes():
    """``vshard._packed_shingles`` cuts a row's shingles from one view of the batch's: [dtype, bytes] as the
    row's numpy slice gives them (``ShingleBatch.of``), empty rows and a batch of none included."""
    from streamdedup.core.shingle import ShingleBatch
    from streamdedup.engine.vshards.vshard import _packed_shingles

    rng = np.random.default_rng(5)
    sets = [np.sort(rng.integers(0, 2 ** 63, n).astype(np.uint64)) for n in (3, 0, 250, 1, 0, 40)]
    for batch in (ShingleBatch.of_sets(sets), ShingleBatch.of_sets([])):
        shingles_of = _packed_shingles(batch)
        for row in range(len(batch)):
            assert shingles_of(row) == [batch.of(row).dtype.str, batch.of(row).tobytes()]
    wide = ShingleBatch.of_sets([np.arange(5, dtype=np.uint32)])
    assert _packed_shingles(wide)(0) == ["<u4", np.arange(5, dtype=np.uint32).tobytes()]


def test_a_vshard_kept_through_a_new_generation_of_its_group_reads_again_what_kafka_has_of_it():
    """The outcomes' transactions commit under the generation of the vshards' group the process last followed
    (KIP-447): on a new one, the committed order offset of every vshard kept is read again before its next
    commit (another process may have hosted it, and committed, under a generation this one did not see); under
    the same generation nothing is read; each generation followed is logged, with the member's id."""
    import io
    import threading
    from types import SimpleNamespace

    from streamdedup.ops.logs import Log
    from streamdedup.runtime.vshards.host import VShardHost

    host, h = _host_of(3, 5, [], position=0)
    host.log = Log("text", "info", logged := io.StringIO())
    first, second = (SimpleNamespace(generation_id=g, member_id="m") for g in (4, 6))
    host.fixed, host.group, host.lost_seen, host.rejoined_seen = None, first, 0, 0
    host.membership = SimpleNamespace(assignment=({3}, first), lost=0, rejoined=0)
    host.config = SimpleNamespace(worker=SimpleNamespace(kafka_timeout_s=10))
    host.reading_lock = threading.Lock()
    read = []
    host._emitted_before = lambda numbers: read.append(numbers) or {n: 12 for n in numbers}
    VShardHost._follow_assignment(host)
    assert h.reading is None and read == []
    host.membership.assignment = ({3}, second)
    VShardHost._follow_assignment(host)
    host._await_emitted(h)
    assert (read, h.emitted_before, host.group) == ([[3]], 12, second)
    assert logged.getvalue().count("vshards_group_followed") == 1
    assert 'generation=6 member="m" given="3"' in logged.getvalue()


def test_a_group_member_whose_client_it_cannot_read_polls_as_often_as_it_may_and_never_holds_a_commit():
    """``_Membership`` reads kafka-python's group coordinator to poll only when it must join: a client without
    the parts it reads (another release) polls at every turn, as a plain member does, and never says it is
    moving between generations (a commit is never held for it)."""
    from types import SimpleNamespace

    from streamdedup.runtime.vshards.host import _Membership

    member = _Membership.__new__(_Membership)
    member.source = SimpleNamespace(consumer=SimpleNamespace(_coordinator=SimpleNamespace(state="STABLE")))
    assert member._coordinator() is None
    assert member._joining() is True
    assert member.moving() is False
