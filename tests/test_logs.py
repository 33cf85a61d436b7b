"""Log lines, and kafka-python's own records routed into them."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from streamdedup import cli
from streamdedup import config as config_module
from streamdedup.ops.logs import LibraryLogs, Log, route_library_logs

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture
def kafka_logger():
    """The "kafka" logger, put back as it was after the test."""
    logger = logging.getLogger("kafka")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved


def test_kafka_python_warnings_become_key_value_lines(kafka_logger):
    stream = io.StringIO()
    route_library_logs(Log("text", "info", stream))
    logging.getLogger("kafka.conn").warning("connect attempt to %s returned error %d", "127.0.0.1:9", 111)
    logging.getLogger("kafka.client").info("bootstrap succeeded")  # below WARNING: not forwarded
    assert re.fullmatch(
        STAMP + r' warning kafka_client logger="kafka\.conn" message="connect attempt to 127\.0\.0\.1:9 returned '
        r'error 111"\n', stream.getvalue())


def test_a_coordinator_that_moved_is_routine_and_logged_as_info(kafka_logger):
    stream = io.StringIO()
    route_library_logs(Log("text", "info", stream))
    coordinator = logging.getLogger("kafka.coordinator")
    coordinator.warning("Marking the coordinator dead (node %s) for group %s: %s.", "coordinator-1", "g",
                        "[Error 16] NotCoordinatorError")
    coordinator.warning("Heartbeat failed: %s", "[Error 25] UnknownMemberIdError")
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["info", "warning"], lines
    route_library_logs(Log("text", "warning", quiet := io.StringIO()))
    coordinator.warning("Marking the coordinator dead (node 1) for group g: [Error 15] CoordinatorNotAvailableError.")
    assert quiet.getvalue() == ""


def test_kafka_python_errors_become_json_lines_with_the_exception(kafka_logger):
    stream = io.StringIO()
    route_library_logs(Log("json", "info", stream))
    try:
        raise ConnectionResetError("peer went away")
    except ConnectionResetError:
        logging.getLogger("kafka.producer.sender").exception("send failed")
    line = json.loads(stream.getvalue())
    assert {k: v for k, v in line.items() if k != "time"} == {
        "level": "error", "event": "kafka_client", "logger": "kafka.producer.sender", "message": "send failed",
        "error": "ConnectionResetError: peer went away"}


def test_routing_again_replaces_the_earlier_routing_and_other_loggers_are_left_alone(kafka_logger):
    first, second = io.StringIO(), io.StringIO()
    route_library_logs(Log("text", "info", first))
    route_library_logs(Log("text", "info", second))
    logging.getLogger("kafka.x").warning("once")
    logging.getLogger("elsewhere").warning("not ours")
    assert first.getvalue() == "" and second.getvalue().count("\n") == 1


def test_the_worker_commands_log_installs_the_routing(kafka_logger):
    log = cli._log(config_module.load(None, ("log.format=json",), environ={}))
    ours = [h for h in kafka_logger.handlers if isinstance(h, LibraryLogs)]
    assert len(ours) == 1 and ours[0].log is log and log.fmt == "json"
