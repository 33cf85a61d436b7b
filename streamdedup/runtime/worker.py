"""The long-lived Kafka worker and the backfill run: poll -> decide -> commit, in a flat loop.

A *session* is one connection to the broker: a consumer that owns every
input partition and a transactional producer. When the broker goes away the
session is dropped, the worker waits with backoff, and a new session starts
with the recovery of ``checkpoint.KafkaCommit`` (which also covers a batch
whose Kafka commit may or may not have happened). The commit protocol itself
is in ``checkpoint.py``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from ..config import Config, kafka_client_settings, transaction_producer_settings
from ..core.decode import InputSpec, text_limit_for_output
from ..core.records import canonical_order
from ..engine.engine import Engine
from ..errors import BrokerUnavailableError, kafka_trouble
from ..ops.logs import Log
from ..ops.progress import Progress
from ..ops.summary import Summary
from ..ops.telemetry import WorkerTelemetry
from .access import check_access
from .checkpoint import WORKER_POSITIONS, KafkaCommit, start_plan
from .feed import InlineFeed, KafkaReader, ProcessFeed, kafka_reading, spawn_feed
from .rights import Rights, check_topics
from .sessions import SessionLoop, Stopper, WorkerStats, close_quietly
from .sink import KafkaSink, Pending
from .sink.admin import create_output_topics
from .sink.messages import kept_record_bytes

__all__ = ["Stopper", "run_worker", "run_backfill", "WorkerStats"]

LAG_CHECK_S = 5.0  # how often a busy worker asks the broker for end offsets (an idle one: at every empty poll)
ACCESS_CHECK_S = 10.0  # longest wait for each step of the connection and login check at the start of a session


class Session:
    """One connection to the broker: consumer, producer, recovery, then the batch loop."""

    def __init__(self, engine: Engine, config: Config, log: Log, topics: list[str], group_id: str,
                 transactional_id: Optional[str], prefix: str, spawned: Optional[ProcessFeed] = None,
                 step: Callable[[Optional[str]], None] = lambda name: None):
        """``spawned``: a feed process started earlier for these topics and group, which this session takes over.

        ``step`` is told each step of a long recovery (``Watchdog.phase``), so progress is seen as progress.
        """
        self.step = step
        self.engine = engine
        self.config = config
        self.log = log
        settings = kafka_client_settings(config.kafka, "consumer")
        check_access(settings, ACCESS_CHECK_S)
        reading = kafka_reading(config, topics, group_id)
        spec = InputSpec.from_section(config.input)
        self._process_feed = None
        if config.worker.prepare_processes:
            self._process_feed = spawned or spawn_feed(config, topics, group_id, engine.signing)
        self.feed = None
        self.source = self.sink = None
        making_sink = None
        try:
            if transactional_id is not None and config.output.create_topics:
                self._create_output_topics(topics)
            check_topics(settings, session_rights(config, topics, group_id, transactional_id))
            if transactional_id is not None:
                making_sink = self._start_sink(transactional_id)
            self.source = reading.source()
            if making_sink is not None:
                self.sink, making_sink = making_sink.wait(), None
                Pending(self.sink.learn_topics, "streamdedup-metadata")  # meanwhile; the first send waits if need be
        except BaseException:
            if making_sink is not None:
                making_sink.discard(KafkaSink.close)
            self.close()
            raise
        checked = output_spec(spec, self.sink)
        if checked.max_text_bytes < spec.max_text_bytes:
            self.log.info("text_limit_from_output", max_text_bytes=checked.max_text_bytes,
                          configured=spec.max_text_bytes, clean_max_message_bytes=self.sink.limit("clean"))
        self.commit = KafkaCommit(engine, checked, self.sink, group_id, prefix, config.worker.kafka_timeout_s)
        self.partitions: list = []

    def _start_sink(self, transactional_id: str) -> Pending:
        """The transactional producer, made on a thread: its ``init_transactions`` overlaps the consumer's start."""
        out = self.config.output
        settings = transaction_producer_settings(self.config)
        topics = {"clean": out.clean_topic, "duplicates": out.duplicates_topic, "dead_letter": out.dead_letter_topic}
        return Pending(lambda: KafkaSink(settings, transactional_id, topics, out.dead_letter_max_bytes),
                       "streamdedup-producer-start")

    def _create_output_topics(self, topics: list[str]) -> None:
        """``output.create_topics``: make the missing output topics before the producer looks them up."""
        out = self.config.output
        created, partitions = create_output_topics(
            kafka_client_settings(self.config.kafka, "admin"), topics,
            [out.clean_topic, out.duplicates_topic, out.dead_letter_topic], out.replication_factor)
        if created:
            self.log.info("created_topics", topics=",".join(created), partitions=partitions,
                          replication_factor=out.replication_factor)

    def recover(self, start: Optional[dict] = None) -> dict:
        """Assign every partition, replay a batch emitted but not indexed, seek; returns the start offsets."""
        self.partitions = self.source.partitions()
        self.source.assign(self.partitions)
        stored = self.commit.stored_positions(self.partitions)
        timeout_s = self.config.worker.kafka_timeout_s
        committed = {p: self.source.committed(p, timeout_s) for p in self.partitions} if self.sink else {}
        beginnings = self.source.consumer.beginning_offsets(self.partitions)
        plan = start_plan(stored, committed, beginnings, self.sink is not None, self.commit.group_id)
        for event, fields in plan.warnings:
            self.log.warning(event, **fields)
        if plan.fresh:
            self.commit.set_positions(plan.fresh)
        if plan.gaps:
            self._replay_gap(plan.gaps)
        starts = plan.starts if start is None else start
        for p, offset in starts.items():
            self.source.seek(p, offset)
        return starts

    def _replay_gap(self, gaps: dict) -> None:
        """Index, without emitting, what Kafka committed but the index did not.

        After a crash that is one batch, replayed whole in the canonical order,
        so the index decides it exactly as when it was emitted. After a restore
        from an older backup the range can be long: it is replayed in batches
        of ``worker.batch_size`` (exactly as decided on a single partition;
        across partitions the batches may group records differently).
        """
        self.source.assign(list(gaps))
        for p, (begin, _) in gaps.items():
            self.source.seek(p, begin)
        limit = {p: end for p, (_, end) in gaps.items()}
        pending: list = []
        replayed, quiet_since = 0, time.monotonic()
        while any(self.source.position(p) < end for p, end in limit.items()):
            polled = self.source.poll_batch(500, limit=limit)
            if polled:
                pending += polled
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 120:
                raise BrokerUnavailableError("no progress reading back records Kafka committed (120 s)")
            if len(pending) >= 2 * self.config.worker.batch_size:
                replayed += self._replay_chunk(pending[: self.config.worker.batch_size])
                pending = pending[self.config.worker.batch_size:]
        while len(pending) > self.config.worker.batch_size:
            replayed += self._replay_chunk(pending[: self.config.worker.batch_size])
            pending = pending[self.config.worker.batch_size:]
        self.commit.commit(canonical_order(pending), emit=False, positions=limit)
        self.log.info("replayed_unindexed_batch", records=replayed + len(pending),
                      partitions=",".join(f"{p.topic}/{p.partition}:{b}-{e}" for p, (b, e) in gaps.items()))
        self.source.assign(self.partitions)

    def _replay_chunk(self, records: list) -> int:
        self.step("replaying records Kafka committed")
        self.commit.commit(canonical_order(records), emit=False)
        return len(records)

    def open_feed(self, starts: dict, limit: Optional[dict] = None):
        """The batches from ``starts`` on (see ``feed``): read in the second process, or in this thread."""
        if self._process_feed is None:
            reader = KafkaReader(self.source, self.config.worker.poll_timeout_ms)
            self.feed = InlineFeed(reader, self.commit.spec, self.engine.signing)
        else:
            self.source.consumer.unsubscribe()  # from here on only the feed's consumer reads
            self.feed = self._process_feed
        self.feed.start((starts, limit), self.engine.signing, self.commit.spec)
        return self.feed

    def lag(self) -> dict:
        """Records not yet decided, per partition: end offsets minus where the feed stands."""
        ends = self.source.end_offsets(self.partitions)
        return {p: max(ends[p] - self.feed.position.get(p, ends[p]), 0) for p in self.partitions}

    def close(self) -> None:
        close_quietly(self._process_feed, self.sink, self.source)


