"""A lost index folder (a dead disk, a replaced volume) brought back: ``streamdedup restore``.

Kafka keeps what the worker emitted and, in the group's committed offsets,
how far it emitted; the index keeps decisions and the input positions they
cover. A restored index is older than Kafka's offsets, which is the state
the worker already recovers from after a crash between its Kafka commit and
its index commit (``checkpoint``): at its next start, wherever the group's
committed offset is ahead of the index's position, the records in between
are replayed into the index *without emitting*. So a restore only has to
put an index with the right positions in place, and the worker does the rest:

- from a backup (``streamdedup backup``): its ``data.mdb``, checked against
  the configuration, copied in whole (a new file, synced, then renamed) with
  the folder's stale side files (LMDB's lock file, the saved band-key filter)
  removed. The index id comes with it, and with it the worker's derived
  transactional id;
- without a backup (``--from-topics``): a new, empty index whose position on
  every input partition is the partition's first offset still in Kafka
  (what retention kept). The next start replays everything up to the
  committed offsets into it without emitting. Records retention deleted
  are gone: the index never learns them, so a later copy of one of them is
  kept and emitted to the clean topic a second time.

A shard's index of a sharded deployment is restored from its backup the
same way: it keeps its place (shard number and count) and its positions in
the signed and evidence topics, and at its next start the shard decides
again, without emitting, the signed batches its group committed after them
(``runtime.shards.shard.ShardSession.recover``), from every shard's evidence
still in the evidence topic. Shards are restored one by one, each from any
backup of its own taken since the topics' retention: their backups need not
be taken at the same moment. A shard cannot be rebuilt from the input topics.

The folder's writer lock is held throughout, so a running worker is never
swapped out from under.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Optional

from ..config import Config
from ..engine.engine import Engine, index_settings
from ..engine.shards.shard import PLACE as SHARD_PLACE
from ..errors import ConfigError, IndexUnusableError
from ..store.bandfilter import FILE_NAME as BAND_FILTER_FILE
from ..store.index import take_writer_lock
from .checkpoint import SHARD_POSITIONS, WORKER_POSITIONS, KafkaCommit

__all__ = ["Restored", "restore_backup", "restore_from_topics"]

_STALE = ("lock.mdb", BAND_FILTER_FILE, BAND_FILTER_FILE + ".new")  # belong to the index that was there
_STAGING = ".restoring"  # the folder a restore builds the new index in, inside the index folder


@dataclass
class Restored:
    """What a restore put in place: the index's documents and id, and its positions (name -> offset)."""

    path: str
    documents: int
    index_id: str
    positions: dict = field(default_factory=dict)
    shard: Optional[list] = None  # a shard's index: [number, count]

    def lines(self) -> list[str]:
        found = [f"restored {self.documents:,} documents into {self.path} (index {self.index_id[:16]})"
                 + ("" if self.shard is None else f", shard {self.shard[0]} of {self.shard[1]}")]
        for name, offset in sorted(self.positions.items()):
            found.append(f"position {name} {offset}")
        if self.shard is None:
            found.append("start the worker: it replays what was emitted after these positions (the group's "
                         "committed offsets) into the index without emitting it again, then carries on")
        else:
            found.append(f"start the shard (run --role shard --shard {self.shard[0]}): it decides again, without "
                         "emitting, the signed batches its group committed after shards:signed, from every shard's "
                         "evidence still in the evidence topic, then carries on")
        return found


def restore_backup(config: Config, state: Optional[str], backup: str, replace: bool = False) -> Restored:
    """Put the backup at ``backup`` (a folder holding ``data.mdb``, or the file) in the index folder ``state``."""
    source = backup if os.path.basename(backup) == "data.mdb" else os.path.join(backup, "data.mdb")
    if not os.path.isfile(source):
        raise ConfigError(f"no backup at {backup!r}: give the folder `streamdedup backup` wrote (it holds data.mdb)")
    path = index_settings(config, state).path
    lock = take_writer_lock(path)
    try:
        _refuse_existing(path, replace)
        staging = _fresh_staging(path)
        shutil.copyfile(source, os.path.join(staging, "data.mdb"))
        _sync(os.path.join(staging, "data.mdb"))
        with Engine(config, staging) as engine:  # refuses another format or another signing configuration
            restored = _described(engine, path)
        _swap_in(path, staging)
        return restored
    finally:
        lock.close()


def restore_from_topics(config: Config, state: Optional[str], replace: bool = False) -> Restored:
    """A new index at ``state`` positioned at the first offset Kafka still holds on every input partition."""
    from .feed import kafka_reading

    if config.shards.count:
        raise ConfigError("a shard's index cannot be rebuilt from the input topics (it needs every signed batch and "
                          "every shard's evidence since the deployment began): restore it from its backup, or "
                          "rebuild the whole sharded index (deploy/README.md, \"Backing up and restoring a sharded "
                          "index\")")
    path = index_settings(config, state).path
    lock = take_writer_lock(path)
    try:
        _refuse_existing(path, replace)
        staging = _fresh_staging(path)
        source = kafka_reading(config, list(config.input.topics), config.kafka.group_id).source()
        try:
            partitions = source.partitions()
            firsts = source.consumer.beginning_offsets(partitions)
        finally:
            source.close()
        with Engine(config, staging) as engine:
            KafkaCommit(engine, None, None, config.kafka.group_id, WORKER_POSITIONS).set_positions(firsts)
            restored = _described(engine, path)
        _swap_in(path, staging)
        return restored
    finally:
        lock.close()


def _refuse_existing(path: str, replace: bool) -> None:
    if os.path.exists(os.path.join(path, "data.mdb")) and not replace:
        raise IndexUnusableError(
            f"{path} already holds an index (data.mdb); a restore replaces it only with --replace. "
            "Keep a copy first (`streamdedup backup`) if it may still be needed"
        )


def _fresh_staging(path: str) -> str:
    staging = os.path.join(path, _STAGING)
    shutil.rmtree(staging, ignore_errors=True)  # left by a restore that was interrupted
    os.makedirs(staging)
    return staging


def _described(engine: Engine, path: str) -> Restored:
    with engine.index.read() as txn:
        documents = txn.counters["documents"]
        every = txn.positions()
    shard = every.get(SHARD_PLACE)
    prefix = SHARD_POSITIONS if shard is not None else WORKER_POSITIONS + ":"
    positions = {name: value for name, value in every.items() if name.startswith(prefix)}
    return Restored(path, documents, engine.index.meta["index_id"], positions, shard)


def _swap_in(path: str, staging: str) -> None:
    """Rename the staged ``data.mdb`` over the folder's, drop the old index's side files, sync the folder."""
    for name in _STALE:
        try:
            os.remove(os.path.join(path, name))
        except FileNotFoundError:
            pass
    os.replace(os.path.join(staging, "data.mdb"), os.path.join(path, "data.mdb"))
    shutil.rmtree(staging)
    _sync(path)


def _sync(path: str) -> None:
    """fsync a file or a folder (a rename is durable once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
