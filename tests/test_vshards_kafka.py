"""A deployment whose band tables are split by key, on the real broker: signing processes and processes hosting
virtual shards decide as one worker does, once each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from kafka_helpers import (
    Topics,
    create_topics,
    header,
    outcome_summary,
    outcomes,
    produce,
    read_all,
    run_worker,
    role_command,
    sharded_records,
    sharded_topics,
    single_worker_run,
    single_worker_summary,
    stop_processes,
    vshard_decisions,
    wait_for_outcomes,
)

pytestmark = pytest.mark.kafka

KEYS = ["--set", "templates.enabled=false", "--set", 'lsh.cap="probes"']


def vshard_processes(topics, kafka, count: int, tag: str, hosts: list[str], state, *extra: str) -> list:
    """Processes hosting the vshards ``hosts`` names (one list a process), their states in the folder ``state``."""
    return [subprocess.Popen(role_command(topics, kafka, count, tag, "--role", "vshards", "--vshards", hosted,
                                          "--state", str(state), *KEYS, *extra),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for hosted in hosts]


def signers(topics, kafka, count: int, tag: str, n: int, *extra: str) -> list:
    return [subprocess.Popen(role_command(topics, kafka, count, tag, "--role", "sign", "--until-idle", "8",
                                          *KEYS, *extra),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(n)]

def settled(kafka, topics, expected: int, processes) -> dict:
    """Every outcome, read again a moment after ``expected`` are out (a second outcome of a record would show by
    then)."""
    wait_for_outcomes(kafka, topics, expected, processes)
    time.sleep(2)
    return outcomes(kafka, topics)


@pytest.mark.parametrize("count,hosts", [(1, ["0"]), (4, ["0-1", "2-3"]), (8, ["0,3,6", "1,4,7", "2,5"])],
                         ids=["1-in-1", "4-in-2", "8-in-3"])
def test_vshards_on_the_broker_decide_as_one_worker(kafka, tmp_path, count, hosts):
    records = sharded_records()
    expected = single_worker_summary(records, KEYS)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    produce(kafka, topics.raw, records)
    tag = uuid.uuid4().hex[:8]
    processes = vshard_processes(topics, kafka, count, tag, hosts, tmp_path)
    processes += signers(topics, kafka, count, tag, 2, "--set", "shards.epoch_records=97")
    try:
        found = settled(kafka, topics, len(expected), processes)
    finally:
        stop_processes(processes)
    assert outcome_summary(found) == expected
    places = {where: tuple(map(int, header(outs[0][1], "streamdedup.order").split(b"/")))
              for where, outs in found.items()}
    assert sorted(places, key=places.get) == sorted(places)  # one input partition: its order is the decision order


@pytest.mark.parametrize("step", ["vshard-sent:9", "vshard-kafka-committed:3", "vshard-committed:4"])
def test_a_vshards_process_killed_at_any_step_loses_nothing_and_repeats_nothing(kafka, tmp_path, step):
    """Killed (exit 137, as kill -9) between two steps of the protocol, then started again: every record has one
    outcome, the single worker's. The other process waits for it meanwhile."""
    records = sharded_records(articles=160, seed=5)
    expected = single_worker_summary(records, KEYS)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    produce(kafka, topics.raw, records)
    tag = uuid.uuid4().hex[:8]
    steady = vshard_processes(topics, kafka, 4, tag, ["2-3"], tmp_path)
    crashing = subprocess.Popen(role_command(topics, kafka, 4, tag, "--role", "vshards", "--vshards", "0-1",
                                             "--state", str(tmp_path), *KEYS),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=dict(os.environ, STREAMDEDUP_TEST_CRASH_AT=step))
    processes = steady + [crashing] + signers(topics, kafka, 4, tag, 1, "--set", "shards.epoch_records=61")
    try:
        assert crashing.wait(timeout=120) == 137, crashing.stderr.read().decode()[-2000:]
        processes += vshard_processes(topics, kafka, 4, tag, ["0-1"], tmp_path)
        found = settled(kafka, topics, len(expected), [p for p in processes if p is not crashing])
    finally:
        stop_processes(processes)
    assert outcome_summary(found) == expected


