"""Reading a key-split deployment as one index: ``stats``, ``query``, ``cluster`` and ``explain`` over its vshard
states answer as a single worker's index does.

The vshard states are made on disk by the simulator (``vshards.simulator``,
LMDB in ``vshard-N`` folders) from the synthetic crawl with chains, ties,
replays, new versions and exact copies, and a forget order in the middle; a
single worker's index (``Engine`` on LMDB) is fed the same input in the same
order and forgets at the same point. For 1, 4 and 8 vshards, every answer
read across the states must be the index's, record for record. An incomplete
or mixed set is refused. The command line is run in process (the fast tier
starts no process).
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter

import pytest
from test_vshards import NOW, _chains_and_ties, _config, _items

import streamdedup
from streamdedup import cli
from streamdedup.core import corpus
from streamdedup.core.signing import signing_config
from streamdedup.engine.engine import Engine
from streamdedup.engine.settings import DedupSettings
from streamdedup.engine.vshards import VShard
from streamdedup.engine.vshards.simulator import Forget, Simulator, cut_epochs
from streamdedup.errors import ConfigError, StreamdedupError

COUNTS = (1, 4, 8)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A single worker's index and deployments of 1, 4 and 8 vshards of the same input; its decisions (in
    order, for the items given) and texts."""
    root = tmp_path_factory.mktemp("vshardset")
    config = _config(root)
    rng = random.Random(5)
    texts = [(doc.id, doc.text) for doc in corpus.generate(150, seed=11)] + _chains_and_ties(seed=4, families=12)
    first, rest = texts[:260], texts[260:] + [(f"again-{doc_id}", text) for doc_id, text in rng.sample(texts, 20)]
    rng.shuffle(rest)
    items = _items(first + rest)
    with Engine(config, clock=lambda: NOW) as engine:
        decided = engine.decide_batch(engine.prepare(items[:260]))
        kept = [item.id for item, d in zip(items, decided) if d.status == "kept"]
        forgotten = tuple(rng.sample(kept, 12)) + ("never-seen",)
        engine.forget(list(forgotten))
        for begin in range(260, len(items), 60):
            decided += engine.decide_batch(engine.prepare(items[begin:begin + 60]))
    epochs = cut_epochs([items[:260]], seed=3, largest=40) + [Forget(forgotten)] \
        + cut_epochs([items[260:]], seed=4, largest=40)
    for count in COUNTS:
        with Simulator(config, count, 2, seed=count, clock=lambda: NOW, state=str(root / f"v{count}"),
                       sync=False) as simulator:
            run = simulator.decide(epochs)
        assert run.order == items and run.decisions == decided
    return root, config, items, decided, forgotten


def _single(root, config):
    return streamdedup.open(root / "single", config, readonly=True)


def _vshards(root, config, count):
    return streamdedup.open_shards([root / f"v{count}"], config)


def test_stats_count_the_documents_of_every_vshard_as_one_index(built):
    root, config, _, _, _ = built
    with _single(root, config) as one:
        single = one.stats()
    for count in COUNTS:
        with _vshards(root, config, count) as vshards:
            stats = vshards.stats()
        for key in ("documents", "kept", "clusters", "duplicates", "fingerprint"):
            assert stats[key] == single[key], (count, key)
        assert stats["duplicate_rate"] == pytest.approx(single["duplicate_rate"])
        assert stats["count"] == count
        each = stats["vshards"]
        assert [v["number"] for v in each] == list(range(count))
        assert sum(v["documents"] for v in each) == single["documents"]
        assert all(v["documents"] and v["places"] for v in each)  # homes and owners, each of them
        assert {v["committed"]["epochs_done"] for v in each} == {each[0]["committed"]["epochs_done"]}
        assert stats["index_bytes"] == sum(v["index_bytes"] for v in each)


def _asked_texts(items, decided):
    """Texts of kept documents, exact and near duplicates, each also with an edit; one of nothing."""
    texts = {item.id: item.text for item in items}
    kept = [d.id for d in decided if d.status == "kept"][:6]
    exact = [d.id for d in decided if d.status == "duplicate" and d.exact][:4]
    near = [d.id for d in decided if d.status == "duplicate" and not d.exact][:6]
    chosen = [texts[i] for i in kept + exact + near]
    return chosen + [t + " and one more closing sentence for the query" for t in chosen] + [
        "words that appear in no article of the crawl at all, none of them"]


def test_query_across_vshards_answers_as_one_index(built):
    root, config, items, decided, _ = built
    asked = _asked_texts(items, decided)
    with _single(root, config) as one:
        expected = {(text, floor): [m.as_dict() for m in one.query(text, min_similarity=floor)]
                    for text in asked for floor in (None, 0.3)}
    for count in COUNTS:
        with _vshards(root, config, count) as vshards:
            for (text, floor), answer in expected.items():
                assert [m.as_dict() for m in vshards.query(text, min_similarity=floor)] == answer, count
            with pytest.raises(StreamdedupError, match="nothing to look for"):
                vshards.query("   ")
    answers = list(expected.values())
    assert sum(1 for found in answers if any(m["exact"] for m in found)) >= 8  # the cases are there
    assert sum(1 for found in answers if len(found) > 1) >= 5
    assert not answers[-1]


