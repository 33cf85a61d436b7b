"""A page's own navigation, learned from what its site repeats (``templates.repeats``).

A documentation page carries, beside its body and its site's template, the
titles of the pages before, after and above it and a table of its own
headings: text no frequency rule makes template (each title is on two or
three pages of the site), which a copy of the body on another site lacks.
With ``templates.repeats``, a pair of pages of two sites is compared
without each page's extra text that is on other pages of its own site.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from streamdedup.core import templates as templates_module
from streamdedup.core.corpus import _Writer
from streamdedup.core.records import Document, Source
from streamdedup.core.shingle import ShingleBatch
from streamdedup.core.templates import (GrowingSet, RepeatTable, SiteState, TemplateSettings, kept_rule, own_text_of,
                                       without_repeats)
from streamdedup.core.excerpts import containment
from streamdedup.core.verify import jaccard
from streamdedup.engine import sitelearning as sitelearning_module
from streamdedup.engine.sitelearning import BatchRepeats
from streamdedup.store.index import FORMAT_VERSION
from test_templates import _decide, _engine


def _u32(values) -> np.ndarray:
    return np.unique(np.asarray(list(values), dtype=np.uint32))


# -- what a site repeats -----------------------------------------------------------------------------


def test_a_site_keeps_the_shingles_of_its_new_pages_and_those_on_two_or_more():
    state, settings = SiteState(), TemplateSettings(repeats=True)
    for page in ([1, 2, 3], [2, 3, 4], [3, 9]):
        state.add_page(_u32(page), settings)
    assert state.seen.tolist() == [1, 2, 3, 4, 9]
    assert state.repeated.tolist() == [2, 3]
    assert len(SiteState().seen) == 0
    off = SiteState()
    off.add_page(_u32([1, 2]), TemplateSettings(repeats=False))
    assert len(off.seen) == 0  # nothing counted when turned off


def test_a_full_site_counts_what_it_has_seen_and_adds_nothing(monkeypatch):
    monkeypatch.setattr(templates_module, "MAX_SEEN", 4)
    state = SiteState()
    state.count_repeats(_u32([1, 2, 3]))
    state.count_repeats(_u32([3, 4, 5]))  # 3 of 4: the page goes in whole
    state.count_repeats(_u32([1, 5, 6]))  # full: 6 is not added, 1 and 5 are counted
    state.count_repeats(_u32([6, 7]))  # 6 was never taken in: not repeated
    assert state.seen.tolist() == [1, 2, 3, 4, 5]
    assert state.repeated.tolist() == [1, 3, 5]


def test_what_a_site_repeats_is_the_same_at_every_row_of_a_batch_as_page_by_page(monkeypatch):
    """``BatchRepeats`` answers from the committed state and the batch's pages up to a row: exactly what the
    site's state holds after that row, whatever the batch holds before and after it (``seen`` fills up
    within some of the batches). Asked at a row of the site's own page, it answers from what counting the page
    found, for the values of the page not in its template (all of them, or the part without a shared template, its
    content) and for the others (its template, values on no page)."""
    monkeypatch.setattr(templates_module, "MAX_SEEN", 300)
    rng = np.random.default_rng(5)
    pages = [_u32([*range(600, 640), *rng.integers(0, 500, 60)]) for _ in range(30)]  # 600-639: the template
    site, settings = 7, TemplateSettings(repeats=True)
    for cut, table in ((0, False), (9, False), (21, False), (0, True), (9, True), (21, True)):
        if table and not templates_module._hashed:
            continue
        committed = SiteState()
        for page in pages[:cut]:
            committed.add_page(page, settings)
        base = 1000 * cut  # the stamps of earlier batches are below the batch's
        repeats = BatchRepeats(lambda s: committed if s == site else SiteState(), settings.learns, base)
        plain = committed.copy()  # counted in the sorted sets, whose ``repeated`` is the expectation
        if table:
            repeats.states[site] = committed
            repeats.tables[site] = committed.with_table()
        sequential, expected, parts = committed.copy(), [], []
        values = np.arange(700, dtype=np.uint32)
        for row, page in enumerate(pages[cut:]):
            takes, counted = sequential.takes_new(), sequential.counted_part(page)  # as ``SiteTemplates`` does
            kept = counted[counted >= 100]  # the counted part without a shared template (values below 100)
            repeats.add(site, row, counted, takes, sequential.count_repeats(counted, base + row + 1), kept)
            sequential.add_page(page, settings, counted=True)
            plain.add_page(page, settings)
            expected.append(np.isin(values, plain.repeated))
            parts.append((counted, kept))
        for row in rng.permutation(len(expected)).tolist():  # asked in any order, once the batch is planned
            assert (repeats.repeated(values, site, row) == expected[row]).all()  # as the row's counting found
            for part in parts[row]:  # its counted part, and that part without the shared template
                assert (repeats.repeated(part, site, row) == expected[row][part]).all()
            assert (repeats._searched(values, site, row) == expected[row]).all()  # from the sets and batch pages
        assert not repeats.repeated(values, site + 1, 0).any()  # a site without pages: nothing repeated


def test_a_batchs_pages_counted_site_by_site_answer_as_counted_in_row_order(monkeypatch):
    """``SiteTemplates.content`` counts a batch's new pages site by site (each site's in row order, in one kernel
    pass a site), not in row order: every row's answers (``BatchRepeats.repeated``), what each counting
    returned and each site's sets once settled are those of counting the rows in turn (two sites interleaved,
    one whose ``seen`` fills up within the batch, in tables and in the sorted sets; a template and a shared one
    that change within the batch)."""
    monkeypatch.setattr(templates_module, "MAX_SEEN", 400)
    rng = np.random.default_rng(3)
    sites = rng.choice([4, 9], 40).tolist()
    pages = [_u32(rng.integers(0, 300 if site == 4 else 1500, 80)) for site in sites]
    shingles = ShingleBatch.of_sets(pages)
    templates = [(_u32(rng.integers(0, 1500, 30)), _u32(rng.integers(0, 1500, 30))) for _ in range(3)]
    templates = [templates[min(2, row // 15)] for row in range(len(pages))]
    values = np.arange(1500, dtype=np.uint32)
    for table in ((False, True) if templates_module._hashed else (False,)):
        answers, sets = [], []
        for by_site in (False, True):
            states = {site: SiteState() for site in (4, 9)}
            if table:
                assert all(state.with_table() is not None for state in states.values())
            repeats = BatchRepeats(lambda s: SiteState(), TemplateSettings(repeats=True).learns, 100)
            uncounted = {}
            kept = {}
            for row, (site, page, (template, shared)) in enumerate(zip(sites, pages, templates)):
                if by_site:
                    uncounted.setdefault(site, []).append((row, (template, shared)))
                else:
                    counted, kept[row] = SiteState(template=template).counted_part_and_rest(page, shared)
                    takes = states[site].takes_new()
                    repeats.add(site, row, counted, takes, states[site].count_repeats(counted, 101 + row), kept[row])
            if by_site:
                kept = sitelearning_module._count_site_by_site(uncounted, states, repeats, shingles)
            answers.append([repeats.repeated(values, site, row).tolist() for row, site in enumerate(sites)] +
                           [repeats._counted[row][2].tolist() for row in range(len(sites))] +
                           [repeats.repeated(kept[row], site, row).tolist() for row, site in enumerate(sites)] +
                           [kept[row].tolist() for row in range(len(sites))])
            for state in states.values():
                state.settle_counts()
            sets.append([(state.seen.tolist(), state.repeated.tolist()) for state in states.values()])
        assert answers[0] == answers[1]
        assert sets[0] == sets[1]
        assert len(sets[1][0][0]) < 400 <= len(sets[1][1][0])  # site 9's ``seen`` filled up, site 4's did not


def _counted_in_turn(pages: list, table: bool) -> tuple[SiteState, list]:
    """A site's state after counting ``pages`` in turn (in its ``RepeatTable`` with ``table``, page n stamped
    n + 1), and what each page's counting returned."""
    state = SiteState()
    if table:
        assert state.with_table() is not None
    returned = [state.count_repeats(page, n + 1).tolist() for n, page in enumerate(pages)]
    state.settle_counts()
    return state, returned


