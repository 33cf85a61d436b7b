"""Accuracy on the synthetic crawl against an exact reference (threshold 0.7, 128 permutations)."""

from __future__ import annotations

import pytest

from streamdedup import config as config_module
from streamdedup.core.records import Document, Source
from streamdedup.core.shingle import normalize_batch, shingle_batch
from streamdedup.engine.engine import Engine

THRESHOLD = 0.7


def exact_reference(texts: list[str], containment: float | None = None,
                    min_shingles: int = 50) -> list[tuple[str, int | None]]:
    """Each document in order against every earlier kept one, by exact Jaccard: (status, matched index).

    With ``containment``: a document with no match at the threshold, and at least ``min_shingles``, is an
    excerpt of the earlier kept document holding the largest share of its shingles, if one holds that much.
    """
    batch = shingle_batch(normalize_batch(texts))
    sets = [set(batch.of(i).tolist()) for i in range(len(texts))]
    kept: list[int] = []
    result = []
    for i, shingles in enumerate(sets):
        best, best_similarity = None, -1.0
        for k in kept:
            shared = len(shingles & sets[k])
            similarity = shared / (len(shingles) + len(sets[k]) - shared)
            if similarity >= THRESHOLD and similarity > best_similarity:
                best, best_similarity = k, similarity
        if best is None and containment is not None and len(shingles) >= min_shingles:
            for k in kept:
                share = len(shingles & sets[k]) / len(shingles)
                if share >= containment and share > best_similarity:
                    best, best_similarity = k, share
        if best is None:
            kept.append(i)
            result.append(("kept", None))
        else:
            result.append(("duplicate", best))
    return result


def _decided(crawl, state, *settings, batch=200):
    cfg = config_module.load(None, settings, environ={})
    with Engine(cfg, str(state)) as engine:
        assert (engine.signing.num_perm, engine.settings.threshold) == (128, THRESHOLD)
        items = [Document(d.id, d.text, Source("crawl", -1, i)) for i, d in enumerate(crawl)]
        decisions = []
        for start in range(0, len(items), batch):
            decisions += engine.decide_batch(engine.prepare(items[start:start + batch]))
    return decisions


def test_batch_boundaries_change_no_decision(crawl, decided, tmp_path):
    """Excerpt anchors fill up (``excerpts.max_postings``) in decision order, whatever the batches."""
    on = ("excerpts.enabled=true", "excerpts.max_postings=4")
    assert _decided(crawl, tmp_path / "small", *on, batch=37) == _decided(crawl, tmp_path / "large", *on, batch=500)


@pytest.fixture(scope="module")
def decided(crawl, tmp_path_factory):
    return _decided(crawl, tmp_path_factory.mktemp("accuracy"), "excerpts.enabled=true")


def _agreement(crawl, decided, reference) -> float:
    ids = [d.id for d in crawl]
    agree = sum(
        d.status == status and (status == "kept" or d.cluster == ids[match])
        for d, (status, match) in zip(decided, reference)
    )
    return agree / len(crawl)


def test_agrees_with_the_exact_reference_on_99_percent(crawl, decided):
    """Templates and excerpts on, against the exact reference of the same definition."""
    reference = exact_reference([d.text for d in crawl], containment=0.8)
    assert _agreement(crawl, decided, reference) >= 0.99
    assert len(crawl) > 1100


def test_by_default_it_agrees_with_the_plain_jaccard_reference(crawl, tmp_path):
    decided = _decided(crawl, tmp_path)
    assert _agreement(crawl, decided, exact_reference([d.text for d in crawl])) >= 0.99


def test_every_duplicate_is_really_above_the_threshold(crawl, decided):
    """Near duplicates by exact Jaccard, excerpts by exact containment (pages without a URL: whole texts)."""
    by_id = {d.id: d.text for d in crawl}
    duplicates = [d for d in decided if d.status == "duplicate"]
    assert len(duplicates) > 250 and any(d.relation == "excerpt" for d in duplicates)
    for d in duplicates:
        batch = shingle_batch(normalize_batch([by_id[d.id], by_id[d.matched]]))
        a, b = set(batch.of(0).tolist()), set(batch.of(1).tolist())
        exact = len(a & b) / len(a | b)
        assert exact == pytest.approx(d.similarity)
        if d.relation == "excerpt":
            assert d.containment == pytest.approx(len(a & b) / len(a)) and d.containment >= 0.8
        else:
            assert exact >= THRESHOLD and d.containment is None


def test_no_document_joins_another_articles_cluster(crawl, decided):
    family = {d.id: d.family for d in crawl}
    assert all(family[d.cluster] == family[d.id] for d in decided)
    exact = [d for d in decided if d.exact]
    assert exact and all(d.similarity == 1.0 for d in exact)
