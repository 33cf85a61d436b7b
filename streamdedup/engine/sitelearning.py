"""A batch's pages through the site templates: each page's content, and the band keys it is looked up by.

Runs in the batch's index transaction, before any document is decided (the
rules are in ``core.templates``): page by page in batch order it moves each
site's learning state, takes the page's content (its shingles without the
template as it stands at that page), signs again the pages whose content is
not their whole shingle set, and writes the sites' new state into the
transaction. The committed state is cached in memory; a batch works on
copies, taken in only once it commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from ..core.prepare import PreparedBatch
from ..core.records import Document
from ..core.signing import SigningConfig, band_keys_of
from ..core.templates import (EMPTY, NOTHING, SiteState, SiteTimeline, TemplateSettings, content_left, content_of,
                              contents_of, count_new_pages, excerpt_text_of, has_own_text, in_sorted, own_text_of,
                              without_repeats)
from ..store.index import IndexTxn
from ..store.sites import load_site, move_site_counts, save_site, shared_template

__all__ = ["SiteTemplates", "BatchContent", "templates_in_advance"]

CACHED_SITES = 200_000  # committed site states kept in memory (the rest are read from the index when needed)
CACHED_BYTES = 1 << 30  # and at most about this much of them (a site's window and sketch: 100-200 KiB)
ADVANCE_WINDOWS = 20_000  # sites whose windows the first pass of ``dedup --learn-first`` holds at once
STORED_CONTENT_BYTES = 64 << 20  # stored candidates' contents kept across batches (``StoredContents``) at most


@dataclass
class BatchContent:
    """Each document row's content shingles, and the templates as they stand at each row."""

    shingles: list  # row -> sorted uint64 content shingles
    timeline: SiteTimeline
    settings: TemplateSettings
    provisional: set  # rows decided while their site was learning: kept, they are looked up again later
    settles: dict  # row -> learning sites whose template changes at that row
    repeats: Optional["BatchRepeats"] = None  # with ``settings.repeats``: what each site repeats, as of each row
    own_texts: dict = field(default_factory=dict)  # row -> its own text (``settings.own_text``), sorted uint32
    own_keys: dict = field(default_factory=dict)  # row -> the band keys of its own text
    excerpt_texts: dict = field(default_factory=dict)  # row -> its content as an excerpt is measured (``lines``)
    probe: Optional[tuple] = field(default=None, repr=False)  # the batch's probed slots (``evidence.probe_slots``)
    stored: Optional["StoredContents"] = field(default=None, repr=False)  # earlier batches' stored contents
    made_stored: dict = field(default_factory=dict, repr=False)  # serial -> what this batch made of one stored before

    def content_of_stored(self, shingles: np.ndarray, site: int, made: Optional[dict] = None,
                          key: Optional[int] = None, timeline: Optional[SiteTimeline] = None,
                          committed: bool = False) -> np.ndarray:
        """A decided document's stored shingles without its site's template as it stands now (or as
        ``timeline`` has it); with ``made`` (``key`` -> the templates a content was made under, and that
        content), made again only when they changed since (a candidate of many rows). ``committed``: ``key`` is
        the serial of a document stored before the batch, whose content earlier batches may have made under
        the same templates (``stored``)."""
        timeline = self.timeline if timeline is None else timeline
        template, shared = timeline.template(site), timeline.shared
        found = None if made is None else made.get(key)
        stored = self.stored if committed else None
        if found is None and stored is not None:
            found = stored.get(key)
        if found is not None and found[0] is template and found[1] is shared:
            return found[2]
        content = content_of(shingles, template, shared, self.settings.min_content_share)
        if made is not None:
            made[key] = template, shared, content
        if stored is not None:
            self.made_stored[key] = template, shared, content
        return content

    def contents_of_stored(self, asked: list, made: dict) -> list:
        """``content_of_stored(shingles, site, made, key, committed=True)`` of each (shingles, the site's template,
        the shared template, key) of ``asked`` (the templates as they stood where each was asked), the same
        contents: those not made before under the same templates made in one kernel call (``contents_of``)."""
        stored, made_stored = self.stored, self.made_stored
        contents: list = [None] * len(asked)
        todo: dict = {}  # (key, template, shared) -> the places asking for it
        for place, (shingles, template, shared, key) in enumerate(asked):
            found = made.get(key)
            if found is None and stored is not None:
                found = stored.get(key)
            if found is not None and found[0] is template and found[1] is shared:
                contents[place] = found[2]
            else:
                todo.setdefault((key, id(template), id(shared)), []).append(place)
        if todo:
            firsts = [asked[places[0]] for places in todo.values()]
            made_now = contents_of([entry[0] for entry in firsts], [entry[1] for entry in firsts],
                                   [entry[2] for entry in firsts], self.settings.min_content_share)
            for (_, template, shared, key), places, content in zip(firsts, todo.values(), made_now):
                made[key] = made_stored[key] = template, shared, content
                for place in places:
                    contents[place] = content
        return contents

    def pair_contents(self, own: np.ndarray, own_site: int, other: np.ndarray, other_site: int,
                      timeline: Optional[SiteTimeline] = None) -> tuple[np.ndarray, np.ndarray]:
        """Two contents (a row's of ``own_site``, a candidate's of ``other_site``) as their pair is verified
        (``TemplateSettings.pair_contents``), by the templates as they stand in ``timeline`` (default: the
        batch's, where deciding is)."""
        timeline = self.timeline if timeline is None else timeline
        return self.pair_contents_under(own, own_site, other, other_site, timeline.template(own_site),
                                        timeline.template(other_site), timeline.row)

    def pair_contents_under(self, own: np.ndarray, own_site: int, other: np.ndarray, other_site: int,
                            own_template: np.ndarray, other_template: np.ndarray,
                            row: int) -> tuple[np.ndarray, np.ndarray]:
        """``pair_contents`` with the sites' templates as they stood at ``row`` (what each site repeats as of it)."""
        own, other = self.settings.pair_contents(own, other, own_template, other_template)
        return self.repeats_left_out(own, own_site, other, other_site, row)

    def repeats_left_out(self, own: np.ndarray, own_site: int, other: np.ndarray, other_site: int,
                         row: int) -> tuple[np.ndarray, np.ndarray]:
        """Two contents of a pair, each without the other's site template (``TemplateSettings.pair_contents``),
        then without what each site repeats as of ``row`` (``without_repeats``), when both sites learn it."""
        repeats = self.repeats
        if repeats is None or own_site == other_site or not (repeats.learns(own_site) and repeats.learns(other_site)):
            return own, other
        return without_repeats(own, other, lambda values: repeats.repeated(values, own_site, row),
                               lambda values: repeats.repeated(values, other_site, row))


