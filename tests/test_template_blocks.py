"""Repeated blocks: navigation that changes by section learned as template, article text kept, memory bounded."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from test_templates import _decide

from streamdedup import config as config_module
from streamdedup.core import templates as templates_module
from streamdedup.core.corpus import _Writer
from streamdedup.core.records import Document, Source
from streamdedup.core.shingle import normalize_batch, shingle_batch
from streamdedup.core.signing import signing_config, template_settings
from streamdedup.core.templates import MAX_WINDOW_PAGE, SiteState, TemplateSettings, in_sorted
from streamdedup.core.webcrawl import generate_web
from streamdedup.engine.engine import Engine
from streamdedup.engine.explain import explain
from streamdedup.engine.sitelearning import templates_in_advance
from streamdedup.store.index import Index, IndexSettings
from streamdedup.store.sites import load_site, save_site

SETTINGS = TemplateSettings(window=16)  # repeated blocks on (off by default)
BLOCKS = ["templates.window=16"]


def _shingles(text: str) -> np.ndarray:
    """A text's shingles as the templates keep them (top 32 bits, sorted)."""
    batch = shingle_batch(normalize_batch([text]))
    return np.unique((batch.of(0) >> np.uint64(32)).astype(np.uint32))


class SectionedSite:
    """A site-wide header and footer, and per section a box listing the section's page titles."""

    def __init__(self, name: str, writer: _Writer, sections: int = 3):
        self.name, self.writer = name, writer
        self.header = f"{name} home docs search " + " ".join(writer.words(20))
        self.footer = "about contact " + " ".join(writer.words(20)) + f" copyright {name}"
        self.boxes = ["in this section " + " ".join(writer.words(60)) for _ in range(sections)]

    def text(self, section: int, body: str) -> str:
        return "\n".join((self.header, self.boxes[section], body, self.footer))


@pytest.fixture
def writer():
    return _Writer(random.Random(11))


def _learn(texts: list[str], settings: TemplateSettings = SETTINGS) -> SiteState:
    site = SiteState()
    for text in texts:
        site.add_page(_shingles(text), settings)
    return site


def test_a_sections_navigation_is_template_once_on_min_pages_pages_of_the_window(writer):
    site = SectionedSite("docs", writer)
    bodies = [writer.article(6) for _ in range(30)]
    texts = [site.text(0, bodies[n]) for n in range(10)] + [site.text(n % 2 + 1, bodies[n]) for n in range(10, 30)]
    state = SiteState()
    box = _shingles(site.boxes[1])
    for n, text in enumerate(texts):
        state.add_page(_shingles(text), SETTINGS)
        if n == 11:  # the second page of section 1: not yet
            assert in_sorted(box, state.template).mean() < 0.5
    for section in range(3):  # section 0 on 10 pages of 30, sections 1 and 2 on 10 pages each, interleaved
        assert in_sorted(_shingles(site.boxes[section]), state.template).mean() > 0.9
    for body in bodies:
        assert in_sorted(_shingles(body), state.template).mean() < 0.05
    without = _learn(texts, TemplateSettings(window=0))
    assert in_sorted(_shingles(site.boxes[1]), without.template).mean() < 0.1  # on a third of the pages: not before


def test_an_article_on_several_pages_of_a_site_keeps_its_text(writer):
    site = SectionedSite("news", writer)
    article = writer.article(12)
    texts = []
    for n in range(24):  # the same article on 8 pages of the site (print versions, moved pages), among others
        texts.append(site.text(n % 3, article if n % 3 == 0 else writer.article(12)))
    state = _learn(texts)
    assert in_sorted(_shingles(article), state.template).mean() < 0.05
    assert in_sorted(_shingles(site.boxes[1]), state.template).mean() > 0.9


def test_a_phrase_repeated_by_chance_is_not_a_block(writer):
    site = SectionedSite("blog", writer, sections=1)
    phrase = "as we said before"  # a few shingles on every page: fewer than min_block together
    texts = [site.text(0, f"{writer.article(6)} {phrase} {writer.article(3)}") for _ in range(20)]
    state = _learn(texts, TemplateSettings(sample_pages=4, share=0.9, relearn_every=0, window=16))
    assert not in_sorted(_shingles(phrase)[1:-1], state.blocks).any()


