"""Where the worker's batches come from: read from Kafka and prepared, one batch ahead of the decisions.

A feed hands out batches in the canonical order (``KafkaSource.poll_batch``),
each already decoded and prepared (normalized, shingled, signed), with the
consumer's positions after it (for the lag). Reading and preparing are pure:
they change no state, so where they run changes no decision.

- ``ProcessFeed`` (``worker.prepare_processes = 1``, the default) runs its
  own consumer in a second process, spawned so it shares no Kafka client,
  LMDB environment or lock with the worker. It polls and prepares the next
  batch while the worker decides and commits the current one, so both cores
  work, and the worker's own thread is left with deciding and producing.
- ``InlineFeed`` (``worker.prepare_processes = 0``) polls and prepares in the
  worker's own thread.

Offsets never move here: the worker commits the input offsets after each
batch it decided (``checkpoint.KafkaCommit``). A feed that is dropped takes
its unread batches with it; the next session reads them again.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..config import Config, kafka_client_settings
from ..core.records import RawRecord, Source, canonical_order
from ..errors import BrokerError, BrokerUnavailableError, kafka_trouble
from .source import KafkaSource

if TYPE_CHECKING:
    from ..core.prepare import PreparedBatch

# This module imports nothing heavy at the top (numpy, LMDB: see ``prepare``), so the command line can
# spawn the feed process first thing, and the process imports them while the worker does the same.

__all__ = ["FedBatch", "InlineFeed", "ProcessFeed", "FeedSettings", "feed_settings", "spawn_feed"]

FILL_WAIT_MS = 50  # longest wait for more records to top up a batch (see ``_filled``)
STOP_GRACE_S = 0.05  # how long a feed process told to stop may take before it is killed
BOOT_TIMEOUT_S = 120.0  # a feed process that has not said a word by then is reported as stuck


@dataclass
class FedBatch:
    """Records in the canonical order and their prepared batch."""

    records: list[RawRecord]
    prepared: PreparedBatch
    at_end: bool  # the batch reached the end of every partition, as of the last fetch


@dataclass(frozen=True)
class FeedSettings:
    """What a feed needs to read the input topics (everything picklable, for the second process)."""

    topics: tuple
    client_settings: dict
    group_id: str
    batch_size: int
    poll_timeout_ms: int

    def source(self) -> KafkaSource:
        return KafkaSource(list(self.topics), self.client_settings, self.group_id, self.batch_size)


def feed_settings(config: Config, topics: list[str], group_id: str) -> FeedSettings:
    """The settings of a feed reading ``topics`` for ``group_id`` under ``config``."""
    return FeedSettings(tuple(topics), kafka_client_settings(config.kafka, "consumer"), group_id,
                        config.worker.batch_size, config.worker.poll_timeout_ms)


def spawn_feed(config: Config, topics: list[str], group_id: str, warm_up) -> "ProcessFeed":
    """A feed process for ``topics`` and ``group_id`` under ``config`` (``warm_up``: see ``ProcessFeed``)."""
    from ..core.decode import InputSpec

    return ProcessFeed(feed_settings(config, topics, group_id), InputSpec.from_section(config.input), warm_up)


class InlineFeed:
    """Polls and prepares in this thread, with the worker's own consumer."""

    def __init__(self, source: KafkaSource, spec, signing, starts: dict, limit: Optional[dict] = None):
        self.source = source
        self.spec = spec
        self.signing = signing
        self.limit = limit
        self.positions = dict(starts)

    def next(self, timeout_ms: int) -> Optional[FedBatch]:
        from ..core.prepare import prepare_raw, raw_payload

        records = self.source.poll_batch(timeout_ms, limit=self.limit)
        self.positions = {p: self.source.position(p) for p in self.positions}
        if not records:
            return None
        return FedBatch(records, prepare_raw(raw_payload(records), self.spec, self.signing),
                        self.source.read_to_end(list(self.positions)))

    def fetch_ahead(self) -> None:
        pass

    def close(self) -> None:
        pass


