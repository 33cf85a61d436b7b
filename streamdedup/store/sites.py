"""The learned site templates on disk (see ``core.templates`` for what they mean).

============== ================================ =====================================
table          key                              value
============== ================================ =====================================
sites          site key (8 B)                   msgpack [new pages, settled, sampled, host(, window pages)]
site_templates site key (8 B)                   its template: sorted uint32 (little-endian)
               site key + "b" (9 B)             its repeated blocks: sorted uint32
               site key + "s" (9 B)             shingles seen on its new pages (``repeats``): sorted uint32,
                                                the main part of a ``GrowingSet``
               site key + "S" (9 B)             the first chunk of its recent part: uint32, in the order
                                                added (in indexes made before chunks, 2026-12-07: the whole
                                                recent part, sorted; absent in indexes made before it)
               site key + "S" + chunk (11 B)    its next chunks (chunk 1, 2, ...: 2 bytes, big-endian), each
                                                uint32 in the order added; a version before chunks reads the
                                                first only, as a sorted array: an index written since is not
                                                for it
               site key + "r" (9 B)             those on two or more of its new pages: likewise
               site key + "R" (+ chunk)         their recent part's chunks
               site key + "a" (9 B)             present when those were counted ahead (``dedup --learn-first``)
               site key + "p" (9 B)             what its last sample learned, on probation: sorted uint32
               site key + "q" (9 B)             pages counted since, then each of those shingles' pages: uint32
site_samples   site key (8 B) + page (2 B)      a sampled page's shingles: sorted uint32
               site key + 0x8000 + slot (2 B)   a window page's new shingles: sorted uint32
template_sites shingle's top 32 bits (4 B)      how many sites' settled templates hold it
site_provisional site key (8 B)                 kept pages of a learning site (serials, 8 B each)
rekeyed        band (2 B) + band key (8 B)      a first page's serial, by its settled content
rekeyed_of     serial (8 B)                     that page's settled band keys (to remove them)
============== ================================ =====================================

They change in the batch transaction that decides the pages, so they are
always as of the last committed batch. Without repeated blocks
(``templates.window = 0``, and indexes made before them) a site has neither
blocks nor window pages and its record four values, as before: the index is
the same as one made by the version before. An index made with blocks is
refused by that version (its template settings differ).
"""

from __future__ import annotations

import weakref
from typing import Iterator, Optional

import msgpack
import numpy as np

from ..core.templates import GrowingSet, SiteState, in_sorted
from .index import Index, IndexTxn, TxnState, u64

__all__ = ["load_site", "save_site", "move_site_counts", "shared_template", "site_summaries", "provisional_pages",
           "set_provisional_pages", "write_rekeyed_many", "remove_rekeyed", "rekeyed_may_hold"]

_EMPTY = np.zeros(0, dtype=np.uint32)
_WINDOW = 0x8000  # window slots in ``site_samples``, after the sample's pages
_REKEYED_KEY = np.dtype([("band", ">u2"), ("key", ">u8")])  # a key of the ``rekeyed`` table
REKEYED_FILTER_BITS = 1 << 25  # the writer's filter of the ``rekeyed`` table's keys (4 MiB)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # a (band, key)'s bit: the top bits of its product with this odd number


def _u32_array(raw) -> np.ndarray:
    return np.frombuffer(raw, dtype="<u4").astype(np.uint32) if raw else _EMPTY


