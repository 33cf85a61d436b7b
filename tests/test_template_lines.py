"""An excerpt measured without its host page's navigation, told from body text by its short lines
(``templates.lines``).

An excerpt put in a documentation page keeps that page's navigation: its
table of contents, its neighbours' titles, its section's list of pages, each
on other pages of the site too, and as large as the excerpt. Its source
lacks all of it. Text its site repeats is not all navigation (a passage
quoted on several of its pages is body text); navigation is lines of a few
words.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from streamdedup.core.corpus import _Writer
from streamdedup.core.prepare import SHORT_LINE_WORDS, short_line_shingles
from streamdedup.core.shingle import narrow, normalize_texts, shingle_batch
from streamdedup.core.signing import SigningConfig
from streamdedup.core.templates import TemplateSettings, excerpt_text_of, kept_rule, reads_lines
from conftest import run_cli
from test_templates import _decide, _engine
from test_template_repeats import _found

EXCERPTS = "excerpts.enabled=true"


def _shingles(text: str) -> np.ndarray:
    return narrow(shingle_batch(normalize_texts([text]))).of(0)


def test_short_lines_give_the_shingles_that_lie_within_their_runs():
    long_line = " ".join(f"word{n}" for n in range(SHORT_LINE_WORDS + 1))
    text = f"alpha beta\ngamma delta epsilon\n{long_line}\nzeta eta theta\n\niota kappa"
    found = short_line_shingles([text, long_line, "one two three"], SigningConfig())
    assert found.of(0).tolist() == np.union1d(_shingles("alpha beta gamma delta epsilon"),
                                              _shingles("zeta eta theta iota kappa")).tolist()
    assert not set(found.of(0).tolist()) & set(_shingles(long_line).tolist())
    assert len(found.of(1)) == 0  # no short line
    assert found.of(2).tolist() == _shingles("one two three").tolist()
    assert set(found.of(0).tolist()) <= set(_shingles(text).tolist())


def test_an_excerpt_text_leaves_out_only_what_its_site_repeats_in_short_lines():
    content = np.arange(10, 40, dtype=np.uint32)
    repeated = np.arange(30) < 12  # 10..21
    short = np.arange(16, 30, dtype=np.uint32)  # 16..29: of the repeated, 16..21 lie in short lines
    assert excerpt_text_of(content, repeated, short, 1).tolist() == [*range(10, 16), *range(22, 40)]
    assert excerpt_text_of(content, repeated, np.arange(30, 40, dtype=np.uint32), 1) is None  # none repeated there
    assert excerpt_text_of(content, repeated, np.zeros(0, dtype=np.uint32), 1) is None
    assert excerpt_text_of(content, repeated, short, 25) is None  # too little left


def test_lines_are_read_by_new_indexes_and_not_by_those_made_before():
    now = TemplateSettings()
    assert now.lines and reads_lines(now.fingerprint())
    assert TemplateSettings.from_fingerprint(now.fingerprint()) == now
    before = TemplateSettings(lines=False).fingerprint()
    assert not reads_lines(before) and kept_rule(before, now.fingerprint()) == before
    assert not reads_lines(TemplateSettings(repeats=False).fingerprint())  # only with ``repeats``


# -- decisions on a real index ----------------------------------------------------------------------


class HostSite:
    """A documentation site in sections of 20 pages: on each page its section's titles and its own headings,
    one a line, around its body (long lines)."""

    def __init__(self, name: str, writer: _Writer, pages: int):
        self.name = name
        self.header = f"{name} documentation home index modules search"
        self.footer = f"copyright the {name} authors built with a generator"
        self.titles = [" ".join(writer.words(4)) for _ in range(pages)]
        self.headings = [[" ".join(writer.words(5)) for _ in range(4)] for _ in range(pages)]

    def page(self, n: int, body: str) -> str:
        section = n // 20 * 20
        toc = "\n".join(["on this page", *self.headings[n], "in this section", *self.titles[section:section + 20]])
        return f"{self.header}\n{self.titles[n]}\n{body}\n{toc}\n{self.footer}"


def _sentences(text: str) -> list[str]:
    return [s.strip() + "." for s in text.split(".") if s.strip()]


def _excerpts_in_host_pages(writer: _Writer):
    """Site a: 30 pages of long articles (a sentence a line). Site b: 40 pages; after them, ten pages each
    holding half of one of a's articles in the navigation of one of b's pages (as a page republished in
    that page's template). Site c: 30 pages, ten of them quoting a passage of their site's; after them, five
    pages whose one paragraph is that passage and half of one of a's articles (body text its site repeats,
    beside a passage of another page: not an excerpt of it)."""
    rng = random.Random(9)
    a, b, c = HostSite("a", writer, 30), HostSite("b", writer, 40), HostSite("c", writer, 35)
    articles = [_sentences(writer.article(16)) for _ in range(30)]
    quoted = writer.article(8)
    pages = []
    for n in range(30):
        pages.append((f"a{n}", f"https://a.example/{n}", a.page(n, "\n".join(articles[n]))))
        body = writer.article(10) + (f" {quoted}" if n % 3 == 0 else "")
        pages.append((f"c{n}", f"https://c.example/{n}", c.page(n, body)))
    for n in range(40):
        pages.append((f"b{n}", f"https://b.example/{n}", b.page(n, "\n".join(_sentences(writer.article(10))))))
    rng.shuffle(pages)
    excerpts, mixed = {}, []
    for k in range(10):
        passage = "\n".join(articles[3 * k][4:12])
        pages.append((f"x{k}", f"https://b.example/x{k}", b.page(4 * k + 1, passage)))
        excerpts[f"x{k}"] = f"a{3 * k}"
    for k in range(5):
        body = f"{quoted} " + " ".join(articles[3 * k + 1][:8])
        mixed.append((f"m{k}", f"https://c.example/m{k}", c.page(30 + k, body)))
    return pages + mixed, excerpts, [page for page, _, _ in mixed]


@pytest.fixture
def writer():
    return _Writer(random.Random(13))


def test_an_excerpt_in_a_host_page_is_measured_without_the_navigation_its_site_repeats(tmp_path, writer):
    pages, excerpts, mixed = _excerpts_in_host_pages(writer)
    with _engine(tmp_path / "off", EXCERPTS, "templates.lines=false") as engine:
        off = _decide(engine, pages, batch=25)
    with _engine(tmp_path / "on", EXCERPTS) as engine:
        on = _decide(engine, pages, batch=25)
    assert _found(off, excerpts) <= len(excerpts) // 2  # the host's navigation weighs too much
    # one source is not among the ten candidates verified: the pages of the host's section share more of the
    # excerpt's anchors (its navigation's) than the source does, and candidates are ranked by all of them
    assert _found(on, excerpts) == len(excerpts) - 1
    assert all(on[page].relation == "excerpt" and on[page].containment >= 0.8 for page in excerpts
               if on[page].status == "duplicate")
    for decided in (off, on):
        assert all(d.status == "kept" for i, d in decided.items() if i not in excerpts)  # the mixed pages too
    assert all(on[page].status == "kept" for page in mixed)


def test_excerpts_measured_without_navigation_decide_alike_whatever_the_batches_and_restarts(tmp_path, writer):
    pages, excerpts, _ = _excerpts_in_host_pages(writer)
    with _engine(tmp_path / "all", EXCERPTS) as engine:
        reference = _decide(engine, pages, batch=len(pages))
    assert _found(reference, excerpts) == len(excerpts) - 1
    for batch in (1, 9):
        with _engine(tmp_path / f"batch{batch}", EXCERPTS) as engine:
            assert _decide(engine, pages, batch=batch) == reference
    with _engine(tmp_path / "cut", EXCERPTS) as engine:
        first = _decide(engine, pages[:100], batch=11)
    with _engine(tmp_path / "cut", EXCERPTS) as engine:
        second = _decide(engine, pages[100:], batch=7)
    assert {**first, **second} == reference


@pytest.mark.system
def test_pages_prepared_in_the_feed_process_keep_their_short_lines(tmp_path, writer):
    """``dedup`` prepares its batches in a second process (``worker.prepare_processes = 1``) or in its own: the
    short lines travel with the prepared batch, and the decisions are the same."""
    pages, excerpts, _ = _excerpts_in_host_pages(writer)
    path = tmp_path / "pages.jsonl"
    path.write_text("".join(json.dumps({"id": i, "url": url, "text": text}) + "\n" for i, url, text in pages))
    outcomes = {}
    for processes in (0, 1):
        decisions = tmp_path / f"d{processes}.jsonl"
        run_cli("dedup", str(path), "--state", str(tmp_path / f"state{processes}"), "--decisions", str(decisions),
                "--set", 'input.url_field="url"', "--set", EXCERPTS, "--set", "worker.batch_size=40",
                "--set", f"worker.prepare_processes={processes}")
        outcomes[processes] = decisions.read_bytes()
    assert outcomes[0] == outcomes[1]
    decided = [json.loads(line) for line in outcomes[1].splitlines()]
    assert sum(d["relation"] == "excerpt" for d in decided if d["id"] in excerpts) == len(excerpts) - 1


def test_explain_shows_an_excerpts_containment_without_its_hosts_navigation(tmp_path, writer):
    """An excerpt found without its host's navigation: ``explain`` gives that containment beside the plain one
    (below the mark), and the higher of the two is the one its decision recorded."""
    from streamdedup.engine.explain import explain
    from streamdedup.ops.explained import explanation_lines

    pages, excerpts, _ = _excerpts_in_host_pages(writer)
    texts = {page: text for page, _, text in pages}
    with _engine(tmp_path / "on", EXCERPTS) as engine:
        decided = _decide(engine, pages, batch=25)
        found = [explain(engine, page, texts=texts) for page, source in excerpts.items()
                 if decided[page].cluster == source]
        without_text = explain(engine, found[0].a.id)
        same_site = explain(engine, "x0", other="b1", texts=texts)
    assert len(found) == len(excerpts) - 1
    for explained in found:
        assert explained.containment < 0.8 <= explained.excerpt_text_containment
        assert explained.excerpt_text_containment == pytest.approx(explained.decided_containment, abs=1e-6)
        assert any(line.lstrip().startswith("excerpt text") for line in explanation_lines(explained))
    assert without_text.excerpt_text_containment is None  # its short lines are in its text, not the index
    assert same_site.excerpt_text_containment is None  # pages of one site are compared as before
