"""Accuracy on the synthetic crawl against an exact reference (threshold 0.7, 128 permutations)."""

from __future__ import annotations

import pytest

from streamdedup import config as config_module
from streamdedup.core.records import Document, Source
from streamdedup.core.shingle import normalize_batch, shingle_batch
from streamdedup.engine.engine import Engine

THRESHOLD = 0.7


def exact_reference(texts: list[str]) -> list[tuple[str, int | None]]:
    """Each document in order against every earlier kept one, by exact Jaccard: (status, matched index)."""
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
        if best is None:
            kept.append(i)
            result.append(("kept", None))
        else:
            result.append(("duplicate", best))
    return result


@pytest.fixture(scope="module")
def decided(crawl, tmp_path_factory):
    cfg = config_module.load(None, environ={})
    state = tmp_path_factory.mktemp("accuracy")
    with Engine(cfg, str(state)) as engine:
        assert (engine.signing.num_perm, engine.settings.threshold) == (128, THRESHOLD)
        items = [Document(d.id, d.text, Source("crawl", -1, i)) for i, d in enumerate(crawl)]
        decisions = []
        for start in range(0, len(items), 200):
            decisions += engine.decide_batch(engine.prepare(items[start:start + 200]))
    return decisions


def test_agrees_with_the_exact_reference_on_99_percent(crawl, decided):
    reference = exact_reference([d.text for d in crawl])
    ids = [d.id for d in crawl]
    agree = sum(
        d.status == status and (status == "kept" or d.cluster == ids[match])
        for d, (status, match) in zip(decided, reference)
    )
    assert agree / len(crawl) >= 0.99, f"{agree} of {len(crawl)} agree"
    assert len(crawl) > 1100


def test_every_duplicate_is_really_above_the_threshold(crawl, decided):
    by_id = {d.id: d.text for d in crawl}
    duplicates = [d for d in decided if d.status == "duplicate"]
    assert len(duplicates) > 250
    for d in duplicates:
        batch = shingle_batch(normalize_batch([by_id[d.id], by_id[d.matched]]))
        a, b = set(batch.of(0).tolist()), set(batch.of(1).tolist())
        exact = len(a & b) / len(a | b)
        assert exact >= THRESHOLD
        assert exact == pytest.approx(d.similarity)


def test_no_document_joins_another_articles_cluster(crawl, decided):
    family = {d.id: d.family for d in crawl}
    assert all(family[d.cluster] == family[d.id] for d in decided)
    exact = [d for d in decided if d.exact]
    assert exact and all(d.similarity == 1.0 for d in exact)
