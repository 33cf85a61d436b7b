"""Where every front end's batches come from: read from a source and prepared, ahead of the decisions.

A feed owns a source (``KafkaReading``: the input topics; ``FileReading``:
JSONL files or stdin) and hands out ``FedBatch``es: the records (Kafka
records in the canonical order, or a ``FileBatch`` of whole lines), their
prepared batch (decoded, normalized, shingled, signed), the source's
position after them and whether the batch reached the end. Reading and
preparing are pure: they change no state, so where they run changes no
decision. ``dedup``, ``run`` and ``backfill`` all read through one.

- ``ProcessFeed`` (``worker.prepare_processes = 1``, the default) reads and
  prepares in a second process, spawned so it shares no Kafka client, LMDB
  environment or lock with the deciding one: it reads and prepares the next
  batch while this process decides and commits the current one, so both
  cores work (and kafka-python's polling, which costs CPU, runs there).
  Stdin is handed to it as a file descriptor.
- ``ThreadFeed`` (``dedup`` with ``worker.prepare_processes = 0``) reads and
  prepares in the caller's thread, one batch ahead, but for the kernel's part
  of preparing, which runs on a thread without the GIL: it overlaps the
  deciding thread's work and its waits for the disk.
- ``InlineFeed`` (the worker with ``worker.prepare_processes = 0``) reads and
  prepares in the caller's own thread, from the same kind of reader.

Positions never move here: the front ends commit them after each batch
they decided (``checkpoint``). A feed that is dropped takes its unread
batches with it; the next one reads them again.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing import queues as _queues, reduction, synchronize as _synchronize  # noqa: F401 (see below)
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Optional, Union

from ..config import Config, kafka_client_settings
from ..core.records import FileBatch, RawRecord, Source
from ..errors import BrokerUnavailableError, StreamdedupError, kafka_trouble
from .rights import Rights
from .source import FilePosition, FileSource, KafkaSource

if TYPE_CHECKING:
    from ..core.prepare import PreparedBatch

# This module imports nothing heavy at the top (numpy, LMDB: see ``prepare``), so the command line can
# spawn the feed process first thing, and the process imports them while the deciding one does the same.
# It does import multiprocessing's queues and events (5-8 ms): every ``ProcessFeed`` needs them before its process
# starts, and a spawned process imports them to unpickle its arguments; importing them with this module, rather
# than when the first feed is made, only moves them out of the run's clock.

__all__ = ["FedBatch", "InlineFeed", "ThreadFeed", "ProcessFeed", "KafkaReading", "FileReading", "kafka_reading",
           "spawn_feed", "open_feed", "spawn_file_feed"]

FILL_WAIT_MS = 50  # longest wait for more records to top up a batch (see ``_filled``)
STOP_GRACE_S = 0.05  # how long a feed process told to stop may take before it is killed
BOOT_TIMEOUT_S = 120.0  # a feed process neither ready (booted, connected) nor heard from by then is reported stuck


@dataclass
class FedBatch:
    """A batch's records, their prepared batch, and where the source stands after them."""

    records: Union[list[RawRecord], FileBatch]  # Kafka records in the canonical order, or a block of lines
    prepared: PreparedBatch
    position: Any  # Kafka: {partition: next offset}; files: the FilePosition after the block
    at_end: bool  # Kafka: every partition read to its end, as of the last fetch; files: no more input


# -- what readers say, and what the feed process sends the deciding one -----------------------------


class Read(NamedTuple):
    """A batch read: where the source stands after it, whether it is at the end (Kafka: every partition read
    to its end, as of the last fetch; files: no more input), its records (Kafka records in the canonical
    order, or a block of lines); sent by the feed process, also its prepared form."""

    position: Any
    at_end: bool
    records: Any
    prepared: Any = None


class Idle(NamedTuple):
    """Nothing new, but the position moved (a transaction marker was read past: the lag moved)."""

    position: Any


class Ended(NamedTuple):
    """Every input was read (files)."""


class Failed(NamedTuple):
    """The feed process failed: the error, one of ours (``_as_ours``), raised in the deciding process."""

    error: StreamdedupError


# -- readers: what a feed reads, in whichever process it runs ----------------------------------------


@dataclass(frozen=True)
class KafkaReading:
    """How a feed reads the input topics (everything picklable, for the second process)."""

    topics: tuple
    client_settings: dict
    group_id: str
    batch_size: int
    poll_timeout_ms: int

    def source(self) -> KafkaSource:
        return KafkaSource(list(self.topics), self.client_settings, self.group_id, self.batch_size)

    def open(self) -> "KafkaReader":
        return KafkaReader(self.source(), self.poll_timeout_ms)


