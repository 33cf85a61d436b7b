"""HTML pages -> their main content, with Resiliparse (the extractor of the ChatNoir web search project).

Chosen over trafilatura on speed, measured in ``bench/html_input.py`` on the web
crawl sample served as HTML: Resiliparse extracts about 6 times as many
pages a second as trafilatura's fast mode (and 20 times its default mode),
and recovers every page's body, with more of the template left in (sidebars,
boxes); the site templates learned downstream (``core.templates``) take
that out. The import is deferred: only HTML and WARC input need it.

**The same body under any markup gives the same content.** A near copy is
often the same text in another site's markup: a documentation page
republished as plain paragraphs, a Sphinx page rendered again by Doxygen.
Resiliparse's main-content rules judge a ``<ul>`` by its own tag rather
than by where it stands: it is dropped when it is fewer than four levels
under ``<body>`` (every list of a ``<main><article>``) or when links make a
fifth of its text (one linked phrase in three items), while the same lines
as ``<p>`` or ``<div>`` are kept; and items are numbered ("1.") only where
the markup numbers them. So before extracting, every ``<ul>`` that is not
navigation becomes a ``<section>`` with the same attributes, judged as the
blocks around it are (an ``<ol>`` already is), and no bullets or numbers
are added. Inside the page's main container (``<main>``, ``<article>``, an
element with ``role="main"``) no list is navigation: a copy of the page as
plain paragraphs keeps those lines, links or not (a table of contents of
the article, a javadoc class tree, the Node.js reference's lists of typed
parameters). Elsewhere a list is navigation when most of its items are a
link and no other words (a menu, breadcrumbs, a sidebar's table of
contents): it is left as it is, so Resiliparse drops it as before. A list
of terms with their types or classes linked (Doxygen's member index) is
content: taken by the share of its text in links, twenty index pages of one
Doxygen site came out as the same sentence and were merged.

**Code, tables and lists are kept.** Someone deduplicating documentation
wants two pages that differ only in their code examples or in a table of
defaults to stay two pages; and dropping them the same way in every markup
is impossible, since a copy that sets its code as ``<p>`` lines gives no
sign that it is code. Resiliparse keeps ``<pre>`` blocks and tables where it
keeps the text around them (in the generators' markups tried: Sphinx,
Doxygen, mdBook, rustdoc, DocBook, the Node.js reference); what it dropped
were the lists, and with them any code or table inside an item, which the
pass above keeps. ``tests/test_html.py`` holds one body (paragraphs, lists,
code, a table, a quote, inline code and links) in six site markups, each
extracted to the same text with its navigation, sidebars and footer left
out; ``bench/html_markup.py`` measures real documentation pages and plain
paragraph copies of them.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from typing import Optional, Union

from ..errors import ConfigError

__all__ = ["main_text", "html_text", "neutral_markup"]

def _any_case(word: str) -> str:
    return "".join(f"[{letter}{letter.upper()}]" for letter in word)


_SCRIPT, _STYLE = _any_case("script"), _any_case("style")
_TAG = re.compile(  # "<" taken out, each case spelt out, no lazy ".*?": faster than re.IGNORECASE and ".*?"
    r"<(?:!--[^-]*(?:-(?!->)[^-]*)*-->"
    rf"|{_SCRIPT}\b[^<]*(?:<(?!/{_SCRIPT})[^<]*)*</{_SCRIPT}\s*>"
    rf"|{_STYLE}\b[^<]*(?:<(?!/{_STYLE})[^<]*)*</{_STYLE}\s*>"
    rf"|(?P<closing>/?)(?P<kind>[uU][lL]|{_any_case('div')}|{_any_case('main')}|{_any_case('article')})\b[^>]*>)")
_EMPTY_END = re.compile(r"/\s*>")
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
_RAW = frozenset("script style textarea title".split())  # their text runs to their end tag: left as a parser reads them
_LINE = re.compile(r"<(?:[tT][rR]|[dD][tTdD]|[pP]|[lL][iI]|[bB][rR]|[dD][iI][vV]|[hH][1-6]|[pP][rR][eE])\b[^>]*>")
_RELATION_WORD = re.compile(r"rel\s*=\s*[\"']?(?:next|prev|previous|up|contents|toc|index|start|first|last)\b")
_RELATION_TAG = re.compile(r"<(?:[lL][iI][nN][kK]|[aA])\s[^>]*?\bhref\s*=\s*[\"']?([^\"'\s>]+)")
_HREF = re.compile(r"<[aA]\s[^>]*\bhref\s*=\s*[\"']?([^\"'\s>]+)")
_PARAGRAPH = re.compile(  # a <p> up to the next block's start or end (Texinfo leaves its paragraphs open)
    r"(<[pP])((?:\s[^>]*)?>[^<]*(?:<(?!/?(?i:p|div|table|ul|ol|dl|h[1-6]|pre|section|hr|blockquote)[\s/>])[^<]*)*)")
_INVISIBLE = re.compile(r"<!--.*?-->|<(script|style|head)\b.*?</\1\s*>", re.DOTALL | re.IGNORECASE)
_CLUSTER_CHARS, _CLUSTER_SHARE = 1500, 0.5  # characters not white space
_BLOCK_MARKUP_LIMIT = 12_000  # a block with more markup holds more text than a cluster (a Doxygen list: 4 to 1)
_ANY_TAG = re.compile(r"<[^>]*>")
_ROLE_MAIN = re.compile(rf"role\s*=\s*[\"']?{_any_case('main')}[\"'\s/>]")  # "role" as written: a literal is fast
_TAG_NAME = re.compile(r"<([a-zA-Z][a-zA-Z0-9]*)")
_MARKUP = re.compile(r"<!--.*?-->|</?[a-zA-Z][^>]*>", re.DOTALL)
_LINK = re.compile(r"<a\b[^>]*>.*?</a\s*>", re.DOTALL | re.IGNORECASE)
_ITEM = re.compile(r"<[lL][iI]\b[^>]*>")
_ENTITY = re.compile(r"&#?\w+;")
_WORD = re.compile(r"\w")


def html_text(page: Union[bytes, str]) -> Optional[str]:
    """The page's markup as text: bytes decoded by their declared or detected encoding (None: undecodable)."""
    if isinstance(page, str):
        return page
    bytes_to_str, detect_encoding = _resiliparse("parse.encoding", "bytes_to_str", "detect_encoding")
    try:
        return bytes_to_str(page, detect_encoding(page))
    except (UnicodeDecodeError, LookupError):
        return None


