"""HTML pages and WARC files as input: main content extracted, original bytes forwarded, bad records rejected."""

from __future__ import annotations

import gzip
import json

import html_markups
import pytest
from conftest import read_jsonl, run_cli
from kafka_helpers import Topics, header, produce, read_all, run_worker

from streamdedup.core.decode import InputSpec, decode
from streamdedup.core.html import main_text, neutral_markup
from streamdedup.core.records import Document, Source
from streamdedup.core.shingle import normalize
from streamdedup.core.webcrawl import as_html, generate_web

SRC = Source("t", 0, 1)
HTML = InputSpec(format="html")


def test_an_html_page_becomes_its_main_content_named_by_its_key():
    page = generate_web(5, 2, 1)[0]
    doc = decode(as_html(page).encode(), SRC, HTML, key=page.url.encode())
    assert isinstance(doc, Document) and (doc.id, doc.url) == (page.url, page.url)
    assert " ".join(page.body.split()[:20]) in " ".join(doc.text.split())
    assert "Privacy policy" not in doc.text and "cookies" not in doc.text  # footer and banner left out


def test_html_pages_in_other_encodings_and_without_content():
    latin = "<html><head><meta charset=\"iso-8859-1\"></head><body><article><p>" + "Caf\u00e9 cr\u00e8me au lait. " * 20
    doc = decode((latin + "</p></article></body></html>").encode("latin-1"), SRC, HTML, key=b"k")
    assert isinstance(doc, Document) and "Caf\u00e9 cr\u00e8me" in doc.text and doc.url is None
    empty = decode(b"<html><body><nav>Home</nav></body></html>", SRC, HTML, key=b"k")
    assert (empty.reason, empty.id) == ("no_main_content", "k")
    assert decode(None, SRC, HTML).reason == "tombstone"


TEMPLATE_WORDS = set(normalize(" ".join(html_markups.NAV + html_markups.LOCAL + [html_markups.FOOTER])).split())


@pytest.mark.parametrize("markup", html_markups.MARKUPS)
def test_the_same_body_under_any_markup_comes_out_as_the_same_text(markup):
    """Lists, code, a table, a quote, headings and inline code and links: kept in every markup, in order, with no
    bullets or numbers added; the navigation, sidebars and footers around them left out."""
    text = normalize(main_text(html_markups.MARKUPS[markup]()))
    body = normalize(html_markups.body_text())
    if markup == "doxygen":  # its title area (project name and brief) is not recognised: the site's template
        assert text.startswith("webcache a response cache ")
        text = text[len("webcache a response cache "):]
    assert text == body
    assert not TEMPLATE_WORDS & set(text.split()) - set(body.split())


def test_in_the_main_container_every_list_is_content_and_outside_it_a_list_of_links_is_navigation():
    """A plain-paragraph copy keeps every line of a page's main content, links or not; outside ``<main>``,
    ``<article>`` and ``role="main"`` a list whose links hold most of its text is navigation."""
    contents = "".join(f'<li><a href="#s{n}">Section {n} of the guide</a></li>' for n in range(2))
    steps = ('<ul><li>Download the archive from <a href="/get">the mirror</a></li><li>Unpack it into the project '
             'folder<pre>tar xf webcache.tar.gz</pre></li></ul>')
    article = html_markups.page("", f"<main><article><h1>Setting up</h1><ul class=\"toc\">{contents}</ul>"
                                    f"<p>Two steps install everything the guide needs.</p>{steps}</article></main>")
    assert normalize(main_text(article)) == (
        "setting up section 0 of the guide section 1 of the guide two steps install everything the guide needs "
        "download the archive from the mirror unpack it into the project folder tar xf webcache tar gz")
    tabs = "".join(f'<li><a href="/{n}.html"><span>{n}</span></a></li>' for n in ("Main Page", "Modules", "Files"))
    crumbs = '<ul class="crumbs"><li><a href="/">Home</a> &raquo;</li><li><a href="/guide">Guide</a> &raquo;</li></ul>'
    members = "".join(f'<li>{name} : <a href="/cache.html">webcache::Cache</a></li>' for name in ("capacity", "expiry"))
    soup = html_markups.page(f'<div id="top"><div id="navrow1" class="tabs"><ul class="tablist">{tabs}</ul></div>'
                             f'</div>{crumbs}', '<div class="contents"><div class="textblock"><p>Two steps install '
                             f'everything the guide needs.</p>{steps}<ul>{members}</ul></div></div>')
    assert normalize(main_text(soup)) == (
        "two steps install everything the guide needs download the archive from the mirror unpack it into the "
        "project folder tar xf webcache tar gz capacity webcache cache expiry webcache cache")  # tabs, crumbs out
    sphinx = html_markups.page('<div class="related"><ul><li><a href="/">Webcache docs</a></li></ul></div>',
                               '<div class="document"><div class="body" role="main"><p>See also:</p>'
                               f'<ul class="simple">{contents}</ul>'
                               '<p>Two steps install everything the guide needs.</p></div>'
                               f'<div class="sphinxsidebar"><ul>{tabs}</ul></div></div>')
    assert normalize(main_text(sphinx)) == ("see also section 0 of the guide section 1 of the guide two steps "
                                            "install everything the guide needs")


