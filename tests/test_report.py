"""`streamdedup report`: the figures it counts from a real index, and the page as headless Chromium shows it."""

from __future__ import annotations

import html
import io
import json
import os
import re
import shlex
from collections import Counter

import pytest
from chromium import chromium_binary, render
from conftest import read_jsonl, run_cli

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.records import Document, Source
from streamdedup.engine.census import BUCKET_LADDER, bucket_width, take_census
from streamdedup.engine.engine import Engine
from streamdedup.ops.report import explain_command, render_report

DAY = 86400.0


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory):
    """The sample crawl (written by `streamdedup sample`) decided by `streamdedup dedup`: its index and decisions."""
    folder = tmp_path_factory.mktemp("report")
    crawl = folder / "crawl.jsonl"
    run_cli("sample", "--out", str(crawl))
    run_cli("dedup", str(crawl), "--state", str(folder / "state"), "--decisions", str(folder / "decisions.jsonl"))
    return folder / "state", read_jsonl(folder / "decisions.jsonl")


def census_of(state, **kwargs):
    with Engine(config_module.load(None, environ={}), str(state), readonly=True) as engine:
        return take_census(engine, **kwargs)


def test_census_counts_what_dedup_decided(sample_index):
    state, decisions = sample_index
    census = census_of(state, top=5, members=2)
    duplicates = [d for d in decisions if d["status"] == "duplicate"]
    relations = Counter(d["relation"] for d in duplicates)
    assert census.documents == len(decisions)
    assert census.kept == sum(d["status"] == "kept" for d in decisions)
    assert (census.duplicates, census.exact, census.near, census.excerpts) == (
        len(duplicates), relations["exact"], relations["near"], relations["excerpt"])
    assert sum(census.near_similarity) == census.near and sum(census.excerpt_similarity) == census.excerpts
    # every near duplicate's similarity lands in its own bin; with excerpts off, all are at the threshold or above
    near_bins = Counter(min(int(d["similarity"] * 50), 49) for d in duplicates if d["relation"] == "near")
    assert {b: n for b, n in enumerate(census.near_similarity) if n} == dict(near_bins)
    assert min(near_bins) >= int(0.7 * 50)

    sizes = Counter(Counter(d["cluster"] for d in decisions).values())
    assert census.cluster_sizes == dict(sorted(sizes.items()))
    assert census.clusters == census.kept
    assert sum(size * n for size, n in census.cluster_sizes.items()) == census.documents

    largest = census.largest
    assert len(largest) == 5 and largest[0].size == max(sizes)
    assert [c.size for c in largest] == sorted((c.size for c in largest), reverse=True)
    first = largest[0]
    members = [d["id"] for d in decisions if d["cluster"] == first.representative["id"] and d["status"] != "kept"]
    assert [m["id"] for m in first.members] == members[:2]
    assert first.members_left_out == len(members) - 2
    assert census.by_order and sum(b.decided for b in census.by_order) == census.documents
    assert sum(b.duplicates for b in census.timeline) == census.duplicates


def test_census_buckets_decisions_by_day(tmp_path):
    """Decisions made on different days (the engine's clock) land in day buckets with their own duplicate rates."""
    now = [1_700_000_000.0]
    texts = [d.text for d in corpus.generate(40, seed=3)]
    with Engine(config_module.load(None, environ={}), str(tmp_path), clock=lambda: now[0]) as engine:
        outcomes = []
        for day in range(5):
            items = [Document(f"day{day}-{i}", text, Source("t", -1, i)) for i, text in enumerate(texts)]
            outcomes.append([d.status for d in engine.decide_batch(engine.prepare(items))])
            now[0] += DAY
        census = take_census(engine)
    assert census.bucket_seconds == 3600  # four days: 96 hourly buckets (at most 120)
    busy = [b for b in census.timeline if b.decided]
    assert [b.decided for b in busy] == [len(texts)] * 5
    assert [b.duplicates for b in busy] == [day.count("duplicate") for day in outcomes]
    assert busy[0].duplicate_rate < 0.5 and all(b.duplicate_rate == 1.0 for b in busy[1:])
    page = render_report(census)
    assert page.count('class="plot"') == 4 and "see the decision order below" not in page


def test_bucket_width_keeps_within_the_bucket_count():
    assert bucket_width(0) == 1 and bucket_width(100) == 1 and bucket_width(119) == 1 and bucket_width(121) == 10
    assert bucket_width(4 * DAY) == 3600 and bucket_width(20 * DAY) == 6 * 3600 and bucket_width(30 * DAY) == DAY
    assert bucket_width(100 * 365 * DAY) == BUCKET_LADDER[-1]