class StoredContents:
    """Stored documents' contents as earlier batches made them (serial -> the site template and shared
    template they were made under, and the content), so a candidate of many batches is not made again while
    its templates stand (``BatchContent.content_of_stored``: a template that changed is another array).

    Taken in only once the batch that made them commits (its serials, and
    the templates it made them under, are then the index's); at most
    ``STORED_CONTENT_BYTES`` of contents, then emptied (a cache of a function
    of the stored shingles and the templates: which entries it holds never
    changes a content).
    """

    def __init__(self, limit: int = STORED_CONTENT_BYTES):
        self._limit = limit
        self._made: dict[int, tuple] = {}
        self._bytes = 0

    def get(self, serial: int) -> Optional[tuple]:
        return self._made.get(serial)

    def take_in(self, made: dict) -> None:
        """A committed batch's ``BatchContent.made_stored``."""
        for serial, entry in made.items():
            if self._bytes >= self._limit:
                self.clear()
            before = self._made.get(serial)
            self._bytes += entry[2].nbytes - (before[2].nbytes if before is not None else 0)
            self._made[serial] = entry

    def clear(self) -> None:
        self._made.clear()
        self._bytes = 0


class BatchRepeats:
    """What each site repeats over its new pages (``SiteState.seen`` and ``repeated``) as it stands at any row
    of a batch: the committed state, then the batch's new pages up to that row, in order (so a pair is
    compared alike whatever the batches)."""

    def __init__(self, committed, learns, base: int = 0):
        self._committed = committed  # site -> its committed SiteState (of a site the batch does not touch)
        self.learns = learns
        self.base = base  # row r's new values came into the sites' ``RepeatTable``s stamped base + r + 1
        self.states: dict[int, SiteState] = {}  # the committed state of each site the batch touches
        self.tables: dict = {}  # the ``RepeatTable`` of each site the batch touches that has one
        self._pages: dict[int, list[tuple[int, np.ndarray, bool]]] = {}  # site -> (row, shingles, takes new)
        self._firsts: dict[int, tuple] = {}  # site -> its batch pages' shingles and where each is first, second
        self._counted: dict[int, tuple] = {}  # row -> site, its page, what was fresh, a part of the page or None

    def add(self, site: int, row: int, page: np.ndarray, takes_new: bool, fresh: np.ndarray,
            part: Optional[np.ndarray] = None, part_fresh: Optional[int] = None) -> None:
        """A new page of ``site`` at ``row`` (rows in order); ``takes_new``: its site's ``seen`` takes it;
        ``fresh``: what of it its site had not seen (``SiteState.count_repeats``); ``part``: values of ``page``
        only (the row's content, when it is the page without the shared template), asked about as a whole;
        ``part_fresh``: how many of ``part`` are fresh."""
        self._pages.setdefault(site, []).append((row, page, takes_new))
        self._firsts.pop(site, None)
        self._counted[row] = site, page, fresh, part, part_fresh

    def add_pages(self, site: int, rows: list, pages: list, takes_new: list, fresh: list, parts: list,
                  parts_fresh: list) -> None:
        """``add`` of a site's pages at ``rows`` (in order), each argument a list of one a page."""
        if site not in self.tables:  # the site's table answers without its pages' shingles
            self._pages.setdefault(site, []).extend(zip(rows, pages, takes_new))
            self._firsts.pop(site, None)
        self._counted.update(zip(rows, zip([site] * len(rows), pages, fresh, parts, parts_fresh)))

    def repeated_count(self, values: np.ndarray, site: int, row: int) -> Optional[int]:
        """How many of ``values`` ``repeated`` finds, when that is known without a look-up: ``values`` is the row's
        own counted ``part``, whose fresh values counting numbered; else None."""
        counted = self._counted.get(row)
        if counted is None or counted[0] != site or values is not counted[3] or counted[4] is None:
            return None
        return len(values) - counted[4]

    def repeated(self, values: np.ndarray, site: int, row: int) -> np.ndarray:
        """Which of ``values`` (sorted uint32) are on two or more new pages of ``site`` up to ``row``, this one
        included (as ``SiteState.count_repeats`` page by page would say)."""
        counted = self._counted.get(row)
        if counted is not None and counted[0] == site:  # the row's own page: as its counting found
            if values is counted[3]:  # within the counted page: repeated unless fresh
                return ~in_sorted(values, counted[2])
            return _repeated_of_counted(values, counted[1], counted[2], lambda rest: self._searched(rest, site, row))
        return self._searched(values, site, row)

    def _searched(self, values: np.ndarray, site: int, row: int) -> np.ndarray:
        """``repeated``, from the site's table by the stamps, or from its committed sets and its batch pages."""
        table = self.tables.get(site)
        state = self.states.get(site)
        if state is None:
            state = self._committed(site)
            table = state.matching_table()
        if table is not None:
            return table.repeated_as_of(values, self.base + row + 1)
        repeated = state.repeated.contains(values)
        if site not in self._pages:
            return repeated
        seen = state.seen.contains(values)
        shingles, first, second, takes = self._first_rows(site)
        at = np.searchsorted(shingles, values)
        inside = at < len(shingles)
        inside[inside] = shingles[at[inside]] == values[inside]
        at = at[inside]
        now = np.zeros(len(values), dtype=bool)
        # seen before the batch: repeated once on a batch page; new: when its first batch page took it into
        # ``seen`` (a full ``seen`` takes no more, and the pages after one it refused are refused too)
        now[inside] = np.where(seen[inside], first[at] <= row, takes[at] & (second[at] <= row))
        return repeated | now

    def _first_rows(self, site: int) -> tuple:
        """The shingles of the site's batch pages (sorted, unique), the rows of the first and second pages each
        is on (a large number when none), and whether the first of them took new shingles."""
        found = self._firsts.get(site)
        if found is None:
            pages = self._pages[site]
            page_rows = np.array([row for row, _, _ in pages], dtype=np.int64)  # ascending: pages come in row order
            ordered = _by_value_then_page([page for _, page, _ in pages])
            values = (ordered >> np.uint64(32)).astype(np.uint32)
            at = (ordered & np.uint64(0xFFFFFFFF)).astype(np.int64)  # each value's page
            start = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
            first = page_rows[at[start]]
            second = np.full(len(start), np.iinfo(np.int64).max, dtype=np.int64)
            ends = np.append(start[1:], len(values))
            twice = ends - start >= 2
            second[twice] = page_rows[at[start[twice] + 1]]
            takes = np.array([takes for _, _, takes in pages], dtype=bool)[at[start]]
            found = self._firsts[site] = (values[start], first, second, takes)
        return found


