"""Exactly one outcome per input record across crashes at every commit step, random kill -9 and a broker outage."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import OwnBroker, index_snapshot, run_cli, spawned
from kafka_helpers import (
    Topics,
    outcomes,
    produce,
    read_all,
    run_worker,
    worker_command,
)

from streamdedup.core import corpus

STEPS = ["decided", "kafka-begun", "produced", "offsets-sent", "kafka-committed", "index-committed"]


def crawl_records(docs):
    return [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode()) for d in docs]


def reference_run(kafka, tmp_path, records, *extra):
    """An uninterrupted run over the same records: its outcomes, clean values and index."""
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    state = tmp_path / "reference"
    result = run_worker(state, topics, kafka, *extra)
    assert result.returncode == 0, result.stderr.decode()
    return _outcome(kafka, topics, state)


def _outcome(kafka, topics, state):
    found = outcomes(kafka, topics)
    return {
        "per_offset": {k: [kind for kind, _ in v] for k, v in found.items()},
        "clean": [(m.key, m.value) for m in read_all(kafka, topics.clean)],
        "index": _without_topic_names(index_snapshot(state)),
    }


def _without_topic_names(snapshot: dict) -> dict:
    """The index snapshot with each record's source topic blanked (each run has its own topics)."""
    snapshot["records"] = [r[:8] + (r[8][1:],) + r[9:] for r in snapshot["records"]]
    return snapshot


def assert_same_as_reference(kafka, topics, state, reference, count):
    got = _outcome(kafka, topics, state)
    assert sorted(got["per_offset"]) == [(0, n) for n in range(count)], "an input has no outcome"
    duplicated = {k: v for k, v in got["per_offset"].items() if len(v) != 1}
    assert duplicated == {}, "an input has more than one outcome"
    assert got["per_offset"] == reference["per_offset"]
    assert got["clean"] == reference["clean"]
    assert got["index"] == reference["index"]
    assert run_cli("check", "--state", str(state)).returncode == 0


@pytest.fixture(scope="module")
def crash_corpus():
    return crawl_records(corpus.generate(650, seed=42))


@pytest.fixture(scope="module")
def crash_reference(kafka, tmp_path_factory, crash_corpus):
    return reference_run(kafka, tmp_path_factory.mktemp("ref"), crash_corpus, "--set", "worker.batch_size=200")


@pytest.mark.parametrize("step", STEPS)
def test_killed_at_each_commit_step_the_restart_ends_as_an_uninterrupted_run(kafka, tmp_path, step,
                                                                                crash_corpus, crash_reference):
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crash_corpus)
    state = tmp_path / "state"
    crashed = run_worker(state, topics, kafka, "--set", "worker.batch_size=200",
                         env={"STREAMDEDUP_TEST_CRASH_AT": f"{step}:3"})
    assert crashed.returncode == 137, crashed.stderr.decode()
    restarted = run_worker(state, topics, kafka, "--set", "worker.batch_size=200")
    assert restarted.returncode == 0, restarted.stderr.decode()
    replayed = b"replayed_unindexed_batch" in restarted.stderr
    assert replayed == (step in ("kafka-committed",)), "only the window after the Kafka commit needs a replay"
    assert_same_as_reference(kafka, topics, state, crash_reference, len(crash_corpus))


