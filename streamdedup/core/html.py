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
Resiliparse's main-content rules judge some blocks by their own tag rather
than by where they stand: a ``<ul>`` or ``<ol>`` is dropped when it is fewer
than four levels under ``<body>`` (every list of a ``<main><article>``) or
when links make a fifth of its text (one linked phrase in three items),
while the same lines as ``<p>`` or ``<div>`` are kept; and list items are
numbered ("1.") only where the markup numbers them. So before extracting,
every list that is not navigation becomes a ``<div>`` with the same
attributes, judged as the paragraphs around it are, and no bullets or
numbers are added. A list is navigation when its links hold more than half
of its text (a menu, a table of contents, breadcrumbs): it stays a list and
is dropped as before, wherever it stands.

**Code, tables and lists are kept.** Someone deduplicating documentation
wants two pages that differ only in their code examples or in a table of
defaults to stay two pages, and dropping them the same way in every markup
is impossible: a copy that sets its code as ``<p>`` lines gives no sign that
it is code. Resiliparse keeps ``<pre>`` blocks and tables where it keeps the
text around them; what it dropped were the lists (with any code inside
them), which the pass above keeps. ``tests/test_html.py`` holds one body
(paragraphs, lists, code, a table, a quote, inline code and links) in six
site markups, each extracted to the same normalized text with its
navigation, sidebars and footer left out.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

from ..errors import ConfigError

__all__ = ["main_text", "html_text"]

NAVIGATION_LINK_SHARE = 0.5  # a list whose links hold more of its text than this is navigation


def html_text(page: Union[bytes, str]) -> Optional[str]:
    """The page's markup as text: bytes decoded by their declared or detected encoding (None: undecodable)."""
    if isinstance(page, str):
        return page
    _require_resiliparse()
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    try:
        return bytes_to_str(page, detect_encoding(page))
    except (UnicodeDecodeError, LookupError):
        return None


def main_text(markup: str) -> str:
    """The main content of an HTML page as plain text ("" when it has none)."""
    _require_resiliparse()
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(markup)
    if tree.body is None:
        return ""
    _neutral_lists(tree)
    return extract_plain_text(tree, main_content=True, list_bullets=False, alt_texts=False, noscript=False) or ""


def _neutral_lists(tree) -> None:
    """Every ``<ul>``/``<ol>`` of the page that is not navigation, turned into a ``<div>`` with its attributes."""
    for listing in tree.body.query_selector_all("ul, ol"):
        if _link_share(listing) <= NAVIGATION_LINK_SHARE:
            _rename(tree.document, listing, "div")


def _link_share(element) -> float:
    """The share of an element's text (spaces collapsed) inside its links; 1.0 for an element without text."""
    text = len(" ".join(element.text.split()))
    if not text:
        return 1.0
    return sum(len(" ".join(link.text.split())) for link in element.get_elements_by_tag_name("a")) / text


def _rename(document, element, tag: str) -> None:
    """Put a ``tag`` element with ``element``'s attributes and children in its place."""
    renamed = document.create_element(tag)
    for name in element.attrs:
        renamed[name] = element[name]
    for child in list(element.child_nodes):
        renamed.append_child(child)
    element.parent.replace_child(renamed, element)


@functools.cache
def _require_resiliparse() -> None:
    try:
        import resiliparse  # noqa: F401
    except ImportError:
        raise ConfigError("HTML and WARC input need Resiliparse and FastWARC: pip install 'streamdedup[html]'") from None
