"""Normalization and shingling: text -> stable 64-bit shingle hashes.

Normalization is Unicode NFKC, then casefold, then every character that is
not a letter, a mark or a number becomes a space, then runs of spaces
collapse to one and the ends are stripped. Pure-ASCII text takes a fast path
(one ``bytes.translate``) that gives exactly the same result.

A shingle is either ``k`` consecutive words (``kind="word"``) or ``n``
consecutive characters (``kind="char"``) of the normalized text; a text
shorter than one shingle gives one shingle, the whole text.

The hash of a shingle depends only on its characters, so it is identical in
every process, with every ``PYTHONHASHSEED`` and on every machine:

    poly  = sum(codepoint[j] * P**j for j in range(L))   (mod 2**64)
    hash  = fmix64(poly ^ (L * GOLDEN))

``poly`` of every shingle of a whole batch comes from one prefix sum over the
batch's code points, so no Python object is made per shingle. The compiled
kernel (``_kernel.c``, built by ``pip install`` when a C compiler is there)
computes the same hashes one document at a time, about five times faster;
without it the numpy path below runs (both are tested against the one-by-one
reference ``shingle_hashes_exact``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from .unicode_words import non_word_ranges

try:
    from . import _kernel
except ImportError:  # built without a C compiler: the numpy path gives the same hashes
    _kernel = None

__all__ = [
    "ShingleBatch",
    "narrow",
    "NormalizedBatch",
    "normalize",
    "normalize_batch",
    "normalize_texts",
    "shingle_batch",
    "shingle_hashes_exact",
    "content_hash",
]

POLY_BASE = 0x9E3779B97F4A7C55  # odd, so invertible modulo 2**64
GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, mixes the length in
MASK64 = (1 << 64) - 1
_U64 = np.uint64

_ASCII_TABLE = bytes(
    c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122) else 32
    for c in range(256)
)


@lru_cache(maxsize=1)
def _non_word_pattern() -> re.Pattern[str]:
    """Every code point that is not a letter, a mark or a number (``unicode_words``)."""
    ranges = "".join(f"{re.escape(chr(first))}-{re.escape(chr(last))}" for first, last in non_word_ranges())
    return re.compile("[" + ranges + "]+")


def normalize(text: str) -> str:
    """The normalized form of ``text`` (see the module docstring)."""
    if text.isascii():
        return " ".join(text.encode("ascii").translate(_ASCII_TABLE).decode("ascii").split())
    return normalize_exact(text)


def normalize_exact(text: str) -> str:
    """The normalization every text can take; ``normalize`` equals it on ASCII."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_non_word_pattern().sub(" ", folded).split())


def normalize_batch(texts: list[str]) -> list[str]:
    """``normalize`` applied to each text."""
    return [normalize(t) for t in texts]


