"""The Scrapy item pipeline in a real crawl: Scrapy fetching templated pages from a local HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import ROOT, read_jsonl

from streamdedup.core.webcrawl import as_html, generate_web

pytest.importorskip("scrapy", reason="the scrapy extra is not installed: pip install -e '.[test]'")

pytestmark = pytest.mark.system  # every test here starts a crawl in a process of its own

PAGES = generate_web(150, 4, 3)  # articles, and among them articles republished in another site's template
BY_ID = {page.id: page for page in PAGES}

SPIDER = '''
import json
import scrapy


class Site(scrapy.Spider):
    name = "site"

    def __init__(self, start, stats, **kw):
        super().__init__(**kw)
        self.start_urls, self.stats_file = [start], stats

    def parse(self, response):
        if response.url.endswith("/index.html"):
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href, self.page)

    def page(self, response):
        yield {"url": "https://" + response.url.split("/", 3)[3], "html": response.text}

    def closed(self, reason):
        with open(self.stats_file, "w") as handle:
            json.dump({k: v for k, v in self.crawler.stats.get_stats().items() if k.startswith("streamdedup/")},
                      handle)
'''


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.lstrip("/")
        if path == "index.html":
            links = "".join(f'<a href="/{page.url.split("://", 1)[1]}">{page.id}</a>' for page in PAGES)
            body = f"<html><body>{links}</body></html>"
        else:
            page = next((p for p in PAGES if p.url == "https://" + path), None)
            if page is None:
                self.send_error(404)
                return
            body = as_html(page)
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


READ_PAGES = {"id_field": "url", "url_field": "url", "html_field": "html"}  # the spider's items


def _crawl(tmp_path, site, *settings, kafka=None):
    """A crawl of every page with the pipeline, one request at a time in link order: (items out, stats)."""
    spider = tmp_path / "spider.py"
    spider.write_text(SPIDER)
    out, stats = tmp_path / "items.jsonl", tmp_path / "stats.json"
    sections = {"input": READ_PAGES, "index": {"sync": False}}
    if kafka is not None:
        sections["kafka"] = {"bootstrap_servers": kafka}
    command = [sys.executable, "-m", "scrapy", "runspider", str(spider), "-a", f"start={site}/index.html",
               "-a", f"stats={stats}", "-O", f"{out}:jsonlines", "-s", "LOG_LEVEL=WARNING",
               "-s", "CONCURRENT_REQUESTS=1", "-s", "DEPTH_PRIORITY=1",
               "-s", "SCHEDULER_MEMORY_QUEUE=scrapy.squeues.FifoMemoryQueue",
               "-s", "ITEM_PIPELINES={\"streamdedup.scrapy.DedupPipeline\": 300}",
               "-s", f"STREAMDEDUP_SETTINGS={json.dumps(sections)}", *settings]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    (tmp_path / "crawl.log").write_bytes(result.stderr)
    return read_jsonl(out), json.loads(stats.read_text())


def _page_of(url):
    return next(page for page in PAGES if page.url == url)


def _republished_pairs():
    """(republished page, the page it comes from) for each republished article."""
    return [(page, BY_ID[page.source]) for page in PAGES if page.kind == "republished"]


def test_dropping_duplicates_keeps_one_page_of_each_republished_article(tmp_path, site):
    items, stats = _crawl(tmp_path, site, "-s", f"STREAMDEDUP_INDEX={tmp_path / 'index'}")
    urls = [item["url"] for item in items]
    assert len(urls) == len(set(urls)) and "streamdedup" not in items[0]
    pairs = _republished_pairs()
    collapsed = sum(1 for page, source in pairs if (page.url in urls) != (source.url in urls))
    assert collapsed >= 0.9 * len(pairs), f"{collapsed} of {len(pairs)} republished articles found"
    articles = [page for page in PAGES if page.kind == "article"]
    assert all(page.url in urls for page in articles if not any(s is page for _, s in pairs))  # nothing else lost
    assert stats["streamdedup/kept"] == len(items) - stats.get("streamdedup/rejected", 0)
    assert stats["streamdedup/dropped"] == stats["streamdedup/duplicate"] == len(PAGES) - len(items)


def test_tagging_passes_every_page_on_with_its_decision(tmp_path, site):
    items, stats = _crawl(tmp_path, site, "-s", f"STREAMDEDUP_INDEX={tmp_path / 'index'}",
                          "-s", "STREAMDEDUP_ACTION=tag", "-s", "STREAMDEDUP_TAG_FIELD=dedup")
    assert sorted(item["url"] for item in items) == sorted(page.url for page in PAGES)
    tags = {item["url"]: item["dedup"] for item in items}
    for page, source in _republished_pairs():
        later, earlier = (page, source) if PAGES.index(page) > PAGES.index(source) else (source, page)
        if tags[later.url]["status"] == "duplicate":
            assert tags[later.url]["cluster"] == tags[earlier.url]["cluster"]
    duplicates = {url: tag for url, tag in tags.items() if tag["status"] == "duplicate"}
    assert duplicates and all(_article_of(url) == _article_of(tag["matched"]) for url, tag in duplicates.items())
    assert stats["streamdedup/duplicate"] == len(duplicates) and "streamdedup/dropped" not in stats


def _article_of(url):
    """The article a page carries: its own, or the one it republishes or quotes."""
    page = _page_of(url)
    return page.source or page.id


@pytest.mark.kafka
def test_sent_to_the_input_topic_the_pages_are_decided_by_the_worker(kafka, tmp_path, site):
    """``STREAMDEDUP_TOPIC``: each page goes to the worker's input topic as the record it reads, keyed by its
    id; the worker, reading the same fields, finds the republished articles."""
    from kafka_helpers import Topics, read_all, run_worker

    topics = Topics.fresh(kafka)
    items, stats = _crawl(tmp_path, site, "-s", f"STREAMDEDUP_TOPIC={topics.raw}", kafka=kafka)
    assert len(items) == stats["streamdedup/sent"] == len(PAGES)
    sent = read_all(kafka, topics.raw)
    assert sorted(m.key.decode() for m in sent) == sorted(page.url for page in PAGES)
    fields = [arg for name, value in READ_PAGES.items() for arg in ("--set", f'input.{name}="{value}"')]
    assert run_worker(tmp_path / "state", topics, kafka, *fields).returncode == 0
    duplicates = read_all(kafka, topics.duplicates)
    assert len(read_all(kafka, topics.clean)) + len(duplicates) == len(PAGES)
    assert len(duplicates) >= 0.9 * len(_republished_pairs())


@pytest.mark.kafka
def test_a_page_the_broker_refuses_is_counted_as_failed_and_logged_not_as_sent(kafka, tmp_path, site):
    """The input topic takes no page (its max.message.bytes below one): kafka-python's flush returns all the same,
    so each page's send is checked: ``streamdedup/send_failed``, an error naming the topic and what to do, and
    no ``streamdedup/sent``; the items themselves pass on."""
    from kafka_helpers import Topics, create_topics, read_all

    topics = Topics.fresh(kafka)
    small = f"small-{topics.raw}"
    create_topics(kafka, [small], 1, max_message_bytes=200)
    items, stats = _crawl(tmp_path, site, "-s", f"STREAMDEDUP_TOPIC={small}", kafka=kafka)
    assert len(items) == stats["streamdedup/send_failed"] == len(PAGES)
    assert "streamdedup/sent" not in stats
    log = (tmp_path / "crawl.log").read_text()
    assert f"was not sent to {small} partition 0 ([Error 10] MessageSizeTooLargeError" in log
    assert f"raise max.message.bytes of topic {small}" in log
    assert f"{len(PAGES)} page(s) were not sent to {small}" in log
    assert read_all(kafka, small) == []


def test_a_pipeline_without_an_index_or_a_topic_is_not_enabled_and_says_what_to_set():
    from scrapy.exceptions import NotConfigured
    from scrapy.settings import Settings

    from streamdedup.errors import ConfigError
    from streamdedup.scrapy import DedupPipeline

    with pytest.raises(NotConfigured, match="STREAMDEDUP_INDEX.*STREAMDEDUP_TOPIC"):
        DedupPipeline(Settings())
    with pytest.raises(ConfigError, match="STREAMDEDUP_ACTION must be one of 'drop', 'tag'"):
        DedupPipeline(Settings({"STREAMDEDUP_INDEX": "x", "STREAMDEDUP_ACTION": "delete"}))
