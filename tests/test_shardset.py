"""Reading a sharded index as one: ``stats``, ``query``, ``cluster`` and ``explain`` over every shard answer as one
index does.

The sharded index is built in-process (``test_shards._sharded``) next to one
index fed the same batches; the shards' answers, merged, must be the one
index's. An incomplete set of shards is refused.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from conftest import run_cli
from test_shards import _config, _crawl_batches, _sharded, _single

import streamdedup
from streamdedup.engine.engine import Engine
from streamdedup.errors import ConfigError

OFF = ("--set", "templates.enabled=false")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One index and a 3-shard index of the same crawl, and the decisions."""
    root = tmp_path_factory.mktemp("shardset")
    cfg = _config()
    batches = _crawl_batches(articles=200)
    decided = _single(cfg, root / "single", batches)
    assert _sharded(cfg, root / "sharded", batches, 3)[0] == decided
    texts = {item.id: item.text for items in batches for item in items}
    return root, cfg, decided, texts


def _folders(root):
    return [str(root / "sharded" / f"shard-{n}") for n in range(3)]


def test_stats_sum_the_shards_counts_and_list_each_shard(built):
    root, cfg, _, _ = built
    with streamdedup.open(root / "single", cfg, readonly=True) as one:
        single = one.stats()
    with streamdedup.open_shards(_folders(root), cfg) as shards:
        stats = shards.stats()
    for key in ("documents", "kept", "clusters", "duplicates", "exact_duplicates", "next_serial", "fingerprint"):
        assert stats[key] == single[key], key
    assert stats["duplicate_rate"] == pytest.approx(single["duplicate_rate"])
    assert stats["count"] == 3 and [s["positions"]["shard"] for s in stats["shards"]] == [[0, 3], [1, 3], [2, 3]]
    assert all(0 < s["documents"] < single["documents"] for s in stats["shards"])  # each counts its own
    assert {s["next_serial"] for s in stats["shards"]} == {single["next_serial"]}  # the deployment's, in each
    assert stats["index_bytes"] == sum(s["index_bytes"] for s in stats["shards"])


def _query_texts(decided, texts):
    """Texts of kept documents, of exact and near duplicates, each also with an edit, and one of nothing."""
    kept = [f[0] for f in decided if f[1] == "kept"][:6]
    exact = [f[0] for f in decided if f[1] == "duplicate" and f[5]][:4]
    near = [f[0] for f in decided if f[1] == "duplicate" and not f[5]][:6]
    chosen = [texts[i] for i in kept + exact + near]
    return chosen + [t + " and one more closing sentence for the query" for t in chosen] + [
        "words that appear in no article of the crawl at all, none of them"]


def test_query_over_the_shards_answers_as_one_index(built):
    root, cfg, decided, texts = built
    asked = _query_texts(decided, texts)
    with streamdedup.open(root / "single", cfg, readonly=True) as one, \
            streamdedup.open_shards([root / "sharded"], cfg) as shards:
        for text in asked:
            for floor in (None, 0.3):
                expected = [m.as_dict() for m in one.query(text, min_similarity=floor)]
                assert [m.as_dict() for m in shards.query(text, min_similarity=floor)] == expected
        answers = [one.query(text, min_similarity=0.3) for text in asked]
    assert sum(1 for found in answers if any(m.exact for m in found)) >= 10  # the cases are there
    assert sum(1 for found in answers if len(found) > 1) >= 5
    assert not answers[-1]


def test_cluster_over_the_shards_answers_as_one_index_with_members_from_every_shard(built):
    root, cfg, decided, _ = built
    sizes = Counter(f[2] for f in decided if f[1] == "duplicate")
    clusters = [cluster for cluster, _ in sizes.most_common(12)]
    members = [f[0] for f in decided if f[1] == "duplicate" and f[2] in clusters[:4]]
    with streamdedup.open(root / "single", cfg, readonly=True) as one, \
            streamdedup.open_shards(_folders(root), cfg) as shards:
        for doc_id in clusters + members:
            for limit in (None, 2):
                expected = one.cluster(doc_id, limit=limit).as_dict()
                assert shards.cluster(doc_id, limit=limit).as_dict() == expected, doc_id
        spread = [{shards._shards.owner(m["id"]) for m in one.cluster(c).members} for c in clusters]
        with pytest.raises(streamdedup.UnknownDocumentError):
            shards.cluster("no-such-document")
    assert max(len(owners) for owners in spread) > 1  # members in several shards: the merge is needed
    assert sizes.most_common(1)[0][1] >= 2