def _repeated_of_counted(content: np.ndarray, counted: np.ndarray, fresh: np.ndarray, repeated) -> np.ndarray:
    """Which of ``content`` (sorted uint32) a new page's site repeats as of the page (``BatchRepeats.repeated``)
    when the page's ``counted`` part was counted and ``fresh`` is what of it the site had not seen: the values of
    ``counted`` are repeated unless fresh, the others (template before the page, or not on the page) are looked
    up by ``repeated(values)``.

    Counting searched the site's sets for the page's shingles already;
    ``BatchRepeats.repeated`` would search them again, and each search is a
    cache miss in up to a quarter of a million values (a third of a
    templated run's deciding went to it).
    """
    if content is counted:
        return ~in_sorted(content, fresh)
    inside = in_sorted(content, counted)
    found = ~in_sorted(content, fresh)
    if not inside.all():
        found[~inside] = repeated(content[~inside])
    return found


def _by_value_then_page(pages: list) -> np.ndarray:
    """Every shingle of ``pages`` (uint32 arrays) with the number of its page, as ``shingle << 32 | page``, sorted:
    by shingle, then by page (one sort of machine words, not a sort by two keys)."""
    sizes = [len(page) for page in pages]
    numbers = np.repeat(np.arange(len(pages), dtype=np.uint64), sizes)
    keyed = np.concatenate(pages).astype(np.uint64) << np.uint64(32) if pages else np.zeros(0, dtype=np.uint64)
    keyed |= numbers
    keyed.sort()
    return keyed