def load_site(txn: IndexTxn, site: int) -> SiteState:
    """The site's ``SiteState`` as committed (a new one if the index has never seen the site)."""
    key = u64(site)
    raw = txn.get("sites", key)
    if raw is None:
        return SiteState()
    pages, settled, sampled, _, *windowed = msgpack.unpackb(raw)
    template = _u32_array(txn.get("site_templates", key))
    sample = [_u32_array(txn.get("site_samples", key + i.to_bytes(2, "big"))) for i in range(sampled)]
    blocks = _u32_array(txn.get("site_templates", key + b"b"))
    window = [_u32_array(txn.get("site_samples", key + (_WINDOW + i).to_bytes(2, "big")))
              for i in range(windowed[0] if windowed else 0)]
    seen, repeated = (GrowingSet(_u32_array(txn.get("site_templates", key + part)),
                                 _chunks(txn, key + part.upper())) for part in (b"s", b"r"))
    ahead = txn.get("site_templates", key + b"a") is not None
    probation = _u32_array(txn.get("site_templates", key + b"p"))
    confirmations = _u32_array(txn.get("site_templates", key + b"q"))
    return SiteState(pages, settled, template, sample, blocks, window, None, seen, repeated, ahead, probation,
                     confirmations)


def save_site(txn: IndexTxn, site: int, state: SiteState, before: SiteState, host: str) -> None:
    """Write what changed of a site's state (``before``: the state as committed)."""
    key, raw, dbs = u64(site), txn.txn, txn.dbs
    record = [state.pages, state.settled, len(state.sample), host] + ([len(state.window)] if state.window else [])
    raw.put(key, msgpack.packb(record), db=dbs["sites"])
    if state.template is not before.template:
        raw.put(key, state.template.astype("<u4").tobytes(), db=dbs["site_templates"])
    if state.blocks is not before.blocks:
        raw.put(key + b"b", state.blocks.astype("<u4").tobytes(), db=dbs["site_templates"])
    if state.seen is not before.seen or state.repeated is not before.repeated:
        txn.mark_current_format()  # chunks in the order added: a release of format 7 reads them as sorted
    _save_growing(raw, dbs["site_templates"], key, b"s", state.seen, before.seen)
    _save_growing(raw, dbs["site_templates"], key, b"r", state.repeated, before.repeated)
    if state.probation is not before.probation:
        raw.put(key + b"p", state.probation.astype("<u4").tobytes(), db=dbs["site_templates"])
    if state.confirmations is not before.confirmations:
        raw.put(key + b"q", state.confirmations.astype("<u4").tobytes(), db=dbs["site_templates"])
    if state.ahead and not before.ahead:
        raw.put(key + b"a", b"1", db=dbs["site_templates"])
    for i, page in enumerate(state.window):
        if i >= len(before.window) or page is not before.window[i]:
            raw.put(key + (_WINDOW + i).to_bytes(2, "big"), page.astype("<u4").tobytes(), db=dbs["site_samples"])
    for i in range(len(state.sample)):
        if i >= len(before.sample) or state.sample[i] is not before.sample[i]:
            raw.put(key + i.to_bytes(2, "big"), state.sample[i].astype("<u4").tobytes(), db=dbs["site_samples"])
    for i in range(len(state.sample), len(before.sample)):
        raw.delete(key + i.to_bytes(2, "big"), db=dbs["site_samples"])


def _chunks(txn: IndexTxn, key: bytes) -> tuple:
    """A ``GrowingSet``'s chunks as written under ``key`` (``_chunk_key``): the first under ``key`` itself (an index
    made before chunks holds its whole recent part there), the others after it, in order, up to the first absent."""
    chunks = []
    while (raw := txn.get("site_templates", _chunk_key(key, len(chunks)))) is not None:
        chunks.append(_u32_array(raw))
    return tuple(chunks)


def _chunk_key(key: bytes, n: int) -> bytes:
    return key if n == 0 else key + n.to_bytes(2, "big")


def _save_growing(raw, db, key: bytes, part: bytes, now: GrowingSet, before: GrowingSet) -> None:
    """Write what changed of a ``GrowingSet`` (under the site's ``key`` + ``part``, its chunks under ``part`` in
    upper case, ``_chunk_key``): at most batches its last chunk and those it added, the main part only when
    the chunks merged into it (and then the chunks it had are deleted)."""
    if now.main is not before.main:
        raw.put(key + part, now.main.astype("<u4").tobytes(), db=db)
    chunks = key + part.upper()
    for n, chunk in enumerate(now.chunks):
        if n >= len(before.chunks) or chunk is not before.chunks[n]:
            raw.put(_chunk_key(chunks, n), chunk.astype("<u4").tobytes(), db=db)
    for n in range(len(now.chunks), len(before.chunks)):
        raw.delete(_chunk_key(chunks, n), db=db)