def main_text(markup: str) -> str:
    """The main content of an HTML page as plain text ("" when it has none)."""
    extract_plain_text, = _resiliparse("extract.html2text", "extract_plain_text")
    return extract_plain_text(neutral_markup(markup), main_content=True, list_bullets=False, alt_texts=False,
                              noscript=False) or ""


def neutral_markup(markup: str) -> str:
    """The markup with XHTML's empty elements closed, and every ``<ul>`` that is not navigation and every ``<div>``
    whose links hold most of its text that is not navigation made a ``<section>`` (same attributes). A list or block
    of links that holds most of the page's text is the page's content (a table of contents, an index), not its
    navigation.

    A ``<section>``, not a ``<div>``: an HTML parser closes an open ``<li>`` at
    the next ``<li>`` unless a list or a section-like element stands between
    them, but not a ``<div>``, so items of a ``<div>`` nested in an item would
    close it and the ``</div>`` would close an element around the list.

    Done on the markup text, not on a parsed tree: Resiliparse's DOM makes a
    Python object for every node an attribute read passes, and reading the
    text of a page's lists that way cost 10 to 100 times its extraction.
    """
    markup = _relation_lines_as_navigation(_closed_empty_elements(markup))
    elements = _elements(markup)
    page = _Page(markup, _main_containers(markup, elements))
    blocks, hidden = _link_blocks(page, elements["div"])
    tags = _content_lists(page, elements["ul"]) + blocks
    return _as_sections(markup, sorted(tags, key=re.Match.start), hidden) if tags or hidden else markup


def _closed_empty_elements(markup: str) -> str:
    """The markup with each element written as XHTML's empty element (``<a id="x"/>``, as DocBook writes its
    anchors) given its end tag: an HTML parser ignores the "/" and leaves a link open, so everything after it was
    link text, dropped in blocks as clusters of links, while the same page with ``<a id="x"></a>`` kept it."""
    pieces, done = [], 0
    for end in _EMPTY_END.finditer(markup):
        opens = markup.rfind("<", done, end.start())
        name = _TAG_NAME.match(markup, opens) if opens >= 0 else None
        if name is None or name.group(1).lower() in _VOID or name.group(1).lower() in _RAW \
                or ">" in markup[opens:end.start()]:
            continue
        pieces += [markup[done:end.start()], "></", name.group(1), ">"]
        done = end.end()
    return "".join(pieces) + markup[done:] if pieces else markup


