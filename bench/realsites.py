"""Real documentation sites with known answers: a corpus builder and its scorer (issue 31).

The synthetic crawl (``bench/crawl_accuracy.py``) gives each site one
constant template. Real sites do not: a Sphinx sidebar lists the pages of
the section a page is in, Texinfo puts the next, previous and up nodes in
every header, javadoc's navigation names the package. This corpus is made
of such sites, as Debian ships them in its ``*-doc`` packages: real HTML
from several site generators, fetched with ``apt-get download`` and unpacked
with ``dpkg-deb -x`` (no root needed), every page given a URL on a host of
its own site (``https://<package>.docs.example/<path>``) so that site
templates can be learned per site.

Every page comes in two forms: its whole visible text (navigation, sidebars
and footers included, as Resiliparse's ``extract_plain_text`` gives it with
``main_content=False``) and its HTML. Its **main content** is what a small
rule per generator selects (:data:`RULES`): the element holding the body,
less the navigation inside it. The truth is the exact greedy reference on
main content alone (``bench.realtext``: the engine's normalization and word
3-gram shingles, every pair by a sparse product, each page against every
earlier kept one at ``lsh.threshold`` 0.7), with excerpts (containment 0.8
in an earlier kept page, at least 50 shingles) when the run has them on.

Planted among the pages, each after its source, in an order fixed by the
seed:

- ``republished``: a page's main content moved into a page of *another*
  site (that page's template, its own body taken out), 3% of its words
  changed;
- ``excerpt``: 30-60% of a long page's main content (consecutive lines, as
  paragraphs) in a page of another site;
- ``near``: a page of the same site with 3% of its main content's words
  changed;
- ``markup``: a page of the same site whose main content is re-rendered as
  plain ``<p>`` paragraphs (the same text, other markup).

Run (downloads the packages once into ``--cache``; ``--holdout`` uses other
packages of the same generators)::

    python -m bench.realsites [--holdout] [--seed 31] [--forms text,html,warc] [--detail] [--out DIR]
    python -m bench.realsites --set templates.share=0.3 --set ...   # one run with these settings
    python -m bench.realsites --set templates.repeats=true --set excerpts.enabled=true --set=--learn-first
    python -m bench.realsites --sample      # the committed sample (bench/data/realsites), no network
    python -m bench.realsites --blocks      # what repeated blocks learn on each site, and how much is main content
    python -m bench.realsites --build-only --out DIR   # the corpus alone: text.jsonl, html.jsonl, crawl.warc.gz,
                                                       # truth.jsonl (site, kind, source, main content), manifest.json

It prints the packages and versions the corpus was built from (also in
``manifest.json`` beside the corpus), each site's share of words outside its
main content, then one table: for the text form (JSONL ``text``) and the HTML form (JSONL with the
page in ``html``, read with ``input.html_field``; ``warc``: a WARC file of
the same pages), each run of ``streamdedup dedup`` with ``input.url_field =
"url"`` (site templates on, as by default): the defaults, and excerpts on with
``--learn-first``. ``--detail`` says by site where the false merges and the
misses are.
"""

from __future__ import annotations

import argparse
import collections
import copy
import glob
import json
import lzma
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

THRESHOLD = 0.7
CONTAINMENT = 0.8
EXCERPT_MIN_SHINGLES = 50
MIN_WORDS = 25  # a page with fewer words of main content is left out (an empty index page, a redirect)
SAMPLE = Path(__file__).resolve().parent / "data" / "realsites" / "sample.jsonl.xz"
TARGETS = {"false_merges": 0.001, "republished": {"text": 0.95, "html": 0.99}, "excerpts": 0.90,
           "excerpt_precision": 0.95, "status": {"text": 0.97, "html": 0.99}}


