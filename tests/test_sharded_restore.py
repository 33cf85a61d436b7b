"""Backing up and restoring a sharded index on the real broker: a lost shard comes back from its backup.

All shards are backed up while the deployment runs; the deployment carries on;
then one shard's folder is lost, restored from its (now lagging) backup and
the shard restarted. It replays, without emitting, the signed batches its
group committed after the backup, from the other shards' evidence still in
the evidence topic, and the deployment ends with exactly one outcome per input
record, the single worker's.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import uuid

import pytest
from kafka_helpers import (
    Topics,
    outcome_summary,
    outcomes,
    produce,
    role_command,
    run_worker,
    sharded_records,
    sharded_topics,
    single_worker_summary,
    stop_processes,
    wait_for_outcomes,
)


pytestmark = pytest.mark.kafka

OFF = ["--set", "templates.enabled=false"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "streamdedup", *args], capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    return result


def test_a_lost_shard_restored_from_a_backup_taken_while_running_replays_and_the_deployment_decides_as_one_worker(
        kafka, tmp_path):
    """Pages of sites with templates (the plain crawl's restore is the Kubernetes manifests' test in
    ``test_deploy.py``)."""
    settings: list[str] = []
    records = sharded_records(web=True, seed=23)
    first, second = len(records) // 3, 2 * len(records) // 3
    expected = single_worker_summary(records, settings)
    before = {phase: sum(1 for where in expected if where[1] < end) for phase, end in (("a", first), ("b", second))}

    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    state = [tmp_path / f"shard-{n}" for n in range(3)]

    def shard(n: int, log=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(role_command(topics, kafka, 3, tag, "--role", "shard", "--shard", str(n),
                                              "--state", str(state[n]), *settings),
                                stdout=subprocess.DEVNULL, stderr=log)

    shards = [shard(n) for n in range(3)]
    signers = [subprocess.Popen(role_command(topics, kafka, 3, tag, "--role", "sign", "--set",
                                              "worker.batch_size=41", *settings),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    restored_log = tmp_path / "restored-shard.log"
    try:
        produce(kafka, topics.raw, records[:first])
        wait_for_outcomes(kafka, topics, before["a"], shards + signers)
        for n in range(3):  # while the shards run: each shard's backup, a consistent copy of its own index
            _cli("backup", "--state", str(state[n]), str(tmp_path / f"backup-{n}"))
        produce(kafka, topics.raw, records[first:second])
        wait_for_outcomes(kafka, topics, before["b"], shards + signers)

        shards[1].send_signal(signal.SIGKILL)  # shard 1's machine dies, and its disk with it
        shards[1].wait(timeout=30)
        shards[1].stderr.close()
        shutil.rmtree(state[1])
        produce(kafka, topics.raw, records[second:])  # the other shards wait for shard 1's evidence

        restored = _cli("restore", str(tmp_path / "backup-1"), "--state", str(state[1]),
                        *settings)
        assert b"shards:signed" in restored.stdout  # the restore says where the shard takes up again
        with open(restored_log, "wb") as log:
            shards[1] = shard(1, log)
            found = wait_for_outcomes(kafka, topics, len(expected), shards + signers)
            stop_processes([shards[1]])  # its log is complete
    finally:
        stop_processes(shards + signers)
    got = outcome_summary(found)  # also asserts one outcome per record
    assert got == expected
    assert len(got) == len(expected)
    assert "replayed_unindexed_batch" in restored_log.read_text(), \
        "the restored shard did not replay the batches committed after its backup"

    stats = json.loads(_cli("stats", "--shards", str(tmp_path), "--json", *settings).stdout)
    kept = sum(outcome[0] == "clean" for outcome in expected.values())
    duplicates = [outcome for outcome in expected.values() if outcome[0] == "duplicates"]
    assert (stats["documents"], stats["kept"], stats["duplicates"], stats["exact_duplicates"]) == (
        kept + len(duplicates), kept, len(duplicates), sum(outcome[4] for outcome in duplicates))


def test_a_shard_restored_from_a_backup_older_than_the_signed_topic_retention_is_refused(kafka, tmp_path):
    """The signed batches after the backup are gone (retention): the shard would skip them, so it refuses."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    records = sharded_records(web=False, articles=90, seed=5)
    half = len(records) // 2
    single = Topics.fresh(kafka)
    produce(kafka, single.raw, records)
    assert run_worker(tmp_path / "single", single, kafka, *OFF).returncode == 0
    expected = outcomes(kafka, single)
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    state = [tmp_path / f"shard-{n}" for n in range(2)]
    shards = [subprocess.Popen(role_command(topics, kafka, 2, tag, "--role", "shard", "--shard", str(n),
                                             "--state", str(state[n]), *OFF),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for n in range(2)]
    signer = subprocess.Popen(role_command(topics, kafka, 2, tag, "--role", "sign", *OFF),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        produce(kafka, topics.raw, records[:half])
        wait_for_outcomes(kafka, topics, sum(1 for where in expected if where[1] < half), shards + [signer])
        _cli("backup", "--state", str(state[1]), str(tmp_path / "backup-1"))
        produce(kafka, topics.raw, records[half:])
        wait_for_outcomes(kafka, topics, len(expected), shards + [signer])
    finally:
        stop_processes(shards + [signer])
    signed = TopicPartition(f"signed-{tag}", 0)
    admin = KafkaAdminClient(bootstrap_servers=kafka)
    try:
        consumer = KafkaConsumer(bootstrap_servers=kafka)
        end = consumer.end_offsets([signed])[signed]
        consumer.close()
        admin.delete_records({signed: end})  # as retention would, a while after the backup
    finally:
        admin.close()
    restored = _cli("restore", str(tmp_path / "backup-1"), "--state", str(state[1]), "--replace", *OFF)
    assert b"shards:signed" in restored.stdout
    result = subprocess.run(role_command(topics, kafka, 2, tag, "--role", "shard", "--shard", "1",
                                          "--state", str(state[1]), "--until-caught-up", *OFF),
                            capture_output=True, timeout=180)
    assert result.returncode != 0
    assert b"no longer hold" in result.stderr and f"signed-{tag}/0".encode() in result.stderr