class ProcessFeed:
    """A second process that polls and prepares the next batches while this one decides.

    It is spawned as soon as the feed is made (its imports, connection and
    warm-up overlap the worker's start and recovery) and starts reading once
    ``start`` gives it the positions and the index's signing settings. At
    most three batches are ahead: one received here, one in the pipe, one
    being prepared.

    ``warm_up`` is what the process prepares a made-up batch with while it
    waits: the index's ``SigningConfig``, or the ``Config`` when the index is
    not open yet (the command line spawns the feed before anything else).
    """

    def __init__(self, settings: FeedSettings, spec, warm_up):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._orders = context.Queue()
        self._batches = context.Queue(maxsize=1)
        self._stop = context.Event()
        self._process = context.Process(target=_feed_main, name="streamdedup-feed", daemon=True,
                                        args=(settings, spec, warm_up, self._orders, self._batches, self._stop,
                                              os.getpid()))
        self._process.start()
        self._received: queue.Queue = queue.Queue(maxsize=1)  # messages taken off the pipe, records rebuilt
        self._wanted = threading.Event()
        self._started_at = 0.0
        self._heard = False
        self._closing = threading.Event()
        self.positions: dict = {}

    def start(self, starts: dict, signing, limit: Optional[dict] = None, spec=None) -> None:
        """Read from ``starts`` (partition -> offset) on, stopping at ``limit`` where given.

        ``spec`` replaces the ``InputSpec`` the process was made with: the
        session learns the clean topic's size limit only once it is connected.
        """
        self.positions = dict(starts)
        self._orders.put((starts, signing, limit, spec))
        self._started_at = time.monotonic()
        threading.Thread(target=self._receive, name="streamdedup-feed-receiver", daemon=True).start()

    def fetch_ahead(self) -> None:
        """Take the next batch off the pipe now: the worker is about to wait for Kafka and the disk.

        Unpickling a batch and rebuilding its records takes 15-25 ms of this
        process's time. Done on the receiving thread while the worker's
        thread waits (the GIL is free then), it no longer delays the next batch.
        """
        self._wanted.set()

    def next(self, timeout_ms: int) -> Optional[FedBatch]:
        """The next batch, or None when none came within ``timeout_ms``."""
        try:
            message = self._received.get_nowait()
        except queue.Empty:
            self._wanted.set()
            try:
                message = self._received.get(timeout=timeout_ms / 1000)
            except queue.Empty:
                self._check_alive()
                return None
        self._heard = True
        kind = message[0]
        if kind == "error":
            _, name, text, retriable = message
            raise (BrokerUnavailableError if retriable else BrokerError)(f"reading the input topics: {name}: {text}")
        self.positions = message[1]
        if kind == "idle":
            return None
        return FedBatch(message[3], message[4], message[2])

    def _receive(self) -> None:
        """On a thread: when wanted, take the next message off the pipe and rebuild its records."""
        from ..core.prepare import raw_records, restore_items

        while not self._closing.is_set():
            if not self._wanted.wait(0.2):
                continue
            try:
                message = self._batches.get(timeout=0.2)
            except queue.Empty:
                continue
            except (OSError, ValueError, EOFError):  # the queue was closed under us: the feed is closing
                return
            self._wanted.clear()
            if message[0] == "batch":
                records = raw_records(message[3])
                message = (*message[:3], records, restore_items(message[4], [r.source for r in records]))
            if not _hand_over(self._received, message, self._closing):
                return

    def _check_alive(self) -> None:
        if not self._process.is_alive():
            raise BrokerUnavailableError(f"the process reading the input topics ended (exit code "
                                         f"{self._process.exitcode}); starting it again")
        if not self._heard and self._started_at and time.monotonic() - self._started_at > BOOT_TIMEOUT_S:
            raise BrokerUnavailableError("the process reading the input topics has not answered in "
                                         f"{BOOT_TIMEOUT_S:.0f} s; starting it again")

    def close(self) -> None:
        """Stop the process (again: nothing).

        It is told to stop, and killed if it has not within ``STOP_GRACE_S``
        (a poll in progress would keep it up to ``worker.poll_timeout_ms``).
        That is safe: it writes nothing anywhere and its consumer is no
        group member, so nothing of it needs a clean close.
        """
        if self._closing.is_set():
            return
        self._closing.set()
        self._stop.set()
        self._process.join(timeout=STOP_GRACE_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        for q in (self._orders, self._batches):
            q.cancel_join_thread()
            q.close()


def _feed_main(settings: FeedSettings, spec, warm_up, orders, batches, stop, parent: int) -> None:
    """In the feed process: poll, prepare, hand over, until told to stop (or the worker is gone)."""
    import signal

    from ..core.prepare import preparing_process

    for sig in (signal.SIGINT, signal.SIGTERM):  # the worker decides when this process stops (Ctrl-C hits both)
        signal.signal(sig, signal.SIG_IGN)
    preparing_process(parent)
    batches.cancel_join_thread()  # at exit, do not wait for the worker to read what is still queued
    source = None
    warming = threading.Thread(target=_warm_up, args=(warm_up, settings.batch_size), name="warm-up", daemon=True)
    warming.start()  # mostly page faults and numpy (no GIL): overlaps the connection's network waits
    try:
        source = settings.source()
        source.partitions()  # connects and learns the topics now, while the worker recovers
        warming.join()
        starts, signing, limit, given_spec = _wait_for_orders(orders, stop)
        if starts is None:
            return
        spec = given_spec or spec
        partitions = list(starts)
        source.assign(partitions)
        for p, offset in starts.items():
            source.seek(p, offset)
        _feed_batches(source, partitions, settings.poll_timeout_ms, limit, spec, signing, batches, stop)
    except Exception as exc:  # reported to the worker, which starts a new session
        trouble = kafka_trouble(exc)
        retriable = trouble is not None and trouble.retriable
        _hand_over(batches, ("error", type(exc).__name__, str(trouble or exc)[:500], retriable), stop)
    finally:
        if source is not None:
            try:
                source.close()
            except Exception:  # the broker may be gone; nothing of ours is pending in the consumer
                pass


def _warm_up(warm_up, documents: int) -> None:
    """Prepare a made-up batch of the real size: builds the Unicode tables and the memory the batches use.

    Otherwise the first real batches pay for it (measured: a second more
    for a 50,000-record run), while the worker waits for them.
    """
    from ..core.prepare import prepare
    from ..core.records import Document
    from ..core.signing import signing_config

    signing = signing_config(warm_up) if isinstance(warm_up, Config) else warm_up
    words = " ".join(f"warmingup{i:03d}" for i in range(175))  # about the size of a crawled page
    prepare([Document(f"warm-up-{i}", f"{words} {i}" + (" \u00e9" if i % 100 == 0 else ""), Source("warm-up", -1, i))
             for i in range(documents)], signing)


def _wait_for_orders(orders, stop) -> tuple:
    while not stop.is_set():
        try:
            return orders.get(timeout=0.2)
        except queue.Empty:
            continue
    return None, None, None, None


def _feed_batches(source: KafkaSource, partitions: list, timeout_ms: int, limit, spec, signing, batches,
                  stop) -> None:
    from ..core.prepare import prepare_compact, raw_payload

    told = None
    while not stop.is_set():
        records = _filled(source, source.poll_batch(timeout_ms, limit=limit), limit, batches)
        positions = {p: source.position(p) for p in partitions}
        if records:
            payload = raw_payload(records)
            at_end = source.read_to_end(partitions)
            message = ("batch", positions, at_end, payload, prepare_compact(payload, spec, signing))
        elif positions != told:
            message = ("idle", positions)  # e.g. a transaction marker was read past: the lag moved
        else:
            continue
        if not _hand_over(batches, message, stop):
            return
        told = positions


def _filled(source: KafkaSource, records: list, limit, batches) -> list:
    """``records`` topped up to a whole batch while the worker has not taken the previous one yet.

    A fetch often holds less than a batch. Whole batches share the costs
    of each commit; a partial one goes at once to a worker that waits.
    """
    while records and len(records) < source.batch_size and batches.full():
        more = source.poll_batch(FILL_WAIT_MS, limit=limit, max_records=source.batch_size - len(records))
        if not more:
            break
        records = canonical_order(records + more)
    return records


def _hand_over(batches, message, stop) -> bool:
    """Put ``message`` for the next stage, waiting while one is still unread; False if told to stop meanwhile."""
    while not stop.is_set():
        try:
            batches.put(message, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False