@pytest.mark.skipif(not templates_module._hashed, reason="the kernel's tables")
def test_a_sites_table_counts_as_its_sorted_sets_and_answers_as_of_each_page(monkeypatch):
    """Counted in the kernel's open-addressed table (value 0 included, the table growing, ``seen`` filling
    up), a site returns what the sorted sets return page by page and ends with the same sets, part by part;
    by the stamps, the table tells what was repeated as of each page."""
    monkeypatch.setattr(templates_module, "MAX_SEEN", 900)
    monkeypatch.setattr(templates_module, "MIN_RECENT", 64)
    rng = np.random.default_rng(11)
    pages = [_u32([0, *rng.integers(0, 2000, 90)]) for _ in range(40)]
    sorted_state, expected = _counted_in_turn(pages, table=False)
    state, returned = _counted_in_turn(pages, table=True)
    assert returned == expected
    for part in ("main", "recent"):
        assert getattr(state.seen, part).tolist() == getattr(sorted_state.seen, part).tolist()
        assert getattr(state.repeated, part).tolist() == getattr(sorted_state.repeated, part).tolist()
    assert state.table.matches(len(state.seen), len(state.repeated))
    values = np.arange(2000, dtype=np.uint32)
    for n in range(len(pages)):
        as_of = SiteState()
        for page in pages[:n + 1]:
            as_of.count_repeats(page)
        assert (state.table.repeated_as_of(values, n + 1) == as_of.repeated.contains(values)).all()
    rebuilt = RepeatTable(state.seen, state.repeated)  # as a state read from the index builds it
    assert (rebuilt.repeated_as_of(values, 0) == state.repeated.contains(values)).all()


def _pages_under_templates(rng, pages: int) -> tuple[list, list]:
    """``pages`` random pages (value 0 on some) and the (template, shared) each is counted under: a few of each,
    changing within the pages, some empty, some holding much of the pages."""
    common = rng.integers(0, 3000, 400)
    made = [_u32([*([0] if rng.random() < 0.3 else []), *rng.choice(common, 60), *rng.integers(0, 2**32, 90,
                                                                                          dtype=np.uint64)])
            for _ in range(pages)]
    choices = [templates_module.EMPTY, _u32(common[:150]), _u32(rng.choice(common, 100)), _u32(common[100:])]
    return made, [(choices[int(rng.integers(0, 3))], choices[int(rng.integers(0, 4))] if n % 7 else choices[0])
                  for n in range(pages)]


@pytest.mark.skipif(templates_module._hashed_count_pages is None, reason="the kernel's tables")
@pytest.mark.parametrize("seed", range(3))
def test_a_batchs_pages_counted_in_one_kernel_pass_count_as_page_by_page(monkeypatch, seed):
    """``templates.count_new_pages`` (``_kernel.hashed_count_pages``: each page without its template and the shared
    one, then counted in its site's table) gives each page's counted part, rest, fresh values, whether ``seen``
    took them and the rest's fresh count as ``counted_part_and_rest`` and ``count_repeats`` page by page, with two
    sites' pages interleaved, the templates changing from page to page, the tables growing within the pass (its
    runs of pages written apart) and ``seen`` filling up: the same tables, slot for slot, the same pending
    additions and, settled, the same sets; so does its path without tables (the same answers and sets)."""
    monkeypatch.setattr(templates_module, "MAX_SEEN", 5000)
    monkeypatch.setattr(templates_module, "MIN_RECENT", 64)
    monkeypatch.setattr(templates_module, "CHUNK_VALUES", 1000)  # in runs of a few pages
    rng = np.random.default_rng(seed)
    pages, templates = _pages_under_templates(rng, 90)
    owners = rng.choice([0, 1], len(pages), p=[0.7, 0.3]).tolist()
    shingles = ShingleBatch.of_sets(pages)
    bounds = np.stack((shingles.offsets[:-1], shingles.offsets[1:]), axis=1).ravel()
    stamps = np.arange(1, len(pages) + 1, dtype=np.uint32) + 40
    results, built = {}, {}
    for way in ("page by page", "in one pass", "without tables"):
        states = [SiteState(), SiteState()]
        for n, page in enumerate(pages[:6]):  # a few pages committed before, in small tables
            states[n % 2].count_repeats(page, 3)
        for state in states:
            state.settle_counts()
            if way != "without tables":
                built[way] = len(state.with_table()._slots)
        if way == "page by page":
            found = []
            for owner, page, (template, shared), stamp in zip(owners, pages, templates, stamps.tolist()):
                counted, kept = SiteState(template=template).counted_part_and_rest(page, shared)
                takes = states[owner].takes_new()
                fresh = states[owner].count_repeats(counted, stamp)
                found.append((counted, kept, fresh, takes, int(np.isin(kept, fresh).sum())))
        else:
            found = list(zip(*templates_module.count_new_pages(states, owners, shingles.hashes, bounds, templates,
                                                               stamps)))
        tables = [None if state.table is None else (state.table._slots.tolist(), state.table._meta.tolist())
                  for state in states]
        pending = [[(fresh.tolist(), again.tolist()) for fresh, again in state.pending] for state in states]
        for state in states:
            state.settle_counts()
        results[way] = ([tuple(part.tolist() if isinstance(part, np.ndarray) else part for part in page)
                         for page in found], tables, pending,
                        [(state.seen.tolist(), state.repeated.tolist()) for state in states])
    one, other, plain = results["page by page"], results["in one pass"], results["without tables"]
    assert one == other
    assert one[0] == plain[0] and one[3] == plain[3]
    takes = [page[3] for page, owner in zip(one[0], owners) if owner == 0]
    assert takes[0] and not takes[-1]  # the first site's ``seen`` filled up within the pages
    assert len(other[1][0][0]) >= 4 * built["in one pass"]  # its table grew within the pass, twice or more
    assert sum(0 < len(page[1]) < len(page[0]) for page in one[0]) > 20 and any(page[4] for page in one[0])


