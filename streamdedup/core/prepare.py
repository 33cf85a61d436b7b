"""Step 2 of a batch, before any index is read: decode, normalize, shingle, sign, band.

Preparing is a pure function of the records, so it may run anywhere: in
the deciding process, or ahead of it in a second one (``runtime.feed``,
``feed.ProcessFeed`` for the worker). This module imports only what preparing
needs (no lookup tables, band filter or Kafka client), so a preparing process
boots quickly.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from .decode import decode_many, decode_warc_line
from .lsh import BAND_BASE, band_keys, sorted_slots
from .memory import keep_freed_memory
from .records import Document, Item, RawRecord, Rejected, Source, id_key
from .shingle import NormalizedBatch, ShingleBatch, narrow, normalize_texts, shingle_batch
from .signing import SigningConfig, permutations, sign_batch
from .sites import site_host, site_key
from .templates import reads_lines

PIECE_RECORDS = 2000  # records prepared at once by ``prepare_in_pieces``
SHORT_LINE_WORDS = 12  # a line of at most this many words is a short line (``short_line_shingles``)
_NO_SHINGLES = np.zeros(0, dtype=np.uint32)
_UNMADE = object()  # ``prepare``'s kernel answer not made beforehand

try:
    from . import _kernel
except ImportError:  # built by ``pip install`` when a C compiler is there; the steps below give the same
    _kernel = None

__all__ = ["PreparedBatch", "die_with_parent", "decode_raw", "joined", "json_id_keys", "prepare", "prepare_ahead", "prepare_in_pieces",
           "short_line_shingles", "prepare_compact", "prepare_raw", "preparing_process", "raw_payload", "raw_records",
           "restore_items"]


@dataclass
class PreparedBatch:
    """A batch ready to be decided: each item is a Rejected, or a document with its hashes.

    ``row[i]`` is the row of item ``i`` in ``contents``, ``shingles`` and ``keys`` (-1 when rejected).
    """

    items: list[Item]
    row: list[int]
    contents: list[bytes]  # content hash of each document row
    id_keys: list[bytes]  # index key of each document row's id
    shingles: ShingleBatch
    keys: np.ndarray  # (documents, bands) uint64
    sites: np.ndarray  # site key of each document row (uint64, ``core.sites``)
    hosts: dict  # site key -> host, for the batch's sites
    short_lines: Optional[ShingleBatch] = None  # each row's shingles within its runs of short lines, if read
    _slots: Optional[tuple] = field(default=None, repr=False, compare=False)  # (keys, sorted_slots(keys)), last asked

    def sorted_slots(self, keys: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``lsh.sorted_slots`` of ``keys`` (default: the batch's signed keys), kept for the last keys asked: a
        shard asks for the same in its evidence and again in its decision (the sort is a tenth of each)."""
        keys = self.keys if keys is None else keys
        last = self._slots  # one read: shards in threads of one process (tests) may replace it meanwhile
        if last is not None and last[0] is keys:
            return last[1]
        answer = sorted_slots(keys)
        self._slots = (keys, answer)
        return answer


def prepare(items: list[Item], signing: SigningConfig, made=_UNMADE) -> PreparedBatch:
    """Normalize, shingle, sign and band every document of the batch in one go (and, when the index's rules read
    them, ``short_line_shingles``). ``made``: ``_prepared_ascii``'s answer, made already (``prepare_ahead``)."""
    documents = [item for item in items if isinstance(item, Document)]
    if made is _UNMADE:
        made = _prepared_ascii([doc.text for doc in documents], signing)
    if made is not None:  # most batches: every text ASCII, none empty
        contents, shingles, keys = made
    else:
        normalized = normalize_texts([doc.text for doc in documents])
        if not normalized.lengths.all():
            items, documents, normalized = _reject_empty(items, normalized)
        contents = normalized.contents
        shingles = narrow(shingle_batch(normalized, signing.shingle, signing.k))  # signed as stored: the same signature
        signatures = sign_batch(shingles, signing.num_perm, signing.seed)
        keys = band_keys(signatures, signing.bands, signing.rows)
    row, next_row = [], 0
    for item in items:
        row.append(next_row if isinstance(item, Document) else -1)
        next_row += isinstance(item, Document)
    id_keys = id_keys_of([doc.id for doc in documents])
    hosts = {}
    for doc in documents:
        if doc.url:
            hosts[site_key(doc.url)] = site_host(doc.url)
    sites = np.array([site_key(doc.url) for doc in documents], dtype=np.uint64)
    lines = short_line_shingles([doc.text for doc in documents], signing) if reads_lines(signing.templates) \
        and signing.excerpt_sampling else None
    return PreparedBatch(items, row, contents, id_keys, shingles, keys, sites, hosts, lines)


