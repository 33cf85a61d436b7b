"""MinHash signatures of whole batches of documents, vectorized with numpy.

Permutation ``p`` maps the top 32 bits ``x`` of a shingle hash to
``(a_p * x + b_p) mod 2**32`` with ``a_p`` odd: a bijection of the 32-bit
space, so each position of the signature is the minimum of the document's
shingles under one random permutation. Because shingle hashes are already
well mixed (``fmix64``), the agreement rate of two signatures estimates the
Jaccard similarity of the shingle sets with the usual error
sqrt(J(1-J)/num_perm) (tested). 32-bit lanes move half the bytes of 64-bit
ones and sign about 2.7 times faster; two unrelated documents agree on a
position by chance about once in tens of millions, far below the estimate's
own error.

The compiled kernel (``_kernel.c``) computes the same signatures one
document at a time, every permutation in vector lanes, without the
(num_perm x shingles) matrix; the numpy path runs when it was not built.

``a_p`` and ``b_p`` come from BLAKE2b of the seed and ``p``, never from a
random generator whose stream could change between library versions.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .lsh import band_keys, optimal_params, recall_params
from .shingle import ShingleBatch, _kernel
from .templates import TemplateSettings

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["SigningConfig", "sign_batch", "band_keys_of", "signing_config", "template_settings", "permutations", "HASH_VERSION"]

HASH_VERSION = 2  # bump when normalization, shingle hashing or permutations change
CHUNK_SHINGLES = 8192  # shingles per vectorized step: num_perm x 8192 x 4 B = 4 MiB at 128


@dataclass(frozen=True)
class SigningConfig:
    """Everything that decides a document's shingles, signature and band keys."""

    shingle: str = "word"  # "word" k-grams or "char" n-grams
    k: int = 3  # words (or characters) per shingle
    num_perm: int = 128  # signature length
    seed: int = 1  # seed of the permutations
    # A new index gets lsh.bands x lsh.rows, or else what lsh.recall_params picks for lsh.threshold and
    # lsh.recall (signing_config); these defaults are that pick at the defaults (threshold 0.7, recall 0.998).
    bands: int = 32
    rows: int = 4
    hash_version: int = HASH_VERSION
    templates: str = "off"  # ``TemplateSettings.fingerprint()``: how content is told from site templates
    excerpt_sampling: int = 0  # one content shingle in this many is an excerpt anchor (0: no excerpts)
    min_shared: int = 2  # bands a kept document shares with a document to be verified against it
    cap: str = "kept"  # what a band key's cap counts: kept documents, or "probes" (``candidates.file_prober``)

    def as_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """A short, stable name of this configuration for logs and stats."""
        return (
            f"{self.shingle}{self.k}-p{self.num_perm}-s{self.seed}-"
            f"b{self.bands}r{self.rows}m{self.min_shared}-h{self.hash_version}-t{self.templates}"
            f"-x{self.excerpt_sampling}" + ("" if self.cap == "kept" else f"-c{self.cap}")
        )


@lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Multipliers (odd) and increments of the ``num_perm`` permutations, as uint32 columns."""
    a = np.empty(num_perm, dtype=np.uint32)
    b = np.empty(num_perm, dtype=np.uint32)
    for p in range(num_perm):
        digest = hashlib.blake2b(f"streamdedup:{seed}:{p}".encode(), digest_size=8).digest()
        a[p] = int.from_bytes(digest[:4], "little") | 1
        b[p] = int.from_bytes(digest[4:], "little")
    return a[:, None], b[:, None]


def sign_batch(shingles: ShingleBatch, num_perm: int, seed: int) -> np.ndarray:
    """MinHash signatures, shape (documents, num_perm), uint32 (of shingle hashes, or of ``shingle.narrow``'s).

    Documents are taken in groups of about ``CHUNK_SHINGLES`` shingles so the
    working matrix stays in cache; every document must have a shingle.
    """
    if _kernel is not None:
        return _kernel_signatures(shingles, num_perm, seed)
    return _numpy_signatures(shingles, num_perm, seed)


def _kernel_signatures(shingles: ShingleBatch, num_perm: int, seed: int) -> np.ndarray:
    """``sign_batch`` by the compiled kernel."""
    a, b = permutations(num_perm, seed)
    out = np.empty((len(shingles.offsets) - 1, num_perm), dtype=np.uint32)
    hashes = shingles.hashes
    narrowed = hashes.dtype == np.uint32  # ``shingle.narrow``'s top 32 bits, signed as they are
    _kernel.minhash(np.ascontiguousarray(hashes, dtype=np.uint32 if narrowed else np.uint64), not narrowed,
                    np.ascontiguousarray(shingles.offsets, dtype=np.int64), a.ravel(), b.ravel(), out)
    return out


def _numpy_signatures(shingles: ShingleBatch, num_perm: int, seed: int) -> np.ndarray:
    """``sign_batch`` in numpy: a (num_perm, shingles) matrix per group of documents, reduced per document."""
    a, b = permutations(num_perm, seed)
    offsets = shingles.offsets
    n_docs = len(offsets) - 1
    out = np.empty((n_docs, num_perm), dtype=np.uint32)
    longest = int(np.max(np.diff(offsets))) if n_docs else 0
    buffer = np.empty(num_perm * (CHUNK_SHINGLES + longest), dtype=np.uint32)
    hashes = shingles.hashes
    x = hashes if hashes.dtype == np.uint32 else (hashes >> np.uint64(32)).astype(np.uint32)  # narrowed already
    first = 0
    while first < n_docs:
        last = int(np.searchsorted(offsets, offsets[first] + CHUNK_SHINGLES, "right")) - 1
        last = min(max(last, first + 1), n_docs)
        lo, hi = offsets[first], offsets[last]
        values = buffer[: num_perm * (hi - lo)].reshape(num_perm, hi - lo)
        with np.errstate(over="ignore"):
            np.multiply(a, x[None, lo:hi], out=values)
            values += b
        out[first:last] = np.minimum.reduceat(values, offsets[first:last] - lo, axis=1).T
        first = last
    return out


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of signature positions where the two signatures agree."""
    return float(np.count_nonzero(sig_a == sig_b)) / len(sig_a)


def signing_config(config: Config) -> SigningConfig:
    """The signing configuration a new index gets: bands x rows as configured, else chosen."""
    signing, lsh = config.signing, config.lsh
    shared = lsh.min_shared_bands or 1
    if lsh.bands:
        bands, rows = lsh.bands, lsh.rows
    elif lsh.recall:
        bands, rows, chosen = recall_params(lsh.threshold, signing.num_perm, lsh.recall)
        shared = lsh.min_shared_bands or chosen
    else:
        bands, rows = optimal_params(lsh.threshold, signing.num_perm, lsh.fp_weight, lsh.fn_weight)
    return SigningConfig(shingle=signing.shingle, k=signing.k, num_perm=signing.num_perm, seed=signing.seed,
                         bands=bands, rows=rows, templates=template_settings(config).fingerprint(),
                         excerpt_sampling=config.excerpts.sampling if config.excerpts.enabled else 0,
                         min_shared=shared, cap=lsh.cap)


def template_settings(config: Config) -> TemplateSettings:
    """The ``[templates]`` section as the engine's settings."""
    section = config.templates
    return TemplateSettings(section.enabled, section.sample_pages, section.share, section.relearn_every,
                            section.min_sites, section.min_content_share, section.learn_without_url,
                            section.window, section.min_pages, section.min_block, repeats=section.repeats,
                            own_text=section.own_text, lines=section.lines)


def band_keys_of(sets: list[np.ndarray], signing: "SigningConfig") -> np.ndarray:
    """The band keys (rows x bands) of these shingle sets, each signed as a document of its own."""
    signatures = sign_batch(ShingleBatch.of_sets(sets), signing.num_perm, signing.seed)
    return band_keys(signatures, signing.bands, signing.rows)