MEMBERS = ('<p>This is the complete list of members for <a class="el" href="c.html">webcache::Cache</a>.</p>'
           '<table class="directory">' + "".join(
               f'<tr><td class="entry"><a class="el" href="c.html#{n}">{n}</a>(size_t)</td>'
               f'<td class="entry"><a class="el" href="c.html">webcache::ResponseCache</a></td></tr>'
               for n in ("capacity", "expiry", "evict")) + "</table>")
MEMBER_TEXT = ("this is the complete list of members for webcache cache capacity size t webcache responsecache expiry "
               "size t webcache responsecache evict size t webcache responsecache")


def test_a_list_of_linked_members_is_content_at_any_depth_and_a_menu_is_not():
    """Resiliparse drops a ``<div>`` more than two levels down whose links hold most of its text; a Doxygen member
    list is such a block, kept on its own site (one level down) and lost in another site's deeper template."""
    menu = '<div class="bar"><div class="row"><div class="links">' + "".join(
        f'<a href="/{n}.html">{n}</a> ' for n in html_markups.NAV) + "</div></div></div>"
    shallow = html_markups.page(menu, f'<div class="contents">{MEMBERS}</div>')
    deep = html_markups.page(menu, '<div class="document"><div class="wrapper-x"><div class="body">'
                                   f'<div class="contents">{MEMBERS}</div></div></div></div>')
    assert normalize(main_text(shallow)) == normalize(main_text(deep)) == MEMBER_TEXT


def test_a_bar_of_links_to_the_pages_own_sections_is_navigation_at_any_depth_and_a_contents_block_is_left():
    """Doxygen's summary bar (links to the page's own sections) stood one level under ``<body>`` and was kept there
    only; a block of links to other pages (a DocBook chapter's contents) is left to Resiliparse as before."""
    bar = ('<div class="summary"><a href="#pub-types">Public Types</a> | <a href="#pub-methods">Public Member '
           'Functions</a> | <a href="cache-members.html">List of all members</a></div>')
    body = "<p>" + "The cache keeps recent responses in memory for the workers. " * 6 + "</p>"
    shallow = html_markups.page("", f'<div class="header">{bar}</div><div class="contents">{body}</div>')
    deep = html_markups.page("", f'<div class="a"><div class="b"><div class="header">{bar}</div></div></div>'
                                 f'<div class="contents">{body}</div>')
    assert normalize(main_text(shallow)) == normalize(main_text(deep)) == normalize(body[3:-4])
    contents = ('<div class="toc"><p><b>Table of Contents</b></p><dl><dt><a href="ch01s01.html">1.1. Introduction'
                '</a></dt><dt><a href="ch01s02.html">1.2. Preparing your program</a></dt></dl></div>')
    chapter = html_markups.page("", f'<div class="chapter">{contents}{body}</div>')
    assert "preparing your program" in normalize(main_text(chapter))


