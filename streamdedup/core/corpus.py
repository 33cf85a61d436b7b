"""A synthetic crawl with known answers: original articles and their scraped copies.

Each original article is 14 sentences of 9 to 16 words (about 175 words)
drawn from an invented, Zipf-distributed vocabulary of 3,000 words. Half of the
originals get no copy; the others get one, two or three, each made by one or
two edits:

- ``light``: 3% of the words replaced;
- ``heavy``: 12% of the words replaced;
- ``drop``: the last two sentences removed;
- ``boilerplate``: a cookie banner before and a footer after;
- ``reformat``: upper case and doubled spaces.

Every document carries the number of the original it came from (``family``),
so a deduplicator can be scored: no document may join another family's
cluster. The order is shuffled so that copies are not neighbours. The same
``(articles, seed)`` gives the same corpus on every machine.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from typing import Iterator, TextIO

__all__ = ["CrawlDocument", "generate", "hot_keys", "write_jsonl", "EDITS"]

EDITS = ("light", "heavy", "drop", "boilerplate", "reformat")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l")
_BANNER = "We use cookies to improve your experience. Accept all. Manage preferences. Sign up for our newsletter today."
_FOOTER = "More from this section. Share this story. Contact us. Privacy notice. Terms and conditions apply. Copyright all rights reserved."


@dataclass(frozen=True)
class CrawlDocument:
    id: str
    text: str
    family: int  # number of the original article this document came from
    edits: tuple[str, ...]  # empty for an original


class _Writer:
    """Draws words and sentences from a Zipf-weighted invented vocabulary."""

    def __init__(self, rng: random.Random, vocabulary_size: int = 3000, vocabulary_rng: random.Random = None):
        """``vocabulary_rng`` invents the words (default ``rng``, which then draws from them)."""
        self.rng = rng
        self.vocabulary = _invented(vocabulary_rng or rng, vocabulary_size)
        self.cumulative = list(itertools.accumulate(1.0 / rank for rank in range(1, vocabulary_size + 1)))

    def words(self, count: int) -> list[str]:
        return self.rng.choices(self.vocabulary, cum_weights=self.cumulative, k=count)

    def article(self, sentences: int = 14) -> str:
        return " ".join(self.sentence() for _ in range(sentences))

    def sentence(self) -> str:
        return " ".join(self.words(self.rng.randint(9, 16))).capitalize() + "."

    def edit(self, text: str, kind: str) -> str:
        if kind in ("light", "heavy"):
            return self._replace(text, 0.03 if kind == "light" else 0.12)
        if kind == "drop":
            return ". ".join(text.split(". ")[:-2]) + "."
        if kind == "boilerplate":
            return f"{_BANNER} {text} {_FOOTER}"
        return "  ".join(text.upper().split(" "))

    def _replace(self, text: str, rate: float) -> str:
        words = text.split(" ")
        for i in range(len(words)):
            if self.rng.random() < rate:
                words[i] = self.words(1)[0]
        return " ".join(words)


def _invented(rng: random.Random, size: int) -> list[str]:
    """``size`` invented words, most frequent first."""
    words: set[str] = set()
    while len(words) < size:
        syllables = rng.choice((1, 2, 2, 3, 3, 4))
        words.add("".join(_syllable(rng) for _ in range(syllables)))
    return rng.sample(sorted(words), size)


def _syllable(rng: random.Random) -> str:
    return rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)


def generate(articles: int = 650, seed: int = 42, vocabulary_seed: int = None) -> list[CrawlDocument]:
    """The shuffled crawl: ``articles`` originals and their copies (about 1.86 documents each). Its words are
    invented from ``seed`` too, unless ``vocabulary_seed`` is given: crawls of several seeds then write the same
    language, as the slices of one large crawl do."""
    rng = random.Random(seed)
    writer = _Writer(rng, vocabulary_rng=None if vocabulary_seed is None else random.Random(vocabulary_seed))
    made: list[tuple[str, int, tuple[str, ...]]] = []
    for family in range(articles):
        original = writer.article()
        made.append((original, family, ()))
        for _ in range(rng.choices((0, 1, 2, 3), weights=(50, 25, 15, 10))[0]):
            edits = tuple(rng.sample(EDITS, rng.choice((1, 2))))
            text = original
            for kind in edits:
                text = writer.edit(text, kind)
            made.append((text, family, edits))
    rng.shuffle(made)
    return [CrawlDocument(f"doc-{i:07d}", text, family, edits) for i, (text, family, edits) in enumerate(made)]


def hot_keys(documents: int = 2000, seed: int = 7, templates: int = 6) -> list[CrawlDocument]:
    """A corpus whose band keys are hot: package descriptions or product pages filled into a few templates.

    Each template is 5 to 8 boilerplate sentences with a few slots; a
    document fills every slot of one template with words of its own (one to
    three each), so documents of a template share most of their shingles
    and many band keys, and their similarity spreads around the usual
    thresholds. A third of the documents are near copies of an earlier one
    (a slot word or a word of the text changed, or a sentence added). Every
    document's ``family`` is its template; an original's ``edits`` are
    empty, a copy's are ``("copy",)``. The order is shuffled; the same
    arguments give the same corpus everywhere.
    """
    rng = random.Random(seed)
    writer = _Writer(rng)
    shapes = [_template(writer) for _ in range(templates)]
    made: list[tuple[str, int, tuple[str, ...]]] = []
    while len(made) < documents:
        if made and rng.random() < 1 / 3:
            text, family, _ = rng.choice(made)
            made.append((_near_copy(writer, text), family, ("copy",)))
            continue
        family = rng.randrange(templates)
        filled = [" ".join(writer.words(rng.randint(1, 3))) for _ in range(shapes[family].count("{}"))]
        made.append((shapes[family].format(*filled), family, ()))
    rng.shuffle(made)
    return [CrawlDocument(f"hot-{i:07d}", text, family, edits) for i, (text, family, edits) in enumerate(made)]


def _template(writer: _Writer) -> str:
    """Boilerplate sentences with a slot (``{}``) every 6 to 14 words."""
    words = writer.words(writer.rng.randint(5, 8) * 12)
    out, gap = [], writer.rng.randint(6, 14)
    for i, word in enumerate(words):
        out.append(word)
        if i % 12 == 11:
            out[-1] += "."
        gap -= 1
        if gap == 0:
            out.append("{}")
            gap = writer.rng.randint(6, 14)
    return " ".join(out).capitalize()


def _near_copy(writer: _Writer, text: str) -> str:
    rng = writer.rng
    kind = rng.choice(("word", "words", "sentence"))
    if kind == "sentence":
        return f"{text} {writer.sentence()}"
    words = text.split(" ")
    for _ in range(1 if kind == "word" else 3):
        words[rng.randrange(len(words))] = writer.words(1)[0]
    return " ".join(words)


def jsonl_lines(documents: list[CrawlDocument]) -> Iterator[str]:
    """One JSON object per document: id, text, family, edits."""
    for doc in documents:
        yield json.dumps({"id": doc.id, "text": doc.text, "family": doc.family, "edits": list(doc.edits)}) + "\n"


def write_jsonl(documents: list[CrawlDocument], out: TextIO) -> int:
    """Write the documents as JSONL; returns how many were written."""
    return write_lines(jsonl_lines(documents), out)


def write_lines(lines: Iterator[str], out: TextIO) -> int:
    """Write the lines; returns how many were written."""
    count = 0
    for line in lines:
        out.write(line)
        count += 1
    return count