def move_site_counts(txn: IndexTxn, old: np.ndarray, new: np.ndarray, min_sites: int) -> tuple[np.ndarray, np.ndarray]:
    """A site's settled template went from ``old`` to ``new`` (sorted, unique): move the across-site counts.

    Returns (shingles that reached ``min_sites`` sites, shingles that fell below it).
    """
    raw, db = txn.txn, txn.dbs["template_sites"]
    gone, came = old[~in_sorted(old, new)], new[~in_sorted(new, old)]  # both sorted and unique: no sort again
    reached, fell = [], []
    for values, step in ((gone, -1), (came, 1)):
        for value in values.tolist():
            key = value.to_bytes(4, "big")
            found = raw.get(key, db=db)
            before = int.from_bytes(found, "big") if found else 0
            after = before + step
            if after > 0:
                raw.put(key, after.to_bytes(4, "big"), db=db)
            elif found:
                raw.delete(key, db=db)
            if before < min_sites <= after:
                reached.append(value)
            elif after < min_sites <= before:
                fell.append(value)
    return np.array(reached, dtype=np.uint32), np.array(fell, dtype=np.uint32)


def shared_template(txn: IndexTxn, min_sites: int) -> np.ndarray:
    """The shingles in the settled templates of at least ``min_sites`` sites (sorted uint32)."""
    found = [int.from_bytes(k, "big") for k, v in txn.table_entries("template_sites")
             if int.from_bytes(v, "big") >= min_sites]
    return np.array(found, dtype=np.uint32)


