"""Accuracy on a web crawl with site templates, republished articles and excerpts (bench/crawl_accuracy.py)."""

from __future__ import annotations

import json

import pytest
from conftest import index_snapshot, run_cli

from bench import harness
from bench.crawl_accuracy import contained, jaccard, pitfall_three, score, shingle_sets
from streamdedup.core.webcrawl import generate_web, web_jsonl_lines

PAGES = 2000


def decided(path, state, settings=()) -> list[dict]:
    """The decisions of ``streamdedup dedup`` run as its own program (``bench.harness``)."""
    return harness.dedup(str(path), str(state), settings).decisions()


@pytest.fixture(scope="module", params=["invented", "stdlib"])
def crawl(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"web-{request.param}")
    path = folder / "web.jsonl"
    path.write_text("".join(web_jsonl_lines(generate_web(PAGES, 30, 11, request.param))), encoding="utf-8")
    return folder, [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_crawl_is_the_same_every_time_and_its_truth_holds():
    first = list(web_jsonl_lines(generate_web(300, 10, 3)))
    assert first == list(web_jsonl_lines(generate_web(300, 10, 3)))
    records = [json.loads(line) for line in first]
    bodies = shingle_sets([r["truth"]["body"] for r in records])
    where = {r["id"]: i for i, r in enumerate(records)}
    kinds = {r["truth"]["kind"] for r in records}
    assert kinds == {"article", "short", "republished", "excerpt"}
    for i, r in enumerate(records):
        truth = r["truth"]
        assert truth["body"] in r["text"] and truth["site"] in r["url"]
        if truth["kind"] == "republished":
            assert jaccard(bodies[i], bodies[where[truth["source"]]]) >= 0.6  # as it was, or 3% of words edited
        if truth["kind"] == "excerpt":
            assert contained(bodies[i], bodies[where[truth["source"]]]) >= 0.8
            assert len(bodies[where[truth["source"]]]) > len(bodies[i])


@pytest.mark.system
def test_templates_keep_pages_apart_and_republished_articles_are_found(crawl, tmp_path):
    folder, records = crawl
    result = score(records, decided(str(folder / "web.jsonl"), str(tmp_path / "state"), [])).rates()
    assert result["false_merges"] <= 0.001
    # the misses: republished on, or first seen on, a site that is still learning its template (see --learn-first)
    assert result["republished"] >= 0.95 and result["republished_of"] > 200
    assert result["settled_republished"] >= 0.99


@pytest.mark.system
def test_without_templates_pages_of_one_site_are_merged(crawl, tmp_path):
    folder, records = crawl
    off = ["templates.enabled=false"]
    result = score(records, decided(str(folder / "web.jsonl"), str(tmp_path / "state"), off)).rates()
    assert result["false_merges"] > 0.02 and result["republished"] < 0.5


@pytest.mark.system
def test_excerpts_are_found_and_none_is_false(crawl, tmp_path):
    folder, records = crawl
    on = ["excerpts.enabled=true"]
    result = score(records, decided(str(folder / "web.jsonl"), str(tmp_path / "state"), on)).rates()
    assert result["excerpts"] >= 0.95 and result["excerpts_of"] > 100
    assert result["false_excerpts"] == 0 and result["false_merges"] <= 0.001


@pytest.mark.system
def test_the_seed_pitfall_three_pages_are_not_flagged(tmp_path):
    pages, mean = pitfall_three()
    assert mean > 0.7
    path = tmp_path / "pitfall3.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pages), encoding="utf-8")
    assert all(d["status"] == "kept" for d in decided(str(path), str(tmp_path / "state"), []))


@pytest.mark.system
def test_learning_templates_first_finds_articles_republished_on_a_sites_first_pages(crawl, tmp_path):
    folder, records = crawl
    path = str(folder / "web.jsonl")
    single = score(records, decided(path, str(tmp_path / "single"), [])).rates()
    first = score(records, decided(path, str(tmp_path / "first"), ["--learn-first"])).rates()
    assert first["republished"] >= 0.99 and first["learning_republished"] >= 0.99
    assert first["republished"] > single["republished"]
    assert first["false_merges"] <= 0.001


@pytest.mark.system
def test_a_learn_first_run_killed_then_resumed_decides_as_an_uninterrupted_one(crawl, tmp_path):
    folder, _ = crawl
    path = str(folder / "web.jsonl")

    def dedup(state, **kw):
        return run_cli("dedup", path, "--state", str(tmp_path / state), "--decisions", str(tmp_path / f"{state}.jsonl"),
                       "--learn-first", "--set", "worker.batch_size=100", **kw)

    assert dedup("whole").returncode == 0
    crashed = dedup("resumed", check=False, env={"STREAMDEDUP_TEST_CRASH_AT": "file-committed:4"})
    assert crashed.returncode == 137
    assert b"resumed" in dedup("resumed").stdout
    assert (tmp_path / "resumed.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert index_snapshot(tmp_path / "resumed") == index_snapshot(tmp_path / "whole")


@pytest.mark.system
def test_learn_first_needs_files_it_can_read_twice(tmp_path):
    result = run_cli("dedup", "-", "--state", str(tmp_path / "state"), "--learn-first", check=False, stdin=b"")
    assert result.returncode != 0 and b"--learn-first reads the inputs twice" in result.stderr
