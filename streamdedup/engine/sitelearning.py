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

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.lsh import band_keys
from ..core.prepare import PreparedBatch
from ..core.records import Document
from ..core.shingle import ShingleBatch
from ..core.signing import SigningConfig, sign_batch
from ..core.templates import SiteState, SiteTimeline, TemplateSettings, content_of, top32
from ..store.index import IndexTxn
from ..store.lookup import BatchView
from ..store.sites import load_site, move_site_counts, save_site, shared_template

__all__ = ["SiteTemplates", "BatchContent"]

CACHED_SITES = 200_000  # committed site states kept in memory (the rest are read from the index when needed)


@dataclass
class BatchContent:
    """Each document row's content shingles, and the templates as they stand at each row."""

    shingles: list  # row -> sorted uint64 content shingles
    timeline: SiteTimeline
    settings: TemplateSettings

    def content_of_stored(self, shingles: np.ndarray, site: int) -> np.ndarray:
        """A decided document's stored shingles without its site's template as it stands now."""
        timeline = self.timeline
        return content_of(shingles, timeline.template(site), timeline.shared, self.settings.min_content_share)


class SiteTemplates:
    """The writer's view of the learned templates: committed state cached, batches planned on copies."""

    def __init__(self, settings: TemplateSettings, signing: SigningConfig):
        self.settings = settings
        self.signing = signing
        self._sites: dict[int, SiteState] = {}
        self._shared: Optional[np.ndarray] = None

    def content(self, txn: IndexTxn, view: BatchView, batch: PreparedBatch) -> BatchContent:
        """Every row's content, the sites' new state written into ``txn``, and ``view`` keyed by content."""
        settings = self.settings
        shared = self._shared_now(txn)
        timeline = SiteTimeline(lambda site: self._committed(txn, site).template, shared)
        copies: dict[int, SiteState] = {}
        seen: set[bytes] = set()
        rows, changed = [], []
        sites = batch.sites.tolist()
        learns = settings.learns
        for i, item in enumerate(batch.items):
            row = batch.row[i]
            if row < 0 or not isinstance(item, Document):
                continue
            site, full = sites[row], batch.shingles.of(row)
            state = copies.get(site)
            if state is None:
                state = copies[site] = self._committed(txn, site).copy()
            digest = batch.contents[row]
            if learns(site) and digest not in seen and view.serial_of_content(digest) is None:
                seen.add(digest)
                before = state.template
                moved = state.add_page(np.unique(top32(full)), settings)
                if state.template is not before:
                    timeline.record(row, site, state.template)
                if moved is not None and site:
                    shared = self._moved(txn, moved, shared)
                    timeline.record(row, None, shared)
            content = content_of(full, state.template, shared, settings.min_content_share)
            rows.append(content)
            if content is not full:
                changed.append(row)
        self._write(txn, copies, shared, batch.hosts)
        view.use_band_keys(self._content_keys(batch, rows, changed))
        return BatchContent(rows, timeline, settings)

    def _committed(self, txn: IndexTxn, site: int) -> SiteState:
        state = self._sites.get(site)
        if state is None:
            state = load_site(txn, site)
            if len(self._sites) >= CACHED_SITES:
                self._sites.clear()
            self._sites[site] = state
        return state

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
            before = self._committed(txn, site)
            if state.pages != before.pages:
                save_site(txn, site, state, before, hosts.get(site, ""))

        def taken_in() -> None:
            self._sites.update(copies)
            self._shared = shared

        txn.after_commit.append(taken_in)

    def _content_keys(self, batch: PreparedBatch, rows: list, changed: list[int]) -> np.ndarray:
        """The batch's band keys, those of rows whose content is not their whole shingle set signed again."""
        if not changed:
            return batch.keys
        parts = [rows[r] for r in changed]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        signing = self.signing
        signatures = sign_batch(ShingleBatch(np.concatenate(parts), offsets), signing.num_perm, signing.seed)
        keys = batch.keys.copy()
        keys[changed] = band_keys(signatures, signing.bands, signing.rows)
        return keys

    def forget_cache(self) -> None:
        """Drop the cached state (after the index changed under it: a rebuild)."""
        self._sites.clear()
        self._shared = None

