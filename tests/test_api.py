"""The Python API on real LMDB indexes: the same decisions as ``dedup``, one writer, replays, kill -9, the README example."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import streamdedup
from conftest import ROOT, read_jsonl, run_cli, spawned
from streamdedup.errors import IndexLockedError, StreamdedupError, UnknownDocumentError


def _records(path) -> list[tuple[str, str]]:
    return [(row["id"], row["text"]) for row in read_jsonl(path)]


def _outcome(decision) -> dict:
    """What a decision says, as the ``--decisions`` line says it."""
    return decision.as_json()


@pytest.mark.system
def test_add_many_decides_exactly_as_the_dedup_command(tmp_path, crawl_file):
    run_cli("dedup", str(crawl_file), "--state", str(tmp_path / "cli"), "--decisions", str(tmp_path / "d.jsonl"))
    expected = read_jsonl(tmp_path / "d.jsonl")
    with streamdedup.open(tmp_path / "api") as index:
        decisions = index.add_many(_records(crawl_file), batch_size=300)
        stats = index.stats()
    assert [_outcome(d) for d in decisions] == expected
    assert sum(d.status == "duplicate" for d in decisions) > 100  # the crawl really has near and exact copies
    assert stats["documents"] == len(expected)


def test_dict_records_and_json_lines_read_as_the_command_reads_them(tmp_path, crawl_file):
    rows = read_jsonl(crawl_file)[:200]
    with streamdedup.open(tmp_path / "a") as index:
        from_dicts = [_outcome(d) for d in index.add_many(rows)]
    lines = Path(crawl_file).read_bytes().splitlines()[:200]
    with streamdedup.open(tmp_path / "b") as index:
        from_lines = [_outcome(d) for d in index.add_many(lines)]
    with streamdedup.open(tmp_path / "c") as index:
        from_pairs = [_outcome(d) for d in index.add_many((r["id"], r["text"]) for r in rows)]
    assert from_dicts == from_lines == from_pairs


def test_bad_records_get_rejected_decisions_with_their_reason(tmp_path):
    with streamdedup.open(tmp_path / "s", input={"max_text_bytes": 100}) as index:
        decisions = index.add_many([
            ("ok", "a perfectly ordinary text of several words"),
            ("blank", "   "),
            ("number", 42),
            (None, "no id at all"),
            {"text": "a dict without its id"},
            {"id": "big", "text": "word " * 50},
            ["a", "list"],
            ("punct", "!!! ... ???"),
        ])
    reasons = {d.id: (d.status, (d.reason or "").split(":")[0]) for d in decisions}
    assert reasons["ok"] == ("kept", "")
    assert reasons["blank"] == ("rejected", "empty_text")
    assert reasons["number"] == ("rejected", "text_not_string")
    assert reasons["big"] == ("rejected", "text_too_large")
    assert reasons["punct"] == ("rejected", "empty_text")
    by_position = [d.reason.split(":")[0] if d.reason else None for d in decisions]
    assert by_position[3:5] == ["bad_id", "bad_id"] and by_position[6] == "not_an_object"
    assert decisions[3].id == "python:4"  # named by its place in the call, as a file line is


def test_adding_again_replays_the_earlier_decisions(tmp_path, crawl_file):
    records = _records(crawl_file)[:400]
    with streamdedup.open(tmp_path / "s") as index:
        first = index.add_many(records)
        again = index.add_many(records)
        counts = index.stats()
        changed = index.add(records[0][0], records[0][1] + " and a new closing sentence of several words here")
    assert [_outcome(d) for d in again] == [_outcome(d) for d in first]
    assert all(d.replayed for d in again) and not any(d.replayed for d in first)
    assert counts["documents"] == 400
    assert not changed.replayed and changed.status == "duplicate"  # the same id with other text: a new version


@pytest.mark.system
def test_one_writer_at_a_time_and_readers_alongside(tmp_path):
    state = tmp_path / "s"
    with streamdedup.open(state) as writer:
        writer.add("x", "one two three four five six seven")
        with pytest.raises(IndexLockedError, match="exactly one writer"):
            streamdedup.open(state)
        code = f"import streamdedup; streamdedup.open({str(state)!r})"
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert other.returncode != 0 and "IndexLockedError" in other.stderr
        with pytest.raises(StreamdedupError, match="already open in this process: use the object"):
            streamdedup.open(state, readonly=True)
        reader = ("import streamdedup, sys; index = streamdedup.open(sys.argv[1], readonly=True); "
                  "print(index.stats()['documents'], [m.id for m in index.query('one two three four five six seven')]); "
                  "index.add('y', 'some other text')")
        read = subprocess.run([sys.executable, "-c", reader, str(state)], capture_output=True, text=True, timeout=120)
        assert read.stdout.strip() == "1 ['x']", read.stderr
        assert "opened read-only" in read.stderr
    with streamdedup.open(state) as writer:  # the lock goes with the first writer
        assert writer.add("y", "eight nine ten eleven twelve").status == "kept"


def test_query_cluster_forget_and_check(tmp_path, crawl_file):
    records = _records(crawl_file)[:300]
    with streamdedup.open(tmp_path / "s") as index:
        decisions = index.add_many(records)
        duplicate = next(d for d in decisions if d.status == "duplicate" and not d.exact)
        text = dict(records)[duplicate.id]
        found = {m.id: m for m in index.query(text)}
        assert found[duplicate.id].exact  # the document itself, by its content
        assert found[duplicate.matched].similarity == round(duplicate.similarity, 6)
        view = index.cluster(duplicate.id)
        assert view.representative["id"] == duplicate.cluster
        assert duplicate.id in [m["id"] for m in view.members]
        assert view.members_total == len(view.members)
        first = index.cluster(duplicate.id, limit=1)
        assert first.members == view.members[:1] and first.members_total == view.members_total
        with pytest.raises(UnknownDocumentError):
            index.cluster("no-such-id")
        report = index.forget([duplicate.matched, "no-such-id"])
        assert report.forgotten == [duplicate.matched] and report.unknown == ["no-such-id"]
        assert duplicate.matched not in [m.id for m in index.query(text)]
        with pytest.raises(UnknownDocumentError):
            index.cluster(duplicate.matched)
        assert index.check().ok


def test_config_file_and_section_overrides(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[lsh]\nthreshold = 0.9\n", encoding="utf-8")
    with streamdedup.open(tmp_path / "s", toml, index={"sync": False}) as index:
        assert index.config.lsh.threshold == 0.9 and index.config.index.sync is False
    with pytest.raises(StreamdedupError, match="lsh.threshold must be"):
        streamdedup.open(tmp_path / "t", lsh={"threshold": "high"})
    with pytest.raises(StreamdedupError, match="unknown section 'lhs'"):
        streamdedup.open(tmp_path / "t", lhs={"threshold": 0.8})


KILLED_WRITER = """
import sys, streamdedup
records = [tuple(r) for r in __import__("json").load(open(sys.argv[2]))]
with streamdedup.open(sys.argv[1]) as index:
    for n, decision in enumerate(index.add_stream(records, batch_size=100), 1):
        if n % 100 == 0:
            print(n, flush=True)
