"""The access check and the ACL messages without a broker: what a server that is not a Kafka broker gets.

The real cases (TLS, SASL logins, ACLs on a real broker) are in test_secure_kafka.py.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from kafka import errors as kafka_errors

from streamdedup.errors import BrokerError, BrokerUnavailableError, ConfigError
from streamdedup.runtime.access import _servers, check_access
from streamdedup.runtime.rights import Right, Rights


class FakeServer:
    """A local TCP server that does one thing with every connection: ``hang`` (say nothing) or ``close``."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.behaviour == "close":
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        """Stop accepting (shutdown wakes the blocked accept), wait for the thread, then close what it holds."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(timeout=10)
        for conn in self.held:
            conn.close()


@pytest.fixture
def server(request):
    made = FakeServer(request.param)
    yield made
    made.close()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def test_nothing_listening_is_a_broker_to_wait_for():
    with pytest.raises(BrokerUnavailableError, match="no bootstrap server accepts a connection"):
        check_access({"bootstrap_servers": [f"127.0.0.1:{free_port()}"]}, timeout_s=1)


@pytest.mark.parametrize("server", ["hang"], indirect=True)
@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_SSL"])
def test_a_server_that_says_nothing_is_waited_for_no_longer_than_the_limit(server, protocol):
    began = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as raised:
        check_access({"bootstrap_servers": [f"127.0.0.1:{server.port}"], "security_protocol": protocol,
                      "sasl_mechanism": "PLAIN", "sasl_plain_username": "u", "sasl_plain_password": "secret-pw"},
                     timeout_s=0.5)
    assert time.monotonic() - began < 10  # one bounded wait, not kafka-python's retries
    assert "secret-pw" not in str(raised.value)


@pytest.mark.parametrize("server", ["close"], indirect=True)
def test_a_server_that_closes_at_once_and_speaks_no_tls_is_a_broker_to_wait_for(server):
    with pytest.raises(BrokerUnavailableError, match="closed the connection without answering"):
        check_access({"bootstrap_servers": [f"127.0.0.1:{server.port}"]}, timeout_s=1)


@pytest.mark.parametrize("server", ["hang"], indirect=True)
def test_an_unreadable_ca_file_is_a_configuration_error(server, tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="kafka.ssl_cafile"):
        check_access({"bootstrap_servers": [f"127.0.0.1:{server.port}"], "security_protocol": "SSL",
                      "ssl_cafile": str(bad)}, timeout_s=1)


@pytest.mark.parametrize("given, expected", [
    (["127.0.0.1:9093"], [("127.0.0.1", 9093)]),
    ("a:1, b:2", [("a", 1), ("b", 2)]),
    (["broker"], [("broker", 9092)]),
    (["[::1]:9093"], [("::1", 9093)]),
])
def test_bootstrap_servers_are_read_as_kafka_python_reads_them(given, expected):
    assert _servers(given) == expected


def rights() -> Rights:
    return Rights.of({"sasl_plain_username": "crawler"}, ["raw"], ["clean", "dups", ""], "g", "txn-1")


def test_the_needed_rights_are_read_write_describeconfigs_group_and_transactional_id():
    assert rights().needed() == [
        Right("Read", "topic", "raw"),
        Right("Write", "topic", "clean"), Right("DescribeConfigs", "topic", "clean"),
        Right("Write", "topic", "dups"), Right("DescribeConfigs", "topic", "dups"),
        Right("Read", "group", "g"), Right("Write", "transactional-id", "txn-1"),
    ]


@pytest.mark.parametrize("error, grant, command", [
    (kafka_errors.TopicAuthorizationFailedError({"clean"}), "WRITE on topic 'clean'", "--operation Write --topic clean"),
    (kafka_errors.TopicAuthorizationFailedError({"raw"}), "READ on topic 'raw'", "--operation Read --topic raw"),
    (kafka_errors.GroupAuthorizationFailedError("g"), "READ on group 'g'", "--operation Read --group g"),
    (kafka_errors.TransactionalIdAuthorizationFailedError(), "WRITE on transactional-id 'txn-1'",
     "--operation Write --transactional-id txn-1"),
    (kafka_errors.ClusterAuthorizationFailedError(), "IDEMPOTENT_WRITE on the cluster",
     "--operation IdempotentWrite --cluster"),
])
def test_a_refusal_names_the_right_and_the_command_that_grants_it(error, grant, command):
    message = str(rights().explain(error))
    assert message.startswith("the broker refused: ")
    assert f"grant {grant} to the worker's principal User:crawler" in message
    assert f"--allow-principal User:crawler {command}" in message


def test_a_topic_refusal_that_names_no_topic_lists_every_topic_it_may_be():
    message = str(rights().explain(kafka_errors.TopicAuthorizationFailedError()))
    assert "a topic the broker did not name" in message
    assert all(f"--topic {t}" in message for t in ("raw", "clean", "dups"))


def test_other_errors_are_not_refusals():
    assert rights().explain(kafka_errors.NotLeaderForPartitionError()) is None
    assert rights().explain(BrokerError("x")) is None


def test_a_principal_without_sasl_user_is_named_for_what_it_is():
    assert Rights.of({}, ["raw"], [], "g", None).principal == "User:<the worker's principal>"