def prepare_in_pieces(items: list[Item], signing: SigningConfig, size: int = PIECE_RECORDS) -> PreparedBatch:
    """``prepare`` of ``items``, ``size`` at a time, ``joined``: the same batch (preparing is per document), but
    an epoch's arrays at once outgrow the caches (preparing 10,000 records in one go cost a fifth more a record
    than in pieces of 2,000)."""
    if len(items) <= size:
        return prepare(items, signing)
    return joined([prepare(items[at:at + size], signing) for at in range(0, len(items), size)])


def joined(batches: list[PreparedBatch]) -> PreparedBatch:
    """One prepared batch of ``batches``' items in turn, rows renumbered: the same as preparing their items
    together (preparing is per document), in pieces whose arrays stay in the caches."""
    if len(batches) == 1:
        return batches[0]
    items, row, hosts, before = [], [], {}, 0
    for batch in batches:
        items += batch.items
        row += [r + before if r >= 0 else -1 for r in batch.row]
        hosts.update(batch.hosts)
        before += len(batch.contents)
    lines = [b.short_lines for b in batches]
    return PreparedBatch(items, row, [c for b in batches for c in b.contents], [k for b in batches for k in b.id_keys],
                         _joined_shingles([b.shingles for b in batches]), np.concatenate([b.keys for b in batches]),
                         np.concatenate([b.sites for b in batches]), hosts,
                         _joined_shingles(lines) if all(s is not None for s in lines) else None)


def _joined_shingles(batches: list[ShingleBatch]) -> ShingleBatch:
    """The documents of ``batches`` in turn, as one ``ShingleBatch``."""
    sizes = np.concatenate([np.diff(b.offsets) for b in batches])
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return ShingleBatch(np.concatenate([b.hashes for b in batches]), offsets)


def id_keys_of(ids: list[str]) -> list[bytes]:
    """``records.id_key`` of each id, in one kernel call (``_kernel.id_keys``, the same keys) when there is one."""
    if _kernel is None:
        return [id_key(doc_id) for doc_id in ids]
    return _kernel.id_keys(ids)


def json_id_keys(payload: tuple, spec) -> list[Optional[bytes]]:
    """For each record of ``raw_payload`` columns, ``records.id_key`` of the id ``decode_raw`` with ``spec`` gives
    it, where the kernel finds that id in the record's bytes (``_kernel.json_id_keys``: a JSON object whose whole
    value it checks, its id a string without escapes or a short integer); None for every other record (and for
    all of them without the kernel or with a spec other than JSON with a top-level id field), which only
    decoding names. The sharded signer places records so without decoding most of them."""
    values, keys, _, _, _, _, _, rejected = payload
    field = spec.id_field
    if _kernel is None or spec.format != "json" or not field or "." in field or not field.isascii():
        return [None] * len(values)
    return _kernel.json_id_keys(values, keys, rejected, field.encode(), spec.max_record_bytes)


def prepare_ahead(items: list[Item], signing: SigningConfig, executor: Executor) -> Callable[[], PreparedBatch]:
    """``prepare``, the kernel's call in it (``_AsciiCall.run``) started on ``executor``'s thread: call the answer
    for the prepared batch.

    The kernel prepares without the GIL, so a thread makes the next batch's
    hashes while this one decides the current batch and waits for the disk.
    Only the call goes there, its arguments made and its answer read here:
    each time the thread takes the GIL, the deciding thread waits for it (on
    a busy machine, for as long as the thread waits to be scheduled).
    """
    call = _ascii_call([item.text for item in items if isinstance(item, Document)], signing)
    if call is None:
        return lambda: prepare(items, signing)
    written = executor.submit(call.run)
    return lambda: prepare(items, signing, call.answer(written.result()))