def session_rights(config: Config, topics: list[str], group_id: str, transactional_id: Optional[str]) -> Rights:
    """What a session reads, writes and commits under (outputs only when it emits)."""
    out = config.output
    outputs = [out.clean_topic, out.duplicates_topic, out.dead_letter_topic] if transactional_id else []
    return Rights.of(kafka_client_settings(config.kafka, "consumer"), topics, outputs, group_id, transactional_id)


def output_spec(spec: InputSpec, sink: Optional[KafkaSink]) -> InputSpec:
    """``spec`` with the clean topic's size limit, so a record too large to keep there is rejected, not decided,
    and a text limit the clean topic can hold (``text_limit_for_output``)."""
    if sink is None:
        return spec
    limit = sink.limit("clean")
    return dataclasses.replace(spec, max_output_bytes=limit, kept_bytes=kept_record_bytes,
                               max_text_bytes=text_limit_for_output(spec.max_text_bytes, limit))


class WorkerLoop:
    """Runs sessions until stopped, reconnecting with backoff when the broker goes away (``sessions``)."""

    def __init__(self, engine: Engine, config: Config, log: Log, stopper: Stopper, telemetry: WorkerTelemetry,
                 spawned: Optional[ProcessFeed] = None):
        self.engine = engine
        self.config = config
        self.log = log
        self.stopper = stopper
        self.telemetry = telemetry
        self._spawned = spawned  # for the first session
        self.stats = WorkerStats()
        self._last_summary = time.monotonic()
        self.loop = SessionLoop(config, log, stopper, telemetry)
        self.watchdog = self.loop.watchdog

    def transactional_id(self) -> str:
        return self.config.worker.transactional_id or f"streamdedup-{self.engine.index.meta['index_id'][:16]}"

    def rights(self) -> Rights:
        return session_rights(self.config, self.config.input.topics, self.config.kafka.group_id,
                              self.transactional_id())

    def run(self, until_caught_up: bool = False) -> WorkerStats:
        try:
            self.loop.run(lambda connected: self._session(connected, until_caught_up), until_caught_up,
                          lambda exc: self.rights().explain(exc))
            return self.stats
        finally:
            self.loop.close()

    def _session(self, connected: Callable[..., None], until_caught_up: bool) -> WorkerStats:
        """One session: connect, recover, then batches until caught up (or stopped)."""
        session = self._new_session()
        try:
            starts = session.recover()
            connected(partitions=",".join(f"{p.topic}/{p.partition}" for p in session.partitions))
            self._batches(session, starts, until_caught_up)
            return self.stats
        finally:
            session.close()

    def _new_session(self) -> "Session":
        spawned, self._spawned = self._spawned, None
        return Session(self.engine, self.config, self.log, self.config.input.topics, self.config.kafka.group_id,
                       self.transactional_id(), WORKER_POSITIONS, spawned, self.watchdog.phase)

    def _batches(self, session: Session, starts: dict, until_caught_up: bool) -> None:
        """Decide and commit batch after batch; the feed reads and prepares the next ones meanwhile."""
        feed = session.open_feed(starts)
        last_lag_check = 0.0
        watchdog = self.watchdog
        while not self.stopper.stopped:
            self.engine.between_batches()
            watchdog.phase("records from the input topics")
            batch = feed.next(self.config.worker.poll_timeout_ms)
            if batch is not None:
                began = time.monotonic()
                watchdog.phase("the batch's Kafka transaction")
                decisions = session.commit.commit(batch.records, batch.prepared, while_waiting=feed.fetch_ahead)
                self._after_batch(decisions, time.monotonic() - began)
            now = time.monotonic()
            quiet = batch is None or batch.at_end  # maybe caught up: ask for the end offsets
            if quiet or now - last_lag_check > LAG_CHECK_S:
                last_lag_check = now
                watchdog.phase("end offsets of the input topics")
                self.stats.lag = session.lag()
                self.telemetry.set_lag(self.stats.lag)
                self.telemetry.refresh_index()
                self.stats.caught_up = quiet and not any(self.stats.lag.values())
                if until_caught_up and self.stats.caught_up:
                    watchdog.phase(None)
                    self.log.info("caught_up", documents=self.stats.summary.total)
                    return
            watchdog.phase(None)
        self.telemetry.stopping = True
        self.log.info("stopping", reason="signal")

    def _after_batch(self, decisions: list, seconds: float) -> None:
        self.telemetry.batch_done(decisions, seconds)
        self.telemetry.refresh_index()
        stats = self.stats
        stats.summary.add(decisions)
        stats.batches += 1
        stats.last_commit = time.time()
        interval = self.config.log.summary_interval_s
        if time.monotonic() - self._last_summary >= interval:
            self._last_summary = time.monotonic()
            s = stats.summary
            self.log.info("batch", records=len(decisions), seconds=round(seconds, 3), total=s.total,
                          kept=s.outcomes["kept"], duplicate=s.outcomes["duplicate"],
                          rejected=s.outcomes["rejected"], replayed=s.replayed)