# -- the sites -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Where a generator puts a page's main content: XPath of the elements holding it, and of the navigation
    inside them (a local table of contents, a node header) to leave out."""

    main: str
    drop: str = ""


RULES = {
    "sphinx": Rule("//div[@role='main'] | //div[@id='yui-main']"),  # the second: Django's own theme
    "mkdocs": Rule("//div[@role='main']"),
    "doxygen": Rule("//div[@class='headertitle'] | //div[@class='contents']"),
    "texinfo": Rule("//body/div[div[@class='header']]",
                    ".//div[@class='header'] | .//ul[@class='section-toc'] | .//table[@class='menu'] | "
                    ".//div[@class='nav-panel']"),
    "texi2html": Rule("//body", ".//table[@cellpadding='1' and @cellspacing='1'] | .//table[@class='menu'] | "
                      ".//p[font[@size='-1']]"),
    "javadoc": Rule("//main", ".//nav"),
    "asciidoc": Rule("//div[@id='content']"),
    "docbook": Rule("//body/div[not(@class='navheader' or @class='navfooter')]",
                    ".//div[@class='toc'] | .//div[@class='navheader'] | .//div[@class='navfooter']"),
}


@dataclass(frozen=True)
class Site:
    package: str
    root: str  # the folder of the site's pages inside the package (``/usr/share/doc/...``)
    generator: str
    limit: int = 0  # at most this many pages (a seeded choice), 0 for all
    pattern: str = "**/*.html"
    name: str = ""  # the site's name in its host, when not its package's (two sites of one package)

    @property
    def host(self) -> str:
        return f"{(self.name or self.package).replace('+', 'p')}.docs.example"


MAIN_SITES = (
    Site("python3.11-doc", "usr/share/doc/python3.11/html", "sphinx"),
    Site("sphinx-doc", "usr/share/doc/sphinx-doc/html", "sphinx"),
    Site("python-werkzeug-doc", "usr/share/doc/python-werkzeug-doc/html", "sphinx"),
    Site("mkdocs-doc", "usr/share/doc/mkdocs/html", "mkdocs"),
    Site("libsigc++-2.0-doc", "usr/share/doc/libsigc++-2.0-doc/reference/html", "doxygen", 400),
    Site("octave-doc", "usr/share/doc/octave/octave.html", "texinfo"),
    Site("libjsoup-java-doc", "usr/share/doc/libjsoup-java/api", "javadoc"),
    Site("git-doc", "usr/share/doc/git-doc", "asciidoc"),
    Site("debian-reference-en", "usr/share/debian-reference", "docbook", pattern="*.en.html"),
)
HOLDOUT_SITES = (
    Site("python-flask-doc", "usr/share/doc/python-flask-doc/html", "sphinx"),
    Site("python-click-doc", "usr/share/doc/python-click-doc/html", "sphinx"),
    Site("python-jinja2-doc", "usr/share/doc/python-jinja2-doc/html", "sphinx"),
    Site("developers-reference", "usr/share/developers-reference", "sphinx"),
    Site("python-django-doc", "usr/share/doc/python-django-doc/html", "sphinx", 400),
    Site("libjsoncpp-doc", "usr/share/doc/libjsoncpp-doc", "doxygen"),
    Site("gettext-doc", "usr/share/doc/gettext", "texi2html", pattern="gettext_*.html"),
    Site("octave-doc", "usr/share/doc/octave/liboctave.html", "texinfo", name="liboctave"),
    Site("libcommons-io-java-doc", "usr/share/doc/libcommons-io-java/api", "javadoc"),
    Site("maint-guide", "usr/share/doc/maint-guide/html", "docbook", pattern="*.en.html"),
)


@dataclass(frozen=True)
class Page:
    site: Site
    version: str
    path: str  # inside the site's root
    html: str

    @property
    def url(self) -> str:
        return f"https://{self.site.host}/{self.path}"


def fetch(sites: Iterable[Site], cache: Path) -> dict[str, tuple[str, Path]]:
    """Each site's package downloaded (``apt-get download``) and unpacked once into ``cache``: its version and
    the folder it was unpacked in."""
    found = {}
    for package in sorted({site.package for site in sites}):
        debs = sorted((cache / "debs").glob(f"{package}_*.deb"))
        if not debs:
            (cache / "debs").mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["apt-get", "download", package], cwd=cache / "debs", capture_output=True,
                                  text=True)
            debs = sorted((cache / "debs").glob(f"{package}_*.deb"))
            if not debs:
                raise SystemExit(f"apt-get download {package} failed (run apt-get update first?):\n{done.stderr}")
        version = subprocess.run(["dpkg-deb", "-f", str(debs[-1]), "Version"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        unpacked = cache / "unpacked" / f"{package}_{version}"
        if not unpacked.exists():
            unpacked.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(unpacked) + ".part"], check=True)
            os.rename(str(unpacked) + ".part", unpacked)
        found[package] = (version, unpacked)
    return found


def site_pages(site: Site, version: str, unpacked: Path, seed: int) -> list[Page]:
    """The site's pages (regular files, not links), in path order; a seeded choice of ``site.limit`` of them."""
    root = unpacked / site.root
    paths = sorted(p for p in glob.glob(str(root / site.pattern), recursive=True)
                   if os.path.isfile(p) and not os.path.islink(p) and "/_static/" not in p)
    pages = []
    for path in paths:
        with open(path, "rb") as handle:
            pages.append(Page(site, version, os.path.relpath(path, root), decode(handle.read())))
    pages = [p for p in pages if len(main_text(p.html, site.generator).split()) >= MIN_WORDS]
    if site.limit and len(pages) > site.limit:
        pages = sorted(random.Random(f"{seed}/{site.package}").sample(pages, site.limit), key=lambda p: p.path)
    return pages


