"""Site templates and excerpts: the learning rules, and decisions on templated pages against a real index."""

from __future__ import annotations

import random

import numpy as np
import pytest

from streamdedup import config as config_module
from streamdedup.core.corpus import _Writer
from streamdedup.core.records import Document, Source
from streamdedup.core.templates import SiteState, TemplateSettings, content_of, in_sorted, kept_rule, learned_template
from streamdedup.core.verify import jaccard
from streamdedup.engine.engine import Engine
from streamdedup.errors import IncompatibleIndexError

SETTINGS = TemplateSettings()


def _pages(*arrays) -> list[np.ndarray]:
    return [np.array(sorted(a), dtype=np.uint32) for a in arrays]


# -- the rules ----------------------------------------------------------------


def test_a_template_is_what_more_than_half_of_the_pages_share_and_at_least_two():
    assert learned_template(_pages({1, 2, 3}), 0.5).tolist() == []
    assert learned_template(_pages({1, 2, 3}, {2, 3, 4}), 0.5).tolist() == [2, 3]
    three = _pages({1, 2, 3}, {2, 3, 4}, {3, 5})
    assert learned_template(three, 0.5).tolist() == [2, 3]  # on 2 of 3 pages: more than half
    four = _pages({1, 2, 3}, {2, 3, 4}, {3, 5}, {3, 6})
    assert learned_template(four, 0.5).tolist() == [3]  # 2 of 4 is not more than half


def test_a_site_learns_from_its_first_pages_then_settles_and_relearns():
    settings = TemplateSettings(sample_pages=3, relearn_every=5)
    site = SiteState()
    pages = _pages({1, 2, 10}, {1, 2, 11}, {1, 2, 12}, {1, 2, 13}, {1, 2, 14})
    assert site.add_page(pages[0], settings) is None and site.template.tolist() == []
    assert site.add_page(pages[1], settings) is None and site.template.tolist() == [1, 2]  # learning: this page counts
    moved = site.add_page(pages[2], settings)
    assert site.settled and moved is not None and moved[1].tolist() == [1, 2] and site.sample == []
    site.add_page(pages[3], settings)
    site.add_page(pages[4], settings)
    assert site.pages == 5 and site.sample == []
    redesign = _pages({7, 8, 20}, {7, 8, 21}, {7, 8, 22})
    assert site.add_page(redesign[0], settings) is None and site.template.tolist() == [1, 2]  # sampled, not yet used
    site.add_page(redesign[1], settings)
    old, new = site.add_page(redesign[2], settings)
    assert (old.tolist(), new.tolist(), site.template.tolist()) == ([1, 2], [1, 2, 7, 8], [1, 2, 7, 8])


def test_content_leaves_the_template_out_unless_too_little_is_left():
    shingles = np.arange(1, 21, dtype=np.uint32)
    template = np.arange(1, 11, dtype=np.uint32)
    assert len(content_of(shingles, template, np.zeros(0, np.uint32), 0.05)) == 10
    shared = np.array([11, 12], dtype=np.uint32)
    assert len(content_of(shingles, template, shared, 0.05)) == 8
    everything = np.arange(1, 21, dtype=np.uint32)
    assert content_of(shingles, everything, shared, 0.05) is shingles  # nothing left: compared whole
    assert content_of(shingles, np.arange(1, 20, dtype=np.uint32), shared, 0.1) is shingles  # 1 of 20 < 10%


