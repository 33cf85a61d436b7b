"""``streamdedup restore`` from a backup, without a broker: what it refuses, and what it puts in place.

The end-to-end recovery against a broker (a deleted index folder restored, the worker replaying what it
had emitted without emitting it again) is in ``test_exactly_once.py``.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from streamdedup.config import load
from streamdedup.core import corpus
from streamdedup.engine.engine import Engine

pytestmark = pytest.mark.system  # every test here starts processes


def _documents(state) -> int:
    return json.loads(run_cli("stats", "--json", "--state", str(state)).stdout)["documents"]


def _index_with_backup(tmp_path, crawl_file):
    state = tmp_path / "state"
    run_cli("dedup", str(crawl_file), "--state", str(state), "--decisions", str(tmp_path / "d.jsonl"))
    run_cli("backup", str(tmp_path / "backup"), "--state", str(state))
    return state


def test_restore_puts_the_backup_in_a_lost_folder_and_replaces_an_index_only_when_told(tmp_path, crawl_file, crawl):
    _index_with_backup(tmp_path, crawl_file)
    other, few = tmp_path / "other", tmp_path / "few.jsonl"
    with open(few, "w", encoding="utf-8") as handle:
        corpus.write_jsonl(corpus.generate(20, seed=3), handle)
    run_cli("dedup", str(few), "--state", str(other), "--decisions", str(tmp_path / "o.jsonl"))
    held = _documents(other)
    refused = run_cli("restore", str(tmp_path / "backup"), "--state", str(other), check=False)
    assert refused.returncode != 0 and b"--replace" in refused.stderr
    assert _documents(other) == held != len(crawl), "a refused restore leaves the folder's index alone"
    run_cli("restore", str(tmp_path / "backup"), "--state", str(other), "--replace")
    assert _documents(other) == len(crawl)
    lost = tmp_path / "lost"
    done = run_cli("restore", str(tmp_path / "backup" / "data.mdb"), "--state", str(lost))
    assert f"restored {len(crawl):,} documents".encode() in done.stdout
    assert sorted(p.name for p in lost.iterdir()) == ["data.mdb", "writer.lock"], "no staging or stale files left"
    assert run_cli("check", "--state", str(lost)).returncode == 0


def test_restore_refuses_a_folder_a_writer_holds_and_a_backup_of_another_configuration(tmp_path, crawl_file):
    _index_with_backup(tmp_path, crawl_file)
    busy = tmp_path / "busy"
    with Engine(load(None, environ={}), str(busy)):
        held = run_cli("restore", str(tmp_path / "backup"), "--state", str(busy), "--replace", check=False)
    assert held.returncode != 0 and b"already open for writing" in held.stderr
    fresh = tmp_path / "fresh"
    other = run_cli("restore", str(tmp_path / "backup"), "--state", str(fresh), "--set", "signing.num_perm=64",
                    check=False)
    assert other.returncode != 0 and b"num_perm" in other.stderr
    assert not (fresh / "data.mdb").exists()
    missing = run_cli("restore", str(tmp_path / "nothing"), "--state", str(fresh), check=False)
    assert missing.returncode != 0 and b"no backup at" in missing.stderr
    neither = run_cli("restore", "--state", str(fresh), check=False)
    assert neither.returncode != 0 and b"--from-topics" in neither.stderr
