"""Fetched records read by the C kernel: the one place that replaces a part of kafka-python's consumer.

kafka-python (3.0.12) reads each record of a fetch in Python: varints one
call each, a ``DefaultRecord``, then a ``ConsumerRecord``, about 19 µs a
record of 3 KB, most of a signing process's reading. ``fast_records`` gives
a consumer a ``PartitionRecords`` whose record batches are read by
``_kernel.consumer_records`` into the same ``ConsumerRecord`` tuples (0.5-1
µs a record). Everything around a record is kafka-python's, unchanged: the
batch CRC check, decompression, aborted transactions and control batches of
``read_committed`` (which batches are read at all), the fetch position that
moves record by record as ``poll`` takes them. A batch the kernel does not
read as kafka-python would (a framing error, a header key that is not UTF-8,
bytes after its last record) goes to kafka-python's own reader, which raises
or recovers (``wire``) as it always did.

One difference, in kafka-python's fetch metrics only: a batch's bytes are
counted when its first record is taken, not record by record.

``larger_socket_reads`` has kafka-python's plain TCP connections read what a
socket holds ``SOCKET_READ_BYTES`` at a time instead of 4 KB: a fetch of
megabytes (a vshards host's home messages, a signer's input) was a thousand
``recv`` calls of Python a megabyte, and their pieces joined; and
``frames_read_in_one_copy`` has a response's frame buffer give its bytes in
one copy, not two (a fetch response is read out of it whole); and
``metadata_paced_as_configured`` has each client refresh its cluster metadata
at the pace it was given.
"""

from __future__ import annotations

__all__ = ["fast_records", "held_fetches", "larger_socket_reads", "frames_read_in_one_copy",
           "metadata_paced_as_configured", "FETCH_KAFKA_PYTHON", "SOCKET_READ_BYTES"]

FETCH_KAFKA_PYTHON = "3.0."  # the kafka-python releases whose fetcher ``fast_records`` was checked against
# A socket read's most bytes. Reading 234 MB of 1.3 MB messages as a host does (docs/pages/performance.md,
# 2026-12-07 mid-morning): 1.74 ns a byte of the consumer's CPU at kafka-python's 4 KB, 1.59 at 64 KB, 1.54 at 256 KB
# (medians of 3, loaded). A read's buffer is cut to what the socket held, so a short response costs a short read.
SOCKET_READ_BYTES = 256 << 10

try:
    from ..core import _kernel

    consumer_records = _kernel.consumer_records
except ImportError:  # built without a C compiler: kafka-python reads every record
    consumer_records = None


def fast_records(consumer) -> bool:
    """Have ``consumer`` read its fetched record batches in the kernel; whether it does.

    Not for a consumer with deserializers (ours have none), a kafka-python
    other than the checked releases, or a build without the kernel: those
    read as kafka-python does.
    """
    import kafka

    fetcher = getattr(consumer, "_fetcher", None)
    parent = getattr(type(fetcher), "PartitionRecords", None)
    if (consumer_records is None or parent is None or not kafka.__version__.startswith(FETCH_KAFKA_PYTHON)
            or fetcher.config.get("key_deserializer") or fetcher.config.get("value_deserializer")):
        return False
    fetcher.PartitionRecords = _kernel_records_class(parent)
    return True


def held_fetches(consumer, partial_wait_ms: int) -> bool:
    """Have ``consumer``'s fetches that ask for every partition it reads wait at the broker for its
    ``fetch_max_wait_ms``, and those that leave some out ``partial_wait_ms`` at most; whether it does.

    Why: kafka-python leaves out of a fetch the partitions whose records are fetched but not taken yet (its
    fetch session even tells the broker to forget them), and sends no other fetch to that broker until the
    one it holds comes back. A record that comes for such a partition meanwhile waits for the held fetch's
    whole wait, however soon it is taken: a consumer that must hear of every message at once (the vshards')
    had to fetch every 10 ms, which cost an idle process 6% of a core and the broker 3% for each of them. A
    fetch of every partition is answered by the broker as soon as any of them has a record, so it can wait
    long: only a fetch that leaves some out needs to come back soon.
    """
    import kafka

    fetcher = getattr(consumer, "_fetcher", None)
    create = getattr(fetcher, "_create_fetch_requests", None)
    if create is None or not kafka.__version__.startswith(FETCH_KAFKA_PYTHON):
        return False
    subscriptions = fetcher._subscriptions

    def created():
        requests = create()
        asked = sum(len(offsets) for _, offsets in requests.values())
        if asked < len(subscriptions.fetchable_partitions()):
            for request, _ in requests.values():
                request.max_wait_ms = min(request.max_wait_ms, partial_wait_ms)
        return requests

    fetcher._create_fetch_requests = created
    return True