@dataclass
class NormalizedBatch:
    """The normalized texts of a batch as one array of code points, documents separated by 0."""

    points: np.ndarray  # uint32 code points
    starts: np.ndarray  # int64, where each document starts in ``points``
    lengths: np.ndarray  # int64, code points of each normalized document (0: nothing left)
    contents: list[bytes]  # content hash of each normalized document

    @classmethod
    def of_normalized(cls, normalized: list[str]) -> "NormalizedBatch":
        """From texts that are normalized already."""
        arrays = [np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for t in normalized]
        return cls._joined(arrays, [content_hash(t) for t in normalized])

    @classmethod
    def _joined(cls, arrays: list[np.ndarray], contents: list[bytes]) -> "NormalizedBatch":
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        starts = np.zeros(len(arrays), dtype=np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        pieces = [piece for a in arrays for piece in (a, _SEPARATOR)]
        points = np.concatenate(pieces[:-1]) if pieces else np.zeros(0, dtype=np.uint32)
        return cls(points.astype(np.uint32, copy=False), starts, lengths, contents)


_SEPARATOR = np.zeros(1, dtype=np.uint32)


def normalize_texts(texts: list[str]) -> NormalizedBatch:
    """Normalize a batch: pure-ASCII texts on the fast path, the others on the exact one."""
    fast = [t.isascii() for t in texts]
    if all(fast):
        return _normalize_ascii(texts)
    ascii_batch = _normalize_ascii([t for t, f in zip(texts, fast) if f])
    arrays, contents, next_fast = [], [], 0
    for text, is_fast in zip(texts, fast):
        if is_fast:
            begin = ascii_batch.starts[next_fast]
            arrays.append(ascii_batch.points[begin : begin + ascii_batch.lengths[next_fast]])
            contents.append(ascii_batch.contents[next_fast])
            next_fast += 1
        else:
            norm = normalize_exact(text)
            arrays.append(np.frombuffer(norm.encode("utf-32-le"), dtype=np.uint32))
            contents.append(content_hash(norm))
    return NormalizedBatch._joined(arrays, contents)


def _normalize_ascii(texts: list[str]) -> NormalizedBatch:
    """Lowercase, non-alphanumerics to spaces, runs of spaces collapsed and trimmed, for the whole batch.

    Equal to ``normalize_exact`` on ASCII text (tested). One ``translate``
    over the joined batch, then two vectorized compactions: keep every
    letter or digit and the first space after one, then drop a space that
    ends a document. About twice as fast as ``split``/``join`` per text,
    which makes a bytes object per word.
    """
    count = len(texts)
    if not count:
        return NormalizedBatch._joined([], [])
    if _kernel is not None:
        return _kernel_normalize_ascii(texts)
    joined = np.frombuffer("\x00".join(texts).encode("ascii").translate(_ASCII_TABLE), dtype=np.uint8).copy()
    text_lengths = np.fromiter(map(len, texts), dtype=np.int64, count=count)
    joined[np.cumsum(text_lengths[:-1] + 1) - 1] = 0  # document separators (a NUL inside a text is a space)
    keep = joined != 32  # letters, digits, separators; and below, a space right after a letter or digit
    keep[1:] |= joined[:-1] > 32
    points = joined[keep]
    last_space = np.zeros(len(points), dtype=bool)
    last_space[:-1] = (points[:-1] == 32) & (points[1:] == 0)
    last_space[-1:] = points[-1:] == 32
    points = points[~last_space]
    parts = points.tobytes().split(b"\x00")
    contents = [hashlib.blake2b(p, digest_size=16).digest() for p in parts]
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=count)
    starts = np.zeros(count, dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    return NormalizedBatch(points.astype(np.uint32), starts, lengths, contents)


def _kernel_normalize_ascii(texts: list[str]) -> NormalizedBatch:
    """``_normalize_ascii`` by the compiled kernel: one pass over the batch's bytes, no temporary arrays."""
    count = len(texts)
    text = "".join(texts).encode("ascii")
    out = np.empty(len(text) + count, dtype=np.uint8)
    lengths = np.empty(count, dtype=np.int64)
    written = _kernel.ascii_normalize(text, np.fromiter(map(len, texts), dtype=np.int64, count=count), out, lengths)
    starts = np.zeros(count, dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    view = memoryview(out)
    contents = [hashlib.blake2b(view[s : s + n], digest_size=16).digest()
                for s, n in zip(starts.tolist(), lengths.tolist())]
    return NormalizedBatch(out[:written].astype(np.uint32), starts, lengths, contents)


def content_hash(normalized: str) -> bytes:
    """16-byte digest of a normalized text, the key of the exact-duplicate fast path."""
    return hashlib.blake2b(normalized.encode("utf-8"), digest_size=16).digest()


_NO_HASHES = np.zeros(0, dtype=np.uint64)


@dataclass(frozen=True)
class ShingleBatch:
    """The unique shingle hashes of a batch of documents, sorted within each document.

    ``hashes[offsets[i]:offsets[i + 1]]`` belong to document ``i``.
    """

    hashes: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len(documents) + 1

    @classmethod
    def of_sets(cls, sets: list[np.ndarray], empty: np.ndarray = _NO_HASHES) -> "ShingleBatch":
        """The batch of these sorted shingle sets, a document each, in order (``empty``: the hashes of none)."""
        offsets = np.zeros(len(sets) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in sets], out=offsets[1:])
        return cls(np.concatenate(sets) if sets else empty, offsets)

    def of(self, i: int) -> np.ndarray:
        """The sorted unique shingle hashes of document ``i``."""
        bounds = self._bounds
        return self.hashes[bounds[i] : bounds[i + 1]]

    def each(self) -> list[np.ndarray]:
        """``of`` of every document, in order."""
        hashes, bounds = self.hashes, self._bounds
        return [hashes[start:end] for start, end in zip(bounds, bounds[1:])]

    @cached_property
    def _bounds(self) -> list[int]:
        return self.offsets.tolist()  # Python ints: slicing with numpy scalars costs several times more

    def __len__(self) -> int:
        return len(self.offsets) - 1


def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, in place on a uint64 array."""
    x ^= x >> _U64(33)
    x *= _U64(0xFF51AFD7ED558CCD)
    x ^= x >> _U64(33)
    x *= _U64(0xC4CEB93FE53B5A61)
    x ^= x >> _U64(33)
    return x


_powers = np.ones(1, dtype=np.uint64)
_inverse_powers = np.ones(1, dtype=np.uint64)


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**j and P**-j modulo 2**64 for j < n, grown and kept between batches."""
    global _powers, _inverse_powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        _powers = _geometric(POLY_BASE, size)
        _inverse_powers = _geometric(pow(POLY_BASE, -1, 1 << 64), size)
    return _powers[:n], _inverse_powers[:n]


def _geometric(base: int, n: int) -> np.ndarray:
    """base**j modulo 2**64 for j < n, by doubling: each step is one vectorized multiply.

    (``np.cumprod`` is a sequential loop, about 20 times slower on millions of entries.)
    """
    out = np.empty(max(n, 1), dtype=np.uint64)
    out[0] = 1
    filled = 1
    with np.errstate(over="ignore"):
        while filled < n:
            take = min(filled, n - filled)
            np.multiply(out[:take], _U64(pow(base, filled, 1 << 64)), out=out[filled : filled + take])
            filled += take
    return out[:n]


SPAN_CHUNK_POINTS = 1 << 18  # code points hashed per step: small tables and prefix sums that stay in cache


def _span_hashes(points: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Stable hash of each span ``points[begin[i]:end[i]]`` (spans in text order: ``end`` never decreases).

    The batch is hashed a few hundred thousand code points at a time. A span's
    hash does not depend on where it sits, so the result is the same, but the
    power tables stay the size of a step instead of the batch: a first batch
    would otherwise spend more time faulting in fresh pages than hashing.
    """
    hashes = np.empty(len(begin), dtype=np.uint64)
    first = 0
    while first < len(begin):
        last = max(int(np.searchsorted(begin, begin[first] + SPAN_CHUNK_POINTS, "left")), first + 1)
        low, high = int(begin[first]), int(end[last - 1])
        hashes[first:last] = _step_hashes(points[low:high], begin[first:last] - low, end[first:last] - low)
        first = last
    return hashes


def _step_hashes(points: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    powers, inverse_powers = _power_tables(len(points) + 1)
    with np.errstate(over="ignore"):
        prefix = np.empty(len(points) + 1, dtype=np.uint64)
        prefix[0] = 0
        np.multiply(points, powers[: len(points)], out=prefix[1:], dtype=np.uint64)  # in place: no temporaries
        np.cumsum(prefix[1:], out=prefix[1:])
        poly = prefix[end]
        poly -= prefix[begin]
        poly *= inverse_powers[begin]
        poly ^= (end - begin).astype(np.uint64) * _U64(GOLDEN)
        return fmix64(poly)


def _word_spans(points: np.ndarray, starts: np.ndarray, lengths: np.ndarray, k: int):
    """Begin and end of every word k-gram, and the document each one belongs to."""
    is_space = (points == 32) | (points == 0)
    word_begin = np.flatnonzero(~is_space & np.concatenate(([True], is_space[:-1])))
    word_end = np.flatnonzero(~is_space & np.concatenate((is_space[1:], [True]))) + 1
    first_word = np.searchsorted(word_begin, starts)
    words = np.diff(np.append(first_word, len(word_begin)))
    words[lengths == 0] = 0
    return _gram_spans(word_begin, word_end, first_word, words, k)


def _char_spans(starts: np.ndarray, lengths: np.ndarray, n: int):
    """Begin and end of every character n-gram, and the document each one belongs to."""
    positions = np.arange(int(starts[-1] + lengths[-1]) if len(starts) else 0, dtype=np.int64)
    return _gram_spans(positions, positions + 1, starts, lengths, n)


def _gram_spans(unit_begin, unit_end, first_unit, units, k: int):
    """Spans of ``k`` consecutive units per document; one span when a document has fewer."""
    grams = np.maximum(units - k + 1, 1)
    grams[units == 0] = 0
    doc = np.repeat(np.arange(len(units)), grams)
    gram_offsets = np.zeros(len(units) + 1, dtype=np.int64)
    np.cumsum(grams, out=gram_offsets[1:])
    index_in_doc = np.arange(len(doc)) - gram_offsets[doc]
    first = first_unit[doc] + index_in_doc
    last = first_unit[doc] + np.minimum(index_in_doc + k, units[doc]) - 1
    return unit_begin[first], unit_end[last], gram_offsets


def shingle_batch(batch, kind: str = "word", k: int = 3) -> ShingleBatch:
    """Sorted unique shingle hashes of every document of a ``NormalizedBatch`` (or normalized texts).

    An empty document gets no shingles; callers reject empty documents first.
    """
    if not isinstance(batch, NormalizedBatch):
        batch = NormalizedBatch.of_normalized(list(batch))
    if len(batch.lengths) == 0:
        return ShingleBatch(np.zeros(0, dtype=np.uint64), np.zeros(1, dtype=np.int64))
    if _kernel is not None:
        return _kernel_shingles(batch, kind, k)
    if kind == "word":
        begin, end, offsets = _word_spans(batch.points, batch.starts, batch.lengths, k)
    else:
        begin, end, offsets = _char_spans(batch.starts, batch.lengths, k)
    hashes = _span_hashes(batch.points, begin, end)
    return _unique_per_document(hashes, offsets)


def _kernel_shingles(batch: NormalizedBatch, kind: str, k: int) -> ShingleBatch:
    """``shingle_batch`` by the compiled kernel: one pass per document, sorted and deduplicated in place."""
    lengths = np.ascontiguousarray(batch.lengths, dtype=np.int64)
    hashes = np.empty(int(lengths.sum()) + len(lengths), dtype=np.uint64)  # at most one shingle a code point, or one
    offsets = np.empty(len(lengths) + 1, dtype=np.int64)
    written = _kernel.shingles(np.ascontiguousarray(batch.points, dtype=np.uint32),
                               np.ascontiguousarray(batch.starts, dtype=np.int64), lengths, kind == "word", k,
                               hashes, offsets)
    return ShingleBatch(hashes[:written].copy(), offsets)


def _unique_per_document(hashes: np.ndarray, offsets: np.ndarray) -> ShingleBatch:
    """Sort each document's hashes and drop repeats, for the whole batch at once."""
    lengths = np.diff(offsets)
    n_docs = len(lengths)
    longest = int(lengths.max()) if n_docs else 0
    if n_docs * longest <= PADDED_SORT_SLACK * len(hashes) + 4096:
        hashes, doc = _sorted_in_rows(hashes, offsets, lengths, longest)
    else:
        hashes, doc = _sorted_by_document(hashes, lengths)
    keep = np.ones(len(hashes), dtype=bool)
    keep[1:] = (hashes[1:] != hashes[:-1]) | (doc[1:] != doc[:-1])
    counts = np.bincount(doc[keep], minlength=n_docs)
    unique_offsets = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(counts, out=unique_offsets[1:])
    return ShingleBatch(hashes[keep], unique_offsets)


PADDED_SORT_SLACK = 3  # the row-wise sort may pad the batch to this many times its shingles


def _sorted_in_rows(hashes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, longest: int):
    """Each document's hashes sorted, by one row-wise sort of a padded (documents, longest) grid.

    About four times faster than two argsorts, when documents are of similar
    length; padding is the largest hash, so it sorts last and is cut off.
    """
    n_docs = len(lengths)
    doc = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    grid = np.full((n_docs, longest), np.iinfo(np.uint64).max, dtype=np.uint64)
    grid[doc, np.arange(len(hashes)) - offsets[doc]] = hashes
    grid.sort(axis=1)
    return grid[np.arange(longest) < lengths[:, None]], doc


def _sorted_by_document(hashes: np.ndarray, lengths: np.ndarray):
    """Each document's hashes sorted: one sort by hash, then a stable radix sort by document.

    (16-bit document numbers when the batch allows; three times faster than ``lexsort``.)
    """
    n_docs = len(lengths)
    doc_type = np.int16 if n_docs < 1 << 15 else np.int64
    doc = np.repeat(np.arange(n_docs, dtype=doc_type), lengths)
    order = np.argsort(hashes)
    order = order[np.argsort(doc[order], kind="stable")]
    return hashes[order], doc[order]


def shingle_hashes_exact(text: str, kind: str = "word", k: int = 3) -> list[int]:
    """Sorted unique shingle hashes of one text, in plain Python, one shingle at a time.

    The reference the vectorized path is tested against; too slow for the hot path.
    """
    norm = normalize_exact(text)
    if not norm:
        return []
    units = norm.split(" ") if kind == "word" else list(norm)
    sep = " " if kind == "word" else ""
    grams = [sep.join(units[i : i + k]) for i in range(max(len(units) - k + 1, 1))]
    return sorted({_shingle_hash_exact(g) for g in grams})


def _shingle_hash_exact(shingle: str) -> int:
    poly = 0
    power = 1
    for ch in shingle:
        poly = (poly + ord(ch) * power) & MASK64
        power = (power * POLY_BASE) & MASK64
    x = poly ^ ((len(shingle) * GOLDEN) & MASK64)
    for shift, mult in ((33, 0xFF51AFD7ED558CCD), (33, 0xC4CEB93FE53B5A61)):
        x ^= x >> shift
        x = (x * mult) & MASK64
    return x ^ (x >> 33)


def narrow(batch: ShingleBatch) -> ShingleBatch:
    """Each document's shingles as the top 32 bits of their hashes, sorted and unique (uint32).

    What the index stores, verifies and learns templates from. MinHash
    already signs these 32 bits, so a signature of the narrowed set equals
    that of the whole hashes. Two different shingles of two documents share
    their top 32 bits about once in 2**32 / (n * m) comparisons (for
    documents of a few hundred shingles, once in ~100,000 pairs, moving
    that pair's Jaccard by one shingle in several hundred).
    """
    high = (batch.hashes >> np.uint64(32)).astype(np.uint32)
    offsets = batch.offsets
    keep = np.ones(len(high), dtype=bool)
    if len(high) > 1:
        keep[1:] = high[1:] != high[:-1]
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]
    keep[starts] = True  # every document's first hash, whatever the one before it
    kept_before = np.zeros(len(high) + 1, dtype=np.int64)
    np.cumsum(keep, out=kept_before[1:])
    return ShingleBatch(high[keep], kept_before[offsets])
