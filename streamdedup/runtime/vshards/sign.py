"""The ``sign`` role: input records in, epochs out, in a consumer group of any size.

Each poll's records (topped up while the input is behind, ``_batch``) are
cut into epochs of at most ``shards.batch_bytes`` record bytes per vshard and
each is placed at its home (``placement.homes_of_records``: by its id, which the
kernel finds in a JSON record's bytes; other records are decoded). Each vshard home to records of an epoch gets a home message on its
partition of the records topic: those records whole, with how they were
decoded (``messages.pack_home``); the home decodes and prepares them itself,
so what preparing makes never crosses Kafka. Once the broker has those, the epoch naming them
goes to the order topic (``messages.pack_epoch``); once the broker has every
epoch, the group's offsets after them are committed (a home or epoch message
it did not take raises first, ``sink.deliveries``: those offsets stay where
they are). A process that dies between two of these (home messages no epoch
names are never read), or loses its partitions in a rebalance, leaves records
that the next owner signs again: the vshards take each input record once, by its partition and offset
(``Epoch.fresh_after``), so signing needs no transaction. Nothing here
depends on earlier epochs: processes come and go freely.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from typing import Callable, Optional

from ...config import Config, kafka_client_settings
from ...core.decode import InputSpec
from ...core.memory import keep_freed_memory
from ...core.signing import signing_config
from ...engine.vshards.placement import homes_of_records
from ...errors import lost_write
from ...faults import reached
from ...ops.logs import Log
from ...ops.telemetry import WorkerTelemetry
from ..sink.admin import topic_limits
from ..sink.deliveries import flushed
from ..sessions import SessionLoop
from ..source import KafkaSource
from .messages import input_ranges, kept_with_order, pack_epoch, pack_home
from .topics import SIGNED_MESSAGE_BYTES, ensure_internal_topics, values_topic

__all__ = ["run_signer", "signed_spans", "queue_forget"]

FILL_WAIT_S = 0.5  # longest time spent filling an epoch while the input is behind
EPOCH_S = 0.1  # shortest time an epoch fills for while records keep coming (each costs its vshards as much)
# A session's first epoch holds at most this share of ``shards.epoch_records``, and each next one twice as many as
# the one before, up to it: the vshards wait for an epoch whole before they begin it, so a full first epoch left
# them idle at start (when the signer signed records: 0.5 s for 10,000), where a small one starts them while the
# next is read. Now that the signer only places records (8-10 µs a record) a first epoch is cut by ``FILL_WAIT_S``
# as often, but a small one also shortens the time in which a second host's join can refuse the first host's
# first commit (2026-12-07: 2 of 15 rounds so at this share; none gained without the ramp).
FIRST_EPOCH_SHARE = 1 / 8
# A signer killed without leaving the group holds its input partitions until the group drops it after
# ``session_timeout_ms`` (kafka-python: 45 s), and signing stops meanwhile; a signer's heartbeats run on
# their own thread, so a shorter session costs nothing. A member hears of a rebalance in a heartbeat's
# answer, so a process joining waited up to a whole interval (3 s) for the others to let go of their share:
# the vshards of two hosts started together went to the first for its first epochs. [kafka.consumer]
# settings replace these.
GROUP_SESSION = {"session_timeout_ms": 10000, "heartbeat_interval_ms": 500}


def signed_spans(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Records of value bytes ``sizes`` cut into runs of at most ``limit`` bytes (a larger record alone), in order:
    each run's (start, stop)."""
    spans, start, size = [], 0, 0
    for at, length in enumerate(sizes):
        if at > start and size + length > limit:
            spans.append((start, at))
            start, size = at, 0
        size += length
    if start < len(sizes):
        spans.append((start, len(sizes)))
    return spans


