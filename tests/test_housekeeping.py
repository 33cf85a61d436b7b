"""Inspection and housekeeping: query, cluster, forget, check --fix, retention, backup, a full disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import index_snapshot, read_jsonl, run_cli, spawned
from kafka_helpers import Topics, produce, worker_command

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.records import Document, Source
from streamdedup.engine.engine import Engine
from streamdedup.errors import IndexCorruptError
from streamdedup.store.bands import band_entries
from streamdedup.store.check import check_index


@pytest.fixture(scope="module")
def decided(tmp_path_factory, crawl_file):
    """An index of the sample crawl and its decisions."""
    folder = tmp_path_factory.mktemp("decided")
    run_cli("dedup", str(crawl_file), "--state", str(folder / "state"), "--decisions", str(folder / "d.jsonl"))
    return folder / "state", read_jsonl(folder / "d.jsonl")


def copy_index(decided, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(decided[0], state)
    os.remove(state / "writer.lock")
    return state


@pytest.mark.system
def test_query_finds_the_near_duplicates_of_a_text_best_first(decided, crawl):
    state, decisions = decided
    by_id = {d.id: d for d in crawl}
    duplicate = next(d for d in decisions if d["status"] == "duplicate" and not d["similarity"] == 1.0)
    text = by_id[duplicate["id"]].text
    found = json.loads(run_cli("query", "--json", "--state", str(state), text).stdout)
    assert found[0]["id"] == duplicate["id"] and found[0]["similarity"] == 1.0 and found[0]["exact"]
    near = [m for m in found if not m["exact"]]
    assert near and near[0]["id"] == duplicate["matched"]
    assert near[0]["similarity"] == pytest.approx(duplicate["similarity"], abs=1e-6)
    assert [m["similarity"] for m in found] == sorted((m["similarity"] for m in found), reverse=True)
    assert all(by_id[m["id"]].family == by_id[duplicate["id"]].family for m in found)
    unrelated = run_cli("query", "--state", str(state), "nothing like anything in the crawl at all today")
    assert b"no near-duplicates" in unrelated.stdout


@pytest.mark.system
def test_cluster_shows_the_representative_and_its_members(decided):
    state, decisions = decided
    sizes = {}
    for d in decisions:
        sizes.setdefault(d["cluster"], []).append(d)
    cluster_id, members = max(sizes.items(), key=lambda item: len(item[1]))
    view = json.loads(run_cli("cluster", "--json", cluster_id, "--state", str(state)).stdout)
    assert view["representative"]["id"] == cluster_id
    assert sorted(m["id"] for m in view["members"]) == sorted(d["id"] for d in members if d["id"] != cluster_id)
    assert view["members_total"] == len(view["members"]) >= 2
    first = json.loads(run_cli("cluster", "--json", "--limit", "1", cluster_id, "--state", str(state)).stdout)
    assert first["members"] == view["members"][:1] and first["members_total"] == view["members_total"]
    shown = run_cli("cluster", "--limit", "1", cluster_id, "--state", str(state)).stdout.decode()
    assert f"{view['members_total'] + 1} documents" in shown and f"and {view['members_total'] - 1:,} later" in shown
    via_member = json.loads(run_cli("cluster", "--json", view["members"][0]["id"], "--state", str(state)).stdout)
    assert via_member["representative"]["id"] == cluster_id and via_member["asked"] == view["members"][0]["id"]
    missing = run_cli("cluster", "no-such-id", "--state", str(state), check=False)
    assert missing.returncode == 1 and b"no document with id" in missing.stderr


@pytest.mark.system
def test_forgetting_a_representative_dissolves_its_cluster(decided, crawl, tmp_path):
    state = copy_index(decided, tmp_path)
    decisions = decided[1]
    rep = next(d["cluster"] for d in decisions if d["status"] == "duplicate" and not d["similarity"] == 1.0)
    members = [d["id"] for d in decisions if d["cluster"] == rep and d["id"] != rep]
    result = run_cli("forget", rep, "not-there", "--state", str(state))
    assert f"{len(members)} member(s) released".encode() in result.stdout and b"not in the index: not-there" in result.stdout
    assert run_cli("check", "--state", str(state)).returncode == 0
    gone = run_cli("cluster", rep, "--state", str(state), check=False)
    assert gone.returncode == 1
    released = run_cli("cluster", members[0], "--state", str(state), check=False)
    assert b"belongs to no cluster" in released.stderr
    text = {d.id: d.text for d in crawl}[rep]
    with Engine(config_module.load(None, environ={}), str(state)) as engine:
        again = engine.decide_batch(engine.prepare([Document("look-alike", text + " one more", Source("t", -1, 1))]))
        assert again[0].status == "kept", "a new look-alike starts a new cluster"
        assert check_index(engine.index).ok


@pytest.mark.system
def test_forgetting_a_duplicate_and_a_file_of_ids(decided, tmp_path):
    state = copy_index(decided, tmp_path)
    duplicates = [d["id"] for d in decided[1] if d["status"] == "duplicate"][:5]
    (tmp_path / "ids.txt").write_text("\n".join(duplicates) + "\n")
    before = json.loads(run_cli("stats", "--json", "--state", str(state)).stdout)
    run_cli("forget", "--file", str(tmp_path / "ids.txt"), "--state", str(state))
    after = json.loads(run_cli("stats", "--json", "--state", str(state)).stdout)
    assert after["documents"] == before["documents"] - 5 and after["clusters"] == before["clusters"]
    assert run_cli("check", "--state", str(state)).returncode == 0


@pytest.mark.parametrize("merge_every", [100000, 1], ids=["recent-log", "merged"])
def test_forgetting_the_first_copy_of_a_text_leaves_its_later_copies_findable(tmp_path, merge_every):
    """Every document is filed by its content: when the first one with a text is forgotten, the next copy of
    that text is an exact match of the copy that remains (not a near duplicate of the cluster's kept one)."""
    words = [f"word{i} other{i % 5} more{i % 11}" for i in range(80)]
    original, edited = " ".join(words), " ".join(words[:-3] + ["changed words here"])
    cfg = config_module.load(None, (f"index.merge_every={merge_every}",), environ={})
    with Engine(cfg, str(tmp_path)) as engine:
        def decide(doc_id, text, n):
            return engine.decide_batch(engine.prepare([Document(doc_id, text, Source("t", -1, n))]))[0]

        assert decide("kept", original, 1).status == "kept"
        assert (decide("edit", edited, 2).exact, decide("copy", edited, 3).matched) == (False, "edit")
        engine.forget(["edit"])
        again = decide("again", edited, 4)
        assert (again.status, again.cluster, again.matched, again.exact) == ("duplicate", "kept", "copy", True)
        assert check_index(engine.index).ok


def test_forget_goes_through_a_running_worker(kafka, tmp_path):
    docs = corpus.generate(100, seed=12)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode()) for d in docs])
    state = tmp_path / "state"
    with spawned(worker_command(state, topics, kafka), stderr=subprocess.DEVNULL) as worker:
        try:
            deadline = time.monotonic() + 60
            while json.loads(run_cli("stats", "--json", "--state", str(state), check=False).stdout or b'{"documents":0}'
                             )["documents"] < len(docs):
                assert time.monotonic() < deadline
                time.sleep(0.5)
            result = run_cli("forget", docs[0].id, docs[1].id, "--state", str(state))
            assert b"applied by the running worker" in result.stdout and b"forgot 2 id(s)" in result.stdout
            stats = json.loads(run_cli("stats", "--json", "--state", str(state)).stdout)
            assert stats["documents"] == len(docs) - 2
            assert run_cli("check", "--state", str(state)).returncode == 0
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)


