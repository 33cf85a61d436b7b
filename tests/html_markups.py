"""One documentation page body rendered in six site markups, each inside its site's navigation.

The markups follow what the generators write (class names, wrappers, code
highlighting, table classes, sidebars): plain semantic HTML5, ``<div>`` soup
with ``<br>`` lines, Sphinx, Doxygen, mdBook, and every line a ``<p>``. The
text is the same in all of them (``body_text``); lists carry no literal
bullets or numbers, as list markup adds none to the text.
"""

from __future__ import annotations

import html as _h
import re

BODY = [
    ("h1", "Configuring the response cache"),
    ("p", "The cache keeps recent responses in memory so that repeated lookups skip the backend. Read "
          "[the deployment guide] before turning it on in production."),
    ("h2", "Options"),
    ("p", "Three settings decide how the cache behaves:"),
    ("ul", ["capacity: how many responses are kept at most", "expiry: [how long a response stays fresh], in seconds",
            "eviction: `lru` or `fifo`, chosen when the cache is full"]),
    ("h2", "Setting it up"),
    ("ol", ["Install the package with pip", "Add a cache section to the configuration file",
            "Restart every worker so that it reads the new settings"]),
    ("pre", ["from webcache import Cache", "cache = Cache(capacity=1000, expiry=60)",
             "cache.put(request.url, response)", "hit = cache.get(request.url)"]),
    ("table", [["Setting", "Default", "Meaning"], ["capacity", "1000", "responses kept"],
               ["expiry", "60", "seconds a response stays fresh"]]),
    ("blockquote", "A cache that is never invalidated is a bug waiting for its first stale page."),
    ("p", "Call `cache.clear()` after a deployment to drop every stored response."),
]
NAV = ["Home", "Tutorials", "Reference", "Changelog", "Downloads"]
LOCAL = ["Installation", "Quickstart", "Troubleshooting", "Glossary"]
FOOTER = "Copyright 2026 Webcache developers. Built with care."


def body_text() -> str:
    """The text of the body, a line per paragraph, heading, item, code line and table row."""
    return "\n".join(" ".join(line) if isinstance(line, list) else re.sub(r"[`\[\]]", "", line)
                     for _, content in BODY for line in (content if isinstance(content, list) else [content]))


def page(head: str, body: str) -> str:
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>Cache</title></head>'
            f"<body>{head}{body}</body></html>")


def _inline(text: str, code: str = "<code>{}</code>", link: str = '<a href="/guide.html">{}</a>') -> str:
    """``text`` with its `code` and [links] marked up."""
    text = _h.escape(text, quote=False)
    text = re.sub(r"`([^`]+)`", lambda m: code.format(m.group(1)), text)
    return re.sub(r"\[([^\]]+)\]", lambda m: link.format(m.group(1)), text)


def _links(names: list[str], item: str = '<li><a href="/{0}.html">{1}</a></li>', between: str = "") -> str:
    return between.join(item.format(name.lower(), name) for name in names)


def _list(kind: str, items: list[str], start: str = "<{}>", item: str = "<li>{}</li>", **inline) -> str:
    return start.format(kind) + "".join(item.format(_inline(i, **inline)) for i in items) + f"</{kind}>"


def _table(rows: list[list[str]], start: str = "<table>", head: str = "<thead><tr>{}</tr></thead>",
           th: str = "<th>{}</th>", body: str = "<tbody>{}</tbody>", tr: str = "<tr>{}</tr>", td: str = "<td>{}</td>"
           ) -> str:
    first, *rest = rows
    return (start + head.format("".join(th.format(cell) for cell in first))
            + body.format("".join(tr.format("".join(td.format(cell) for cell in row)) for row in rest)) + "</table>")


def _element(kind: str, content: str, **inline) -> str:
    return f"<{kind}>{_inline(content, **inline)}</{kind}>"


def _render(**writers) -> str:
    """The body, each kind of block written by ``writers[kind](kind, content)`` or else as plain HTML5 writes it."""
    plain = {"h1": _element, "h2": _element, "p": _element, "ul": _list, "ol": _list,
             "blockquote": lambda kind, c: f"<blockquote><p>{_inline(c)}</p></blockquote>",
             "pre": lambda kind, c: '<pre><code class="language-python">' + _h.escape("\n".join(c)) + "</code></pre>",
             "table": lambda kind, c: _table(c)}
    return "".join({**plain, **writers}[kind](kind, content) for kind, content in BODY)