def decode(data: bytes) -> str:
    """A page's text in the charset it declares, else UTF-8, else Latin-1."""
    declared = re.search(rb"charset=[\"']?([A-Za-z0-9_-]+)", data[:2048])
    for encoding in ((declared.group(1).decode(),) if declared else ()) + ("utf-8", "latin-1"):
        try:
            return data.decode(encoding)
        except (LookupError, UnicodeDecodeError):
            continue
    return data.decode("utf-8", "replace")


def load_pages(sites: Iterable[Site], cache: Path, seed: int) -> list[Page]:
    sites = tuple(sites)
    packages = fetch(sites, cache)
    return [page for site in sites for page in site_pages(site, *packages[site.package], seed)]


def write_sample(pages: list[Page], path: Path, per_generator: int, seed: int, max_bytes: int = 40_000) -> None:
    """A few pages of each generator (each under ``max_bytes`` of HTML), xz-compressed JSON lines."""
    rng = random.Random(seed)
    chosen = []
    for generator in sorted({p.site.generator for p in pages}):
        fits = [p for p in pages if p.site.generator == generator and len(p.html.encode()) <= max_bytes]
        chosen += rng.sample(fits, min(per_generator, len(fits)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(path, "wt", encoding="utf-8", preset=9) as handle:
        for page in chosen:
            site = page.site
            handle.write(json.dumps({"package": site.package, "name": site.name, "version": page.version,
                                     "root": site.root, "generator": site.generator, "path": page.path,
                                     "html": page.html}) + "\n")


def read_sample(path: Path = SAMPLE) -> list[Page]:
    with lzma.open(path, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    return [Page(Site(r["package"], r["root"], r["generator"], name=r.get("name", "")), r["version"], r["path"],
                 r["html"]) for r in rows]


# -- a page's parts --------------------------------------------------------------------------------


def parse(html: str):
    import lxml.html

    return lxml.html.document_fromstring(html.encode("utf-8"), parser=lxml.html.HTMLParser(encoding="utf-8"))


def serialize(tree) -> str:
    import lxml.html

    return lxml.html.tostring(tree, encoding="unicode", doctype="<!DOCTYPE html>")


def main_elements(tree, generator: str) -> list:
    """The elements of ``tree`` holding its main content (in document order; none inside another)."""
    found = tree.xpath(RULES[generator].main)
    return [e for e in found if not any(a in found for a in e.iterancestors())]


def main_fragments(tree, generator: str) -> list:
    """Copies of the main elements, the navigation inside them taken out."""
    rule = RULES[generator]
    fragments = []
    for element in main_elements(tree, generator):
        element = copy.deepcopy(element)
        for nav in (element.xpath(rule.drop) if rule.drop else ()):
            _remove(nav)
        fragments.append(element)
    return fragments


def _remove(element) -> None:
    """Take ``element`` out, keeping the text that follows it."""
    parent = element.getparent()
    if parent is None:
        return
    if element.tail:
        previous = element.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + element.tail
        else:
            parent.text = (parent.text or "") + element.tail
    parent.remove(element)


def visible_text(html: str) -> str:
    """The whole page as a browser shows it: navigation, sidebars and footers included."""
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=False, alt_texts=False, noscript=False, links=False,
                              list_bullets=False) or ""


def fragments_text(fragments: list) -> str:
    import lxml.html

    body = "".join(lxml.html.tostring(f, encoding="unicode") for f in fragments)
    return visible_text(f"<!DOCTYPE html><html><body>{body}</body></html>")


def main_text(html: str, generator: str) -> str:
    """The page's main content as text (the truth is computed on it)."""
    return fragments_text(main_fragments(parse(html), generator))


# -- plants ----------------------------------------------------------------------------------------


def edit_words(fragments: list, rng: random.Random, share: float = 0.03) -> list:
    """Copies of ``fragments`` with ``share`` of their words (at least 2) replaced by other words of theirs."""
    fragments = [copy.deepcopy(f) for f in fragments]
    slots = [(node, attribute) for f in fragments for node in f.iter() if isinstance(node.tag, str)
             for attribute in ("text", "tail") if getattr(node, attribute) and (node is not f or attribute == "text")]
    words = [w for node, attribute in slots for w in getattr(node, attribute).split()]
    if len(words) < 4:
        return fragments
    chosen = set(rng.sample(range(len(words)), max(2, round(share * len(words)))))
    number = 0
    for node, attribute in slots:
        parts = re.split(r"(\s+)", getattr(node, attribute))
        for index, part in enumerate(parts):
            if part and not part.isspace():
                if number in chosen:
                    parts[index] = rng.choice(words)
                number += 1
        setattr(node, attribute, "".join(parts))
    return fragments


def paragraphs(text: str) -> list:
    """Plain ``<p>`` elements, one a line of ``text``: a body under other markup."""
    import lxml.html

    result = []
    for line in text.splitlines():
        if line.strip():
            element = lxml.html.Element("p")
            element.text = line.strip()
            result.append(element)
    return result


def graft(host: Page, fragments: list) -> str:
    """``host``'s page with its main content replaced by ``fragments`` (the navigation inside it stays)."""
    tree = parse(host.html)
    rule = RULES[host.site.generator]
    targets = main_elements(tree, host.site.generator)
    first = targets[0]
    for other in targets[1:]:
        _remove(other)
    navigation = set(first.xpath(rule.drop)) if rule.drop else set()
    for child in list(first):
        if child not in navigation and not any(a in navigation for a in child.iterdescendants()):
            _remove(child)
    first.text = None
    for child in first:
        if child.tail and child.tail.strip():
            child.tail = None
    first.extend(fragments)
    return serialize(tree)


def excerpt_lines(text: str, rng: random.Random) -> Optional[str]:
    """30 to 60% of ``text``'s words, whole consecutive lines (None if no window fits)."""
    lines = [line for line in text.splitlines() if line.strip()]
    counts = [len(line.split()) for line in lines]
    total = sum(counts)
    low, high = 0.3 * total, 0.6 * total
    windows = []
    for start in range(len(lines)):
        words = 0
        for end in range(start, len(lines)):
            words += counts[end]
            if words > high:
                break
            if words >= low:
                windows.append((start, end))
    if not windows:
        return None
    start, end = rng.choice(windows)
    return "\n".join(lines[start:end + 1])


@dataclass
class Record:
    id: str
    url: str
    html: str
    site: str
    generator: str
    kind: str  # page, republished, excerpt, near, markup
    source: Optional[str]  # the record a plant was made from
    template: Optional[str] = None  # the record whose page a plant's content was put in
    main: str = ""
    text: str = ""


PLANTS = {"republished": 0.08, "excerpt": 0.05, "near": 0.03, "markup": 0.03}  # per page of the site


def build(pages: list[Page], seed: int, max_pages: int = 0) -> list[Record]:
    """The corpus: the pages (interleaved across sites in a seeded order) and the plants, each after its source."""
    rng = random.Random(seed)
    pages = list(pages)
    rng.shuffle(pages)
    if max_pages:
        pages = pages[: int(max_pages / (1 + sum(PLANTS.values())))]
    records = [Record(f"p{n:05d}", page.url, page.html, page.site.host, page.site.generator, "page", None)
               for n, page in enumerate(pages)]
    order = [float(n) for n in range(len(records))]
    texts = [main_text(page.html, page.site.generator) for page in pages]
    plants = []
    for kind, share in PLANTS.items():
        for _ in range(round(share * len(pages))):
            plant = _plant(kind, pages, texts, rng, len(records) + len(plants))
            if plant is not None:
                record, source = plant
                plants.append((rng.uniform(source + 0.5, len(pages)), record))
    keyed = sorted([(o, r.id, r) for o, r in zip(order, records)] + [(o, r.id, r) for o, r in plants],
                   key=lambda t: (t[0], t[1]))
    result = [r for _, _, r in keyed]
    for record in result:
        record.main = main_text(record.html, record.generator)
        record.text = visible_text(record.html)
    return result


def _plant(kind: str, pages: list[Page], texts: list[str], rng: random.Random, number: int):
    """A planted record of ``kind`` and the place of its source among ``pages`` (None when none fits)."""
    long_enough = 250 if kind == "excerpt" else 80
    candidates = [i for i, t in enumerate(texts) if len(t.split()) >= long_enough]
    if not candidates:
        return None
    at = rng.choice(candidates)
    source = pages[at]
    fragments = main_fragments(parse(source.html), source.site.generator)
    if kind in ("republished", "excerpt"):
        others = [n for n, p in enumerate(pages) if p.site.host != source.site.host]
        if not others:
            return None
        template = rng.choice(others)
        host = pages[template]
        if kind == "republished":
            html = graft(host, edit_words(fragments, rng))
        else:
            passage = excerpt_lines(texts[at], rng)
            if passage is None:
                return None
            html = graft(host, paragraphs(passage))
    else:
        template, host = at, source
        html = graft(host, edit_words(fragments, rng) if kind == "near" else paragraphs(texts[at]))
    url = f"https://{host.site.host}/{kind}/{number:05d}/{os.path.basename(source.path)}"
    return Record(f"p{number:05d}", url, html, host.site.host, host.site.generator, kind, f"p{at:05d}",
                  f"p{template:05d}"), at


def write_corpus(records: list[Record], out: Path) -> dict[str, Path]:
    """The two forms, as ``dedup`` reads them: ``text.jsonl`` (whole visible text) and ``html.jsonl`` (the page in
    ``html``); ``crawl.warc.gz`` the pages as WARC responses (named by their URL); ``truth.jsonl`` each record's
    site, generator, kind, source, template page (a plant's) and main content."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"text": out / "text.jsonl", "html": out / "html.jsonl", "truth": out / "truth.jsonl"}
    with open(paths["text"], "w", encoding="utf-8") as text, open(paths["html"], "w", encoding="utf-8") as html, \
            open(paths["truth"], "w", encoding="utf-8") as truth:
        for r in records:
            text.write(json.dumps({"id": r.id, "url": r.url, "text": r.text}) + "\n")
            html.write(json.dumps({"id": r.id, "url": r.url, "html": r.html}) + "\n")
            truth.write(json.dumps({"id": r.id, "site": r.site, "generator": r.generator, "kind": r.kind,
                                    "source": r.source, "template": r.template, "main": r.main}) + "\n")
    from bench.html_input import _warc_record

    with open(out / "crawl.warc.gz", "wb") as warc:
        for number, r in enumerate(records):
            warc.write(_warc_record(r.url, r.html.encode("utf-8"), number))
    paths["warc"] = out / "crawl.warc.gz"
    return paths


# -- the truth -------------------------------------------------------------------------------------


def overlaps(sets: list[np.ndarray], low: float = 0.5, block: int = 2000) -> dict[tuple[int, int], tuple]:
    """Every pair (i < j) whose Jaccard, or containment of ``j`` in ``i``, is at least ``low``: (Jaccard,
    containment), exactly."""
    from bench.realtext import shared_counts

    pairs = {}
    for i, j, both, first, second in shared_counts(sets, block):
        jaccard = both / (first + second - both)
        contained = both / np.maximum(second, 1)
        good = (jaccard >= low) | (contained >= low)
        pairs.update(zip(zip(i[good].tolist(), j[good].tolist()),
                         zip(jaccard[good].tolist(), contained[good].tolist())))
    return pairs


def reference(sets: list[np.ndarray], pairs: dict, excerpts: bool) -> list[tuple[str, int]]:
    """(status, matched or -1) of each record by the exact greedy rule on main content: the most similar earlier
    kept record at or above the threshold (ties to the earliest); with ``excerpts``, else the earlier kept record
    that contains it most, at or above 0.8, if it has at least 50 shingles."""
    earlier: list[list] = [[] for _ in sets]
    for (i, j), similarity in pairs.items():
        earlier[j].append((i, *similarity))
    kept = np.zeros(len(sets), dtype=bool)
    result = []
    for j in range(len(sets)):
        near = [(s, -i) for i, s, _ in earlier[j] if kept[i] and s >= THRESHOLD]
        within = [(c, -i) for i, _, c in earlier[j] if kept[i] and c >= CONTAINMENT] \
            if excerpts and len(sets[j]) >= EXCERPT_MIN_SHINGLES else []
        best = max(near) if near else max(within) if within else None
        if best is None:
            kept[j] = True
            result.append(("kept", -1))
        else:
            result.append(("duplicate", -best[1]))
    return result


# -- the score -------------------------------------------------------------------------------------


def score(records: list[Record], decisions: list[dict], sets: list[np.ndarray], pairs: dict,
          excerpts: bool) -> dict:
    """The figures of one run against the truth on main content.

    A false merge: a near (or exact) duplicate whose main content has Jaccard < 0.5 with the page it was
    matched to (``below_threshold``: < 0.7). A plant counts when its main content is what it says with its
    source's representative in the reference (Jaccard >= 0.7; an excerpt: contained >= 0.8 and 50 shingles);
    it is found when decided a duplicate in its source's cluster, or of a page it matches as well.
    Excerpt precision: excerpt decisions whose main content is contained >= 0.8 in the matched page's."""
    where = {r.id: i for i, r in enumerate(records)}
    decided = {d["id"]: d for d in decisions}
    truth = reference(sets, pairs, excerpts)
    root = []  # each record's cluster representative in the reference
    for n, (status, matched) in enumerate(truth):
        root.append(n if status == "kept" else root[matched])

    def similarity(i: int, j: int) -> tuple[float, float]:
        """(Jaccard, containment of the later in the earlier) of records i and j."""
        a, b = min(i, j), max(i, j)
        return pairs.get((a, b), (0.0, 0.0)) if a != b else (1.0, 1.0)

    figures = {"pages": len(records), "false_merges": 0, "below_threshold": 0, "excerpt_decisions": 0,
               "excerpts_right": 0, "status": 0, "where": collections.Counter()}
    found = {kind: [0, 0] for kind in ("republished", "excerpt", "near", "markup")}
    for i, record in enumerate(records):
        d = decided[record.id]
        figures["status"] += (d["status"] == "duplicate") == (truth[i][0] == "duplicate")
        other = where.get(d["matched"]) if d["status"] == "duplicate" else None
        if other is not None:
            jaccard, contained = similarity(i, other)
            if d["relation"] == "excerpt":
                figures["excerpt_decisions"] += 1
                figures["excerpts_right"] += contained >= CONTAINMENT or jaccard >= THRESHOLD
            else:
                figures["false_merges"] += jaccard < 0.5
                if jaccard < 0.5:
                    figures["where"][f"false merge on {record.site}"] += 1
                figures["below_threshold"] += jaccard < THRESHOLD
        if record.source is None or (record.kind == "excerpt" and not excerpts):
            continue
        jaccard, contained = similarity(root[where[record.source]], i)  # with the source's representative
        expected = decided[record.source]["cluster"]
        in_cluster = other is not None and d["cluster"] == expected
        if record.kind == "excerpt":
            if contained < CONTAINMENT or len(sets[i]) < EXCERPT_MIN_SHINGLES:
                continue
            hit = in_cluster or (other is not None and similarity(other, i)[1] >= CONTAINMENT)
        else:
            if jaccard < THRESHOLD:
                continue
            hit = in_cluster or (other is not None and similarity(other, i)[0] >= THRESHOLD)
        found[record.kind][0] += hit
        if not hit:
            figures["where"][f"{record.kind} missed, source on {records[where[record.source]].site}"] += 1
        found[record.kind][1] += 1
    figures["found"] = found
    return figures


def rates(figures: dict) -> dict:
    def share(part: int, whole: int) -> float:
        return part / whole if whole else float("nan")

    result = {"pages": figures["pages"], "false_merges": share(figures["false_merges"], figures["pages"]),
              "false_merge_count": figures["false_merges"], "below_threshold": figures["below_threshold"],
              "excerpt_decisions": figures["excerpt_decisions"],
              "status": share(figures["status"], figures["pages"]),
              "excerpt_precision": share(figures["excerpts_right"], figures["excerpt_decisions"])}
    for kind, (hit, of) in figures["found"].items():
        result[kind] = share(hit, of)
        result[f"{kind}_of"] = of
    result["where"] = figures["where"]
    return result


def shingles(records: list[Record]) -> list[np.ndarray]:
    from bench.realtext import shingle_sets

    return shingle_sets([r.main for r in records])


def learned_blocks(records: list[Record], window: int = 16) -> dict[str, tuple[int, float]]:
    """Site -> (shingles its repeated blocks hold, the share of them in the main content of the page that taught
    them): each site's new pages (whole visible text, in corpus order, an exact repeat counted once) through
    the engine's template learning with ``templates.window = window``. Navigation learned is outside the main
    content; what is inside is text the site repeats in its pages (see docs, "Real sites")."""
    from streamdedup.core.shingle import narrow, normalize_texts, shingle_batch
    from streamdedup.core.templates import SiteState, TemplateSettings, in_sorted

    settings = TemplateSettings(window=window)
    states: dict[str, SiteState] = {}
    learned: dict[str, list[int]] = {}
    seen: set[bytes] = set()
    for record in records:
        texts = normalize_texts([record.text, record.main])
        if texts.contents[0] in seen:
            continue
        seen.add(texts.contents[0])
        shingles = narrow(shingle_batch(texts))
        state = states.setdefault(record.site, SiteState())
        before = state.blocks
        state.add_page(shingles.of(0), settings)
        new = np.setdiff1d(state.blocks, before)
        counts = learned.setdefault(record.site, [0, 0])
        counts[0] += len(new)
        counts[1] += int(np.count_nonzero(in_sorted(new, shingles.of(1))))
    return {site: (total, inside / total if total else 0.0) for site, (total, inside) in sorted(learned.items())}


# -- the command -----------------------------------------------------------------------------------


RUNS = {"defaults": [], "excerpts, learn first": ["excerpts.enabled=true", "--learn-first"]}
FORMS = {"text": ['input.url_field="url"'], "html": ['input.url_field="url"', 'input.html_field="html"'],
         "warc": []}


def run_all(records: list[Record], work: Path, runs: dict, forms: Iterable[str] = FORMS) -> list[tuple]:
    """Each form and run through ``streamdedup dedup`` (its own process), scored: (form, run, rates)."""
    from bench import harness

    paths = write_corpus(records, work)
    sets = shingles(records)
    pairs = overlaps(sets)
    id_of_url = {r.url: r.id for r in records}
    rows = []
    for form in forms:
        for name, settings in runs.items():
            state = work / f"state-{form}-{name.replace(' ', '-')}"
            shutil.rmtree(state, ignore_errors=True)  # a new index: an earlier corpus's would decide this one
            run = harness.dedup(str(paths[form]), str(state), [*FORMS[form], *settings], documents=len(records))
            decisions = run.decisions()
            if form == "warc":  # a WARC response is named by its URL
                decisions = [{**d, **{key: id_of_url.get(d[key], d[key]) for key in ("id", "matched", "cluster")}}
                             for d in decisions]
            excerpts = any(s.replace(" ", "") == "excerpts.enabled=true" for s in settings)
            rows.append((form, name, rates(score(records, decisions, sets, pairs, excerpts))))
    return rows


def table(rows: list[tuple]) -> str:
    head = ("| form | run | pages | false merges | below 0.7 | republished | excerpts found | excerpt precision "
            "| near copies | other markup | status agreement |")
    lines = [head, "|" + "---|" * 11]
    for form, name, r in rows:
        excerpts = f"{r['excerpt']:.1%} of {r['excerpt_of']}" if r["excerpt_of"] else "-"
        precision = f"{r['excerpt_precision']:.1%}" if r["excerpt_decisions"] else "-"
        lines.append(f"| {form} | {name} | {r['pages']:,} | {r['false_merges']:.2%} ({r['false_merge_count']}) "
                     f"| {r['below_threshold']} | {r['republished']:.1%} of {r['republished_of']} | {excerpts} "
                     f"| {precision} | {r['near']:.1%} of {r['near_of']} | {r['markup']:.1%} of {r['markup_of']} "
                     f"| {r['status']:.1%} |")
    return "\n".join(lines)


def site_table(records: list[Record]) -> str:
    """Each site's generator, pages, and the median share of a page's words that are not its main content."""
    import statistics

    shares: dict[tuple, list] = {}
    for r in records:
        if r.kind == "page":
            shares.setdefault((r.site, r.generator), []).append(1 - len(r.main.split()) / max(1, len(r.text.split())))
    return "\n".join(f"  {site:<36} {generator:<10} {len(found):>5} pages, {statistics.median(found):.0%} of a "
                     "page's words outside its main content (median)"
                     for (site, generator), found in sorted(shares.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--holdout", action="store_true", help="the held-out packages (and seed + 1 by default)")
    parser.add_argument("--sample", action="store_true", help="the committed sample, not downloaded packages")
    parser.add_argument("--seed", type=int, default=None, help="the order and plants (default 31; 32 held out)")
    parser.add_argument("--max-pages", type=int, default=0, help="at most this many records (0: all pages)")
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/streamdedup/realsites"))
    parser.add_argument("--out", default="", help="keep the corpus and the runs' states here")
    parser.add_argument("--forms", default="text,html", help="of text, html (JSONL) and warc")
    parser.add_argument("--build-only", action="store_true", help="write the corpus (to --out) and score nothing")
    parser.add_argument("--detail", action="store_true", help="where the false merges and misses are, by site")
    parser.add_argument("--set", action="append", default=[], help="settings of one run scored (repeatable)")
    parser.add_argument("--blocks", action="store_true",
                        help="what repeated blocks (templates.window=16) learn on each site, and how much is main content")
    parser.add_argument("--write-sample", type=int, default=0, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else 32 if args.holdout else 31
    sites = HOLDOUT_SITES if args.holdout else MAIN_SITES
    pages = read_sample() if args.sample else load_pages(sites, Path(args.cache), seed)
    if args.write_sample:
        write_sample(pages, SAMPLE, args.write_sample, seed)
        print(f"wrote {SAMPLE} ({SAMPLE.stat().st_size:,} bytes)")
        return 0
    versions = sorted({(p.site.package, p.version, p.site.generator) for p in pages})
    print("built from: " + ", ".join(f"{package} {version} ({generator})" for package, version, generator in versions))
    records = build(pages, seed, args.max_pages)
    kinds = {}
    for r in records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    print(f"{len(records):,} records of {len({r.site for r in records})} sites, seed {seed}: "
          + ", ".join(f"{n:,} {k}" for k, n in kinds.items()))
    print(site_table(records))
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="realsites-"))
    runs = {"given": args.set} if args.set else RUNS
    work.mkdir(parents=True, exist_ok=True)
    (work / "manifest.json").write_text(json.dumps(
        {"seed": seed, "packages": [{"package": p, "version": v, "generator": g} for p, v, g in versions]}, indent=1))
    if args.blocks:
        for site, (shingles, inside) in learned_blocks(records).items():
            print(f"  {site:<36} repeated blocks: {shingles:>6,} shingles, {inside:.0%} of them main content")
        return 0
    if args.build_only:
        paths = write_corpus(records, work)
        print("wrote " + ", ".join(str(path) for path in paths.values()))
        return 0
    rows = run_all(records, work, runs, args.forms.split(","))
    print(table(rows))
    if args.detail:
        for form, name, r in rows:
            print(f"{form}, {name}: " + "; ".join(f"{what} {n}" for what, n in r["where"].most_common()))
    t = TARGETS
    print(f"targets: false merges <= {t['false_merges']:.1%} of pages; republished >= {t['republished']['text']:.0%} "
          f"text, {t['republished']['html']:.0%} html; excerpts >= {t['excerpts']:.0%} found at "
          f"{t['excerpt_precision']:.0%} precision; status agreement >= {t['status']['text']:.0%} text, "
          f"{t['status']['html']:.0%} html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