def run_worker(config: Config, state: Optional[str], until_caught_up: bool, log: Log,
               stopper: Optional[Stopper] = None, spawned: Optional[ProcessFeed] = None) -> WorkerStats:
    """The ``run`` command: live deduplication until stopped (or caught up).

    ``spawned``: the feed process, if the caller started it already (``feed.spawn_feed``); the first
    session takes it over, and the caller still closes it (closing twice does nothing).
    """
    stopper = stopper or Stopper()
    with Engine(config, state) as engine:
        telemetry = WorkerTelemetry(engine.index, config.metrics.address if config.metrics.enabled else None)
        telemetry.refresh_index()
        telemetry.start()
        log.info("started", index=engine.index.path, fingerprint=engine.signing.fingerprint(),
                 topics=",".join(config.input.topics), bootstrap=config.kafka.bootstrap_servers,
                 metrics=telemetry.url() or "off")
        began = time.monotonic()
        try:
            stats = WorkerLoop(engine, config, log, stopper, telemetry, spawned).run(until_caught_up)
        finally:
            telemetry.stop()
        stats.summary.seconds = time.monotonic() - began
        return stats


def run_backfill(config: Config, state: Optional[str], topic: str, from_timestamp_ms: Optional[int],
                 index_only: bool, log: Log, stopper: Optional[Stopper] = None,
                 progress_enabled: Optional[bool] = None) -> Summary:
    """Replay ``topic`` into the index up to the end offsets seen at start, then stop."""
    stopper = stopper or Stopper()
    with Engine(config, state) as engine:
        index_id = engine.index.meta["index_id"][:16]
        group = f"{config.kafka.group_id}.backfill.{index_id}"
        txid = None if index_only else f"streamdedup-{index_id}.backfill"
        rights = session_rights(config, [topic], group, txid)
        try:
            session = Session(engine, config, log, [topic], group, txid, f"backfill:{group}")
        except Exception as exc:
            _raise_if_refused(rights, exc)
            raise
        try:
            partitions = session.source.partitions()
            session.source.assign(partitions)
            if from_timestamp_ms is None:
                first = session.source.consumer.beginning_offsets(partitions)
            else:
                first = session.source.offsets_for_time(partitions, from_timestamp_ms)
            ends = session.source.end_offsets(partitions)
            starts = session.recover(start=first)
            return _backfill_batches(session, starts, first, ends, index_only, log, stopper, progress_enabled)
        except Exception as exc:
            _raise_if_refused(rights, exc)
            raise
        finally:
            session.close()


