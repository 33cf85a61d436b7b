"""The real-site corpus builder (bench/realsites.py) on its committed sample: what its figures rest on."""

from __future__ import annotations

import collections
import math

import pytest

from bench import realsites as rs
from bench.realtext import shingle_sets


@pytest.fixture(scope="module")
def sample():
    return rs.read_sample()


@pytest.fixture(scope="module")
def corpus(sample):
    return rs.build(sample, seed=5)


def _jaccard(a, b) -> float:
    a, b = set(a.tolist()), set(b.tolist())
    return len(a & b) / len(a | b)


def _nan(value) -> bool:
    """A rate of nothing (no excerpts planted in a run without them)."""
    return isinstance(value, float) and math.isnan(value)


def _lines(text: str) -> set:
    return {" ".join(line.split()) for line in text.splitlines() if line.strip()}


def test_the_sample_has_four_generators_or_more_each_with_main_content(sample):
    generators = collections.Counter(page.site.generator for page in sample)
    assert len(generators) >= 4
    for page in sample:
        main = rs.main_text(page.html, page.site.generator)
        assert len(main.split()) >= rs.MIN_WORDS
        assert len(main.split()) < len(rs.visible_text(page.html).split())  # the rule leaves navigation out


def test_every_kind_is_planted_each_after_its_source(corpus):
    kinds = collections.Counter(r.kind for r in corpus)
    assert set(kinds) == {"page", "republished", "excerpt", "near", "markup"}
    place = {r.id: n for n, r in enumerate(corpus)}
    for record in corpus:
        if record.kind == "page":
            assert record.source is None
        else:
            assert place[record.source] < place[record.id]
            assert corpus[place[record.source]].kind == "page"


def test_a_republished_body_sits_in_another_sites_template(corpus):
    by_id = {r.id: r for r in corpus}
    republished = [r for r in corpus if r.kind == "republished"]
    assert republished
    for record in republished:
        source, template = by_id[record.source], by_id[record.template]
        assert record.site == template.site != source.site
        assert record.url.startswith(f"https://{template.site}/")
        mine, theirs, frame = shingle_sets([record.main, source.main, template.main])
        assert _jaccard(mine, theirs) >= 0.7  # a few words changed
        assert _jaccard(mine, frame) < 0.5  # not the template page's own body
        # what is not main content is the template page's: its navigation, sidebar, footer
        around = _lines(record.text) - _lines(record.main)
        assert around and around <= _lines(template.text)


def test_excerpts_and_near_copies_are_what_they_say(corpus):
    by_id = {r.id: r for r in corpus}
    for record in corpus:
        if record.kind == "page":
            continue
        source = by_id[record.source]
        mine, theirs = shingle_sets([record.main, source.main])
        shared = len(set(mine.tolist()) & set(theirs.tolist()))
        if record.kind == "excerpt":
            assert record.site != source.site
            assert shared / len(mine) >= 0.8
            assert 0.2 <= len(record.main.split()) / len(source.main.split()) <= 0.7
        elif record.kind == "near":
            assert record.site == source.site and record.text != source.text
            assert 0.7 <= _jaccard(mine, theirs) < 1
        elif record.kind == "markup":
            assert record.site == source.site and record.html != source.html
            assert _jaccard(mine, theirs) >= 0.9  # the same text under plain paragraphs


def test_the_same_seed_gives_the_same_corpus(sample, corpus):
    again = rs.build(sample, seed=5)
    assert [(r.id, r.url, r.html, r.main) for r in again] == [(r.id, r.url, r.html, r.main) for r in corpus]
    other = rs.build(sample, seed=6)
    assert [r.url for r in other] != [r.url for r in corpus]


def test_truth_is_on_main_content_not_on_the_template(corpus):
    """Pages of one site share their template: whole texts look alike, main contents do not."""
    sets = rs.shingles(corpus)
    pairs = rs.overlaps(sets)
    whole = shingle_sets([r.text for r in corpus])
    pages = [n for n, r in enumerate(corpus) if r.kind == "page"]
    truth = rs.reference(sets, pairs, excerpts=False)
    for n, record in enumerate(corpus):
        if record.kind in ("near", "markup"):
            source = next(i for i in pages if corpus[i].id == record.source)
            assert truth[n][0] == "duplicate" or truth[source][0] == "duplicate"
    # the pairs are every pair at or above 0.5 (Jaccard, or containment of the later), as brute force finds them
    plain = [set(s.tolist()) for s in sets]
    brute = {}
    for i in range(len(plain)):
        for j in range(i + 1, len(plain)):
            both = len(plain[i] & plain[j])
            jaccard, contained = both / len(plain[i] | plain[j]), both / len(plain[j])
            if jaccard >= 0.5 or contained >= 0.5:
                brute[(i, j)] = (jaccard, contained)
    assert pairs.keys() == brute.keys()
    assert all(pairs[key] == pytest.approx(value) for key, value in brute.items())
    # some pages of one site look alike only through their template
    alike = [(i, j) for a, i in enumerate(pages) for j in pages[a + 1:a + 40]
             if corpus[i].site == corpus[j].site and _jaccard(whole[i], whole[j]) >= 0.5]
    template_only = [(i, j) for i, j in alike if pairs.get((i, j), (0, 0))[0] < 0.5]
    assert len(template_only) >= len(alike) // 2 > 0
    assert all(truth[j][1] != i for i, j in template_only)