def larger_socket_reads() -> bool:
    """Have kafka-python's plain TCP connections (every client of this process) read ``SOCKET_READ_BYTES`` at a
    time from their sockets, not 4 KB; whether they do (not on a kafka-python other than the checked releases).

    kafka-python 3.0's ``KafkaTCPTransport._sock_recv`` reads the socket until it would block, 4 KB a call, and
    joins the pieces; this is the same loop with larger reads (the same bytes, the same errors). Its TLS
    transport has a loop of its own, left as it is."""
    import kafka
    from kafka.net import transport

    if not kafka.__version__.startswith(FETCH_KAFKA_PYTHON) or not hasattr(transport.KafkaTCPTransport, "_sock_recv"):
        return False
    transport.KafkaTCPTransport._sock_recv = _sock_recv
    return True


def _sock_recv(self):
    """kafka-python's ``KafkaTCPTransport._sock_recv`` (3.0.12), reading ``SOCKET_READ_BYTES`` a call."""
    import kafka.errors as Errors
    from kafka.net.transport import log

    recvd = []
    err = None
    while True:
        try:
            data = self._sock.recv(SOCKET_READ_BYTES)
            if not data:  # non-blocking: no data raises; empty data is a closed connection
                log.error('%s: socket disconnected', self)
                err = Errors.KafkaConnectionError('socket disconnected')
                break
            recvd.append(data)
        except (BlockingIOError, InterruptedError):
            break
        except BaseException as e:
            log.exception('%s: Error receiving network data closing socket', self)
            err = Errors.KafkaConnectionError(e)
            break
    return b''.join(recvd), err


def frames_read_in_one_copy() -> bool:
    """Have kafka-python's frame buffer (``KafkaBytes``, a ``bytearray`` a response is received into) give the
    bytes read in one copy; whether it does (not on a kafka-python other than the checked releases).

    kafka-python 3.0 decodes a response from ``read_buffer.read()``, the frame's bytes after its header, as
    ``bytes(self[start:end])``: a ``bytearray`` slice (a copy) made ``bytes`` (a second copy), a fetch response
    of megabytes copied twice. Through a ``memoryview`` the slice copies nothing. Reading 234 MB of 1.3 MB
    messages as a host does (docs/pages/performance.md, 2026-12-07 mid-morning): 1.48 -> 1.21 ns a byte of the
    consumer's CPU (medians of 5 alternated, loaded)."""
    import kafka
    from kafka.protocol.frame import KafkaBytes

    if not kafka.__version__.startswith(FETCH_KAFKA_PYTHON) or not hasattr(KafkaBytes, "read"):
        return False
    KafkaBytes.read = _frame_read
    return True


def _frame_read(self, nbytes=None) -> bytes:
    """kafka-python's ``KafkaBytes.read`` (3.0.12): the next ``nbytes`` (None: the rest), as bytes, copied once."""
    if nbytes is None:
        nbytes = len(self) - self._idx
    start = self._idx
    self._idx = min(self._idx + nbytes, len(self))
    with memoryview(self) as view:
        return bytes(view[start:self._idx])


_classes: dict = {}