def _relation_lines_as_navigation(markup: str) -> str:
    """The markup with each paragraph whose links (two or more) all lead to the page's declared neighbours
    (``rel="next"``, ``"prev"``, ``"up"``, ``"contents"``, ... on a ``<link>`` or ``<a>``) hidden, as navigation:
    Texinfo's "Next: ..., Previous: ... [Contents][Index]" line, which it repeats at the foot of a node without
    the ``rel`` attributes that make Resiliparse drop the links at its head. A paragraph of the body linking to a
    neighbour among other pages is left as it is."""
    targets = set()
    for relation in _RELATION_WORD.finditer(markup):  # on a <link> or <a>, its href before or after it
        opens, closes = markup.rfind("<", 0, relation.start()), markup.find(">", relation.end())
        tag = _RELATION_TAG.match(markup, opens, closes) if opens >= 0 and closes >= 0 else None
        if tag:
            targets.add(tag.group(1).split("#")[0])
    if not targets:
        return markup

    def marked(paragraph: re.Match) -> str:
        if paragraph.group(2).count("href") < 2:
            return paragraph.group(0)
        hrefs = _HREF.findall(paragraph.group(2))
        if len(hrefs) < 2 or any(href.split("#")[0] not in targets for href in hrefs):
            return paragraph.group(0)
        return f"{paragraph.group(1)} hidden{paragraph.group(2)}"  # what Resiliparse leaves out whatever the element

    return _PARAGRAPH.sub(marked, markup)


class _Page:
    """A page's markup, its main containers, and the length of its visible text (measured when first asked)."""

    def __init__(self, markup: str, containers: list[tuple[int, int]]):
        self.markup, self.containers, self._length = markup, containers, -1

    def contains(self, position: int) -> bool:
        """Whether ``position`` is inside one of the page's main containers."""
        return any(begin <= position < finish for begin, finish in self.containers)

    def is_most_of(self, inner: str) -> bool:
        """Whether the markup ``inner`` holds more than half of the page's visible text."""
        if len(inner) * 16 < len(self.markup):
            return False
        if self._length < 0:
            self._length = _visible_length(_INVISIBLE.sub("", self.markup))
        return _visible_length(inner) * 2 > self._length


def _content_lists(page: _Page, lists: list) -> list[re.Match]:
    """The start and end tags of each of ``lists`` that is not navigation (a list inside one that is, is not; every
    list inside one that is most of the page, is)."""
    tags, navigation_ends, whole_ends = [], -1, -1
    for start, end in sorted(lists, key=lambda pair: pair[0].start()):
        if start.start() < navigation_ends:
            continue  # inside a navigation list: left as it is, as the list is
        inner = page.markup[start.end():end.start()]
        if start.start() >= whole_ends and not page.contains(start.start()) and _is_navigation(inner):
            if not page.is_most_of(inner):
                navigation_ends = end.end()
                continue
            whole_ends = end.end()
        tags += [start, end]
    return tags


def _link_blocks(page: _Page, blocks: list) -> tuple[list[re.Match], set[int]]:
    """Of ``blocks`` (``<div>`` elements) that Resiliparse drops as clusters of links when they stand more than two
    levels under ``<body>``, whatever their depth: the start and end tags of those that are content (inside the
    main container, with most of their lines holding words besides links, as Doxygen's member lists and "New API"
    lists, or most of the page), and where those that are navigation within the page start (lines of links, most of
    them to its own anchors, and nothing else, as Doxygen's summary bar "Public Types | Public Member Functions |
    ..."), to be hidden. A block of links to other pages (a chapter's table of contents) is left to Resiliparse."""
    tags, hidden = [], set()
    for start, end in blocks:
        inner = page.markup[start.end():end.start()]
        if len(inner) > _BLOCK_MARKUP_LIMIT or ("<a" not in inner and "<A" not in inner) or not _is_link_cluster(inner):
            continue
        if page.contains(start.start()) or not _is_navigation_lines(inner) or page.is_most_of(inner):
            tags += [start, end]
        elif _mostly_within_page(inner):
            hidden.add(start.start())
    return tags, hidden


def _mostly_within_page(inner: str) -> bool:
    """Whether most of the links of the markup ``inner`` lead to anchors of the page itself ("#...")."""
    hrefs = _HREF.findall(inner)
    return sum(href.startswith("#") for href in hrefs) * 2 > len(hrefs)


def _elements(markup: str) -> dict[str, list[tuple[re.Match, re.Match]]]:
    """Each ``<ul>``, ``<div>``, ``<main>`` and ``<article>`` of the markup as its start and end tag, by name, paired as a parser
    nests them (unclosed ones left out). Tags inside comments, scripts and styles are not tags and are passed over.
    """
    pairs = {"ul": [], "div": [], "main": [], "article": []}
    open_tags = {name: [] for name in pairs}
    for tag in _TAG.finditer(markup):
        if not tag.group("kind"):
            continue
        name = tag.group("kind").lower()
        if not tag.group("closing"):
            open_tags[name].append(tag)
        elif open_tags[name]:
            pairs[name].append((open_tags[name].pop(), tag))
    return pairs


def _main_containers(markup: str, elements: dict) -> list[tuple[int, int]]:
    """Where each ``<main>``, ``<article>`` and element with ``role="main"`` of the markup begins and ends."""
    spans = [(start.start(), end.end()) for name in ("main", "article") for start, end in elements[name]]
    for role in _ROLE_MAIN.finditer(markup):
        opens = markup.rfind("<", 0, role.start())
        element = _TAG_NAME.match(markup, opens) if opens >= 0 else None
        if element and markup[role.start() - 1].isspace() and ">" not in markup[opens:role.start()]:
            spans.append((opens, _element_end(markup, opens, element.group(1))))
    return spans