def test_settings_survive_the_index_fingerprint():
    for settings in (TemplateSettings(), TemplateSettings(enabled=False),
                     TemplateSettings(True, 16, 0.6, 0, 5, 0.1, True),
                     TemplateSettings(window=16, min_pages=4, min_block=10)):
        assert TemplateSettings.from_fingerprint(settings.fingerprint()) == settings
    made_before = TemplateSettings(neither=False, confirm=False, repeats=False, own_text=False)
    assert made_before.fingerprint() == "p8-s0.5-r200-m3-c0.05-u0"  # made before
    assert TemplateSettings(confirm=False, repeats=False, own_text=False).fingerprint() == "p8-s0.5-r200-m3-c0.05-u0-v2"
    assert TemplateSettings(own_text=False, lines=False).fingerprint() == "p8-s0.5-r200-m3-c0.05-u0-e1-t1-v2"
    assert TemplateSettings(lines=False).fingerprint() == "p8-s0.5-r200-m3-c0.05-u0-o1-e1-t1-v2"  # and own text
    assert TemplateSettings().fingerprint() == "p8-s0.5-r200-m3-c0.05-u0-n1-o1-e1-t1-v2"  # and lines, by default
    assert not TemplateSettings.from_fingerprint("p8-s0.5-r200-m3-c0.05-u0-v2").confirm
    assert TemplateSettings.from_fingerprint("p8-s0.5-r200-m3-c0.05-u0").window == 0
    assert not TemplateSettings.from_fingerprint("p8-s0.5-r200-m3-c0.05-u0").neither


def test_an_index_made_before_pairs_were_verified_on_neither_template_keeps_its_rule():
    before, now = TemplateSettings(neither=False, confirm=False).fingerprint(), TemplateSettings().fingerprint()
    assert kept_rule(before, now) == before
    unconfirmed = TemplateSettings(confirm=False).fingerprint()  # made before templates were confirmed
    assert kept_rule(unconfirmed, now) == unconfirmed
    assert kept_rule(TemplateSettings(neither=False).fingerprint(), now) == TemplateSettings(neither=False).fingerprint()
    assert kept_rule(now, now) == now
    other = TemplateSettings(window=16).fingerprint()
    assert kept_rule(before, other) == other  # other settings: refused as before (``Index``)


def test_a_pair_is_verified_on_what_is_template_on_neither_site():
    """A body whose first 40 shingles its source's site repeats over its pages (in that site's template),
    republished on a site whose template does not hold them."""
    body = np.arange(100, 200, dtype=np.uint32)
    template_a = np.union1d(np.arange(1000, 1030), body[:40]).astype(np.uint32)
    template_b = np.arange(2000, 2030, dtype=np.uint32)
    source, copy = body[40:], body  # each page's own content
    assert jaccard(copy, source) == 0.6
    neither = TemplateSettings()
    assert jaccard(*neither.pair_contents(copy, source, template_b, template_a)) == 1.0
    own = TemplateSettings(neither=False)
    assert jaccard(*own.pair_contents(copy, source, template_b, template_a)) == 0.6
    same_site = neither.pair_contents(copy, source, template_a, template_a)
    assert same_site[0] is copy and same_site[1] is source  # pages of one site: as they are
    few = np.union1d(body[:40], [7]).astype(np.uint32)  # 1 shingle of 41 would be left: below 5%, kept whole
    assert neither.pair_contents(few, source, template_b, template_a)[0] is few


# -- decisions on a real index --------------------------------------------------


class Site:
    """A site with a header, a navigation menu, a sidebar and a footer around each page's body."""

    def __init__(self, name: str, writer: _Writer):
        self.name = name
        self.header = f"{name} home news sport business culture opinion " + " ".join(writer.words(30))
        self.footer = "about us contact advertise careers " + " ".join(writer.words(40)) + f" copyright {name}"

    def page(self, number: int, body: str) -> tuple[str, str]:
        return f"https://www.{self.name}.example/{number}", f"{self.header}\n{body}\n{self.footer}"


def _decide(engine: Engine, pages: list[tuple[str, str, str]], batch: int = 50) -> dict:
    """Decide (id, url, text) pages in batches; the decisions by id."""
    items = [Document(i, text, Source("crawl", -1, n), url) for n, (i, url, text) in enumerate(pages)]
    decided = []
    for start in range(0, len(items), batch):
        decided += engine.decide_batch(engine.prepare(items[start:start + batch]))
    return {d.id: d for d in decided}


def _engine(path, *settings) -> Engine:
    return Engine(config_module.load(None, settings, environ={}), str(path))


@pytest.fixture
def writer():
    return _Writer(random.Random(7))


