"""LSH banding, pure math: the S-curve, choosing bands x rows, band keys.

A signature of ``bands * rows`` values is cut into ``bands`` bands of
``rows`` values. Two documents whose Jaccard similarity is ``s`` share at
least one band, and so become candidates, with probability

    P(s) = 1 - (1 - s**rows)**bands

``optimal_params`` picks the ``(bands, rows)`` with ``bands * rows <= num_perm``
that minimizes ``fp_weight * FP + fn_weight * FN``, where FP is the area
under P below the threshold and FN the area above P beyond it (the same
choice as datasketch's ``MinHashLSH``, which integrates with scipy). The
areas come from composite Gauss-Legendre quadrature evaluated for every
candidate pair at once.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb

import numpy as np

from .shingle import GOLDEN, _kernel, fmix64

__all__ = ["s_curve", "band_hits", "optimal_params", "recall_params", "band_keys", "approx_threshold", "band_slots",
           "sorted_slots", "KEY_MASK"]

KEY_MASK = np.uint64(0xFFFFFFFF)  # a band slot's band key (``band_slots``)

_PANELS = 64  # sub-intervals of each integral
_NODES = 16  # Gauss-Legendre points per sub-interval
# The 16-point Gauss-Legendre rule's positive nodes and their weights, as ``numpy.polynomial.legendre.leggauss(16)``
# gives them (bit for bit; it makes them symmetric, and the negative half mirrors these). A table: the rule's
# eigenvalue solve and the import of ``numpy.polynomial`` cost 4-6 ms at the start of every process that signs.
_LEGGAUSS_16 = (
    (0.09501250983763744, 0.18945061045506864), (0.2816035507792589, 0.18260341504492364),
    (0.45801677765722737, 0.16915651939500265), (0.6178762444026438, 0.1495959888165767),
    (0.755404408355003, 0.12462897125553407), (0.8656312023878318, 0.0951585116824926),
    (0.9445750230732326, 0.062253523938647456), (0.9894009349916499, 0.027152459411754176),
)
BAND_BASE = np.uint64(0xD6E8FEB86659FD93)  # odd multiplier that folds a band's rows (also in the compiled kernel's prepare_ascii)
_BAND_BASE = BAND_BASE


def s_curve(similarity, bands: int, rows: int, min_shared: int = 1):
    """Probability that two documents of this Jaccard similarity become candidates (share ``min_shared`` bands).

    The bands two documents share are binomial: ``bands`` draws, each with
    probability ``similarity ** rows``.
    """
    one = np.power(similarity, rows)
    if min_shared == 1:
        return 1.0 - (1.0 - one) ** bands
    fewer = sum(comb(bands, k) * one**k * (1.0 - one) ** (bands - k) for k in range(min_shared))
    return 1.0 - fewer


def band_hits(similarity, bands: int, rows: int):
    """Expected band entries one document reads for each kept document of this similarity."""
    return bands * np.power(similarity, rows)


@lru_cache(maxsize=256)
def recall_params(threshold: float, num_perm: int, recall: float) -> tuple[int, int, int]:
    """``(bands, rows, min_shared)``: pairs at ``threshold`` become candidates with probability ``recall``.

    Rows are as many as can reach the recall (each band key then matches
    fewest unrelated documents, so lookups stay short); with those rows,
    the bands and the bands two documents must share (1 to 3) that make
    the fewest candidates below the threshold (the area under the S-curve),
    fewer bands on a tie. Requiring two shared bands of many bands is a cheap
    agreement test: it keeps recall at the threshold and drops the pairs
    that share one band by chance.
    """
    if not 0.0 < recall < 1.0:
        raise ValueError(f"recall must be between 0 and 1 (exclusive), got {recall}")
    s_low, w_low = _nodes(0.0, threshold)
    for rows in range(num_perm, 0, -1):
        options = [(float(s_curve(s_low, bands, rows, shared) @ w_low), bands, shared)
                   for bands in range(1, num_perm // rows + 1) for shared in range(1, min(3, bands) + 1)
                   if s_curve(threshold, bands, rows, shared) >= recall]
        if options:
            _, bands, shared = min(options)
            return bands, rows, shared
    raise ValueError(f"no bands x rows of {num_perm} values reach recall {recall} at threshold {threshold}")


def approx_threshold(bands: int, rows: int) -> float:
    """Similarity at which the S-curve is about half way up: (1/bands)**(1/rows)."""
    return (1.0 / bands) ** (1.0 / rows)


def gauss_legendre() -> tuple[np.ndarray, np.ndarray]:
    """The ``_NODES``-point Gauss-Legendre rule on [-1, 1]: nodes ascending and their weights (``_LEGGAUSS_16``)."""
    positive = np.array(_LEGGAUSS_16)
    return np.concatenate([-positive[::-1, 0], positive[:, 0]]), np.concatenate([positive[::-1, 1], positive[:, 1]])


def _nodes(low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """Quadrature points and weights for the integral over [low, high]."""
    x, w = gauss_legendre()
    edges = np.linspace(low, high, _PANELS + 1)
    half = (edges[1:] - edges[:-1])[:, None] / 2
    mid = (edges[1:] + edges[:-1])[:, None] / 2
    return (mid + half * x).ravel(), (half * w).ravel()


@lru_cache(maxsize=256)
def optimal_params(
    threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5
) -> tuple[int, int]:
    """The ``(bands, rows)`` that minimizes the weighted false-positive and false-negative areas."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be between 0 and 1 (exclusive), got {threshold}")
    if num_perm < 2:
        raise ValueError(f"num_perm must be at least 2, got {num_perm}")
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=float)
    bands, rows = pairs[:, :1], pairs[:, 1:]
    s_low, w_low = _nodes(0.0, threshold)
    s_high, w_high = _nodes(threshold, 1.0)
    false_pos = (1.0 - (1.0 - s_low**rows) ** bands) @ w_low
    false_neg = ((1.0 - s_high**rows) ** bands) @ w_high
    error = fp_weight * false_pos + fn_weight * false_neg
    best = int(np.argmin(error))  # first minimum, in datasketch's loop order
    return int(pairs[best, 0]), int(pairs[best, 1])


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 32-bit key per band per document, shape (documents, bands), uint64 holding 32 bits.

    The band number is mixed in, so equal values in different bands rarely
    give the same key. 32 bits are plenty: two unrelated documents share a
    band key by chance once in 2**32 bands, and every candidate is verified.
    """
    n = signatures.shape[0]
    grid = signatures[:, : bands * rows].astype(np.uint64).reshape(n, bands, rows)
    powers = np.cumprod(np.full(rows, _BAND_BASE, dtype=np.uint64))
    with np.errstate(over="ignore"):
        folded = (grid * powers).sum(axis=2, dtype=np.uint64)
        folded ^= np.arange(1, bands + 1, dtype=np.uint64) * np.uint64(GOLDEN)
        return fmix64(folded) >> np.uint64(32)


def band_slots(bands: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each (band, 32-bit band key) as one number, ``band << 32 | key``: what a lookup matches.

    A band key's value is unique to its band only up to chance (one pair of
    bands in 2^32), and the band table files keys under their band: every
    lookup in memory (the recent mirror, the batch's own rows) matches the
    pair too, so that where a document is filed never changes what it finds.
    """
    return (bands.astype(np.uint64) << np.uint64(32)) | keys.astype(np.uint64)


def sorted_slots(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's band keys (rows x bands) as band slots (``band_slots``) sorted, the row of each and its band;
    rows of an equal slot in row order."""
    n, bands = keys.shape
    if _kernel is not None and n:  # band by band, each band's keys radix sorted with their rows
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        size = n * bands
        slots, rows, band = np.empty(size, np.uint64), np.empty(size, np.int64), np.empty(size, np.uint16)
        if _kernel.band_slots_sorted(keys, bands, slots, rows, band):
            return slots, rows, band
    slots = band_slots(np.arange(bands, dtype=np.uint64)[None, :], keys).ravel()
    by_slot = np.argsort(slots, kind="stable")
    return slots[by_slot], by_slot // bands, (by_slot % bands).astype(np.uint16)
