"""output.create_topics against a real broker: created with the input's partitions, refused clearly, or off."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import run_cli
from kafka import KafkaAdminClient
from kafka_helpers import Topics, create_topics, outcomes, produce, run_worker

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.errors import ConfigError


def only_input(bootstrap: str, partitions: int) -> Topics:
    """Topic names of a fresh test whose input topic exists and whose output topics do not."""
    tag = uuid.uuid4().hex[:10]
    topics = Topics(f"raw-{tag}", f"clean-{tag}", f"dups-{tag}", f"dead-{tag}")
    create_topics(bootstrap, [topics.raw], partitions)
    return topics


def partition_counts(bootstrap: str, names: list[str]) -> dict:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = set(admin.list_topics())
        found = [n for n in names if n in existing]
        return {t["name"]: len(t["partitions"]) for t in admin.describe_topics(found)} if found else {}
    finally:
        admin.close()


def feed(bootstrap: str, topics: Topics, partitions: int) -> list:
    docs = corpus.generate(40, seed=11)
    produce(bootstrap, topics.raw, [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode())
                                    for d in docs], partition_of=lambda n: n % partitions)
    return docs


def test_missing_output_topics_stop_the_start_by_default(kafka, tmp_path):
    topics = only_input(kafka, 1)
    feed(kafka, topics, 1)
    result = run_worker(tmp_path / "state", topics, kafka)
    stderr = result.stderr.decode()
    assert result.returncode != 0 and "Traceback" not in stderr
    assert f"output topic '{topics.clean}' does not exist" in stderr and "output.create_topics = true" in stderr
    outputs = [topics.clean, topics.duplicates, topics.dead_letter]
    assert partition_counts(kafka, outputs) == {}


def test_create_topics_makes_the_outputs_with_the_inputs_partitions(kafka, tmp_path):
    topics = only_input(kafka, 3)
    docs = feed(kafka, topics, 3)
    result = run_worker(tmp_path / "state", topics, kafka, "--set", "output.create_topics=true",
                        "--set", "output.replication_factor=1")
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "created_topics" in stderr and "partitions=3" in stderr
    outputs = [topics.clean, topics.duplicates, topics.dead_letter]
    assert partition_counts(kafka, outputs) == {name: 3 for name in outputs}
    found = outcomes(kafka, topics)
    assert len(found) == len(docs) and all(len(v) == 1 for v in found.values())
    again = run_worker(tmp_path / "state", topics, kafka, "--set", "output.create_topics=true")
    assert again.returncode == 0 and "created_topics" not in again.stderr.decode()


def test_create_topics_takes_the_brokers_default_replication(kafka, tmp_path):
    topics = only_input(kafka, 2)
    feed(kafka, topics, 2)
    result = run_worker(tmp_path / "state", topics, kafka, "--set", "output.create_topics=true",
                        "--set", 'output.duplicates_topic=""')
    assert result.returncode == 0, result.stderr.decode()
    assert partition_counts(kafka, [topics.clean, topics.duplicates, topics.dead_letter]) == \
        {topics.clean: 2, topics.dead_letter: 2}


def test_a_refused_topic_stops_the_start_with_the_brokers_reason(kafka, tmp_path):
    topics = only_input(kafka, 1)
    result = run_worker(tmp_path / "state", topics, kafka, "--set", "output.create_topics=true",
                        "--set", "output.replication_factor=3")  # one broker
    stderr = result.stderr.decode()
    assert result.returncode != 0 and "Traceback" not in stderr
    assert "cannot create the output topics" in stderr and "InvalidReplicationFactor" in stderr
    assert "output.replication_factor" in stderr


@pytest.mark.system
def test_replication_factor_zero_is_refused():
    with pytest.raises(ConfigError, match="output.replication_factor must be -1"):
        config_module.load(None, ("output.replication_factor=0",), environ={})
    result = run_cli("run", "--set", "output.replication_factor=-2", check=False)
    assert result.returncode == 2 and b"replication_factor" in result.stderr