def _count_site_by_site(uncounted: dict, states: dict, repeats: BatchRepeats, shingles) -> dict[int, np.ndarray]:
    """Count the repeats of a batch's new pages (``templates.count_new_pages``, then ``BatchRepeats.add``) site by
    site, each site's pages in row order; ``uncounted``: site -> its pages' (row, (its site's template before
    the page, the shared template before it)); ``shingles``: the batch's (``ShingleBatch``). Returns row -> the page
    without both templates (``SiteState.counted_part_and_rest``'s rest).

    A page's counting depends only on its site's counting state and the
    pages counted before it, and its counted part only on the templates
    before it (nothing else of the batch's plan reads that state, and
    ``add_page`` is told the page is counted), so the answers are those of
    counting in row order. Counting probes the site's table once a value, a
    cache miss in the tables of a few hundred sites; a site's next page
    repeats much of its section's navigation, whose slots are then still
    cached. The batch's pages are counted in one kernel pass.
    """
    counted_states, owners, rows, pairs, firsts = [], [], [], [], []
    for site, pages in uncounted.items():
        firsts.append(len(rows))
        owners.extend([len(counted_states)] * len(pages))
        counted_states.append(states[site])
        rows.extend([row for row, _ in pages])
        pairs.extend([pair for _, pair in pages])
    offsets, at = shingles.offsets, np.array(rows, dtype=np.int64)
    counted, kept, fresh, takes, kept_fresh = count_new_pages(
        counted_states, owners, shingles.hashes, np.stack((offsets[at], offsets[at + 1]), axis=1).ravel(), pairs,
        (at + (repeats.base + 1)).astype(np.uint32))
    for n, row in enumerate(rows):  # the same values as a page by page walk gives them: the same arrays
        if len(kept[n]) == len(counted[n]):
            if len(counted[n]) == offsets[row + 1] - offsets[row]:
                counted[n] = shingles.of(row)
            kept[n] = counted[n]
    for site, start, end in zip(uncounted, firsts, [*firsts[1:], len(rows)]):
        repeats.add_pages(site, rows[start:end], counted[start:end], takes[start:end], fresh[start:end],
                          kept[start:end], kept_fresh[start:end])
    return dict(zip(rows, kept))