def test_the_consumer_group_moves_vshards_as_processes_come_and_go(kafka, tmp_path):
    """No --vshards: the group gives 8 vshards to 2 processes; a third joins in the middle, then one of the first
    two stops (SIGTERM) and another is killed; their vshards move, each decided on from its state in the shared
    folder, and every record has one outcome, the single worker's."""
    records = sharded_records(articles=300, seed=8)
    expected = single_worker_summary(records, KEYS)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    command = role_command(topics, kafka, 8, tag, "--role", "vshards", "--state", str(tmp_path), *KEYS)

    def host() -> subprocess.Popen:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    processes = [host(), host()]
    third = len(records) // 3
    try:
        produce(kafka, topics.raw, records[:third])
        processes += signers(topics, kafka, 8, tag, 1, "--set", "shards.epoch_records=53")
        wait_for_outcomes(kafka, topics, sum(1 for where in expected if where[1] < third) // 2, processes)
        processes.append(host())
        produce(kafka, topics.raw, records[third:2 * third])
        wait_for_outcomes(kafka, topics, sum(1 for where in expected if where[1] < third), processes)
        processes[0].terminate()
        assert processes[0].wait(timeout=60) == 0
        produce(kafka, topics.raw, records[2 * third:])
        processes[1].kill()
        processes[1].wait()
        processes.append(host())
        found = settled(kafka, topics, len(expected), processes[2:])
    finally:
        stop_processes(processes)
    assert outcome_summary(found) == expected


def test_make_demo_sharded_runs_the_sample_crawl_as_one_worker_decides(kafka, tmp_path):
    """``make demo-sharded``: 8 vshards in 2 processes and 2 signers on the broker, every record once, the single
    worker's outcome."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KAFKA_BOOTSTRAP=kafka, DEMO_DIR=str(tmp_path / "demo"), DEMO_TIMEOUT_S="240")
    result = subprocess.run([sys.executable, os.path.join(root, "deploy", "demo_sharded.py")], capture_output=True,
                            timeout=400, env=env)
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "records       1,191" in out and "rejected          1" in out
    assert "same as the single worker (1,191 of 1,191 records)" in out
    assert sorted(os.listdir(tmp_path / "demo" / "logs")) == ["sign-0.log", "sign-1.log", "single.log",
                                                              "vshards-0.log", "vshards-1.log"]
    # the states, and the two processes' host slots (``host.host_slot``)
    assert sorted(os.listdir(tmp_path / "demo" / "vshards")) == ["host-0.lock", "host-1.lock",
                                                                  *(f"vshard-{n}" for n in range(8))]


def test_a_backfill_in_large_epochs_decides_as_streaming_in_small_ones(kafka, tmp_path):
    """A topic replayed through the deployment (signers reading it whole, epochs of thousands of records: what a
    backfill is) gives the outcomes a stream of small epochs gives, the single worker's."""
    records = sharded_records(articles=400, seed=13)
    expected = single_worker_summary(records, KEYS)
    raw = Topics.fresh(kafka).raw
    produce(kafka, raw, records)
    found, sizes = {}, {}
    for name, epochs in (("stream", ["--set", "shards.epoch_records=37"]),
                         ("backfill", ["--set", "shards.epoch_records=80000", "--set", "shards.batch_bytes=16777216"])):
        topics = sharded_topics(kafka, raw)
        tag = uuid.uuid4().hex[:8]
        processes = vshard_processes(topics, kafka, 4, tag, ["0,2", "1,3"], tmp_path / name)
        processes += signers(topics, kafka, 4, tag, 1, *epochs)
        try:
            found[name] = outcome_summary(settled(kafka, topics, len(expected), processes))
        finally:
            stop_processes(processes)
        sizes[name] = epoch_sizes(kafka, f"signed-{tag}")
    assert found["backfill"] == found["stream"] == expected
    # A session's first epoch holds an eighth of shards.epoch_records at most, each next one twice as many, up to it
    # (the vshards start on a small one while the next is signed); the topic was there whole, so they fill up.
    assert [size <= cap for size, cap in zip(sizes["stream"], [4, 8, 16, 32])] == [True] * 4
    assert max(sizes["stream"]) == 37 and max(sizes["backfill"]) <= 2500
    assert sum(sizes["stream"]) == sum(sizes["backfill"]) == len(records)


def epoch_sizes(kafka, order_topic: str) -> list[int]:
    """The records of each epoch of the order topic, in order."""
    from streamdedup.runtime.vshards.messages import Epoch, unpack_order

    epochs = [unpack_order(m.value) for m in read_all(kafka, order_topic)]
    return [e.count for e in epochs if isinstance(e, Epoch)]


def test_forgetting_in_the_middle_of_the_stream_decides_as_one_worker(kafka, tmp_path):
    """``streamdedup forget`` puts its order in the order topic, where every vshard meets it at the same place;
    later copies of forgotten texts are decided as the single worker decides them after ``forget``."""
    records = sharded_records(articles=150, seed=3)
    half = len(records) // 2
    ids = sorted({json.loads(v)["id"] for _, v in records[:half] if v.startswith(b"{")})[:25] + ["nobody"]
    single = Topics.fresh(kafka)
    produce(kafka, single.raw, records[:half])
    assert run_worker(tmp_path / "single", single, kafka, *KEYS).returncode == 0
    subprocess.run([sys.executable, "-m", "streamdedup", "forget", *ids, "--state", str(tmp_path / "single"),
                    *KEYS], check=True, capture_output=True)
    produce(kafka, single.raw, records[half:])
    assert run_worker(tmp_path / "single", single, kafka, *KEYS).returncode == 0
    expected = outcome_summary(outcomes(kafka, single))

    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    hosts = vshard_processes(topics, kafka, 4, tag, ["0-1", "2-3"], tmp_path / "vshards")
    try:
        produce(kafka, topics.raw, records[:half])
        signing = signers(topics, kafka, 4, tag, 1)
        wait_for_outcomes(kafka, topics, sum(1 for where in expected if where[1] < half), hosts + signing)
        assert signing[0].wait(timeout=60) == 0
        signing[0].stderr.close()
        queued = subprocess.run(role_command(topics, kafka, 4, tag, *ids, *KEYS, command="forget"),
                                capture_output=True, timeout=60)
        assert queued.returncode == 0 and b"queued" in queued.stdout, queued.stderr.decode()
        produce(kafka, topics.raw, records[half:])
        signing = signers(topics, kafka, 4, tag, 1)
        got = outcome_summary(settled(kafka, topics, len(expected), hosts + signing))
    finally:
        stop_processes(hosts + signing)
    assert got == expected


def test_a_vshard_restored_from_an_older_backup_decides_its_epochs_again_without_emitting(kafka, tmp_path):
    """Vshard 1's state is backed up a third of the way in; the deployment goes on to the end; then that state is
    replaced by the backup (``restore --replace``). Its host decides the epochs after the backup's positions again
    from the order, records and exchange topics, emitting nothing its group committed: every record still has one
    outcome, the single worker's, and the vshards' states hold what the single worker's index holds."""
    records = sharded_records(articles=180, seed=6)
    expected, held = single_worker_run(records, KEYS)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag, state, third = uuid.uuid4().hex[:8], tmp_path / "vshards", len(records) // 3

    def run(batch: list, wanted: int) -> None:
        produce(kafka, topics.raw, batch)
        processes = vshard_processes(topics, kafka, 4, tag, ["0-1", "2-3"], state)
        processes += signers(topics, kafka, 4, tag, 1, "--set", "shards.epoch_records=59")
        try:
            wait_for_outcomes(kafka, topics, wanted, processes)
        finally:
            stop_processes(processes)

    def command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "streamdedup", *args, "--set", "shards.count=4", *KEYS],
                              capture_output=True, timeout=120)

    run(records[:third], sum(1 for where in expected if where[1] < third))
    backup = command("backup", "--state", str(state / "vshard-1"), str(tmp_path / "backup-1"))
    assert backup.returncode == 0, backup.stderr.decode()
    run(records[third:], len(expected))
    restored = command("restore", "--state", str(state / "vshard-1"), "--replace", str(tmp_path / "backup-1"))
    assert restored.returncode == 0, restored.stderr.decode()
    assert vshard_decisions(state, 4, KEYS) != held  # vshard 1 is back where the backup left it
    hosts = [subprocess.Popen(role_command(topics, kafka, 4, tag, "--role", "vshards", "--vshards", hosted, "--state",
                                           str(state), "--until-caught-up", *KEYS),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for hosted in ("0-1", "2-3")]
    try:
        for host in hosts:
            assert host.wait(timeout=180) == 0, host.stderr.read().decode()[-2000:]
    finally:
        stop_processes(hosts)
    assert outcome_summary(outcomes(kafka, topics)) == expected
    assert vshard_decisions(state, 4, KEYS) == held


@pytest.mark.parametrize("pause_at,refused", [("vshard-decided:1", False), ("vshard-kafka-begun:1", True)],
                         ids=["before-the-commit-looks", "inside-the-transaction"])
def test_a_host_joining_while_the_first_commits_its_first_epoch_costs_no_backoff(kafka, tmp_path, pause_at, refused):
    """The first host, given all 8 vshards, is held at its first epoch's commit (the pause switch) while a second
    joins the group and is given half of them (the generation moves). Held before the commit looks at the group
    (``vshard-decided``), the first host drops the vshards given away and commits the others under the new
    generation: nobody is refused. Held inside its transaction (``vshard-kafka-begun``), past that look, its
    offsets are refused for the old generation and its next session starts at once (``fenced_by_group``), not
    after the lost broker's backoff (``broker_lost``), with the member its first session had: the group's
    generation moves once, for the join, and not again for the new session. Either way every record has one
    outcome, the single worker's."""
    records = sharded_records(articles=160, seed=6)
    expected = single_worker_summary(records, KEYS)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    produce(kafka, topics.raw, records)
    tag = uuid.uuid4().hex[:8]
    command = role_command(topics, kafka, 8, tag, "--role", "vshards", "--state", str(tmp_path / "states"), *KEYS)
    flag, logs = tmp_path / "paused", [tmp_path / "host-0.log", tmp_path / "host-1.log"]

    def host(log, **env) -> subprocess.Popen:
        with open(log, "wb") as handle:
            return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=handle, env=dict(os.environ, **env))

    def wait_until(done, what: str) -> None:
        deadline = time.monotonic() + 120
        while not done():
            assert all(p.poll() is None for p in processes), f"a process ended before {what}"
            assert time.monotonic() < deadline, f"no {what}"
            time.sleep(0.05)

    processes = [host(logs[0], STREAMDEDUP_TEST_PAUSE_AT=pause_at, STREAMDEDUP_TEST_PAUSE_FILE=str(flag))]
    try:
        processes += signers(topics, kafka, 8, tag, 1, "--set", "shards.epoch_records=53")
        wait_until(flag.exists, f"first host at {pause_at}")
        processes.append(host(logs[1]))
        wait_until(lambda: "vshard_state_busy" in logs[1].read_text(), "vshards given to the second host")
        flag.unlink()
        found = settled(kafka, topics, len(expected), processes)
        first, second = (log.read_text() for log in logs)  # before the stops move the group
    finally:
        stop_processes(processes)
    assert outcome_summary(found) == expected
    assert "broker_lost" not in first + second
    assert ("fenced_by_group" in first) == refused and "fenced_by_group" not in second
    assert not refused or "a new session starts at once" in first
    assert len(re.findall(r" assigned role=", first)) == 1 + refused  # a session, and one after the refusal
    followed = {name: generations_followed(log) for name, log in (("first", first), ("second", second))}
    assert len({member for _, member in followed["first"]}) == 1, followed
    assert sorted({generation for name in followed for generation, _ in followed[name]}) == [1, 2], followed


