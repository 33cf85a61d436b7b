"""The shards of a sharded index opened together, to be read as one index (``stats``, ``query``, ``cluster``,
``explain``).

Each shard's index names its place (position ``shard``: [number, count],
written at its first start by ``ShardEngine``), so the set given is checked
against it: every number from 0 to count - 1 once, one count. A set with a
shard missing would answer for part of the documents only, without saying
so; it is refused instead.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Optional, Sequence

from ..config import Config
from ..core.records import id_key
from ..errors import ConfigError
from .engine import Engine
from .explain import Explanation, explain_in
from .query import ClusterView, Match, cluster_in, near_duplicates_in
from .evidence import owner_of
from .shards.shard import PLACE

__all__ = ["ShardSet", "shard_folders"]

_SHARD_FOLDER = re.compile(r"shard-(\d+)")


def shard_folders(paths: Sequence[str]) -> list[str]:
    """The index folders ``paths`` name: a folder holding an index (``data.mdb``) is one shard's; a folder
    holding none is the parent of ``shard-0`` ... ``shard-N`` folders (the layout of deploy/ and the demo)."""
    folders = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "data.mdb")):
            folders.append(path)
            continue
        children = sorted((int(m.group(1)), m.group(0)) for m in map(_SHARD_FOLDER.fullmatch, _listing(path)) if m)
        found = [os.path.join(path, name) for _, name in children if os.path.isfile(os.path.join(path, name,
                                                                                                  "data.mdb"))]
        if not found:
            raise ConfigError(f"{path} holds no index (data.mdb) and no shard-N folders with one: give each "
                              "shard's index folder, or the folder holding shard-0 ... shard-N")
        folders += found
    twice = sorted(path for path, n in Counter(os.path.realpath(f) for f in folders).items() if n > 1)
    if twice:
        raise ConfigError(f"the same shard is given more than once: {', '.join(twice)}: give each shard once")
    return folders


def _listing(path: str) -> list[str]:
    if not os.path.isdir(path):
        raise ConfigError(f"no index at {path!r}: no such folder; give each shard's index folder, or the folder "
                          "holding shard-0 ... shard-N")
    try:
        return os.listdir(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the index folder {path!r}: {exc.strerror or exc}") from None


class ShardSet:
    """Every shard of a sharded index, opened read-only, in shard order (safe while the shards run)."""

    def __init__(self, config: Config, paths: Sequence[str]):
        self.engines: list[Engine] = []
        try:
            places = []
            for path in shard_folders(paths):
                engine = Engine(config, path, readonly=True)
                self.engines.append(engine)
                places.append((engine.index.path, _place_of(engine)))
            order = complete_set(places)
            self.engines = [self.engines[n] for n in order]
        except BaseException:
            self.close()
            raise
        self.count = len(self.engines)

    def owner(self, doc_id: str) -> int:
        """The shard holding every version of ``doc_id``."""
        return owner_of(id_key(doc_id), self.count)

    def query(self, text: str, min_similarity: Optional[float] = None, limit: int = 20) -> list[Match]:
        return near_duplicates_in(self.engines, text, min_similarity, limit)

    def cluster(self, doc_id: str, limit: Optional[int] = None) -> ClusterView:
        return cluster_in(self.engines, doc_id, limit, self.owner)

    def explain(self, doc_id: str, other: Optional[str] = None, texts: Optional[dict] = None) -> Explanation:
        return explain_in(self.engines, doc_id, other, texts, self.owner)

    def close(self) -> None:
        for engine in self.engines:
            engine.close()

    def __enter__(self) -> "ShardSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _place_of(engine: Engine) -> list:
    with engine.index.read() as txn:
        place = txn.position(PLACE)
    if place is None:
        raise ConfigError(f"{engine.index.path} is not a shard's index (it names no shard): a single worker's "
                          "index is read with --state alone")
    return place


def complete_set(places: list[tuple[str, list]]) -> list[int]:
    """The positions in ``places`` ((folder, [number, count]) each) in shard order, once they are every shard
    of one index, each once."""
    if not places:
        raise ConfigError("no shard given: give every shard's index folder")
    counts = sorted({count for _, (_, count) in places})
    if len(counts) > 1:
        raise ConfigError("these folders hold shards of deployments of different sizes ("
                          + ", ".join(f"{path}: shard {n} of {c}" for path, (n, c) in places)
                          + "): give the shards of one sharded index")
    count = counts[0]
    holders: dict[int, list[str]] = {}
    for path, (number, _) in places:
        holders.setdefault(number, []).append(path)
    twice = {n: paths for n, paths in holders.items() if len(paths) > 1}
    if twice:
        raise ConfigError("the same shard is given more than once: " + "; ".join(
            f"shard {n} in {' and '.join(sorted(paths))}" for n, paths in sorted(twice.items()))
            + " (a backup and its shard, or a folder given twice?): give each shard once")
    missing = sorted(set(range(count)) - set(holders))
    if missing:
        raise ConfigError(f"the index has {count} shards, and shard(s) {', '.join(map(str, missing))} "
                          f"{'is' if len(missing) == 1 else 'are'} not given: give every shard's folder "
                          "(answers from part of the shards would miss documents)")
    return sorted(range(len(places)), key=lambda i: places[i][1][0])