def semantic() -> str:
    return page(f'<header><a class="logo" href="/">Webcache</a><nav><ul>{_links(NAV)}</ul></nav></header>',
                f"<main><article>{_render()}</article><aside><h2>In this section</h2><ul>{_links(LOCAL)}</ul>"
                f"</aside></main><footer><p>{FOOTER}</p></footer>")


def div_soup() -> str:
    def lines(kind, c):
        bullet = "&bull; " if kind == "ul" else ""
        return "<div>" + "<br>".join(bullet + _inline(i) for i in c) + "</div>"

    body = _render(h1=lambda kind, c: f'<div class="title"><b>{_inline(c)}</b></div>',
                   h2=lambda kind, c: f"<div><b>{_inline(c)}</b></div>",
                   p=lambda kind, c: f"<div>{_inline(c)}</div>", blockquote=lambda kind, c: f"<div>{_inline(c)}</div>",
                   ul=lines, ol=lines,
                   pre=lambda kind, c: '<div class="code"><tt>' + "<br>".join(map(_h.escape, c)) + "</tt></div>",
                   table=lambda kind, c: "<div>" + "<br>".join(" ".join(row) for row in c) + "</div>")
    menu = _links(NAV, '<a href="/{0}.html">{1}</a>', " | ")
    side = _links(LOCAL, '<a href="/{0}.html">{1}</a>', "<br>")
    return page(f'<div id="top"><div class="menu">{menu}</div></div>',
                f'<div id="wrap"><div class="sidebar">{side}</div><div class="content">{body}</div></div>'
                f'<div id="footer">{FOOTER}</div>')


def sphinx() -> str:
    inline = {"code": '<code class="docutils literal notranslate"><span class="pre">{}</span></code>',
              "link": '<a class="reference internal" href="guide.html"><span class="doc">{}</span></a>'}

    def heading(kind, c):
        anchor = '<a class="headerlink" href="#x" title="Link to this heading">\u00b6</a>'
        return f"<{kind}>{_inline(c, **inline)}{anchor}</{kind}>"

    def listing(kind, c):
        start = '<ul class="simple">' if kind == "ul" else '<ol class="arabic simple">'
        return _list(kind, c, start, "<li><p>{}</p></li>", **inline)

    def code(kind, c):
        lines = "\n".join(" ".join(f'<span class="n">{_h.escape(word)}</span>' for word in line.split(" "))
                          for line in c)
        return ('<div class="highlight-python notranslate"><div class="highlight"><pre><span></span>'
                f"{lines}\n</pre></div></div>")

    body = _render(h1=heading, h2=heading, ul=listing, ol=listing, pre=code,
                   p=lambda kind, c: _element(kind, c, **inline),
                   blockquote=lambda kind, c: f"<blockquote><div><p>{_inline(c, **inline)}</p></div></blockquote>",
                   table=lambda kind, c: _table(c, '<table class="docutils align-default">',
                                                '<thead><tr class="row-odd">{}</tr></thead>',
                                                '<th class="head"><p>{}</p></th>', tr='<tr class="row-even">{}</tr>',
                                                td="<td><p>{}</p></td>"))
    related = ('<div class="related" role="navigation" aria-label="Related"><h3>Navigation</h3>'
               f"<ul>{_links(NAV)}</ul></div>")
    toctree = _links(LOCAL, '<li class="toctree-l1"><a class="reference internal" href="{0}.html">{1}</a></li>')
    side = ('<div class="sphinxsidebar" role="navigation" aria-label="Main"><div class="sphinxsidebarwrapper">'
            f'<h3>Table of Contents</h3><ul>{toctree}</ul><div id="searchbox" role="search"><h3>Quick search</h3>'
            '<form><input type="text"></form></div></div></div>')
    return page(related, '<div class="document"><div class="documentwrapper"><div class="bodywrapper">'
                f'<div class="body" role="main"><section id="cache">{body}</section></div></div></div>'
                f'{side}<div class="clearer"></div></div>{related}'
                f'<div class="footer" role="contentinfo">{FOOTER}</div>')


