"""The ``vshards`` role: one process hosting some of a key-split deployment's virtual shards on Kafka.

Each hosted vshard (``engine.vshards.VShard``) goes through the order topic
one message after the other (``messages``): an epoch starts it with its
home's records of the epoch (its partition of the records topic), and its
messages to the other vshards go to their partitions of the exchange
topic, from which it reads theirs; a message to itself stays in the
process. Once a vshard has decided an epoch, ``VShardCommit`` puts its
outcomes out and commits (``checkpoint``'s steps for a vshard).

Where offsets move: a vshard's positions (the next order message, each input
partition's next offset, the next serial, where to read its exchange
partition from) are its state's, committed with it; the order topic's
offset after each epoch whose outcomes went out is committed in that
epoch's Kafka transaction for the vshard's own group, so a restart knows
which epochs Kafka has and decides them again without emitting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...config import Config, kafka_client_settings
from ...core.prepare import prepare
from ...core.records import id_key
from ...core.signed import ForgetOrder, subset
from ...core.signing import signing_config
from ...engine.settings import DedupSettings
from ...engine.vshards import Message, VShard, check_supported, homes_of
from ...errors import BrokerUnavailableError, ConfigError, IndexUnusableError
from ...faults import reached
from ...ops.logs import Log
from ...ops.telemetry import WorkerTelemetry
from ..sessions import SessionLoop, Stopper
from ..shards.topics import SIGNED_MESSAGE_BYTES, ensure_internal_topics, values_topic
from ..sink.producer import KafkaSink
from ..source import KafkaSource
from ..worker import WorkerStats, close_quietly
from .messages import Epoch, Home, pack_message, unpack_home, unpack_message, unpack_order

__all__ = ["run_vshards", "parse_vshards", "VShardHost"]

WAIT_S = 60.0  # longest wait for a message named by another (a home message, the order topic's next)
ORDER_HEADER = "streamdedup.order"


def parse_vshards(text: str, count: int) -> list[int]:
    """``0-3,7`` -> [0, 1, 2, 3, 7]; each must be below ``count``."""
    numbers: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            numbers.update(range(int(first), int(last or first) + 1))
        except ValueError:
            raise ConfigError(f"--vshards {text!r}: give numbers and ranges, such as 0-3,7") from None
    wrong = sorted(n for n in numbers if not 0 <= n < count)
    if wrong or not numbers:
        raise ConfigError(f"--vshards {text!r}: vshards are 0 to {count - 1} (shards.count - 1); not {wrong}")
    return sorted(numbers)


@dataclass
class _InFlight:
    """The epoch a hosted vshard is deciding."""

    number: int
    offset: int  # its order message's
    records: list  # this home's records of it, whole, in the order of its items
    serials: list  # their places in the order
    emit: bool  # False: Kafka has its outcomes already (decided again after a crash)


@dataclass
class _Hosted:
    """A vshard in this process and where it is: its positions are what its state would commit."""

    vshard: VShard
    order_at: Optional[int] = None  # where to take the next order message from (None: the topic's beginning)
    next_input: dict = field(default_factory=dict)  # (topic, partition) -> the next offset not taken
    next_serial: int = 1
    emitted_before: int = 0  # order messages before this have their outcomes in Kafka
    flight: Optional[_InFlight] = None
    floors: dict = field(default_factory=dict)  # epoch -> lowest exchange offset read of a message of it
    exchange_at: Optional[int] = None  # where to read its exchange partition from after a restart

    @property
    def number(self) -> int:
        return self.vshard.number

    def positions(self) -> dict:
        return {"order_at": self.order_at, "next_input": [[t, p, o] for (t, p), o in sorted(self.next_input.items())],
                "next_serial": self.next_serial, "exchange_at": self.exchange_at}


class _Reader:
    """A consumer of some partitions of one topic, without a group (positions are the vshards'), holding what it
    read by (partition, offset) until asked for it."""

    def __init__(self, topic: str, partitions: list[int], settings: dict, starts: dict):
        from kafka import TopicPartition

        self.topic = topic
        self.source = KafkaSource([topic], settings, None, 1000)
        self.partitions = {n: TopicPartition(topic, n) for n in partitions}
        self.source.assign(list(self.partitions.values()))
        for n, tp in self.partitions.items():
            self.source.seek(tp, starts.get(n))
        self.held: dict[tuple[int, int], bytes] = {}

    def poll(self, timeout_ms: int) -> list:
        """What came: (partition, offset, value) each, in offset order per partition."""
        return [(r.source.partition, r.source.offset, r.value)
                for r in self.source.poll_batch(timeout_ms, max_records=1000)]

    def at(self, partition: int, offset: int, stopper: Stopper, step: Callable) -> bytes:
        """The message at ``offset`` of ``partition``, reading on to it (it was written before the message naming
        it, so it comes; BrokerUnavailableError past ``WAIT_S``: the session starts again)."""
        tp = self.partitions[partition]
        if (partition, offset) not in self.held and self.source.position(tp) != offset:
            self._check_kept(tp, offset)
            self.source.seek(tp, offset)
        deadline = time.monotonic() + WAIT_S
        while (partition, offset) not in self.held:
            if stopper.stopped:
                raise BrokerUnavailableError(f"stopping while reading {self.topic}/{partition} at {offset}")
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(f"message {offset} of {self.topic}/{partition} did not come in "
                                             f"{WAIT_S:.0f} s")
            step(f"message {offset} of {self.topic}/{partition}")
            for n, at, value in self.poll(200):
                self.held[(n, at)] = value
        self.drop_before(partition, offset)
        return self.held.pop((partition, offset))

    def _check_kept(self, tp, offset: int) -> None:
        first = self.source.consumer.beginning_offsets([tp])[tp]
        if first > offset:
            raise IndexUnusableError(f"{tp.topic}/{tp.partition} no longer holds offset {offset} (it begins at "
                                     f"{first}): the internal topics' retention must keep what the vshards have not "
                                     "committed (deploy/README.md)")

    def drop_before(self, partition: int, offset: int) -> None:
        for key in [k for k in self.held if k[0] == partition and k[1] < offset]:
            del self.held[key]

    def close(self) -> None:
        self.source.close()


class VShardHost:
    """One connection to the broker for the hosted vshards: the order, records and exchange readers, a producer
    for the exchange, and a transactional producer per vshard for its outcomes."""

    def __init__(self, config: Config, hosted: list[_Hosted], log: Log, stopper: Stopper,
                 step: Callable[[Optional[str]], None]):
        from kafka import KafkaProducer

        ensure_internal_topics(config)
        self.config, self.log, self.stopper, self.step = config, log, stopper, step
        self.hosted = {h.number: h for h in hosted}
        self.count = config.shards.count
        self.fingerprint = signing_config(config).fingerprint()
        settings = kafka_client_settings(config.kafka, "consumer")
        producer_settings = kafka_client_settings(config.kafka, "producer")
        self.order_topic = config.shards.signed_topic
        self.sinks: dict[int, KafkaSink] = {}
        self.order = self.records = self.exchange = self.publisher = None
        try:
            self.publisher = KafkaProducer(**{"acks": "all", "linger_ms": 0, "max_request_size": SIGNED_MESSAGE_BYTES,
                                              **producer_settings})
            out = config.output
            for n in self.hosted:
                self.sinks[n] = KafkaSink(producer_settings, self.transactional_id(n),
                                          {"clean": out.clean_topic, "duplicates": out.duplicates_topic,
                                           "dead_letter": out.dead_letter_topic}, out.dead_letter_max_bytes)
            self._recover_positions(settings)
            self.order = _Reader(self.order_topic, [0], settings, {})
            first = self.order.source.consumer.beginning_offsets([self.order.partitions[0]])[self.order.partitions[0]]
            for h in self.hosted.values():
                h.order_at = first if h.order_at is None else h.order_at
            self.order.source.seek(self.order.partitions[0], min(h.order_at for h in self.hosted.values()))
            self.records = _Reader(values_topic(config), list(self.hosted), settings, {})
            self.exchange = _Reader(config.shards.evidence_topic, list(self.hosted), settings,
                                    {n: h.exchange_at for n, h in self.hosted.items()})
        except BaseException:
            self.close()
            raise
        self.orders: dict[int, bytes] = {}  # order offset -> message, read ahead for the slower vshards
        self.decided = 0
        self.outcomes = WorkerStats()

    # -- names ---------------------------------------------------------------------------------------------

    def transactional_id(self, number: int) -> str:
        base = self.config.worker.transactional_id or f"streamdedup-{self.config.kafka.group_id}"
        return f"{base}-vshard-{number}"

    def group_id(self, number: int) -> str:
        return f"{self.config.kafka.group_id}-vshard-{number}"

    # -- recovery -------------------------------------------------------------------------------------------

    def _recover_positions(self, settings: dict) -> None:
        """Which order messages have their outcomes in Kafka already, for each hosted vshard (its group's
        committed offset on the order topic): those are decided again without emitting."""
        from kafka import KafkaConsumer, TopicPartition

        tp = TopicPartition(self.order_topic, 0)
        for n, h in self.hosted.items():
            consumer = KafkaConsumer(**{"group_id": self.group_id(n), "enable_auto_commit": False, **settings})
            try:
                committed = consumer.committed(tp, timeout_ms=int(self.config.worker.kafka_timeout_s * 1000))
            finally:
                consumer.close()
            h.emitted_before = committed or 0

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self, until_caught_up: bool) -> None:
        """Epochs until stopped, or until every hosted vshard has taken the whole order topic."""
        self.publisher.partitions_for(self.config.shards.evidence_topic)
        while not self.stopper.stopped:
            started = any([self._start(h) for h in self.hosted.values() if h.flight is None])
            received = self._receive(0 if started else 100)
            if until_caught_up and not started and not received and self._caught_up():
                return

    def _caught_up(self) -> bool:
        if any(h.flight is not None for h in self.hosted.values()):
            return False
        end = self.order.source.end_offsets(list(self.order.partitions.values()))[self.order.partitions[0]]
        return all(h.order_at >= end for h in self.hosted.values())

    def _order_message(self, offset: int) -> Optional[tuple[int, bytes]]:
        """The order message at ``offset``, or the next one after it (offsets of transaction markers hold
        none), if it has come."""
        if not any(at >= offset for at in self.orders):
            for _, at, value in self.order.poll(0):
                self.orders[at] = value
        later = [at for at in self.orders if at >= offset]
        return (min(later), self.orders[min(later)]) if later else None

    def _start(self, h: _Hosted) -> bool:
        """Start ``h``'s next epoch if its order message is in; whether it started one."""
        found = self._order_message(h.order_at)
        if found is None:
            return False
        offset, value = found
        order = unpack_order(value)
        epoch = h.vshard.epochs_done
        if isinstance(order, ForgetOrder):
            mine = [doc_id for doc_id, home in zip(order.ids, homes_of([id_key(i) for i in order.ids], self.count)
                                                   .tolist()) if home == h.number] if order.ids else []
            h.flight = _InFlight(epoch, offset, [], [], False)
            self._send(h.vshard.forget(epoch, mine))
            return True
        if order.fingerprint != self.fingerprint:
            raise IndexUnusableError(f"an epoch was signed with {order.fingerprint}, vshard {h.number} runs with "
                                     f"{self.fingerprint}: give the sign and vshards roles the same [signing], [lsh] "
                                     "and [templates] settings")
        if not order.fresh_after(h.next_input):  # every record of it taken before (signed twice)
            h.order_at = offset + 1
            self._forget_order_before(h.order_at)
            return True
        records, batch, places = self._home_records(h, order)
        span = (h.next_serial, h.next_serial + order.count)
        for topic, partition, _, last in order.ranges:
            h.next_input[(topic, partition)] = max(h.next_input.get((topic, partition), 0), last + 1)
        h.next_serial = span[1]
        serials = [span[0] + p for p in places]
        h.flight = _InFlight(epoch, offset, records, serials, offset >= h.emitted_before)
        self._send(h.vshard.slice_prepared(epoch, batch, serials, span, order.signed_at))
        return True

    def _home_records(self, h: _Hosted, order: Epoch) -> tuple:
        """This home's records of ``order`` not taken before: whole, prepared, and their places in the epoch."""
        at = order.homes.get(h.number)
        if at is None:
            return [], prepare([], h.vshard.signing), []
        home: Home = unpack_home(self.records.at(h.number, at, self.stopper, self.step))
        keep = [r.source.offset >= h.next_input.get((r.source.name, r.source.partition), 0) for r in home.records]
        return ([r for r, k in zip(home.records, keep) if k], subset(home.prepared, keep),
                [p for p, k in zip(home.places, keep) if k])

    def _receive(self, timeout_ms: int) -> bool:
        """Deliver what the exchange brought; whether anything came."""
        polled = self.exchange.poll(timeout_ms)
        for partition, offset, value in polled:
            message = unpack_message(value)
            h = self.hosted[partition]
            if message.epoch >= h.vshard.epochs_done:
                h.floors[message.epoch] = min(h.floors.get(message.epoch, offset), offset)
            self._deliver(h, message)
        return bool(polled)

    def _deliver(self, h: _Hosted, message: Message) -> None:
        self._send(h.vshard.receive(message))
        flight = h.flight
        if flight is not None and h.vshard.epochs_done > flight.number:
            self._finish(h)

    def _send(self, messages: list[Message]) -> None:
        """Messages to other vshards through their exchange partitions (flushed: they wait for them); to itself,
        at once."""
        own = []
        for message in messages:
            if message.to == message.sender:
                own.append(message)
            else:
                self.publisher.send(self.config.shards.evidence_topic, partition=message.to,
                                    value=pack_message(message))
        self.publisher.flush(timeout=self.config.worker.kafka_timeout_s)
        for message in own:
            self._deliver(self.hosted[message.to], message)

    def _finish(self, h: _Hosted) -> None:
        """The epoch is decided here: its outcomes out and its state committed (``VShardCommit``)."""
        flight = h.flight
        decisions = h.vshard.decided.pop(flight.number)
        h.order_at = flight.offset + 1
        h.flight = None
        h.exchange_at = self._exchange_floor(h, flight.number)
        if flight.emit and flight.records:
            self._kafka_transaction(h, flight, decisions)
        reached("vshard-kafka-committed")
        commit = getattr(h.vshard, "commit", None)
        if commit is not None:
            commit(h.positions())
        reached("vshard-committed")
        self.outcomes.summary.add(decisions)
        self.decided += len(decisions)
        self._forget_order_before(min(x.order_at for x in self.hosted.values()))

    def _exchange_floor(self, h: _Hosted, epoch: int) -> int:
        """Where a restart reads ``h``'s exchange partition from once ``epoch`` is committed: the first message
        read of a later epoch, or what comes next."""
        for done in [e for e in h.floors if e <= epoch]:
            del h.floors[done]
        if h.floors:
            return min(h.floors.values())
        return self.exchange.source.position(self.exchange.partitions[h.number])

    def _kafka_transaction(self, h: _Hosted, flight: _InFlight, decisions: list) -> None:
        """The epoch's outcomes of this home and the order offset after it, for the vshard's group, in one
        Kafka transaction; each outcome says its place in the order (epoch's order offset / serial)."""
        from kafka import TopicPartition

        sink = self.sinks[h.number]
        sink.begin()
        offsets = sink.send_offsets({TopicPartition(self.order_topic, 0): flight.offset + 1}, self.group_id(h.number))
        messages = sink.messages(flight.records, decisions)
        places = [f"{flight.offset}/{serial}".encode() for serial, d in zip(flight.serials, decisions)
                  if not d.replayed]
        for (_, message), place in zip(messages, places):
            message["headers"] = message["headers"] + [(ORDER_HEADER, place)]
        sink.send(messages)
        offsets.wait(self.config.worker.kafka_timeout_s, "the order offset to join the Kafka transaction",
                     sink.transaction_error)
        sink.commit(self.config.worker.kafka_timeout_s)

    def _forget_order_before(self, offset: int) -> None:
        for at in [at for at in self.orders if at < offset]:
            del self.orders[at]

    def close(self) -> None:
        close_quietly(*self.sinks.values(), self.order, self.records, self.exchange)
        if self.publisher is not None:
            try:
                self.publisher.close(timeout=5)
            except Exception:
                pass


def run_vshards(config: Config, numbers: list[int], until_caught_up: bool, log: Log,
                stopper: Optional[Stopper] = None) -> WorkerStats:
    """The ``run --role vshards`` command: host ``numbers`` of the ``shards.count`` vshards until stopped (or
    caught up)."""
    check_supported(config)
    stopper = stopper or Stopper()
    telemetry = WorkerTelemetry(None, config.metrics.address if config.metrics.enabled else None)
    telemetry.start()
    log.info("started", role="vshards", vshards=",".join(map(str, numbers)), count=config.shards.count,
             order_topic=config.shards.signed_topic, bootstrap=config.kafka.bootstrap_servers)
    settings = DedupSettings.of(config, signing_config(config))
    loop = SessionLoop(config, log, stopper, telemetry, role="vshards")
    stats = WorkerStats()
    began = time.monotonic()

    def session(connected: Callable[..., None]) -> WorkerStats:
        hosted = [_Hosted(VShard(n, config.shards.count, settings)) for n in numbers]  # in memory: from the start
        host = VShardHost(config, hosted, log, stopper, loop.watchdog.phase)
        try:
            connected(vshards=",".join(map(str, numbers)))
            host.run(until_caught_up)
            return host.outcomes
        finally:
            host.close()

    try:
        found = loop.run(session, until_done=until_caught_up)
        if found is not None:
            stats = found
    finally:
        loop.close()
        telemetry.stopping = True
        telemetry.stop()
    stats.summary.seconds = time.monotonic() - began
    return stats