@pytest.mark.system
def test_check_fix_rebuilds_damaged_lookup_tables(decided, tmp_path):
    state = copy_index(decided, tmp_path)
    snapshot = index_snapshot(state)
    cfg = config_module.load(None, environ={})
    with Engine(cfg, str(state)) as engine:
        def damage(txn):
            for name in ("ids", "members"):
                cursor = txn.txn.cursor(db=txn.dbs[name])
                for _ in range(25):
                    if cursor.first():
                        cursor.delete()
            txn.count(documents=3)

        engine.index.write(damage)
    broken = run_cli("check", "--state", str(state), check=False)
    assert broken.returncode == 3 and b"INCONSISTENT" in broken.stdout
    fixed = run_cli("check", "--fix", "--state", str(state))
    assert b"consistent:" in fixed.stdout and b"rebuilt the lookup tables" in fixed.stdout
    assert run_cli("check", "--state", str(state)).returncode == 0
    assert index_snapshot(state)["records"] == snapshot["records"]


@pytest.mark.system
def test_check_names_damaged_stored_shingles_and_the_engine_refuses_them(decided, tmp_path):
    state = copy_index(decided, tmp_path)
    cfg = config_module.load(None, environ={})
    with Engine(cfg, str(state)) as engine:
        def damage(txn):
            key, coded = next(iter(txn.table_entries("shingles")))
            txn.txn.put(key, coded[:-3], db=txn.dbs["shingles"])
            return int.from_bytes(key, "big")

        serial = engine.index.write(damage)
        with engine.index.read() as txn:
            with pytest.raises(IndexCorruptError, match=f"shingles of #{serial} are damaged"):
                txn.shingles(serial)
    broken = run_cli("check", "--state", str(state), check=False)
    assert broken.returncode == 3 and f"#{serial}".encode() in broken.stdout and b"damaged" in broken.stdout


