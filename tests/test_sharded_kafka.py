"""A sharded deployment on the real broker: signing processes and shards decide as one worker does, once each."""

from __future__ import annotations

import os
import subprocess
import time
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
    stop_processes,
    wait_for_outcomes,
)

pytestmark = pytest.mark.kafka

OFF = ["--set", "templates.enabled=false"]


@pytest.mark.parametrize("settings", [[], OFF], ids=["defaults", "templates-off"])
def test_three_shards_and_two_signers_decide_as_one_worker(kafka, tmp_path, settings):
    records = sharded_records(web=not settings)
    single = Topics.fresh(kafka)
    produce(kafka, single.raw, records)
    result = run_worker(tmp_path / "single", single, kafka, *settings)
    assert result.returncode == 0, result.stderr.decode()
    expected = outcome_summary(outcomes(kafka, single))
    assert len(expected) == len(records) - 30  # a replayed record emits nothing

    topics = sharded_topics(kafka, single.raw)
    tag = uuid.uuid4().hex[:8]
    shards = [subprocess.Popen(role_command(topics, kafka, 3, tag, "--role", "shard", "--shard", str(n),
                                             "--state", str(tmp_path / f"shard-{n}"), *settings),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for n in range(3)]
    signers = [subprocess.Popen(role_command(topics, kafka, 3, tag, "--role", "sign", "--until-idle", "8",
                                              "--set", "worker.batch_size=97", *settings),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        found = wait_for_outcomes(kafka, topics, len(expected), shards + signers)
        time.sleep(2)  # anything more (a second outcome) would show now
        found = outcomes(kafka, topics)
    finally:
        stop_processes(shards + signers)
    got = outcome_summary(found)
    assert got == expected
    kinds = {v[0] for v in got.values()}
    assert kinds == {"clean", "duplicates", "dead_letter"}


def test_a_shard_refuses_the_wrong_shard_number_with_what_to_do(kafka, tmp_path):
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    command = role_command(topics, kafka, 3, "refuse", "--role", "shard", "--shard", "3",
                            "--state", str(tmp_path / "s"), "--until-caught-up")
    result = subprocess.run(command, capture_output=True, timeout=120, env=dict(os.environ))
    assert result.returncode != 0
    assert b"--shard N, 0 to 2" in result.stderr
