"""Normalization, shingling and stable shingle hashing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from streamdedup.core import unicode_words
from streamdedup.core.shingle import (
    normalize,
    normalize_batch,
    normalize_exact,
    shingle_batch,
    shingle_hashes_exact,
)

MIXED = [
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé — déjà vu, FRANÇAIS!",
    "Cafe\u0301 nai\u0308ve (combining marks)",
    "東京タワーは日本の電波塔です。東京タワー",
    "emoji 🎉🎉 party 👩‍👩‍👧 family ❤️ hearts",
    "tabs\tand\u00a0no-break\u2003em\u3000ideographic\u200bzero-width\r\nnewlines",
    "ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ and ﬁ ligature",
    "Straße STRASSE ǅ titlecase ΣΊΣΥΦΟΣ",
    "हिन्दी भाषा में कुछ शब्द",
    "a",
    "one two",
    "under_score snake_case_name",
]


def test_normalize_folds_case_punctuation_and_spacing():
    assert normalize("Hello,   WORLD!!") == "hello world"
    assert normalize("  a--b__c  ") == "a b c"
    assert normalize("Straße") == "strasse"
    assert normalize("ＦＵＬＬ") == "full"
    assert normalize("\u00a0x\u3000y\u200bz") == "x y z"


@pytest.mark.parametrize("text", MIXED)
def test_ascii_fast_path_equals_exact_path(text):
    assert normalize(text) == normalize_exact(text)


def test_ascii_fast_path_on_every_ascii_character():
    text = "".join(chr(c) for c in range(128)) * 2
    assert normalize(text) == normalize_exact(text)


def test_stored_non_word_ranges_are_those_unicodedata_gives():
    """The stored table of the running Python's Unicode version is the computed one; every stored one is sane."""
    assert unicode_words.stored_non_word_ranges(unicodedata.unidata_version) == \
        unicode_words.computed_non_word_ranges(), "store this version again: see unicode_words"
    for version in unicode_words.STORED:
        ranges = unicode_words.stored_non_word_ranges(version)
        bounds = [b for r in ranges for b in r]
        assert bounds == sorted(bounds) and all(a < b - 1 for a, b in zip(bounds[1::2], bounds[2::2])), version
        assert ranges[0][0] == 0 and ranges[-1][1] == sys.maxunicode and len(ranges) > 700, version


def test_a_version_not_stored_is_worked_out(monkeypatch):
    monkeypatch.setattr(unicode_words, "STORED", {})
    assert unicode_words.stored_non_word_ranges(unicodedata.unidata_version) is None
    assert unicode_words.non_word_ranges() == unicode_words.computed_non_word_ranges()


def test_marks_stay_inside_words():
    assert normalize("हिन्दी") == "हिन्दी"
    assert normalize("Cafe\u0301") == "café"


@pytest.mark.parametrize("kind,k", [("word", 3), ("word", 1), ("word", 5), ("char", 5), ("char", 2)])
def test_vectorized_hashes_equal_one_by_one_hashes(kind, k):
    batch = shingle_batch(normalize_batch(MIXED), kind, k)
    for i, text in enumerate(MIXED):
        assert batch.of(i).tolist() == shingle_hashes_exact(text, kind, k), text


def test_short_text_gets_one_shingle():
    batch = shingle_batch(["one two", "a"], "word", 3)
    assert [len(batch.of(0)), len(batch.of(1))] == [1, 1]
    assert shingle_hashes_exact("one two", "word", 3) == batch.of(0).tolist()


def test_shingles_are_sorted_and_unique():
    batch = shingle_batch(normalize_batch(["a b a b a b a b", "x y z x y z"]), "word", 2)
    for i in range(2):
        values = batch.of(i)
        assert np.all(values[1:] > values[:-1])
    assert len(batch.of(0)) == 2  # "a b", "b a"


def test_same_text_gives_same_shingles_in_any_batch():
    alone = shingle_batch(normalize_batch([MIXED[1]])).of(0)
    among = shingle_batch(normalize_batch(MIXED)).of(1)
    assert alone.tolist() == among.tolist()


@pytest.mark.system
def test_shingle_hashes_do_not_depend_on_the_hash_seed():
    code = (
        "import json; from streamdedup.core.shingle import shingle_batch, normalize_batch; "
        f"texts = {MIXED!r}; b = shingle_batch(normalize_batch(texts)); print(json.dumps(b.hashes.tolist()))"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONHASHSEED=seed))
        outputs.add(run.stdout)
    assert len(outputs) == 1
    assert len(json.loads(outputs.pop())) > 30