def generations_followed(log: str) -> list[tuple[int, str]]:
    """The group's generations a vshards process followed, in order, with its member id in each
    (``vshards_group_followed`` lines)."""
    return [(int(generation), member) for generation, member in
            re.findall(r'vshards_group_followed .*?generation=(\d+) member="([^"]*)"', log)]


def test_a_process_keeps_its_group_member_from_session_to_session_until_its_client_is_closed(kafka):
    """``_Members``: each session of a vshards process takes the member the one before it had (no new join, the
    group's generation stays); a member whose client was closed is replaced by a new one, which joins."""
    from streamdedup.config import load
    from streamdedup.runtime.vshards.host import _Members
    from streamdedup.runtime.vshards.topics import ensure_internal_topics, values_topic

    tag = uuid.uuid4().hex[:8]
    config = load(None, (f"kafka.bootstrap_servers={kafka}", "shards.count=4", f"shards.signed_topic=order-{tag}",
                         f"shards.evidence_topic=ex-{tag}", f"kafka.group_id=g-{tag}"), environ={})
    ensure_internal_topics(config)
    members = _Members(config, {"bootstrap_servers": kafka})

    def joined(member) -> tuple:
        deadline = time.monotonic() + 60
        while member.assignment[1] is None or member.moving():
            assert time.monotonic() < deadline, "the member was given nothing"
            time.sleep(0.05)
        return member.assignment

    try:
        first = members.current()
        given, metadata = joined(first)
        assert given == {0, 1, 2, 3} and first.usable()
        assert members.current() is first and joined(first) == (given, metadata) and members.made == 1
        first.source.close()
        second = members.current()
        assert second is not first and members.made == 2 and not first.usable()
        again, renewed = joined(second)
        assert again == given and renewed.member_id != metadata.member_id
        assert renewed.group_id == f"g-{tag}-vshards" and values_topic(config) == f"order-{tag}-values"
    finally:
        members.close()


