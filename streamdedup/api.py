"""The Python API: open an index, add documents, ask it questions.

::

    import streamdedup

    with streamdedup.open("state") as index:
        decision = index.add("doc-1", "some text")
        decisions = index.add_many([("doc-2", "more text"), {"id": "doc-3", "text": "..."}])

It is the engine the ``dedup`` command and the worker use, with the same
batches, index and guarantees: ``add_many`` decides ``worker.batch_size``
documents per index transaction, and each committed batch is durable. One
process writes an index at a time (a second writer gets
``IndexLockedError``); ``readonly=True`` opens it to ask questions while
another process writes. An ``Index`` is not thread-safe: use it from one
thread.
"""

from __future__ import annotations

import builtins
import os
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from . import config as config_module
from .core.decode import InputSpec, decode, decode_object, decode_pair
from .core.memory import collector_paused
from .core.records import Decision, Document, Item, Source
from .engine.engine import Engine
from .engine.explain import Explanation, explain
from .engine.query import ClusterView, Match, cluster_of, near_duplicates, stats_of, templates_learned
from .engine.shardset import VShardSet, opened_set
from .errors import ConfigError, StreamdedupError
from .store.check import CheckReport, check_index
from .store.housekeeping import ForgetReport

__all__ = ["open", "open_shards", "Index", "ShardedIndex", "Decision", "Match", "ClusterView", "Explanation", "ForgetReport", "CheckReport",
           "Record"]

PathLike = Union[str, "os.PathLike[str]"]
# (id, text), (id, text, url), a dict read by input.id_field / text_field / url_field, or a JSON line (bytes)
Record = Union[tuple, Mapping[str, Any], bytes]


def open(path: Optional[PathLike] = None, config: Union[config_module.Config, PathLike, None] = None, *,
         readonly: bool = False, **sections: Mapping[str, Any]) -> "Index":
    """Open (or create) the index in folder ``path``.

    ``config`` is a config.toml path or a ``Config`` (default: the built-in
    defaults; environment variables are not read). ``sections`` override
    keys by section, e.g. ``lsh={"threshold": 0.8}, index={"sync": False}``.
    ``path`` defaults to ``index.path``. An existing index keeps its own
    signing settings and refuses others (``IncompatibleIndexError``).
    ``readonly`` opens an existing index without the writer lock, to query it
    while another process writes.
    """
    cfg = config_of(config, sections)
    return Index(Engine(cfg, None if path is None else os.fspath(path), readonly=readonly), cfg, readonly)


def config_of(config: Union[config_module.Config, PathLike, None], sections: Mapping[str, Any]) -> config_module.Config:
    """The settings ``open`` works with: ``config`` (a ``config.toml`` path, a ``Config``, or None: the
    defaults), with ``sections`` over it."""
    if config is None:
        cfg = config_module.Config()
    elif isinstance(config, config_module.Config):
        cfg = config
    elif isinstance(config, (str, os.PathLike)):
        cfg = config_module.load(os.fspath(config), environ={})
    else:
        raise ConfigError(f"config is a config.toml path or a streamdedup Config, not a {type(config).__name__}")
    return config_module.with_values(cfg, sections) if sections else cfg