def test_explain_over_the_shards_answers_as_one_index(built):
    """A duplicate and its match (often in another shard), with and without texts; kept ones and a pair named."""
    root, cfg, decided, texts = built
    duplicates = [f for f in decided if f[1] == "duplicate"][:12]
    kept = [f[0] for f in decided if f[1] == "kept"][:3]
    with streamdedup.open(root / "single", cfg, readonly=True) as one, \
            streamdedup.open_shards(_folders(root), cfg) as shards:
        owner = shards._shards.owner
        for doc_id, other in [(f[0], None) for f in duplicates] + [(k, None) for k in kept] + [(kept[0], kept[1])]:
            for given in (None, {doc_id: texts[doc_id]}, {i: texts[i] for i in (doc_id, other or doc_id)}):
                expected = one.explain(doc_id, other, texts=given).as_dict()
                assert shards.explain(doc_id, other, texts=given).as_dict() == expected, (doc_id, other)
        pairs = [(f[0], f[3]) for f in duplicates]
        assert any(owner(a) != owner(b) for a, b in pairs)  # matches in other shards: the case is there
        compared = [shards.explain(a, texts={a: texts[a], b: texts[b]}) for a, b in pairs if owner(a) != owner(b)]
        assert any(c.passages and c.shared_bands and c.similarity is not None for c in compared)
        assert shards.explain(kept[0]).members == one.explain(kept[0]).members


def test_an_incomplete_set_of_shards_is_refused_with_what_is_wrong(built, tmp_path):
    root, cfg, _, _ = built
    folders = _folders(root)
    with pytest.raises(ConfigError, match=r"shard\(s\) 1 is not given"):
        streamdedup.open_shards([folders[0], folders[2]], cfg)
    copy = tmp_path / "copy-of-shard-2"
    shutil.copytree(folders[2], copy)
    with pytest.raises(ConfigError, match="shard 2 in .* and .*: give each shard once"):
        streamdedup.open_shards(folders + [str(copy)], cfg)
    with pytest.raises(ConfigError, match="more than once"):
        streamdedup.open_shards(folders + folders[:1], cfg)
    with pytest.raises(ConfigError, match="not a shard's index"):
        streamdedup.open_shards(folders + [str(root / "single")], cfg)
    two = tmp_path / "two"
    _sharded(cfg, two, _crawl_batches(articles=10), 2)
    with pytest.raises(ConfigError, match="different sizes"):
        streamdedup.open_shards(folders + [str(two / "shard-0"), str(two / "shard-1")], cfg)
    with pytest.raises(ConfigError, match="no index"):
        streamdedup.open_shards([tmp_path / "nothing-here"], cfg)


@pytest.mark.system
def test_the_commands_read_every_shard_given_as_folders_or_their_parent(built):
    root, _, decided, texts = built
    folders = _folders(root)
    as_list = ["--shards", ",".join(folders)]
    as_parent = ["--shards", str(root / "sharded")]
    repeated = [arg for folder in folders for arg in ("--shards", folder)]
    single = json.loads(run_cli("stats", "--state", str(root / "single"), "--json", *OFF).stdout)
    for given in (as_list, as_parent, repeated):
        stats = json.loads(run_cli("stats", *given, "--json", *OFF).stdout)
        assert (stats["count"], stats["documents"], stats["duplicates"]) == (3, single["documents"],
                                                                             single["duplicates"])
    text = run_cli("stats", *as_parent, *OFF).stdout.decode()
    assert f"documents          {single['documents']:,}" in text
    assert all(f"shard {n}" in text for n in range(3))

    near = next(f for f in decided if f[1] == "duplicate" and not f[5])
    query = ["query", texts[near[0]], "--json", *OFF]
    assert json.loads(run_cli(*query, *as_list).stdout) == json.loads(
        run_cli(*query, "--state", str(root / "single")).stdout)
    cluster = ["cluster", near[0], "--json", "--limit", "0", *OFF]
    assert json.loads(run_cli(*cluster, *repeated).stdout) == json.loads(
        run_cli(*cluster, "--state", str(root / "single")).stdout)
    assert f"cluster {near[2]}" in run_cli("cluster", near[0], *as_parent, *OFF).stdout.decode()

    explain = ["explain", near[0], "--json", *OFF]
    assert json.loads(run_cli(*explain, *as_parent).stdout) == json.loads(
        run_cli(*explain, "--state", str(root / "single")).stdout)

    missing = run_cli("stats", "--shards", ",".join(folders[1:]), *OFF, check=False)
    assert missing.returncode == 2 and b"shard(s) 0 is not given" in missing.stderr
    both = run_cli("query", "x", "--state", folders[0], "--shards", folders[1], check=False)
    assert both.returncode == 2 and b"not both" in both.stderr


def test_a_shard_read_alone_is_one_index_of_its_own_documents(built):
    """``--state`` on one shard still works (the index format is the single worker's): its own documents."""
    root, cfg, decided, _ = built
    with Engine(cfg, _folders(root)[1], readonly=True) as engine, engine.index.read() as txn:
        assert 0 < txn.counters["documents"] < sum(1 for f in decided if f[1] != "rejected")