class KafkaReader:
    """Reads the input topics from the positions it is started at (to ``limit``, where given)."""

    def __init__(self, source: KafkaSource, timeout_ms: int):
        self.source = source
        self.timeout_ms = timeout_ms
        self.partitions: list = []
        self.limit: Optional[dict] = None
        self._told: Optional[dict] = None

    def connect(self) -> None:
        self.source.partitions()  # connects and learns the topics now, while the deciding process recovers

    def start(self, order: tuple) -> None:
        """``order``: (start offset per partition, limit per partition or None)."""
        starts, self.limit = order
        self.partitions = list(starts)
        self.source.assign(self.partitions)
        for p, offset in starts.items():
            self.source.seek(p, offset)

    def read(self, busy=lambda: False) -> Union[Read, Idle, None]:
        """The next batch, or that only the positions moved (None: nothing new).

        ``busy`` says the batch before has not been taken yet: a partial
        batch is then topped up (``_filled``).
        """
        records = _filled(self.source, self.source.poll_batch(self.timeout_ms, limit=self.limit), self.limit, busy)
        positions = {p: self.source.position(p) for p in self.partitions}
        if records:
            return Read(positions, self.source.read_to_end(self.partitions), records)
        if positions != self._told:
            self._told = positions
            return Idle(positions)
        return None

    def close(self) -> None:
        self.source.close()


@dataclass(frozen=True)
class FileReading:
    """How a feed reads JSONL files, or stdin (``-``), in batches of ``batch_size`` lines."""

    paths: tuple
    batch_size: int
    stdin: Optional["InheritedFd"] = None  # set when a path is "-": stdin, handed to the second process

    def open(self) -> "FileReader":
        return FileReader(FileSource(list(self.paths), stdin_fd=self.stdin.fd if self.stdin else None),
                          self.batch_size)


class FileReader:
    """Reads blocks of whole lines from a ``FilePosition`` on, to the end of the last input."""

    def __init__(self, source: FileSource, batch_size: int):
        self.source = source
        self.batch_size = batch_size
        self._blocks: Optional[Iterator[tuple[FileBatch, FilePosition]]] = None
        self._next: Optional[tuple[FileBatch, FilePosition]] = None

    def connect(self) -> None:
        pass

    def start(self, order: FilePosition) -> None:
        self._blocks = self.source.batches(self.batch_size, order)
        self._next = next(self._blocks, None)

    def read(self, busy=lambda: False) -> Union[Read, Ended]:
        """The next block, or ``Ended`` once every input is read."""
        if self._next is None:
            return Ended()
        block, position = self._next
        self._next = next(self._blocks, None)  # one block ahead: the last batch says it is the last
        return Read(position, self._next is None, block)

    def close(self) -> None:
        pass


