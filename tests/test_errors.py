"""Every error met while reading, deciding and writing is sorted in one place: retried, or a message and exit."""

from __future__ import annotations

import pytest
from kafka import errors as kafka_errors

from streamdedup.errors import (
    BrokerError,
    BrokerUnavailableError,
    ConfigError,
    kafka_trouble,
)


def test_our_own_errors_keep_their_kind():
    waiting = BrokerUnavailableError("reading the input topics: KafkaConnectionError: 111 ECONNREFUSED")
    assert kafka_trouble(waiting) is waiting and waiting.retriable
    wrong = ConfigError("fix it")
    assert kafka_trouble(wrong) is wrong and not wrong.retriable


@pytest.mark.parametrize("error", [
    kafka_errors.KafkaConnectionError("111 ECONNREFUSED"), kafka_errors.UnknownTopicOrPartitionError(),
    kafka_errors.KafkaTimeoutError("waited"), kafka_errors.NotLeaderForPartitionError(),
    kafka_errors.IllegalStateError("closed"), kafka_errors.InvalidProducerEpochError(),
    kafka_errors.CorruptRecordError("a record no reader handled"), ConnectionResetError(104, "reset"),
])
def test_transient_errors_are_retried(error):
    trouble = kafka_trouble(error)
    assert isinstance(trouble, BrokerUnavailableError) and trouble.retriable


@pytest.mark.parametrize("error,advice", [
    (kafka_errors.ProducerFencedError(), "one worker per index"),
    (kafka_errors.TopicAuthorizationFailedError(), "ACLs in deploy/README.md"),
    (kafka_errors.TransactionalIdAuthorizationFailedError(), "ACLs in deploy/README.md"),
    (kafka_errors.MessageSizeTooLargeError(), "reads the limits at start"),
    (kafka_errors.SaslAuthenticationFailedError(), "kafka.sasl_"),
    (kafka_errors.KafkaConfigurationError("bad"), "[kafka] section"),
])
def test_errors_waiting_cannot_cure_stop_the_worker_with_what_to_do(error, advice):
    trouble = kafka_trouble(error)
    assert type(trouble) is BrokerError and not trouble.retriable
    assert advice in str(trouble)


def test_anything_else_is_a_bug_and_rises_as_it_is():
    assert kafka_trouble(TypeError("All headers items must be (str, bytes) tuples")) is None


@pytest.mark.system
def test_the_version_is_the_packages():
    from importlib.metadata import version

    from conftest import run_cli

    result = run_cli("--version")
    assert result.stdout.decode().strip() == f"streamdedup {version('streamdedup')}"