def short_line_shingles(texts: list[str], signing: SigningConfig) -> ShingleBatch:
    """Each text's shingles (narrowed, sorted) whose words all lie in a run of consecutive lines of at most
    ``SHORT_LINE_WORDS`` words each: where a page's navigation is, as its text says it (``templates.lines``).

    A page's text keeps its lines: a sidebar's table of contents, breadcrumbs,
    the titles of the pages before and after are lines of a few words,
    paragraphs of body text are long ones. The normalized text keeps no line,
    but a shingle's hash depends on its words alone, so a run's own shingles
    are the text's shingles that lie within it.
    """
    runs, owner = [], []
    for number, text in enumerate(texts):
        for run in _short_runs(text):
            runs.append(run)
            owner.append(number)
    per_text: list[list[np.ndarray]] = [[] for _ in texts]
    if runs:
        shingled = narrow(shingle_batch(normalize_texts(runs), signing.shingle, signing.k))
        for number, hashes in zip(owner, shingled.each()):
            per_text[number].append(hashes)
    arrays = [np.unique(np.concatenate(found)) if len(found) > 1 else found[0] if found else _NO_SHINGLES
              for found in per_text]
    batch = ShingleBatch.of_sets(arrays, _NO_SHINGLES)
    return ShingleBatch(batch.hashes.astype(np.uint32, copy=False), batch.offsets)


def _short_runs(text: str) -> list[str]:
    """The runs of consecutive short lines of ``text`` that hold a word (blank lines join a run)."""
    runs, current, words = [], [], 0
    for line in text.split("\n"):
        count = len(line.split())
        if count <= SHORT_LINE_WORDS:
            current.append(line)
            words += count
            continue
        if words:
            runs.append("\n".join(current))
        current, words = [], 0
    if words:
        runs.append("\n".join(current))
    return [run for run in runs if any(c.isalnum() for c in run)]


def _prepared_ascii(texts: list[str], signing: SigningConfig):
    """The steps of ``prepare`` from texts to band keys in one call of the compiled kernel (``prepare_ascii``):
    (content hashes, narrowed shingles, band keys), the same as the steps give; None when a text is not ASCII
    or nothing is left of one after normalization (the steps then take the batch, and reject it)."""
    call = _ascii_call(texts, signing)
    return None if call is None else call.answer(call.run())


def _ascii_call(texts: list[str], signing: SigningConfig) -> Optional["_AsciiCall"]:
    """The kernel's call for ``texts``; None without the kernel, or when a text is not ASCII."""
    if _kernel is None or not texts or signing.shingle not in ("word", "char"):
        return None
    joined = "".join(texts)
    if not joined.isascii():  # a flag of the string, read in one step: ASCII when every text is
        return None
    return _AsciiCall(texts, joined, signing)


class _AsciiCall:
    """``_kernel.prepare_ascii``'s arguments for a batch of ASCII texts (its outputs allocated), and its answer."""

    def __init__(self, texts: list[str], joined: str, signing: SigningConfig):
        count = len(texts)
        self.signing = signing
        self.text = joined.encode("ascii")  # ``joined``: the texts joined
        self.lengths = np.fromiter(map(len, texts), dtype=np.int64, count=count)
        self.a, self.b = permutations(signing.num_perm, signing.seed)
        self.points = np.empty(len(self.text) + count, dtype=np.uint8)
        self.out_lengths = np.empty(count, dtype=np.int64)
        self.contents = bytearray(16 * count)
        self.hashes = np.empty(len(self.text) + count, dtype=np.uint32)
        self.offsets = np.empty(count + 1, dtype=np.int64)
        self.keys = np.empty((count, signing.bands), dtype=np.uint64)

    def run(self) -> int:
        """The kernel's call (without the GIL, for the most part): the count of shingle hashes written."""
        signing = self.signing
        return _kernel.prepare_ascii(self.text, self.lengths, signing.shingle == "word", signing.k, self.a.ravel(),
                                     self.b.ravel(), signing.bands, signing.rows, int(BAND_BASE), self.points,
                                     self.out_lengths, self.contents, self.hashes, self.offsets, self.keys)

    def answer(self, written: int):
        """(content hashes, narrowed shingles, band keys) after ``run``; None when a text normalized to nothing."""
        if not self.out_lengths.all():
            return None
        whole = bytes(self.contents)
        contents = [whole[i:i + 16] for i in range(0, len(whole), 16)]
        return contents, ShingleBatch(self.hashes[:written].copy(), self.offsets), self.keys