def site_summaries(txn: IndexTxn) -> Iterator[dict]:
    """What was learned of every site: host, new pages, settled, template shingles, pages in its sample."""
    for key, raw in txn.table_entries("sites"):
        pages, settled, sampled, host, *_ = msgpack.unpackb(raw)
        template = txn.get("site_templates", key)
        yield {"site": int.from_bytes(key, "big"), "host": host, "pages": pages, "settled": settled,
               "template_shingles": len(template) // 4 if template else 0, "sampled": sampled}


def provisional_pages(txn: IndexTxn, site: int) -> list[int]:
    """The kept pages the site had while it was learning (not yet looked up by their settled content)."""
    raw = txn.get("site_provisional", u64(site))
    return np.frombuffer(raw, dtype=">u8").astype(np.int64).tolist() if raw else []


def set_provisional_pages(txn: IndexTxn, site: int, serials: list[int]) -> None:
    if serials:
        txn.txn.put(u64(site), np.array(serials, dtype=">u8").tobytes(), db=txn.dbs["site_provisional"])
    else:
        txn.delete("site_provisional", u64(site))


def write_rekeyed_many(txn: IndexTxn, rekeyed: dict) -> None:
    """First pages' band keys by their settled content (serial -> keys, one per band), beside their own, in
    place of those they had in the table: only the bands whose key changed are written (a page rekeyed again
    when its site's template moves keeps most of them), every page's deletions in sorted order, then its puts
    in one sorted ``putmulti`` (each descent of the table near the last: the deletions a third faster than in
    the pages' order). A page's entries hold its serial, so one page's deletions and puts never touch
    another's: the table ends as written page by page."""
    pairs, gone, written = [], [], []
    for serial, keys in rekeyed.items():
        value = u64(serial)
        raw = txn.get("rekeyed_of", value)
        before = np.frombuffer(raw, dtype=">u8").tolist() if raw is not None else []
        now = keys.tolist()
        if now == before:
            continue
        gone.extend((band.to_bytes(2, "big") + key.to_bytes(8, "big"), value)
                    for band, key in enumerate(before) if band >= len(now) or now[band] != key)
        pairs.extend((band.to_bytes(2, "big") + key.to_bytes(8, "big"), value)
                     for band, key in enumerate(now) if band >= len(before) or before[band] != key)
        txn.txn.put(value, keys.astype(">u8").tobytes(), db=txn.dbs["rekeyed_of"])
        written.append(keys)
    _note_rekeyed(txn, written)
    table = txn.dbs["rekeyed"]
    gone.sort()
    for key, value in gone:
        txn.txn.delete(key, value, db=table)
    if pairs:
        pairs.sort()
        txn.txn.cursor(db=table).putmulti(pairs, dupdata=True)


def remove_rekeyed(txn: IndexTxn, serial: int) -> None:
    """Take a document out of the rekeyed table (forget, retention)."""
    value = u64(serial)
    raw = txn.get("rekeyed_of", value)
    if raw is None:
        return
    for band, key in enumerate(np.frombuffer(raw, dtype=">u8").tolist()):
        txn.delete("rekeyed", band.to_bytes(2, "big") + key.to_bytes(8, "big"), value)
    txn.delete("rekeyed_of", value)


class _RekeyedFilter:
    """Which (band, key) the writer's ``rekeyed`` table may hold: a bit a hashed pair, set for every key the
    table held when the filter was built and every one written since, never cleared (a superset: a key
    whose bit is clear is not in the table).

    Every batch of a templated run looks each of its tens of thousands of
    slots up in the table (a B-tree descent each, about a tenth of the
    deciding thread's learning), and finds a handful: asked through the
    filter, it descends only for the few whose bits are set.
    """

    def __init__(self, txn: IndexTxn):
        self._bits = np.zeros(REKEYED_FILTER_BITS // 8, dtype=np.uint8)
        self.added = 0
        raw = txn.txn
        keys = b"".join(raw.cursor(db=txn.dbs["rekeyed"]).iternext_nodup(keys=True, values=False))
        held = np.frombuffer(keys, dtype=_REKEYED_KEY)
        self.add(held["band"], held["key"])

    @staticmethod
    def _places(bands: np.ndarray, keys: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            mixed = (keys.astype(np.uint64) ^ (bands.astype(np.uint64) << np.uint64(48))) * _MIX
        return mixed >> np.uint64(64 - REKEYED_FILTER_BITS.bit_length() + 1)

    def add(self, bands: np.ndarray, keys: np.ndarray) -> None:
        places = self._places(bands, keys)
        np.bitwise_or.at(self._bits, places >> np.uint64(3), np.left_shift(1, places & np.uint64(7)).astype(np.uint8))
        self.added += len(places)

    def may_hold(self, bands: np.ndarray, keys: np.ndarray) -> np.ndarray:
        places = self._places(bands, keys)
        return (self._bits[places >> np.uint64(3)] >> (places & np.uint64(7)).astype(np.uint8)) & 1 == 1


_FILTERS: "weakref.WeakKeyDictionary[Index, _RekeyedFilter]" = weakref.WeakKeyDictionary()


def rekeyed_may_hold(txn: IndexTxn, bands: np.ndarray, keys: np.ndarray) -> Optional[np.ndarray]:
    """Which of these (band, key) the ``rekeyed`` table may hold, in the writer's transactions (built on the
    first asked; writes go through ``write_rekeyed_many``, the index's only writer holds its lock); None in a
    reader's (another process may write the table meanwhile): ask it for each."""
    if txn.index.readonly or txn.state is not TxnState.OPEN:
        return None
    found = _FILTERS.get(txn.index)
    if found is None or found.added > REKEYED_FILTER_BITS // 8:  # built again once mostly stale keys fill it
        found = _FILTERS[txn.index] = _RekeyedFilter(txn)
    return found.may_hold(bands, keys)


def _note_rekeyed(txn: IndexTxn, pages: list) -> None:
    """Pages' band keys (one a band each) go into the ``rekeyed`` table: into the writer's filter too, if built."""
    found = _FILTERS.get(txn.index)
    if found is not None and pages:
        found.add(np.concatenate([np.arange(len(keys), dtype=np.uint16) for keys in pages]), np.concatenate(pages))