class _Signer:
    """One connection: a group member reading the input topics, a producer to the order and records topics."""

    def __init__(self, config: Config):
        from kafka import KafkaProducer

        ensure_internal_topics(config)
        self.config = config
        self.fingerprint = signing_config(config).fingerprint()
        self.values_topic = values_topic(config)
        consumer_settings = kafka_client_settings(config.kafka, "consumer")
        producer_settings = kafka_client_settings(config.kafka, "producer")
        self.spec = self._input_spec(consumer_settings)
        self.placing = self.spec.placing()
        self.source = KafkaSource(config.input.topics, {**GROUP_SESSION, **consumer_settings},
                                  f"{config.kafka.group_id}-sign", self._first_epoch_records())
        self.source.subscribe(config.input.topics)
        self.producer = KafkaProducer(**{"acks": "all", "linger_ms": 5, "max_request_size": SIGNED_MESSAGE_BYTES,
                                         "batch_size": 1 << 20, **producer_settings})

    def _input_spec(self, settings: dict) -> InputSpec:
        """The worker's input spec: records too large for the clean topic are rejected as they are decoded."""
        spec = InputSpec.from_section(self.config.input)
        clean = self.config.output.clean_topic
        limit = topic_limits(settings, [clean]).get(clean, 0)
        if not limit:
            return spec
        return dataclasses.replace(spec, max_output_bytes=limit, kept_bytes=kept_with_order)

    def sign_once(self, timeout_ms: int, step: Callable[[Optional[str]], None] = lambda name: None) -> int:
        """Read a poll's records, sign them and send their epochs, then commit the group's offsets; returns how
        many records.

        ``step`` is told each step that waits for the broker (``Watchdog.phase``).
        """
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        step("records from the input topics")
        payload = self._batch(timeout_ms)
        if not payload[0]:
            step(None)
            return 0
        self._grow_epochs()
        step("the epochs sent")
        spans = signed_spans([len(value) if value else 0 for value in payload[0]], self._most_bytes())
        chunks = [tuple(column[start:stop] for column in payload) for start, stop in spans]
        homes_sent = [self._send_homes(chunk) for chunk in chunks]
        timeout = self.config.worker.kafka_timeout_s
        flushed(self.producer, [sent for at in homes_sent for sent in at.values()], "a home message",
                SIGNED_MESSAGE_BYTES, timeout)
        homes_at = [{home: sent.get(timeout=timeout).offset for home, sent in at.items()} for at in homes_sent]
        reached("values-sent")  # a crash here leaves home messages no epoch names: the next signer sends its own
        epochs = [self.producer.send(self.config.shards.signed_topic, partition=0,
                                     value=pack_epoch(time.time(), self.fingerprint, len(chunk[0]),
                                                      input_ranges(chunk), at))
                  for chunk, at in zip(chunks, homes_at)]
        # flush returns once every send is done, taken or not: an epoch the broker never took must not have its
        # records' offsets committed (no epoch would ever name them)
        flushed(self.producer, epochs, "an epoch message", SIGNED_MESSAGE_BYTES, timeout)
        reached("signed-sent")  # a crash here signs these records again: the vshards take them once
        step("the group's offsets committed")
        self._commit({TopicPartition(topic, partition): OffsetAndMetadata(last + 1, "", -1)
                      for (topic, partition), (_, last) in input_ranges(payload).items()})
        step(None)
        return len(payload[0])

    def _send_homes(self, chunk: tuple) -> dict:
        """Send the home message of each vshard home to records of ``chunk`` (``raw_payload`` columns;
        ``homes_of_records``: the homes of the records decoded as far as their ids, ``InputSpec.placing``): their
        bytes and places, for their home alone, which decodes and prepares them; vshard -> its send's future."""
        homes = homes_of_records(chunk, self.placing, self.config.shards.count).tolist()
        places: dict[int, list[int]] = {}
        for place, home in enumerate(homes):
            places.setdefault(home, []).append(place)
        return {home: self.producer.send(self.values_topic, partition=home,
                                         value=pack_home(at, [_picked(column, at) for column in chunk], self.spec))
                for home, at in sorted(places.items())}

    def _first_epoch_records(self) -> int:
        """Records the session's first epoch holds at most (``FIRST_EPOCH_SHARE``): the source's batch size, which
        ``_grow_epochs`` doubles up to ``shards.epoch_records`` (larger epochs cost the vshards less a document)."""
        return max(1, int(self.config.shards.epoch_records * FIRST_EPOCH_SHARE))

    def _grow_epochs(self) -> None:
        """The next epoch may hold twice as many records as this one could, up to ``shards.epoch_records``."""
        self.source.batch_size = min(2 * self.source.batch_size, self.config.shards.epoch_records)

    def _most_bytes(self) -> int:
        """Record bytes in one epoch: ``shards.batch_bytes`` in each vshard's home message on average."""
        return self.config.shards.batch_bytes * self.config.shards.count

    def _batch(self, timeout_ms: int) -> tuple:
        """One poll's records (``raw_payload`` columns), topped up to an epoch's records and bytes while the input
        is behind (records are waiting beyond them, as the last fetch says), for at most ``FILL_WAIT_S``, and for
        ``EPOCH_S`` in any case while records keep coming. Every epoch costs the vshards rounds of messages and a
        commit each (about as much for ten records as for ten thousand): a backlog is cut into full epochs, a
        steady light stream into ten a second, and a lone record goes at once."""
        limit = self._most_bytes()
        began = time.monotonic()
        source = self.source

        def fill(size: int) -> bool:
            now = time.monotonic()
            return size < limit and (now < began + EPOCH_S or (
                now < began + FILL_WAIT_S and not source.read_to_end(source.consumer.assignment())))

        return source.poll_payload(timeout_ms, int(EPOCH_S * 1000), fill)

    def _commit(self, offsets: dict) -> None:
        """Commit the group's offsets; a rebalance that took the partitions away is no loss (they are signed
        again by their new owner, and the vshards take each record once)."""
        from kafka.errors import CommitFailedError

        try:
            self.source.consumer.commit(offsets)
        except CommitFailedError:
            pass

    def close(self) -> None:
        for close in (lambda: self.producer.close(timeout=5), self.source.close):
            try:
                close()
            except Exception:  # closing after the broker vanished may fail; what was sent is settled
                pass


