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

A vshard's state of a sharded deployment (its folder ``vshard-N``: an
LMDB environment with a vshard's tables, ``store.vshardstate``) is backed up
and restored the same way, checked against the deployment's settings and
against the folder's number. It keeps its positions (the next order
message, the input offsets, the next serial, where to read its records and
exchange partitions from), and the next host given the vshard decides the
epochs after them again from the order, records and exchange topics,
emitting nothing its group committed (``checkpoint``, "A virtual shard").
Vshards are restored one by one, each from any backup of its own taken
since the topics' retention. A vshard cannot be rebuilt from the input
topics.

The folder's writer lock is held throughout, so a running worker is never
swapped out from under.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Optional

from ..config import Config
from ..core.signing import signing_config
from ..engine.engine import Engine, index_settings
from ..engine.settings import DedupSettings
from ..engine.vshards import VShard
from ..errors import ConfigError, IndexUnusableError
from ..store.bandfilter import FILE_NAME as BAND_FILTER_FILE
from ..store.index import take_writer_lock
from ..store.vshardstate import StoredVShard, is_vshard_state
from .checkpoint import WORKER_POSITIONS, KafkaCommit

__all__ = ["Restored", "restore_backup", "restore_from_topics"]

_STALE = ("lock.mdb", BAND_FILTER_FILE, BAND_FILTER_FILE + ".new")  # belong to the index that was there
_STAGING = ".restoring"  # the folder a restore builds the new index in, inside the index folder


@dataclass
class Restored:
    """What a restore put in place: the index's documents and id, and its positions (name -> offset)."""

    path: str
    documents: int
    index_id: str  # a vshard's state has none
    positions: dict = field(default_factory=dict)
    vshard: Optional[list] = None  # a vshard's state: [number, count]

    def lines(self) -> list[str]:
        if self.vshard is not None:
            return self._vshard_lines()
        found = [f"restored {self.documents:,} documents into {self.path} (index {self.index_id[:16]})"]
        found += [f"position {name} {offset}" for name, offset in sorted(self.positions.items())]
        found.append("start the worker: it replays what was emitted after these positions (the group's "
                     "committed offsets) into the index without emitting it again, then carries on")
        return found

    def _vshard_lines(self) -> list[str]:
        number, count = self.vshard
        found = [f"restored {self.documents:,} documents into {self.path}, vshard {number} of {count}"]
        found += [f"position {name} {json.dumps(value, sort_keys=True)}"
                  for name, value in sorted(self.positions.items())]
        found.append("start the vshards hosts (run --role vshards, --state the folder holding vshard-N): the one given "
                     f"vshard {number} decides again the epochs after these positions from the order, records and "
                     "exchange topics, emitting nothing its group committed, then carries on")
        return found


def restore_backup(config: Config, state: Optional[str], backup: str, replace: bool = False) -> Restored:
    """Put the backup at ``backup`` (a folder holding ``data.mdb``, or the file) in the index folder ``state``: an
    index, or a vshard's state."""
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
        if is_vshard_state(staging):
            restored = _checked_vshard(config, staging, path)
        else:
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
        raise ConfigError("a vshard's state cannot be rebuilt from the input topics (it needs every epoch and every "
                          "vshard's messages since the deployment began): restore it from its backup (deploy/README.md, "
                          "\"Backing up and restoring a vshard\")")
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
    positions = {name: value for name, value in every.items() if name.startswith(WORKER_POSITIONS + ":")}
    return Restored(path, documents, engine.index.meta["index_id"], positions)


def _checked_vshard(config: Config, staging: str, path: str) -> Restored:
    """The vshard state staged at ``staging`` for the folder ``path``, refused unless it is the vshard the folder
    is named for (``vshard-N``) with the deployment's count and settings (``VShard`` refuses another)."""
    stored = StoredVShard(staging)
    try:
        number, count = stored.identity["number"], stored.identity["count"]
        with stored.index.read() as txn:
            documents, committed = stored.sizes(txn)["documents"], stored.committed(txn)
    finally:
        stored.close()
    named = os.path.basename(path.rstrip(os.sep))
    if named.startswith("vshard-") and named != f"vshard-{number}":
        raise IndexUnusableError(f"the backup holds vshard {number}, not {named}: restore each vshard's backup "
                                 f"into its own folder (vshard-{number})")
    if count != config.shards.count:
        raise ConfigError(f"the backup holds vshard {number} of {count}, the configuration has shards.count = "
                          f"{config.shards.count}: give the deployment's configuration")
    VShard(number, count, DedupSettings.of(config, signing_config(config)), path=staging).close()
    positions = {"epochs_done": committed["epochs_done"], **committed["meta"]}
    return Restored(path, documents, "", positions, [number, count])


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
