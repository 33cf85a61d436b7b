"""The real-text truth of bench/realtext.py: brute-force pairs, the greedy reference, and the score of a run."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from test_accuracy import exact_reference

from bench.realtext import (
    components,
    greedy_reference,
    prose_windows,
    run_dedup,
    score,
    shingle_sets,
    similar_pairs,
)


def _records(count: int = 400) -> list[dict]:
    texts = prose_windows(count, random.Random(3), paragraphs_used=150)
    return [{"id": f"r{i}", "text": text} for i, (_, text) in enumerate(texts)]


def test_pairs_are_every_pair_at_or_above_one_half_exactly():
    sets = [set(s.tolist()) for s in shingle_sets([r["text"] for r in _records(150)])]
    expected = {}
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            similarity = len(sets[i] & sets[j]) / len(sets[i] | sets[j])
            if similarity >= 0.5:
                expected[(i, j)] = similarity
    found = similar_pairs([np.array(sorted(s), dtype=np.uint32) for s in sets], block=40)
    assert found.keys() == expected.keys() and len(found) > 20
    assert all(abs(found[k] - expected[k]) < 1e-12 for k in found)


def test_the_greedy_reference_from_pairs_is_the_exact_greedy_rule():
    records = _records()
    pairs = similar_pairs(shingle_sets([r["text"] for r in records]))
    reference = greedy_reference(len(records), pairs)
    assert reference == [(s, -1 if m is None else m) for s, m in exact_reference([r["text"] for r in records])]
    assert sum(s == "duplicate" for s, _ in reference) > 50


@pytest.mark.system
def test_a_run_scores_against_the_truth_and_wrong_decisions_lower_it(tmp_path):
    records = _records()
    path = tmp_path / "real.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    pairs = similar_pairs(shingle_sets([r["text"] for r in records]))
    reference, parts = greedy_reference(len(records), pairs), components(len(records), pairs)
    decisions, rate, size = run_dedup(str(path), [])
    result = score(records, decisions, pairs, reference, parts)
    assert result["status"] >= 0.99 and result["found"] >= 0.99 and result["mixed"] == 0 and result["error"] < 1e-5
    assert rate > 0 and size > 0
    first = next(i for i, (s, _) in enumerate(reference) if s == "duplicate")
    decisions[first] = dict(decisions[first], status="kept", cluster=decisions[first]["id"], relation=None)
    worse = score(records, decisions, pairs, reference, parts)
    assert worse["status"] < result["status"] and worse["found"] < result["found"]