@pytest.mark.skipif(templates_module._hashed_count_pages is None, reason="the kernel's tables")
def test_a_batchs_pages_are_refused_by_the_kernel_outside_their_arrays():
    """``_kernel.hashed_count_pages`` reads no value outside the arrays it is given: bounds past the values or the
    templates, an owner past the tables, outputs too short for the pages, sizes not six a page are refused, and so
    is a table left without room by its growth."""
    table = RepeatTable(GrowingSet(), GrowingSet())
    tables = ((table._slots, table._meta),)
    values, templates = _u32(range(1, 50)), _u32(range(10, 20))
    out = [np.empty(49, dtype=np.uint32) for _ in range(4)]
    sizes = np.zeros((1, 6), dtype=np.int64)
    stamps, seen, owner = np.ones(1, dtype=np.uint32), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int32)

    def grown(_, values):
        table._grow(values)
        return table._slots, table._meta

    def counted(bounds, owners=owner, outputs=out, sizes=sizes, grow=grown):
        return templates_module._hashed_count_pages(values, templates, np.array([bounds], dtype=np.int64), tables,
                                                    grow, owners, stamps, seen, 10, *outputs, sizes)

    for bounds in ([0, 50, 0, 10, 0, 0], [0, 49, 0, 11, 0, 0], [0, 49, 5, 4, 0, 0], [-1, 49, 0, 10, 0, 10]):
        with pytest.raises(ValueError):
            counted(bounds)
    good = [0, 49, 0, 10, 0, 0]
    for wrong in ({"owners": np.ones(1, dtype=np.int32)}, {"outputs": [*out[:3], np.empty(48, dtype=np.uint32)]},
                  {"sizes": np.zeros(5, dtype=np.int64)}):
        with pytest.raises(ValueError):
            counted(good, **wrong)
    with pytest.raises(ValueError):  # no room for its 39 values, and a grow that gives none
        counted(good, grow=lambda _, values: (table._slots, table._meta))
    assert counted(good) == 1 and sizes[0].tolist() == [39, 39, 39, 0, 39, 1] and seen.tolist() == [39]
    assert table.sizes() == (39, 0) and len(table._slots) == 2 * 128  # grown, as ``RepeatTable.count`` grows it


@pytest.mark.skipif(templates_module._hashed_moved is None, reason="the kernel's tables")
def test_a_table_grows_in_one_kernel_pass_into_the_slots_its_values_put_in_again_take(monkeypatch):
    """``RepeatTable._grow`` moves the values in one kernel pass (``hashed_moved``): the same slots, stamps and
    counts as putting them in again one by one (value 0, held beside the slots, and stamps of every kind)."""
    rng = np.random.default_rng(4)
    seen = _u32([0, *rng.integers(1, 2**32, 3000, dtype=np.uint64)])
    repeated = seen[rng.random(len(seen)) < 0.4]
    page = _u32(rng.integers(1, 2**32, 50, dtype=np.uint64))
    grown = []
    for moved in (templates_module._hashed_moved, None):
        monkeypatch.setattr(templates_module, "_hashed_moved", moved)
        table = RepeatTable(GrowingSet(seen), GrowingSet(repeated))
        table.count(page, True, 7)
        table._grow(3 * len(seen))
        grown.append(table)
    assert grown[0]._slots.tolist() == grown[1]._slots.tolist()
    assert grown[0]._meta.tolist() == grown[1]._meta.tolist() and grown[0].sizes()[0] == len(seen) + 50
    assert (grown[0].repeated_as_of(seen, 0) == np.isin(seen, repeated)).all()


@pytest.mark.skipif(not templates_module._hashed, reason="the kernel's tables")
def test_a_table_a_batch_moved_without_committing_is_built_again():
    """A batch counts in the table its copy shares with the committed state; if the batch does not commit,
    the committed state's table is ahead of it, and the next batch's copy gets one built from its sets."""
    rng = np.random.default_rng(2)
    pages = [_u32(rng.integers(0, 500, 80)) for _ in range(12)]
    committed = SiteState()
    for page in pages[:6]:
        committed.count_repeats(page)
    table = committed.with_table()
    dropped = committed.copy()
    for n, page in enumerate(pages[6:9]):
        dropped.count_repeats(page, 100 + n)
    assert not table.matches(len(committed.seen), len(committed.repeated))
    again = committed.copy()
    assert again.table is table  # shared, and behind nothing: the next batch builds its own
    assert committed.with_table() is not table
    retried = committed.copy()
    reference = committed.copy()
    reference.table = None
    for page in pages[6:]:
        assert retried.count_repeats(page, 200).tolist() == reference.count_repeats(page).tolist()
    retried.settle_counts()
    assert retried.seen.tolist() == reference.seen.tolist() and retried.repeated.tolist() == reference.repeated.tolist()