def test_a_group_member_whose_join_outlasts_its_polls_still_completes_it(kafka):
    """kafka-python leaves a join that outlasts ``poll`` half done, and a group's first leader never completes it
    (no heartbeats: the group drops the member after its session, while it keeps its assignment); every group
    member of ours asks to join again (``rejoin_if_abandoned``). Polled with 1 ms timeouts, as a loaded machine
    makes a longer poll, each member ends its join stable, heartbeating."""
    from kafka import KafkaConsumer
    from kafka.structs import MemberState

    from streamdedup.runtime.source import rejoin_if_abandoned

    for _ in range(3):
        topic = f"join-{uuid.uuid4().hex[:8]}"
        create_topics(kafka, [topic], 8)
        consumer = KafkaConsumer(bootstrap_servers=kafka, group_id=f"group-{topic}", enable_auto_commit=False)
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=1)
                rejoin_if_abandoned(consumer)
            coordinator = consumer._coordinator
            assert coordinator.state is MemberState.STABLE and coordinator._heartbeat_enabled
            assert len(consumer.assignment()) == 8
        finally:
            consumer.close()


class _VShardCommitted:
    """A vshard as ``VShardCommit`` sees it: its number, and its state's commit (what it was given)."""

    def __init__(self, number: int):
        self.number, self.positions = number, None

    def commit(self, positions: dict) -> None:
        self.positions = positions


