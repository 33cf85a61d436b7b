"""The commit protocols step by step, in this process: the worker's (``checkpoint.KafkaCommit``) against an
in-memory Kafka, and the offline run's (``checkpoint.FileRun``) dying at each step.

The sink below is the real ``KafkaSink`` (its messages, their topics and
headers) with the broker calls replaced by an in-memory transaction log
that records every step and shows only committed transactions to readers,
as ``read_committed`` consumers see them. The index is a real LMDB folder.
Failing each step, and the narrow window after the Kafka commit and before
the index commit, must each end as an uninterrupted run: the same index,
exactly one outcome per record. The same protocol against a real broker and
real kills is in ``test_exactly_once.py``.
"""

from __future__ import annotations

import json

import pytest
from conftest import index_snapshot
from kafka import TopicPartition

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.decode import InputSpec
from streamdedup.core.records import RawRecord, Source
from streamdedup.engine.engine import Engine
from streamdedup.runtime.checkpoint import WORKER_POSITIONS, KafkaCommit, start_plan
from streamdedup.runtime.sink import KafkaSink

RAW = "raw"
PARTITION = TopicPartition(RAW, 0)
GROUP = "dedup"
TOPICS = {"clean": "clean", "duplicates": "duplicates", "dead_letter": "dead"}


class Crash(Exception):
    """The process dies here: nothing after this step happens."""


class MemoryKafka:
    """Topics and group offsets as read_committed readers see them, and every step the sink took."""

    def __init__(self):
        self.topics: dict[str, list[dict]] = {}
        self.offsets: dict = {}
        self.steps: list[str] = []


class RecordingSink(KafkaSink):
    """``KafkaSink`` over ``MemoryKafka``; ``crash_at`` names the step that fails (after it happened, for
    "commit": the transaction is committed, then the process dies)."""

    def __init__(self, kafka: MemoryKafka, crash_at: str = "", on_commit=lambda: None):
        self.topics, self.limits, self.dead_letter_max_bytes = TOPICS, {}, 1000
        self.kafka, self.crash_at, self.on_commit = kafka, crash_at, on_commit
        self._open = None

    def _step(self, name: str) -> None:
        self.kafka.steps.append(name)
        if name == self.crash_at and name != "commit":
            raise Crash(name)

    def begin(self):
        self._step("begin")
        self._open = {"messages": [], "offsets": {}}

    def send_offsets(self, offsets, group_id):
        assert group_id == GROUP
        self._step("offsets")
        self._open["offsets"].update(offsets)
        return Done()

    def send(self, messages):
        self._step("send")
        self._open["messages"] += messages

    def commit(self, timeout_s):
        self.on_commit()
        self._step("commit")
        for topic, message in self._open["messages"]:
            self.kafka.topics.setdefault(topic, []).append(message)
        self.kafka.offsets.update(self._open["offsets"])
        self._open = None
        if self.crash_at == "commit":
            raise Crash("after the Kafka commit, before the index commit")

    def abort(self):
        self._step("abort")
        self._open = None

    def transaction_error(self):
        return None


class Done:
    def wait(self, *args):
        return None