def test_chaos_twenty_thousand_documents_and_ten_kill_9(kafka, tmp_path):
    records = crawl_records(corpus.generate(10900, seed=77))[:20000]
    assert len(records) == 20000
    reference = reference_run(kafka, tmp_path, records, "--set", "worker.batch_size=250")
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    state = tmp_path / "state"
    command = worker_command(state, topics, kafka, "--set", "worker.batch_size=250", "--until-caught-up")
    rng = random.Random(2026)
    kills = 0
    while kills < 10:
        with spawned(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
            batches = rng.randrange(-1, 6)  # -1: during start-up or recovery; else after that many batches
            if batches < 0:
                time.sleep(rng.uniform(0.2, 1.0))
            else:
                _read_batch_lines(process, batches + 1)
                time.sleep(rng.uniform(0.0, 0.05))  # somewhere in the next batch's commit path
            if process.poll() is not None:
                break  # it caught up before this kill
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            kills += 1
    assert kills >= 10, f"only {kills} kills landed before the worker caught up"
    final = run_worker(state, topics, kafka, "--set", "worker.batch_size=250")
    assert final.returncode == 0, final.stderr.decode()
    assert_same_as_reference(kafka, topics, state, reference, len(records))


def test_hot_keys_after_repeated_kill_9_are_decided_as_in_one_run(kafka, tmp_path):
    """Each restart cuts the rest of the partition into batches of another size, on a corpus whose band keys
    are hot and a per-key limit of 2 that bites on most of them: decisions, record for record, as one
    uninterrupted run's (a decision is a function of the order alone)."""
    records = crawl_records(corpus.hot_keys(3000, seed=7))
    limit = ("--set", "lsh.max_candidates=2")
    reference = reference_run(kafka, tmp_path, records, "--set", "worker.batch_size=300", *limit)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    state = tmp_path / "state"
    rng = random.Random(28)
    kills = 0
    while kills < 8:
        size = rng.choice([1, 17, 90, 450, 2000])
        command = worker_command(state, topics, kafka, "--set", f"worker.batch_size={size}", *limit,
                                 "--until-caught-up")
        with spawned(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
            _read_batch_lines(process, rng.randrange(1, 4))
            time.sleep(rng.uniform(0.0, 0.05))
            if process.poll() is not None:
                break
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            kills += 1
    assert kills >= 5, f"only {kills} kills landed before the worker caught up"
    final = run_worker(state, topics, kafka, "--set", "worker.batch_size=130", *limit)
    assert final.returncode == 0, final.stderr.decode()
    assert_same_as_reference(kafka, topics, state, reference, len(records))


def _read_batch_lines(process: subprocess.Popen, count: int) -> None:
    """Read the worker's log until it reported ``count`` committed batches (or ended).

    Kills are timed by the worker's progress, not by the clock: a worker that
    got faster would otherwise catch up between fixed-time kills.
    """
    seen = 0
    for line in process.stderr:
        seen += b" batch " in line
        if seen >= count or b"caught_up" in line:
            return


@pytest.mark.kafka
@pytest.mark.parametrize("partitions", [1, 3])  # with 3, the feed process's read fails while the broker is away
def test_broker_outage_of_twenty_seconds_loses_nothing(tmp_path_factory, tmp_path, partitions):
    """Uses a broker of its own (it must be stopped), always started by deploy/kafka."""
    broker = OwnBroker(tmp_path_factory.mktemp("outage"))
    bootstrap = broker.bootstrap
    try:
        records = crawl_records(corpus.generate(4400, seed=13))
        topics = Topics.fresh(bootstrap, partitions=partitions)
        produce(bootstrap, topics.raw, records, partition_of=lambda n: n % partitions)
        command = worker_command(tmp_path / "state", topics, bootstrap, "--set", "worker.batch_size=100",
                                 "--until-caught-up")
        with spawned(command, stderr=subprocess.PIPE) as worker:
            log = _read_until(worker, b"info batch")
            ready_url = re.search(rb'metrics="(http://[^"]+)/metrics"', log).group(1).decode() + "/readyz"
            broker.stop()
            down_since = time.monotonic()
            answers = set()
            while time.monotonic() - down_since < 20:
                answers.add(_status(ready_url))
                time.sleep(1)
            assert 503 in answers, "/readyz should fail while the broker is down"
            broker.start()
            _, rest = worker.communicate(timeout=240)
            log += rest
            (tmp_path / "worker.log").write_bytes(log)
            assert worker.returncode == 0, log.decode()
            assert time.monotonic() - down_since >= 20
        assert b"broker_lost" in log and b"broker_back" in log
        assert b"waiting_for" in log
        found = outcomes(bootstrap, topics)
        assert sorted(found) == sorted((n % partitions, n // partitions) for n in range(len(records)))
        assert all(len(v) == 1 for v in found.values())
        assert run_cli("check", "--state", str(tmp_path / "state")).returncode == 0
    finally:
        broker.wipe()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _read_until(process: subprocess.Popen, needle: bytes, timeout: float = 60) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen += line
        if needle in line:
            return seen
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"the worker never logged {needle!r}:\n{seen.decode()}")


def test_restoring_an_older_backup_replays_what_kafka_has_without_emitting_it(kafka, tmp_path):
    records = crawl_records(corpus.generate(700, seed=23))
    topics = Topics.fresh(kafka)
    state = tmp_path / "state"
    small = ("--set", "worker.batch_size=100")
    produce(kafka, topics.raw, records[:600])
    assert run_worker(state, topics, kafka, *small).returncode == 0
    run_cli("backup", str(tmp_path / "backup"), "--state", str(state))
    produce(kafka, topics.raw, records[600:])
    assert run_worker(state, topics, kafka, *small).returncode == 0
    before = _outcome(kafka, topics, state)
    for name in os.listdir(state):
        os.remove(state / name)
    shutil.copy(tmp_path / "backup" / "data.mdb", state / "data.mdb")
    restored = run_worker(state, topics, kafka, *small)
    assert restored.returncode == 0, restored.stderr.decode()
    assert b"replayed_unindexed_batch records=" + str(len(records) - 600).encode() in restored.stderr
    after = _outcome(kafka, topics, state)
    assert after["per_offset"] == before["per_offset"], "nothing was emitted again"
    assert after["index"] == before["index"]
    assert run_cli("check", "--state", str(state)).returncode == 0


def _lose_the_disk_between_runs(kafka, tmp_path, records, restore_args):
    """Feed, back up, feed more, delete the whole index folder, restore (``restore_args``), run, feed more.

    Returns (topics, state, the restored worker's log) once the last records are decided.
    """
    topics = Topics.fresh(kafka)
    state = tmp_path / "state"
    small = ("--set", "worker.batch_size=100")
    produce(kafka, topics.raw, records[:500])
    assert run_worker(state, topics, kafka, *small).returncode == 0
    run_cli("backup", str(tmp_path / "backup"), "--state", str(state))
    produce(kafka, topics.raw, records[500:700])
    assert run_worker(state, topics, kafka, *small).returncode == 0
    shutil.rmtree(state)  # the disk is gone
    refused = run_worker(state, topics, kafka, *small)
    assert refused.returncode != 0 and b"streamdedup restore" in refused.stderr, refused.stderr.decode()
    shutil.rmtree(state)
    restored = run_cli("restore", *restore_args(tmp_path), "--state", str(state), *topics.settings(kafka))
    assert b"start the worker" in restored.stdout
    resumed = run_worker(state, topics, kafka, *small)
    assert resumed.returncode == 0, resumed.stderr.decode()
    produce(kafka, topics.raw, records[700:])
    assert run_worker(state, topics, kafka, *small).returncode == 0
    return topics, state, resumed.stderr


@pytest.fixture(scope="module")
def lost_disk_records():
    return crawl_records(corpus.generate(520, seed=29))[:900]


@pytest.fixture(scope="module")
def lost_disk_reference(kafka, tmp_path_factory, lost_disk_records):
    return reference_run(kafka, tmp_path_factory.mktemp("ref"), lost_disk_records, "--set", "worker.batch_size=100")


def test_a_lost_index_folder_restored_from_its_backup_emits_nothing_twice(kafka, tmp_path, lost_disk_records,
                                                                          lost_disk_reference):
    """The folder is deleted after 700 records; the backup holds 500: the other 200 are replayed unemitted."""
    topics, state, log = _lose_the_disk_between_runs(kafka, tmp_path, lost_disk_records,
                                                     lambda base: [str(base / "backup")])
    assert b"replayed_unindexed_batch records=200" in log
    assert_same_as_reference(kafka, topics, state, lost_disk_reference, len(lost_disk_records))


def test_a_lost_index_folder_without_backup_is_rebuilt_from_the_topics_emitting_nothing_twice(
        kafka, tmp_path, lost_disk_records, lost_disk_reference):
    """With every record still in the topic (no retention yet), the rebuilt index is the one that was lost."""
    topics, state, log = _lose_the_disk_between_runs(kafka, tmp_path, lost_disk_records,
                                                     lambda base: ["--from-topics"])
    assert b"replayed_unindexed_batch records=700" in log
    assert_same_as_reference(kafka, topics, state, lost_disk_reference, len(lost_disk_records))


def test_a_commit_that_fills_the_map_after_kafka_committed_emits_nothing_twice(kafka, tmp_path, crash_corpus,
                                                                               crash_reference):
    """The index's commit fails with the map full right after the Kafka transaction of batches 2 and 4 committed."""
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crash_corpus)
    state = tmp_path / "state"
    result = run_worker(state, topics, kafka, "--set", "worker.batch_size=200",
                        env={"STREAMDEDUP_TEST_FAIL_AT": "index-commit-map-full:2,index-commit-map-full:5"})
    assert result.returncode == 0, result.stderr.decode()
    assert_same_as_reference(kafka, topics, state, crash_reference, len(crash_corpus))


COMMIT_STEPS = ["decided", "kafka-begun", "produced", "offsets-sent"]  # the broker goes away after each


@pytest.mark.kafka
@pytest.mark.parametrize("how", ["kill", "graceful", "freeze"])
def test_broker_restarted_at_each_step_of_a_batch_commit_loses_and_repeats_nothing(tmp_path_factory, tmp_path, how):
    """The worker pauses after each Kafka step of a batch in turn; meanwhile the broker is stopped and started
    (or frozen, with SIGSTOP, for longer than ``worker.kafka_timeout_s``).

    Three input partitions, as in the run that once left the worker waiting
    forever in kafka-python's ``send_offsets_to_transaction``. Every wait on
    Kafka is bounded (``worker.kafka_timeout_s``), so a call that would never
    return gives up, the session is rebuilt and the batch recovered: every
    input record ends with exactly one outcome.
    """
    broker = OwnBroker(tmp_path_factory.mktemp("restarts"))
    try:
        records = crawl_records(corpus.generate(1300, seed=31))
        topics = Topics.fresh(broker.bootstrap, partitions=3, output_partitions=3)
        produce(broker.bootstrap, topics.raw, records, partition_of=lambda n: n % 3)
        pause_file = tmp_path / "paused"
        pauses = ",".join(f"{step}:{3 + 4 * n}" for n, step in enumerate(COMMIT_STEPS))
        env = dict(os.environ, STREAMDEDUP_TEST_PAUSE_AT=pauses, STREAMDEDUP_TEST_PAUSE_FILE=str(pause_file))
        command = worker_command(tmp_path / "state", topics, broker.bootstrap, "--set", "worker.batch_size=100",
                                 "--set", "worker.kafka_timeout_s=15", "--until-caught-up")
        with spawned(command, env=env, stderr=subprocess.PIPE) as worker:
            log = _restart_broker_at_each_pause(broker, worker, pause_file, how)
            (tmp_path / "worker.log").write_bytes(log)
            assert worker.returncode == 0, log.decode()
        if how == "freeze":  # nothing answered for longer than the limit: the waits gave up, the session was rebuilt
            assert b"gave up waiting for" in log and b"kafka_timeout_s" in log, log.decode()
        found = outcomes(broker.bootstrap, topics)
        assert sum(len(v) for v in found.values()) == len(records), "an input has no outcome, or more than one"
        assert sorted(found) == sorted((n % 3, n // 3) for n in range(len(records)))
        assert run_cli("check", "--state", str(tmp_path / "state")).returncode == 0
    finally:
        broker.wipe()


def _restart_broker_at_each_pause(broker: OwnBroker, worker: subprocess.Popen, pause_file, how: str) -> bytes:
    """Stop and start the broker each time the worker pauses at a commit step; returns what it logged meanwhile."""
    import threading

    log = bytearray()
    reader = threading.Thread(target=lambda: log.extend(worker.stderr.read()), daemon=True)
    reader.start()
    for step in COMMIT_STEPS:
        deadline = time.monotonic() + 240
        while not pause_file.exists():
            assert worker.poll() is None, f"the worker ended before pausing at {step}:\n{bytes(log).decode()}"
            assert time.monotonic() < deadline, f"the worker never paused at {step}"
            time.sleep(0.05)
        assert pause_file.read_text() == step
        if how == "freeze":
            pause_file.unlink()
            broker.freeze(20)
            continue
        broker.stop(how)
        time.sleep(3)
        broker.start()
        pause_file.unlink()
    worker.wait(timeout=300)
    reader.join(timeout=10)
    return bytes(log)
