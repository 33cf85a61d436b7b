"""A batch's templated pairs compared at once (``evidence._Matches._pair_similarities``): the same similarities, and
so the same decisions, as making and comparing each pair in turn."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from streamdedup import config as config_module
from streamdedup.core.records import Document, Source
from streamdedup.core.templates import EMPTY, content_of, contents_of
from streamdedup.core.verify import jaccard, jaccards
from streamdedup.core.webcrawl import generate_web, web_jsonl_lines
from streamdedup.engine import evidence
from streamdedup.engine.engine import Engine
from streamdedup.engine.evidence import pair_similarity


def sorted_set(rng: random.Random, size: int, top: int, dtype=np.uint32) -> np.ndarray:
    return np.array(sorted(rng.sample(range(top), size)), dtype=dtype)


def test_jaccards_equal_jaccard_of_each_pair():
    rng = random.Random(5)
    owns, others = [], []
    for _ in range(300):
        top = rng.choice([50, 1000, 1 << 32])
        owns.append(sorted_set(rng, rng.choice([0, 1, 7, 40]), top))
        others.append(sorted_set(rng, rng.choice([0, 1, 9, 40]), top))
    assert jaccards(owns, others).tolist() == [jaccard(a, b) for a, b in zip(owns, others)]
    wide = [a.astype(np.uint64) for a in owns]  # not uint32: pair by pair, the same values
    assert jaccards(wide, others).tolist() == [jaccard(a, b) for a, b in zip(wide, others)]


def test_contents_of_equal_content_of_each():
    rng = random.Random(9)
    shingles, templates, shareds = [], [], []
    for _ in range(400):
        values = sorted_set(rng, rng.choice([0, 3, 30, 200]), 400)
        template = sorted_set(rng, rng.choice([0, 5, 100, 390]), 400)
        shared = EMPTY if rng.random() < 0.4 else sorted_set(rng, rng.choice([1, 20, 200]), 400)
        if rng.random() < 0.05:
            template = values.copy()  # all of it template: the page keeps it
        shingles.append(values)
        templates.append(template)
        shareds.append(shared)
    for share in (0.0, 0.25, 0.5):
        made = contents_of(shingles, templates, shareds, share)
        expected = [content_of(*asked, share) for asked in zip(shingles, templates, shareds)]
        assert len(made) == len(expected)
        for got, want, values in zip(made, expected, shingles):
            assert got.dtype == want.dtype and got.tolist() == want.tolist()
            assert (got is values) == (want is values)  # the whole set is the array itself
        wide = contents_of([a.astype(np.uint64) for a in shingles], templates, shareds, share)
        assert [a.tolist() for a in wide] == [a.tolist() for a in expected]


def pair_by_pair(self, pairs: list) -> list[float]:
    """What ``_pair_similarities`` gives, each pair made and compared in turn (the way before it)."""
    content, similarities = self.content, []
    for _, row, serial, own, shingles, own_site, own_template, other_site, other_template, shared, at in pairs:
        other = content_of(shingles, other_template, shared, content.settings.min_content_share)
        compared = content.pair_contents_under(own, own_site, other, other_site, own_template, other_template, at)
        similarities.append(pair_similarity(content, row, *compared))
    return similarities


def decisions_of(pages: list[dict], state) -> list[tuple]:
    """The crawl decided in batches of 250 by an engine with site templates (the pages' urls)."""
    items = [Document(p["id"], p["text"], Source("crawl", -1, n), p["url"]) for n, p in enumerate(pages)]
    decided = []
    with Engine(config_module.load(None, (), environ={}), str(state)) as engine:
        for start in range(0, len(items), 250):
            decided += engine.decide_batch(engine.prepare(items[start:start + 250]))
    return [(d.id, d.status, d.cluster, d.matched, d.similarity, d.relation) for d in decided]


@pytest.mark.parametrize("prose", ["invented", "stdlib"])
def test_a_crawl_decided_with_pairs_at_once_as_pair_by_pair(tmp_path, monkeypatch, prose):
    pages = [json.loads(line) for line in web_jsonl_lines(generate_web(2500, 30, 7, prose, "sections"))]
    compared = []
    at_once = evidence._Matches._pair_similarities

    def counted(self, pairs):
        compared.append(len(pairs))
        return at_once(self, pairs)

    monkeypatch.setattr(evidence._Matches, "_pair_similarities", counted)
    together = decisions_of(pages, tmp_path / "together")
    assert sum(compared) > 100  # the crawl's batches have templated pairs with stored candidates
    monkeypatch.setattr(evidence._Matches, "_pair_similarities", pair_by_pair)
    assert decisions_of(pages, tmp_path / "one-by-one") == together
