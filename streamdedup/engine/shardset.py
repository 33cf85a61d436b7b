"""The vshard states of a sharded deployment opened together, to be read as one index (``stats``, ``query``,
``cluster``, ``explain``).

Each state names its vshard, [number, count] (``engine.vshards``). The set
given is checked against them: every number from 0 to count - 1 once, one
count, one deployment's settings. A set with a vshard missing would answer
for part of the documents only, without saying so; it is refused instead,
as is a folder holding a single worker's index.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections import Counter
from typing import Optional, Sequence

from ..config import Config
from ..core.records import id_key
from ..errors import ConfigError, StreamdedupError
from ..store.vshardstate import is_vshard_state
from .explain import Explanation, explain_in
from .query import ClusterView, Match, best_first, cluster_in, exact_copy, near_matches, query_of
from .vshards.placement import homes_of
from .vshards.reading import VShardReader, first_document, holders_across

__all__ = ["VShardSet", "opened_set", "shard_folders"]

_SHARD_FOLDER = re.compile(r"vshard-(\d+)")
_SUMMED = ("documents", "clusters", "kept", "duplicates", "exact_duplicates", "index_bytes", "map_used_bytes",
           "map_size_bytes")


def opened_set(config: Config, paths: Sequence[str]) -> "VShardSet":
    """The vshard states ``paths`` name (``shard_folders``), opened read-only; a folder holding an index is
    refused."""
    folders = shard_folders(paths)
    indexes = [folder for folder in folders if not is_vshard_state(folder)]
    if indexes:
        raise ConfigError(f"{', '.join(indexes)} hold(s) an index, not a vshard's state: give the vshard-N folders "
                          "of one sharded deployment (a single worker's index is read with --state alone)")
    return VShardSet(config, folders)


def shard_folders(paths: Sequence[str]) -> list[str]:
    """The folders ``paths`` name: a folder holding an LMDB environment (``data.mdb``) is one vshard's; a
    folder holding none is the parent of ``vshard-0`` ... ``vshard-N`` folders (the layout of
    ``run --role vshards --state``)."""
    folders = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "data.mdb")):
            folders.append(path)
            continue
        children = sorted((int(m.group(1)), m.group(0)) for m in map(_SHARD_FOLDER.fullmatch, _listing(path)) if m)
        found = [os.path.join(path, name) for _, name in children
                 if os.path.isfile(os.path.join(path, name, "data.mdb"))]
        if not found:
            raise ConfigError(f"{path} holds no vshard state (data.mdb) and no vshard-N folders with one: give each "
                              "vshard's folder, or the folder holding vshard-0 ... vshard-N")
        folders += found
    twice = sorted(path for path, n in Counter(os.path.realpath(f) for f in folders).items() if n > 1)
    if twice:
        raise ConfigError(f"the same vshard is given more than once: {', '.join(twice)}: give each vshard once")
    return folders


def _listing(path: str) -> list[str]:
    if not os.path.isdir(path):
        raise ConfigError(f"no vshard state at {path!r}: no such folder; give each vshard's folder, or the folder "
                          "holding vshard-0 ... vshard-N")
    try:
        return os.listdir(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the index folder {path!r}: {exc.strerror or exc}") from None


class VShardSet:
    """Every vshard state of a sharded deployment, opened read-only, in vshard order, answering as one index
    (safe while the vshards run: each question reads every state in a short transaction of its own)."""

    def __init__(self, config: Config, folders: Sequence[str]):
        self.readers: list[VShardReader] = []
        try:
            for path in folders:
                self.readers.append(VShardReader(config, path))
            order = complete_set([(reader.index.path, reader.place) for reader in self.readers])
            self.readers = [self.readers[n] for n in order]
            _refuse_other_settings(self.readers)
        except BaseException:
            self.close()
            raise
        self.count = len(self.readers)

    @property
    def paths(self) -> list[str]:
        return [reader.index.path for reader in self.readers]

    def owner(self, doc_id: str) -> int:
        """The home of every version of ``doc_id``."""
        return int(homes_of([id_key(doc_id)], self.count)[0])

    def query(self, text: str, min_similarity: Optional[float] = None, limit: int = 20) -> list[Match]:
        """``near_duplicates`` of one index: each band key's holders from its owner, each verified at its home,
        the first document of the text's content from the content's owner."""
        floor, batch = query_of(self.readers[0], text, min_similarity)
        with contextlib.ExitStack() as stack:
            txns = [stack.enter_context(reader.index.read()) for reader in self.readers]
            homes = holders_across(self.readers, txns, batch.sorted_slots()[0])
            near = near_matches(list(homes), lambda serial: txns[homes[serial]], batch.shingles.of(0), floor)
            first = first_document(self.readers, txns, batch.contents[0])
            twin = None if first is None else exact_copy(first[0], txns[first[1]].record(first[0]))
        return best_first([(near, twin, {})], limit)

    def cluster(self, doc_id: str, limit: Optional[int] = None) -> ClusterView:
        return cluster_in(self.readers, doc_id, limit, self.owner)

    def explain(self, doc_id: str, other: Optional[str] = None, texts: Optional[dict] = None) -> Explanation:
        return explain_in(self.readers, doc_id, other, texts, self.owner)

    def sites(self, host: Optional[str] = None, top: int = 10) -> dict:
        raise StreamdedupError("a deployment with band tables split by key learns no site templates (it refuses "
                               "templates.enabled): there is nothing to show of a site")

    def stats(self) -> dict:
        """The deployment's counts (documents, kept, duplicates: a document is kept where it has shingles), and
        each vshard's under ``vshards``: its documents, the places its band keys hold, its bytes, its last
        commit. Each vshard is counted as of its last commit."""
        each = []
        for reader in self.readers:
            with reader.index.read() as txn:
                each.append({"path": reader.index.path, "number": reader.place[0], **reader.state.sizes(txn),
                             "index_bytes": os.path.getsize(os.path.join(reader.index.path, "data.mdb")),
                             "committed": reader.state.committed(txn)})
        documents, kept = sum(v["documents"] for v in each), sum(v["kept"] for v in each)
        return {
            "count": self.count,
            "documents": documents,
            "kept": kept,
            "clusters": kept,
            "duplicates": documents - kept,
            "duplicate_rate": (documents - kept) / documents if documents else 0.0,
            "places": sum(v["places"] for v in each),
            "index_bytes": sum(v["index_bytes"] for v in each),
            "fingerprint": self.readers[0].signing.fingerprint(),
            "config": self.readers[0].signing.as_dict(),
            "vshards": each,
        }

    def close(self) -> None:
        for reader in self.readers:
            reader.close()


def _refuse_other_settings(readers: list[VShardReader]) -> None:
    """Refuse vshards made with other settings (signing, threshold, cap: another deployment of the same size)."""
    made = {reader.index.path: json.dumps({key: value for key, value in reader.state.identity.items()
                                           if key != "number"}, sort_keys=True) for reader in readers}
    if len(set(made.values())) > 1:
        raise ConfigError("these vshards were made with different settings (" + "; ".join(
            f"{path}: {settings}" for path, settings in made.items()) + "): give the vshards of one deployment")


def complete_set(places: list[tuple[str, list]]) -> list[int]:
    """The positions in ``places`` ((folder, [number, count]) each) in vshard order, once they are every vshard
    of one deployment, each once."""
    if not places:
        raise ConfigError("no vshard given: give every vshard's folder")
    counts = sorted({count for _, (_, count) in places})
    if len(counts) > 1:
        raise ConfigError("these folders hold vshards of deployments of different sizes ("
                          + ", ".join(f"{path}: vshard {n} of {c}" for path, (n, c) in places)
                          + "): give the vshards of one deployment")
    count = counts[0]
    holders: dict[int, list[str]] = {}
    for path, (number, _) in places:
        holders.setdefault(number, []).append(path)
    twice = {n: paths for n, paths in holders.items() if len(paths) > 1}
    if twice:
        raise ConfigError("the same vshard is given more than once: " + "; ".join(
            f"vshard {n} in {' and '.join(sorted(paths))}" for n, paths in sorted(twice.items()))
            + " (a backup and its vshard, or a folder given twice?): give each vshard once")
    missing = sorted(set(range(count)) - set(holders))
    if missing:
        raise ConfigError(f"the deployment has {count} vshards, and vshard(s) {', '.join(map(str, missing))} "
                          f"{'is' if len(missing) == 1 else 'are'} not given: give every vshard's folder "
                          "(answers from part of the vshards would miss documents)")
    return sorted(range(len(places)), key=lambda i: places[i][1][0])