def test_a_batch_that_did_not_commit_decides_and_counts_again_as_one_that_did(tmp_path, writer, monkeypatch):
    """A batch whose index transaction fails after its sites counted their pages (their tables moved): the
    same batch decided again, and the rest, decide and count as an uninterrupted run."""
    from streamdedup.engine import sitelearning

    pages, _ = _doc_crawl(writer)

    def counts(engine):
        return {site: (state.seen.tolist(), state.repeated.tolist()) for site, state in engine.templates._sites.items()}

    with _engine(tmp_path / "one") as engine:
        reference = _decide(engine, pages, batch=10)
        counted = counts(engine)
    save = sitelearning.save_site
    with _engine(tmp_path / "failed") as engine:
        decided = _decide(engine, pages[:30], batch=10)
        monkeypatch.setattr(sitelearning, "save_site", lambda *args: (_ for _ in ()).throw(RuntimeError("down")))
        with pytest.raises(RuntimeError):
            _decide(engine, pages[30:40], batch=10)
        monkeypatch.setattr(sitelearning, "save_site", save)
        decided.update(_decide(engine, pages[30:], batch=10))
        assert counts(engine) == counted
    assert decided == reference


def test_stored_candidates_contents_are_made_once_while_their_templates_stand(tmp_path, writer, monkeypatch):
    """A stored page that is a candidate of several batches has its content made once while its site's template
    and the shared one stand (``StoredContents``), with the same decisions as when every batch makes it again."""
    from streamdedup.engine import sitelearning

    pages, _ = _doc_crawl(writer)
    made = []
    content_of = sitelearning.content_of
    monkeypatch.setattr(sitelearning, "content_of", lambda *args: made.append(1) or content_of(*args))
    contents_of = sitelearning.contents_of  # a batch's templated pairs' contents, made at once
    monkeypatch.setattr(sitelearning, "contents_of", lambda shingles, *args: made.extend([1] * len(shingles))
                        or contents_of(shingles, *args))
    with _engine(tmp_path / "kept") as engine:
        kept = _decide(engine, pages, batch=10)
        kept_made = len(made)
    made.clear()
    monkeypatch.setattr(sitelearning.StoredContents, "get", lambda self, serial: None)
    with _engine(tmp_path / "again") as engine:
        again = _decide(engine, pages, batch=10)
    assert kept == again
    assert kept_made < len(made)


def test_a_batch_that_did_not_commit_leaves_no_stored_contents(tmp_path, writer, monkeypatch):
    """The contents a batch made of stored candidates are kept for later batches only once it commits."""
    from streamdedup.engine import engine as engine_module

    pages, _ = _doc_crawl(writer)
    write = engine_module.write_documents
    with _engine(tmp_path / "failed") as engine:
        _decide(engine, pages[:60], batch=10)
        stored = set(engine.templates._stored._made)
        assert stored
        monkeypatch.setattr(engine_module, "write_documents", lambda *args: (_ for _ in ()).throw(RuntimeError("down")))
        with pytest.raises(RuntimeError):
            _decide(engine, pages[60:], batch=len(pages))
        assert set(engine.templates._stored._made) == stored
        monkeypatch.setattr(engine_module, "write_documents", write)
        _decide(engine, pages[60:], batch=len(pages))
        assert set(engine.templates._stored._made) > stored


# -- a pair compared without what each page's site repeats ------------------------------------------


def test_each_page_loses_its_extra_text_repeated_on_its_site_and_nothing_both_hold():
    body = np.arange(100, 200, dtype=np.uint32)
    source_navigation, host_navigation = np.arange(1000, 1030, dtype=np.uint32), np.arange(2000, 2020)
    source, copy = _u32([*body, *source_navigation]), _u32([*body, *host_navigation])
    on_source_site = lambda values: (values >= 1000) | (values < 120)  # its navigation, and 20 shingles of the body
    on_host_site = lambda values: values >= 2000
    assert jaccard(source, copy) == 100 / 150
    a, b = without_repeats(source, copy, on_source_site, on_host_site)
    assert a.tolist() == body.tolist() and b.tolist() == body.tolist()  # what both hold stays
    nothing = lambda values: np.zeros(len(values), dtype=bool)
    a, b = without_repeats(source, copy, nothing, nothing)
    assert jaccard(a, b) == 100 / 150


def test_an_extra_that_is_most_of_the_page_stays():
    """An excerpt's source: its extra is the rest of its body (on other pages of its site too, say); the
    excerpt loses its host's navigation, and is then wholly contained."""
    body = np.arange(100, 400, dtype=np.uint32)
    excerpt = _u32([*body[:100], *np.arange(2000, 2020)])
    everywhere = lambda values: values >= 0
    source, part = without_repeats(body, excerpt, everywhere, everywhere)
    assert source is body
    assert containment(part, source) == 1.0 and jaccard(part, source) == 1 / 3


def test_a_page_keeps_its_extra_beside_a_longer_page_with_more_of_its_own():
    """A page and a longer one holding part of it: the page's extra repeated on its site is not left out
    while the other has more extra of its own (its containment in the longer page is not raised)."""
    body = np.arange(100, 400, dtype=np.uint32)
    page = _u32([*body[:100], *np.arange(2000, 2020)])  # a third of the body, and text its site repeats
    nothing = lambda values: np.zeros(len(values), dtype=bool)
    longer, part = without_repeats(body, page, nothing, lambda values: values >= 2000)
    assert longer is body and part is page
    assert containment(part, longer) == 100 / 120


def test_edits_weigh_the_same_on_both_sides():
    """Words changed in a copy make shingles of its own (on no other page) and take some of the source's
    away; those the source's site repeats (common phrases) are not all left out, or the pair would look
    closer than it is: the source keeps as many of its extra as the copy has of its own."""
    body = np.arange(100, 200, dtype=np.uint32)
    source = _u32([*body, *np.arange(1000, 1030)])  # navigation 1000-1029; 190-199 edited away in the copy
    copy = _u32([*body[:90], *np.arange(5000, 5010)])  # ten shingles of its edits, on no other page
    common = lambda values: values >= 190  # the source's site repeats its navigation and the edited phrases
    a, b = without_repeats(source, copy, common, lambda values: np.zeros(len(values), dtype=bool))
    assert len(a) == 100 and b is copy  # 30 of its 40 extra out: ten left, as many as the copy's own
    assert jaccard(a, b) == 90 / 110


def test_settings_with_repeats_survive_the_index_fingerprint():
    settings = TemplateSettings(repeats=True)
    assert settings.fingerprint().endswith("-e1-t1-v2")
    assert TemplateSettings.from_fingerprint(settings.fingerprint()) == settings
    assert TemplateSettings().repeats  # on by default
    assert not TemplateSettings.from_fingerprint(TemplateSettings(repeats=False).fingerprint()).repeats


# -- decisions on a real index ----------------------------------------------------------------------