def _raise_if_refused(rights: Rights, exc: Exception) -> None:
    """Raise what to do if ``exc`` is a missing right or another error that waiting cannot cure."""
    explained = rights.explain(exc)
    if explained is None:
        trouble = kafka_trouble(exc)
        explained = trouble if trouble is not None and not trouble.retriable and trouble is not exc else None
    if explained is not None:
        raise explained from None


def _backfill_batches(session: Session, starts: dict, first: dict, ends: dict, index_only: bool, log: Log,
                      stopper: Stopper, progress_enabled: Optional[bool]) -> Summary:
    total = sum(max(ends[p] - first[p], 0) for p in ends)
    progress = Progress(total, "records", enabled=progress_enabled)
    summary = Summary()
    began = time.monotonic()
    log.info("backfill_started", topic=session.source.topics[0], records=total, index_only=index_only)
    feed = session.open_feed(starts, limit=ends)
    try:
        while not stopper.stopped and any(feed.position[p] < ends[p] for p in ends):
            session.engine.between_batches()
            batch = feed.next(500)
            if batch is not None:
                summary.add(session.commit.commit(batch.records, batch.prepared, emit=not index_only,
                                                  while_waiting=feed.fetch_ahead))
            done = sum(min(feed.position[p], ends[p]) - first[p] for p in ends)
            progress.update(len(batch.records) if batch is not None else 0, done)
    finally:
        progress.close()
    summary.seconds = time.monotonic() - began
    return summary