class SiteTemplates:
    """The writer's view of the learned templates: committed state cached, batches planned on copies."""

    def __init__(self, settings: TemplateSettings, signing: SigningConfig):
        self.settings = settings
        self.signing = signing
        self._sites: dict[int, SiteState] = {}
        self._bytes = 0  # about what the cached states take
        self._sizes: dict[int, int] = {}  # site -> what its cached state took when cached
        self._shared: Optional[np.ndarray] = None
        self._stamps = 0  # the ``RepeatTable`` stamps batches took so far (a batch's: one past each of its rows)
        self._stored = StoredContents()

    def content(self, txn: IndexTxn, view, batch: PreparedBatch) -> BatchContent:
        """Every row's content, the sites' new state written into ``txn``, and ``view`` keyed by content
        (``view``: ``serial_of_content(content)``, the first decided document of a content, and
        ``use_band_keys(keys)``, told the keys the batch is looked up by)."""
        settings = self.settings
        shared = self._shared_now(txn)
        timeline = SiteTimeline(lambda site: self._committed(txn, site).template, shared)
        whole = self._whole_content(txn, view, batch, shared, timeline)
        if whole is not None:
            return whole
        copies: dict[int, SiteState] = {}
        seen: set[bytes] = set()
        rows, changed = [], []
        provisional, settles = set(), {}
        sites = batch.sites.tolist()
        learns = settings.learns
        base = self._stamp_base(len(sites))
        repeats = BatchRepeats(lambda site: self._committed(txn, site), learns, base) if settings.repeats else None
        uncounted: dict[int, list] = {}  # site -> its new pages' (row, (its template and the shared one before it))
        for i, item in enumerate(batch.items):
            row = batch.row[i]
            if row < 0 or not isinstance(item, Document):
                continue
            site, full = sites[row], batch.shingles.of(row)
            state = copies.get(site)
            if state is None:
                committed = self._committed(txn, site)
                if repeats is not None:
                    committed.with_table()
                state = copies[site] = committed.copy()
                if repeats is not None:
                    repeats.states[site] = committed
                    if state.table is not None:
                        repeats.tables[site] = state.table
            digest = batch.contents[row]
            learning = learns(site)
            # the templates before a new page; whether its repeats are counted (after the rows, site by site)
            before, shared_before, counts = None, shared, False
            if learning and digest not in seen and view.serial_of_content(digest) is None:
                seen.add(digest)
                before, was_settled = state.template, state.settled_for_good()
                counts = repeats is not None and not state.ahead
                if counts:
                    pages = uncounted.setdefault(site, [])
                    pair = pages[-1][1] if pages and pages[-1][1][0] is before and pages[-1][1][1] is shared \
                        else (before, shared)
                    pages.append((row, pair))
                moved = state.add_page(full, settings, counts)
                if not was_settled and state.template is not before:
                    settles.setdefault(row, []).append(site)
                if state.template is not before:
                    timeline.record(row, site, state.template)
                if moved is not None and site:
                    shared = self._moved(txn, moved, shared)
                    timeline.record(row, None, shared)
            if learning and not state.settled_for_good():
                provisional.add(row)
            content = self._row_content(full, state.template, shared,
                                        counts and state.template is before and shared is shared_before)
            rows.append(content)
            if content is not full and content is not None:
                changed.append(row)
        if uncounted:
            kept = _count_site_by_site(uncounted, copies, repeats, batch.shingles)
            changed = sorted(changed + self._contents_of_counted(rows, kept, batch.shingles))
        self._write(txn, copies, shared, batch.hosts)
        view.use_band_keys(self._content_keys(batch, rows, changed))
        lines = batch.short_lines if settings.lines else None
        own, texts = self._own_and_excerpt_texts(sites, rows, repeats, lines) if repeats is not None else ({}, {})
        own_keys = dict(zip(own, band_keys_of(list(own.values()), self.signing))) if own else {}
        content = BatchContent(rows, timeline, settings, provisional, settles, repeats, own, own_keys, texts,
                               stored=self._stored)
        txn.after_commit.append(lambda: self._stored.take_in(content.made_stored))
        return content

    def _row_content(self, full: np.ndarray, template: np.ndarray, shared: np.ndarray,
                     counted: bool) -> Optional[np.ndarray]:
        """A row's content (``content_of``); None when it is its page without both templates, made by counting
        its page (``counted``: it is counted, and its page left the templates as they were:
        ``_contents_of_counted``)."""
        if not len(template) and not len(shared):
            return full
        if counted:
            return None
        return content_of(full, template, shared, self.settings.min_content_share)

    def _contents_of_counted(self, rows: list, kept: dict[int, np.ndarray], shingles) -> list[int]:
        """Fill in the rows ``_row_content`` left to counting, from their pages without both templates (``kept``:
        row -> that, from ``_count_site_by_site``); returns those whose content is not their whole page."""
        changed = []
        for row, rest in kept.items():
            if rows[row] is None:
                full = shingles.of(row)
                rows[row] = content_left(full, rest, self.settings.min_content_share)
                if rows[row] is not full:
                    changed.append(row)
        return changed

    def _whole_content(self, txn: IndexTxn, view, batch: PreparedBatch, shared: np.ndarray,
                       timeline: SiteTimeline) -> Optional[BatchContent]:
        """``content``'s answer when no site of the batch learns or has a template, and no template is shared
        (pages without a URL, by default): every row's content is its whole shingles and no state changes,
        which the row by row plan would find at a microsecond a row. None: the batch needs the plan. With
        ``repeats`` too: a pair is compared without what its sites repeat only when both its pages' sites learn,
        and none of the batch's does."""
        if len(shared):
            return None
        learns = self.settings.learns
        copies: dict[int, SiteState] = {}
        for site in dict.fromkeys(batch.sites.tolist()):  # in the order the plan meets them
            committed = self._committed(txn, site)
            if learns(site) or len(committed.template):
                return None
            copies[site] = committed.copy()
        self._write(txn, copies, shared, batch.hosts)
        view.use_band_keys(batch.keys)
        return BatchContent(batch.shingles.each(), timeline, self.settings, set(), {}, None)

    def _stamp_base(self, rows: int) -> int:
        """The stamp before a batch of ``rows`` rows' first (``RepeatTable``): past every earlier batch's. Near
        the end of uint32 the cached states drop their tables (built again, stamped 0) and stamps start over."""
        if self._stamps + rows + 2 >= 1 << 32:
            for state in self._sites.values():
                state.table = None
            self._stamps = 0
        base = self._stamps
        self._stamps += rows + 1
        return base

    def _committed(self, txn: IndexTxn, site: int) -> SiteState:
        state = self._sites.get(site)
        if state is None:
            state = load_site(txn, site)
            self._cache(site, state)
        return state

    def _cache(self, site: int, state: SiteState) -> None:
        self._bytes -= self._sizes.pop(site, 0)  # a state replaced: its tables and large parts are the new one's
        if len(self._sites) >= CACHED_SITES or self._bytes >= CACHED_BYTES:
            self._sites.clear()
            self._sizes.clear()
            self._bytes = 0
        self._sites[site] = state
        self._sizes[site] = state.nbytes()
        self._bytes += self._sizes[site]

    def _shared_now(self, txn: IndexTxn) -> np.ndarray:
        if self._shared is None:
            self._shared = shared_template(txn, self.settings.min_sites)
        return self._shared

    def _moved(self, txn: IndexTxn, moved: tuple[np.ndarray, np.ndarray], shared: np.ndarray) -> np.ndarray:
        """The shared template after a site's settled template changed."""
        reached, fell = move_site_counts(txn, moved[0], moved[1], self.settings.min_sites)
        if len(reached) == 0 and len(fell) == 0:
            return shared
        return np.union1d(np.setdiff1d(shared, fell), reached).astype(np.uint32)

    def _write(self, txn: IndexTxn, copies: dict[int, SiteState], shared: np.ndarray, hosts: dict) -> None:
        for site, state in copies.items():
            state.settle_counts()
            before = self._committed(txn, site)
            if state.pages != before.pages:
                save_site(txn, site, state, before, hosts.get(site, ""))

        def taken_in() -> None:
            for site, state in copies.items():
                self._cache(site, state)
            self._shared = shared

        txn.after_commit.append(taken_in)

    def _content_keys(self, batch: PreparedBatch, rows: list, changed: list[int]) -> np.ndarray:
        """The batch's band keys, those of rows whose content is not their whole shingle set signed again."""
        if not changed:
            return batch.keys
        keys = batch.keys.copy()
        keys[changed] = band_keys_of([rows[r] for r in changed], self.signing)
        return keys

    def _own_and_excerpt_texts(self, sites: list, rows: list, repeats: BatchRepeats,
                               lines) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """Row -> its own text (``templates.own_text_of``: its content without what its site repeats as of that
        row), for the rows of learning sites that have one (with ``own_text``); and, with ``lines`` (the batch's
        ``short_line_shingles``), row -> its content as an excerpt is measured (``templates.excerpt_text_of``)."""
        settings = self.settings
        learns, share = settings.learns, settings.min_content_share
        own: dict[int, np.ndarray] = {}
        texts: dict[int, np.ndarray] = {}
        if not settings.own_text and lines is None:
            return own, texts
        for row, content in enumerate(rows):
            site = sites[row]
            if learns(site) and len(content):
                out = repeats.repeated_count(content, site, row) if lines is None else None
                if out is not None and not has_own_text(len(content), out, share):
                    continue  # no own text, and no excerpt text asked for
                repeated = repeats.repeated(content, site, row)
                found = own_text_of(content, repeated, share) if settings.own_text else None
                if found is not None:
                    own[row] = found
                text = excerpt_text_of(content, repeated, lines.of(row), 1) if lines is not None else None
                if text is not None:
                    texts[row] = text
        return own, texts

    def seed(self, txn: IndexTxn, templates: dict[int, np.ndarray], hosts: dict,
             counted: Optional[dict] = None) -> int:
        """Settle every site the index has not met yet with its template from ``templates_in_advance``.

        Such a site starts settled with no pages counted, so its first pages
        are decided by that template and its relearning windows fall where a
        single pass puts them. With ``counted`` (site -> ``seen``, ``repeated``
        over all its pages), what the site repeats is known from its first
        page on and not counted again. Returns how many sites were settled so.
        """
        shared = self._shared_now(txn)
        copies: dict[int, SiteState] = {}
        for site, template in templates.items():
            before = self._committed(txn, site)
            if before.pages or before.settled or before.sample:
                continue
            seen, repeated = (counted or {}).get(site, (None, None))
            copies[site] = SiteState(0, True, template) if seen is None else \
                SiteState(0, True, template, seen=seen, repeated=repeated, ahead=True)
            save_site(txn, site, copies[site], before, hosts.get(site, ""))
            shared = self._moved(txn, (EMPTY, template), shared)

        def taken_in() -> None:
            for site, state in copies.items():
                self._cache(site, state)
            self._shared = shared

        txn.after_commit.append(taken_in)
        return len(copies)

    def forget_cache(self) -> None:
        """Drop the cached state (after the index changed under it: a rebuild)."""
        self._sites.clear()
        self._sizes.clear()
        self._bytes = 0
        self._shared = None
        self._stored.clear()


