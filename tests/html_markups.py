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
    parts = []
    for kind, content in BODY:
        items = content if isinstance(content, list) else [content]
        for item in items:
            parts.append(" ".join(item) if isinstance(item, list) else _plain(item))
    return "\n".join(parts)


def _plain(text: str) -> str:
    return re.sub(r"[`\[\]]", "", text)


def _inline(text, code="<code>{}</code>", link='<a href="/guide.html">{}</a>'):
    text = _h.escape(text, quote=False)
    text = re.sub(r"`([^`]+)`", lambda m: code.format(m.group(1)), text)
    return re.sub(r"\[([^\]]+)\]", lambda m: link.format(m.group(1)), text)


def _links(names, item="<li><a href=\"/{0}.html\">{1}</a></li>"):
    return "".join(item.format(n.lower(), n) for n in names)


def page(head: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Cache</title></head><body>{head}{body}</body></html>"


def semantic() -> str:
    parts = []
    for kind, c in BODY:
        if kind in ("h1", "h2", "p"):
            parts.append(f"<{kind}>{_inline(c)}</{kind}>")
        elif kind in ("ul", "ol"):
            parts.append(f"<{kind}>" + "".join(f"<li>{_inline(i)}</li>" for i in c) + f"</{kind}>")
        elif kind == "pre":
            parts.append("<pre><code class=\"language-python\">" + _h.escape("\n".join(c)) + "</code></pre>")
        elif kind == "table":
            head, *rows = c
            parts.append("<table><thead><tr>" + "".join(f"<th>{x}</th>" for x in head) + "</tr></thead><tbody>"
                         + "".join("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>" for r in rows)
                         + "</tbody></table>")
        else:
            parts.append(f"<blockquote><p>{_inline(c)}</p></blockquote>")
    return page(f"<header><a class=\"logo\" href=\"/\">Webcache</a><nav><ul>{_links(NAV)}</ul></nav></header>",
                f"<main><article>{''.join(parts)}</article><aside><h2>In this section</h2><ul>{_links(LOCAL)}</ul>"
                f"</aside></main><footer><p>{FOOTER}</p></footer>")


def div_soup() -> str:
    parts = []
    for kind, c in BODY:
        if kind == "h1":
            parts.append(f"<div class=\"title\"><b>{_inline(c)}</b></div>")
        elif kind == "h2":
            parts.append(f"<div><b>{_inline(c)}</b></div>")
        elif kind in ("p", "blockquote"):
            parts.append(f"<div>{_inline(c)}</div>")
        elif kind in ("ul", "ol"):
            parts.append("<div>" + "<br>".join(f"&bull; {_inline(i)}" if kind == "ul" else _inline(i) for i in c) + "</div>")
        elif kind == "pre":
            parts.append("<div class=\"code\"><tt>" + "<br>".join(_h.escape(x) for x in c) + "</tt></div>")
        else:
            parts.append("<div>" + "<br>".join(" ".join(r) for r in c) + "</div>")
    menu = " | ".join(f"<a href=\"/{n.lower()}.html\">{n}</a>" for n in NAV)
    side = "<br>".join(f"<a href=\"/{n.lower()}.html\">{n}</a>" for n in LOCAL)
    return page(f"<div id=\"top\"><div class=\"menu\">{menu}</div></div>",
                f"<div id=\"wrap\"><div class=\"sidebar\">{side}</div><div class=\"content\">{''.join(parts)}</div></div>"
                f"<div id=\"footer\">{FOOTER}</div>")


def sphinx() -> str:
    code = "<code class=\"docutils literal notranslate\"><span class=\"pre\">{}</span></code>"
    link = "<a class=\"reference internal\" href=\"guide.html\"><span class=\"doc\">{}</span></a>"
    parts = []
    for kind, c in BODY:
        if kind in ("h1", "h2"):
            parts.append(f"<{kind}>{_inline(c, code, link)}<a class=\"headerlink\" href=\"#x\" title=\"Link to this heading\">\u00b6</a></{kind}>")
        elif kind == "p":
            parts.append(f"<p>{_inline(c, code, link)}</p>")
        elif kind in ("ul", "ol"):
            cls = "simple" if kind == "ul" else "arabic simple"
            parts.append(f"<{kind} class=\"{cls}\">" + "".join(f"<li><p>{_inline(i, code, link)}</p></li>" for i in c) + f"</{kind}>")
        elif kind == "pre":
            lines = "\n".join(" ".join(f"<span class=\"n\">{_h.escape(w)}</span>" for w in x.split(" ")) for x in c)
            parts.append(f"<div class=\"highlight-python notranslate\"><div class=\"highlight\"><pre><span></span>{lines}\n</pre></div></div>")
        elif kind == "table":
            head, *rows = c
            parts.append("<table class=\"docutils align-default\"><thead><tr class=\"row-odd\">"
                         + "".join(f"<th class=\"head\"><p>{x}</p></th>" for x in head) + "</tr></thead><tbody>"
                         + "".join("<tr class=\"row-even\">" + "".join(f"<td><p>{x}</p></td>" for x in r) + "</tr>" for r in rows)
                         + "</tbody></table>")
        else:
            parts.append(f"<blockquote><div><p>{_inline(c, code, link)}</p></div></blockquote>")
    related = ("<div class=\"related\" role=\"navigation\" aria-label=\"Related\"><h3>Navigation</h3><ul>"
               + _links(NAV) + "</ul></div>")
    side = ("<div class=\"sphinxsidebar\" role=\"navigation\" aria-label=\"Main\"><div class=\"sphinxsidebarwrapper\">"
            "<h3>Table of Contents</h3><ul>" + _links(LOCAL, "<li class=\"toctree-l1\"><a class=\"reference internal\" href=\"{0}.html\">{1}</a></li>")
            + "</ul><div id=\"searchbox\" role=\"search\"><h3>Quick search</h3><form><input type=\"text\"></form></div></div></div>")
    return page(related, "<div class=\"document\"><div class=\"documentwrapper\"><div class=\"bodywrapper\">"
                f"<div class=\"body\" role=\"main\"><section id=\"cache\">{''.join(parts)}</section></div></div></div>"
                f"{side}<div class=\"clearer\"></div></div>{related}<div class=\"footer\" role=\"contentinfo\">{FOOTER}</div>")


def doxygen() -> str:
    link = "<a class=\"el\" href=\"guide.html\">{}</a>"
    parts = []
    title = ""
    for kind, c in BODY:
        if kind == "h1":
            title = _inline(c)
        elif kind == "h2":
            parts.append(f"<h2><a class=\"anchor\" id=\"autotoc\"></a>{_inline(c, link=link)}</h2>")
        elif kind == "p":
            parts.append(f"<p>{_inline(c, link=link)}</p>")
        elif kind in ("ul", "ol"):
            parts.append(f"<{kind}>" + "".join(f"<li>{_inline(i, link=link)}</li>" for i in c) + f"</{kind}>")
        elif kind == "pre":
            parts.append("<div class=\"fragment\">" + "".join(
                f"<div class=\"line\"><a id=\"l{n:05d}\" name=\"l{n:05d}\"></a><span class=\"lineno\"> </span>{_h.escape(x)}</div>"
                for n, x in enumerate(c, 1)) + "</div>")
        elif kind == "table":
            head, *rows = c
            parts.append("<table class=\"markdownTable\"><tr class=\"markdownTableHead\">"
                         + "".join(f"<th class=\"markdownTableHeadNone\">{x}</th>" for x in head) + "</tr>"
                         + "".join("<tr class=\"markdownTableRowOdd\">" + "".join(f"<td class=\"markdownTableBodyNone\">{x}</td>" for x in r) + "</tr>" for r in rows)
                         + "</table>")
        else:
            parts.append(f"<blockquote class=\"doxtable\"><p>{_inline(c, link=link)}</p></blockquote>")
    top = ("<div id=\"top\"><div id=\"titlearea\"><table cellspacing=\"0\" cellpadding=\"0\"><tbody><tr><td id=\"projectalign\">"
           "<div id=\"projectname\">Webcache</div><div id=\"projectbrief\">A response cache</div></td></tr></tbody></table></div>"
           "<div id=\"navrow1\" class=\"tabs\"><ul class=\"tablist\">" + _links(NAV, "<li><a href=\"{0}.html\"><span>{1}</span></a></li>")
           + "</ul></div></div>")
    path = ("<div id=\"nav-path\" class=\"navpath\"><ul>" + _links(LOCAL, "<li class=\"navelem\"><a class=\"el\" href=\"{0}.html\">{1}</a></li>")
            + "</ul></div>")
    return page(top, f"<div><div class=\"header\"><div class=\"headertitle\"><div class=\"title\">{title}</div></div></div>"
                f"<div class=\"contents\"><div class=\"textblock\">{''.join(parts)}</div></div></div>{path}"
                f"<hr class=\"footer\"><address class=\"footer\"><small>{FOOTER}</small></address>")


def paragraphs() -> str:
    lines = []
    for kind, c in BODY:
        items = c if isinstance(c, list) else [c]
        for item in items:
            lines.append(" ".join(item) if isinstance(item, list) else _inline(item))
    menu = " ".join(f"<a href=\"/{n.lower()}.html\">{n}</a>" for n in NAV)
    side = " ".join(f"<a href=\"/{n.lower()}.html\">{n}</a>" for n in LOCAL)
    return page(f"<div id=\"header\"><p>{menu}</p></div><div id=\"sidebar\"><p>{side}</p></div>",
                "".join(f"<p>{x}</p>" for x in lines) + f"<div id=\"footer\"><p>{FOOTER}</p></div>")


def mdbook() -> str:
    parts = []
    for kind, c in BODY:
        if kind in ("h1", "h2"):
            parts.append(f"<{kind} id=\"x\"><a class=\"header\" href=\"#x\">{_inline(c)}</a></{kind}>")
        elif kind == "pre":
            parts.append("<pre><code class=\"language-python hljs\">" + "\n".join(
                f"<span class=\"hljs-keyword\">{_h.escape(x)}</span>" for x in c) + "</code></pre>")
        elif kind == "table":
            head, *rows = c
            parts.append("<div class=\"table-wrapper\"><table><thead><tr>" + "".join(f"<th>{x}</th>" for x in head)
                         + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>" for r in rows)
                         + "</tbody></table></div>")
        elif kind in ("ul", "ol"):
            parts.append(f"<{kind}>" + "".join(f"<li>{_inline(i)}</li>" for i in c) + f"</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{_inline(c)}</p>")
        else:
            parts.append(f"<blockquote><p>{_inline(c)}</p></blockquote>")
    side = ("<nav id=\"sidebar\" class=\"sidebar\" aria-label=\"Table of contents\"><div class=\"sidebar-scrollbox\"><ol class=\"chapter\">"
            + _links(LOCAL, "<li class=\"chapter-item expanded\"><a href=\"{0}.html\">{1}</a></li>") + "</ol></div></nav>")
    bar = ("<div id=\"menu-bar\" class=\"menu-bar sticky\"><div class=\"left-buttons\"><button id=\"sidebar-toggle\">x</button></div>"
           "<h1 class=\"menu-title\">The Webcache Book</h1><div class=\"right-buttons\">"
           + " ".join(f"<a href=\"/{n.lower()}.html\">{n}</a>" for n in NAV) + "</div></div>")
    return page(side, f"<div id=\"page-wrapper\" class=\"page-wrapper\"><div class=\"page\">{bar}<div id=\"content\" class=\"content\">"
                f"<main>{''.join(parts)}</main><nav class=\"nav-wrapper\" aria-label=\"Page navigation\">"
                f"<a rel=\"prev\" href=\"glossary.html\" class=\"mobile-nav-chapters previous\">Glossary</a></nav></div></div></div>"
                f"<footer>{FOOTER}</footer>")


MARKUPS = {"semantic": semantic, "div soup": div_soup, "sphinx": sphinx, "doxygen": doxygen, "paragraphs": paragraphs,
           "mdbook": mdbook}