class Index:
    """An open deduplication index (see ``open``). Close it, or use it in a ``with`` block."""

    def __init__(self, engine: Engine, config: config_module.Config, readonly: bool):
        self._engine = engine
        self.config = config
        self.readonly = readonly
        self._spec = InputSpec.from_section(config.input)

    @property
    def path(self) -> str:
        """The index folder (absolute)."""
        return self._engine.index.path

    @property
    def engine(self) -> Engine:
        """The engine underneath, for the command line and the tests."""
        return self._engine

    # -- writing -------------------------------------------------------

    def add(self, id: Union[str, int], text: str, *, url: Optional[str] = None) -> Decision:
        """Decide one document and commit it; its ``Decision``.

        Adding one at a time costs a commit (an fsync with ``index.sync``) per
        document: use ``add_many`` for more than a few.
        """
        return self.add_many([(id, text, url)])[0]

    def add_many(self, records: Iterable[Record], *, batch_size: Optional[int] = None,
                 source: str = "python") -> list[Decision]:
        """Decide ``records`` in order, in batches committed one by one; one ``Decision`` per record, in order.

        A record is ``(id, text)``, ``(id, text, url)`` or a dict read with
        ``input.id_field``, ``text_field`` and ``url_field`` (dotted paths).
        Bad records are not exceptions: each gets a ``rejected`` decision with
        a reason (``missing_text``, ``text_not_string``, ``empty_text``,
        ``text_too_large``, ``bad_id``, ...). ``source`` is recorded with each
        document, with its position in ``records`` (from 1).
        """
        return list(self.add_stream(records, batch_size=batch_size, source=source))

    def add_stream(self, records: Iterable[Record], *, batch_size: Optional[int] = None,
                   source: str = "python") -> Iterator[Decision]:
        """``add_many`` lazily: reads ``records`` a batch at a time and yields each batch's decisions once committed.

        Nothing is decided until the iterator is consumed; a read-only index
        or a wrong ``batch_size`` is refused at once.
        """
        self._writable("add documents")
        size = self.config.worker.batch_size if batch_size is None else batch_size
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"batch_size must be an integer of at least 1, got {size!r}")
        return self._batches(records, size, source)

    def _batches(self, records: Iterable[Record], size: int, source: str) -> Iterator[Decision]:
        batch: list[Item] = []
        for number, record in enumerate(records, 1):
            batch.append(self._item(record, Source(source, -1, number)))
            if len(batch) >= size:
                yield from self._decided(batch)
                batch = []
        if batch:
            yield from self._decided(batch)

    def _decided(self, items: list[Item]) -> list[Decision]:
        engine = self._engine
        engine.between_batches()
        with collector_paused():
            prepared = engine.prepare(items)
        return engine.decide_batch(prepared)

    def _item(self, record: Record, where: Source) -> Item:
        if isinstance(record, tuple) and len(record) in (2, 3):
            return decode_pair(record[0], record[1], where, self._spec, record[2] if len(record) == 3 else None)
        if isinstance(record, Mapping):
            return decode_object(dict(record), where, self._spec)
        if isinstance(record, (bytes, bytearray)):  # a JSON line, as the ``dedup`` command reads it
            return decode(bytes(record), where, self._spec)
        return decode_object(record, where, self._spec)

    def forget(self, ids: Union[str, Iterable[str]]) -> ForgetReport:
        """Remove documents (every version of each id): takedowns, privacy requests.

        A forgotten representative dissolves its cluster: its members stay
        recorded, in no cluster. Unknown ids are listed in the report.
        """
        self._writable("forget documents")
        wanted = [ids] if isinstance(ids, str) else list(ids)
        return self._engine.forget(wanted)

    # -- reading -------------------------------------------------------

    def query(self, text: str, *, min_similarity: Optional[float] = None, limit: int = 20) -> list[Match]:
        """Kept documents at least ``min_similarity`` (default: the threshold) like ``text``, best first.

        Then the documents ``text`` is an excerpt of. Changes nothing.
        """
        return near_duplicates(self._engine, text, min_similarity, limit)

    def cluster(self, id: str, *, limit: Optional[int] = None) -> ClusterView:
        """The cluster ``id`` names (its representative) or belongs to; ``UnknownDocumentError`` if unknown.

        ``limit``: only the earliest so many members (None: all); ``members_total`` counts them all.
        """
        return cluster_of(self._engine, id, limit)

    def explain(self, id: str, other: Optional[str] = None, *,
                texts: Union[Mapping[str, Union[str, Sequence[str]]], PathLike, Sequence[PathLike], None] = None
                ) -> Explanation:
        """Why ``id`` was decided as it was, against ``other`` (default: its match).

        ``texts``: the documents' texts (a dict of id -> text), or input JSONL
        files to find them in (read with ``input.id_field``/``text_field``).
        Without texts, the explanation holds what the index knows: the
        match, the recorded similarity, and for two kept documents the exact
        similarity and shared bands. See ``engine.explain``.
        """
        return _explained(lambda *asked: explain(self._engine, *asked), id, other, texts, self._spec)

    def texts_in(self, paths: Sequence[PathLike], ids: Iterable[str]) -> dict[str, list[str]]:
        """Every text of ``ids`` in JSONL files (an id on several lines: each of its versions, in file order)."""
        return texts_in_files([os.fspath(p) for p in paths], set(ids), self._spec)

    def stats(self) -> dict[str, Any]:
        """Counts, sizes, positions and configuration of the index (the ``stats --json`` object)."""
        return stats_of(self._engine)

    def sites(self, host: Optional[str] = None, top: int = 10) -> dict[str, Any]:
        """What was learned of site templates: totals and the largest sites, or the one site ``host``."""
        return templates_learned(self._engine, host, top)

    def check(self, *, fix: bool = False) -> CheckReport:
        """Check the index's consistency; with ``fix``, rebuild its lookup tables from the records first.

        Returns the report of the index as it stands after (``report.ok``).
        """
        if fix:
            self._writable("rebuild the index's tables")
            self._engine.rebuild()
        return check_index(self._engine.index)

    # -- lifetime ------------------------------------------------------

    def _writable(self, doing: str) -> None:
        if self.readonly:
            raise StreamdedupError(f"cannot {doing}: the index at {self.path} was opened read-only "
                                   "(open it with readonly=False, when no other process writes it)")

    def close(self) -> None:
        """Release the index (and its writer lock). Everything added is already committed."""
        self._engine.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamdedup.Index {self.path!r}{' read-only' if self.readonly else ''}>"


