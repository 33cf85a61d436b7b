"""Where records come from: JSONL files or stdin (offline), Kafka topics (the worker).

``FileSource.batches`` yields ``FileBatch`` blocks of consecutive lines in
file order, each with the ``FilePosition`` after it (stored once the batch
is committed); the lines are split and decoded later, by whoever prepares
the batch. ``KafkaSource.poll_batch`` returns a list of ``RawRecord`` in the
canonical order (topic, partition, offset); the offsets after such a batch
are worked out from its records when it is committed (``checkpoint``).
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator, Optional

from ..core.prepare import raw_payload
from ..core.records import FileBatch, RawRecord, Source, canonical_order
from ..errors import ResumeError
from .warc import is_warc, warc_lines
from .wire import BinaryHeaderKey

__all__ = ["FilePosition", "FileSource", "KafkaSource", "payload_of", "rejoin_if_abandoned", "unreadable_position"]


@dataclass(frozen=True)
class FilePosition:
    """How far an offline run has read: file number, lines and bytes read in that file."""

    file: int = 0
    line: int = 0
    byte: int = 0

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "byte": self.byte}


@dataclass
class FileSource:
    """The lines of JSONL files (``-`` is stdin), one record per line, in order."""

    paths: list[str]
    stdin_fd: Optional[int] = None  # what ``-`` reads (None: this process's stdin)
    bytes_read: int = field(default=0, init=False)

    def total_bytes(self) -> Optional[int]:
        """Bytes in all inputs, for the progress bar; None when reading stdin."""
        if "-" in self.paths:
            return None
        return sum(os.path.getsize(p) for p in self.paths)

    def batches(self, size: int, start: FilePosition) -> Iterator[tuple[FileBatch, FilePosition]]:
        """Batches of at most ``size`` lines from ``start`` on, each with the position after it."""
        for number in range(start.file, len(self.paths)):
            begin = start if number == start.file else FilePosition(number)
            yield from self._file_batches(number, size, begin)

    def _file_batches(self, number: int, size: int, begin: FilePosition):
        path = self.paths[number]
        if is_warc(path):
            yield from self._warc_batches(number, size, begin)
            return
        with self._open_at(path, begin) as handle:
            line_no, offset = begin.line, begin.byte
            for block, count in _blocks_of_lines(handle, size):
                offset += len(block)
                self.bytes_read += len(block)
                yield FileBatch(path, line_no + 1, count, block), FilePosition(number, line_no + count, offset)
                line_no += count

    def _warc_batches(self, number: int, size: int, begin: FilePosition):
        """A WARC file's responses as lines (``runtime.warc``); a resumed run skips the records decided."""
        path = self.paths[number]
        with _opened(path) as handle:
            base, lines = self.bytes_read, warc_lines(handle)
            for _ in range(begin.line):
                if next(lines, None) is None:
                    raise ResumeError(f"input {path!r} has fewer responses than where the interrupted run stopped "
                                      f"({begin.line}); it changed since: run with --restart")
            line_no = begin.line
            while block := list(itertools.islice(lines, size)):
                data = b"\n".join(block) + b"\n"
                self.bytes_read = base + handle.tell()
                yield (FileBatch(path, line_no + 1, len(block), data, "warc"),
                       FilePosition(number, line_no + len(block), 0))
                line_no += len(block)

    def _open_at(self, path: str, begin: FilePosition) -> BinaryIO:
        if path == "-":
            handle = os.fdopen(os.dup(sys.stdin.fileno() if self.stdin_fd is None else self.stdin_fd), "rb")
            for _ in range(begin.line):  # a pipe cannot seek: skip what was already decided
                if not handle.readline():
                    raise ResumeError(f"stdin ended before line {begin.line}, where the interrupted run stopped; "
                                      "pipe the same input again, or run with --restart")
            return handle
        handle = _opened(path)
        if begin.byte:
            if os.path.getsize(path) < begin.byte:
                handle.close()
                raise ResumeError(f"input {path!r} is shorter than where the interrupted run stopped "
                                  f"(byte {begin.byte}); it changed since: run with --restart")
            handle.seek(begin.byte)
        return handle


