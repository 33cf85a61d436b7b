"""A sharded deployment killed at each step of a shard's commit (and a signer between sending and committing):
restarted, it ends with exactly one outcome per input record, the single worker's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid

import pytest
from conftest import spawned
from kafka_helpers import (
    Topics,
    outcome_summary,
    outcomes,
    produce,
    read_all,
    role_command,
    sharded_records,
    sharded_topics,
    single_worker_summary,
)

from streamdedup.core.signed import unpack_signed

pytestmark = pytest.mark.kafka

SHARD_STEPS = ["shard-evidence-sent", "shard-evidence-b-sent", "shard-decided", "shard-kafka-begun",
               "shard-kafka-committed", "shard-index-committed"]
COUNT = 3
CRASHED = 1  # the shard that crashes
SIGNER = ("--set", "worker.batch_size=97")


@pytest.fixture(scope="module")
def single_worker(kafka, tmp_path_factory):
    """The input topic (pages of sites with templates, replays, copies, a rejected record), and what the
    single worker made of it: input (partition, offset) -> outcome."""
    records = sharded_records(web=True)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    expected = single_worker_summary(records)
    assert len(expected) == len(records) - 30  # a replayed record emits nothing
    return topics.raw, expected


def _sign(topics: Topics, kafka: str, tag: str, env: dict | None = None, idle_s: int = 3):
    """One signing process over the whole input, until it is idle for ``idle_s`` (or crashes)."""
    command = role_command(topics, kafka, COUNT, tag, "--role", "sign", "--until-idle", str(idle_s), *SIGNER)
    return subprocess.run(command, capture_output=True, timeout=240, env=dict(os.environ, **(env or {})))


def _shard_command(topics: Topics, kafka: str, tag: str, tmp_path, number: int) -> list[str]:
    return role_command(topics, kafka, COUNT, tag, "--role", "shard", "--shard", str(number),
                        "--state", str(tmp_path / f"shard-{number}"), "--until-caught-up")


def _run_shards_crashing_one(topics: Topics, kafka: str, tag: str, tmp_path, crash_at: str | None,
                             down_s: float = 0.0) -> bytes:
    """The shards until caught up; shard ``CRASHED`` crashes at ``crash_at`` (if any) and is started again
    ``down_s`` later while the others wait for its evidence. Returns the log of shard ``CRASHED``'s last run."""
    logs = {n: tmp_path / f"shard-{n}.log" for n in range(COUNT)}
    crash_env = dict(os.environ, STREAMDEDUP_TEST_CRASH_AT=crash_at) if crash_at else dict(os.environ)
    with contextlib.ExitStack() as stack:
        others = {n: stack.enter_context(spawned(_shard_command(topics, kafka, tag, tmp_path, n),
                                                 stderr=stack.enter_context(open(logs[n], "wb"))))
                  for n in range(COUNT) if n != CRASHED}
        last = subprocess.run(_shard_command(topics, kafka, tag, tmp_path, CRASHED), capture_output=True,
                              timeout=240, env=crash_env)
        if crash_at:
            assert last.returncode == 137, last.stderr.decode()
            time.sleep(down_s)
            last = subprocess.run(_shard_command(topics, kafka, tag, tmp_path, CRASHED), capture_output=True,
                                  timeout=240)
        assert last.returncode == 0, last.stderr.decode()
        for n, process in others.items():
            assert process.wait(timeout=240) == 0, logs[n].read_text()
    return last.stderr


@pytest.mark.parametrize("nth", [1, 3], ids=["first-batch", "third-batch"])
@pytest.mark.parametrize("step", SHARD_STEPS)
def test_a_shard_killed_at_each_commit_step_restarts_into_the_single_workers_outcomes(kafka, tmp_path, step, nth,
                                                                                        single_worker):
    raw, expected = single_worker
    topics = sharded_topics(kafka, raw)
    tag = uuid.uuid4().hex[:8]
    signed = _sign(topics, kafka, tag)
    assert signed.returncode == 0, signed.stderr.decode()
    down_s = 6.0 if step == "shard-evidence-sent" and nth == 3 else 0.0  # the others say they wait after 5 s
    log = _run_shards_crashing_one(topics, kafka, tag, tmp_path, f"{step}:{nth}", down_s)
    replayed = b"replayed_unindexed_batch" in log
    assert replayed == (step == "shard-kafka-committed"), "only the window after the Kafka commit needs a replay"
    assert outcome_summary(outcomes(kafka, topics)) == expected
    if down_s:
        waited = (tmp_path / "shard-0.log").read_text()
        assert 'waiting_for_shards batch=' in waited and f'missing="{CRASHED}"' in waited, waited


def _signed_by_a_signer_killed_at(kafka, raw: str, crash_at: str):
    """A signer killed at ``crash_at``, then another over the whole input: the topics, the deployment's tag
    and every signed batch."""
    topics = sharded_topics(kafka, raw)
    tag = uuid.uuid4().hex[:8]
    crashed = _sign(topics, kafka, tag, {"STREAMDEDUP_TEST_CRASH_AT": crash_at})
    assert crashed.returncode == 137, crashed.stderr.decode()
    resigned = _sign(topics, kafka, tag, idle_s=15)  # the group first drops the dead member (10 s)
    assert resigned.returncode == 0, resigned.stderr.decode()
    return topics, tag, [unpack_signed(m.value) for m in read_all(kafka, f"signed-{tag}")]


def test_records_a_killed_signer_signed_twice_are_decided_once(kafka, tmp_path, single_worker):
    """The signer dies after the broker has its second signed batch and before the group's offsets are
    committed: the next one signs those records again, and the shards take each once."""
    raw, expected = single_worker
    topics, tag, batches = _signed_by_a_signer_killed_at(kafka, raw, "signed-sent:2")
    signed_offsets = [r.source.offset for batch in batches for r in batch.records]
    assert sorted(set(signed_offsets)) == list(range(len(expected) + 30)), "every input record was signed"
    assert len(signed_offsets) - len(set(signed_offsets)) == 97, "the second batch was signed twice"
    _run_shards_crashing_one(topics, kafka, tag, tmp_path, None)
    assert outcome_summary(outcomes(kafka, topics)) == expected


def test_values_a_killed_signer_sent_without_their_signed_batch_are_never_read(kafka, tmp_path, single_worker):
    """The signer dies after the broker has the values of its second batch and before that batch's signed
    message: the next one signs those records again with values of its own, and the shards, which read only
    the values messages signed batches name, decide each record once."""
    raw, expected = single_worker
    topics, tag, batches = _signed_by_a_signer_killed_at(kafka, raw, "values-sent:2")
    signed_offsets = [r.source.offset for batch in batches for r in batch.records]
    assert sorted(signed_offsets) == list(range(len(expected) + 30)), "every input record was signed once"
    named = {(shard, at) for batch in batches for shard, at in batch.values_at.items()}
    sent = {(m.partition, m.offset) for m in read_all(kafka, f"signed-{tag}-values")}
    assert named < sent, "the values of the batch signed without its signed message are in the topic, unnamed"
    _run_shards_crashing_one(topics, kafka, tag, tmp_path, None)
    assert outcome_summary(outcomes(kafka, topics)) == expected