def test_an_anchor_written_as_an_empty_element_does_not_make_the_rest_of_the_page_a_link():
    """``<a id="x"/>`` (DocBook's XHTML) is an open link to an HTML parser: everything after it was link text, and
    blocks of it were dropped as clusters of links; the same page with ``<a id="x"></a>`` kept them."""
    sections = "".join(f'<div class="section"><h3><a id="s{n}"{{}}>Part {n}</h3><div class="note"><p>Step {n} of '
                       f'the guide: <a href="/g{n}">read it</a>.</p></div></div>' for n in range(3))
    body = f'<div class="chapter"><div class="wrap-x"><div class="inner">{sections}</div></div></div>'
    empty, closed = (html_markups.page("", body.replace("{}", end)) for end in ("/>", "></a"))
    assert normalize(main_text(empty)) == normalize(main_text(closed)) == (
        "part 0 step 0 of the guide read it part 1 step 1 of the guide read it part 2 step 2 of the guide read it")


def test_a_list_of_links_that_is_most_of_the_page_is_its_content():
    """A table of contents page without a main container: its list is what the page holds (dropped, every such page
    of a site came out as its title); a menu beside a page's text is still navigation."""
    entries = "".join(f'<li><a href="/c{n}.html">Chapter {n} of the manual</a><ul><li><a href="/c{n}s.html">'
                      f"Section {n}.1 in depth</a></li></ul></li>" for n in range(6))
    menu = '<table><tr><td>[<a href="/top">Top</a>]</td><td>[<a href="/index">Index</a>]</td></tr></table>'
    contents = html_markups.page(menu, f'<h1>Table of Contents</h1><div class="contents"><ul class="toc">{entries}'
                                       "</ul></div>")
    text = normalize(main_text(contents))
    assert "chapter 5 of the manual section 5 1 in depth" in text and text.startswith("top index table of contents")
    prose = "<p>" + "The manual explains every option of the tool in turn. " * 12 + "</p>"
    page = html_markups.page(f'<ul class="menu">{entries}</ul>', prose)
    assert "chapter" not in normalize(main_text(page))


def test_a_line_of_links_to_the_pages_neighbours_is_navigation_wherever_it_stands():
    """Texinfo heads a node with "Next: ..., Previous: ..." links marked ``rel`` (Resiliparse drops those links and
    leaves the words) and repeats the line at its foot without the marks; both lines go, a link of the body to a
    neighbour stays."""
    line = ('<div class="header"><p>Next: <a href="Loops.html"{}>Loops</a>, Previous: <a href="Types.html"{}>Types</a>'
            ' [<a href="index.html#toc" rel="contents">Contents</a>]</div>')
    body = '<h2>Strings</h2><p>A string holds text; <a href="Types.html">the types</a> say more.</p>'
    head = '<link href="Loops.html" rel="next"><link href="Types.html" rel="prev">'
    marked, unmarked = line.format(' rel="next"', ' rel="prev"'), line.format("", "")
    page = (f'<!DOCTYPE html><html><head>{head}</head><body><div class="chapter" id="Strings">'
            f"{marked}{body}<hr>{unmarked}</div></body></html>")
    assert normalize(main_text(page)) == "strings a string holds text the types say more"


def _text_places(markup: str) -> list[tuple[str, str]]:
    """Each text of a page with the tags of the elements around it, a list and a section alike."""
    from resiliparse.parse.html import HTMLTree

    def walk(node, path):
        for child in node.child_nodes:
            if child.tag == "#text" and child.text.strip():
                yield path, child.text.strip()
            elif child.tag and not child.tag.startswith("#"):
                tag = "list" if child.tag in ("ul", "ol", "section") else child.tag
                yield from walk(child, f"{path}/{tag}")

    return list(walk(HTMLTree.parse(markup).body, "body"))


def test_lists_made_sections_leave_every_other_element_where_it_was():
    """A parser closes an item at the next item's start unless a list or a section stands between them, so nested
    lists made ``<div>``s would move what follows them; list tags in scripts and comments are not lists."""
    page = ('<html><body><div class="wrapper"><div id="content"><h2>Options</h2>'
            '<UL><li>path: where the file is</li><li>options: how it is read<ul><li>encoding: utf8 by default</li>'
            '<li>flag: r by default</li></ul></li><li>callback: called at the end</li></UL>'
            '<script>var menu = "</ul><ul>";</script><!-- <ol> --><p>Reads the whole file.</p></div>'
            '<div class="sidebar"><ul><li><a href="/a">Sidebar link one</a></li></ul></div></div>'
            '<p>Closing words of the page.</p></body></html>')
    made = neutral_markup(page)
    assert made.count("<section") == 2 and made.count("</section>") == 2 and 'var menu = "</ul><ul>"' in made
    assert _text_places(made) == _text_places(page)
    assert ("body/div/div/list/li/list/li", "flag: r by default") in _text_places(made)


