"""The ``vshards`` role: one process hosting some of a key-split deployment's virtual shards on Kafka.

Each hosted vshard (``engine.vshards.VShard``) goes through the order topic
one message after the other (``messages``): an epoch starts it with its
home's records of the epoch (its partition of the records topic), and its
messages to the other vshards go to their partitions of the exchange
topic, from which it reads theirs; a message to itself stays in the
process. Once a vshard has decided an epoch, ``checkpoint.VShardCommit``
puts its outcomes out and commits its state.

Where offsets move: a vshard's positions (the next order message, each input
partition's next offset, the next serial, where to read its exchange
partition from) are its state's, committed with it; the order topic's
offset after each epoch whose outcomes went out is committed in that
epoch's Kafka transaction (one a process for the vshards that decided an
epoch together) for the group ``<group_id>-vshards``, on the vshard's
partition of the exchange topic, so a restart knows which epochs Kafka has
and decides them again without emitting.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...config import Config, kafka_client_settings, transaction_producer_settings
from ...core.memory import QuietCollector, collector_paused, keep_freed_memory
from ...core.records import id_key
from ...core.signed import ForgetOrder
from ...core.signing import signing_config
from ...engine.settings import DedupSettings
from ...engine.vshards import Message, VShard, check_supported, homes_of
from ...errors import BrokerUnavailableError, ConfigError, GroupMovedError, IndexLockedError, IndexUnusableError
from ...faults import reached
from ...ops.logs import Log
from ...ops.telemetry import WorkerTelemetry
from ..checkpoint import VShardCommit, VShardEpoch
from ..fetch import held_fetches
from ..sessions import SessionLoop, Stopper, WorkerStats, close_quietly
from ..sink.appender import RecordAppender
from ..sink.deliveries import Deliveries
from ..sink.producer import KafkaSink, Pending
from ..source import KafkaSource, rejoin_if_abandoned
from .messages import Epoch, Home, pack_message, unpack_home, unpack_message, unpack_order
from .sign import GROUP_SESSION
from .topics import SIGNED_MESSAGE_BYTES, ensure_internal_topics, values_topic

__all__ = ["run_vshards", "parse_vshards", "VShardHost", "exchange_publisher", "EXCHANGE_BATCH_BYTES"]

# A stage's messages cross between processes once a fetch brings them. kafka-python leaves out of a fetch the
# partitions whose records it holds untaken, and sends no other fetch to the broker until the one in flight comes
# back: a message for such a partition waited out the whole wait (with the client's default 500 ms, an epoch took
# 1.3 s where its stages' work took 0.1; a one-record epoch 0.6 s against 0.15 at 10 ms). So a fetch that leaves
# some out waits ``FETCH_WAIT_MS`` at most, and one that asks for every partition, which the broker answers as soon
# as any has a message, ``HELD_FETCH_MS`` (``fetch.held_fetches``): fetching every 10 ms cost an idle host 6% of a
# core and the broker 3% for each (2026-12-06: 2.5% and 0.5% so). One case is left: a partition assigned while a held
# fetch is in flight (a vshard taken from another process) is first fetched when that fetch comes back, at most
# ``HELD_FETCH_MS`` later; a process fetches nothing before its first vshards, so its start does not wait so.
FETCH_WAIT_MS = 10
HELD_FETCH_MS = 500
# The group's member reads nothing: its partitions are paused as they are assigned, but a fetch may go out before
# (kafka-python assigns them, then calls the listener), and from the records topic's beginning a fetch brought up
# to 64 MiB of home messages for the member's network thread to parse in Python. A host that was given all the
# vshards at its start then stopped heartbeating and kept them while the group gave them to another (seen on a
# loaded machine: one host deciding alone, at twice its CPU a document): so it starts at the end and takes one
# record batch at most. Between its rounds of group bookkeeping, kafka-python's poll sleeps ``retry_backoff_ms``:
# at the 20 ms the other clients use (``config``), the member cost 2.6% of a core doing nothing (5 µs a document
# of a host's CPU on the end-to-end bench); at 100 ms, 0.8%, and it joins a new group in 0.13 s instead of 0.11.
IDLE_MEMBER = {"retry_backoff_ms": 100, "auto_offset_reset": "latest", "fetch_max_bytes": 1,
               "max_partition_fetch_bytes": 1}
# The member's client tries a broker that went away again after a pause that doubles, up to kafka-python's 30 s:
# after an outage of 15 s its next try came 14 s after the broker was back, past the group's session, so the
# group had dropped the member and it joined again as a new one, moving the generation and refusing the other
# processes' commits. A second at most kept it in the group (2026-12-07: a broker killed and back after 15 s,
# with the default 10 s session; a 6 s one had run out all the same). [kafka.consumer] settings replace this.
MEMBER_RECONNECT = {"reconnect_backoff_max_ms": 1000}
# A join of the group that outlasts the member's poll goes on without it, and may then never be completed
# (``rejoin_if_abandoned``): the longer each poll, the rarer that is; closing the member waits for one.
MEMBER_POLL_MS = 1000
# Each of kafka-python's poll rounds hands work to the client's network thread and waits for it (the coordinator
# looked up, a fetch of the paused partitions): ten rounds a second cost the member 0.6% of a core doing nothing
# (its thread 0.3%, the network thread as much; a wakeup alone is 40-60 µs of CPU on this machine). Its heartbeats
# run on the network thread without polls, and it needs a poll only to join (the heartbeats say when: a few
# attribute reads, ``_Membership._joining``) and to show it lives within ``max_poll_interval_ms`` (5 minutes). So it
# looks every ``MEMBER_LOOK_S`` (as often as its poll rounds were: a join begins as soon) and polls when it must
# join, or once every ``MEMBER_IDLE_POLL_S``: 0.25% of a core in all (2026-12-07, loaded: a second member's join
# completed in 0.40-0.51 s against 0.49-0.55).
MEMBER_LOOK_S = 0.1
MEMBER_IDLE_POLL_S = 5.0
MEMBER_KAFKA_PYTHON = "3.0."  # the kafka-python releases whose group coordinator ``_Membership`` reads
# A vshard with a new state reads its records and exchange partitions from their beginning. Seeking there
# (``seek_to_beginning``) leaves a partition unfetchable until the client has asked the broker where that is, and
# a broker answers a connection's requests in turn, so that question waited behind the held fetch in flight
# (``HELD_FETCH_MS``), as did the metadata of topics the consumer had not read yet: a deployment's first epoch
# took 0.6 to 1.6 s where its work took 0.1. So such a partition is read from offset 0, which the broker answers at
# once; a partition whose beginning retention has removed is out of range there, and the consumer moves to its
# beginning (``auto_offset_reset``), as the seek did.
FROM_START = {"auto_offset_reset": "earliest"}
# The exchange producer's record batches. kafka-python's sender puts one batch of each partition into a produce request
# (``RecordAccumulator.drain``), and at its default 16 KiB a stage message (about 13 KB at 10,000-record epochs) was a
# batch of its own: a turn's 15 batches went out as 2.1 requests, each a round of the sender's and the broker's
# per-request work (2026-12-07). A megabyte holds a partition's messages of a turn in one batch (``BatchAppender``),
# so a turn's messages are one request; larger messages are a batch each, as before.
EXCHANGE_BATCH_BYTES = 1 << 20
WAIT_S = 60.0  # longest wait for a message named by another (a home message, the order topic's next)
# A commit waits while the process's group member is told of a rebalance or joins (``_Membership.moving``): the
# broker refuses it once the join completes, until the new assignment is followed. A join usually completes once
# this member has joined (a process that joined started it), within tens of milliseconds; one that waits for a
# member paused or gone lasts up to the group's session timeout, and the commit goes on after ``GROUP_SETTLE_S``
# (then it is taken: the generation moves only at the join's end), waiting no more in that generation.
GROUP_SETTLE_S = 0.5


def known_offset(offset: Optional[int]) -> int:
    """Where to read a partition from: ``offset``, or for None (from its beginning) offset 0 (``FROM_START``)."""
    return 0 if offset is None else offset


def exchange_publisher(producer_settings: dict):
    """The producer of the vshards' messages to each other (``producer_settings``: ``[kafka.producer]`` and the
    connection's): not transactional, each turn's messages sent at once (``linger_ms`` 0) in one request
    (``EXCHANGE_BATCH_BYTES``), acknowledged once the broker has them (acks=all)."""
    from kafka import KafkaProducer

    return KafkaProducer(**{"acks": "all", "linger_ms": 0, "max_request_size": SIGNED_MESSAGE_BYTES,
                            "batch_size": EXCHANGE_BATCH_BYTES, **producer_settings})


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
    began: float = field(default_factory=time.monotonic)


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
    records_at: Optional[int] = None  # where to read its records partition from: after the last home message
    reading: Optional[Pending] = None  # the read of its ``emitted_before`` (``VShardHost._read_emitted``), until used

    @property
    def number(self) -> int:
        return self.vshard.number

    def close(self) -> None:
        self.vshard.close()

    def positions(self) -> dict:
        return {"order_at": self.order_at, "next_input": [[t, p, o] for (t, p), o in sorted(self.next_input.items())],
                "next_serial": self.next_serial, "exchange_at": self.exchange_at, "records_at": self.records_at}


def hosted_at(vshard: VShard, positions: dict) -> _Hosted:
    """A vshard where its last commit left it (``_Hosted.positions``; {}: at the beginning)."""
    return _Hosted(vshard, order_at=positions.get("order_at"),
                   next_input={(t, p): o for t, p, o in positions.get("next_input", [])},
                   next_serial=positions.get("next_serial", 1), exchange_at=positions.get("exchange_at"),
                   records_at=positions.get("records_at"))


class _Membership:
    """This process's place in the consumer group ``<group_id>-vshards`` on the records topic, which says which
    vshards it hosts (a partition a vshard): Kafka moves them when processes come and go. Its own thread polls
    the group (every partition paused: it reads nothing), so the group hears from the process however long a
    step of an epoch takes. It outlives the process's sessions (``_Members``): a session that ends leaves the
    group as it is, and the next follows the assignment as it stands."""

    def __init__(self, config: Config, settings: dict):
        from kafka import ConsumerRebalanceListener

        membership = self
        self.assignment: tuple = (set(), None)  # the vshards given, and the group's metadata when they were
        self.lost = 0  # times the group dropped this member (its session ran out), as the client reports them
        self.rejoined = 0  # times a join left half done by the client was asked for again
        self.stopping = threading.Event()

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                pass  # the vshards still given when the new assignment comes stay, with their epochs

            def on_partitions_assigned(self, assigned):
                consumer = membership.source.consumer
                consumer.pause(*assigned)
                membership.assignment = ({tp.partition for tp in assigned}, consumer.group_metadata())

            def on_partitions_lost(self, lost):
                membership.assignment = (set(), None)  # the group dropped this member: let the states go for others
                membership.lost += 1

        group = f"{config.kafka.group_id}-vshards"
        self.source = KafkaSource([], {**GROUP_SESSION, **MEMBER_RECONNECT, **settings, **IDLE_MEMBER}, group, 1)
        self.source.subscribe([values_topic(config)], Listener())
        self.thread = threading.Thread(target=self._poll, name="streamdedup-vshards-group", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        consumer, polled = self.source.consumer, 0.0
        while not self.stopping.is_set():
            try:
                joining = self._joining()
                if not joining and time.monotonic() - polled < MEMBER_IDLE_POLL_S:
                    self.stopping.wait(MEMBER_LOOK_S)
                    continue
                consumer.poll(timeout_ms=MEMBER_POLL_MS if joining else 0)
                polled = time.monotonic()
                self.rejoined += rejoin_if_abandoned(consumer)
            except Exception:  # the broker away: the group is joined again once it answers
                self.stopping.wait(1.0)

    def _joining(self) -> bool:
        """Whether the member has to poll to join the group: not joined, told of a rebalance (its heartbeats),
        its subscribed topics' partitions changed, a join under way, or no coordinator known (always, on a
        kafka-python whose coordinator is not the one this reads: it then polls as often as it may)."""
        from kafka.structs import MemberState

        coordinator = self._coordinator()
        if coordinator is None:
            return True
        return (coordinator.state is not MemberState.STABLE or coordinator.coordinator_id is None
                or coordinator._join_task is not None or coordinator.need_rejoin())

    def moving(self) -> bool:
        """Whether the member is between two generations: told the group rebalances, or joining it (never, on a
        kafka-python whose coordinator is not the one this reads)."""
        from kafka.structs import MemberState

        coordinator = self._coordinator()
        return coordinator is not None and (coordinator.rejoin_needed or coordinator.state is MemberState.REBALANCING)

    def _coordinator(self):
        """The member's group coordinator, if its kafka-python is a release this was checked against
        (``MEMBER_KAFKA_PYTHON``) and it has what ``_joining`` and ``moving`` read, else None."""
        import kafka

        coordinator = getattr(self.source.consumer, "_coordinator", None)
        parts = ("state", "coordinator_id", "_join_task", "need_rejoin", "rejoin_needed")
        if not kafka.__version__.startswith(MEMBER_KAFKA_PYTHON) or not all(hasattr(coordinator, p) for p in parts):
            return None
        return coordinator

    def usable(self) -> bool:
        """Whether a new session can take this member: its thread polls and its client is open. A broker that
        went away is reconnected to by the client itself, and a member the group dropped (its session ran out,
        ``on_partitions_lost``) is joined again by it, under a new member id: a new member for the group."""
        return self.thread.is_alive() and not getattr(self.source.consumer, "_closed", False)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.source.close()


class _Members:
    """The process's group member from one session to the next. A member made again for every session left the
    group as a session ended (a commit refused, a broker lost) and joined it again: twice the group's generation
    moved, refusing the other processes' next commits, whose sessions ended and did the same (a cascade). So a
    session takes the member the one before it had, and only one that cannot go on (``_Membership.usable``) is
    replaced; it leaves the group when the process stops."""

    def __init__(self, config: Config, settings: dict):
        self.config, self.settings = config, settings
        self.member: Optional[_Membership] = None
        self.made = 0  # members made: one for the process unless one had to be replaced

    def current(self) -> _Membership:
        """The member a new session takes: the process's, or a new one (joining on its own thread) if it has none
        or its member cannot go on."""
        if self.member is not None and not self.member.usable():
            close_quietly(self.member)
            self.member = None
        if self.member is None:
            self.member = _Membership(self.config, self.settings)
            self.made += 1
        return self.member

    def close(self) -> None:
        close_quietly(self.member)
        self.member = None


class _Inbound:
    """Everything the hosted vshards read, by one consumer without a group (their positions are theirs), held
    until taken: order messages by offset, home messages by vshard and offset, stage messages in the order they
    came."""

    def __init__(self, config: Config, settings: dict):
        from kafka import TopicPartition

        self.order_tp = TopicPartition(config.shards.signed_topic, 0)
        self.records_topic, self.exchange_topic = values_topic(config), config.shards.evidence_topic
        self.source = KafkaSource([], {"fetch_max_wait_ms": HELD_FETCH_MS, **settings, **FROM_START}, None, 1000)
        held_fetches(self.source.consumer, FETCH_WAIT_MS)
        self.source.assign([self.order_tp])
        self.first_order = self.source.consumer.beginning_offsets([self.order_tp])[self.order_tp]
        self.source.consumer.partitions_for_topic(self.records_topic)  # every topic's leaders, before any fetch
        self.orders: dict[int, bytes] = {}
        self.homes: dict[tuple[int, int], bytes] = {}
        self.stages: list[tuple[int, int, bytes]] = []

    def host(self, hosted: dict[int, _Hosted], new: list[int]) -> None:
        """Read the records and exchange partitions of ``hosted`` (the ``new`` ones from their positions), and
        the order topic from the first message one of them has not taken."""
        from kafka import TopicPartition

        for n in new:
            h = hosted[n]
            h.order_at = self.first_order if h.order_at is None else h.order_at
        self.source.assign([self.order_tp, *(TopicPartition(topic, n) for n in hosted
                                             for topic in (self.records_topic, self.exchange_topic))])
        for n in new:
            self.source.seek(TopicPartition(self.exchange_topic, n), known_offset(hosted[n].exchange_at))
            self.source.seek(TopicPartition(self.records_topic, n), known_offset(hosted[n].records_at))
        self.stages = [stage for stage in self.stages if stage[0] in hosted and stage[0] not in new]
        self.homes = {key: value for key, value in self.homes.items() if key[0] in hosted and key[0] not in new}
        if new and hosted:
            self.source.seek(self.order_tp, min(h.order_at for h in hosted.values()))
            self.orders.clear()

    def poll(self, timeout_ms: int) -> bool:
        """Read what has come, waiting at most ``timeout_ms`` for something; whether anything came."""
        records = self.source.poll_batch(timeout_ms, max_records=5000)
        for r in records:
            where = r.source
            if where.name == self.exchange_topic:
                self.stages.append((where.partition, where.offset, r.value))
            elif where.name == self.records_topic:
                self.homes[(where.partition, where.offset)] = r.value
            else:
                self.orders[where.offset] = r.value
        return bool(records)

    def order(self, offset: int) -> Optional[tuple[int, bytes]]:
        """The order message at ``offset``, or the first after it (a transaction marker's offset holds none), if
        it has come."""
        at = min((at for at in self.orders if at >= offset), default=None)
        return None if at is None else (at, self.orders[at])

    def drop_orders_before(self, offset: int) -> None:
        for at in [at for at in self.orders if at < offset]:
            del self.orders[at]

    def home(self, vshard: int, offset: int, stopper: Stopper, step: Callable) -> bytes:
        """The home message at ``offset`` of ``vshard``'s records partition, reading on to it (it was written
        before the order message naming it, so it comes; BrokerUnavailableError past ``WAIT_S``: the session
        starts again)."""
        from kafka import TopicPartition

        tp = TopicPartition(self.records_topic, vshard)
        if (vshard, offset) not in self.homes and self.source.position(tp) != offset:
            self._check_kept(tp, offset)
            self.source.seek(tp, offset)
        deadline = time.monotonic() + WAIT_S
        while (vshard, offset) not in self.homes:
            if stopper.stopped:
                raise BrokerUnavailableError(f"stopping while reading {tp.topic}/{vshard} at {offset}")
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(f"message {offset} of {tp.topic}/{vshard}, named by the order topic, "
                                             f"did not come in {WAIT_S:.0f} s")
            step(f"message {offset} of {tp.topic}/{vshard}")
            self.poll(100)
        step(None)
        for key in [k for k in self.homes if k[0] == vshard and k[1] < offset]:
            del self.homes[key]
        return self.homes.pop((vshard, offset))

    def take_stages(self) -> list[tuple[int, int, bytes]]:
        taken, self.stages = self.stages, []
        return taken

    def _check_kept(self, tp, offset: int) -> None:
        first = self.source.consumer.beginning_offsets([tp])[tp]
        if first > offset:
            raise IndexUnusableError(f"{tp.topic}/{tp.partition} no longer holds offset {offset} (it begins at "
                                     f"{first}): the internal topics' retention must keep what the vshards have not "
                                     "committed (deploy/README.md)")

    def exchange_position(self, vshard: int) -> int:
        from kafka import TopicPartition

        return self.source.position(TopicPartition(self.exchange_topic, vshard))

    def order_end(self) -> int:
        return self.source.end_offsets([self.order_tp])[self.order_tp]

    def close(self) -> None:
        self.source.close()


class VShardHost:
    """One connection to the broker for the vshards this process hosts: what they read (``_Inbound``), a producer
    for their messages to others, and one transactional producer for all their outcomes. Which vshards it hosts
    can change between any two steps (the consumer group moves them): one it no longer hosts is dropped with its
    epoch in flight (its new host decides that epoch again), one it is given is opened where its state stands."""

    def __init__(self, config: Config, open_vshard: Callable[[int], _Hosted], fixed: Optional[list[int]], log: Log,
                 stopper: Stopper, step: Callable[[Optional[str]], None], transactional_id: str,
                 members: Optional[_Members] = None):
        """``members``: the process's group member (``_Members``), taken by this session and not closed with it;
        needed unless the vshards are ``fixed`` by number."""
        ensure_internal_topics(config)
        self.config, self.log, self.stopper, self.step = config, log, stopper, step
        self.open_vshard = open_vshard
        self.hosted: dict[int, _Hosted] = {}
        self.waiting: set[int] = set()  # given, but another process holds their state
        self.decided: list[_Hosted] = []  # those whose epoch in flight is decided: committed at the turn's end
        self.unflushed = False  # messages sent to other vshards that the broker may not have yet
        self.committed_any = False  # whether this session has committed an epoch
        self.unsettled = None  # the generation in which the group did not settle before a commit (``_settle_group``)
        self.lost_seen = 0  # the group's drops of this process already logged
        self.rejoined_seen = 0
        self.count = config.shards.count
        self.fingerprint = signing_config(config).fingerprint()
        self.settings = kafka_client_settings(config.kafka, "consumer")
        self.producer_settings = kafka_client_settings(config.kafka, "producer")
        self.group_name = f"{config.kafka.group_id}-vshards"
        # What the outcomes' transactions commit for: the group's generation as this process last followed it
        # (``_follow_assignment``), or the group's bare name for vshards given by number (no generation).
        self.group = self.group_name
        self.inbound = self.publisher = self.membership = self.sink = self.offsets_reader = self.starting_sink = None
        self.fixed = fixed
        self.reading_lock = threading.Lock()
        try:
            if fixed is None:  # first: the process's member (a new one joins on its own thread meanwhile)
                self.membership = members.current()
                self.lost_seen, self.rejoined_seen = self.membership.lost, self.membership.rejoined
            self.starting_sink = Pending(lambda: self._started_sink(transactional_id), "streamdedup-producer")
            self.publisher = exchange_publisher(self.producer_settings)
            # Each flush checks what it waited for: a message the broker never took ends the session before any
            # commit (the other vshards would wait for it in vain); a lasting refusal stops the process.
            self.sent = Deliveries(self.publisher, "a vshard's message to another", SIGNED_MESSAGE_BYTES)
            self.inbound = _Inbound(config, self.settings)
            self.commit = VShardCommit(self.sent, config.shards.evidence_topic, config.worker.kafka_timeout_s)
            self.appender = RecordAppender.of(self.publisher, transactional=False, sent=self.sent)
        except BaseException:
            self.close()
            raise
        self.outcomes = WorkerStats()

    # -- Kafka's side of the outcomes ------------------------------------------------------------------------

    def _started_sink(self, transactional_id: str) -> KafkaSink:
        """The process's transactional producer (0.05 to 0.3 s to start, on a thread while the vshards decide):
        starting, it aborts a transaction its id left open (this process's former session, or a killed process
        that held its host slot, ``host_transactional_id``)."""
        out = self.config.output
        sink = KafkaSink(transaction_producer_settings(self.config), transactional_id,
                         {"clean": out.clean_topic, "duplicates": out.duplicates_topic,
                          "dead_letter": out.dead_letter_topic}, out.dead_letter_max_bytes)
        try:
            sink.learn_topics()
        except BaseException:
            sink.close(0)
            raise
        return sink

    def _sink(self) -> KafkaSink:
        """The transactional producer, once started (``_started_sink``)."""
        if self.sink is None:
            self.sink = self.starting_sink.wait(self.config.worker.kafka_timeout_s, "the vshards' producer to start")
        return self.sink

    def _read_emitted(self, hosted: list[_Hosted]) -> None:
        """Read, on a thread, which order messages have their outcomes in Kafka for each of ``hosted`` (decided
        again without emitting): their committed offsets for the vshards' group, on their partitions of the
        exchange topic. Read with read_committed, the broker answers once no transaction that may commit them is
        open (a former host's, aborted at its timeout at the latest); read again whenever the generation
        changes, since another generation may have committed them meanwhile."""
        if hosted:
            pending = Pending(lambda: self._emitted_before([h.number for h in hosted]), "streamdedup-adopt")
            for h in hosted:
                h.reading = pending

    def _emitted_before(self, numbers: list[int]) -> dict[int, int]:
        from kafka import KafkaConsumer, TopicPartition

        timeout_ms = int(self.config.worker.kafka_timeout_s * 1000)
        with self.reading_lock:
            if self.offsets_reader is None:
                self.offsets_reader = KafkaConsumer(**{**self.settings, "group_id": self.group_name,
                                                       "enable_auto_commit": False,
                                                       "isolation_level": "read_committed"})
            reader = self.offsets_reader
            return {n: reader.committed(TopicPartition(self.config.shards.evidence_topic, n),
                                        timeout_ms=timeout_ms) or 0 for n in numbers}

    def _await_emitted(self, h: _Hosted) -> None:
        """Wait for ``h``'s ``emitted_before`` (``_read_emitted``)."""
        pending = h.reading
        if pending is None:
            return
        h.emitted_before = pending.wait(self.config.worker.kafka_timeout_s,
                                        f"vshard {h.number}'s committed order offset")[h.number]
        h.reading = None

    # -- which vshards ---------------------------------------------------------------------------------------

    def _follow_assignment(self) -> None:
        """Drop the vshards this process no longer hosts, open those it is given; on a new generation of the
        group, read again what Kafka has of the vshards kept."""
        given, group = (set(self.fixed), self.group_name) if self.membership is None else self.membership.assignment
        if self.membership is not None and self.membership.lost > self.lost_seen:
            self.lost_seen = self.membership.lost
            self.log.warning("vshards_group_lost", role="vshards", hosted=",".join(map(str, sorted(self.hosted))),
                             cause="the group stopped hearing from this process for its session timeout",
                             then="its vshards go to the others; it joins again")
        if self.membership is not None and self.membership.rejoined > self.rejoined_seen:
            self.rejoined_seen = self.membership.rejoined
            self.log.warning("vshards_group_rejoined", role="vshards", cause="the Kafka client left a join of the "
                             "group half done", then="it joins again")
        gone = sorted(set(self.hosted) - given)
        new = sorted(given - set(self.hosted))
        for n in gone:
            close_quietly(self.hosted.pop(n))
        if group is not None and group != self.group:
            self.group = group
            self._read_emitted(list(self.hosted.values()))
            if self.membership is not None:
                self.log.info("vshards_group_followed", role="vshards", generation=group.generation_id,
                              member=group.member_id, given=",".join(map(str, sorted(given))) or "none")
        if not gone and not new:
            return
        new = self._adopt(new)
        if not gone and not new:  # every vshard given is still held by another process: nothing moved
            return
        self.inbound.host(self.hosted, new)
        self.log.info("vshards_moved", role="vshards", hosted=",".join(map(str, sorted(self.hosted))) or "none",
                      dropped=",".join(map(str, gone)) or "none", taken=",".join(map(str, new)) or "none")

    def _adopt(self, numbers: list[int]) -> list[int]:
        """Host the vshards ``numbers``; returns those taken. One whose state another process still holds (its
        former host, not yet told it lost it, or paused) is tried again on the next turn of the loop.

        Which of their epochs Kafka has is read on a thread while they decide (``_read_emitted``); their first
        commit waits for it. Deciding needs nothing of it: the outcomes go out only at the commit."""
        opened = {}
        for number in numbers:
            try:
                opened[number] = self.open_vshard(number)
            except IndexLockedError:
                if number not in self.waiting:
                    self.waiting.add(number)
                    self.log.warning("vshard_state_busy", role="vshards", vshard=number,
                                     waiting_for="its former host to let go of its state")
        self._read_emitted(list(opened.values()))
        self.hosted.update(opened)
        self.waiting.difference_update(opened)
        return sorted(opened)

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self, until_caught_up: bool) -> None:
        """Epochs until stopped, or until every hosted vshard has taken the whole order topic."""
        self.publisher.partitions_for(self.config.shards.evidence_topic)
        inbound = self.inbound
        collector = QuietCollector()
        with collector_paused():  # a turn's messages make many small containers: collected between turns
            while not self.stopper.stopped:
                self._follow_assignment()
                started = any([self._start(h) for h in list(self.hosted.values()) if h.flight is None])
                received = self._receive(inbound.take_stages())
                self._flush()
                collector.now_and_then(self._commit_decided())
                if not self.hosted:  # no fetch held at the broker when the first vshards come (``HELD_FETCH_MS``)
                    self.stopper.wait(0.05)
                elif started or received:
                    inbound.poll(0)
                elif not inbound.poll(50) and until_caught_up and self._caught_up():
                    return

    def _caught_up(self) -> bool:
        if not self.hosted or any(h.flight is not None for h in self.hosted.values()):
            return False
        end = self.inbound.order_end()
        return all(h.order_at >= end for h in self.hosted.values())

    def _start(self, h: _Hosted) -> bool:
        """Start ``h``'s next epoch if its order message is in; whether it started one."""
        found = self.inbound.order(h.order_at)
        if found is None:
            return False
        offset, value = found
        order = unpack_order(value)
        epoch = h.vshard.epochs_done
        if isinstance(order, ForgetOrder):
            mine = [doc_id for doc_id, home in zip(order.ids, homes_of([id_key(i) for i in order.ids], self.count)
                                                   .tolist()) if home == h.number] if order.ids else []
            h.flight = _InFlight(epoch, offset, [], [])
            self._send(h.vshard.forget(epoch, mine))
            return True
        if order.fingerprint != self.fingerprint:
            raise IndexUnusableError(f"an epoch was signed with {order.fingerprint}, vshard {h.number} runs with "
                                     f"{self.fingerprint}: give the sign and vshards roles the same [signing], [lsh] "
                                     "and [templates] settings")
        if not order.fresh_after(h.next_input):  # every record of it taken before (signed twice)
            h.order_at = offset + 1
            return True
        records, items, places = self._home_records(h, order)
        span = (h.next_serial, h.next_serial + order.count)
        for topic, partition, _, last in order.ranges:
            h.next_input[(topic, partition)] = max(h.next_input.get((topic, partition), 0), last + 1)
        h.next_serial = span[1]
        serials = [span[0] + p for p in places]
        h.flight = _InFlight(epoch, offset, records, serials)
        self._send(h.vshard.slice(epoch, items, serials, span, order.signed_at))
        return True

    def _home_records(self, h: _Hosted, order: Epoch) -> tuple:
        """This home's records of ``order`` not taken before: whole, decoded (``Home.items``: the home prepares
        them, ``VShard.slice``), and their places in the epoch."""
        at = order.homes.get(h.number)
        if at is None:
            return [], [], []
        home: Home = unpack_home(self.inbound.home(h.number, at, self.stopper, self.step))
        h.records_at = at + 1
        keep = [r.source.offset >= h.next_input.get((r.source.name, r.source.partition), 0) for r in home.records]
        if not all(keep):  # signed twice: the records taken before are left out before decoding
            home.records = [r for r, k in zip(home.records, keep) if k]
            home.places = [p for p, k in zip(home.places, keep) if k]
        return home.records, home.items(), home.places

    def _receive(self, polled: list) -> bool:
        """Deliver what the exchange brought; whether anything came. Every message's offset counts in its
        epoch's floor before any is delivered: a delivery may finish and commit an epoch, and the exchange
        position it commits must not pass a message of a later epoch still to be delivered."""
        messages = [(self.hosted[partition], offset, unpack_message(value)) for partition, offset, value in polled]
        for h, offset, message in messages:
            if message.epoch >= h.vshard.epochs_done:
                h.floors[message.epoch] = min(h.floors.get(message.epoch, offset), offset)
        for h, _, message in messages:
            self._deliver(h, message)
        return bool(polled)

    def _deliver(self, h: _Hosted, message: Message) -> None:
        self._send(h.vshard.receive(message))
        flight = h.flight
        if flight is not None and h.vshard.epochs_done > flight.number and h not in self.decided:
            self.decided.append(h)

    def _send(self, messages: list[Message]) -> None:
        """Messages to other vshards through their exchange partitions (flushed once a turn of the loop has
        sent all it sends, ``_flush``); to itself, at once."""
        own = []
        for message in messages:
            if message.to == message.sender:
                own.append(message)
            else:
                self._publish(message)
                self.unflushed = True
        for message in own:
            self._deliver(self.hosted[message.to], message)

    def _publish(self, message: Message) -> None:
        topic, value = self.config.shards.evidence_topic, pack_message(message)
        if self.appender is None or not self.appender.append(topic, message.to, None, value, []):
            self.sent.add(self.publisher.send(topic, partition=message.to, value=value))

    def _flush(self) -> None:
        """Wait until the broker has every message sent (the other vshards wait for them); one it did not take
        raises (``Deliveries.flush``)."""
        if self.unflushed:
            if self.appender is not None:
                self.appender.done()
            self.sent.flush(timeout=self.config.worker.kafka_timeout_s)
            self.unflushed = False
            reached("vshard-sent")  # a crash here: the messages are decided again after the restart, the same

    def _commit_decided(self) -> bool:
        """The epochs decided in this turn of the loop: their outcomes out and their states committed, together
        (``checkpoint.VShardCommit``: one wait for each step, not one for each vshard); whether there were any.

        The group is looked at again first (``_follow_assignment``): a process that joined since the turn began
        moved its generation, under which alone the broker takes the commit. A vshard given away is dropped with
        its epoch; the others commit under the new generation once Kafka's record of their epochs is read again
        (``_await_emitted``). A move between this look and the broker's check still refuses the commit
        (``GroupMovedError``: nothing of it committed anywhere, the next session starts at once)."""
        if not self.decided:
            return False
        reached("vshard-decided")  # nothing of the epochs out yet: a crash here decides them again, the same
        self._settle_group()
        self._follow_assignment()
        done, self.decided = [h for h in self.decided if self.hosted.get(h.number) is h], []
        if not done:
            return False
        for h in done:
            self._await_emitted(h)
        flights = [h.flight for h in done]
        epochs = [self._decided_epoch(h) for h in done]
        decided = time.monotonic()
        try:
            self.commit.commit(epochs, self._sink() if any(e.emits for e in epochs) else None, self.group)
        except GroupMovedError as exc:
            exc.session_committed = self.committed_any
            raise
        self.committed_any = True
        for h, flight, epoch in zip(done, flights, epochs):
            self.log.debug("epoch_committed", vshard=h.number, epoch=flight.number, records=len(flight.records),
                           decided_s=round(decided - flight.began, 3), commit_s=round(time.monotonic() - decided, 3),
                           together=len(done))
            self.outcomes.summary.add(epoch.decisions)
        self.inbound.drop_orders_before(min(x.order_at for x in self.hosted.values()))
        return True

    def _settle_group(self) -> None:
        """Wait while the group moves this process to a new generation (``GROUP_SETTLE_S`` at most, once a
        generation), so that the commit goes under the generation the broker checks it against."""
        membership = self.membership
        if membership is None or self.unsettled == self.group or not membership.moving():
            return
        began = time.monotonic()
        while membership.moving():
            if time.monotonic() - began > GROUP_SETTLE_S:
                self.unsettled = self.group
                break
            self.stopper.wait(0.005)
        self.log.debug("vshards_group_settled", waited_s=round(time.monotonic() - began, 3),
                       settled=self.unsettled != self.group)

    def _decided_epoch(self, h: _Hosted) -> VShardEpoch:
        """``h``'s epoch in flight, decided, as it commits; ``h`` moved past it. Its outcomes go out unless Kafka has
        them already (decided again after a crash: ``emitted_before``)."""
        flight = h.flight
        h.order_at = flight.offset + 1
        h.flight = None
        h.exchange_at = self._exchange_floor(h, flight.number)
        return VShardEpoch(h.vshard, flight.offset, flight.records, flight.serials, h.vshard.decided.pop(flight.number),
                           h.positions(), flight.offset >= h.emitted_before)

    def _exchange_floor(self, h: _Hosted, epoch: int) -> int:
        """Where a restart reads ``h``'s exchange partition from once ``epoch`` is committed: the first message
        read of a later epoch, or polled but not taken yet (``home`` polls while an epoch starts), or what
        comes next."""
        for done in [e for e in h.floors if e <= epoch]:
            del h.floors[done]
        unread = [offset for partition, offset, _ in self.inbound.stages if partition == h.number]
        return min([*h.floors.values(), *unread], default=self.inbound.exchange_position(h.number))

    def close(self) -> None:
        """Close what the session opened; the group member stays the process's (``_Members``)."""
        close_quietly(*self.hosted.values(), self.inbound)
        if self.sink is not None:
            self.sink.close()
        elif self.starting_sink is not None:
            self.starting_sink.discard(lambda sink: sink.close(0))
        if self.offsets_reader is not None:  # not under ``reading_lock``: a read may be stuck on a lost broker
            close_quietly(self.offsets_reader)
        if self.publisher is not None:
            try:
                self.publisher.close(timeout=5)
            except Exception:
                pass


