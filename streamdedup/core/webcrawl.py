"""A synthetic web crawl with known answers: sites with templates, republished articles, excerpts.

Each site has a template around every page: a header with the site's name,
navigation and tagline, a cookie banner (one of three that content systems
share across sites), a sidebar of headlines, a newsletter box and a footer.
Pages, interleaved across sites as a crawler meets them:

- ``article``: a new article of the site (8 to 30 sentences);
- ``short``: a short page, 25 to 60 words of its own inside the whole template;
- ``republished``: an earlier article of another site, in this site's
  template, as it was or lightly edited (3% of the words);
- ``excerpt``: 100 to 250 words quoted from an earlier article of at least
  twice that length, with a line of the site's own before it.

Bodies are invented words (``prose="invented"``) or real prose: the
docstrings of Python's own standard library and its language reference as
``help()`` shows it (``prose="stdlib"``; the same on every machine with the
same Python version). Each record carries its
truth: site, kind, source page and the page's own body, so a deduplicator
can be scored on what the page itself says (``bench/crawl_accuracy.py``).
The same arguments give the same crawl.

With ``navigation="sections"`` the sites are built as documentation and
news sites are (the default, ``"constant"``, keeps one template a site):
each site's pages fall into sections of 5 to 40 pages, and around a page's
body, besides the site-wide blocks, come its section's navigation: a
breadcrumb trail, a box listing every page title of the section, previous
and next links, a footer of the section and an "on this page" list taken
from the body's own sentences. The crawler meets two or three sections of
a site at a time, interleaved. Two more kinds of pages appear:

- ``repeated``: an earlier article of the *same* site on another page of it
  (a print version, a page moved to another section);
- pages carrying a ``featured`` box on some of a site's pages: the summary
  (first two sentences) of one of the site's earlier articles, the same
  summary on a run of pages.

So a body can appear on several pages of one site, and a site's navigation
is not on most of its pages; the truth (``body``) never includes the
navigation or the featured box.
"""

from __future__ import annotations

import json
import os
import random
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Optional, TextIO

from .corpus import _Writer, write_lines

__all__ = ["WebPage", "generate_web", "write_web_jsonl", "stdlib_paragraphs", "KINDS", "NAVIGATIONS"]

NAVIGATIONS = ("constant", "sections")

KINDS = ("article", "short", "republished", "excerpt", "repeated")
_WEIGHTS = (55, 15, 18, 12, 0)
_SECTIONED_WEIGHTS = (52, 13, 18, 12, 5)
_BANNERS = (
    "We use cookies and similar technologies to personalise content and ads, to provide social media features "
    "and to analyse our traffic. Accept all cookies. Reject all. Manage your privacy settings.",
    "This website stores cookies on your computer. These cookies are used to collect information about how you "
    "interact with our website. Accept. Decline. Read our cookie policy.",
    "By continuing to browse this site you agree to our use of cookies. Find out more about how we use cookies "
    "and how to change your settings. Got it.",
)


@dataclass(frozen=True)
class WebPage:
    id: str
    url: str
    text: str  # the whole page as a text extractor gives it: template blocks and body, one per line
    site: str
    kind: str
    source: Optional[str]  # the page a republished page or an excerpt comes from
    body: str  # the page's own content, without the template


class _Site:
    def __init__(self, number: int, writer: _Writer, rng: random.Random):
        words = writer.words(2)
        self.host = f"{words[0]}{words[1]}-{number}.example"
        self.name = " ".join(w.capitalize() for w in words)
        sections = " ".join(w.capitalize() for w in writer.words(rng.randint(6, 10)))
        self.header = f"{self.name}. Home {sections}. Search. Subscribe. Log in.\n{writer.sentence()}"
        self.banner = _BANNERS[number % len(_BANNERS)]
        self.sidebar = "Most read. " + " ".join(writer.sentence() for _ in range(rng.randint(4, 7)))
        self.newsletter = f"Get the {self.name} newsletter. " + writer.sentence() + " Sign up now."
        self.footer = (f"About {self.name}. Contact us. Advertise with us. Careers. Terms of use. Privacy policy. "
                       + writer.sentence() + f" Copyright {self.name}. All rights reserved.")
        self.pages = 0

    def page(self, body: str) -> tuple[str, str]:
        self.pages += 1
        text = "\n".join((self.banner, self.header, body, self.sidebar, self.newsletter, self.footer))
        return f"https://www.{self.host}/{self.pages:05d}.html", text