def test_a_main_container_ends_where_its_element_ends_and_role_main_in_text_is_not_one():
    links = '<ul><li><a href="/a">Section A</a></li></ul>'
    page = (f'<html><body><p>Write <code>role="main"</code> on it.</p>{links}<div class="x" role="main"><div>{links}'
            f'<div>inner</div></div></div>{links}</body></html>')
    made = neutral_markup(page)  # the list inside, and the blocks of links around it there, are content
    assert made.count("<ul>") == 2 and made.count("<section>") == 2
    assert made.endswith(f"<div>inner</div></section></section>{links}</body></html>")


JSON_HTML = InputSpec(html_field="page.html", url_field="page.url")


def test_a_json_record_with_its_page_html_in_a_field_becomes_its_main_content():
    page = generate_web(5, 2, 1)[0]
    record = {"id": "p1", "page": {"url": page.url, "html": as_html(page)}, "text": "not this"}
    doc = decode(json.dumps(record).encode(), SRC, JSON_HTML)
    assert isinstance(doc, Document) and (doc.id, doc.url) == ("p1", page.url)
    assert doc.text == decode(as_html(page).encode(), SRC, HTML, key=page.url.encode()).text  # as format html
    assert "not this" not in doc.text and "Privacy policy" not in doc.text


def test_records_without_the_html_field_are_read_by_their_text_and_bad_html_fields_are_rejected():
    plain = decode(b'{"id": "t", "text": "only words here"}', SRC, JSON_HTML)
    assert plain == Document("t", "only words here", SRC)
    assert decode(b'{"id": "n", "page": {"html": 42}}', SRC, JSON_HTML).reason == "text_not_string"
    empty = decode(b'{"id": "e", "page": {"html": "<html><body><nav>Home</nav></body></html>"}}', SRC, JSON_HTML)
    assert (empty.reason, empty.id) == ("no_main_content", "e")


def test_the_api_reads_a_dict_record_with_its_html_as_dedup_does(tmp_path):
    import streamdedup

    pages = generate_web(60, 3, 2)
    with streamdedup.open(tmp_path / "s", input={"html_field": "html"}) as index:
        decisions = index.add_many([{"id": p.id, "url": p.url, "html": as_html(p)} for p in pages])
    assert [d.id for d in decisions] == [p.id for p in pages]
    assert {d.status for d in decisions} <= {"kept", "duplicate"} and any(d.status == "duplicate" for d in decisions)


