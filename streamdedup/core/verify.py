"""Exact verification of candidates: Jaccard similarity of stored shingle hashes."""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

try:
    from . import _kernel
except ImportError:  # built by ``pip install`` when a C compiler is there
    _kernel = None

__all__ = ["jaccard", "jaccards", "jaccard_coded", "jaccards_coded", "codes_together", "all_code_together",
           "best_match"]

_UINT32 = np.dtype(np.uint32)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|A & B| / |A | B| of two sorted arrays of unique hashes."""
    if len(a) > len(b):
        a, b = b, a
    if len(a) == 0:
        return 1.0 if len(b) == 0 else 0.0
    if _kernel is not None and _is_uint32(a.dtype) and _is_uint32(b.dtype):
        shared = _kernel.shared_count(a, b)
    else:
        shared = shared_count_numpy(a, b)
    return shared / (len(a) + len(b) - shared)


def jaccards(owns: list[np.ndarray], others: list[np.ndarray]) -> np.ndarray:
    """``jaccard`` of each pair (``owns[p]``, ``others[p]``), the same values: in one kernel call when every array
    ``codes_together`` (a batch's templated pairs, gathered), else pair by pair."""
    if all_code_together(owns) and all_code_together(others):
        out = np.empty(len(owns), dtype=np.float64)
        _kernel.jaccards(owns, others, out)
        return out
    return np.array([jaccard(a, b) for a, b in zip(owns, others)], dtype=np.float64)


def jaccard_coded(a: np.ndarray, coded: bytes) -> Optional[float]:
    """``jaccard(a, eliasfano.decode(coded))`` decoded and compared in one kernel call (``coded_shared``);
    None when that cannot be done here (no kernel, or ``a`` not uint32): decode and call ``jaccard``.
    ValueError if ``coded`` is not a coding."""
    if _kernel is None or not _is_uint32(a.dtype):
        return None
    shared, n = _kernel.coded_shared(a, coded)
    if min(len(a), n) == 0:
        return 1.0 if max(len(a), n) == 0 else 0.0
    return shared / (len(a) + n - shared)


def codes_together(a: np.ndarray) -> bool:
    """Whether ``a`` can be verified against a coding in a batch's one call (``jaccards_coded``)."""
    return _kernel is not None and _is_uint32(a.dtype)


def all_code_together(arrays: list[np.ndarray]) -> bool:
    """``codes_together`` of every one of ``arrays``: their distinct dtypes asked once each."""
    return not arrays or (_kernel is not None and all(_is_uint32(dtype) for dtype in {a.dtype for a in arrays}))


def jaccards_coded(owns: list[np.ndarray], codings: list[bytes]) -> tuple[np.ndarray, int]:
    """``jaccard_coded`` of each pair, in one kernel call (each of ``owns`` ``codes_together``): the
    similarities, and -1 or the first pair whose coding is not one (similarities up to it only)."""
    out = np.empty(len(owns), dtype=np.float64)
    bad = _kernel.coded_jaccards(owns, codings, out)
    return out, bad


def _is_uint32(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is native uint32: numpy's own instance, or an equal one (an array that came through
    pickle, from the feed process, has a dtype of its own, which ``is`` alone took for another type)."""
    return dtype is _UINT32 or dtype == _UINT32


def shared_count_numpy(a: np.ndarray, b: np.ndarray) -> int:
    """How many values sorted unique ``a`` and ``b`` share (the kernel's ``shared_count`` without it)."""
    positions = np.searchsorted(b, a)
    positions[positions == len(b)] = 0
    return int(np.count_nonzero(b[positions] == a))


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