def test_the_window_and_the_blocks_are_bounded(writer, monkeypatch):
    monkeypatch.setattr(templates_module, "MAX_TEMPLATE", 100)
    settings = TemplateSettings(window=4, min_pages=2, min_block=4)
    state = SiteState()
    rng = np.random.default_rng(3)
    block = np.zeros(0, dtype=np.uint32)
    for n in range(40):  # every two pages share a new block of 60 shingles beside 200 of their own
        if n % 2 == 0:
            block = rng.integers(1, 2**32, 60, dtype=np.uint64).astype(np.uint32)
        own = rng.integers(1, 2**32, 200 if n != 7 else 2 * MAX_WINDOW_PAGE, dtype=np.uint64).astype(np.uint32)
        state.add_page(np.unique(np.concatenate([block, own])), settings)
        assert len(state.window) <= 4 and all(len(page) <= MAX_WINDOW_PAGE for page in state.window)
    assert 100 <= len(state.blocks) < 100 + 60  # blocks stop once past the cap
    assert set(state.blocks.tolist()) <= set(state.template.tolist())


def test_a_site_with_blocks_and_window_reads_back_as_it_was_written(tmp_path, writer):
    site = SectionedSite("docs", writer)
    state = _learn([site.text(n % 2, writer.article(5)) for n in range(21)])
    assert len(state.blocks) and len(state.window) == SETTINGS.window
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "i")) as engine:
        engine.index.write(lambda txn: save_site(txn, 7, state, SiteState(), "docs.example"))
        with engine.index.read() as txn:
            loaded = load_site(txn, 7)
    assert (loaded.pages, loaded.settled, len(loaded.window)) == (state.pages, state.settled, len(state.window))
    for mine, theirs in [(loaded.template, state.template), (loaded.blocks, state.blocks)] + \
            list(zip(loaded.window, state.window)):
        assert mine.tolist() == theirs.tolist()
    page = _shingles(site.text(2, writer.article(5)))
    for _ in range(3):  # the window's counts are rebuilt from the pages read: the same learning goes on
        loaded.add_page(page, SETTINGS)
        state.add_page(page, SETTINGS)
        page = _shingles(site.text(2, writer.article(5)))
    assert loaded.blocks.tolist() == state.blocks.tolist() and loaded.template.tolist() == state.template.tolist()
    assert in_sorted(_shingles(site.boxes[2]), loaded.template).mean() > 0.9


# -- decisions on a real index --------------------------------------------------


def _sectioned_crawl(writer: _Writer, carried: bool = False) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """Two sites of three sections each (a box of 60 words per section), 45 pages each, interleaved; from the
    24th page on, every third page of b republishes an article of a inside b's template. ``carried``: the
    article takes its section's box of a along (an API page's inherited members: main content its site
    repeats, which a learns as a block), and the articles come from a's three sections in turn (so that b
    does not learn one of a's boxes as a block of its own)."""
    sites = {name: SectionedSite(name, writer) for name in "ab"}
    articles, pages, republished = [], [], {}
    for n in range(45):
        for name, site in sites.items():
            if name == "b" and n >= 24 and n % 3 == 0:
                taken = n - 24 + ((n // 3) % 3 if carried else 0)  # a's page, in section taken % 3
                source = articles[taken]
                body = f"{sites['a'].boxes[taken % 3]}\n{source[1]}" if carried else source[1]
                republished[f"b{n}"] = source[0]
            else:
                body = writer.article(6)
                if name == "a":
                    articles.append((f"a{n}", body))
            pages.append((f"{name}{n}", f"https://{name}.example/s{n % 3}/{n}", site.text(n % 3, body)))
    return pages, republished


def _found(decided: dict, republished: dict) -> int:
    return sum(decided[p].status == "duplicate" and decided[p].cluster == s for p, s in republished.items())


def test_an_article_republished_under_another_sites_sectioned_template_is_found(tmp_path, writer):
    pages, republished = _sectioned_crawl(writer)
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "on")) as engine:
        decided = _decide(engine, pages)
    with Engine(config_module.load(None, ["templates.window=0"], environ={}), str(tmp_path / "off")) as engine:
        before = _decide(engine, pages)
    assert _found(decided, republished) == len(republished) == 7
    assert _found(before, republished) == 0  # the section boxes (a third of the page) stay in the content
    others = [d for i, d in decided.items() if i not in republished]
    assert all(d.status == "kept" for d in others)


def _made_before_neither(path, settings: list[str]) -> None:
    """An index as the version before pairs were verified on neither site's template makes it (nor were pages
    looked up by their own text then)."""
    config = config_module.load(None, settings, environ={})
    before = dataclasses.replace(template_settings(config), neither=False, own_text=False, lines=False).fingerprint()
    Index(IndexSettings(path=str(path)), dataclasses.replace(signing_config(config), templates=before)).close()


