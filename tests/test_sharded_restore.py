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
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from kafka_helpers import Topics, create_topics, header, outcomes, produce, run_worker

from streamdedup.core import corpus

pytestmark = pytest.mark.kafka

OFF = ["--set", "templates.enabled=false"]


def _records(web: bool, articles=220, seed=11):
    """The synthetic crawl (or pages of sites with their templates), with replays of some records, exact
    copies under new ids and a rejected record."""
    from streamdedup.core.webcrawl import generate_web

    rng = random.Random(seed)
    if web:
        docs = [(p.id, p.text, p.url) for p in generate_web(450, 12, seed)]
    else:
        docs = [(d.id, d.text, None) for d in corpus.generate(articles, seed=seed)]
    extra = []
    for doc_id, text, url in rng.sample(docs, 30):
        extra += [(doc_id, text, url), (doc_id + "-copy", text, url)]
    stream = docs + extra
    rng.shuffle(stream)
    return [(doc_id.encode(), json.dumps({"id": doc_id, "text": text, "url": url}).encode())
            for doc_id, text, url in stream] + [(b"bad", b"{not json")]


def _sharded_topics(kafka, raw: str) -> Topics:
    tag = uuid.uuid4().hex[:10]
    topics = Topics(raw, f"clean-{tag}", f"dups-{tag}", f"dead-{tag}")
    create_topics(kafka, topics.outputs, 1)
    return topics


def _role_command(topics: Topics, kafka: str, count: int, tag: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "streamdedup", "run", *topics.settings(kafka),
            "--set", f"kafka.group_id=sharded-{tag}", "--set", f"shards.count={count}",
            "--set", f"shards.signed_topic=signed-{tag}", "--set", f"shards.evidence_topic=evidence-{tag}",
            "--set", "log.summary_interval_s=0", *extra]


def _summary(found: dict) -> dict:
    """Input (partition, offset) -> what came out for it: kind, cluster, matched, similarity, exact."""
    summary = {}
    for where, outs in found.items():
        assert len(outs) == 1, f"{where}: {len(outs)} outcomes"
        kind, message = outs[0]
        if kind == "clean":
            summary[where] = (kind, header(message, "streamdedup.cluster").decode())
        elif kind == "duplicates":
            body = json.loads(message.value)
            summary[where] = (kind, body["cluster"], body["matched"], body["similarity"], body["exact"])
        else:
            summary[where] = (kind,)
    return summary


def _wait_for_outcomes(kafka, topics, expected: int, processes, timeout=240) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = outcomes(kafka, topics)
        if sum(len(v) for v in found.values()) >= expected:
            return found
        for process in processes:
            if process.poll() not in (None, 0):
                raise AssertionError(process.stderr.read().decode()[-3000:] if process.stderr else
                                     f"{process.args[-8:]} exited {process.returncode} (its log is a file)")
        if time.monotonic() > deadline:
            raise AssertionError(f"{sum(len(v) for v in found.values())} of {expected} outcomes after {timeout} s")
        time.sleep(1)


def _stop(processes) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "streamdedup", *args], capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    return result


@pytest.mark.parametrize("settings", [OFF, []], ids=["templates-off", "defaults"])
def test_a_lost_shard_restored_from_a_backup_taken_while_running_replays_and_the_deployment_decides_as_one_worker(
        kafka, tmp_path, settings):
    records = _records(web=not settings, seed=23)
    first, second = len(records) // 3, 2 * len(records) // 3
    single = Topics.fresh(kafka)
    produce(kafka, single.raw, records)
    result = run_worker(tmp_path / "single", single, kafka, *settings)
    assert result.returncode == 0, result.stderr.decode()
    expected = _summary(outcomes(kafka, single))
    before = {phase: sum(1 for where in expected if where[1] < end) for phase, end in (("a", first), ("b", second))}

    topics = _sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    state = [tmp_path / f"shard-{n}" for n in range(3)]

    def shard(n: int, log=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(_role_command(topics, kafka, 3, tag, "--role", "shard", "--shard", str(n),
                                              "--state", str(state[n]), *settings),
                                stdout=subprocess.DEVNULL, stderr=log)

    shards = [shard(n) for n in range(3)]
    signers = [subprocess.Popen(_role_command(topics, kafka, 3, tag, "--role", "sign", "--set",
                                              "worker.batch_size=41", *settings),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    restored_log = tmp_path / "restored-shard.log"
    try:
        produce(kafka, topics.raw, records[:first])
        _wait_for_outcomes(kafka, topics, before["a"], shards + signers)
        for n in range(3):  # while the shards run: each shard's backup, a consistent copy of its own index
            _cli("backup", "--state", str(state[n]), str(tmp_path / f"backup-{n}"))
        produce(kafka, topics.raw, records[first:second])
        _wait_for_outcomes(kafka, topics, before["b"], shards + signers)

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
            found = _wait_for_outcomes(kafka, topics, len(expected), shards + signers)
            _stop([shards[1]])  # its log is complete
    finally:
        _stop(shards + signers)
    got = _summary(found)  # also asserts one outcome per record
    assert got == expected
    assert len(got) == len(expected)
    assert "replayed_unindexed_batch" in restored_log.read_text(), \
        "the restored shard did not replay the batches committed after its backup"

    stats = json.loads(_cli("stats", "--shards", str(tmp_path), "--json", *settings).stdout)
    single_stats = json.loads(_cli("stats", "--state", str(tmp_path / "single"), "--json", *settings).stdout)
    for key in ("documents", "kept", "duplicates", "exact_duplicates"):
        assert stats[key] == single_stats[key], key


def test_a_shard_restored_from_a_backup_older_than_the_signed_topic_retention_is_refused(kafka, tmp_path):
    """The signed batches after the backup are gone (retention): the shard would skip them, so it refuses."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    records = _records(web=False, articles=90, seed=5)
    half = len(records) // 2
    single = Topics.fresh(kafka)
    produce(kafka, single.raw, records)
    assert run_worker(tmp_path / "single", single, kafka, *OFF).returncode == 0
    expected = outcomes(kafka, single)
    topics = _sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    state = [tmp_path / f"shard-{n}" for n in range(2)]
    shards = [subprocess.Popen(_role_command(topics, kafka, 2, tag, "--role", "shard", "--shard", str(n),
                                             "--state", str(state[n]), *OFF),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for n in range(2)]
    signer = subprocess.Popen(_role_command(topics, kafka, 2, tag, "--role", "sign", *OFF),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        produce(kafka, topics.raw, records[:half])
        _wait_for_outcomes(kafka, topics, sum(1 for where in expected if where[1] < half), shards + [signer])
        _cli("backup", "--state", str(state[1]), str(tmp_path / "backup-1"))
        produce(kafka, topics.raw, records[half:])
        _wait_for_outcomes(kafka, topics, len(expected), shards + [signer])
    finally:
        _stop(shards + [signer])
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
    result = subprocess.run(_role_command(topics, kafka, 2, tag, "--role", "shard", "--shard", "1",
                                          "--state", str(state[1]), "--until-caught-up", *OFF),
                            capture_output=True, timeout=180)
    assert result.returncode != 0
    assert b"no longer hold" in result.stderr and f"signed-{tag}/0".encode() in result.stderr