def _group_member(kafka: str, topic: str, group: str):
    """A consumer of ``group`` on ``topic``, once the group has given it its partitions."""
    from kafka import KafkaConsumer

    member = KafkaConsumer(topic, bootstrap_servers=kafka, group_id=group, enable_auto_commit=False)
    deadline = time.monotonic() + 60
    while not member.assignment():
        assert time.monotonic() < deadline, "the group gave the member nothing"
        member.poll(timeout_ms=200)
    return member


def test_a_process_the_vshards_group_moved_on_from_commits_nothing(kafka):
    """One transaction a process, fenced by the generation of the group ``<group_id>-vshards`` (KIP-447): an
    epoch committed with the group's metadata as a member had it before the group moved on (here: the member
    left and another joined) is refused by the broker, its outcomes aborted, its state not committed, and
    the session ends (``TransactionFencedError``, retriable); with the current generation the epochs of two
    vshards go out in one transaction, their order offsets readable (read_committed) on their partitions of the
    exchange topic."""
    from kafka import KafkaConsumer, TopicPartition

    from streamdedup.core.records import Decision, RawRecord, Source
    from streamdedup.errors import TransactionFencedError
    from streamdedup.runtime.checkpoint import VShardCommit, VShardEpoch
    from streamdedup.runtime.sink import KafkaSink

    topics = Topics.fresh(kafka)
    tag = uuid.uuid4().hex[:8]
    exchange, group = f"evidence-{tag}", f"sharded-{tag}-vshards"
    create_topics(kafka, [exchange], 2)
    sink = KafkaSink({"bootstrap_servers": kafka}, f"test-{tag}-vshards-host-0",
                     {"clean": topics.clean, "duplicates": topics.duplicates, "dead_letter": topics.dead_letter},
                     1 << 20)

    def epochs(offset: int) -> list:
        made = []
        for n in range(2):
            doc = f"doc-{offset}-{n}"
            record = RawRecord(json.dumps({"id": doc}).encode(), Source(topics.raw, 0, 2 * offset + n),
                               key=doc.encode())
            made.append(VShardEpoch(_VShardCommitted(n), offset, [record], [2 * offset + n + 1],
                                    [Decision(doc, "kept", cluster=doc)], {"order_at": offset + 1}, True))
        return made

    former = _group_member(kafka, topics.raw, group)
    stale = former.group_metadata()
    former.close()
    member = _group_member(kafka, topics.raw, group)
    try:
        commit = VShardCommit(sink.producer, exchange, 30)
        refused = epochs(4)
        with pytest.raises(TransactionFencedError, match="consumer group"):
            commit.commit(refused, sink, stale)
        assert [e.vshard.positions for e in refused] == [None, None]
        sink.abort()
        taken = epochs(7)
        commit.commit(taken, sink, member.group_metadata())
        assert [e.vshard.positions for e in taken] == [{"order_at": 8}, {"order_at": 8}]
    finally:
        member.close()
        sink.close()
    assert sorted(where for where in outcomes(kafka, topics)) == [(0, 14), (0, 15)]
    reader = KafkaConsumer(bootstrap_servers=kafka, group_id=group, isolation_level="read_committed",
                           enable_auto_commit=False)
    try:
        assert [reader.committed(TopicPartition(exchange, n)) for n in range(2)] == [8, 8]
    finally:
        reader.close()