def _clusters_and_members(decided, forgotten):
    """The largest clusters' ids and their members' ids, and members of dissolved clusters."""
    sizes = Counter(d.cluster for d in decided if d.status == "duplicate")
    clusters = [cluster for cluster, _ in sizes.most_common(10)]
    members = [d.id for d in decided if d.status == "duplicate" and d.cluster in clusters[:4]]
    dissolved = [d.id for d in decided if d.status == "duplicate" and d.cluster in forgotten]
    return clusters, members, dissolved


def test_cluster_across_vshards_answers_as_one_index(built):
    root, config, _, decided, forgotten = built
    clusters, members, dissolved = _clusters_and_members(decided, forgotten)
    asked = [doc_id for doc_id in clusters + members if doc_id not in forgotten]
    with _single(root, config) as one:
        expected = {(doc_id, limit): one.cluster(doc_id, limit=limit).as_dict() for doc_id in asked
                    for limit in (None, 2)}
        spread = [{one_owner for one_owner in (m["id"] for m in one.cluster(c).members)} for c in asked[:4]]
    assert dissolved and max(len(ids) for ids in spread) > 1
    for count in COUNTS:
        with _vshards(root, config, count) as vshards:
            for (doc_id, limit), view in expected.items():
                assert vshards.cluster(doc_id, limit=limit).as_dict() == view, (count, doc_id)
            if count > 1:
                assert any(len({vshards.owner(member) for member in ids}) > 1 for ids in spread)
            with pytest.raises(streamdedup.UnknownDocumentError):
                vshards.cluster(forgotten[0])
            with pytest.raises(StreamdedupError, match="belongs to no cluster"):
                vshards.cluster(dissolved[0])


def test_explain_across_vshards_answers_as_one_index(built):
    """Duplicates and their matches (often at other homes), with and without texts; kept ones; a pair named."""
    root, config, items, decided, forgotten = built
    texts = {item.id: item.text for item in items}
    duplicates = [d for d in decided if d.status == "duplicate" and d.id not in forgotten][:14]
    kept = [d.id for d in decided if d.status == "kept" and d.id not in forgotten][:3]
    asked = [(d.id, None, d.matched) for d in duplicates] + [(k, None, k) for k in kept] + [(*kept[:2], kept[1])]
    with _single(root, config) as one:
        expected = {}
        for doc_id, other, partner in asked:
            for given in (None, {doc_id: texts[doc_id]}, {i: texts[i] for i in (doc_id, partner)}):
                expected[doc_id, other, json.dumps(given)] = one.explain(doc_id, other, texts=given).as_dict()
    for count in COUNTS:
        with _vshards(root, config, count) as vshards:
            for (doc_id, other, given), explained in expected.items():
                got = vshards.explain(doc_id, other, texts=json.loads(given)).as_dict()
                assert got == explained, (count, doc_id, other)
            pairs = [(d.id, d.matched) for d in duplicates]
            apart = [(a, b) for a, b in pairs if vshards.owner(a) != vshards.owner(b)]
            assert count == 1 or apart  # matches at other homes: the case is there
    assert any(e["shared_bands"] and e["passages"] for e in expected.values())


def test_an_incomplete_or_mixed_set_of_vshards_is_refused_with_what_to_do(built, tmp_path):
    root, config, _, _, _ = built
    folders = [str(root / "v4" / f"vshard-{n}") for n in range(4)]
    copy = tmp_path / "copy-of-vshard-2"
    shutil.copytree(folders[2], copy)
    refused = [
        ([folders[0], *folders[2:]], r"4 vshards, and vshard\(s\) 1 is not given: give every vshard's folder"),
        (folders + [str(copy)], "vshard 2 in .* and .*: give each vshard once"),
        (folders + folders[:1], "more than once"),
        (folders + [str(root / "v1" / "vshard-0")], "different sizes.*give the vshards of one deployment"),
        (folders + [str(root / "single")], r"hold\(s\) an index, not a vshard.s state: give the vshard-N folders"),
        (_made_with_two_thresholds(tmp_path / "two"), "made with different settings .*: give the vshards of one"),
        ([tmp_path / "nothing-here"], "no such folder"),
    ]
    for given, message in refused:
        with pytest.raises(ConfigError, match=message):
            streamdedup.open_shards(given, config)
    with streamdedup.open_shards(folders[::-1], config) as vshards:  # in any order: read in vshard order
        assert vshards.paths == [str(root / "v4" / f"vshard-{n}") for n in range(4)]
        with pytest.raises(StreamdedupError, match="no site templates"):
            vshards.sites("example.com")