def _pitfall_three(writer: _Writer, url: bool) -> list[tuple[str, str, str]]:
    """The seed tutorial's case: 20 pages, one long header and footer, five-sentence bodies."""
    head, tail = writer.article(), writer.article()
    return [(f"p{i}", "https://shop.example/p" if url else None, f"{head} {writer.article(5)} {tail}")
            for i in range(20)]


def test_pages_sharing_header_and_footer_are_not_duplicates(tmp_path, writer):
    pages = _pitfall_three(writer, url=True)
    with _engine(tmp_path / "a") as engine:
        decided = _decide(engine, pages, batch=7)
    assert [d.status for d in decided.values()] == ["kept"] * 20


def test_pages_without_a_url_learn_a_template_only_when_asked(tmp_path, writer):
    pages = _pitfall_three(writer, url=False)
    with _engine(tmp_path / "plain") as engine:
        plain = _decide(engine, pages)
    with _engine(tmp_path / "learned", "templates.learn_without_url=true") as engine:
        learned = _decide(engine, pages)
    assert sum(d.status == "duplicate" for d in plain.values()) == 19  # the whole texts are alike (J ~ 0.73)
    assert all(d.status == "kept" for d in learned.values())


def _crawl(writer: _Writer) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """Three sites of 30 pages, interleaved; the last ten pages of b and c republish articles of a."""
    sites = {name: Site(name, writer) for name in "abc"}
    articles = [writer.article(8) for _ in range(30)]
    pages, republished = [], {}
    for n in range(30):
        for name, site in sites.items():
            if name != "a" and n >= 20:
                source = n - 20 + (10 if name == "c" else 0)
                body = writer.edit(articles[source], "light") if n % 2 else articles[source]
                republished[f"{name}{n}"] = f"a{source}"
            else:
                body = articles[n] if name == "a" else writer.article(8)
            url, text = site.page(n, body)
            pages.append((f"{name}{n}", url, text))
    return pages, republished


@pytest.mark.parametrize("excerpts", ["false", "true"])
def test_an_article_republished_inside_another_sites_template_is_found(tmp_path, writer, excerpts):
    pages, republished = _crawl(writer)
    with _engine(tmp_path / "t", f"excerpts.enabled={excerpts}") as engine:
        decided = _decide(engine, pages)
        stats = engine.templates._sites
    for page, source in republished.items():
        if excerpts == "false" and (source == "a0" or int(page[1:]) % 2):
            # a site's first page is stored with its template (nothing was learned yet), and a light edit of
            # a short article may fall below 0.7: without excerpt anchors these may be missed
            continue
        assert (decided[page].status, decided[page].cluster) == ("duplicate", source)
        if int(page[1:]) % 2 == 0:  # a light edit may fall below 0.7: then an excerpt
            assert decided[page].relation == "near" and decided[page].similarity > 0.9
    others = [d for i, d in decided.items() if i not in republished]
    assert all(d.status == "kept" for d in others)
    assert len(stats) == 3 and all(s.settled and len(s.template) > 50 for s in stats.values())


def test_without_templates_the_template_hides_republished_articles(tmp_path, writer):
    pages, republished = _crawl(writer)
    with _engine(tmp_path / "t", "templates.enabled=false") as engine:
        decided = _decide(engine, pages)
    found = sum(decided[p].status == "duplicate" and decided[p].cluster == s for p, s in republished.items())
    assert found < len(republished) / 2


def test_the_same_pages_give_the_same_decisions_whatever_the_batches_and_restarts(tmp_path, writer):
    pages, _ = _crawl(writer)
    _assert_any_batching_and_restart_decide_alike(tmp_path, pages, cuts=(13, 47), batches=(5, 9))