def test_a_member_subscribed_records_its_topics_partitions_before_it_joins(kafka):
    """A member whose client recorded the subscribed topic's partitions only after its join (from metadata asked
    for by the subscription) would see them "change" once it had assigned the group as its leader, and make the
    group rebalance again (kafka-python 3.0.12): the vshards' first commits were refused for an old generation.
    ``KafkaSource.subscribe`` records them before the first poll joins, and the group stays at its first
    generation."""
    from streamdedup.runtime.source import KafkaSource

    topic = f"joined-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 8)
    source = KafkaSource([topic], {"bootstrap_servers": kafka}, f"group-{topic}", 10)
    try:
        source.subscribe([topic])
        assert source.consumer._coordinator._metadata_snapshot == {topic: set(range(8))}
        joined_by = time.monotonic() + 60
        while len(source.consumer.assignment()) < 8 and time.monotonic() < joined_by:
            source.poll_batch(100)
        assert len(source.consumer.assignment()) == 8
        settled_by = time.monotonic() + 2
        while time.monotonic() < settled_by:
            source.poll_batch(100)
        assert len(source.consumer.assignment()) == 8
        assert source.consumer.group_metadata().generation_id == 1
    finally:
        source.close()


def test_a_vshard_with_a_new_state_reads_its_partitions_without_asking_where_they_begin(kafka):
    """A vshard taken with a new state reads its records and exchange partitions from offset 0, at once: seeking
    to their beginning left them unfetchable until the broker said where it is, an answer that waited behind the
    fetch held in flight (a deployment's first epoch took 0.6 to 1.2 s so, its work 0.1)."""
    from kafka import TopicPartition

    from streamdedup.config import load
    from streamdedup.runtime.vshards.host import _Inbound, hosted_at
    from streamdedup.runtime.vshards.topics import ensure_internal_topics

    tag = uuid.uuid4().hex[:8]
    config = load(None, (f"kafka.bootstrap_servers={kafka}", "shards.count=2", f"shards.signed_topic=order-{tag}",
                         f"shards.evidence_topic=ex-{tag}"), environ={})
    ensure_internal_topics(config)
    inbound = _Inbound(config, {"bootstrap_servers": kafka})
    try:
        hosted = {n: hosted_at(None, {}) for n in (0, 1)}
        inbound.host(hosted, [0, 1])
        subscriptions = inbound.source.consumer._subscription
        partitions = [TopicPartition(t, n) for t in (f"order-{tag}-values", f"ex-{tag}") for n in (0, 1)]
        assert [subscriptions.assignment[tp].position.offset for tp in partitions] == [0, 0, 0, 0]
        assert set(partitions) <= set(subscriptions.fetchable_partitions())
    finally:
        inbound.close()