class DocSite:
    """A documentation site: a header and a footer, and on each page the titles of the pages before and
    after it and of its section, a table of its own headings and the titles of its section's pages."""

    def __init__(self, name: str, writer: _Writer, pages: int, section: int = 5):
        self.name = name
        self.section = section  # pages a section has (its pages' "in this section" list)
        self.header = f"{name} documentation home index modules search " + " ".join(writer.words(12))
        self.footer = "copyright the authors built with a generator " + " ".join(writer.words(12))
        self.titles = [" ".join(writer.words(4)) for _ in range(pages)]
        self.headings = [[" ".join(writer.words(5)) for _ in range(3)] for _ in range(pages)]
        self.sections = [" ".join(writer.words(3)) for _ in range(pages // section + 1)]

    def page(self, n: int, body: str, headings=None) -> tuple[str, str]:
        headings = self.headings[n] if headings is None else headings
        titles = self.titles
        nav = (f"next {titles[(n + 1) % len(titles)]} previous {titles[n - 1]} up {self.sections[n // self.section]}")
        paragraphs = body.split(". ")
        third = len(paragraphs) // 3
        text = (f"{titles[n]}\n{headings[0]}\n{'. '.join(paragraphs[:third])}.\n{headings[1]}\n"
                f"{'. '.join(paragraphs[third:2 * third])}.\n{headings[2]}\n{'. '.join(paragraphs[2 * third:])}")
        section = n // self.section * self.section
        toc = ("table of contents\n" + "\n".join(headings) + "\nin this section\n"
               + "\n".join(titles[section:section + self.section]))
        return f"https://{self.name}.example/{n}", f"{self.header}\n{nav}\n{text}\n{toc}\n{nav}\n{self.footer}"


def _doc_crawl(writer: _Writer, *, repeated_article: bool = False):
    """Sites a and b of 40 pages, interleaved in a shuffled order; after them ten pages of b republish bodies
    of a's pages (b's navigation and headings around them). With ``repeated_article``, each article
    republished is on two pages of a."""
    rng = random.Random(3)
    a, b = DocSite("a", writer, 40), DocSite("b", writer, 50)
    articles = [writer.article(10) for _ in range(40)]
    pages = []
    for n in range(40):
        for site in (a, b):
            body = articles[n] if site is a else writer.article(10)
            if repeated_article and site is a and n % 4 == 1:
                body = articles[n - 1]  # the article of the page before, again
            url, text = site.page(n, body)
            pages.append((f"{site.name}{n}", url, text))
    rng.shuffle(pages)
    republished = {}
    for k, n in enumerate(range(0, 40, 4)):
        url, text = b.page(40 + k, articles[n], a.headings[n])  # the article with its headings
        pages.append((f"b{40 + k}", url, text))
        republished[f"b{40 + k}"] = f"a{n}"
    return pages, republished


@pytest.fixture
def writer():
    return _Writer(random.Random(11))


def _found(decided: dict, republished: dict) -> int:
    return sum(decided[page].status == "duplicate" and decided[page].cluster == source
               for page, source in republished.items())


def test_bodies_republished_without_their_pages_navigation_are_found(tmp_path, writer):
    pages, republished = _doc_crawl(writer)
    with _engine(tmp_path / "off", "templates.repeats=false") as engine:
        off = _decide(engine, pages, batch=25)
    with _engine(tmp_path / "on", "templates.repeats=true") as engine:
        on = _decide(engine, pages, batch=25)
    assert _found(off, republished) <= len(republished) // 2  # the source's navigation weighs too much
    assert _found(on, republished) >= len(republished) - 1  # one source is on a's first pages, as it learns
    for decided in (off, on):
        assert all(d.status == "kept" for i, d in decided.items() if i not in republished)


def _short_bodies_in_large_navigation(writer: _Writer):
    """Site a of 40 pages of short articles (five sentences); site b of 40 pages in sections of 20, each page
    listing its section's 20 titles: navigation several times a short body, on many of b's pages. Ten of b's
    pages come after the others, and republish a's articles (b's navigation around them)."""
    rng = random.Random(5)
    a, b = DocSite("a", writer, 40), DocSite("b", writer, 40, section=20)
    articles = [writer.article(5) for _ in range(40)]
    pages, copies, republished = [], [], {}
    for n in range(40):
        pages.append((f"a{n}", *a.page(n, articles[n])))
        if n % 4 == 2:
            copies.append((f"b{n}", *b.page(n, articles[n - 2], a.headings[n - 2])))
            republished[f"b{n}"] = f"a{n - 2}"
        else:
            pages.append((f"b{n}", *b.page(n, writer.article(5))))
    rng.shuffle(pages)
    return pages + copies, republished


def test_a_short_body_in_a_host_page_of_large_navigation_is_looked_up_by_its_own_text(tmp_path, writer):
    """The copy's band keys are mostly its host's navigation, so its source shares too few bands with it; looked
    up by its own text too (``templates.own_text``), it finds its source, a near duplicate of its own text."""
    pages, republished = _short_bodies_in_large_navigation(writer)
    with _engine(tmp_path / "off", "templates.own_text=false") as engine:
        off = _decide(engine, pages, batch=25)
    with _engine(tmp_path / "on") as engine:
        on = _decide(engine, pages, batch=25)
    assert _found(off, republished) <= len(republished) // 2
    assert _found(on, republished) >= len(republished) - 1
    for decided in (off, on):
        assert all(d.status == "kept" for i, d in decided.items() if i not in republished)


def test_explain_shows_the_own_text_similarity_a_decision_took(tmp_path, writer):
    """Copies found by their own text: ``explain`` gives that similarity beside the pair's (below the threshold),
    and the higher of the two is the decision's (no note that it differs)."""
    from streamdedup.engine.explain import explain
    from streamdedup.ops.explained import explanation_lines

    pages, republished = _short_bodies_in_large_navigation(writer)
    with _engine(tmp_path / "on") as engine:
        decided = _decide(engine, pages, batch=25)
        texts = {page: text for page, _, text in pages}
        found = [explain(engine, page, texts=texts) for page, source in republished.items()
                 if decided[page].cluster == source]
    by_own_text = [e for e in found if e.similarity < e.threshold]
    assert len(found) >= len(republished) - 1 and len(by_own_text) >= len(found) // 2
    for explained in by_own_text:
        assert explained.own_text_similarity >= explained.threshold
        assert not [note for note in explained.notes if "differs from the decision" in note]
        assert any(line.lstrip().startswith("own text") for line in explanation_lines(explained))


def test_a_page_looked_up_by_its_own_text_decides_alike_whatever_the_batches_and_restarts(tmp_path, writer):
    """Sources and copies in one batch (found by the batch's own rows), in batches of one (found in the index),
    and across restarts: the same decisions."""
    pages, republished = _short_bodies_in_large_navigation(writer)
    with _engine(tmp_path / "one") as engine:
        reference = _decide(engine, pages, batch=len(pages))
    assert _found(reference, republished) >= len(republished) - 1
    for batch in (1, 7):
        with _engine(tmp_path / f"batch{batch}") as engine:
            assert _decide(engine, pages, batch=batch) == reference
    for cut in (30, 85):
        with _engine(tmp_path / f"cut{cut}") as engine:
            first = _decide(engine, pages[:cut], batch=9)
        with _engine(tmp_path / f"cut{cut}") as engine:
            second = _decide(engine, pages[cut:], batch=13)
        assert {**first, **second} == reference


def test_own_text_is_the_content_without_what_its_site_repeats_when_that_is_most_of_it():
    content = _u32(range(30))
    assert own_text_of(content, np.arange(30) < 10, 0.05) is None  # a third repeated: its keys are close enough
    assert own_text_of(content, np.arange(30) < 11, 0.05).tolist() == list(range(11, 30))
    assert own_text_of(content, np.ones(30, dtype=bool), 0.05) is None  # nothing of its own
    assert own_text_of(content, np.arange(30) < 29, 0.05) is None  # less than ``min_content_share`` left


def test_a_page_with_an_own_text_is_as_similar_as_its_own_text_is():
    from streamdedup.engine.evidence import pair_similarity
    from streamdedup.engine.sitelearning import BatchContent

    later = _u32(range(0, 40))  # 10 of its own, 30 of navigation its site repeats
    earlier = _u32([*range(0, 10), *range(100, 103)])
    content = BatchContent([later], None, TemplateSettings(), set(), {}, own_texts={0: own_text_of(later, later >= 10,
                                                                                                    0.05)})
    assert jaccard(later, earlier) == 10 / 43
    assert pair_similarity(content, 0, later, earlier) == 10 / 13  # its own text against the other page
    assert pair_similarity(None, 0, later, earlier) == 10 / 43


def test_an_article_on_two_pages_of_its_site_keeps_its_text(tmp_path, writer):
    """The same article on two pages of a: its body is on two pages of the site, yet not taken out of a pair
    (a copy is compared with its source on what the pair does not share, and shares the body)."""
    pages, republished = _doc_crawl(writer, repeated_article=True)
    with _engine(tmp_path / "on", "templates.repeats=true") as engine:
        on = _decide(engine, pages, batch=25)
    assert _found(on, republished) >= len(republished) - 1  # as when the article is on one page


def test_the_same_pages_give_the_same_decisions_whatever_the_batches_and_restarts(tmp_path, writer):
    pages, _ = _doc_crawl(writer)
    with _engine(tmp_path / "one", "templates.repeats=true") as engine:
        reference = _decide(engine, pages, batch=len(pages))
    with _engine(tmp_path / "small", "templates.repeats=true") as engine:
        assert _decide(engine, pages, batch=1) == reference
    for cut in (17, 61):  # a restart after the first ``cut`` pages
        with _engine(tmp_path / f"cut{cut}", "templates.repeats=true") as engine:
            first = _decide(engine, pages[:cut], batch=6)
        with _engine(tmp_path / f"cut{cut}", "templates.repeats=true") as engine:
            second = _decide(engine, pages[cut:], batch=11)
        assert {**first, **second} == reference


def test_a_growing_set_merges_its_recent_part_into_its_main_part_past_its_size(monkeypatch):
    monkeypatch.setattr(templates_module, "MIN_RECENT", 4)
    grown = GrowingSet()
    grown = grown.with_values(_u32([10, 20, 30]))
    assert grown.main.tolist() == [] and grown.recent.tolist() == [10, 20, 30]
    grown = grown.with_values(_u32([5, 25]))  # 5 recent > max(4, 0): merged
    assert grown.main.tolist() == [5, 10, 20, 25, 30] and grown.recent.tolist() == []
    before = grown
    grown = grown.with_values(_u32([1, 40]))
    assert grown.main is before.main and grown.recent.tolist() == [1, 40]  # the main part untouched
    assert before.recent.tolist() == []  # immutable: the committed set is not changed by an addition
    assert grown.contains(_u32([1, 2, 5, 40, 41])).tolist() == [True, False, True, True, False]
    assert grown.tolist() == [1, 5, 10, 20, 25, 30, 40] and len(grown) == 7
    assert grown.with_values(_u32([])) is grown


def test_a_growing_set_keeps_its_recent_part_in_chunks_it_appends_to(monkeypatch):
    """Additions go into the last chunk while it holds fewer than ``RECENT_CHUNK`` values, else start one; an
    addition taking the chunks past the main part merges them all into it."""
    monkeypatch.setattr(templates_module, "MIN_RECENT", 4)
    monkeypatch.setattr(templates_module, "RECENT_CHUNK", 3)
    grown = GrowingSet(_u32(range(100, 120)))
    grown = grown.with_values(_u32([1, 2]))
    first = grown.chunks[0]
    grown = grown.with_values(_u32([3, 4]))  # the first chunk held 2 < 3: grown
    assert [chunk.tolist() for chunk in grown.chunks] == [[1, 2, 3, 4]]
    before = grown
    grown = grown.with_values(_u32([9]))  # 4 >= 3: a chunk of its own, the first untouched
    assert [chunk.tolist() for chunk in grown.chunks] == [[1, 2, 3, 4], [9]]
    assert grown.chunks[0] is before.chunks[0] and first.tolist() == [1, 2] and grown.main is before.main
    assert grown.recent.tolist() == [1, 2, 3, 4, 9] and len(grown) == 25
    assert grown.contains(_u32([0, 3, 9, 100, 121])).tolist() == [False, True, True, True, False]
    grown = grown.with_values(_u32(range(200, 216)))  # 21 recent > 20: all merged
    assert grown.chunks == () and len(grown.main) == 41 and grown.tolist() == sorted(grown.main.tolist())


@pytest.mark.parametrize("seed", range(4))
def test_a_growing_set_settled_a_batch_at_a_time_has_the_parts_and_chunks_of_one_added_at_a_time(monkeypatch,
                                                                                                  seed):
    """``_settled_set`` (a batch's additions merged at once) gives the main part and the chunks of
    ``with_values`` page by page, whatever the batches: the index holds the same arrays under the same keys."""
    monkeypatch.setattr(templates_module, "MIN_RECENT", 64)
    monkeypatch.setattr(templates_module, "RECENT_CHUNK", 40)
    rng = np.random.default_rng(seed)
    values = rng.permutation(np.arange(1, 20000, dtype=np.uint32))
    sizes = rng.integers(0, 30, 300)
    cuts = np.cumsum(sizes)
    additions = [np.sort(values[end - size:end]) for size, end in zip(sizes, cuts)]
    one = GrowingSet()
    for addition in additions:
        one = one.with_values(addition)
    batched, start = GrowingSet(), 0
    while start < len(additions):
        end = start + int(rng.integers(1, 40))
        batched = templates_module._settled_set(batched, additions[start:end])
        start = end
    assert batched.main.tolist() == one.main.tolist() and len(one.main) and len(one.chunks) > 1
    assert [chunk.tolist() for chunk in batched.chunks] == [chunk.tolist() for chunk in one.chunks]


def _stored_parts(engine, site: int) -> dict:
    """The ``site_templates`` entries of a site's ``seen`` and ``repeated``: key suffix -> values."""
    with engine.index.read() as txn:
        key = site.to_bytes(8, "big")
        return {k[8:]: np.frombuffer(v, dtype="<u4").tolist() for k, v in txn.table_entries("site_templates")
                if k[:8] == key and k[8:9] in (b"s", b"S", b"r", b"R")}


def test_a_sites_sets_are_written_chunk_by_chunk_and_read_back_as_written(tmp_path, monkeypatch):
    """A batch writes the chunks it grew or added, and deletes the chunks once they merged into the main part;
    the site reads back with the same parts and chunks."""
    monkeypatch.setattr(templates_module, "MIN_RECENT", 8)
    monkeypatch.setattr(templates_module, "RECENT_CHUNK", 4)
    from streamdedup.store.sites import load_site, save_site
    rng = np.random.default_rng(5)
    with _engine(tmp_path / "i") as engine:
        before, state = SiteState(), SiteState()
        for batch in range(12):
            state = before.copy()
            for _ in range(3):
                state.count_repeats(_u32(rng.integers(0, 200, 5)))
                state.pages += 1
            state.settle_counts()
            engine.index.write(lambda txn: save_site(txn, 7, state, before, "docs.example"))
            stored = _stored_parts(engine, 7)
            for part, grown in ((b"S", state.seen), (b"R", state.repeated)):
                chunks = [stored[part + (n.to_bytes(2, "big") if n else b"")] for n in range(len(grown.chunks))]
                assert chunks == [chunk.tolist() for chunk in grown.chunks]
                assert len([key for key in stored if key[:1] == part]) == len(grown.chunks)  # none left behind
            with engine.index.read() as txn:
                loaded = load_site(txn, 7)
            for mine, theirs in ((loaded.seen, state.seen), (loaded.repeated, state.repeated)):
                assert mine.main.tolist() == theirs.main.tolist()
                assert [chunk.tolist() for chunk in mine.chunks] == [chunk.tolist() for chunk in theirs.chunks]
            before = loaded
        assert len(state.seen.main) and len(state.seen.chunks) and 0 < len(state.repeated)


def test_an_index_written_before_chunks_reads_its_recent_part_as_one_chunk_and_counts_on(tmp_path, monkeypatch):
    """An index made before chunks holds a site's whole recent part under its first chunk's key: read back as
    one chunk (past ``RECENT_CHUNK``, so a new page starts another), the site counts on to the sets of a site
    counted from the start."""
    monkeypatch.setattr(templates_module, "MIN_RECENT", 64)
    monkeypatch.setattr(templates_module, "RECENT_CHUNK", 8)
    from streamdedup.store.sites import load_site, save_site
    rng = np.random.default_rng(6)
    pages = [_u32(rng.integers(0, 1000, 12)) for _ in range(14)]
    whole = SiteState()
    for page in pages:
        whole.count_repeats(page)
    with _engine(tmp_path / "old") as engine:
        counted = SiteState()
        for page in pages[:10]:
            counted.count_repeats(page)
        counted.pages = 10
        old_seen, old_repeated = np.asarray(counted.seen), np.asarray(counted.repeated)
        old = SiteState(pages=10, seen=GrowingSet(old_seen[:-20]), repeated=GrowingSet(old_repeated[:-2]))
        engine.index.write(lambda txn: save_site(txn, 7, old, SiteState(), "docs.example"))

        def old_layout(txn):  # the recent parts whole under the "S" and "R" keys, as a version before chunks wrote
            for part, values in ((b"S", old_seen[-20:]), (b"R", old_repeated[-2:])):
                txn.txn.put((7).to_bytes(8, "big") + part, values.astype("<u4").tobytes(), db=txn.dbs["site_templates"])
        engine.index.write(old_layout)
        _mark_format(engine.index, 7)
        with engine.index.read() as txn:
            loaded = load_site(txn, 7)
        assert [len(chunk) for chunk in loaded.seen.chunks] == [20] and len(loaded.repeated.chunks) == 1
        assert loaded.seen.tolist() == old_seen.tolist() and loaded.repeated.tolist() == old_repeated.tolist()
        state = loaded.copy()
        for page in pages[10:]:
            state.count_repeats(page)
        state.pages = 14
        engine.index.write(lambda txn: save_site(txn, 7, state, loaded, "docs.example"))
        with engine.index.read() as txn:
            again = load_site(txn, 7)
            marked = json.loads(txn.get("meta", b"index"))["format"]
    assert marked == FORMAT_VERSION  # chunks in the order added: a release of format 7 refuses the index
    assert again.seen.tolist() == whole.seen.tolist() and again.repeated.tolist() == whole.repeated.tolist()
    assert len(again.seen.chunks) > 1 and again.seen.chunks[0].tolist() == old_seen[-20:].tolist()
    assert again.seen.main.tolist() == old_seen[:-20].tolist()  # not merged: the chunks hold fewer values


def test_the_same_decisions_and_counts_whatever_the_batches_when_the_sets_merge(tmp_path, writer, monkeypatch):
    """With a small ``MIN_RECENT`` every site's sets merge many times over the crawl: batches of one page,
    restarts (each reading the sites' two parts back from the index) and one batch decide and count alike."""
    monkeypatch.setattr(templates_module, "MIN_RECENT", 16)
    pages, _ = _doc_crawl(writer)

    def counts(engine):
        return {site: (state.seen.tolist(), state.repeated.tolist()) for site, state in engine.templates._sites.items()}

    with _engine(tmp_path / "one") as engine:
        reference = _decide(engine, pages, batch=len(pages))
        counted = counts(engine)
        assert any(len(state.seen.main) and len(state.seen.recent) for state in engine.templates._sites.values())
    with _engine(tmp_path / "small") as engine:
        assert _decide(engine, pages, batch=1) == reference
        assert counts(engine) == counted
    decided = {}
    for start, batch in ((0, 6), (23, 11), (61, 5)):  # a restart at 23 and 61: the sets read back from the index
        with _engine(tmp_path / "cut") as engine:
            decided.update(_decide(engine, pages[start:[23, 61, len(pages)][[0, 23, 61].index(start)]], batch=batch))
    assert decided == reference
    with _engine(tmp_path / "cut") as engine:
        engine.templates.forget_cache()
        with engine.index.read() as txn:
            from streamdedup.store.sites import load_site
            stored = {site: (load_site(txn, site).seen.tolist(), load_site(txn, site).repeated.tolist())
                      for site in counted}
    assert stored == counted


def test_an_index_made_before_repeats_were_on_by_default_keeps_deciding_without_them():
    before = TemplateSettings(repeats=False).fingerprint()
    now = TemplateSettings().fingerprint()
    assert kept_rule(before, now) == before
    older = TemplateSettings(repeats=False, confirm=False, neither=False).fingerprint()
    assert kept_rule(older, now) == older
    no_own_text = TemplateSettings(own_text=False).fingerprint()
    assert kept_rule(no_own_text, now) == no_own_text  # made before pages were looked up by their own text
    made_before_both = TemplateSettings(own_text=False, repeats=False).fingerprint()
    assert kept_rule(made_before_both, now) == made_before_both
    assert kept_rule(now, TemplateSettings(repeats=False).fingerprint()) == before  # asked off: refused (``Index``)


def test_pages_sharing_header_and_footer_are_still_not_duplicates(tmp_path, writer):
    """The seed's Pitfall 3 (20 pages of one site, one long header and footer): pages of one site are
    compared as before."""
    head, tail = writer.article(), writer.article()
    pages = [(f"p{i}", "https://shop.example/p", f"{head} {writer.article(5)} {tail}") for i in range(20)]
    with _engine(tmp_path / "a", "templates.repeats=true") as engine:
        decided = _decide(engine, pages, batch=7)
    assert [d.status for d in decided.values()] == ["kept"] * 20


def test_learning_first_counts_every_page_of_a_site_once_before_deciding(tmp_path, writer):
    """``dedup --learn-first``: what each site repeats is counted over all its pages in the first pass (a
    source's neighbours coming after its copy count too), and not again while deciding: the same counts a
    single pass has at its end."""
    pages, republished = _doc_crawl(writer)
    items = [Document(i, text, Source("crawl", -1, n), url) for n, (i, url, text) in enumerate(pages)]
    with _engine(tmp_path / "one", "templates.repeats=true") as engine:
        one = _decide(engine, pages, batch=25)
        single = {site: (state.seen.tolist(), state.repeated.tolist())
                  for site, state in engine.templates._sites.items()}
    with _engine(tmp_path / "first", "templates.repeats=true") as engine:
        assert engine.learn_templates_first([engine.prepare(items[:50]), engine.prepare(items[50:])]) == 2
        first = _decide(engine, pages, batch=25)
        states = engine.templates._sites
        assert all(state.ahead for state in states.values())
        assert {site: (state.seen.tolist(), state.repeated.tolist()) for site, state in states.items()} == single
    assert _found(first, republished) == len(republished) >= _found(one, republished)
    assert all(d.status == "kept" for i, d in first.items() if i not in republished)


def test_explain_compares_a_pair_as_its_decision_did(tmp_path, writer):
    import streamdedup

    pages, republished = _doc_crawl(writer)
    with _engine(tmp_path / "on", "templates.repeats=true") as engine:
        decided = _decide(engine, pages, batch=25)
    page = next(p for p, source in republished.items() if decided[p].cluster == source)
    with streamdedup.open(tmp_path / "on", readonly=True, templates={"repeats": True}) as index:
        explained = index.explain(page, texts={page: dict((i, t) for i, _, t in pages)[page]})
    assert explained.similarity == pytest.approx(decided[page].similarity, abs=0.05)  # counts as of now
    assert explained.similarity >= 0.7


def test_a_batchs_probed_slots_and_its_own_texts_merged_as_a_sort_by_slot_then_row_finds_them():
    """``evidence._slots_and_rows_merged``: the (slot, row) pairs of a batch's sorted slots and of its own texts'
    (slots shared between rows and between the two, a row's slot in both), each once and sorted by slot then
    row, as ``np.lexsort`` orders them; also past what one machine word holds (the lexsort path)."""
    from streamdedup.core.lsh import sorted_slots
    from streamdedup.engine.evidence import _slots_and_rows_merged

    rng = np.random.default_rng(5)
    for rows, own, top in ((300, 90, 1 << 32), (3, 2, 1 << 32), (1, 1, 1 << 32), (300, 300, 1 << 62)):
        keys = rng.integers(0, 40, (rows, 32)).astype(np.uint64) * np.uint64(top // 64)
        own_rows = np.sort(rng.choice(rows, own, replace=False))
        own_keys = np.where(rng.random((own, 32)) < 0.5, keys[own_rows], rng.integers(0, 40, (own, 32)) * (top // 64))
        slots, of, _ = sorted_slots(keys)
        more, at, _ = sorted_slots(own_keys.astype(np.uint64))
        merged = _slots_and_rows_merged(slots, of, more, own_rows[at])
        both, rows_of = np.concatenate((slots, more)), np.concatenate((of, own_rows[at]))
        order = np.lexsort((rows_of, both))
        pairs = sorted(set(zip(both[order].tolist(), rows_of[order].tolist())))
        assert list(zip(merged[0].tolist(), merged[1].tolist())) == pairs
        assert merged[0].dtype == np.uint64 and merged[1].dtype == np.int64
        assert len(pairs) < len(both)  # pairs in both were there


def _mark_format(index, number: int) -> None:
    """The index's meta as a streamdedup of format ``number`` left it (its opening record, and the open index's)."""
    def marked(txn):
        meta = json.loads(txn.get("meta", b"index"))
        txn.txn.put(b"index", json.dumps({**meta, "format": number}).encode(), db=txn.dbs["meta"])
    index.write(marked)
    index.meta["format"] = number