def _record(kind: str, uri: str, payload: bytes) -> bytes:
    head = (f"WARC/1.1\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {uri}\r\n"
            f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{abs(hash((kind, uri))) % 10**12:012d}>\r\n"
            f"WARC-Date: 2026-12-01T00:00:00Z\r\nContent-Type: application/http; msgtype={kind}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    return head + payload + b"\r\n\r\n"


def _http(status: int, content_type: str, body: bytes) -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def write_warc(path, pages, extra=(), compress=True) -> None:
    """A WARC file of a request and a response per page, then ``extra`` (kind, uri, payload) records."""
    records = []
    for page in pages:
        records.append(_record("request", page.url, b"GET / HTTP/1.1\r\nHost: example\r\n\r\n"))
        records.append(_record("response", page.url, _http(200, "text/html; charset=utf-8", as_html(page).encode())))
    records += [_record(*r) for r in extra]
    with open(path, "wb") as handle:
        for record in records:
            handle.write(gzip.compress(record) if compress else record)


@pytest.mark.system
def test_a_warc_file_is_deduplicated_response_by_response(tmp_path):
    pages = generate_web(200, 6, 4)
    extra = [("response", "https://x.example/gone", _http(404, "text/html", b"<html>gone</html>")),
             ("response", "https://x.example/logo.png", _http(200, "image/png", b"\x89PNG\r\n")),
             ("metadata", "https://x.example/meta", b"fetchTimeMs: 12\r\n")]
    warc = tmp_path / "crawl.warc.gz"
    write_warc(warc, pages, extra)
    run_cli("dedup", str(warc), "--state", str(tmp_path / "s"), "--out", str(tmp_path / "clean.jsonl"),
            "--decisions", str(tmp_path / "decisions.jsonl"))
    decisions = read_jsonl(tmp_path / "decisions.jsonl")
    assert [d["id"] for d in decisions] == [p.url for p in pages] + ["https://x.example/gone", "https://x.example/logo.png"]
    assert [d["reason"] for d in decisions[-2:]] == ["http_error: HTTP status 404", "not_html: payload is image/png"]
    by_url = {p.url: p for p in pages}
    kept = read_jsonl(tmp_path / "clean.jsonl")
    assert [k["id"] for k in kept] == [d["id"] for d in decisions if d["status"] == "kept"]
    assert all(k["html"] == as_html(by_url[k["id"]]) for k in kept)
    for d in decisions[:-2]:  # a republished page joins its source's cluster, a new article is kept
        page = by_url[d["id"]]
        if page.kind == "article":
            assert d["status"] == "kept"
    stats = json.loads(run_cli("stats", "--state", str(tmp_path / "s"), "--json").stdout)
    assert stats["templates"]["sites"] == 6
    again = run_cli("dedup", str(warc), "--state", str(tmp_path / "s"), "--decisions", str(tmp_path / "again.jsonl"))
    assert again.returncode == 0
    assert [d["status"] for d in read_jsonl(tmp_path / "again.jsonl")] == [d["status"] for d in decisions]


@pytest.mark.system
def test_jsonl_with_each_page_html_in_a_field_is_decided_as_the_same_pages_in_a_warc_file(tmp_path):
    """Crawlers write JSONL with the page's HTML in it: ``input.html_field`` reads it as WARC input is read."""
    pages = generate_web(200, 6, 4)
    warc = tmp_path / "crawl.warc.gz"
    write_warc(warc, pages)
    jsonl = tmp_path / "crawl.jsonl"
    jsonl.write_text("".join(json.dumps({"id": p.url, "url": p.url, "html": as_html(p)}) + "\n" for p in pages))
    for name, source, extra in (("warc", warc, ()), ("jsonl", jsonl, ("--set", 'input.html_field="html"'))):
        run_cli("dedup", str(source), "--state", str(tmp_path / f"s-{name}"), "--decisions",
                str(tmp_path / f"{name}.jsonl"), *extra)
    from_warc, from_jsonl = read_jsonl(tmp_path / "warc.jsonl"), read_jsonl(tmp_path / "jsonl.jsonl")
    assert from_jsonl == from_warc
    assert {d["status"] for d in from_jsonl} == {"kept", "duplicate"}


@pytest.mark.system
def test_a_truncated_warc_file_ends_with_a_rejection_not_a_crash(tmp_path):
    pages = generate_web(20, 2, 5)
    whole = tmp_path / "whole.warc"
    write_warc(whole, pages, compress=False)
    cut = tmp_path / "cut.warc"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    result = run_cli("dedup", str(cut), "--state", str(tmp_path / "s"), "--decisions", str(tmp_path / "d.jsonl"))
    assert result.returncode == 0
    decisions = read_jsonl(tmp_path / "d.jsonl")
    assert 5 < len(decisions) < 20
    assert all(d["status"] != "rejected" for d in decisions[:-1])


def test_the_worker_forwards_html_records_untouched(kafka, tmp_path):
    pages = generate_web(60, 3, 6)
    records = [(p.url.encode(), as_html(p).encode("utf-8")) for p in pages]
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    assert run_worker(tmp_path / "state", topics, kafka, "--set", "input.format=html").returncode == 0
    clean = read_all(kafka, topics.clean)
    sent = dict(records)
    assert clean and all(m.value == sent[m.key] for m in clean)
    assert {header(m, "streamdedup.id") for m in clean} <= set(sent)
    assert len(clean) + len(read_all(kafka, topics.duplicates)) == len(pages)
    assert read_all(kafka, topics.dead_letter) == []