def test_an_excerpt_of_a_long_article_is_found_and_a_later_source_is_kept(tmp_path, writer):
    article = " ".join(writer.article() for _ in range(12))
    excerpt = ". ".join(article.split(". ")[40:52]) + "."
    with _engine(tmp_path / "forward", "excerpts.enabled=true") as engine:
        decided = _decide(engine, [("article", None, article), ("other", None, writer.article()),
                                   ("excerpt", None, excerpt)])
    found = decided["excerpt"]
    assert (found.status, found.relation, found.cluster, found.containment) == ("duplicate", "excerpt", "article", 1.0)
    assert found.similarity < 0.2
    with _engine(tmp_path / "reverse", "excerpts.enabled=true") as engine:
        reverse = _decide(engine, [("excerpt", None, excerpt), ("article", None, article)])
    assert [d.status for d in reverse.values()] == ["kept", "kept"]
    with _engine(tmp_path / "off") as engine:
        off = _decide(engine, [("article", None, article), ("excerpt", None, excerpt)])
    assert off["excerpt"].status == "kept"


def test_an_index_built_with_other_template_settings_is_refused_with_how_to_rebuild(tmp_path, writer):
    with _engine(tmp_path / "t", "templates.enabled=false") as engine:
        _decide(engine, [("a", None, writer.article())])
    with pytest.raises(IncompatibleIndexError, match="(?s)templates.*backfill"):
        _engine(tmp_path / "t")


def test_what_a_sample_learned_stays_template_only_if_the_next_pages_confirm_it():
    """Eight pages are a small sample: a family of pages first (a parameter list on six of them) teaches
    its shared text as template, which the site's next pages do not show. Counted over the next 32 new
    pages, it leaves the template; the navigation on every page stays."""
    navigation, family = {1, 2, 3}, {50, 51, 52}
    first = _pages(*[navigation | (family if n < 6 else set()) | {100 + n} for n in range(8)])
    later = _pages(*[navigation | (family if n % 4 == 0 else set()) | {200 + n} for n in range(32)])
    site = SiteState()
    for page in first:
        site.add_page(page, SETTINGS)
    assert site.settled and site.template.tolist() == [1, 2, 3, 50, 51, 52]
    for page in later[:-1]:
        assert site.add_page(page, SETTINGS) is None
    old, new = site.add_page(later[-1], SETTINGS)  # on 8 of the 32: not confirmed
    assert (old.tolist(), new.tolist(), site.template.tolist()) == ([1, 2, 3, 50, 51, 52], [1, 2, 3], [1, 2, 3])
    assert len(site.probation) == 0
    before = SiteState()
    for page in first + later:
        before.add_page(page, TemplateSettings(confirm=False))  # indexes made before
    assert before.template.tolist() == [1, 2, 3, 50, 51, 52]


def _family(writer: _Writer) -> list[tuple[str, str, str]]:
    """A reference whose first eight pages are of one family of classes (a parameter list shared by six of
    them), then 40 other pages, then a family page and its near copy, whose own text alone is below the
    threshold."""
    head, parameters = writer.article(), " ".join(f"param{n} type{n} value{n}" for n in range(14))
    url = "https://reference.example/class"
    pages = [(f"f{n}", url, f"{head} {parameters if n < 6 else ''} {writer.article(2)}") for n in range(8)]
    pages += [(f"o{n}", url, f"{head} {writer.article(3)}") for n in range(40)]
    words = writer.article(3).split()[:30]
    copy = list(words)
    copy[9], copy[20] = "changed", "altered"
    return pages + [("member", url, f"{head} {parameters} {' '.join(words)}"),
                    ("member-copy", url, f"{head} {parameters} {' '.join(copy)}")]


def test_near_copies_in_a_family_the_first_sample_showed_are_found(tmp_path, writer):
    """The pair is compared with the parameter list once the next pages showed it is not the site's
    template (without confirming, it is kept: its own text alone is below the threshold)."""
    with _engine(tmp_path / "t") as engine:
        decided = _decide(engine, _family(writer), batch=11)
    assert (decided["member-copy"].status, decided["member-copy"].cluster) == ("duplicate", "member")
    assert all(d.status == "kept" for i, d in decided.items() if i != "member-copy")


def test_a_template_confirmed_is_the_same_whatever_the_batches_and_restarts(tmp_path, writer):
    pages = _family(writer)
    _assert_any_batching_and_restart_decide_alike(tmp_path, pages, cuts=(9, 30), batches=(4, 7))  # on probation


