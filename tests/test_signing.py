"""MinHash signing: accuracy of the estimator, stability, batch independence."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from streamdedup.core.shingle import (
    ShingleBatch,
    normalize_batch,
    shingle_batch,
    shingle_hashes_exact,
)
from streamdedup.core.signing import estimate_jaccard, sign_batch

SEEDS = 300  # the RMS of 300 runs is itself within about 4% of its expectation


def _pair(size: int, target: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Two sets of shingle hashes of ``size`` elements with Jaccard as close to ``target`` as sizes allow."""
    shared = round(2 * size * target / (1 + target))
    words = [f"shared {i} x" for i in range(shared)]
    only_a = [f"only a {i}" for i in range(size - shared)]
    only_b = [f"only b {i}" for i in range(size - shared)]
    hash_of = lambda texts: np.array(sorted({shingle_hashes_exact(t, "char", 64)[0] for t in texts}), np.uint64)
    a, b = hash_of(words + only_a), hash_of(words + only_b)
    return a, b, shared / (2 * size - shared)


@pytest.mark.parametrize("target", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("num_perm", [64, 128])
def test_estimator_error_matches_theory(target, num_perm):
    a, b, exact = _pair(200, target)
    batch = ShingleBatch(np.concatenate((a, b)), np.array([0, len(a), len(a) + len(b)]))
    errors = []
    for seed in range(SEEDS):
        signatures = sign_batch(batch, num_perm, seed)
        errors.append(estimate_jaccard(signatures[0], signatures[1]) - exact)
    rms = math.sqrt(float(np.mean(np.square(errors))))
    theory = math.sqrt(exact * (1 - exact) / num_perm)
    assert abs(rms - theory) <= 0.15 * theory, f"RMS {rms:.4f} vs theory {theory:.4f}"
    assert abs(float(np.mean(errors))) < 2 * theory / math.sqrt(SEEDS) + 0.005  # unbiased


def test_identical_sets_have_identical_signatures_and_disjoint_ones_almost_never_agree():
    batch = shingle_batch(normalize_batch(["a b c d e f g", "a b c d e f g", "p q r s t u v"]))
    signatures = sign_batch(batch, 128, 7)
    assert estimate_jaccard(signatures[0], signatures[1]) == 1.0
    assert estimate_jaccard(signatures[0], signatures[2]) < 0.05


def test_signature_of_a_document_does_not_depend_on_its_batch():
    texts = [f"document number {i} with some words {i * 7}" for i in range(300)]
    together = sign_batch(shingle_batch(normalize_batch(texts)), 128, 1)
    for i in (0, 150, 299):
        alone = sign_batch(shingle_batch(normalize_batch([texts[i]])), 128, 1)
        assert np.array_equal(alone[0], together[i])


@pytest.mark.system
def test_signatures_are_identical_across_processes_and_hash_seeds():
    code = (
        "from streamdedup.core.shingle import shingle_batch, normalize_batch; from streamdedup.core.signing import sign_batch; "
        "s = sign_batch(shingle_batch(normalize_batch(['Café au lait, s’il vous plaît', 'x y z w'])), 128, 3); "
        "print(s.tolist())"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONHASHSEED=seed)).stdout
        for seed in ("1", "2", "random")
    }
    assert len(outputs) == 1


def test_pinned_signature_values():
    """Stored band keys depend on these values: changing them needs a new signing.HASH_VERSION."""
    signatures = sign_batch(shingle_batch(["the quick brown fox"]), 4, 1)
    assert signatures.tolist() == [[637440729, 1171851238, 1638684693, 1264724305]]


def test_fast_and_exact_paths_give_identical_signatures_on_mixed_text():
    from test_shingle import MIXED

    from streamdedup.core.shingle import normalize_texts

    texts = MIXED + ["plain ascii words " * 5, "Ascii, with PUNCTUATION!"]
    fast = sign_batch(shingle_batch(normalize_texts(texts)), 128, 1)
    exact_hashes = [np.array(shingle_hashes_exact(t), dtype=np.uint64) for t in texts]
    offsets = np.cumsum([0] + [len(h) for h in exact_hashes])
    exact = sign_batch(ShingleBatch(np.concatenate(exact_hashes), offsets), 128, 1)
    assert np.array_equal(fast, exact)