def templates_in_advance(batches: Iterable[PreparedBatch], settings: TemplateSettings,
                         counted: Optional[dict] = None) -> tuple[dict, dict]:
    """Each site's template as its first ``sample_pages`` new pages show it, with the repeated blocks all its
    pages show, and the sites' hosts.

    The first pass of a two-pass offline run (``dedup --learn-first``): the
    same learning as the single pass (new pages only: an exact copy of a
    page read before is not one), done before any page is decided. Sites
    with fewer new pages are left to learn as usual. With ``templates.confirm``
    the first template is what of it the next ``CONFIRM_PAGES`` new pages
    confirm (all of it on a site with fewer). Repeated blocks
    (``templates.window``) are looked for over the whole input, so a
    section's navigation is template from the section's first page on; the
    windows of at most ``ADVANCE_WINDOWS`` sites are held at once (a site
    met again after others took its place starts a new window). With
    ``templates.repeats``, ``counted`` receives what each settled site repeats
    over all its pages (``seen``, ``repeated``; not a site that rested
    without its window: it may have missed none, but is left to count as
    it goes, like a single pass).
    """
    learning: dict[int, SiteState] = {}  # with their windows, by the order sites were last met
    resting: dict[int, SiteState] = {}  # without
    first: dict[int, np.ndarray] = {}  # site -> the template its first sample shows
    hosts: dict[int, str] = {}
    seen: set[bytes] = set()
    tired: set[int] = set()  # sites that rested once
    probing: set[int] = set()  # sites whose first template is being confirmed (``templates.confirm``)
    for batch in batches:
        hosts.update(batch.hosts)
        sites = batch.sites.tolist()
        for item, row in zip(batch.items, batch.row):
            if row < 0 or not isinstance(item, Document):
                continue
            site, digest = sites[row], batch.contents[row]
            if (site in first and site not in probing and not settings.window and not settings.repeats) \
                    or not settings.learns(site) or digest in seen:
                continue
            seen.add(digest)
            state = learning.pop(site, None) or resting.pop(site, None) or SiteState()
            learning[site] = state
            state.add_page(batch.shingles.of(row), settings)
            if state.settled and site not in first:
                first[site] = state.template
                if len(state.probation):
                    probing.add(site)
            elif site in probing and not len(state.probation):
                first[site] = first[site][in_sorted(first[site], state.template)]  # what the next pages confirmed
                probing.discard(site)
            if len(learning) > ADVANCE_WINDOWS:  # the site met longest ago rests without its window
                rested = next(iter(learning))
                resting[rested] = learning.pop(rested)
                resting[rested].forget_window()
                resting[rested].seen = resting[rested].repeated = NOTHING  # bounded: a rested site counts as it goes
                tired.add(rested)
    learning.update(resting)
    if counted is not None and settings.repeats:
        counted.update((site, (learning[site].seen, learning[site].repeated)) for site in first if site not in tired)
    return {site: np.union1d(template, learning[site].blocks).astype(np.uint32) for site, template in first.items()}, \
        hosts
