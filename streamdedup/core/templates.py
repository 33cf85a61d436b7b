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
- **Across sites.** A shingle in the settled templates of at least
  ``min_sites`` sites (a shared cookie banner, a CMS footer) is template on
  every page, of every site and of pages without a URL.
- **Nothing left.** A page whose content is less than ``min_content_share``
  of its shingles (a page that is all template, a crawler trap's pages with a
  few changing words) is compared as a whole.

Everything here is a function of the input in its order, never of batch
boundaries or timing: the state moves page by page and is committed with
each batch's decisions, so a restart, a replay or a backfill learns and
decides exactly as an uninterrupted run. Template shingles are kept as the
top 32 bits of the shingle hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .sites import NO_SITE

__all__ = ["TemplateSettings", "SiteState", "learned_template", "content_of", "in_sorted",
           "SiteTimeline", "EMPTY"]

EMPTY = np.zeros(0, dtype=np.uint32)


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

    def learns(self, site: int) -> bool:
        """Whether pages of ``site`` teach and use a site template (pages without a URL: if asked to)."""
        return site != NO_SITE or self.learn_without_url

    def fingerprint(self) -> str:
        """The settings as the index records them ("off", or each value after its letter)."""
        if not self.enabled:
            return "off"
        return (f"p{self.sample_pages}-s{self.share:g}-r{self.relearn_every}-m{self.min_sites}"
                f"-c{self.min_content_share:g}-u{int(self.learn_without_url)}")

    @classmethod
    def from_fingerprint(cls, text: str) -> "TemplateSettings":
        """The settings an index recorded with ``fingerprint``."""
        if text == "off":
            return cls(enabled=False)
        values = {part[0]: part[1:] for part in text.split("-")}
        return cls(True, int(values["p"]), float(values["s"]), int(values["r"]), int(values["m"]), float(values["c"]),
                   values["u"] == "1")


@dataclass
class SiteState:
    """What the index knows of one site's template."""

    pages: int = 0  # new pages of the site so far
    settled: bool = False  # its first sample is full
    template: np.ndarray = field(default_factory=lambda: EMPTY)  # sorted uint32: the template in use
    sample: list = field(default_factory=list)  # sorted uint32 arrays: the pages sampled so far

    def copy(self) -> "SiteState":
        return SiteState(self.pages, self.settled, self.template, list(self.sample))

    def samples_next(self, settings: TemplateSettings) -> bool:
        """Whether the site's next new page goes into a sample."""
        if not self.settled:
            return True
        every = settings.relearn_every
        return every > 0 and self.pages >= every and self.pages % every < settings.sample_pages

    def add_page(self, page: np.ndarray, settings: TemplateSettings) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Count a new page (``page``: its sorted uint32 shingles).

        Returns (old, new) settled template when the page completes a sample
        (the across-site counts then move), else None.
        """
        sampled = self.samples_next(settings)
        self.pages += 1
        if not sampled:
            return None
        self.sample.append(page)
        if not self.settled:
            self.template = learned_template(self.sample, settings.share)
        if len(self.sample) < settings.sample_pages:
            return None
        old = self.template if self.settled else EMPTY
        learned = learned_template(self.sample, settings.share)
        self.template = np.union1d(old, learned).astype(np.uint32) if self.settled else learned
        self.settled, self.sample = True, []
        return old, self.template


def learned_template(pages: list[np.ndarray], share: float) -> np.ndarray:
    """The shingles on more than ``share`` of ``pages`` and on at least two of them (sorted uint32)."""
    need = max(2, int(share * len(pages)) + 1)
    if len(pages) < need:
        return EMPTY
    values, counts = np.unique(np.concatenate(pages), return_counts=True)
    return values[counts >= need]


def in_sorted(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in the sorted array ``table``."""
    if len(table) == 0:
        return np.zeros(len(values), dtype=bool)
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
    drop = in_sorted(shingles, template)
    if len(shared):
        drop |= in_sorted(shingles, shared)
    left = len(shingles) - int(np.count_nonzero(drop))
    if left == len(shingles):
        return shingles
    if left == 0 or left < min_share * len(shingles):
        return shingles
    return shingles[~drop]


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

    def record(self, row: int, site: Optional[int], template: np.ndarray) -> None:
        self._changes.append((row, site, template))

    def at(self, row: int) -> None:
        changes = self._changes
        while self._next < len(changes) and changes[self._next][0] <= row:
            _, site, template = changes[self._next]
            if site is None:
                self.shared = template
            else:
                self._now[site] = template
            self._next += 1

    def rewound(self) -> "SiteTimeline":
        """The same changes, seen again from the batch's start."""
        again = SiteTimeline(self._committed, self._shared_before)
        again._changes = self._changes
        return again

    def template(self, site: int) -> np.ndarray:
        found = self._now.get(site)
        return found if found is not None else self._committed(site)