def test_kept_documents_are_looked_up_by_the_band_keys_of_their_stored_shingles(decided):
    """Records of plain kept documents store no band keys: signed again from the stored shingles, they are
    the ones the band table holds (``check`` compares every entry), and forgetting removes exactly those."""
    with Engine(config_module.load(None, environ={}), str(decided[0]), readonly=True) as engine:
        with engine.index.read() as txn:
            kept = [r for r in txn.records() if r.kept]
            assert kept and all(r.band_keys == b"" for r in kept)
            assert check_index(engine.index).ok


def test_retention_stops_matching_then_the_sweep_clears_band_tables(tmp_path):
    now = [1_000_000.0]
    cfg = config_module.load(None, ("index.retention_days=1", "index.sweep_interval_s=60"), environ={})
    texts = [d.text for d in corpus.generate(60, seed=5)]
    with Engine(cfg, str(tmp_path), clock=lambda: now[0]) as engine:
        def decide(prefix, chunk):
            items = [Document(f"{prefix}{i}", t, Source("t", -1, i)) for i, t in enumerate(chunk)]
            return engine.decide_batch(engine.prepare(items))

        first = decide("old-", texts)
        assert all(d.status in ("kept", "duplicate") for d in first)
        now[0] += 0.5 * 86400
        assert all(d.status == "duplicate" for d in decide("young-", texts))  # within retention: matches
        now[0] += 1.0 * 86400  # the first batch is now 1.5 days old, past retention
        late = decide("late-", texts)
        kept_first = {d.id[len("old-"):] for d in first if d.status == "kept"}
        assert all(d.status == "kept" for d in late if d.id[len("late-"):] in kept_first)
        assert engine.sweep() > 0
        with engine.index.read() as txn:
            old_bands = sum(1 for _, _, serial in band_entries(txn) if serial <= len(first))
        assert old_bands == 0
        report = check_index(engine.index)
        assert report.ok, report.problems
        engine.merge_recent()
        assert check_index(engine.index).ok


@pytest.mark.system
def test_backup_while_the_index_is_being_written(tmp_path, crawl_file):
    state = tmp_path / "state"
    writer = subprocess.Popen([sys.executable, "-m", "streamdedup", "dedup", str(crawl_file), "--state", str(state),
                               "--set", "worker.batch_size=50"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (state / "data.mdb").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        result = run_cli("backup", str(tmp_path / "copy"), "--state", str(state))
        assert b"compacted" in result.stdout
    finally:
        writer.wait(timeout=120)
    assert run_cli("check", "--state", str(tmp_path / "copy")).returncode == 0
    copied = json.loads(run_cli("stats", "--json", "--state", str(tmp_path / "copy")).stdout)["documents"]
    assert 0 < copied <= 1190
    again = run_cli("backup", str(tmp_path / "copy"), "--state", str(state), check=False)
    assert again.returncode == 2 and b"already holds an index" in again.stderr


@pytest.mark.system
def test_a_full_disk_is_a_clear_error_and_the_index_survives(tmp_path, crawl_file):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        args = ["dedup", str(crawl_file), "--state", str(small / "state"), "--decisions", str(tmp_path / "d.jsonl"),
                "--set", "worker.batch_size=100"]
        full = run_cli(*args, check=False)
        assert full.returncode == 1
        assert b"disk holding the index" in full.stderr and b"full" in full.stderr
        assert run_cli("check", "--state", str(small / "state")).returncode == 0
        shutil.copytree(small / "state", tmp_path / "state")
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)
    os.remove(tmp_path / "state" / "writer.lock")
    args[3] = str(tmp_path / "state")
    resumed = run_cli(*args)
    assert b"resumed" in resumed.stdout
    reference = tmp_path / "reference"
    run_cli("dedup", str(crawl_file), "--state", str(reference), "--decisions", str(tmp_path / "ref.jsonl"),
            "--set", "worker.batch_size=100")
    assert (tmp_path / "d.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()
    assert run_cli("check", "--state", str(tmp_path / "state")).returncode == 0
