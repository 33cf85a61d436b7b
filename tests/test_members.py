"""Cluster memberships: filed by a batch in ``recent_members`` (appended), moved into ``members`` by a merge's
slices, and read as one list by every reader at every commit (``IndexTxn.member_log``)."""

from __future__ import annotations

import json

import lmdb
import pytest
from conftest import run_cli

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.records import Document, Source
from streamdedup.engine.engine import Engine
from streamdedup.engine.query import cluster_of
from streamdedup.store import merge as merge_module
from streamdedup.store.check import check_index
from streamdedup.store.index import FORMAT_VERSION, Index, IndexSettings


def _batches(count: int = 360, seed: int = 41, size: int = 10) -> list[list[Document]]:
    """Texts whose first twenty come back as copies (new ids) all along, so clusters gain members in every
    generation: before a merge, in the generation being merged and after it."""
    texts = [d.text for d in corpus.generate(count, seed=seed)]
    docs = []
    for at, text in enumerate(texts):
        docs.append(Document(f"d{at}", text, Source("t", -1, len(docs))))
        if at >= 20 and at % 3 == 0:
            docs.append(Document(f"copy{at}", texts[at % 20], Source("t", -1, len(docs))))
    return [docs[at:at + size] for at in range(0, len(docs), size)]


def _config(merge_every: int = 120):
    return config_module.load(None, (f"index.merge_every={merge_every}",), environ={})


def _expected(txn) -> dict[int, list[int]]:
    """Each cluster's members, ascending, from the records (the source of truth)."""
    clusters: dict[int, list[int]] = {}
    for record in txn.records():
        if record.cluster and not record.kept:
            clusters.setdefault(record.cluster, []).append(record.serial)
    return clusters


def _read(txn) -> dict[int, list[int]]:
    """Each cluster's members as the readers answer them; their counts must agree."""
    listed = {serial: list(txn.member_serials(serial)) for serial, _ in txn.clusters_with_members()}
    for serial, count in txn.clusters_with_members():
        assert count == txn.member_count(serial) == len(listed[serial])
    assert sorted(txn.memberships()) == sorted((c, m) for c, members in listed.items() for m in members)
    return listed


def _log_entries(index) -> int:
    with index.read() as txn:
        return txn.txn.stat(txn.dbs["recent_members"])["entries"]


def test_readers_list_every_membership_once_at_every_commit_of_a_spread_merge_and_after_restarts(tmp_path,
                                                                                                   monkeypatch):
    """Memberships recent, being merged and merged are each listed once, in serial order, after every batch and
    every merge step, and after a restart (as a kill between two commits leaves the index) in the middle of a
    merge; the log is emptied by each merge's finish and the index checks clean."""
    monkeypatch.setattr(merge_module, "MERGE_SLICE_BYTES", 512)  # many slices: a range of clusters each
    monkeypatch.setattr(merge_module, "FINISH_CHUNK", 15)
    state = str(tmp_path / "state")
    engine = Engine(_config(), state)
    moments, restarted, in_both = set(), set(), 0
    try:
        for number, batch in enumerate(_batches()):
            engine.decide_batch(engine.prepare(batch))
            merge = engine._merge
            moment = None if merge is None else "finishing" if merge.done == merge.slices else \
                "slicing" if 0 < merge.done < merge.slices else None
            moments.add(moment)
            with engine.index.read() as txn:
                expected = _expected(txn)
                assert _read(txn) == expected, (number, moment)
                in_both += len(set(_merged(txn)) & set(txn.member_log()[1].tolist()))
            if moment and moment not in restarted:
                restarted.add(moment)
                engine.close()
                engine = Engine(_config(), state)
                assert engine._merge is not None and engine._merge.done == merge.done
        engine.merge_recent()
        assert _log_entries(engine.index) == 0
        with engine.index.read() as txn:
            assert _read(txn) == _expected(txn) and max(map(len, _expected(txn).values())) > 8
        assert check_index(engine.index).ok
    finally:
        engine.close()
    assert restarted == {"slicing", "finishing"} and in_both > 0  # clusters with members on both sides


def test_forget_check_and_rebuild_over_members_on_both_sides_of_a_merge(tmp_path):
    """A forgotten duplicate leaves its cluster's list, merged or recent; a forgotten representative releases
    every member, merged and recent; check finds the index clean and check --fix rebuilds the same lists
    (all merged)."""
    state = str(tmp_path / "state")
    batches = _batches()
    with Engine(_config(), state) as engine:
        for batch in batches:
            engine.decide_batch(engine.prepare(batch))
        engine._finish_merge()
        assert _log_entries(engine.index) > 0  # the last generation's are recent
        with engine.index.read() as txn:
            clusters = _expected(txn)
            merged = _merged(txn)
            both = [c for c in clusters if c in merged and len(clusters[c]) > len(merged[c])]
            assert len(both) >= 2
            doomed, kept_cluster = both[0], both[1]
            recent_member, merged_member = clusters[kept_cluster][-1], clusters[kept_cluster][0]
            ids = [txn.record(s).id for s in (recent_member, merged_member)] + [txn.record(doomed).id]
            released = len(clusters[doomed])
        report = engine.forget(ids)
        assert report.dissolved == 1 and report.released == released
        with engine.index.read() as txn:
            listed = _read(txn)
            assert listed == _expected(txn)
            assert doomed not in listed
            gone = (recent_member, merged_member)
            assert listed[kept_cluster] == [m for m in clusters[kept_cluster] if m not in gone]
        assert check_index(engine.index).ok
        engine.rebuild()
        assert _log_entries(engine.index) == 0
        with engine.index.read() as txn:
            assert _read(txn) == listed
        assert check_index(engine.index).ok