def _kernel_records_class(parent: type) -> type:
    """kafka-python's ``PartitionRecords`` with record batches read by the kernel (one class per parent)."""
    if parent in _classes:
        return _classes[parent]
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.errors import CorruptRecordError
    from kafka.protocol.consumer import IsolationLevel

    class KernelPartitionRecords(parent):
        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            """kafka-python's ``_unpack_records`` (3.0.12), but a batch's records read by the kernel."""
            try:
                batch = records.next_batch()
                last_batch = None
                while batch is not None:
                    last_batch = batch
                    if self.check_crcs and not batch.validate_crc():
                        raise CorruptRecordError("Record batch for partition %s at offset %s failed crc check"
                                                 % (self.topic_partition, batch.base_offset))
                    if batch.magic == 2 and self._skipped(batch):
                        self.next_fetch_offset = batch.next_offset
                        batch = records.next_batch()
                        continue
                    for record in self._records_of(tp, batch):
                        self.records_read += 1
                        self.next_fetch_offset = record.offset + 1
                        yield record
                    batch = records.next_batch()
                else:
                    if last_batch and last_batch.magic == 2:
                        self.next_fetch_offset = last_batch.next_offset
                    self.drain()
            except StopIteration:  # as kafka-python: a StopIteration inside would end the generator silently
                raise RuntimeError('StopIteration raised unpacking messageset')

        def _skipped(self, batch) -> bool:
            """Whether a v2 batch is not returned: an aborted transaction's, or a control batch (kafka-python's
            rules, in its order: the aborted producers are updated first)."""
            self.leader_epoch = batch.leader_epoch
            if self.isolation_level == IsolationLevel.READ_COMMITTED and batch.has_producer_id():
                self._consume_aborted_transactions_up_to(batch.last_offset)
                if self._contains_abort_marker(batch):
                    self.aborted_producer_ids.discard(batch.producer_id)
                elif self._is_batch_aborted(batch):
                    return True
            return batch.is_control_batch

        def _records_of(self, tp, batch):
            """The ConsumerRecords of ``batch``: the kernel's list, else kafka-python's reader's."""
            if batch.magic == 2:
                iter(batch)  # decompressed
                read = consumer_records(batch._buffer, batch._pos, batch.records_count, batch.base_offset,
                                        batch.first_timestamp, batch.max_timestamp, batch.timestamp_type,
                                        tp.topic, tp.partition, self.leader_epoch, ConsumerRecord)
                if read is not None:
                    self.bytes_read += read[1]
                    return read[0]
            return self._records_read_by_client(tp, batch)

        def _records_read_by_client(self, tp, batch):
            for record in batch:
                if self.check_crcs and not record.validate_crc():
                    raise CorruptRecordError("Record for partition %s at offset %s failed crc check"
                                             % (self.topic_partition, record.offset))
                headers = record.headers
                header_size = (sum(len(k.encode("utf-8")) + (len(v) if v is not None else 0) for k, v in headers)
                               if headers else -1)
                self.bytes_read += record.size_in_bytes
                yield ConsumerRecord(
                    tp.topic, tp.partition, self.leader_epoch, record.offset, record.timestamp,
                    record.timestamp_type, record.key, record.value, headers, record.checksum,
                    len(record.key) if record.key is not None else -1,
                    len(record.value) if record.value is not None else -1, header_size)

    _classes[parent] = KernelPartitionRecords
    return KernelPartitionRecords


def metadata_paced_as_configured() -> bool:
    """Have every kafka-python client of this process wait its own ``retry_backoff_ms`` between two refreshes of
    its cluster metadata, not always 100 ms; whether they do (not on a kafka-python other than the checked releases).

    kafka-python 3.0's ``KafkaConnectionManager`` makes a client's ``ClusterMetadata`` without the client's
    ``retry_backoff_ms``, which keeps its default of 100 ms, and a refresh waits that long after the one before:
    a topic named for the first time, a partition's first offsets, each waited up to 100 ms after the client's
    own start. Our clients are given 20 ms (``config.kafka_client_settings``): a vshards host took 0.41-0.55 s
    to connect, 0.25-0.28 s so (2026-12-07). A client given nothing keeps kafka-python's 100 ms.
    """
    import kafka
    from kafka.net.manager import KafkaConnectionManager

    if not kafka.__version__.startswith(FETCH_KAFKA_PYTHON):
        return False
    made = KafkaConnectionManager.__init__
    if getattr(made, "paced_as_configured", False):
        return True

    def init(self, net, **configs):
        made(self, net, **configs)
        if "retry_backoff_ms" in configs and isinstance(getattr(self.cluster, "config", None), dict):
            self.cluster.config["retry_backoff_ms"] = configs["retry_backoff_ms"]

    init.paced_as_configured = True
    KafkaConnectionManager.__init__ = init
    return True