def _element_end(markup: str, start: int, name: str) -> int:
    """Where the ``name`` element that begins at ``start`` ends: its end tag, paired by counting (or the end)."""
    depth = 0
    for tag in _tag_pattern(name.lower()).finditer(markup, start):
        depth += -1 if tag.group(1) else 1
        if not depth:
            return tag.end()
    return len(markup)


@functools.lru_cache(maxsize=64)
def _tag_pattern(name: str) -> re.Pattern:
    """Start and end tags of the ``name`` elements (group 1: "/" for an end tag)."""
    return re.compile(rf"<(/?){_any_case(name)}\b")


def _is_navigation(inner: str) -> bool:
    """Whether a list whose markup inside is ``inner`` is navigation: most of its items are a link and no other
    words (a menu, breadcrumbs, a table of contents), or it has no items."""
    items = _ITEM.split(inner)[1:]
    return sum(map(_is_only_links, items)) * 2 > len(items) if items else True


def _is_navigation_lines(inner: str) -> bool:
    """Whether a block whose markup inside is ``inner`` is navigation: most of its lines (rows, terms, paragraphs,
    items) that hold a link and words are that link and no other words (a title beside a menu is not counted).
    Counted until the rest of the lines could not change the answer."""
    lines = [line for line in _LINE.split(inner) if "<a" in line or "<A" in line]
    links_only = other = 0
    for done, line in enumerate(lines, 1):
        if _WORD.search(_ENTITY.sub("", _ANY_TAG.sub("", _LINK.sub("", line)))):
            other += 1
        elif _WORD.search(_ANY_TAG.sub("", line)):
            links_only += 1
        most = links_only + other + len(lines) - done  # lines with words, if every one left has some
        if links_only * 2 > most or other * 2 >= most:
            break
    return links_only * 2 > links_only + other if links_only + other else True


def _is_link_cluster(inner: str) -> bool:
    """Whether Resiliparse could drop a ``<div>`` whose markup inside is ``inner`` as a cluster of links: its links
    hold over 60% of its text, of under 1,500 characters (here with a margin: half, 1,500 not counting spaces)."""
    links = _LINK.findall(inner)
    if not links:
        return False
    text = _visible_length(inner)
    return text <= _CLUSTER_CHARS and _visible_length("".join(links)) > _CLUSTER_SHARE * text


def _visible_length(markup: str) -> int:
    """The characters of the text of ``markup`` that are not white space, an entity counted as one."""
    text = _ANY_TAG.sub("", markup)
    return len("".join((_ENTITY.sub("x", text) if "&" in text else text).split()))


def _is_only_links(item: str) -> bool:
    """Whether a list item's words are all inside its links (signs and entities between them do not count)."""
    return not _WORD.search(_ENTITY.sub("", _MARKUP.sub("", _LINK.sub("", item))))


def _as_sections(markup: str, tags: list[re.Match], hidden: set[int] = frozenset()) -> str:
    """The markup with each of ``tags`` (list tags, in order) made a ``section`` tag, its attributes kept, and each
    element starting at one of ``hidden`` given the ``hidden`` attribute (what Resiliparse leaves out)."""
    pieces, done = [], 0
    for at in sorted(hidden):
        name_ends = _TAG_NAME.match(markup, at).end()
        tags.append(_Insert(at, name_ends))
    for tag in sorted(tags, key=lambda tag: tag.start()):
        if isinstance(tag, _Insert):
            pieces += [markup[done:tag.name_ends], " hidden"]
            done = tag.name_ends
            continue
        name_ends = tag.start() + 1 + len(tag.group("closing")) + len(tag.group("kind"))
        name = "</section" if tag.group("closing") else "<section"
        pieces += [markup[done:tag.start()], name, markup[name_ends:tag.end()]]
        done = tag.end()
    pieces.append(markup[done:])
    return "".join(pieces)


@dataclass(frozen=True)
class _Insert:
    """Where an element's start tag begins and its name ends (the ``hidden`` attribute goes after it)."""

    at: int
    name_ends: int

    def start(self) -> int:
        return self.at


@functools.cache
def _resiliparse(module: str, *names: str) -> tuple:
    """``names`` from Resiliparse's ``module``, imported on first use and kept (an import statement run for every
    page cost 7% of an extraction)."""
    try:
        imported = importlib.import_module(f"resiliparse.{module}")
    except ImportError:
        raise ConfigError("HTML and WARC input need Resiliparse and FastWARC: pip install 'streamdedup[html]'") from None
    return tuple(getattr(imported, name) for name in names)