def test_forget_of_many_clusters_reads_the_log_of_recent_memberships_once(tmp_path, monkeypatch):
    """``forget`` dissolves each kept document it removes, asking for its members: the transaction reads
    ``recent_members`` once (tens of milliseconds at a million documents) and keeps its view of it as it
    deletes, so forgetting thousands of clusters does not read it thousands of times; the lists stay right."""
    from streamdedup.store.index import IndexTxn

    state = str(tmp_path / "state")
    with Engine(_config(merge_every=100_000), state) as engine:
        for batch in _batches():
            engine.decide_batch(engine.prepare(batch))
        with engine.index.read() as txn:
            clusters = _expected(txn)
            doomed = sorted(clusters)[:12]
            ids = [txn.record(serial).id for serial in doomed]
            ids += [txn.record(clusters[serial][0]).id for serial in sorted(clusters)[12:16]]  # and members
        reads = []
        logged = IndexTxn.logged_memberships
        monkeypatch.setattr(IndexTxn, "logged_memberships", lambda txn: reads.append(1) or logged(txn))
        report = engine.forget(ids)
        assert report.dissolved == len(doomed) and len(reads) == 1
        monkeypatch.undo()
        with engine.index.read() as txn:
            listed = _read(txn)
            assert listed == _expected(txn) and not set(doomed) & set(listed)
        assert check_index(engine.index).ok


@pytest.mark.system
def test_a_reader_in_another_process_sees_recent_members_at_once(tmp_path):
    """`streamdedup cluster` run while the writer holds the index lists the members it committed, the recent
    ones included, and so does the census."""
    state = str(tmp_path / "state")
    with Engine(_config(100000), state) as engine:  # no merge: every membership is recent
        for batch in _batches(120):
            engine.decide_batch(engine.prepare(batch))
        assert _log_entries(engine.index) > 0
        with engine.index.read() as txn:
            expected = _expected(txn)
            cluster = max(expected, key=lambda c: len(expected[c]))
            cluster_id = txn.record(cluster).id
            member_ids = [txn.record(m).id for m in expected[cluster]]
        view = json.loads(run_cli("cluster", "--json", "--limit", "0", cluster_id, "--state", state).stdout)
        assert [m["id"] for m in view["members"]] == member_ids and view["members_total"] == len(member_ids)
        assert cluster_of(engine, cluster_id).members_total == len(member_ids)


def test_an_index_of_format_7_opens_answers_and_is_marked_once_it_files_recent_members(tmp_path):
    """An index made before the log (no recent_members table, every membership merged, format 7) opens
    read-only and answers as before; a writer goes on with it, and marks it of this format (refused by a
    release of format 7) once a batch files a membership in the log."""
    state = str(tmp_path / "state")
    batches = _batches()
    before = _format_7_index(state, batches)
    index = Index(IndexSettings(path=state), None, readonly=True)
    try:
        assert index.dbs["recent_members"] is None
        with index.read() as txn:
            assert _read(txn) == before
    finally:
        index.close()
    with Engine(_config(), state) as engine:
        with engine.index.read() as txn:
            assert json.loads(txn.get("meta", b"index"))["format"] == 7  # opening alone changes nothing
        for batch in batches[20:]:
            engine.decide_batch(engine.prepare(batch))
        with engine.index.read() as txn:
            assert json.loads(txn.get("meta", b"index"))["format"] == FORMAT_VERSION
            assert _read(txn) == _expected(txn)
        assert check_index(engine.index).ok


def _merged(txn) -> dict[int, list[int]]:
    """Each cluster's members the members table holds (merged)."""
    merged: dict[int, list[int]] = {}
    for key, value in txn.table_entries("members"):
        merged.setdefault(int.from_bytes(key, "big"), []).append(int.from_bytes(value, "big"))
    return merged


@pytest.mark.system
def test_a_reader_opened_on_an_index_of_format_7_sees_the_memberships_a_later_writer_files(tmp_path):
    """A read-only index opened before any writer of this format made the log lists the memberships a writer in
    another process files in it afterwards, at its next read transaction."""
    state = str(tmp_path / "state")
    batches = _batches()
    _format_7_index(state, batches)
    later = tmp_path / "later.jsonl"
    later.write_text("".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for batch in batches[20:] for d in batch))
    index = Index(IndexSettings(path=state), None, readonly=True)
    try:
        assert index.dbs["recent_members"] is None
        run_cli("dedup", str(later), "--state", state, "--out", str(tmp_path / "out.jsonl"),
                "--decisions", str(tmp_path / "decisions.jsonl"), "--set", "index.merge_every=100000")
        with index.read() as txn:
            assert txn.member_log()[0].size > 0
            assert _read(txn) == _expected(txn)
    finally:
        index.close()


def _format_7_index(state: str, batches: list) -> dict[int, list[int]]:
    """An index of the first 20 of ``batches``, merged, left as a streamdedup of format 7 leaves it; its clusters'
    members."""
    with Engine(_config(), state) as engine:
        for batch in batches[:20]:
            engine.decide_batch(engine.prepare(batch))
        engine.merge_recent()
        with engine.index.read() as txn:
            members = _expected(txn)
    _as_format_7(state)
    return members


def _as_format_7(state: str) -> None:
    """The index as a streamdedup of format 7 leaves it once every membership is merged: no log, format 7."""
    env = lmdb.open(state, max_dbs=32)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"recent_members", txn=txn), delete=True)
        meta = env.open_db(b"meta", txn=txn)
        txn.put(b"index", json.dumps({**json.loads(txn.get(b"index", db=meta)), "format": 7}).encode(), db=meta)
    env.close()