class InheritedFd:
    """A file descriptor handed to a spawned process, as multiprocessing hands over its own pipes."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup) -> InheritedFd:
    return InheritedFd(dup.detach())


def kafka_reading(config: Config, topics: list[str], group_id: str) -> KafkaReading:
    """How a feed reads ``topics`` for ``group_id`` under ``config``."""
    return KafkaReading(tuple(topics), kafka_client_settings(config.kafka, "consumer"), group_id,
                        config.worker.batch_size, config.worker.poll_timeout_ms)


def file_reading(paths: list[str], batch_size: int, processes: int) -> FileReading:
    """How a feed reads ``paths``; stdin is handed over when a second process reads it."""
    stdin = InheritedFd(sys.stdin.fileno()) if processes and "-" in paths else None
    return FileReading(tuple(paths), batch_size, stdin)


def spawn_feed(config: Config, topics: list[str], group_id: str, warm_up) -> "ProcessFeed":
    """A feed process for ``topics`` and ``group_id`` under ``config`` (``warm_up``: see ``ProcessFeed``)."""
    from ..core.decode import InputSpec

    return ProcessFeed(kafka_reading(config, topics, group_id), InputSpec.from_section(config.input), warm_up)


def spawn_file_feed(config: Config, paths: list[str]) -> Optional["ProcessFeed"]:
    """The ``dedup`` command's feed process, spawned first thing (None when ``worker.prepare_processes`` is 0).

    Its imports and warm-up then overlap the opening of the index; ``open_feed`` starts it.
    """
    from ..core.decode import InputSpec

    if not config.worker.prepare_processes:
        return None
    return ProcessFeed(file_reading(paths, config.worker.batch_size, 1), InputSpec.from_section(config.input), config,
                       feed_start_method())


def feed_start_method() -> str:
    """How a feed process made before anything else is opened starts: forked where that is safe, else spawned.

    A forked process has at once what this one imported, and is ready about
    a third of a second sooner than a spawned one, which imports and warms
    up while the first batches wait (measured: 6% more documents a second
    for 30,000 lines). Forking is safe only in a process that runs no other
    thread (none can hold a lock or be half-way through an update) and has
    no index or Kafka client open yet; the worker, whose Kafka clients run
    threads, always spawns. Linux only: elsewhere libraries may not survive
    a fork.
    """
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


def open_feed(paths: list[str], spec, signing, batch_size: int, processes: int, start: FilePosition,
              spawned: Optional["ProcessFeed"] = None, lines: bool = True) -> Union["ProcessFeed", "ThreadFeed"]:
    """A started feed of the lines of ``paths`` from ``start`` on (read in a second process when ``processes``,
    else here, the kernel's part of preparing on a thread: ``ThreadFeed``).

    ``spawned``: the feed process ``spawn_file_feed`` made for these paths, taken over. ``lines``: whether the
    caller uses the batches' lines (the clean output); when not, a feed process keeps them (see ``ProcessFeed``).
    A spawned process's first batches are prepared here while it boots (``ProcessFeed.start_here_first``); a
    forked one is ready at once and prepares the input's first batch while the index opens
    (``_first_batch_ahead``), so this process prepares none: it only decides.
    """
    reading = file_reading(paths, batch_size, processes)
    if spawned is None and not processes:
        feed: Union[ProcessFeed, ThreadFeed] = ThreadFeed(InlineFeed(reading.open(), spec, signing))
        feed.start(start, signing, spec)
        return feed
    feed = spawned or ProcessFeed(reading, spec, signing)
    if "-" in paths or feed.forked:  # a pipe read here could not be handed on where it stopped; a forked
        feed.start(start, signing, spec, lines)  # process is ready at once (see ``start_here_first``)
    else:
        feed.start_here_first(InlineFeed(reading.open(), spec, signing), start, signing, spec, lines)
    return feed


# -- feeds -------------------------------------------------------------------------------------------


class InlineFeed:
    """Reads and prepares in this thread."""

    def __init__(self, reader, spec, signing):
        self.reader = reader
        self.spec = spec
        self.signing = signing
        self.position: Any = None
        self.ended = False

    def start(self, order, signing=None, spec=None) -> None:
        self.reader.start(order)
        self.position = _first_position(order)
        self.signing = signing or self.signing
        self.spec = spec or self.spec

    def next(self, timeout_ms: int = 0) -> Optional[FedBatch]:
        from ..core.prepare import prepare_raw, raw_payload

        message = self.reader.read()
        if message is None:
            return None
        if isinstance(message, Ended):
            self.ended = True
            return None
        self.position = message.position
        if isinstance(message, Idle):
            return None
        records = message.records
        payload = records if isinstance(records, FileBatch) else raw_payload(records)
        return FedBatch(records, prepare_raw(payload, self.spec, self.signing), message.position, message.at_end)

    def batches(self) -> Iterator[FedBatch]:
        """Every batch to the end of the input (files)."""
        return _batches(self)

    def fetch_ahead(self) -> None:
        pass

    def close(self) -> None:
        pass


class ThreadFeed:
    """Reads and prepares in this thread, but the kernel's part of preparing on another, one batch ahead: files.

    When a batch is taken, the next one is read and decoded here and its
    hashes are started on a thread (``prepare.prepare_ahead``): the kernel
    makes them without the GIL while this thread decides and commits the
    batch taken, on the second core or while it waits for the disk. The
    batches, their positions and their decisions are an ``InlineFeed``'s.
    """

    def __init__(self, inline: InlineFeed):
        from concurrent.futures import ThreadPoolExecutor

        self._inline = inline
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="streamdedup-prepare")
        self._ahead: Optional[tuple] = None  # (Read, its prepared batch when called), or None at the end
        self.position: Any = None
        self.ended = False

    def start(self, order, signing=None, spec=None) -> None:
        self._inline.start(order, signing, spec)
        self.position = self._inline.position
        self._ahead = self._read_ahead()

    def next(self, timeout_ms: int = 0) -> Optional[FedBatch]:
        """The next batch, or None once the input ended (``ended``)."""
        if self._ahead is None:
            self.ended = True
            return None
        message, prepared = self._ahead
        batch = FedBatch(message.records, prepared(), message.position, message.at_end)
        self.position = message.position
        self._ahead = self._read_ahead()
        return batch

    def batches(self) -> Iterator[FedBatch]:
        """Every batch to the end of the input."""
        return _batches(self)

    def fetch_ahead(self) -> None:
        pass

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _read_ahead(self) -> Optional[tuple]:
        """The next block read and decoded, its hashes started on the thread; None at the end of the input."""
        from ..core.prepare import decode_raw, prepare_ahead

        inline = self._inline
        message = inline.reader.read()
        if isinstance(message, Ended):
            return None
        return message, prepare_ahead(decode_raw(message.records, inline.spec), inline.signing, self._executor)


class ProcessFeed:
    """A second process that reads and prepares the next batches while this one decides.

    It is spawned as soon as the feed is made (its imports, connection and
    warm-up overlap the caller's start and recovery) and starts reading once
    ``start`` gives it the position and the index's signing settings. At
    most three batches are ahead: one received here, one in the pipe, one
    being prepared.

    ``warm_up`` is what the process prepares a made-up batch with while it
    waits: the index's ``SigningConfig``, or the ``Config`` when the index is
    not open yet (the command line spawns the feed before anything else).
    ``start_method``: see ``feed_start_method``; a forked file feed prepares the input's first batch before
    ``start`` (``_first_batch_ahead``).

    A file batch's lines (``FileBatch.block``, some 3 of the 5 MB a batch
    of 2,000 crawled pages takes through the pipe) come over only when the
    caller uses them (``start``'s ``lines``: the clean output); else its
    ``FileBatch`` arrives with an empty block, and every other field.
    """

    def __init__(self, reading: Union[KafkaReading, FileReading], spec, warm_up, start_method: str = "spawn"):
        import multiprocessing

        context = multiprocessing.get_context(start_method)
        self.forked = start_method == "fork"  # ready within milliseconds: it has this process's imports
        self._orders = context.Queue()
        self._batches = context.Queue(maxsize=1)
        self._stop = context.Event()
        self._ready = context.Event()  # set by the process once booted and warm, waiting for ``start``
        self._process = context.Process(target=_feed_main, name="streamdedup-feed", daemon=True,
                                        args=(reading, spec, warm_up, self._orders, self._batches, self._stop,
                                              os.getpid(), self._ready, self.forked))
        self._process.start()
        self._received: queue.Queue = queue.Queue(maxsize=1)  # messages taken off the pipe, records rebuilt
        self._wanted = threading.Event()
        self._started_at = 0.0
        self._heard = False
        self._closing = threading.Event()
        self.position: Any = None
        self.ended = False
        self._here: Optional[InlineFeed] = None  # prepares here until the process is ready (``start_here_first``)
        self._lines = True  # whether the process sends file batches' lines, once ``start_here_first`` started it

    def start(self, order, signing, spec=None, lines: bool = True) -> None:
        """Read from ``order`` on: Kafka, (start offsets, limits or None); files, a ``FilePosition``.

        ``spec`` replaces the ``InputSpec`` the process was made with (the
        worker learns the clean topic's size limit only once it is connected).
        ``lines``: whether file batches come with their lines (see the class).
        """
        self.position = _first_position(order)
        self._orders.put((order, signing, spec, lines))
        self._started_at = time.monotonic()
        threading.Thread(target=self._receive, name="streamdedup-feed-receiver", daemon=True).start()

    def start_here_first(self, here: InlineFeed, order, signing, spec=None, lines: bool = True) -> None:
        """Like ``start``, but batches are read and prepared by ``here`` until the feed process is ready.

        A spawned process takes about half a second to import and warm up
        (more on a busy machine); the first batches would wait for it. They
        are made in this process instead, one block of lines after the other
        (the same blocks the process would read), until the process says it
        is ready: the batch read then is the last one made here, and the
        process starts after it, so it prepares the next batch while this one
        is decided. Where the hand-over falls changes no batch and no decision.
        """
        here.start(order, signing, spec)
        self._here = here
        self._lines = lines
        self.position = order

    def fetch_ahead(self) -> None:
        """Take the next batch off the pipe now: the caller is about to wait for Kafka and the disk.

        Unpickling a batch and rebuilding its records takes 15-25 ms of this
        process's time. Done on the receiving thread while the caller's
        thread waits (the GIL is free then), it no longer delays the next batch.
        """
        self._wanted.set()

    def next(self, timeout_ms: int) -> Optional[FedBatch]:
        """The next batch, or None when none came within ``timeout_ms`` (or the input ended: ``ended``)."""
        if self._here is not None:
            return self._next_here()
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
        if isinstance(message, Failed):
            raise message.error
        if isinstance(message, Ended):
            self.ended = True
            return None
        self.position = message.position
        if isinstance(message, Idle):
            return None
        return FedBatch(message.records, message.prepared, message.position, message.at_end)

    def batches(self) -> Iterator[FedBatch]:
        """Every batch to the end of the input (files)."""
        return _batches(self)

    def _next_here(self) -> Optional[FedBatch]:
        """The next block, read and prepared here; the process is started after it once it is ready."""
        from ..core.prepare import prepare_raw

        here = self._here
        message = here.reader.read()
        if isinstance(message, Ended):  # no input at all
            self._here, self.ended = None, True
            return None
        position, last, block = message.position, message.at_end, message.records
        if last:  # the whole input was read here: the process is never started (``close`` stops it)
            self._here, self.ended = None, True
        elif self._ready.is_set():
            self._here = None
            self.start(position, here.signing, here.spec, self._lines)
        self.position = position
        return FedBatch(block, prepare_raw(block, here.spec, here.signing), position, last)

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
            if isinstance(message, Read):
                records = message.records if isinstance(message.records, FileBatch) else raw_records(message.records)
                sources = records.sources() if isinstance(records, FileBatch) else [r.source for r in records]
                message = message._replace(records=records, prepared=restore_items(message.prepared, sources))
            if not _hand_over(self._received, message, self._closing):
                return

    def _check_alive(self) -> None:
        if not self._process.is_alive():
            raise BrokerUnavailableError(f"the process reading the input ended (exit code "
                                         f"{self._process.exitcode}); starting it again")
        if self._stuck_at_boot():
            raise BrokerUnavailableError("the process reading the input has not started in "
                                         f"{BOOT_TIMEOUT_S:.0f} s; starting it again")

    def _stuck_at_boot(self) -> bool:
        """Whether the process has been started this long without booting: once ready it is working (a first
        batch of large HTML pages may take minutes to prepare on a busy machine, and started again it would
        take as long again, for ever)."""
        return not self._heard and not self._ready.is_set() and self._started_at > 0 and \
            time.monotonic() - self._started_at > BOOT_TIMEOUT_S

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


def _feed_main(reading, spec, warm_up, orders, batches, stop, parent: int, ready=None, ahead: bool = False) -> None:
    """In the feed process: read, prepare, hand over, until told to stop, the input ends, or the parent is gone.

    ``ready`` is set once the process is connected and warm, about to wait for its orders. ``ahead``: prepare
    the first batch of the input before the orders come (``_first_batch_ahead``).
    """
    import signal

    from ..core.prepare import preparing_process

    for sig in (signal.SIGINT, signal.SIGTERM):  # the parent decides when this process stops (Ctrl-C hits both)
        signal.signal(sig, signal.SIG_IGN)
    preparing_process(parent)
    batches.cancel_join_thread()  # at exit, do not wait for the parent to read what is still queued
    reader = None
    warm = reading.batch_size if isinstance(reading, KafkaReading) else 50  # files: the first batch warms up
    warming = threading.Thread(target=_warm_up, args=(warm_up, warm), name="warm-up", daemon=True)
    warming.start()  # mostly page faults and numpy (no GIL): overlaps the connection's network waits
    try:
        reader = reading.open()
        reader.connect()
        warming.join()
        if ready is not None:
            ready.set()
        if not _feed_as_ordered(reading, reader, spec, warm_up, orders, batches, stop, ahead):
            return
        stop.wait()  # the input ended: stay until told, or the queue's last messages may never leave
    except Exception as exc:  # handed to the parent (the worker then starts a new session)
        _hand_over(batches, Failed(_as_ours(exc, reading)), stop)
    finally:
        if reader is not None:
            try:
                reader.close()
            except Exception:  # the broker may be gone; nothing of ours is pending in the consumer
                pass


def _as_ours(exc: Exception, reading=None) -> StreamdedupError:
    """An error of the feed process as one of ours (picklable, and sorted: retriable or not; a missing right named)."""
    if isinstance(exc, StreamdedupError):
        return exc
    if isinstance(reading, KafkaReading):
        refused = Rights.of(reading.client_settings, list(reading.topics), [], reading.group_id, None).explain(exc)
        if refused is not None:
            return refused
    trouble = kafka_trouble(exc)
    if trouble is not None:
        return trouble
    return StreamdedupError(f"reading the input failed: {type(exc).__name__}: {exc}"[:1000])


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


def _feed_as_ordered(reading, reader, spec, warm_up, orders, batches, stop, ahead: bool = False) -> bool:
    """Wait for the orders (where to start, the signing settings, the input spec, whether lines are sent), then
    read, prepare and hand over every batch from there; False when told to stop first. ``ahead``: the first
    batch of the input is prepared while the orders are awaited (``_first_batch_ahead``), and handed over
    when they ask for it."""
    first = _first_batch_ahead(reading, reader, spec, warm_up) if ahead else None
    order, signing, given_spec, lines = _wait_for_orders(orders, stop)
    if signing is None:
        return False
    spec = given_spec or spec
    if first is not None and first.fits(order, signing, spec):
        if not _hand_over(batches, first.message._replace(records=_sent(first.message.records, lines)), stop):
            return False
    else:
        reader.start(order)
    _feed_batches(reader, spec, signing, batches, stop, lines)
    return True


class _Ahead(NamedTuple):
    """A file feed's first batch, read and prepared before its orders came, and the settings it was prepared under."""

    message: Read
    signing: Any
    spec: Any

    def fits(self, order, signing, spec) -> bool:
        """Whether the orders ask for this very batch: from the start of the input, under the same settings."""
        return order == FilePosition() and signing == self.signing and spec == self.spec


def _first_batch_ahead(reading, reader, spec, warm_up) -> Optional[_Ahead]:
    """A forked file feed's first batch, read from the start of the input and prepared under the signing settings
    a new index gets (``signing_config`` of the ``Config`` the feed was made with), while the deciding process
    opens the index and prepares nothing itself (``open_feed``). Its orders nearly always ask for just that (a
    new index, read from the start); else it is dropped and the input read again from where they say. None when
    there is no ``Config`` yet, the input is stdin (a pipe read ahead could not be read again), or reading it
    failed (the orders' reading then meets the same trouble, if it is theirs, and reports it).
    """
    from ..core.prepare import prepare_compact
    from ..core.signing import signing_config

    if not isinstance(reading, FileReading) or "-" in reading.paths or not isinstance(warm_up, Config):
        return None
    try:
        signing = signing_config(warm_up)
        reader.start(FilePosition())
        message = reader.read()
        if not isinstance(message, Read):
            return None
        return _Ahead(message._replace(prepared=prepare_compact(message.records, spec, signing)), signing, spec)
    except Exception:
        return None


def _wait_for_orders(orders, stop) -> tuple:
    while not stop.is_set():
        try:
            return orders.get(timeout=0.2)
        except queue.Empty:
            continue
    return None, None, None, True


def _feed_batches(reader, spec, signing, batches, stop, lines: bool = True) -> None:
    from ..core.prepare import prepare_compact, raw_payload

    while not stop.is_set():
        message = reader.read(batches.full)
        if message is None:
            continue
        if isinstance(message, Read):
            payload = message.records if isinstance(message.records, FileBatch) else raw_payload(message.records)
            message = message._replace(records=_sent(payload, lines), prepared=prepare_compact(payload, spec, signing))
        if not _hand_over(batches, message, stop) or isinstance(message, Ended):
            return


def _sent(payload, lines: bool):
    """What of a batch's records goes to the deciding process: a ``FileBatch`` without its lines, when not used."""
    return payload if lines or not isinstance(payload, FileBatch) else replace(payload, block=b"")


def _filled(source: KafkaSource, records: list, limit, busy) -> list:
    """``records`` topped up to a whole batch while the deciding process has not taken the previous one yet
    (a partial one goes at once to a process that waits)."""
    return source.topped_up(records, FILL_WAIT_MS, lambda _: busy(), limit)


def _first_position(order) -> Any:
    """Where a feed started at ``order`` stands before its first batch."""
    return dict(order[0]) if isinstance(order, tuple) else order


def _batches(feed) -> Iterator[FedBatch]:
    while not feed.ended:
        batch = feed.next(1000)
        if batch is not None:
            yield batch


def _hand_over(batches, message, stop) -> bool:
    """Put ``message`` for the next stage, waiting while one is still unread; False if told to stop meanwhile."""
    while not stop.is_set():
        try:
            batches.put(message, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False