def _reject_empty(items: list[Item], normalized: NormalizedBatch):
    """Turn documents with nothing left after normalization (only punctuation, say) into rejections."""
    empty = iter((normalized.lengths == 0).tolist())
    result: list[Item] = []
    for item in items:
        if isinstance(item, Document) and next(empty):
            item = Rejected("empty_text", "nothing is left after normalization", item.source, item.id)
        result.append(item)
    documents = [item for item in result if isinstance(item, Document)]
    keep = normalized.lengths > 0
    arrays = [normalized.points[s : s + n] for s, n in zip(normalized.starts[keep], normalized.lengths[keep])]
    contents = [c for c, k in zip(normalized.contents, keep.tolist()) if k]
    return result, documents, NormalizedBatch._joined(arrays, contents)


def preparing_process(parent: int) -> None:
    """A preparing process's set-up: its memory kept for reuse, and its end tied to ``parent``'s."""
    keep_freed_memory()
    die_with_parent(parent)


def die_with_parent(parent: int) -> None:
    """In the preparing process: exit as soon as the worker is gone (even after kill -9)."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def raw_payload(records: list) -> tuple:
    """Raw records as columns (values, keys, headers, timestamps, source names, partitions, offsets, rejected).

    Cheap to send to another process; ``raw_records`` turns them back.
    """
    return (
        [r.value for r in records],
        [r.key for r in records],
        [r.headers for r in records],
        [r.timestamp_ms for r in records],
        [r.source.name for r in records],
        [r.source.partition for r in records],
        [r.source.offset for r in records],
        [r.rejected for r in records],
    )


def raw_records(payload: tuple) -> list:
    """The RawRecords of ``raw_payload`` columns."""
    values, keys, headers, stamps, names, partitions, offsets, rejected = payload
    return [RawRecord(v, Source(n, p, o), k, h, t, u)
            for v, k, h, t, n, p, o, u in zip(values, keys, headers, stamps, names, partitions, offsets, rejected)]


def prepare_raw(payload, spec, signing: SigningConfig) -> PreparedBatch:
    """Decode ``raw_payload`` columns (or the lines of a ``FileBatch``) and prepare them."""
    return prepare(decode_raw(payload, spec), signing)


def decode_raw(payload, spec) -> list[Item]:
    """The items of ``raw_payload`` columns (or of the lines of a ``FileBatch``)."""
    if isinstance(payload, tuple):
        values, keys, headers, _, names, partitions, offsets, rejected = payload
        return decode_many(values, [Source(n, p, o) for n, p, o in zip(names, partitions, offsets)], spec, keys,
                           headers, rejected)
    if payload.format == "warc":
        return [decode_warc_line(v, source, spec) for v, source in zip(payload.values(), payload.sources())]
    return decode_many(payload.values(), payload.sources(), spec)


def prepare_compact(payload, spec, signing: SigningConfig) -> PreparedBatch:
    """``prepare_raw`` in the second process: items come back as small tuples (texts and sources stay behind)."""
    batch = prepare_raw(payload, spec, signing)
    batch.items = [("d", i.id) if isinstance(i, Document) else ("r", i.reason, i.detail, i.id) for i in batch.items]
    return batch


def restore_items(batch: PreparedBatch, sources: list) -> PreparedBatch:
    """Undo ``prepare_compact``: the items again as Documents and Rejected, with their records' sources."""
    batch.items = [
        Document(item[1], "", source) if item[0] == "d" else Rejected(item[1], item[2], source, item[3])
        for item, source in zip(batch.items, sources)
    ]
    return batch