def test_the_reference_scores_itself_perfectly(corpus):
    sets = rs.shingles(corpus)
    pairs = rs.overlaps(sets)
    truth = rs.reference(sets, pairs, excerpts=True)
    decisions, cluster = [], {}
    for n, (record, (status, matched)) in enumerate(zip(corpus, truth)):
        cluster[n] = n if status == "kept" else cluster[matched]
        relation = None
        if status == "duplicate":
            relation = "near" if pairs[(matched, n)][0] >= rs.THRESHOLD else "excerpt"
        decisions.append({"id": record.id, "status": status, "cluster": corpus[cluster[n]].id,
                          "matched": corpus[matched].id if status == "duplicate" else None, "relation": relation})
    figures = rs.rates(rs.score(corpus, decisions, sets, pairs, excerpts=True))
    assert figures["status"] == 1.0
    assert figures["false_merges"] == 0 and figures["below_threshold"] == 0
    assert figures["excerpt_precision"] == 1.0
    assert figures["republished"] == 1.0 and figures["republished_of"] > 0
    assert figures["excerpt"] == 1.0 and figures["excerpt_of"] > 0
    # and a run that keeps everything finds nothing
    kept = [{"id": r.id, "status": "kept", "cluster": r.id, "matched": None, "relation": None} for r in corpus]
    figures = rs.rates(rs.score(corpus, kept, sets, pairs, excerpts=True))
    assert figures["republished"] == 0.0 and figures["status"] < 1.0


@pytest.mark.system
def test_dedup_runs_on_both_forms_and_wears_the_same_names(tmp_path, corpus):
    """``streamdedup dedup`` on the text and HTML forms (and WARC), scored: every record decided, the plants
    counted, and the figures a run makes on the sample (the same decisions from HTML in JSONL and in WARC)."""
    rows = rs.run_all(corpus, tmp_path, {"defaults": []}, ("text", "html", "warc"))
    figures = {form: r for form, _, r in rows}
    assert set(figures) == {"text", "html", "warc"}
    for r in figures.values():
        assert r["pages"] == len(corpus) and r["republished_of"] > 0 and r["near_of"] > 0
        assert 0 <= r["false_merges"] <= 0.05 and r["status"] >= 0.8
    assert figures["text"]["near"] == 1.0  # a copy within a site, a few words changed, is found from text
    html, warc = ({k: v for k, v in figures[form].items() if k != "where" and not _nan(v)} for form in ("html", "warc"))
    assert html == warc
    text = (tmp_path / "text.jsonl").read_text(encoding="utf-8")
    assert text.count("\n") == len(corpus) and '"html"' not in text


def test_learned_blocks_tell_navigation_from_text_a_site_repeats_in_its_pages():
    """Sections' boxes (outside the main content, each on a third of a site's pages) learned as blocks count as
    navigation; a notice repeated in the main content of some pages of another site, learned too, counts as
    main content."""
    import random

    from streamdedup.core.corpus import _Writer

    writer = _Writer(random.Random(3))
    boxes = ["in this section " + " ".join(writer.words(40)) for _ in range(3)]
    notice = "note " + " ".join(writer.words(40))
    records = []
    for n in range(24):
        body = writer.article(6) + (f"\n{notice}\n" + writer.article(3) if n % 4 == 0 else "")
        site = "nav.example" if n % 2 else "text.example"
        text = f"{boxes[n // 2 % 3]}\n{body}" if site == "nav.example" else body
        records.append(rs.Record(f"p{n}", f"https://{site}/{n}", "", site, "sphinx", "page", None, main=body,
                                 text=text))
    learned = rs.learned_blocks(records)
    assert learned["nav.example"][0] >= 30 and learned["nav.example"][1] < 0.1
    assert learned["text.example"][0] >= 30 and learned["text.example"][1] > 0.9
    assert all(shingles == 0 for shingles, _ in rs.learned_blocks(records, window=0).values())
