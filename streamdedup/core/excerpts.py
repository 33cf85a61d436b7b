"""Excerpts: a document most of whose content is contained in one earlier document.

*Containment* of A in B is |A ∩ B| / |A| over content shingles (see
``core.templates``); A is an excerpt of B when it reaches
``excerpts.containment``. Jaccard cannot see it: the seed tutorial's
141-shingle excerpt of a 2,046-shingle article has Jaccard 0.069 and
containment 1.0.

Candidates come from *anchors*: the content shingles whose hash is 0
modulo ``sampling``. The choice depends on the shingle alone, so an excerpt
and its source pick the same anchors among the shingles they share, and
an excerpt of n shingles brings about n / sampling of them, whatever the
source's length. Verification stays exact: containment is computed over
the two documents' content shingles.
"""

from __future__ import annotations

import numpy as np

__all__ = ["anchors_of", "containment", "likely_sources", "need_of"]


def anchors_of(content: np.ndarray, sampling: int) -> np.ndarray:
    """The anchors of a document's sorted content shingles (sorted uint64)."""
    if sampling <= 1:
        return content
    return content[content % np.uint64(sampling) == 0]


def containment(part: np.ndarray, whole: np.ndarray) -> float:
    """|part ∩ whole| / |part| of two sorted arrays of unique hashes."""
    if len(part) == 0:
        return 0.0
    if len(whole) == 0:
        return 0.0
    at = np.searchsorted(whole, part)
    at[at == len(whole)] = 0
    return int(np.count_nonzero(whole[at] == part)) / len(part)


def need_of(anchors: int, share: float) -> int:
    """How many of a document's ``anchors`` anchors a candidate source must hold."""
    return max(1, int(np.ceil(share * anchors)))


def likely_sources(serials: np.ndarray, shared: np.ndarray, anchors: int, share: float, limit: int) -> list[int]:
    """Of the documents sharing ``shared[i]`` anchors each, those holding at least ``share`` of a
    document's ``anchors`` anchors, most first (ties: earliest)."""
    if len(serials) == 0:
        return []
    need = need_of(anchors, share)
    keep = shared >= need
    found, counts = serials[keep], shared[keep]
    order = np.lexsort((found, -counts))[:limit]
    return found[order].tolist()