def test_a_body_carrying_text_its_site_repeats_is_found_on_what_is_template_on_neither_site(tmp_path, writer):
    """The source's section box is in a's template (a block), so out of the source's content, but in its copy
    on b: compared on their own contents the pair is at J ~0.55; on what neither template holds, 1."""
    pages, republished = _sectioned_crawl(writer, carried=True)
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "neither")) as engine:
        decided = _decide(engine, pages)
    _made_before_neither(tmp_path / "own", BLOCKS)
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "own")) as engine:
        assert not engine.template_settings.neither  # an index made before keeps its rule
        before = _decide(engine, pages)
    assert _found(decided, republished) == len(republished) == 7
    assert _found(before, republished) == 0
    assert all(d.status == "kept" for i, d in decided.items() if i not in republished)
    assert all(d.status == "kept" for i, d in before.items() if i not in republished)


def test_explain_reports_the_similarity_the_decision_verified(tmp_path, writer):
    """(Without ``repeats``, which explain reads as the sites stand now, not as they stood at the decision.)"""
    pages, republished = _sectioned_crawl(writer, carried=True)
    texts = {i: text for i, _, text in pages}
    settings = [*BLOCKS, "templates.repeats=false"]
    with Engine(config_module.load(None, settings, environ={}), str(tmp_path)) as engine:
        decided = _decide(engine, pages)
        for copy, source in republished.items():
            explained = explain(engine, copy, texts={copy: texts[copy], source: texts[source]})
            assert explained.b_is_match and explained.b.id == source
            assert explained.similarity == round(decided[copy].similarity, 6) > 0.9  # own contents: ~0.55
            assert explained.notes == []


def test_pairs_verified_on_neither_template_get_the_same_decisions_whatever_the_batches(tmp_path, writer):
    """A candidate of the same batch (``decide``) and a stored one (``evidence``) are verified alike."""
    pages, republished = _sectioned_crawl(writer, carried=True)
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "one")) as engine:
        reference = _decide(engine, pages, batch=len(pages))
    assert _found(reference, republished) == len(republished)
    for batch in (1, 7):
        with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / f"by{batch}")) as engine:
            assert _decide(engine, pages, batch=batch) == reference
    for cut in (50, 61):  # a restart after the first ``cut`` pages: the sources stored, the copies to come
        with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / f"cut{cut}")) as engine:
            first = _decide(engine, pages[:cut], batch=9)
        with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / f"cut{cut}")) as engine:
            second = _decide(engine, pages[cut:], batch=11)
        assert {**first, **second} == reference


def test_the_sectioned_crawl_gets_the_same_decisions_whatever_the_batches_and_restarts(tmp_path):
    pages = [(p.id, p.url, p.text) for p in generate_web(240, 4, 9, navigation="sections")]
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "one")) as engine:
        reference = _decide(engine, pages, batch=len(pages))
        assert sum(len(site.blocks) > 0 for site in engine.templates._sites.values()) == 4
    assert sum(d.status == "duplicate" for d in reference.values()) > 20
    with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / "small")) as engine:
        assert _decide(engine, pages, batch=1) == reference
    for cut in (31, 117):  # a restart after the first ``cut`` pages
        with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / f"cut{cut}")) as engine:
            first = _decide(engine, pages[:cut], batch=7)
        with Engine(config_module.load(None, BLOCKS, environ={}), str(tmp_path / f"cut{cut}")) as engine:
            second = _decide(engine, pages[cut:], batch=13)
        assert {**first, **second} == reference


def test_learning_first_finds_each_sections_navigation_before_any_page_is_decided(tmp_path, writer):
    """``dedup --learn-first``: blocks are looked for over the whole input (without them, a box on a third of
    the pages is not in the template of the first sample)."""
    pages, _ = _sectioned_crawl(writer)
    items = [Document(i, text, Source("crawl", -1, n), url) for n, (i, url, text) in enumerate(pages)]
    for window, expected in ((16, True), (0, False)):
        settings = TemplateSettings(window=window)
        with Engine(config_module.load(None, [f"templates.window={window}"], environ={}),
                    str(tmp_path / str(window))) as engine:
            learned, hosts = templates_in_advance([engine.prepare(items[:40]), engine.prepare(items[40:])], settings)
        assert sorted(hosts.values()) == ["a.example", "b.example"]
        for site, template in learned.items():
            text = next(t for (i, u, t) in pages if u.startswith(f"https://{hosts[site]}/s1/"))
            box = _shingles(text.split("\n")[1])
            assert bool(in_sorted(box, template).mean() > 0.9) is expected