def _explained(explain_pair, id: str, other: Optional[str], texts, spec: InputSpec) -> Explanation:
    """``explain_pair(id, other, texts)`` with ``texts`` a dict, or JSONL files read for the two documents only."""
    if texts is None or isinstance(texts, Mapping):
        return explain_pair(id, other, texts)
    paths = [texts] if isinstance(texts, (str, os.PathLike)) else list(texts)
    pair = explain_pair(id, other, None)  # which two documents: the files are read for those
    wanted = [pair.a.id] + ([] if pair.b is None else [pair.b.id])
    return explain_pair(id, other, texts_in_files([os.fspath(p) for p in paths], set(wanted), spec))


def open_shards(paths: Sequence[PathLike], config: Union[config_module.Config, PathLike, None] = None,
                **sections: Mapping[str, Any]) -> "ShardedIndex":
    """Open the vshards of a sharded deployment read-only, to ask them questions as one index (safe while they run).

    ``paths``: every vshard's state folder (``vshard-0`` ... ``vshard-N``),
    or the folder holding them. Each names its place, so an incomplete set
    (one missing, given twice, of another deployment, or a single worker's
    index among them) is refused with a ``ConfigError``. ``config`` and ``sections`` as for
    ``open`` (the threshold of ``query``, the input fields of ``explain``'s
    texts).
    """
    cfg = config_of(config, sections)
    return ShardedIndex(opened_set(cfg, [os.fspath(p) for p in paths]), InputSpec.from_section(cfg.input))


class ShardedIndex:
    """The vshards of a sharded deployment, read as one index (see ``open_shards``). Close it, or use it in a
    ``with`` block."""

    def __init__(self, shards: VShardSet, spec: InputSpec):
        self._shards = shards
        self._spec = spec

    @property
    def paths(self) -> list[str]:
        """Every vshard's folder (absolute), in vshard order."""
        return self._shards.paths

    @property
    def count(self) -> int:
        """How many vshards the deployment has (``shards.count``)."""
        return self._shards.count

    def owner(self, id: str) -> int:
        """The vshard every version of ``id`` lives in (its home)."""
        return self._shards.owner(id)

    def query(self, text: str, *, min_similarity: Optional[float] = None, limit: int = 20) -> list[Match]:
        """``Index.query`` over every vshard: the candidates of one index, each verified where it lives; best
        first, as one index ranks them."""
        return self._shards.query(text, min_similarity, limit)

    def cluster(self, id: str, *, limit: Optional[int] = None) -> ClusterView:
        """``Index.cluster`` over every vshard: the representative from its home, the members from every
        vshard, in decision order."""
        return self._shards.cluster(id, limit)

    def explain(self, id: str, other: Optional[str] = None, *,
                texts: Union[Mapping[str, Union[str, Sequence[str]]], PathLike, Sequence[PathLike], None] = None
                ) -> Explanation:
        """``Index.explain`` over every vshard: each document's record and stored shingles from its home."""
        return _explained(self._shards.explain, id, other, texts, self._spec)

    def sites(self, host: Optional[str] = None, top: int = 10) -> dict[str, Any]:
        """``Index.sites``: refused (a sharded deployment learns no site templates)."""
        return self._shards.sites(host, top)

    def stats(self) -> dict[str, Any]:
        """The deployment's counts and sizes, with each vshard's own under ``vshards``: documents, places,
        bytes, last commit."""
        return self._shards.stats()

    def close(self) -> None:
        """Release every vshard."""
        self._shards.close()

    def __enter__(self) -> "ShardedIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<streamdedup.ShardedIndex of {len(self.paths)} vshards>"


def texts_in_files(paths: Sequence[str], ids: set[str], spec: InputSpec) -> dict[str, list[str]]:
    """The texts of ``ids`` in JSONL files, each id's in file order; ids not found are left out.

    A line is decoded only if it may hold one of the ids: it holds an id's
    bytes, when every id is plain ASCII (no quote, backslash, slash, which
    JSON may escape, or colon: a
    colon may be a ``FILE:LINE`` id, named by no field); else every line.
    """
    found: dict[str, list[str]] = {}
    plain = all(i.isascii() and i.isprintable() and not any(c in i for c in '"\\/:') for i in ids)
    needles = [i.encode() for i in ids]
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"texts file {path!r} does not exist (or is not a file)")
        with builtins.open(path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if plain and not any(n in line for n in needles):
                    continue
                item = decode(line.rstrip(b"\r\n"), Source(path, -1, number), spec)
                if isinstance(item, Document) and item.id in ids:
                    found.setdefault(item.id, []).append(item.text)
    return found