class _Section:
    """A section of a site: its title, and the titles of its pages (all known up front, as a static site's)."""

    def __init__(self, writer: _Writer, rng: random.Random):
        self.title = " ".join(w.capitalize() for w in writer.words(rng.randint(2, 4)))
        self.titles = [" ".join(writer.words(rng.randint(3, 7))).capitalize() for _ in range(rng.randint(5, 40))]
        self.footer = f"More in {self.title}. " + writer.sentence() + " Edit this section. Report a problem."
        self.used = 0


class _SectionedSite(_Site):
    """A site whose navigation changes by section; a featured box on runs of its pages."""

    def __init__(self, number: int, writer: _Writer, rng: random.Random):
        super().__init__(number, writer, rng)
        self.writer, self.rng = writer, rng
        self.open: list[_Section] = []
        self.featured: Optional[str] = None  # the summary in the featured box, while a run lasts
        self.featured_left = 0

    def _section(self) -> tuple[_Section, int]:
        """The section the crawler meets next on this site (two or three open at a time), and the page's place."""
        while len(self.open) < 3 and (not self.open or self.rng.random() < 0.5):
            self.open.append(_Section(self.writer, self.rng))
        section = self.rng.choice(self.open)
        place = section.used
        section.used += 1
        if section.used == len(section.titles):
            self.open.remove(section)
        return section, place

    def feature(self, summary: str) -> None:
        """Show ``summary`` in the featured box of the site's next 3 to 12 pages."""
        self.featured, self.featured_left = summary, self.rng.randint(3, 12)

    def page(self, body: str) -> tuple[str, str]:
        section, place = self._section()
        titles = section.titles
        title = titles[place]
        sentences = [s for s in re.split(r"(?<=\.) ", body) if s]
        on_page = ". ".join(" ".join(s.split()[:4]) for s in sentences[:: max(1, len(sentences) // 5)][:6])
        neighbours = ((f"Previous: {titles[place - 1]}. " if place else "")
                      + (f"Next: {titles[place + 1]}." if place + 1 < len(titles) else ""))
        blocks = [self.banner, self.header, f"Home > {section.title} > {title}",
                  f"In {section.title}: " + ". ".join(titles) + ".", title, f"On this page: {on_page}.", body,
                  neighbours, section.footer]
        if self.featured_left:
            blocks.insert(6, f"Featured. {self.featured} Read more.")
            self.featured_left -= 1
        blocks += [self.sidebar, self.newsletter, self.footer]
        self.pages += 1
        slug = section.title.lower().replace(" ", "-")
        return f"https://www.{self.host}/{slug}/{self.pages:05d}.html", "\n".join(blocks)


class _Bodies:
    """Article bodies: invented sentences, or paragraphs of real prose."""

    def __init__(self, writer: _Writer, rng: random.Random, prose: str):
        self.writer, self.rng = writer, rng
        self.paragraphs = stdlib_paragraphs() if prose == "stdlib" else None
        self.next = 0

    def article(self) -> str:
        if self.paragraphs is None:
            return self.writer.article(self.rng.randint(8, 30))
        wanted, words, parts = self.rng.randint(120, 500), 0, []
        while words < wanted:
            if self.next == len(self.paragraphs):  # each round through the prose in another order
                self.paragraphs, self.next = tuple(self.rng.sample(self.paragraphs, len(self.paragraphs))), 0
            paragraph = self.paragraphs[self.next]
            self.next += 1
            parts.append(paragraph)
            words += len(paragraph.split())
        return " ".join(parts)

    def short(self) -> str:
        words = self.writer.words(self.rng.randint(25, 60)) if self.paragraphs is None else \
            self.paragraphs[self.rng.randrange(len(self.paragraphs))].split()[:60]
        return " ".join(words)


def generate_web(pages: int = 3000, sites: int = 40, seed: int = 42, prose: str = "invented",
                 navigation: str = "constant") -> list[WebPage]:
    """A crawl of ``pages`` pages over ``sites`` sites of varying size (``navigation``: "constant" or "sections")."""
    if navigation not in NAVIGATIONS:
        raise ValueError(f"navigation is one of {NAVIGATIONS}, not {navigation!r}")
    rng = random.Random(seed)
    writer = _Writer(rng)
    bodies = _Bodies(writer, rng, prose)
    sectioned = navigation == "sections"
    made = [(_SectionedSite if sectioned else _Site)(i, writer, rng) for i in range(sites)]
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(sites)]
    articles: list[tuple[str, str, str]] = []  # (page id, site host, body)
    result: list[WebPage] = []
    for number in range(pages):
        site = rng.choices(made, weights=weights)[0]
        kind = rng.choices(KINDS, weights=_SECTIONED_WEIGHTS if sectioned else _WEIGHTS)[0]
        others = [a for a in articles[-400:] if a[1] != site.host]
        own = [a for a in articles[-400:] if a[1] == site.host]
        source = None
        if kind == "repeated" and own:
            source, _, body = rng.choice(own)
        elif kind == "republished" and others:
            source, _, original = rng.choice(others)
            body = writer.edit(original, "light") if rng.random() < 0.3 else original
        elif kind == "excerpt" and (long := [a for a in others if len(a[2].split()) >= 240]):
            source, _, original = rng.choice(long)
            body = writer.sentence() + " " + _passage(original, rng)
        elif kind == "short":
            body = bodies.short()
        else:
            kind, body = "article", bodies.article()
        page_id = f"page-{number:06d}"
        if kind == "article":
            articles.append((page_id, site.host, body))
        if sectioned and not site.featured_left and own and rng.random() < 0.05:
            site.feature(" ".join(re.split(r"(?<=\.) ", rng.choice(own)[2])[:2]))
        url, text = site.page(body)
        result.append(WebPage(page_id, url, text, site.host, kind, source, body))
    return result


def _passage(article: str, rng: random.Random) -> str:
    """100 to 250 consecutive words of ``article``, at most half of it."""
    words = article.split()
    length = min(rng.randint(100, 250), len(words) // 2)
    start = rng.randrange(0, len(words) - length + 1)
    return " ".join(words[start : start + length])


def web_jsonl_lines(pages: list[WebPage]) -> Iterator[str]:
    """One JSON object per page: id, url, text, and the truth."""
    for page in pages:
        truth = {"site": page.site, "kind": page.kind, "source": page.source, "body": page.body}
        yield json.dumps({"id": page.id, "url": page.url, "text": page.text, "truth": truth}) + "\n"


def write_web_jsonl(pages: list[WebPage], out: TextIO) -> int:
    """Write the pages as JSONL; returns how many were written."""
    return write_lines(web_jsonl_lines(pages), out)


@lru_cache(maxsize=1)
def stdlib_paragraphs(min_words: int = 25) -> tuple[str, ...]:
    """Paragraphs of prose from the docstrings of Python's standard library, in a fixed order.

    The same on every machine with the same Python version (the crawl's files name it).
    """
    root = sysconfig.get_paths()["stdlib"]
    found: list[str] = []
    seen: set[str] = set()
    for folder, dirs, files in os.walk(root):  # top-down, pruned and sorted in place
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                found.extend(_docstring_paragraphs(os.path.join(folder, name), min_words, seen))
    found.extend(_reference_paragraphs(min_words, seen))
    return tuple(found)


def _reference_paragraphs(min_words: int, seen: set[str]) -> Iterator[str]:
    """Paragraphs of the language reference that ``help()`` shows (``pydoc_data.topics``)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return
    for name in sorted(topics):
        yield from _paragraphs(topics[name], min_words, seen)


_TRIPLE_QUOTED = re.compile(r'"""(.*?)"""', re.S)


def _docstring_paragraphs(path: str, min_words: int, seen: set[str]) -> Iterator[str]:
    """Paragraphs of the triple-quoted strings of one module (docstrings, mostly)."""
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
    except (UnicodeDecodeError, OSError):
        return
    for doc in _TRIPLE_QUOTED.findall(source):
        yield from _paragraphs(doc, min_words, seen)


def _paragraphs(doc: str, min_words: int, seen: set[str]) -> Iterator[str]:
    """The paragraphs of ``doc`` with at least ``min_words`` words, not seen before and not examples."""
    for paragraph in doc.split("\n\n"):
        text = " ".join(paragraph.split())
        if min_words <= len(text.split()) <= 1000 and text not in seen and ">>>" not in text:
            seen.add(text)
            yield text


def as_html(page: WebPage) -> str:
    """The page as a site would serve it: its template in header, nav, aside and footer, its body in an article."""
    banner, name_nav, tagline, body, sidebar, newsletter, footer = page.text.split("\n")
    escape = _html_escape
    sentences = [s for s in re.split(r"(?<=\.) ", body) if s]
    paragraphs = "".join(f"<p>{escape(' '.join(sentences[i:i + 4]))}</p>" for i in range(0, len(sentences), 4))
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{escape(name_nav.split('.')[0])}</title>"
            f"</head><body><div class=\"cookie-banner\">{escape(banner)}</div>"
            f"<header><nav>{escape(name_nav)}</nav><p class=\"tagline\">{escape(tagline)}</p></header>"
            f"<main><article>{paragraphs}</article>"
            f"<aside><h2>Most read</h2><p>{escape(sidebar)}</p></aside></main>"
            f"<div class=\"newsletter\"><form>{escape(newsletter)}<input type=\"email\"></form></div>"
            f"<footer><p>{escape(footer)}</p></footer></body></html>")


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