def doxygen() -> str:
    link = '<a class="el" href="guide.html">{}</a>'
    title = _inline(BODY[0][1])  # the page's title stands in the header, not in the contents
    body = _render(h1=lambda kind, c: "", p=lambda kind, c: _element(kind, c, link=link),
                   h2=lambda kind, c: f'<h2><a class="anchor" id="autotoc"></a>{_inline(c, link=link)}</h2>',
                   ul=lambda kind, c: _list(kind, c, link=link), ol=lambda kind, c: _list(kind, c, link=link),
                   pre=lambda kind, c: '<div class="fragment">' + "".join(
                       f'<div class="line"><a id="l{n:05d}" name="l{n:05d}"></a><span class="lineno"> </span>'
                       f"{_h.escape(line)}</div>" for n, line in enumerate(c, 1)) + "</div>",
                   table=lambda kind, c: _table(c, '<table class="markdownTable">',
                                                '<tr class="markdownTableHead">{}</tr>',
                                                '<th class="markdownTableHeadNone">{}</th>', "{}",
                                                '<tr class="markdownTableRowOdd">{}</tr>',
                                                '<td class="markdownTableBodyNone">{}</td>'),
                   blockquote=lambda kind, c: f'<blockquote class="doxtable"><p>{_inline(c, link=link)}</p>'
                                              "</blockquote>")
    tabs = _links(NAV, '<li><a href="{0}.html"><span>{1}</span></a></li>')
    top = ('<div id="top"><div id="titlearea"><table cellspacing="0" cellpadding="0"><tbody><tr><td id="projectalign">'
           '<div id="projectname">Webcache</div><div id="projectbrief">A response cache</div></td></tr></tbody></table>'
           f'</div><div id="navrow1" class="tabs"><ul class="tablist">{tabs}</ul></div></div>')
    path = _links(LOCAL, '<li class="navelem"><a class="el" href="{0}.html">{1}</a></li>')
    return page(top, f'<div><div class="header"><div class="headertitle"><div class="title">{title}</div></div></div>'
                f'<div class="contents"><div class="textblock">{body}</div></div></div>'
                f'<div id="nav-path" class="navpath"><ul>{path}</ul></div>'
                f'<hr class="footer"><address class="footer"><small>{FOOTER}</small></address>')


def paragraphs() -> str:
    lines = [" ".join(line) if isinstance(line, list) else _inline(line)
             for _, content in BODY for line in (content if isinstance(content, list) else [content])]
    menu = _links(NAV, '<a href="/{0}.html">{1}</a>', " ")
    side = _links(LOCAL, '<a href="/{0}.html">{1}</a>', " ")
    return page(f'<div id="header"><p>{menu}</p></div><div id="sidebar"><p>{side}</p></div>',
                "".join(f"<p>{line}</p>" for line in lines) + f'<div id="footer"><p>{FOOTER}</p></div>')


def mdbook() -> str:
    def heading(kind, c):
        return f'<{kind} id="x"><a class="header" href="#x">{_inline(c)}</a></{kind}>'

    body = _render(h1=heading, h2=heading, table=lambda kind, c: f'<div class="table-wrapper">{_table(c)}</div>',
                   pre=lambda kind, c: '<pre><code class="language-python hljs">' + "\n".join(
                       f'<span class="hljs-keyword">{_h.escape(line)}</span>' for line in c) + "</code></pre>")
    chapters = _links(LOCAL, '<li class="chapter-item expanded"><a href="{0}.html">{1}</a></li>')
    side = ('<nav id="sidebar" class="sidebar" aria-label="Table of contents"><div class="sidebar-scrollbox">'
            f'<ol class="chapter">{chapters}</ol></div></nav>')
    bar = ('<div id="menu-bar" class="menu-bar sticky"><div class="left-buttons"><button id="sidebar-toggle">x</button>'
           '</div><h1 class="menu-title">The Webcache Book</h1><div class="right-buttons">'
           f'{_links(NAV, "<a href=/{0}.html>{1}</a>", " ")}</div></div>')
    return page(side, f'<div id="page-wrapper" class="page-wrapper"><div class="page">{bar}'
                f'<div id="content" class="content"><main>{body}</main>'
                '<nav class="nav-wrapper" aria-label="Page navigation"><a rel="prev" href="glossary.html" '
                'class="mobile-nav-chapters previous">Glossary</a></nav></div></div></div>'
                f"<footer>{FOOTER}</footer>")


MARKUPS = {"semantic": semantic, "div soup": div_soup, "sphinx": sphinx, "doxygen": doxygen, "paragraphs": paragraphs,
           "mdbook": mdbook}