def _picked(column: list, at: list[int]) -> list:
    """The items of ``column`` at places ``at``, in their order."""
    return [column[at[0]]] if len(at) == 1 else list(operator.itemgetter(*at)(column))


def run_signer(config: Config, log: Log, stopper, until_idle_s: Optional[float] = None) -> int:
    """The ``run --role sign`` command: sign until stopped (or idle for ``until_idle_s``); returns records signed.

    Its sessions run in the reconnect loop every role shares (``sessions``).
    """
    keep_freed_memory()  # an epoch's arrays and home messages are megabytes each (``memory.keep_freed_memory``)
    telemetry = WorkerTelemetry(None, config.metrics.address if config.metrics.enabled else None)
    telemetry.start()
    log.info("started", role="sign", topics=",".join(config.input.topics), signed_topic=config.shards.signed_topic,
             bootstrap=config.kafka.bootstrap_servers, metrics=telemetry.url() or "off")
    loop = SessionLoop(config, log, stopper, telemetry, role="sign")
    signed, idle_since = 0, time.monotonic()

    def session(connected: Callable[..., None]) -> int:
        nonlocal signed, idle_since
        signer = _Signer(config)
        try:
            connected()
            while not stopper.stopped:
                began = time.monotonic()
                count = signer.sign_once(config.worker.poll_timeout_ms, loop.watchdog.phase)
                if count:
                    signed += count
                    idle_since = time.monotonic()
                    telemetry.batch_sent(time.monotonic() - began)
                elif until_idle_s is not None and time.monotonic() - idle_since >= until_idle_s:
                    break
            return signed
        finally:
            signer.close()

    try:
        loop.run(session, until_done=until_idle_s is not None)
        return signed
    finally:
        loop.close()
        telemetry.stopping = True
        telemetry.stop()
        log.info("stopped", role="sign", records=signed)


def queue_forget(config: Config, ids: list[str]) -> int:
    """``streamdedup forget`` on a sharded deployment: the order goes into the order topic, where every vshard
    meets it at the same place in the decision order; returns its offset there."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from ...core.signed import pack_forget

    ensure_internal_topics(config)
    producer = KafkaProducer(**{"acks": "all", "max_request_size": SIGNED_MESSAGE_BYTES,
                                **kafka_client_settings(config.kafka, "producer")})
    try:
        sent = producer.send(config.shards.signed_topic, partition=0, value=pack_forget(ids))
        try:
            return sent.get(timeout=config.worker.kafka_timeout_s).offset
        except KafkaError as exc:  # the command's own message, not a traceback: nothing was queued
            raise lost_write("the forget order", config.shards.signed_topic, 0, exc, SIGNED_MESSAGE_BYTES) from exc
    finally:
        producer.close(timeout=5)