def _made_with_two_thresholds(folder):
    """The (empty) states of a deployment of two vshards, made with two thresholds."""
    for number, threshold in enumerate((0.7, 0.8)):
        config = _config(folder, f"lsh.threshold={threshold}")
        settings = DedupSettings.of(config, signing_config(config))
        VShard(number, 2, settings, str(folder / f"vshard-{number}"), sync=False).close()
    return [str(folder)]


def _cli_json(capsys, *args):
    assert cli.main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_commands_read_every_vshard_as_one_index(built, capsys):
    """``stats``, ``query``, ``cluster`` and ``explain`` with ``--shards`` (the parent folder, or each vshard's
    folder), run in this process."""
    root, _, items, decided, forgotten = built
    texts = {item.id: item.text for item in items}
    near = next(d for d in decided if d.status == "duplicate" and not d.exact and d.cluster not in forgotten)
    single = ["--state", str(root / "single")]
    as_parent = ["--shards", str(root / "v4")]
    as_list = ["--shards", ",".join(str(root / "v4" / f"vshard-{n}") for n in range(4))]
    counts = _cli_json(capsys, "stats", *single)
    for given in (as_parent, as_list):
        stats = _cli_json(capsys, "stats", *given)
        assert (stats["count"], stats["documents"], stats["duplicates"]) == (4, counts["documents"],
                                                                             counts["duplicates"])
        for question in (["query", texts[near.id]], ["cluster", near.id, "--limit", "0"], ["explain", near.id]):
            assert _cli_json(capsys, *question, *given) == _cli_json(capsys, *question, *single), question
    assert cli.main(["stats", *as_parent]) == 0
    text = capsys.readouterr().out
    assert f"documents          {counts['documents']:,}" in text
    assert all(f"vshard {n}" in text and "places" in text for n in range(4))
    assert cli.main(["cluster", near.id, *as_parent]) == 0
    assert f"cluster {near.cluster}" in capsys.readouterr().out
    assert cli.main(["stats", "--shards", ",".join(as_list[1].split(",")[1:])]) == 2
    assert "vshard(s) 0 is not given" in capsys.readouterr().err


def test_a_query_is_judged_by_the_threshold_the_vshards_were_made_with(built):
    """Not the reader's config's: a reader given another threshold still answers as the deployment decides."""
    root, config, items, decided, _ = built
    other = _config(root, f"lsh.threshold={config.lsh.threshold - 0.3}")
    text = next(item.text for item, d in zip(items, decided) if d.status == "duplicate" and not d.exact)
    with _vshards(root, config, 4) as vshards:
        expected = [m.as_dict() for m in vshards.query(text)]
    with _vshards(root, other, 4) as vshards:
        assert [m.as_dict() for m in vshards.query(text)] == expected
        assert vshards.explain(decided[0].id).threshold == config.lsh.threshold


def test_one_vshard_is_backed_up_and_restored_into_its_folder_alone(built, tmp_path, capsys):
    """``backup --state DIR/vshard-N`` copies that vshard's state; ``restore`` puts it back into a lost folder,
    checked against the folder's number and the deployment's count and settings, and the deployment reads
    as before (deploy/README.md, "Backing up and restoring a vshard")."""
    root, _, _, _, _ = built
    deployment = tmp_path / "v4"
    shutil.copytree(root / "v4", deployment)
    settings = ["--set", 'lsh.cap="probes"', "--set", "templates.enabled=false", "--set", "shards.count=4"]
    before = _cli_json(capsys, "stats", "--shards", str(deployment))
    assert cli.main(["backup", str(tmp_path / "backup-2"), "--state", str(deployment / "vshard-2"), *settings]) == 0
    assert f"copied {before['vshards'][2]['documents']:,} documents" in capsys.readouterr().out

    shutil.rmtree(deployment / "vshard-2")  # the folder is lost
    assert cli.main(["restore", str(tmp_path / "backup-2"), "--state", str(deployment / "vshard-2"), *settings]) == 0
    said = capsys.readouterr().out
    assert "vshard 2 of 4" in said
    assert f"position epochs_done {before['vshards'][2]['committed']['epochs_done']}" in said
    after = _cli_json(capsys, "stats", "--shards", str(deployment))
    compacted = {"path": None, "index_bytes": None}  # the backup is a compacted copy
    assert [{**v, **compacted} for v in after["vshards"]] == [{**v, **compacted} for v in before["vshards"]]

    refusals = [(["--state", str(deployment / "vshard-1"), "--replace", *settings], "holds vshard 2, not vshard-1"),
                (["--state", str(tmp_path / "vshard-2"), *settings[:4], "--set", "shards.count=8"],
                 "vshard 2 of 4, the configuration has shards.count = 8"),
                (["--state", str(tmp_path / "elsewhere" / "vshard-2"), *settings, "--set", "lsh.threshold=0.5"],
                 "belongs to another vshard or other settings")]
    for args, message in refusals:
        assert cli.main(["restore", str(tmp_path / "backup-2"), *args]) != 0
        assert message in capsys.readouterr().err, message