def test_known_hash_values_are_pinned():
    """Stored indexes depend on these exact values: changing them needs a new signing.HASH_VERSION."""
    assert shingle_hashes_exact("the quick brown", "word", 3) == [14677284539370320025]
    assert shingle_hashes_exact("Ünïcödé 東京", "char", 3)[:2] == [3487190531192255482, 4374133799821785792]
    assert shingle_batch(["the quick brown"]).hashes.tolist() == [14677284539370320025]


def test_batch_normalization_equals_one_by_one_on_mixed_batches():
    from streamdedup.core.shingle import content_hash, normalize_texts

    texts = MIXED + ["  leading and trailing  ", "!!!", "", "nul\x00inside", "tab\tsep\nlines", "x" * 3, "  a  b  "]
    for batch in (texts, [t for t in texts if t.isascii()], list(reversed(texts))):
        normalized = normalize_texts(batch)
        for i, text in enumerate(batch):
            expected = normalize_exact(text)
            start, length = normalized.starts[i], normalized.lengths[i]
            got = "".join(map(chr, normalized.points[start:start + length].tolist()))
            assert got == expected, repr(text)
            assert normalized.contents[i] == content_hash(expected)
        assert shingle_batch(normalized).hashes.tolist() == shingle_batch(normalize_batch(batch)).hashes.tolist()


def test_ascii_batch_path_equals_exact_on_random_ascii():
    """Runs of spaces and punctuation at every place: starts, ends, empty texts, NULs."""
    import random

    from streamdedup.core.shingle import normalize_texts

    rng = random.Random(7)
    alphabet = "aZ9 .,\t\n\x00-!  "
    pool = ["", " ", "  a  ", "a", "!!", " .a. b ", "\x00a\x00"]
    pool += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(12))) for _ in range(2000)]
    for _ in range(200):
        batch = rng.sample(pool, rng.randrange(1, 20))
        normalized = normalize_texts(batch)
        for i, text in enumerate(batch):
            start, length = normalized.starts[i], normalized.lengths[i]
            assert bytes(normalized.points[start:start + length].astype("u1")).decode() == normalize_exact(text)


def test_both_per_document_sorts_agree(monkeypatch):
    """The padded row-wise sort (documents of similar length) and the fallback (one very long document)."""
    from streamdedup.core import corpus, shingle

    texts = [d.text for d in corpus.generate(40, seed=5)] + ["word " * 3000 + "end", "a b", "a b c a b c a b c"]
    monkeypatch.setattr(shingle, "PADDED_SORT_SLACK", 10**9)
    padded = shingle_batch(normalize_batch(texts))
    monkeypatch.setattr(shingle, "PADDED_SORT_SLACK", 0)
    fallback = shingle_batch(normalize_batch(texts))
    assert padded.offsets.tolist() == fallback.offsets.tolist()
    assert padded.hashes.tolist() == fallback.hashes.tolist()
    for i, text in enumerate(texts):
        assert padded.of(i).tolist() == shingle_hashes_exact(text)


def test_narrowed_shingles_are_each_documents_unique_top_32_bits_and_sign_the_same():
    from streamdedup.core.shingle import ShingleBatch, narrow, normalize_batch, shingle_batch
    from streamdedup.core.signing import sign_batch

    texts = ["one two three four five", "a", "the cat sat on the mat " * 30, "Über straße naïve café déjà vu"]
    batch = shingle_batch(normalize_batch(texts))
    same_top = np.array([5 << 32 | 1, 5 << 32 | 9, 6 << 32, 5 << 32 | 2, 7 << 32], dtype=np.uint64)  # two documents
    for whole in (batch, ShingleBatch(same_top, np.array([0, 3, 5], dtype=np.int64))):
        narrowed = narrow(whole)
        assert narrowed.hashes.dtype == np.uint32
        for i in range(len(whole)):
            assert narrowed.of(i).tolist() == sorted({int(h) >> 32 for h in whole.of(i).tolist()})
    assert narrow(ShingleBatch(same_top, np.array([0, 3, 5], dtype=np.int64))).hashes.tolist() == [5, 6, 5, 7]
    assert (sign_batch(narrow(batch), 128, 1) == sign_batch(batch, 128, 1)).all()
