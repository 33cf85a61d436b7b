"""kafka-python's clients refreshing their cluster metadata at the pace they are given (runtime/fetch.py
``metadata_paced_as_configured``)."""

from __future__ import annotations

import time

from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector

from streamdedup.runtime.fetch import metadata_paced_as_configured


def _manager(**configs) -> KafkaConnectionManager:
    return KafkaConnectionManager(NetworkSelector(), bootstrap_servers="127.0.0.1:1", **configs)


def _wait_after_a_refresh_ms(manager: KafkaConnectionManager) -> float:
    """How long the cluster metadata would wait before the next refresh, one refresh having just been made."""
    cluster = manager.cluster
    cluster._last_refresh_ms = time.monotonic() * 1000
    cluster._need_update = True
    return cluster.ttl()


def test_a_client_given_a_retry_backoff_refreshes_its_metadata_at_that_pace():
    assert metadata_paced_as_configured()
    manager = _manager(retry_backoff_ms=20)
    assert manager.cluster.config["retry_backoff_ms"] == 20
    assert _wait_after_a_refresh_ms(manager) <= 20


def test_a_client_given_none_keeps_kafka_pythons_pace():
    assert metadata_paced_as_configured()
    manager = _manager()
    assert manager.cluster.config["retry_backoff_ms"] == 100
    assert 20 < _wait_after_a_refresh_ms(manager) <= 100


def test_installing_twice_wraps_once():
    assert metadata_paced_as_configured()
    installed = KafkaConnectionManager.__init__
    assert metadata_paced_as_configured()
    assert KafkaConnectionManager.__init__ is installed
