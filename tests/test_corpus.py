"""The synthetic crawl: the same for the same seeds, and slices of one large crawl in one language."""

from __future__ import annotations

from streamdedup.core import corpus


def _words(documents) -> set[str]:
    return {word.lower().strip(".") for d in documents for word in d.text.split()}


def test_a_crawl_is_the_same_for_the_same_seed_and_invents_its_own_words_by_default():
    assert corpus.generate(120, seed=5) == corpus.generate(120, seed=5)
    assert corpus.generate(120, seed=5) == corpus.generate(120, seed=5, vocabulary_seed=None)
    one, other = _words(corpus.generate(200, seed=1)), _words(corpus.generate(200, seed=2))
    assert len(one & other) < 0.2 * min(len(one), len(other))


def test_slices_given_one_vocabulary_seed_write_one_language_with_their_own_articles():
    first = corpus.generate(200, seed=1, vocabulary_seed=0)
    second = corpus.generate(200, seed=2, vocabulary_seed=0)
    one, other = _words(first), _words(second)
    assert len(one & other) > 0.8 * min(len(one), len(other))
    assert not {d.text for d in first} & {d.text for d in second}
    assert first == corpus.generate(200, seed=1, vocabulary_seed=0)
