"""Exact verification of candidates: Jaccard similarity of stored shingle hashes."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

__all__ = ["jaccard", "best_match"]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|A & B| / |A | B| of two sorted arrays of unique hashes."""
    if len(a) > len(b):
        a, b = b, a
    if len(a) == 0:
        return 1.0 if len(b) == 0 else 0.0
    positions = np.searchsorted(b, a)
    positions[positions == len(b)] = 0
    shared = int(np.count_nonzero(b[positions] == a))
    return shared / (len(a) + len(b) - shared)


def best_match(
    shingles: np.ndarray, candidates: Iterable[tuple[int, np.ndarray]], threshold: float
) -> tuple[Optional[int], Optional[float], int]:
    """The candidate most similar to ``shingles`` at or above ``threshold``.

    Returns (serial, similarity, how many were compared). Ties go to the
    smallest serial: the earliest kept document.
    """
    best: Optional[int] = None
    best_similarity = -1.0
    compared = 0
    for serial, other in candidates:
        compared += 1
        similarity = jaccard(shingles, other)
        if similarity >= threshold and (
            similarity > best_similarity or (similarity == best_similarity and serial < best)
        ):
            best, best_similarity = serial, similarity
    return best, (best_similarity if best is not None else None), compared