def test_a_turns_exchange_messages_go_to_the_broker_in_one_request(kafka):
    """A host's messages of one turn (each of its 4 vshards to each of 8 exchange partitions, stage-sized) leave in
    one produce request (``host.EXCHANGE_BATCH_BYTES``: at kafka-python's default batch size they took several),
    and each partition reads them in the order they were sent."""
    from streamdedup.runtime.sink.appender import RecordAppender
    from streamdedup.runtime.vshards.host import exchange_publisher

    topic = f"exchange-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 8)
    messages = [(to, f"{sender}->{to} ".encode() * (13_000 // 8)) for sender in range(4) for to in range(8)]
    publisher = exchange_publisher({"bootstrap_servers": [kafka]})
    try:
        appender = RecordAppender.of(publisher, transactional=False)
        assert appender is not None
        for to, value in messages:
            assert appender.append(topic, to, None, value, [])
        appender.done()
        publisher.flush(timeout=30)
        per_request = publisher.metrics()["producer-metrics"]["records-per-request-avg"]
    finally:
        publisher.close()
    assert per_request == len(messages)
    read = [(m.partition, m.value) for m in read_all(kafka, topic)]
    assert read == sorted(messages, key=lambda message: message[0])


def _topic_max_message_bytes(kafka, topic: str, limit: int) -> None:
    """Set ``topic``'s max.message.bytes on the broker (as an operator would with kafka-configs.sh)."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=kafka)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                            configs={"max.message.bytes": str(limit)})])
    finally:
        admin.close()


def _committed(kafka, group: str, tp) -> int | None:
    from kafka import KafkaConsumer

    reader = KafkaConsumer(bootstrap_servers=kafka, group_id=group, enable_auto_commit=False)
    try:
        return reader.committed(tp)
    finally:
        reader.close()


def test_a_signer_whose_epochs_the_broker_refuses_stops_without_committing_their_offsets(kafka, tmp_path):
    """The order topic takes no epoch message (its max.message.bytes lowered below one): the home messages go
    out, the epochs fail, and the signer stops with an error naming the topic and what to do, its group's input
    offsets not moved (kafka-python's flush returned as if all was well: those records were lost for good).
    Once the limit is back, a signer and the hosts decide every record once, as the single worker does."""
    from kafka import TopicPartition

    from streamdedup.runtime.vshards.topics import SIGNED_MESSAGE_BYTES

    records = sharded_records(articles=80, seed=3, replays=10)
    expected = single_worker_summary(records, KEYS)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    produce(kafka, topics.raw, records)
    tag = uuid.uuid4().hex[:8]
    create_topics(kafka, [f"signed-{tag}"], 1, max_message_bytes=64)
    refused = signers(topics, kafka, 4, tag, 1)[0]
    try:
        error = refused.communicate(timeout=120)[1].decode()  # read as it comes: the client logs each refusal
        assert refused.returncode == 1, error[-2000:]
    finally:
        stop_processes([refused])
    assert f"an epoch message to signed-{tag} partition 0 was not written" in error, error[-2000:]
    assert f"raise max.message.bytes of topic signed-{tag} to {SIGNED_MESSAGE_BYTES}" in error
    assert _committed(kafka, f"sharded-{tag}-sign", TopicPartition(topics.raw, 0)) is None
    assert outcomes(kafka, topics) == {}

    _topic_max_message_bytes(kafka, f"signed-{tag}", SIGNED_MESSAGE_BYTES)
    processes = vshard_processes(topics, kafka, 4, tag, ["0-1", "2-3"], tmp_path)
    processes += signers(topics, kafka, 4, tag, 1)
    try:
        found = settled(kafka, topics, len(expected), processes)
    finally:
        stop_processes(processes)
    assert outcome_summary(found) == expected
    assert _committed(kafka, f"sharded-{tag}-sign", TopicPartition(topics.raw, 0)) == len(records)


def test_a_transactions_send_the_broker_refuses_fails_its_commit(kafka):
    """The single worker's sink needs no check of its own: a send of the transaction refused for good (here the
    clean topic's max.message.bytes lowered after the sink read it) puts kafka-python's transaction in error, and
    its commit raises (for the worker, a ``BrokerError`` saying what to do); nothing of it is readable."""
    from streamdedup.core.records import Decision, RawRecord, Source
    from streamdedup.errors import kafka_trouble
    from streamdedup.runtime.sink import KafkaSink

    topics = Topics.fresh(kafka)
    sink = KafkaSink({"bootstrap_servers": kafka}, f"test-{uuid.uuid4().hex[:8]}",
                     {"clean": topics.clean, "duplicates": topics.duplicates, "dead_letter": topics.dead_letter},
                     1 << 20)
    try:
        _topic_max_message_bytes(kafka, topics.clean, 1000)
        records = [RawRecord(json.dumps({"id": f"doc-{n}", "text": "word " * 500}).encode(), Source(topics.raw, 0, n),
                             key=f"doc-{n}".encode()) for n in range(3)]
        sink.begin()
        sink.send(sink.messages(records, [Decision(f"doc-{n}", "kept", cluster=f"doc-{n}") for n in range(3)]))
        with pytest.raises(Exception) as raised:
            sink.commit(30)
        trouble = kafka_trouble(raised.value)
        assert trouble is not None and not trouble.retriable and "MessageSizeTooLargeError" in str(trouble)
    finally:
        sink.close(0)
    assert read_all(kafka, topics.clean) == []