def _records(count=400):
    docs = corpus.generate(count // 2 + 30, seed=13)[:count]
    return [RawRecord(json.dumps({"id": d.id, "text": d.text}).encode(), Source(RAW, 0, n), d.id.encode())
            for n, d in enumerate(docs)]


def _batches(records, size=50):
    return [records[i:i + size] for i in range(0, len(records), size)]


def _engine(path):
    return Engine(config_module.load(None, (), environ={}), str(path))


def _commit(engine, sink):
    return KafkaCommit(engine, InputSpec(), sink, GROUP, WORKER_POSITIONS)


def _start(commit: KafkaCommit, kafka: "MemoryKafka"):
    """A session's start (``worker.Session.recover``): the plan from the index and the group's offsets, the
    positions of a partition never read recorded before its first batch."""
    plan = start_plan(commit.stored_positions([PARTITION]), dict(kafka.offsets), {PARTITION: 0}, True, GROUP)
    if plan.fresh:
        commit.set_positions(plan.fresh)
    return plan


def _state(engine) -> tuple:
    """What the index holds: its records, input positions and counters."""
    with engine.index.read() as txn:
        return ([(r.serial, r.id, r.kept, r.cluster, r.similarity) for r in txn.records()], txn.positions(),
                dict(txn.counters))


def _outcomes(kafka: MemoryKafka) -> dict:
    """Input offset -> the topics its outcomes went to (every outcome carries its source header)."""
    found: dict = {}
    for topic, messages in kafka.topics.items():
        for message in messages:
            source = dict(message["headers"])["streamdedup.source"].decode()
            found.setdefault(int(source.rsplit("/", 1)[1]), []).append(topic)
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    kafka = MemoryKafka()
    records = _records()
    with _engine(folder) as engine:
        commit = _commit(engine, RecordingSink(kafka))
        _start(commit, kafka)
        decisions = [d for batch in _batches(records) for d in commit.commit(batch)]
    return {"index": index_snapshot(folder), "outcomes": _outcomes(kafka), "decisions": decisions,
            "records": records, "steps": kafka.steps}


def test_each_batch_is_one_kafka_transaction_committed_before_the_index(tmp_path, uninterrupted):
    """begin, offsets, send, commit, once a batch; at the Kafka commit the index does not have the batch yet."""
    kafka = MemoryKafka()
    batches = _batches(uninterrupted["records"])
    with _engine(tmp_path) as engine:
        seen = []

        def stored_now():
            with engine.index.read() as txn:
                seen.append(txn.position(f"{WORKER_POSITIONS}:{RAW}:0"))

        commit = _commit(engine, RecordingSink(kafka, on_commit=stored_now))
        _start(commit, kafka)
        for batch in batches:
            commit.commit(batch)
    assert kafka.steps == ["begin", "offsets", "send", "commit"] * len(batches)
    assert seen == [0] + [batch[-1].source.offset + 1 for batch in batches[:-1]]  # the batch before, not this one
    assert kafka.offsets == {TopicPartition(RAW, 0): len(uninterrupted["records"])}
    assert _outcomes(kafka) == uninterrupted["outcomes"]
    assert sorted(_outcomes(kafka)) == list(range(len(uninterrupted["records"])))
    assert all(len(topics) == 1 for topics in _outcomes(kafka).values())


@pytest.mark.parametrize("step", ["begin", "offsets", "send"])
def test_a_kafka_step_that_fails_leaves_both_sides_as_before_and_the_batch_is_decided_again(tmp_path, uninterrupted,
                                                                                              step):
    kafka = MemoryKafka()
    batches = _batches(uninterrupted["records"])
    with _engine(tmp_path) as engine:
        commit = _commit(engine, RecordingSink(kafka))
        _start(commit, kafka)
        commit.commit(batches[0])
        before = _state(engine)
        with pytest.raises(Crash):
            _commit(engine, RecordingSink(kafka, crash_at=step)).commit(batches[1])
        assert _state(engine) == before  # the index transaction was aborted
        assert sorted(_outcomes(kafka)) == list(range(len(batches[0])))  # nothing of the batch is readable
        commit = _commit(engine, RecordingSink(kafka))
        assert not _start(commit, kafka).gaps
        for batch in batches[1:]:
            commit.commit(batch)
    assert index_snapshot(tmp_path) == uninterrupted["index"]
    assert _outcomes(kafka) == uninterrupted["outcomes"]


@pytest.mark.parametrize("at", [0, 3, 7])
def test_after_the_kafka_commit_and_before_the_index_commit_the_restart_replays_the_batch_without_emitting(
        tmp_path, uninterrupted, at):
    """The narrow window: Kafka has the outcomes and the group's offsets, the index has neither. At start the
    index is behind the group by exactly that batch (``start_plan``): it is decided again into the index, the
    same decisions, and nothing is emitted twice."""
    kafka = MemoryKafka()
    records = uninterrupted["records"]
    batches = _batches(records)
    with _engine(tmp_path) as engine:
        commit = _commit(engine, RecordingSink(kafka))
        _start(commit, kafka)
        for batch in batches[:at]:
            commit.commit(batch)
        with pytest.raises(Crash):
            _commit(engine, RecordingSink(kafka, crash_at="commit")).commit(batches[at])
    with _engine(tmp_path) as engine:  # the restarted worker
        commit = _commit(engine, RecordingSink(kafka))
        plan = _start(commit, kafka)
        assert plan.gaps == {PARTITION: (batches[at][0].source.offset, batches[at][-1].source.offset + 1)}
        steps = len(kafka.steps)
        start, end = plan.gaps[PARTITION]
        replayed = commit.commit([r for r in records if start <= r.source.offset < end], emit=False,
                                 positions={PARTITION: end})
        assert len(kafka.steps) == steps  # the replay touched nothing in Kafka
        assert replayed == uninterrupted["decisions"][start:end]
        for batch in batches[at + 1:]:
            commit.commit(batch)
    assert index_snapshot(tmp_path) == uninterrupted["index"]
    assert _outcomes(kafka) == uninterrupted["outcomes"]


# -- the offline protocol (``checkpoint.FileRun``): a crash at each step, in this process ---------------------


def _offline(folder, source, crash_at: str = "", monkeypatch=None):
    """``dedup_files`` over ``source`` into ``folder`` (batches of 60, read here); with ``crash_at``, the run
    dies the third time that step is reached (``checkpoint.reached`` raises instead of exiting)."""
    from streamdedup.runtime import checkpoint
    from streamdedup.runtime.offline import dedup_files

    if crash_at:
        seen = []

        def reached(step):
            seen.append(step)
            if step == crash_at and seen.count(step) == 3:
                raise Crash(step)

        monkeypatch.setattr(checkpoint, "reached", reached)
    with _engine(folder / "state") as engine:
        try:
            dedup_files(engine, [str(source)], InputSpec(), str(folder / "clean.jsonl"),
                        str(folder / "decisions.jsonl"), batch_size=60)
        finally:
            if crash_at:
                monkeypatch.undo()


@pytest.mark.parametrize("step", ["file-decided", "file-written", "file-committed"])
def test_an_offline_run_dying_at_each_step_resumes_into_an_uninterrupted_runs_outputs(tmp_path, monkeypatch, step):
    """Once the batch is decided its lines are being appended (step 2 begins as the decisions are made, and a
    failure waits for it to end); after step 2 the outputs hold the batch but the index does not (the resume cuts
    them back); after step 3 both have it."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(r.value + b"\n" for r in _records(300)))
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    reference.mkdir(), crashed.mkdir()
    _offline(reference, source)
    with pytest.raises(Crash):
        _offline(crashed, source, step, monkeypatch)
    decided = (crashed / "decisions.jsonl").read_bytes().count(b"\n")
    assert decided == {"file-decided": 180, "file-written": 180, "file-committed": 180}[step]
    _offline(crashed, source)  # the same command again resumes
    for name in ("clean.jsonl", "decisions.jsonl"):
        assert (crashed / name).read_bytes() == (reference / name).read_bytes(), name
    assert index_snapshot(crashed / "state")["records"] == index_snapshot(reference / "state")["records"]



def test_an_offline_batchs_lines_are_appended_while_its_documents_are_written(tmp_path, monkeypatch):
    """Step 2 begins as soon as a batch is decided: its lines reach the decisions file while its documents are
    written into the index transaction (the writes here wait for them, up to 2 s), and the run ends as an
    uninterrupted one's."""
    import time

    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(r.value + b"\n" for r in _records(300)))
    reference, overlapped = tmp_path / "reference", tmp_path / "overlapped"
    reference.mkdir(), overlapped.mkdir()
    _offline(reference, source)
    decisions, lines_found = overlapped / "decisions.jsonl", []
    write_own = Engine._write_own

    def lines() -> int:
        return decisions.read_bytes().count(b"\n") if decisions.exists() else 0

    def written_once_the_lines_are_there(self, txn, batch, together, lookup_keys):
        for _ in range(200):
            if lines() >= 60 * (len(lines_found) + 1):
                break
            time.sleep(0.01)
        lines_found.append(lines())
        return write_own(self, txn, batch, together, lookup_keys)

    monkeypatch.setattr(Engine, "_write_own", written_once_the_lines_are_there)
    _offline(overlapped, source)
    monkeypatch.undo()
    assert lines_found == [60, 120, 180, 240, 300]
    for name in ("clean.jsonl", "decisions.jsonl"):
        assert (overlapped / name).read_bytes() == (reference / name).read_bytes(), name