def test_report_on_an_empty_index_says_there_is_nothing_yet(tmp_path):
    with Engine(config_module.load(None, environ={}), str(tmp_path)) as engine:
        census = take_census(engine)
    assert census.documents == 0 and census.clusters == 0 and census.largest == []
    assert "No cluster has a duplicate yet." in render_report(census)


def test_explain_commands_quote_ids_for_the_shell():
    command = explain_command("it's a page; rm -rf /", ["--state", "/srv/my index"])
    assert shlex.split(command) == ["streamdedup", "explain", "it's a page; rm -rf /", "--state", "/srv/my index"]


@pytest.mark.system
def test_report_runs_while_the_index_has_a_writer(sample_index, tmp_path):
    state, decisions = sample_index
    out = tmp_path / "report.html"
    with Engine(config_module.load(None, environ={}), str(state)):  # holds the writer lock, as a worker would
        result = run_cli("report", "--state", str(state), "--out", str(out), "--top", "3")
    assert f"{len(decisions):,} documents" in result.stdout.decode()
    page = out.read_text(encoding="utf-8")
    assert page.count("<h3>") == 3


@pytest.mark.system
def test_the_explain_commands_in_the_report_run(sample_index, tmp_path):
    state, _ = sample_index
    out = tmp_path / "report.html"
    run_cli("report", "--state", str(state), "--out", str(out), "--top", "1", "--members", "1")
    commands = re.findall(r"<code>(streamdedup explain [^<]*)</code>", out.read_text(encoding="utf-8"))
    assert len(commands) == 2  # the representative and its one member listed
    census = census_of(state, top=1, members=1)
    member = shlex.split(html.unescape(commands[1]))
    assert member[2] == census.largest[0].members[0]["id"]
    explained = json.loads(run_cli(*member[1:], "--json").stdout)
    assert explained["a"]["id"] == member[2] and explained["a"]["status"] == "duplicate"
    assert explained["matched"] == census.largest[0].representative["id"]


@pytest.mark.system
def test_report_without_matplotlib_says_how_to_install_it(sample_index, tmp_path):
    """A matplotlib that fails to import, first on the path, stands for one not installed."""
    state, _ = sample_index
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('not installed')\n")
    result = run_cli("report", "--state", str(state), "--out", str(tmp_path / "r.html"), check=False,
                     env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 1
    assert "pip install 'streamdedup[report]'" in result.stderr.decode()
    assert not (tmp_path / "r.html").exists()


@pytest.mark.system
def test_report_into_a_missing_folder_says_so(sample_index, tmp_path):
    state, _ = sample_index
    result = run_cli("report", "--state", str(state), "--out", str(tmp_path / "no" / "r.html"), check=False)
    assert result.returncode == 1
    assert "cannot write the report to" in result.stderr.decode() and "Traceback" not in result.stderr.decode()


@pytest.mark.system
def test_report_renders_in_headless_chromium(sample_index, tmp_path):
    """The page loads with no network, logs no error, and its screenshot is a picture, not a blank page."""
    if chromium_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on CI: `make test` runs deploy/report/install-chromium.sh first")
        pytest.skip("no chromium: run deploy/report/install-chromium.sh (make test does)")
    from PIL import Image

    state, decisions = sample_index
    out = tmp_path / "report.html"
    run_cli("report", "--state", str(state), "--out", str(out))
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    largest = census_of(state, top=1).largest[0]
    for member in largest.members:
        assert f"streamdedup explain {member['id']} --state {state}" in page

    rendered = render(out.as_uri())
    assert rendered.console_errors == []
    assert {url.split(":", 1)[0] for url in rendered.requested_urls} == {"file", "data"}
    assert sum(url.startswith("data:image/svg+xml") for url in rendered.requested_urls) == 4

    image = Image.open(io.BytesIO(rendered.png)).convert("RGB")
    width, height = image.size
    assert width >= 1000 and height > 3000  # the whole page, not the first screen
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 200  # plots and text antialiased: many colours; a blank or failed page has a handful
    white = max(count for count, colour in colours if colour == (255, 255, 255))
    assert white < 0.97 * width * height
    plot_colours = {(0x4c, 0x72, 0xb0), (0xdd, 0x84, 0x52)}  # the kept and duplicate colours of the plots
    assert plot_colours <= {colour for _, colour in colours}