def host_slot(state: Optional[str]):
    """This process's host slot: the lowest ``host-K.lock`` of the states' folder ``state`` that no running process
    holds, as (K, the open lock file; closing it or dying releases it), or (None, None) without ``state``."""
    if not state:
        return None, None
    os.makedirs(state, exist_ok=True)
    slot = 0
    while True:
        handle = open(os.path.join(state, f"host-{slot}.lock"), "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, handle
        except OSError:
            handle.close()
            slot += 1


def host_transactional_id(config: Config, slot: Optional[int], numbers: Optional[list[int]]) -> str:
    """The transactional id of a vshards process's producer. It need not fence a former host of a vshard (the
    group's generation does, ``checkpoint.VShardCommit``), but a process started again should take its
    predecessor's, whose init aborts the transaction a killed process left open; until aborted, that
    transaction keeps a vshard's new host from reading its committed offset (read_committed) up to the
    transaction timeout. So: the vshards given by number (one process a set), else the host slot in the states'
    folder (a process started again takes the slot freed by the one killed), else one of its own."""
    base = config.worker.transactional_id or f"streamdedup-{config.kafka.group_id}"
    if numbers:
        return f"{base}-vshards-{'-'.join(map(str, numbers))}"
    return f"{base}-vshards-host-{slot if slot is not None else uuid.uuid4().hex}"


def run_vshards(config: Config, state: Optional[str], numbers: Optional[list[int]], until_caught_up: bool, log: Log,
                stopper: Optional[Stopper] = None) -> WorkerStats:
    """The ``run --role vshards`` command: host the vshards the consumer group gives this process (or ``numbers``
    of the ``shards.count``) until stopped (or caught up). Each vshard's state is its folder ``vshard-N`` in
    ``state``, which every process that may host it reaches (without ``state``: in memory, so a vshard given
    to a process is decided again from the topics' beginning, emitting nothing Kafka has)."""
    check_supported(config)
    keep_freed_memory()  # home messages and their fetches are megabytes each (``memory.keep_freed_memory``)
    stopper = stopper or Stopper()
    telemetry = WorkerTelemetry(None, config.metrics.address if config.metrics.enabled else None)
    telemetry.start()
    log.info("started", role="vshards", vshards=",".join(map(str, numbers)) if numbers else "from the group",
             count=config.shards.count, order_topic=config.shards.signed_topic,
             bootstrap=config.kafka.bootstrap_servers)
    settings = DedupSettings.of(config, signing_config(config))
    loop = SessionLoop(config, log, stopper, telemetry, role="vshards")
    stats = WorkerStats()
    began = time.monotonic()
    slot, slot_lock = host_slot(state) if numbers is None else (None, None)
    transactional_id = host_transactional_id(config, slot, numbers)
    members = _Members(config, kafka_client_settings(config.kafka, "consumer"))

    def opened(number: int) -> _Hosted:
        path = os.path.join(state, f"vshard-{number}") if state else None
        vshard = VShard(number, config.shards.count, settings, path=path)
        try:
            return hosted_at(vshard, vshard.meta())
        except BaseException:
            vshard.close()
            raise

    def session(connected: Callable[..., None]) -> WorkerStats:
        host = VShardHost(config, opened, numbers, log, stopper, loop.watchdog.phase, transactional_id, members)
        try:
            connected()
            host.run(until_caught_up)
            return host.outcomes
        finally:
            host.close()

    try:
        found = loop.run(session, until_done=until_caught_up)
        if found is not None:
            stats = found
    finally:
        members.close()  # after the last session released the vshards' states: their next hosts open them at once
        loop.close()
        if slot_lock is not None:
            slot_lock.close()
        telemetry.stopping = True
        telemetry.stop()
    stats.summary.seconds = time.monotonic() - began
    return stats