"""


@pytest.mark.system
def test_killed_in_the_middle_of_add_many_keeps_committed_batches_and_adding_again_is_safe(tmp_path, crawl_file):
    records = _records(crawl_file)
    records += [(doc_id + "-again", text) for doc_id, text in records]  # long enough to be killed well before the end
    (tmp_path / "records.json").write_text(json.dumps(records), encoding="utf-8")
    with streamdedup.open(tmp_path / "whole") as index:
        uninterrupted = [_outcome(d) for d in index.add_many(records, batch_size=100)]
    state = tmp_path / "killed"
    command = [sys.executable, "-c", KILLED_WRITER, str(state), str(tmp_path / "records.json")]
    with spawned(command, stdout=subprocess.PIPE, text=True, cwd=ROOT) as process:
        seen = [int(process.stdout.readline()) for _ in range(3)]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL and seen == [100, 200, 300]
    with streamdedup.open(state) as index:
        committed = index.stats()["documents"]
        assert committed % 100 == 0 and 300 <= committed < len(records)  # whole batches, never half of one
        again = index.add_many(records, batch_size=100)
        assert index.check().ok
        assert index.stats()["documents"] == len(records)
    assert [_outcome(d) for d in again] == uninterrupted
    assert sum(d.replayed for d in again) == committed


def _page_example():
    """The example session of the API page (docs/pages/api.md), as a doctest."""
    import doctest

    page = (ROOT / "docs" / "pages" / "api.md").read_text(encoding="utf-8")
    session = re.search(r"```pycon\n(.*?)```", page, re.S).group(1)
    return doctest.DocTestParser().get_doctest(session, {}, "api.md", "docs/pages/api.md", 0)


def test_the_api_page_example_prints_what_it_shows_and_the_same_when_run_again(tmp_path, monkeypatch):
    import doctest

    monkeypatch.chdir(tmp_path)
    shown = "".join(example.want for example in _page_example().examples)
    assert "news-2 duplicate news-1 near 0.875 None" in shown and "empty_text" in shown
    for _ in range(2):  # the second run replays every decision: the same output
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(_page_example(), out=lambda text: None)
        assert runner.tries > 0 and runner.failures == 0


@pytest.mark.system
def test_import_is_cheap_and_the_api_is_typed():
    code = ("import sys, streamdedup; heavy = [m for m in ('numpy', 'lmdb', 'streamdedup.api') if m in sys.modules]; "
            "streamdedup.open; print(heavy, 'streamdedup.api' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.stdout.strip() == "[] True", result.stderr
    package = Path(streamdedup.__file__).parent
    assert (package / "py.typed").is_file()
    assert 'streamdedup = ["py.typed"]' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert streamdedup.Decision.__module__ == "streamdedup.core.records"
    with pytest.raises(AttributeError):
        streamdedup.no_such_name


def test_wrong_uses_are_refused_at_the_call(tmp_path):
    with streamdedup.open(tmp_path / "s") as index:
        index.add("x", "one two three four five six seven")
        with pytest.raises(StreamdedupError, match="batch_size must be an integer of at least 1"):
            index.add_stream([("y", "text")], batch_size=0)
    with streamdedup.open(tmp_path / "s", readonly=True) as reader:
        with pytest.raises(StreamdedupError, match="opened read-only"):
            reader.add_stream([("y", "text")])  # refused before any record is read
        with pytest.raises(StreamdedupError, match="opened read-only"):
            reader.forget("x")
        assert reader.stats()["documents"] == 1
    with pytest.raises(StreamdedupError, match="config is a config.toml path or a streamdedup Config"):
        streamdedup.open(tmp_path / "s", config=42)
    with pytest.raises(StreamdedupError, match="no index at"):
        streamdedup.open(tmp_path / "none", readonly=True)