def test_an_index_made_before_templates_were_confirmed_keeps_its_rule(tmp_path, writer):
    import dataclasses

    from streamdedup.core.signing import signing_config, template_settings
    from streamdedup.store.index import Index, IndexSettings

    config = config_module.load(None, [], environ={})
    before = dataclasses.replace(template_settings(config), confirm=False).fingerprint()
    Index(IndexSettings(path=str(tmp_path / "old")), dataclasses.replace(signing_config(config), templates=before)).close()
    with _engine(tmp_path / "old") as engine:
        assert not engine.template_settings.confirm
        decided = _decide(engine, _family(writer))
    assert decided["member-copy"].status == "kept"  # as it decided before: the parameter list stays template


def test_learning_first_settles_a_site_with_its_template_as_the_next_pages_confirm_it(tmp_path, writer):
    from streamdedup.engine.sitelearning import templates_in_advance

    pages = _family(writer)
    items = [Document(i, text, Source("crawl", -1, n), url) for n, (i, url, text) in enumerate(pages)]
    parameters = " ".join(f"param{n} type{n} value{n}" for n in range(14))  # as ``_family`` writes them
    with _engine(tmp_path / "t") as engine:
        confirmed, _ = templates_in_advance([engine.prepare(items[:20]), engine.prepare(items[20:])],
                                            engine.template_settings)
        sampled, _ = templates_in_advance([engine.prepare(items)], TemplateSettings(confirm=False))
        family = engine.prepare([Document("p", parameters, Source("x", -1, 0))]).shingles.of(0)
    (template,), (first,) = confirmed.values(), sampled.values()
    assert in_sorted(family, first).all()  # the first sample took the parameter list
    assert not in_sorted(family, template).any() and 0 < len(template) < len(first)


def _assert_any_batching_and_restart_decide_alike(tmp_path, pages, cuts, batches) -> None:
    """``pages`` decided in one batch, one page a batch, and with a restart after each of ``cuts`` pages (the two
    parts in batches of ``batches``): the same decisions every time."""
    with _engine(tmp_path / "one") as engine:
        reference = _decide(engine, pages, batch=len(pages))
    with _engine(tmp_path / "small") as engine:
        assert _decide(engine, pages, batch=1) == reference
    for cut in cuts:
        with _engine(tmp_path / f"cut{cut}") as engine:
            first = _decide(engine, pages[:cut], batch=batches[0])
        with _engine(tmp_path / f"cut{cut}") as engine:
            second = _decide(engine, pages[cut:], batch=batches[1])
        assert {**first, **second} == reference


def test_a_batchs_rekeyed_pages_written_at_once_leave_the_tables_as_written_page_by_page(tmp_path):
    """``write_rekeyed_many``: first pages rekeyed several times in a batch (some of their bands' keys
    unchanged, some pages rekeyed in an earlier batch), written once with their latest keys, leave the
    ``rekeyed`` and ``rekeyed_of`` tables as writing each rekey in turn does, and as deleting and putting each
    changed band of each page at once does."""
    from streamdedup.store.sites import write_rekeyed_many

    rng = np.random.default_rng(3)
    earlier = {serial: rng.integers(0, 6, 32).astype(np.uint64) for serial in range(1, 9)}
    steps = []
    for _ in range(60):
        serial = int(rng.integers(1, 15))
        keys = (earlier.get(serial, rng.integers(0, 6, 32).astype(np.uint64))).copy()
        changed = rng.random(32) < rng.choice([0.0, 0.2, 1.0])
        keys[changed] = rng.integers(0, 6, int(changed.sum())).astype(np.uint64)
        steps.append((serial, keys))
    def written_page_by_page(txn, rekeyed: dict) -> None:  # each changed band deleted and put at once
        for serial, keys in rekeyed.items():
            value = serial.to_bytes(8, "big")
            raw = txn.get("rekeyed_of", value)
            before = np.frombuffer(raw, dtype=">u8").tolist() if raw is not None else []
            for band, key in enumerate(before):
                if band >= len(keys) or keys[band] != key:
                    txn.delete("rekeyed", band.to_bytes(2, "big") + key.to_bytes(8, "big"), value)
            for band, key in enumerate(keys.tolist()):
                if band >= len(before) or before[band] != key:
                    txn.txn.put(band.to_bytes(2, "big") + key.to_bytes(8, "big"), value, db=txn.dbs["rekeyed"])
            txn.txn.put(value, keys.astype(">u8").tobytes(), db=txn.dbs["rekeyed_of"])

    tables = []
    for name, batches, write in (("in_turn", [[{s: k} for s, k in steps]], write_rekeyed_many),
                                 ("at_once", [[dict(steps)]], write_rekeyed_many),
                                 ("by_page", [[{s: k} for s, k in steps]], written_page_by_page)):
        engine = _engine(tmp_path / name)
        engine.index.write(lambda txn: write(txn, earlier))
        for writes in batches:
            engine.index.write(lambda txn: [write(txn, one) for one in writes])
        with engine.index.read() as txn:
            tables.append([list(txn.table_entries(table)) for table in ("rekeyed", "rekeyed_of")])
        engine.close()
    assert tables[0] == tables[1] == tables[2] and len(tables[0][0]) > 200 and len(tables[0][1]) == 14