def _opened(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ResumeError(f"cannot read input {path!r}: {exc.strerror}") from None


READ_BYTES = 1 << 20  # bytes asked of a file at a time


def _blocks_of_lines(handle: BinaryIO, size: int) -> Iterator[tuple[bytes, int]]:
    """Blocks of ``size`` whole lines (fewer at the end of the input), and how many lines each holds.

    Every byte is searched once, however long its line. ``read1`` returns
    what a pipe holds now: a slow writer's lines are not held back.
    """
    pending, ended = bytearray(), False
    while True:
        end = count = searched = 0  # no newline in pending[end:searched]
        while count < size:
            newline = pending.find(b"\n", searched)
            if newline >= 0:
                end = searched = newline + 1
                count += 1
            elif ended:
                break
            else:
                searched = len(pending)
                more = handle.read1(READ_BYTES)
                ended = not more
                pending += more
        if count < size and end < len(pending):  # the input ended in a line without a newline
            end, count = len(pending), count + 1
        if not count:
            return
        yield bytes(pending[:end]), count
        del pending[:end]


FETCH_PARTITION_BYTES = 1 << 20  # per partition and fetch (Kafka's default)


class KafkaSource:
    """A consumer that owns every partition of the input topics (assigned, not balanced by a group).

    The group id is used only to store committed offsets (through the
    producer's transactions) so the usual Kafka tools show the worker's lag.
    """

    def __init__(self, topics: list[str], client_settings: dict, group_id: str, batch_size: int):
        from kafka import KafkaConsumer

        from .fetch import fast_records, frames_read_in_one_copy, larger_socket_reads, metadata_paced_as_configured
        from .wire import read_binary_header_keys

        self.topics = topics
        self.group_id = group_id
        read_binary_header_keys()
        larger_socket_reads()
        frames_read_in_one_copy()
        metadata_paced_as_configured()
        self.consumer = KafkaConsumer(
            **{
                "group_id": group_id,
                "enable_auto_commit": False,
                "auto_offset_reset": "earliest",
                "isolation_level": "read_committed",
                "max_poll_records": batch_size,
                # Not raised for large records: a record batch larger than the limits still comes whole
                # (when it is the first in the fetch). Larger fetches only delay the first batch (24 MiB
                # over three partitions took 0.6 s before the first 2,000 records were seen).
                "max_partition_fetch_bytes": FETCH_PARTITION_BYTES,
                "fetch_max_bytes": 64 << 20,
                **client_settings,
            }
        )
        fast_records(self.consumer)
        self.batch_size = batch_size

    def partitions(self) -> list:
        """Every partition of the input topics, in a fixed order."""
        from kafka import TopicPartition

        found = []
        for topic in self.topics:
            ids = self.consumer.partitions_for_topic(topic)
            if not ids:
                from ..errors import BrokerError

                raise BrokerError(f"input topic {topic!r} does not exist (or has no partitions); "
                                  "create it, or fix input.topics")
            found += [TopicPartition(topic, p) for p in sorted(ids)]
        return found

    def assign(self, partitions: list) -> None:
        self.consumer.assign(partitions)

    def subscribe(self, topics: list[str], listener=None) -> None:
        """Join the group on ``topics``, their partitions learnt first, once subscribed: a member whose client has
        not yet heard of a topic (one created a moment ago) is assigned none of it, and the group rebalances again
        once it has (half a second or more of a starting process, for nothing). And the client's record of the
        subscribed topics' partitions is made when metadata comes in: one that came before the subscription
        records none of them, and a leader that assigns the group before the next comes sees their partitions
        "change" after it, and makes the group rebalance again (kafka-python 3.0.12; seen in 4 to 6 of 10 starts of
        the sharded deployment, a vshards host's first commit then sometimes refused for an old generation). So the
        metadata is fetched after subscribing, before the first poll joins."""
        self.consumer.subscribe(topics, **({} if listener is None else {"listener": listener}))
        self.consumer.topics()  # every topic's metadata, fetched now (the subscribed ones' partitions recorded)

    def committed(self, partition, timeout_s: float) -> Optional[int]:
        """The group's committed offset of a partition (None if it has none).

        Raises ``KafkaTimeoutError`` after ``timeout_s``. Without a bound
        kafka-python asks again every ``retry_backoff_ms``, forever, while the
        broker answers ``UNSTABLE_OFFSET_COMMIT`` (a transaction holding
        offsets of the group is still open); the session would hang silently.
        """
        return self.consumer.committed(partition, timeout_ms=int(timeout_s * 1000))

    def seek(self, partition, offset: Optional[int]) -> None:
        if offset is None:
            self.consumer.seek_to_beginning(partition)
        else:
            self.consumer.seek(partition, offset)

    def position(self, partition) -> int:
        return self.consumer.position(partition)

    def read_to_end(self, partitions: list) -> bool:
        """Whether every partition is read up to the end the last fetch reported (no request made)."""
        for p in partitions:
            end = self.consumer.highwater(p)
            if end is None or self.consumer.position(p) < end:
                return False
        return True

    def end_offsets(self, partitions: list) -> dict:
        return self.consumer.end_offsets(partitions)

    def offsets_for_time(self, partitions: list, timestamp_ms: int) -> dict:
        """First offset at or after the time per partition (the end offset where there is none)."""
        found = self.consumer.offsets_for_times({p: timestamp_ms for p in partitions})
        ends = self.end_offsets(partitions)
        return {p: (found[p].offset if found.get(p) is not None else ends[p]) for p in partitions}

    def poll_batch(self, timeout_ms: int, limit: Optional[dict] = None,
                   max_records: Optional[int] = None) -> list[RawRecord]:
        """Up to ``max_records`` (default ``batch_size``) records, in the canonical order (topic, partition, offset).

        ``limit`` (partition -> offset) drops records at or beyond it, for runs
        that must stop at given offsets.
        """
        polled, unreadable = self._polled(timeout_ms, max_records or self.batch_size, limit)
        if unreadable is not None:
            return unreadable
        records = []
        for tp, messages in polled.items():
            stop = None if limit is None else limit.get(tp)
            for m in messages:
                if stop is not None and m.offset >= stop:
                    continue
                records.append(_raw_record(m))
        return canonical_order(records)

    def topped_up(self, records: list[RawRecord], wait_ms: int, more_wanted: Callable[[int], bool],
                  limit: Optional[dict] = None) -> list[RawRecord]:
        """``records`` (a poll's) topped up towards ``batch_size`` while ``more_wanted(value bytes so far)`` says
        so, each poll waiting at most ``wait_ms``; stops at the first poll that brings nothing. A fetch often
        holds less than a batch, and whole batches share the costs of whatever follows each one."""
        polls, count = [records], len(records)
        size = sum(len(r.value or b"") for r in records)
        while count and count < self.batch_size and more_wanted(size):
            more = self.poll_batch(wait_ms, limit=limit, max_records=self.batch_size - count)
            if not more:
                break
            polls.append(more)
            count += len(more)
            size += sum(len(r.value or b"") for r in more)
        return records if len(polls) == 1 else canonical_order([r for poll in polls for r in poll])

    def poll_payload(self, timeout_ms: int, wait_ms: int, more_wanted: Callable[[int], bool]) -> tuple:
        """``raw_payload`` columns of ``topped_up(poll_batch(timeout_ms), wait_ms, more_wanted)``'s records, the
        same, made column by column from the consumer's records (``payload_of``) without a ``RawRecord`` each:
        the sharded signer's reading, which routes records' bytes and looks into few of them."""
        polled: dict = {}  # partition -> its records, of every poll
        unreadable: list[RawRecord] = []
        count = size = 0
        while not count or (count < self.batch_size and more_wanted(size)):
            more, skipped = self._polled(wait_ms if count else timeout_ms, self.batch_size - count)
            if skipped is not None:
                unreadable += skipped
                count += 1
                continue
            if not any(more.values()):
                break
            for partition, records in more.items():
                polled.setdefault(partition, []).extend(records)
                count += len(records)
                size += sum(map(len, filter(None, [r.value for r in records])))
        return payload_of(polled, unreadable)

    def _polled(self, timeout_ms: int, max_records: int, limit: Optional[dict] = None) -> tuple[dict, Optional[list]]:
        """One poll of the consumer: (partition -> its records, None), or ({}, the record it cannot read, as
        ``_skip_unreadable`` makes it); the group joined again where a join was left half done."""
        from kafka.errors import CorruptRecordError

        try:
            polled = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except CorruptRecordError as exc:
            return {}, self._skip_unreadable(exc, limit)
        if self.group_id is not None:
            rejoin_if_abandoned(self.consumer)
        return polled, None

    def _skip_unreadable(self, exc: Exception, limit: Optional[dict]) -> list[RawRecord]:
        """A record the client cannot read, as a record of its own to reject; the consumer moves past it.

        kafka-python raises ``CorruptRecordError`` for a record it cannot parse
        (a failed checksum, a malformed record; header keys that are not UTF-8
        are read by ``wire``) and, left alone, raises it again at every start
        (and its next ``poll`` spins on the dead record iterator). The
        record's bytes are lost to us, so it becomes a record without key,
        value or headers, rejected as ``unreadable_record`` with the client's
        error as the detail, decided and committed with the batch it falls
        in, so the offsets move past it in the same Kafka transaction as every
        other outcome. Reading again (a replay) meets the same record at the
        same offset: the outcome is deterministic. A record batch that fails
        its checksum gets one such outcome per offset, as each fetch meets it
        again one offset further.
        """
        partition, offset = unreadable_position(self.consumer)
        self.consumer.seek(partition, offset + 1)
        if limit is not None and partition in limit and offset >= limit[partition]:
            return []
        problem = f"unreadable_record: the Kafka client cannot read the record: {exc}"[:500]
        return [RawRecord(None, Source(partition.topic, partition.partition, offset), rejected=problem)]

    def close(self) -> None:
        self.consumer.close(autocommit=False)


def rejoin_if_abandoned(consumer) -> bool:
    """Ask ``consumer`` to join its group again if its last join was left half done; whether it was.

    kafka-python (3.0.12) leaves a join that outlasts ``poll``'s timeout running,
    for the next ``poll`` to complete (its member state, heartbeats, the new
    assignment and the rebalance listener). But the next ``poll`` completes it
    only if the member still needs to join, and the group's leader, whose join
    was asked for by a change of the topics' metadata, has recorded that
    metadata by then: the join is never completed, no heartbeat is sent, and
    the group drops the member after its session, while the member, never
    told, keeps what it was given (seen on a loaded machine: a process hosting
    every vshard of a deployment, the other waiting for their states). A join
    asked for again completes as usual."""
    coordinator = getattr(consumer, "_coordinator", None)
    task = getattr(coordinator, "_join_task", None)
    if task is None or not getattr(task, "is_done", False) or coordinator.need_rejoin():
        return False
    coordinator.request_rejoin()
    return True


def _raw_record(message) -> RawRecord:
    """A consumed record as a RawRecord; one with a header key that is not UTF-8 is rejected as ``invalid_header``.

    Such a key (read as a ``wire.BinaryHeaderKey``) cannot be sent again by
    kafka-python's producer, which takes str keys only: on the dead-letter
    topic the header becomes ``streamdedup.binary-header-key`` (its key's
    bytes) followed by ``streamdedup.binary-header-value`` (its value).
    """
    source = Source(message.topic, message.partition, message.offset)
    if not message.headers:  # most records: nothing to look at
        return RawRecord(message.value, source, message.key, (), message.timestamp)
    headers = tuple(message.headers)
    binary = [name.raw for name, _ in headers if isinstance(name, BinaryHeaderKey)]
    if not binary:
        return RawRecord(message.value, source, message.key, headers, message.timestamp)
    kept = []
    for name, value in headers:
        if isinstance(name, BinaryHeaderKey):
            kept += [("streamdedup.binary-header-key", name.raw), ("streamdedup.binary-header-value", value)]
        else:
            kept.append((name, value))
    problem = f"invalid_header: header key {binary[0]!r} is not UTF-8 (Kafka header keys are UTF-8 strings)"
    return RawRecord(message.value, source, message.key, tuple(kept), message.timestamp, problem)


def payload_of(polled: dict, unreadable: tuple = ()) -> tuple:
    """``raw_payload`` columns of the RawRecords ``KafkaSource.poll_batch`` makes of a poll's records (partition ->
    the consumer's records) and ``unreadable`` ones, in the canonical order: column by column, a partition's records
    at a time, when each partition's records come in rising offsets and none is unreadable (what a poll gives);
    else through the RawRecords. A record with headers is read as ``_raw_record`` reads it (its header keys
    checked)."""
    if unreadable or not all(_rising([r.offset for r in records]) for records in polled.values()):
        records = canonical_order([_raw_record(r) for records in polled.values() for r in records] + list(unreadable))
        return raw_payload(records)
    columns: tuple = ([], [], [], [], [], [], [], [])
    values, keys, headers, stamps, names, partitions, offsets, rejected = columns
    for partition in sorted(polled, key=lambda p: (p.topic, p.partition)):
        records = polled[partition]
        values += [r.value for r in records]
        keys += [r.key for r in records]
        stamps += [r.timestamp for r in records]
        offsets += [r.offset for r in records]
        names += [partition.topic] * len(records)
        partitions += [partition.partition] * len(records)
        if not any([r.headers for r in records]):
            headers += [()] * len(records)
            rejected += [None] * len(records)
            continue
        for r in records:
            read = _raw_record(r) if r.headers else None
            headers.append(read.headers if read else ())
            rejected.append(read.rejected if read else None)
    return columns


def _rising(offsets: list) -> bool:
    return all(map(operator.lt, offsets, offsets[1:]))


def unreadable_position(consumer) -> tuple:
    """The partition and offset of the record a ``CorruptRecordError`` of ``consumer.poll`` is about.

    kafka-python (3.0.12) does not say it in the error. Its fetcher keeps the
    partition's records being parsed as ``_next_partition_records``, and
    their ``next_fetch_offset`` is the offset after the last record read
    (control records and aborted batches included): the unreadable one's.
    If a later kafka-python keeps it elsewhere, the worker stops with this
    message rather than skip a record it cannot name.
    """
    parsed = getattr(getattr(consumer, "_fetcher", None), "_next_partition_records", None)
    partition = getattr(parsed, "topic_partition", None)
    offset = getattr(parsed, "next_fetch_offset", None)
    if partition is None or offset is None:
        from ..errors import BrokerError

        raise BrokerError("the Kafka client could not read a record, and this kafka-python version does not say "
                          "which; install the kafka-python version pyproject.toml names (3.0.12)")
    return partition, max(offset, consumer.position(partition))
