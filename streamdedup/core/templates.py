"""Site templates, learned as pages arrive: which shingles are a site's navigation, banners and footers.

A page's *content* is its shingle set without the shingles of its site's
template and of the templates many sites share; near duplicates and
excerpts are found and verified on content, so two pages of one site are
not duplicates because they share a template, and an article republished
inside another site's template still matches its source.

How a site's template is learned (the seed tutorial's document-frequency
filter, run per site and as pages arrive):

- A site is the host of the page's URL (``core.sites``). Pages without a
  URL learn nothing and lose only the templates many sites share, unless
  ``learn_without_url`` makes them one site of their own: two pages without
  a URL are not assumed to share a template, and the first pages of a site
  cannot be near duplicates of each other (below), which would surprise
  anyone deduplicating plain text.
- Only *new* pages count: a page whose normalized text the index has seen
  before (a replay, an exact copy) is not a page of the site's sample.
- **Learning.** The first ``sample_pages`` new pages of a site are its
  sample. While it fills, the template is every shingle found on more than
  ``share`` of the sample's pages and on at least two, the page being
  decided included. So the second page of a new site loses exactly what it
  shares with the first: two pages of a new site are never near duplicates
  of each other because of a template (nor, while the sample fills, because
  of content they share: a within-site copy among a site's first pages is
  missed unless exact; see docs/pages/crawler-pages.md, "While a site is learning").
- **Settled.** Once the sample is full, the template is what it shows.
  Every ``relearn_every`` new pages of the site the next ``sample_pages``
  pages are sampled again, and what they show is added (a redesign is
  learned that way; the old template stays, so pages decided before it
  keep the content they were compared by).
- **First pages.** The kept pages a site had while learning were looked up
  by what was known then; when the site settles they are looked up again
  by their content under the settled template (``rekeyed``), so an article
  first seen on a site's first page is still found when republished.
- **Repeated blocks** (off unless ``window`` is set). Navigation that
  changes by section (a box listing the section's pages, breadcrumbs,
  previous and next links, a section's footer, a featured box) is on many
  of a site's pages but not on most of them. The last ``window`` new pages
  of a site are kept (each as its shingles that were not template when it
  came); a shingle of a new page is template when it is on at least
  ``min_pages`` of them, the page included, *in a block*: at least
  ``min_block`` of the page's shingles are on exactly the same pages of the
  window (a box of navigation is; a common phrase repeated by chance is
  not), and the block is at most half of the new shingles of most of the
  pages it is on (navigation is beside each page's own text; an article
  shown on several pages of the site, a print version or a page moved to
  another section, is the main text of its pages and stays content). Blocks
  are added to the template and never taken out. Off by default: on real
  documentation sites text repeated in the main content (API references'
  inherited members, shared option descriptions) is learned too, and pages
  of one site that are mostly that text (a family of class templates) lose
  most of their content to it, so near duplicates among them are missed
  (docs/pages/crawler-pages.md has the figures).
- **A page's own navigation** (``repeats``, on by default since 2026-12-06;
  indexes made before keep deciding without it). What a page holds
  beside its body and its site's template is mostly navigation of its own:
  the titles of the pages before, after and above it, a table of its
  headings, its section's menu. Each title is on two or three pages of the
  site (its own page's heading, its neighbours' links), too few for any
  frequency rule, but a copy of the body on another site lacks all of it.
  Each site keeps the shingles of its new pages (``seen``) and those on
  two or more of them (``repeated``), and a pair of pages of two sites is compared
  without each page's extra text that is on two or more pages of its site
  (``without_repeats``: never what both pages hold, and only while that is
  a minor part of the page).
- **A page's own text** (``own_text``, with ``repeats``; on by default
  since 2026-12-06, indexes made before keep deciding without it). A short
  body in a host page whose navigation is two to five times its size has
  band keys made mostly of that navigation, so its source elsewhere is not
  even a candidate. A page more than ``REPEAT_SHARE`` of whose content is
  text its site repeats (as of that page) is also looked up by the band keys
  of the rest, its own text (``own_text_of``; looked up only, never filed),
  and is a near duplicate of a candidate when its own text is
  (``evidence.pair_similarity``: the larger of the pair's Jaccard and its own
  text's). Only for the single worker: site templates are refused by a
  deployment that splits the band tables by key.
- **An excerpt without its host page's navigation** (``lines``, with
  ``repeats`` and excerpts on; indexes made before keep deciding without
  it). An excerpt put in a documentation page keeps that page's table of
  contents and its neighbours' titles, on other pages of the site too,
  which its source lacks. Text a site repeats is not all navigation (a
  passage quoted on several of its pages is body text); navigation is
  lines of a few words. Each page's shingles within its runs of short lines
  are read as it is prepared (``core.prepare.short_line_shingles``), and
  its containment in a page of another site is also measured without
  those its site repeats (``excerpt_text_of``).
- **Across sites.** A shingle in the settled templates of at least
  ``min_sites`` sites (a shared cookie banner, a CMS footer) is template on
  every page, of every site and of pages without a URL.
- **Nothing left.** A page whose content is less than ``min_content_share``
  of its shingles (a page that is all template, a crawler trap's pages with a
  few changing words) is compared as a whole.
- **A pair of pages** is verified on what is template on *neither* of their
  sites (``TemplateSettings.pair_contents``): each page's content less the other site's
  template too. A site's template may hold text of its pages' main content
  (repeated blocks learn an API reference's inherited members), which the
  same body republished on another site keeps; compared so, the copy loses
  it as its source did. Indexes made before keep comparing each page's own
  content (``TemplateSettings.neither``, ``kept_rule``).

Everything here is a function of the input in its order, never of batch
boundaries or timing: the state moves page by page and is committed with
each batch's decisions, so a restart, a replay or a backfill learns and
decides exactly as an uninterrupted run. Template shingles are kept as the
top 32 bits of the shingle hashes.

Memory, per site: the template (at most ``MAX_TEMPLATE`` shingles, 256 KiB;
past that no block is added), the sample being learned (``sample_pages``
pages), and with repeated blocks the window: ``window`` pages of at most
``MAX_WINDOW_PAGE`` shingles (16 pages: at most 256 KiB, about 50 KiB for
pages of 800 words) and a count-min sketch of them (two rows of ``BUCKETS``
8-bit counters, 64 KiB), rebuilt from the window when the site is read from the index. With ``repeats``,
the shingles seen on the site's new pages (at most ``MAX_SEEN``, 1 MiB; past it shingles seen before are
still counted, new ones no longer) and those seen on two or more (as many at most), each a ``GrowingSet``
(a batch appends to and writes its last chunk, at most 4 KiB and a page, and the chunks its pages added,
unless they merged into the large part), and both in one ``RepeatTable`` while the site's state is cached
(8 bytes a slot, at most two thirds full: up to 4 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .sites import NO_SITE

try:
    from . import _kernel

    _sorted_member, _sorted_without, _sorted_union = _kernel.sorted_member, _kernel.sorted_without, _kernel.sorted_union
    _growing_member, _new_and_again = _kernel.growing_member, _kernel.new_and_again
    _sorted_without_each = getattr(_kernel, "sorted_without_each", None)
    _hashed = getattr(_kernel, "hashed_count", None) is not None
    _hashed_moved = getattr(_kernel, "hashed_moved", None)
    _hashed_count_pages = getattr(_kernel, "hashed_count_pages", None)
    _contents_without = getattr(_kernel, "contents_without", None)
except ImportError:  # built without a C compiler: numpy's searchsorted and sort, the same answers
    _sorted_member = _sorted_without = _sorted_union = _growing_member = _new_and_again = _sorted_without_each = None
    _hashed, _hashed_moved, _hashed_count_pages, _contents_without = False, None, None, None

__all__ = ["TemplateSettings", "SiteState", "GrowingSet", "RepeatTable", "NOTHING", "learned_template", "content_of",
           "contents_of",
           "content_left", "in_sorted", "kept_rule", "reads_lines", "excerpt_text_of", "without_repeats",
           "own_text_of", "has_own_text", "count_new_pages", "SiteTimeline", "EMPTY",
           "MAX_TEMPLATE", "MAX_WINDOW_PAGE"]

EMPTY = np.zeros(0, dtype=np.uint32)
MAX_TEMPLATE = 65536  # template shingles a site gets from repeated blocks at most
MAX_WINDOW_PAGE = 4096  # shingles a page keeps in the window (the lowest hashes: a fixed sample of a larger page)
BUCKETS = 1 << 15  # counters a row of the window's sketch (an upper bound of the pages a shingle is on)
BLOCK_SHARE = 0.5  # a block is at most this share of the new shingles of most of the pages it is on
MAX_SEEN = 1 << 18  # shingles a site remembers having seen, for ``repeats`` (1 MiB; past it no page adds any)
REPEAT_SHARE = 1 / 3  # a page's extra text repeated on its site is left out of a pair when at most this share of it
ONCE = 0xFFFFFFFF  # a ``RepeatTable``'s stamp of a value seen on one page (never repeated as of any stamp)
MIN_RECENT = 4096  # a ``GrowingSet``'s chunks merge into its main part past this size (and the main part's)
RECENT_CHUNK = 1024  # values a ``GrowingSet``'s last chunk takes more of (4 KiB, and a page: written whole)
BUCKET_VALUES = 8  # values a bucket holds on average
CHUNK_VALUES = 1 << 14  # a batch's new pages are counted in runs of about this many values (``count_new_pages``)
CONFIRM_PAGES = 32  # new pages of a site over which what a sample learned is counted again (``confirm``)
_NEITHER = "-v2"  # the fingerprint's mark of pairs verified on what is template on neither site
_CONFIRMED = "-t1"  # the fingerprint's mark of templates confirmed over the pages after their sample
_REPEATS = "-e1"  # the fingerprint's mark of pairs compared without what each site repeats (``repeats``)
_OWN_TEXT = "-o1"  # the fingerprint's mark of pages looked up by their own text too (``own_text``)
_LINES = "-n1"  # the fingerprint's mark of excerpts measured without their short lines the site repeats (``lines``)
# rules an index made before them keeps deciding without
_ADDED_SINCE = (_LINES, _OWN_TEXT, _REPEATS, _CONFIRMED, _NEITHER)


@dataclass(frozen=True)
class TemplateSettings:
    """The ``[templates]`` section (part of the index's fingerprint)."""

    enabled: bool = True
    sample_pages: int = 8  # new pages of a site sampled to learn its template
    share: float = 0.5  # a shingle on more than this share of the sampled pages is template
    relearn_every: int = 200  # new pages of a site between two relearning samples (0: never relearn)
    min_sites: int = 3  # a shingle templated on this many sites is template everywhere
    min_content_share: float = 0.05  # below this share of content left, a page is compared as a whole
    learn_without_url: bool = False  # pages without a URL form one site whose template is learned too
    window: int = 0  # recent new pages of a site where repeated blocks are looked for (0: none; 16 to learn them)
    min_pages: int = 3  # a block on this many pages of the window (the new page included) is template
    min_block: int = 8  # shingles on exactly the same pages of the window that make a block
    neither: bool = True  # a pair is verified on what is template on neither site (False: indexes made before)
    repeats: bool = True  # a cross-site pair leaves out each page's extra text repeated on other pages of its site
    confirm: bool = True  # what a sample learned stays template only if on most of the next pages (False: made before)
    own_text: bool = True  # with ``repeats``: a page mostly of text its site repeats is looked up by the rest too
    lines: bool = True  # with ``repeats``: an excerpt is measured without its short lines' text its site repeats

    def learns(self, site: int) -> bool:
        """Whether pages of ``site`` teach and use a site template (pages without a URL: if asked to)."""
        return site != NO_SITE or self.learn_without_url

    def fingerprint(self) -> str:
        """The settings as the index records them ("off", or each value after its letter)."""
        if not self.enabled:
            return "off"
        text = (f"p{self.sample_pages}-s{self.share:g}-r{self.relearn_every}-m{self.min_sites}"
                f"-c{self.min_content_share:g}-u{int(self.learn_without_url)}")
        if self.window:
            text += f"-w{self.window}-k{self.min_pages}-b{self.min_block}"
        if self.lines and self.repeats:
            text += _LINES
        if self.own_text:
            text += _OWN_TEXT
        if self.repeats:
            text += _REPEATS
        if self.confirm:
            text += _CONFIRMED
        return text + _NEITHER if self.neither else text

    def pair_contents(self, own: np.ndarray, other: np.ndarray, own_template: np.ndarray,
                      other_template: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Two pages' contents as their pair is verified: with ``neither``, each without the other's site
        template too (``own_template``, ``other_template``: their sites' templates as they stand).

        A page's content is its shingles less its own site's template. Text a
        site repeats over its pages' main content (an API reference's
        inherited members, learned as repeated blocks) is out of its pages'
        content, yet in a copy republished on another site, whose template
        does not hold it: compared on their own contents, a copy and its
        source diverge by all of it. Compared on what is template on neither
        site, the copy loses it too. Pages of one site (one template) are
        compared as they are; a page with less than ``min_content_share`` of
        its content left keeps it (``content_of``).
        """
        if not self.neither or own_template is other_template:
            return own, other
        share = self.min_content_share
        return content_of(own, other_template, EMPTY, share), content_of(other, own_template, EMPTY, share)

    @classmethod
    def from_fingerprint(cls, text: str) -> "TemplateSettings":
        """The settings an index recorded with ``fingerprint``."""
        if text == "off":
            return cls(enabled=False)
        values = {part[0]: part[1:] for part in text.split("-")}
        blocks = (int(values["w"]), int(values["k"]), int(values["b"])) if "w" in values else (0, 3, 8)  # none
        return cls(True, int(values["p"]), float(values["s"]), int(values["r"]), int(values["m"]), float(values["c"]),
                   values["u"] == "1", *blocks, "v" in values, values.get("e") == "1", values.get("t") == "1",
                   values.get("o") == "1", values.get("n") == "1")


@dataclass(frozen=True)
class GrowingSet:
    """A set of uint32 shingles that grows by a page's worth at a time: a large sorted part merged rarely and
    recent additions in chunks, each its additions in the order they came (never two parts holding a value).

    A site's ``seen`` shingles grow to hundreds of thousands; inserting each
    new page's few hundred into one sorted array moves the whole array at
    every page, and writing it back moves it again at every batch. Here an
    addition is appended to the last chunk while that holds fewer than
    ``RECENT_CHUNK`` values, else starts a chunk; the chunks are sorted and
    merged into ``main`` once they hold more than it (and more than
    ``MIN_RECENT``). A batch's work and writes follow what it added (a chunk
    of at most ``RECENT_CHUNK`` values and a page, and its new chunks), not
    the size of the set, and each value is merged into ``main`` about twice
    over the set's growth (``RepeatTable``s, not these sets, answer a
    batch's look-ups). Which part and chunk holds a value follows from the
    additions in their order alone, so the state is the same whatever the
    batches. Immutable: ``with_values`` returns a new set (a committed state
    is never changed by the batch working on its copy).
    """

    main: np.ndarray = field(default_factory=lambda: EMPTY)  # sorted uint32
    chunks: tuple = ()  # uint32 arrays (additions in order), none holding a value of ``main`` or of another
    _buckets: Optional[tuple] = field(default=None, repr=False, compare=False)  # (shift, starts) of ``main``
    _recent: Optional[np.ndarray] = field(default=None, repr=False, compare=False)  # the chunks merged, once asked

    def __len__(self) -> int:
        return len(self.main) + self.recent_size

    @property
    def recent_size(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    @property
    def recent(self) -> np.ndarray:
        """The chunks as one sorted array (made once a set, when a look-up without a ``RepeatTable`` asks)."""
        if self._recent is None:
            recent = np.sort(np.concatenate(self.chunks)) if self.chunks else EMPTY
            object.__setattr__(self, "_recent", recent)
        return self._recent

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The whole set, sorted."""
        values = _merged(self.main, self.recent) if self.chunks else self.main
        return values if dtype is None else values.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    @property
    def nbytes(self) -> int:
        return self.main.nbytes + sum(chunk.nbytes for chunk in self.chunks)

    def contains(self, values: np.ndarray) -> np.ndarray:
        """Which of ``values`` (uint32) are in the set."""
        parts = self.kernel_parts() if _growing_member is not None and values.dtype == np.uint32 else None
        if parts is not None:
            found = np.empty(len(values), dtype=bool)
            _growing_member(np.ascontiguousarray(values), *parts, found)
            return found
        found = in_sorted(values, self.main)
        if self.chunks:
            found |= in_sorted(values, self.recent)
        return found

    def kernel_parts(self) -> Optional[tuple[np.ndarray, np.ndarray, int, np.ndarray]]:
        """The set as the kernel reads it (``_kernel.growing_member``): ``main``, where each of its buckets (its
        values of one ``value >> shift``) starts, the last start its length, ``shift``, and ``recent``; None
        when either part is not uint32.

        A site's ``seen`` shingles grow to hundreds of thousands and every
        new page looks its few hundred up in them: a search through the
        whole array costs a dozen unpredictable steps a value, a bucket of
        ``BUCKET_VALUES`` values a short walk. The starts are made once for
        a ``main`` (which changes rarely) and handed on to the sets grown
        from it.
        """
        main, recent = np.ascontiguousarray(self.main), np.ascontiguousarray(self.recent)
        if main.dtype != np.uint32 or recent.dtype != np.uint32:
            return None
        if self._buckets is None:
            shift = 32 - max(0, (len(main) // BUCKET_VALUES).bit_length() - 1)
            starts = np.empty((1 << (32 - shift)) + 1, dtype=np.uint32)
            _kernel.bucket_starts(main, shift, starts)
            object.__setattr__(self, "_buckets", (shift, starts))
        shift, starts = self._buckets
        return main, starts, shift, recent

    def with_values(self, values: np.ndarray) -> "GrowingSet":
        """The set with ``values`` (sorted uint32, none of them in it)."""
        if not len(values):
            return self
        if _merges(self.recent_size + len(values), len(self.main)):
            return GrowingSet(_merged(self.main, _sorted_all([*self.chunks, values])))
        if self.chunks and len(self.chunks[-1]) < RECENT_CHUNK:
            return GrowingSet(self.main, (*self.chunks[:-1], np.concatenate((self.chunks[-1], values))), self._buckets)
        return GrowingSet(self.main, (*self.chunks, values), self._buckets)


NOTHING = GrowingSet()


def _merges(recent: int, main: int) -> bool:
    """Whether a ``GrowingSet``'s chunks holding ``recent`` values merge into its main part of ``main``."""
    return recent > max(MIN_RECENT, main)


def _settled_set(grown: GrowingSet, additions: list) -> GrowingSet:
    """``grown`` after ``with_values`` of each of ``additions`` in turn (sorted uint32 arrays, none in it or in
    another): the same parts and chunks, but each merged once (which holds a value follows from the sizes)."""
    additions = [values for values in additions if len(values)]
    sizes = [len(values) for values in additions]
    main_size, recent_size, cut, least = len(grown.main), grown.recent_size, 0, MIN_RECENT
    for n, size in enumerate(sizes):
        recent_size += size
        if recent_size > least and recent_size > main_size:  # ``_merges``
            main_size, recent_size, cut = main_size + recent_size, 0, n + 1
    if cut:
        grown = GrowingSet(_merged(grown.main, _sorted_all([*grown.chunks, *additions[:cut]])))
    return _chunked(grown, additions[cut:], sizes[cut:])


def _chunked(grown: GrowingSet, additions: list, sizes: list) -> GrowingSet:
    """``grown`` with ``additions`` (sorted uint32 arrays of ``sizes`` values, none empty, none in it or in
    another) put in its chunks as ``with_values`` puts them, none of them reaching the merge into ``main``."""
    if not additions:
        return grown
    chunks, most = list(grown.chunks), RECENT_CHUNK
    size = len(chunks[-1]) if chunks else most
    extends = size < most
    starts = []  # where each chunk added starts in ``additions`` (the first grows the last chunk when ``extends``)
    for n, added in enumerate(sizes):
        if size < most:
            size += added
        else:
            starts.append(n)
            size = added
    bounds = [0, *starts] if extends else starts
    groups = [_joined(additions[start:end]) for start, end in zip(bounds, bounds[1:] + [len(additions)])]
    if extends:
        chunks[-1] = np.concatenate((chunks[-1], groups.pop(0)))
    return GrowingSet(grown.main, (*chunks, *groups), grown._buckets)


def _joined(parts: list) -> np.ndarray:
    """``parts`` (uint32 arrays, at least one) one after the other."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _sorted_all(parts: list) -> np.ndarray:
    """The values of ``parts`` (uint32 arrays, no value in two), sorted."""
    parts = [part for part in parts if len(part)]
    if len(parts) <= 1:
        return parts[0] if parts else EMPTY
    values = np.concatenate(parts)
    values.sort()
    return values


class RepeatTable:
    """A site's ``seen`` and ``repeated`` shingles as one open-addressed hash table in the kernel, moved in place
    page by page (``SiteState.count_repeats``): beside each value seen, when it was first seen again (a stamp;
    ``ONCE`` while it is on one page), so what the site repeats as of any row of a batch is one look-up
    (``repeated_as_of``).

    The sorted ``GrowingSet``s stay what is written to the index, and what
    a table is built from when a site's state is read (its repeated values
    stamped 0): each new page was searched in two sorted arrays (a dozen
    unpredictable steps a value, mostly cache misses) and merged into
    their recent parts (a copy of thousands of values a page); here it is
    one probe a value and an insertion in place, and the sets are merged
    once a batch. A table belongs to the state whose set sizes it
    matches (``matches``): a batch that did not commit leaves it ahead of
    its site's committed state, and the next is built again.
    """

    def __init__(self, seen: GrowingSet, repeated: GrowingSet):
        self._meta = np.zeros(4, dtype=np.uint32)
        self._slots = _empty_slots(len(seen))
        for part in (seen.main, *seen.chunks):
            self._add(part, np.full(len(part), ONCE, dtype=np.uint32))
        for part in (repeated.main, *repeated.chunks):
            self._add(part, np.zeros(len(part), dtype=np.uint32))

    def sizes(self) -> tuple[int, int]:
        """How many values ``seen`` and ``repeated`` hold."""
        return int(self._meta[0]), int(self._meta[3])

    def matches(self, seen: int, repeated: int) -> bool:
        return self.sizes() == (seen, repeated)

    @property
    def nbytes(self) -> int:
        return self._slots.nbytes

    def count(self, page: np.ndarray, takes: bool, stamp: int) -> tuple[np.ndarray, np.ndarray]:
        """``_fresh_and_again`` of a new page (sorted uint32), the fresh values put in when ``takes``, the others
        seen on one page stamped ``stamp``."""
        if takes and 3 * (int(self._meta[0]) + len(page)) > len(self._slots):
            self._grow(int(self._meta[0]) + len(page))
        fresh, again = np.empty(len(page), dtype=np.uint32), np.empty(len(page), dtype=np.uint32)
        sizes = _kernel.hashed_count(np.ascontiguousarray(page), self._slots, self._meta, takes, stamp, fresh, again)
        return fresh[:sizes[0]], again[:sizes[1]]

    def repeated_as_of(self, values: np.ndarray, stamp: int) -> np.ndarray:
        """Which of ``values`` (uint32) were seen again by ``stamp``."""
        found = np.empty(len(values), dtype=bool)
        _kernel.hashed_member(np.ascontiguousarray(values, dtype=np.uint32), self._slots, self._meta, stamp, found)
        return found

    def _add(self, values: np.ndarray, stamps: np.ndarray) -> None:
        _kernel.hashed_add(np.ascontiguousarray(values, dtype=np.uint32), stamps, self._slots, self._meta)

    def _grow(self, values: int) -> None:
        """Move the values into a table with room for ``values``, at most half full."""
        slots, meta = self._slots, self._meta
        self._slots = _empty_slots(values)
        if _hashed_moved is not None:  # in one pass of the kernel: the same values and stamps, the same counts
            _hashed_moved(slots, self._slots, np.zeros(4, dtype=np.uint32))
            self._meta = meta
            return
        held = np.flatnonzero(slots[0::2])
        self._meta = np.zeros(4, dtype=np.uint32)
        self._add(slots[0::2][held], slots[1::2][held])
        if meta[1]:
            self._add(np.zeros(1, dtype=np.uint32), meta[2:3].copy())


def _empty_slots(values: int) -> np.ndarray:
    """An empty ``RepeatTable`` for ``values`` values: the least power of two of slots (key, stamp: uint32 each)
    of which they take at most half."""
    return np.zeros(2 << max(4, (2 * values - 1).bit_length()), dtype=np.uint32)


@dataclass
class SiteState:
    """What the index knows of one site's template."""

    pages: int = 0  # new pages of the site so far
    settled: bool = False  # its first sample is full
    template: np.ndarray = field(default_factory=lambda: EMPTY)  # sorted uint32: the template in use
    sample: list = field(default_factory=list)  # sorted uint32 arrays: the pages sampled so far
    blocks: np.ndarray = field(default_factory=lambda: EMPTY)  # sorted uint32: the repeated blocks found
    window: list = field(default_factory=list)  # slot (new page number % window) -> its new shingles, sorted uint32
    _counts: Optional[np.ndarray] = field(default=None, repr=False, compare=False)  # 2 x BUCKETS uint8, of ``window``
    seen: GrowingSet = field(default_factory=GrowingSet)  # shingles of its new pages (``repeats``)
    repeated: GrowingSet = field(default_factory=GrowingSet)  # those on two or more of them
    ahead: bool = False  # ``seen`` and ``repeated`` were counted over all its pages before any was decided
    probation: np.ndarray = field(default_factory=lambda: EMPTY)  # sorted uint32: learned by the last sample, unconfirmed
    confirmations: np.ndarray = field(default_factory=lambda: EMPTY)  # uint32: pages counted, then each one's pages
    # ``seen`` and ``repeated`` in the kernel's tables, moved page by page, with what each page added to them not
    # yet merged into them (``settle_counts``); shared with the copy a batch works on (``with_table``)
    table: Optional[RepeatTable] = field(default=None, repr=False, compare=False)
    pending: list = field(default_factory=list, repr=False, compare=False)  # (seen's, repeated's) of each page
    pending_seen: int = field(default=0, repr=False, compare=False)  # how many values ``pending`` adds to ``seen``

    def copy(self) -> "SiteState":
        counts = None if self._counts is None else self._counts.copy()
        return SiteState(self.pages, self.settled, self.template, list(self.sample), self.blocks, list(self.window),
                         counts, self.seen, self.repeated, self.ahead, self.probation, self.confirmations,
                         self.table, list(self.pending), self.pending_seen)

    def with_table(self) -> Optional[RepeatTable]:
        """The state's ``RepeatTable`` (built when it has none, or one a batch that did not commit moved ahead),
        when the kernel has the tables and the state counts as it goes."""
        if not _hashed or self.ahead or self.pending:
            return self.table
        if self.matching_table() is None:
            self.table = RepeatTable(self.seen, self.repeated)
        return self.table

    def matching_table(self) -> Optional[RepeatTable]:
        """Its ``table`` if that holds what its sets hold (not one a batch that did not commit moved ahead)."""
        table = self.table
        return table if table is not None and table.matches(len(self.seen), len(self.repeated)) else None

    def settle_counts(self) -> None:
        """Merge what counting added since into ``seen`` and ``repeated``, as page by page merges would have."""
        if self.pending:
            self.seen = _settled_set(self.seen, [fresh for fresh, _ in self.pending])
            self.repeated = _settled_set(self.repeated, [again for _, again in self.pending])
            self.pending, self.pending_seen = [], 0

    def samples_next(self, settings: TemplateSettings) -> bool:
        """Whether the site's next new page goes into a sample."""
        if not self.settled:
            return True
        every = settings.relearn_every
        return every > 0 and self.pages >= every and self.pages % every < settings.sample_pages

    def add_page(self, page: np.ndarray, settings: TemplateSettings,
                 counted: bool = False) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Count a new page (``page``: its sorted uint32 shingles; ``counted``: the caller counts its repeats, its
        ``counted_part`` under the template as it stands before the page: ``count_repeats``, ``count_new_pages``).

        Returns (old, new) settled template when the page completes a sample
        or adds repeated blocks to a settled template (the across-site
        counts then move), else None.
        """
        sampled = self.samples_next(settings)
        if settings.repeats and not self.ahead and not counted:
            self.count_repeats(self.counted_part(page))
        unconfirmed = self._confirm(page, settings.share)
        grew = self._learn_blocks(page, settings)
        self.pages += 1
        if sampled:
            self.sample.append(page)
        if not self.settled:
            self.template = _union(learned_template(self.sample, settings.share), self.blocks)
            if len(self.sample) < settings.sample_pages:
                return None
            self.settled, self.sample = True, []
            self._on_probation(self.template, settings)
            return EMPTY, self.template
        template = self.template
        if len(unconfirmed):
            template = template[~in_sorted(template, unconfirmed)]
        if sampled and len(self.sample) == settings.sample_pages:
            learned = learned_template(self.sample, settings.share)
            self._on_probation(learned[~in_sorted(learned, template)], settings)
            template = np.union1d(template, learned).astype(np.uint32)
            self.sample = []
        elif not grew and not len(unconfirmed):
            return None
        old, self.template = self.template, _union(template, self.blocks)
        return old, self.template

    def settled_for_good(self) -> bool:
        """Whether the site's template is settled and nothing of it is on probation: its pages decided before
        (learning, or while the last sample's template was counted again) are looked up again by their content
        when it changes (``rekeyed``)."""
        return self.settled and not len(self.probation)

    def _on_probation(self, learned: np.ndarray, settings: TemplateSettings) -> None:
        """Put what a sample just learned (sorted uint32) on probation, with what is on it still, counted anew."""
        if not settings.confirm:
            return
        learned = learned[~in_sorted(learned, self.blocks)] if len(self.blocks) else learned
        self.probation = _merged(self.probation, learned) if len(self.probation) else learned
        self.confirmations = np.zeros(len(self.probation) + 1, dtype=np.uint32) if len(self.probation) else EMPTY

    def _confirm(self, page: np.ndarray, share: float) -> np.ndarray:
        """Count a new page of a settled site against what its last sample learned; after ``CONFIRM_PAGES`` pages,
        what is on ``share`` of them or fewer is returned (to leave the template: sorted uint32) and the
        probation ends.

        Eight pages are a small sample: on a reference whose first pages
        happened to be of one family of classes, the shingles of their
        shared parameter lists were on five of the eight and learned as
        template, while they are on a third of the site's pages. Taken out
        of every page, they lowered the similarity of the family's near
        duplicates below the threshold. Counted again over the pages that
        follow, they fall out; navigation, on most pages, stays.
        """
        if not len(self.probation):
            return EMPTY
        counts = self.confirmations.copy()
        counts[0] += 1
        counts[1:] += in_sorted(self.probation, page)
        if counts[0] < CONFIRM_PAGES:
            self.confirmations = counts
            return EMPTY
        unconfirmed = self.probation[counts[1:] <= share * counts[0]]
        self.probation, self.confirmations = EMPTY, EMPTY
        return unconfirmed

    def counted_part(self, page: np.ndarray) -> np.ndarray:
        """What ``repeats`` counts of a new page: its shingles not in the template as it stands before it (the
        template is out of every pair's contents anyway)."""
        return _without(page, self.template, EMPTY) if len(self.template) else page

    def counted_part_and_rest(self, page: np.ndarray, shared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``counted_part`` of a new page, and that without ``shared`` too (its content while the templates stand,
        ``content_left``): one walk of the page for both."""
        return _counted_and_kept(page, self.template, shared)

    def _counted_page(self, page: np.ndarray, template: np.ndarray, shared: np.ndarray, stamp: int) -> tuple:
        """``count_new_pages`` of one of its pages, by ``count_repeats``."""
        counted, kept = _counted_and_kept(page, template, shared)
        takes = self.takes_new()
        fresh = self.count_repeats(counted, stamp)
        return counted, kept, fresh, takes, int(np.count_nonzero(in_sorted(kept, fresh)))

    def takes_new(self) -> bool:
        """Whether ``seen`` takes the shingles it has not seen of the site's next new page."""
        return len(self.seen) + self.pending_seen < MAX_SEEN

    def count_repeats(self, page: np.ndarray, stamp: int = 0) -> np.ndarray:
        """Count a new page's shingles (sorted uint32): those seen before are ``repeated`` (on two or more of the
        site's new pages); the others are added to ``seen`` while it holds fewer than ``MAX_SEEN``
        (``takes_new``). Returns the others (sorted uint32): those of the page its site does not repeat as of
        the page. With a ``table``, counted there (the repeated ones stamped ``stamp``) and merged into the
        sets by ``settle_counts``."""
        if self.table is not None:
            takes = self.takes_new()
            fresh, again = self.table.count(page, takes, stamp)
            self.pending.append((fresh if takes else EMPTY, again))
            self.pending_seen += len(fresh) if takes else 0
            return fresh
        fresh, again = _fresh_and_again(page, self.seen, self.repeated)
        self.repeated = self.repeated.with_values(again)
        if self.takes_new():
            self.seen = self.seen.with_values(fresh)
        return fresh

    def _learn_blocks(self, page: np.ndarray, settings: TemplateSettings) -> bool:
        """Put the page into the window, after adding the repeated blocks it shows; whether any was added."""
        if not settings.window:
            return False
        fresh = page[~in_sorted(page, self.template)] if len(self.template) else page
        found = EMPTY
        if len(self.window) + 1 >= settings.min_pages and len(self.blocks) < MAX_TEMPLATE:
            found = self._repeated_blocks(fresh, settings)
            if len(found):
                self.blocks = _merged(self.blocks, found)
        self._into_window(fresh[:MAX_WINDOW_PAGE], settings.window)
        return len(found) > 0

    def _repeated_blocks(self, fresh: np.ndarray, settings: TemplateSettings) -> np.ndarray:
        """The shingles of ``fresh`` (a new page's) in blocks repeated on the window's pages (sorted uint32)."""
        need, window = settings.min_pages - 1, self.window
        counts = self._window_counts()
        maybe = fresh[counts[0][fresh & (BUCKETS - 1)] >= need]  # the sketch's two rows, one after the other
        if len(maybe) >= settings.min_block:
            maybe = maybe[counts[1][(maybe >> 15) & (BUCKETS - 1)] >= need]
        if len(maybe) < settings.min_block:
            return EMPTY
        pages = np.zeros(len(maybe), dtype=np.uint64)  # bit j: on the window's page j (at most 64 pages)
        times = np.zeros(len(maybe), dtype=np.int64)
        for j, other in enumerate(window):
            on = in_sorted(maybe, other)
            pages |= on.astype(np.uint64) << np.uint64(j)
            times += on
        often = times >= need
        maybe, pages = maybe[often], pages[often]
        if len(maybe) < settings.min_block:
            return EMPTY
        patterns, which, sizes = np.unique(pages, return_inverse=True, return_counts=True)
        chosen = [n for n, (pattern, size) in enumerate(zip(patterns.tolist(), sizes.tolist()))
                  if size >= settings.min_block and _beside_other_text(size, pattern, window, len(fresh))]
        if not chosen:
            return EMPTY
        return maybe[np.isin(which, chosen)]

    def nbytes(self) -> int:
        """The memory its arrays take."""
        arrays = [self.template, self.blocks, self.seen, self.repeated, self.probation, self.confirmations, *self.sample,
                  *self.window]
        return sum(a.nbytes for a in arrays) + (0 if self._counts is None else self._counts.nbytes) + \
            (0 if self.table is None else self.table.nbytes)

    def forget_window(self) -> None:
        """Drop the window (to bound memory); the next pages start another."""
        self.window, self._counts = [], None

    def _window_counts(self) -> np.ndarray:
        """The window's count-min sketch: per row, how many of its pages' shingles fall in each bucket (mod 256)."""
        if self._counts is None:
            self._counts = np.zeros((2, BUCKETS), dtype=np.uint8)
            for page in self.window:
                _count(self._counts, page, 1)
        return self._counts

    def _into_window(self, fresh: np.ndarray, size: int) -> None:
        counts, slot = self._window_counts(), self.pages % size
        if slot < len(self.window):
            _count(counts, self.window[slot], -1)
            self.window[slot] = fresh
        else:
            self.window.append(fresh)
        _count(counts, fresh, 1)


def _fresh_and_again(page: np.ndarray, seen: GrowingSet, repeated: GrowingSet) -> tuple[np.ndarray, np.ndarray]:
    """The values of ``page`` (sorted uint32) not in ``seen``, and those in it but not in ``repeated`` (in one
    kernel call when it is there)."""
    usable = _new_and_again is not None and page.dtype == np.uint32
    seen_parts, repeated_parts = (seen.kernel_parts(), repeated.kernel_parts()) if usable else (None, None)
    if seen_parts is None or repeated_parts is None:
        known = seen.contains(page)
        again = page[known]
        return page[~known], again[~repeated.contains(again)]
    fresh, again = np.empty(len(page), dtype=np.uint32), np.empty(len(page), dtype=np.uint32)
    sizes = _new_and_again(np.ascontiguousarray(page), *seen_parts, *repeated_parts, fresh, again)
    return fresh[:sizes[0]], again[:sizes[1]]


def count_new_pages(states: list, owners: list, values: np.ndarray, bounds: np.ndarray, templates: list,
                    stamps: np.ndarray) -> list:
    """``SiteState.counted_part_and_rest`` and ``count_repeats`` of a batch's new pages in turn: page p is
    ``values[bounds[2p]:bounds[2p + 1]]``, of the site whose state is ``states[owners[p]]`` (each site's pages in
    row order), under ``templates[p]`` (its site's template before it, and the shared one: the same pair object
    for a site's pages under the same two), stamped ``stamps[p]``. Each page's counted part, rest, fresh values,
    whether ``seen`` took them and how many of the rest are fresh (five lists, a page each), as counting the
    pages one by one gives; with the sites' ``table``s, in one kernel pass (``_kernel.hashed_count_pages``)
    instead of a few numpy calls a page."""
    tables = [state.table for state in states]
    laid = _laid_out(templates) if _hashed_count_pages is not None and values.dtype == np.uint32 and \
        all(table is not None for table in tables) else None
    if laid is None:
        found = [states[owner]._counted_page(values[start:end], template, shared, stamp)
                 for owner, start, end, (template, shared), stamp
                 in zip(owners, bounds[0::2].tolist(), bounds[1::2].tolist(), templates, stamps.tolist())]
        return [list(part) for part in zip(*found)] if found else [[] for _ in range(5)]
    flat, spans = laid
    seen = np.array([len(state.seen) + state.pending_seen for state in states], dtype=np.int64)
    seen_before = seen.tolist()
    sizes, chunks = _counted_in_tables(tables, values, flat, np.concatenate((bounds.reshape(-1, 2), spans), axis=1),
                                       np.array(owners, dtype=np.int32), stamps, seen)
    counted, kept, fresh, again = lists = [], [], [], []
    for first, last, parts in chunks:
        chunk = sizes[first:last, :4]
        ends = np.cumsum(chunk, axis=0)
        at = np.concatenate((ends - chunk, ends), axis=1).T.tolist()  # each part's starts, then its ends
        for n, (part, found) in enumerate(zip(parts, lists)):
            found.extend([part[start:end] for start, end in zip(at[n], at[n + 4])])
    takes = (sizes[:, 5] == 1).tolist()
    for owner, page_fresh, page_again, took in zip(owners, fresh, again, takes):
        states[owner].pending.append((page_fresh if took else EMPTY, page_again))
    for state, now, before in zip(states, seen.tolist(), seen_before):
        state.pending_seen += now - before
    return [counted, kept, fresh, takes, sizes[:, 4].tolist()]


def _counted_in_tables(tables: list, values: np.ndarray, templates: np.ndarray, bounds: np.ndarray,
                       owners: np.ndarray, stamps: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, list]:
    """``_kernel.hashed_count_pages`` of the pages (``bounds``: six a page), each site's table grown where
    ``RepeatTable.count`` would grow it (the same slots, stamps and answers as page by page): each page's sizes
    (counted, rest, fresh, again, fresh values of the rest, whether it took them) and, for runs of pages of
    about ``CHUNK_VALUES`` values, (first page, page past the last, the four parts' values, each page's after
    the page before's); ``seen`` moved on.

    The parts of a run are written into arrays of a few hundred KiB, not
    one of the batch's tens of MiB: fresh memory a value is a page fault
    every thousand values, and evicts the tables counting reads.
    """
    def grown(owner: int, room: int) -> tuple[np.ndarray, np.ndarray]:
        table = tables[owner]
        table._grow(room)
        return table._slots, table._meta

    pages = len(stamps)
    sizes = np.empty((pages, 6), dtype=np.int64)
    ends = np.cumsum(bounds[:, 1] - bounds[:, 0])
    cuts = np.searchsorted(ends, np.arange(CHUNK_VALUES, ends[-1] if pages else 0, CHUNK_VALUES)).tolist()
    edges = sorted({0, pages, *(cut for cut in cuts if 0 < cut < pages)})
    slots = tuple((table._slots, table._meta) for table in tables)
    chunks = []
    for first, last in zip(edges, edges[1:]):
        parts = np.empty((4, int(ends[last - 1] - (ends[first - 1] if first else 0))), dtype=np.uint32)
        _hashed_count_pages(values, templates, bounds[first:last], slots, grown, owners[first:last],
                            stamps[first:last], seen, MAX_SEEN, *parts, sizes[first:last])
        slots = tuple((table._slots, table._meta) for table in tables)
        chunks.append((first, last, parts))
    return sizes, chunks


def _laid_out(templates: list) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """Pages' (template, shared) pairs as the kernel reads them: the distinct arrays one after the other, and
    each page's (start, end) of both in that; None when one is not uint32."""
    where: dict[int, tuple[int, int]] = {}
    parts, size, spans, last, span = [], 0, [], None, None
    for pair in templates:
        if pair is not last:
            last, span = pair, []
            for values in pair:
                found = where.get(id(values))
                if found is None:
                    if values.dtype != np.uint32:
                        return None
                    found = where[id(values)] = size, size + len(values)
                    parts.append(values)
                    size += len(values)
                span.extend(found)
        spans.append(span)
    flat = np.concatenate(parts) if len(parts) > 1 else np.ascontiguousarray(parts[0]) if parts else EMPTY
    return flat, np.array(spans, dtype=np.int64).reshape(-1, 4)


def _counted_and_kept(page: np.ndarray, template: np.ndarray, shared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A new page's part counted by ``repeats`` (without its site's ``template`` before it) and that without
    ``shared`` too (``SiteState.counted_part_and_rest``): one walk of the page for both."""
    if not len(template) or not len(shared):
        counted = _without(page, template, EMPTY) if len(template) else page
        return counted, (_without(counted, EMPTY, shared) if len(shared) else counted)
    return _without_each(page, template, shared)


def _buckets(shingles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sketch's two buckets of each shingle: two independent parts of its hash."""
    return shingles & (BUCKETS - 1), (shingles >> 15) & (BUCKETS - 1)


def _count(counts: np.ndarray, page: np.ndarray, step: int) -> None:
    """Add (``step`` 1) or take out (-1) a page's shingles in the sketch; 8-bit counters wrap, and a page taken
    out takes out exactly what it put in."""
    low, high = _buckets(page)
    delta = np.uint8(step & 0xFF)
    np.add.at(counts[0], low, delta)
    np.add.at(counts[1], high, delta)


def _beside_other_text(size: int, pattern: int, window: list, fresh: int) -> bool:
    """Whether a block of ``size`` shingles, on the window's pages ``pattern`` (bit j: page j) and on the new
    page (``fresh`` new shingles), is at most ``BLOCK_SHARE`` of most of them: navigation beside each page's own
    text (a short page may be mostly navigation), not an article that is the main text of several pages."""
    sizes = [fresh] + [len(page) for j, page in enumerate(window) if pattern >> j & 1]
    beside = sum(size <= BLOCK_SHARE * pages for pages in sizes)
    return 2 * beside > len(sizes)


def _union(template: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """``template`` with ``blocks`` (``template`` itself when there are none)."""
    return _merged(template, blocks) if len(blocks) else template


def _merged(one: np.ndarray, other: np.ndarray) -> np.ndarray:
    """The union of two sorted uint32 arrays (sorted; in the kernel the smaller put between the larger's runs when
    both are strictly increasing, as they are but for a caller's mistake, else a merge; without it a stable sort,
    which merges the two runs in linear time)."""
    if _sorted_union is not None and one.dtype == other.dtype == np.uint32:
        union = np.empty(len(one) + len(other), dtype=np.uint32)
        one, other = np.ascontiguousarray(one), np.ascontiguousarray(other)
        size = _sorted_union(one, other, union)
        if size >= 0:
            return union[:size]
    both = np.concatenate([one, other]).astype(np.uint32)
    both.sort(kind="stable")
    return both[np.concatenate(([True], both[1:] != both[:-1]))] if len(both) else both


def learned_template(pages: list[np.ndarray], share: float) -> np.ndarray:
    """The shingles on more than ``share`` of ``pages`` and on at least two of them (sorted uint32)."""
    need = max(2, int(share * len(pages)) + 1)
    if len(pages) < need:
        return EMPTY
    values, counts = np.unique(np.concatenate(pages), return_counts=True)
    return values[counts >= need]


def in_sorted(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in the sorted array ``table`` (uint32 both: in the kernel, the same answer)."""
    if len(table) == 0:
        return np.zeros(len(values), dtype=bool)
    if _sorted_member is not None and values.dtype == np.uint32 and table.dtype == np.uint32:
        found = np.empty(len(values), dtype=bool)
        _sorted_member(np.ascontiguousarray(values), np.ascontiguousarray(table), found)
        return found
    at = np.searchsorted(table, values)
    at[at == len(table)] = 0
    return table[at] == values


def content_of(shingles: np.ndarray, template: np.ndarray, shared: np.ndarray, min_share: float) -> np.ndarray:
    """``shingles`` without those of ``template`` and ``shared`` (the across-site template).

    The whole set when less than ``min_share`` of it would be left (and when
    nothing would be).
    """
    if len(template) == 0 and len(shared) == 0:
        return shingles
    return content_left(shingles, _without(shingles, template, shared), min_share)


def contents_of(shingles: list, templates: list, shareds: list, min_share: float) -> list:
    """``content_of(shingles[i], templates[i], shareds[i], min_share)`` of each, the same arrays: in one kernel
    call when all are uint32 (a batch's stored candidates' contents, gathered), else one by one."""
    if _contents_without is None or not all(a.dtype == np.uint32 and a.flags.c_contiguous
                                            for part in (shingles, templates, shareds) for a in part):
        return [content_of(*asked, min_share) for asked in zip(shingles, templates, shareds)]
    out = np.empty(sum(len(values) for values in shingles), dtype=np.uint32)
    sizes = np.empty(len(shingles), dtype=np.int64)
    _contents_without(shingles, templates, shareds, float(min_share), out, sizes)
    made, at = [], 0
    for values, size in zip(shingles, sizes.tolist()):
        if size < 0:
            made.append(values)
        else:
            made.append(out[at:at + size].copy())
            at += size
    return made


def content_left(shingles: np.ndarray, kept: np.ndarray, min_share: float) -> np.ndarray:
    """``kept`` (what of ``shingles`` is not template), unless it is all of them, none, or less than
    ``min_share`` of them: then ``shingles`` itself."""
    left = len(kept)
    if left == len(shingles) or left == 0 or left < min_share * len(shingles):
        return shingles
    return kept


def _without(values: np.ndarray, template: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """The values in neither sorted table, in their order (in the kernel when all are uint32)."""
    if _sorted_without is not None and values.dtype == template.dtype == shared.dtype == np.uint32:
        kept = np.empty(len(values), dtype=np.uint32)
        left = _sorted_without(np.ascontiguousarray(values), np.ascontiguousarray(template),
                               np.ascontiguousarray(shared), kept)
        return kept[:left]
    drop = in_sorted(values, template)
    if len(shared):
        drop |= in_sorted(values, shared)
    return values[~drop]


def _without_each(values: np.ndarray, template: np.ndarray, shared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_without(values, template, EMPTY)`` and ``_without(values, template, shared)`` (in one kernel call when
    all are uint32)."""
    if _sorted_without_each is None or not values.dtype == template.dtype == shared.dtype == np.uint32:
        rest = _without(values, template, EMPTY)
        return rest, _without(rest, EMPTY, shared)
    rest, kept = np.empty(len(values), dtype=np.uint32), np.empty(len(values), dtype=np.uint32)
    sizes = _sorted_without_each(np.ascontiguousarray(values), np.ascontiguousarray(template),
                                 np.ascontiguousarray(shared), rest, kept)
    return rest[:sizes[0]], kept[:sizes[1]]


def without_repeats(own: np.ndarray, other: np.ndarray, own_repeated, other_repeated) -> tuple[np.ndarray, np.ndarray]:
    """Two pages of two sites as their pair is compared with ``TemplateSettings.repeats``: each without its
    extra text (what the other page lacks) that is on other pages of its own site (``own_repeated(values)``:
    which of ``values``, sorted uint32, are on two or more new pages of the first page's site;
    ``other_repeated``: of the second's).

    What a page holds beside its body and its site's template is mostly its
    own navigation: the titles of the pages before, after and above it, a
    table of its headings, its section's menu. Those titles are headings of
    other pages of the site, so that text is on other pages of it, while a
    copy of the body on another site lacks it. Only a page's extra is left
    out, never what both pages hold, and of it:

    - at most as much as leaves the page as many extra shingles as the other
      page has of its own (extra and not repeated on its site): words
      changed in a copy make shingles found nowhere else and take some of
      the source's away, which its site may repeat (common phrases of a
      reference); left out, the pair would look closer than it is (and a
      page would look contained in a longer one it only partly is: an
      excerpt keeps its host's navigation when its source has more extra
      of its own);
    - nothing when that is more than ``REPEAT_SHARE`` of the page: navigation
      is beside a page's own text, while an excerpt's source (whose extra is
      the rest of its body) keeps its extra.
    """
    sides = []
    for this, that, repeated in ((own, other, own_repeated), (other, own, other_repeated)):
        extra = np.flatnonzero(~in_sorted(this, that))
        out = extra[repeated(this[extra])] if len(extra) else extra
        sides.append((this, len(extra), out))
    result = []
    for n, (this, extra, out) in enumerate(sides):
        _, other_extra, other_out = sides[1 - n]
        out = out[:max(0, extra - (other_extra - len(other_out)))]  # the lowest hashes: a choice of no order
        if 0 < len(out) <= REPEAT_SHARE * len(this):
            keep = np.ones(len(this), dtype=bool)
            keep[out] = False
            this = this[keep]
        result.append(this)
    return result[0], result[1]


def own_text_of(content: np.ndarray, repeated: np.ndarray, min_share: float) -> Optional[np.ndarray]:
    """A page's content without the text its site repeats (``repeated``: which of ``content`` are on two or
    more of the site's new pages), when that is more than ``REPEAT_SHARE`` of it and at least ``min_share`` of it
    is left; else None (``TemplateSettings.own_text``).

    A short body in a host page whose own navigation (its table of
    contents, its neighbours' titles) is several times its size has band
    keys made mostly of that navigation, and its source, elsewhere, shares
    too few of them to be a candidate. Looked up by its own text too, the
    body finds it. A page whose repeated text is a minor part of it has
    band keys close to those of its own text already.
    """
    if not has_own_text(len(content), int(np.count_nonzero(repeated)), min_share):
        return None
    return content[~repeated]


def has_own_text(size: int, repeated: int, min_share: float) -> bool:
    """Whether a content of ``size`` values of which its site repeats ``repeated`` has an own text
    (``own_text_of``)."""
    left = size - repeated
    return not (repeated <= REPEAT_SHARE * size or left == 0 or left < min_share * size)


def reads_lines(fingerprint: str) -> bool:
    """Whether an index whose template settings are ``fingerprint`` reads its pages' short lines (``lines``:
    ``core.prepare.short_line_shingles``)."""
    return _LINES in fingerprint


def excerpt_text_of(content: np.ndarray, repeated: np.ndarray, short_lines: np.ndarray,
                    min_shingles: int) -> Optional[np.ndarray]:
    """A page's content as an excerpt of another page is measured (``TemplateSettings.lines``): without the
    shingles its site repeats (``repeated``: which of ``content`` are on two or more of the site's new pages)
    that lie in its runs of short lines (``short_lines``, sorted uint32); None when that leaves out nothing, or
    leaves fewer than ``min_shingles``.

    An excerpt put in a host page keeps the host's own navigation: its
    table of contents, its neighbours' titles, its breadcrumbs, on the host
    page and its neighbours too, and as large as the excerpt on documentation
    sites. Its source lacks all of it, so the excerpt's containment falls
    below the mark. Which of a page's text its site repeats does not tell
    navigation from body text the site repeats (a passage quoted on several
    of its pages, beside a passage of another page: not an excerpt of that
    page); where the text is does: navigation is lines of a few words,
    body text is paragraphs.
    """
    if not len(short_lines):
        return None
    out = repeated & in_sorted(content, short_lines)
    if not out.any():
        return None
    text = content[~out]
    return text if len(text) >= min_shingles else None


def kept_rule(stored: str, wanted: str) -> str:
    """The template fingerprint an index with ``stored`` is used with when ``wanted`` is asked for: ``stored``
    when the two differ only in rules added since (``repeats`` on by default, ``confirm``, ``neither``: an index
    made before them goes on deciding as it always has), else ``wanted``."""
    parts = wanted.split("-")
    added = [n for n, part in enumerate(parts) if "-" + part in _ADDED_SINCE]
    for chosen in range(1 << len(added)):
        dropped = {at for k, at in enumerate(added) if chosen >> k & 1}
        if "-".join(part for n, part in enumerate(parts) if n not in dropped) == stored:
            return stored
    return wanted


class SiteTimeline:
    """The templates as they stand at each document of a batch, replayed in decision order.

    The batch's plan records every change (a site's template, the shared
    template) at the row whose page caused it; ``at(row)`` moves the view up
    to and including that row, so a candidate of any site is compared by its
    template as it stands when the document is decided.
    """

    def __init__(self, committed, shared: np.ndarray):
        self._committed = committed  # site -> template (sorted uint32) as committed
        self._now: dict[int, np.ndarray] = {}
        self.shared = self._shared_before = shared
        self._changes: list[tuple[int, Optional[int], np.ndarray]] = []  # (row, site or None for shared, template)
        self._next = 0
        self.row = -1  # the row the view stands at

    def record(self, row: int, site: Optional[int], template: np.ndarray) -> None:
        self._changes.append((row, site, template))

    def at(self, row: int) -> None:
        self.row = row
        changes = self._changes
        while self._next < len(changes) and changes[self._next][0] <= row:
            _, site, template = changes[self._next]
            if site is None:
                self.shared = template
            else:
                self._now[site] = template
            self._next += 1

    @property
    def changes(self) -> int:
        """How many template changes the batch's plan holds."""
        return len(self._changes)

    def rewound(self) -> "SiteTimeline":
        """The same changes, seen again from the batch's start."""
        again = SiteTimeline(self._committed, self._shared_before)
        again._changes = self._changes
        return again

    def template(self, site: int) -> np.ndarray:
        found = self._now.get(site)
        return found if found is not None else self._committed(site)