def test_the_writers_rekeyed_lookups_through_its_filter_find_what_asking_the_table_for_each_slot_finds(tmp_path):
    """``BandTables.lookup_runs`` asks the ``rekeyed`` table, in the writer's transactions, only for the slots
    its filter (``sites.rekeyed_may_hold``, built from the table, then fed by ``write_rekeyed_many``) may hold:
    the same entries as asking for every slot (a reader's transaction), before and after more pages are
    rekeyed, some again with other keys, and after the index is opened again (the filter built from the table);
    a slot written is never left out, and most slots never written are."""
    from streamdedup.core.lsh import band_slots
    from streamdedup.store.sites import rekeyed_may_hold, write_rekeyed_many

    rng = np.random.default_rng(11)

    def rekeyed(serials) -> dict:
        return {serial: rng.integers(0, 1 << 32, 32).astype(np.uint64) for serial in serials}

    def asked(written: dict) -> np.ndarray:
        keys = np.stack(list(written.values()))
        held = band_slots(np.arange(32, dtype=np.uint64)[None, :], keys).ravel()
        return np.unique(np.concatenate([held[rng.random(len(held)) < 0.3],
                                         rng.integers(0, 1 << 37, 5000, dtype=np.uint64)]))

    def found_both_ways(engine, slots) -> list:
        def found(txn) -> list:
            return [run.tolist() for run in engine.bands.lookup_runs(txn, engine.mirror, slots)[1]]

        by_writer = engine.index.write(found)
        with engine.index.read() as txn:
            assert found(txn) == by_writer
        return by_writer

    written = rekeyed(range(1, 41))
    engine = _engine(tmp_path / "index")
    engine.index.write(lambda txn: write_rekeyed_many(txn, written))
    assert len(found_both_ways(engine, asked(written))[0]) > 100
    again = {**rekeyed(range(30, 61)), **{serial: keys for serial, keys in rekeyed(range(1, 5)).items()}}
    engine.index.write(lambda txn: write_rekeyed_many(txn, again))
    written.update(again)
    assert len(found_both_ways(engine, asked(written))[0]) > 100
    keys = np.stack(list(written.values()))
    bands = np.tile(np.arange(32, dtype=np.uint16), len(keys))
    assert engine.index.write(lambda txn: rekeyed_may_hold(txn, bands, keys.ravel())).all()
    assert engine.index.write(lambda txn: rekeyed_may_hold(txn, bands, keys.ravel() ^ np.uint64(1 << 40))).mean() < 0.05
    with engine.index.read() as txn:
        assert rekeyed_may_hold(txn, bands, keys.ravel()) is None  # a reader asks the table for each
    engine.close()
    engine = _engine(tmp_path / "index")
    assert len(found_both_ways(engine, asked(written))[0]) > 100
    engine.close()
