"""No record and no broker hiccup stops the worker for good (issue 18), against a real Apache Kafka broker.

Each input here once stopped the worker at every restart: a null header
value, a header key that is not UTF-8, a kept record larger than the clean
topic takes; and a worker with no broker to talk to waited forever.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest
from conftest import run_cli
from kafka_helpers import (
    RawHeaderKey,
    Topics,
    create_topics,
    header,
    outcomes,
    produce_raw,
    run_worker,
    wait_for_line,
)

from streamdedup.config import Config
from streamdedup.core.decode import text_limit_for_output

KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1048588  # Kafka's default max.message.bytes


def good(n: int) -> tuple:
    text = f"good document number {n} " + " ".join(f"word{n}x{i}" for i in range(30))
    return f"g{n}".encode(), json.dumps({"id": f"good-{n}", "text": text}).encode(), [("origin", b"test")]


def one_outcome_each(kafka: str, topics: Topics, count: int) -> dict:
    """Every input offset's single outcome: offset -> (topic kind, output record)."""
    found = outcomes(kafka, topics)
    assert sorted(found) == [(0, n) for n in range(count)], "an input has no outcome"
    assert {k: v for k, v in found.items() if len(v) != 1} == {}, "an input has more than one outcome"
    return {offset: v[0] for (_, offset), v in found.items()}


def test_a_null_header_value_is_kept_empty_and_named_in_a_marker_header(kafka, tmp_path):
    records = [
        good(0),
        (b"k", b'{"id":"k","text":"a few words"}', [("h", None), ("x", b"1")]),
        (b"bad", b"{nope", [("h", None)]),
        (None, None, [("h", None)]),  # a tombstone without a key: kafka-python refuses to send one as it is
        good(1),
    ]
    topics = Topics.fresh(kafka)
    produce_raw(kafka, topics.raw, records)
    result = run_worker(tmp_path / "state", topics, kafka, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    found = one_outcome_each(kafka, topics, len(records))
    kind, kept = found[1]
    assert kind == "clean" and kept.key == b"k" and kept.value == records[1][1]
    assert [(k, v) for k, v in kept.headers if not k.startswith("streamdedup.") or k.endswith("null-header")] == [
        ("h", b""), ("x", b"1"), ("streamdedup.null-header", b"h")]
    kind, rejected = found[2]
    assert kind == "dead_letter" and header(rejected, "streamdedup.reason") == b"invalid_json"
    assert header(rejected, "h") == b"" and header(rejected, "streamdedup.null-header") == b"h"
    kind, tombstone = found[3]
    assert kind == "dead_letter" and header(tombstone, "streamdedup.reason") == b"tombstone"
    assert (tombstone.key, tombstone.value) == (None, b"")
    assert [found[n][0] for n in (0, 4)] == ["clean", "clean"]
    again = run_worker(tmp_path / "state", topics, kafka, timeout=120)
    assert again.returncode == 0, again.stderr.decode()
    assert one_outcome_each(kafka, topics, len(records)).keys() == found.keys()


@pytest.mark.parametrize("prepare_processes", [1, 0])  # read in the feed process, or in the worker's thread
def test_a_header_key_that_is_not_utf8_is_rejected_with_its_bytes_and_read_past(kafka, tmp_path, prepare_processes):
    unreadable = [(RawHeaderKey(b"\xff\xfe"), b"v")]
    records = [good(0), (b"b", b'{"id":"b","text":"other words here"}', unreadable), good(1),
               (b"c", b'{"id":"c","text":"and more words"}', unreadable), (None, b"{}", unreadable), good(2)]
    topics = Topics.fresh(kafka)
    produce_raw(kafka, topics.raw, records)
    state = tmp_path / "state"
    setting = ("--set", f"worker.prepare_processes={prepare_processes}")
    crashed = run_worker(state, topics, kafka, *setting, env={"STREAMDEDUP_TEST_CRASH_AT": "kafka-committed"},
                         timeout=120)
    assert crashed.returncode == 137, crashed.stderr.decode()  # Kafka has the batch, the index does not
    result = run_worker(state, topics, kafka, *setting, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert b"replayed_unindexed_batch" in result.stderr
    found = one_outcome_each(kafka, topics, len(records))
    for offset in (1, 3, 4):
        kind, message = found[offset]
        assert kind == "dead_letter"
        assert header(message, "streamdedup.reason") == b"invalid_header"
        assert b"not UTF-8" in header(message, "streamdedup.detail")
        assert (message.key, message.value) == records[offset][:2]
        assert [(k, v) for k, v in message.headers if "binary-header" in k] == [
            ("streamdedup.binary-header-key", b"\xff\xfe"), ("streamdedup.binary-header-value", b"v")]
    assert [found[n][0] for n in (0, 2, 5)] == ["clean", "clean", "clean"]
    assert run_cli("check", "--state", str(state)).returncode == 0


def test_a_kept_record_larger_than_the_clean_topic_takes_is_rejected_before_it_is_decided(kafka, tmp_path):
    """With the defaults on both sides (a clean topic of Kafka's default max.message.bytes, 1 MiB of text):
    the worker lowers the text limit to what the topic holds and says so; the largest text under it is kept
    and forwarded, one byte more is text_too_large, and a text under it whose record is still too large
    (JSON escapes make it three times its text) is too_large_for_output, all before anything is decided."""
    topics = Topics.fresh(kafka)
    tag = uuid.uuid4().hex[:10]
    topics.clean, topics.dead_letter = f"clean-default-{tag}", f"dead-default-{tag}"
    create_topics(kafka, [topics.clean, topics.dead_letter], 1, max_message_bytes=KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    limit = text_limit_for_output(Config().input.max_text_bytes, KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    assert limit == KAFKA_DEFAULT_MAX_MESSAGE_BYTES - (16 << 10)
    big = json.dumps({"id": "big", "text": "\u00e9" * 300000}).encode()  # 600,000 bytes of text, 1.8 MB escaped
    fits = json.dumps({"id": "fits", "text": "x" * limit}).encode()
    over = json.dumps({"id": "over", "text": "y" * (limit + 1)}).encode()
    records = [good(0), (b"big", big, []), (b"fits", fits, []), (b"over", over, []), good(1)]
    produce_raw(kafka, topics.raw, records)
    began = time.monotonic()
    result = run_worker(tmp_path / "state", topics, kafka, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert time.monotonic() - began < 60
    assert b"broker_lost" not in result.stderr
    assert f"text_limit_from_output max_text_bytes={limit} configured=1048576".encode() in result.stderr
    found = one_outcome_each(kafka, topics, len(records))
    kind, message = found[1]
    assert kind == "dead_letter"
    assert header(message, "streamdedup.reason") == b"too_large_for_output"
    assert b"max.message.bytes 1048588" in header(message, "streamdedup.detail")
    assert int(header(message, "streamdedup.original-bytes")) == len(big)
    assert big.startswith(message.value) and len(message.value) == 1000000  # output.dead_letter_max_bytes
    kind, message = found[2]
    assert kind == "clean" and message.value == fits
    kind, message = found[3]
    assert kind == "dead_letter" and header(message, "streamdedup.reason") == b"text_too_large"
    assert [found[n][0] for n in (0, 4)] == ["clean", "clean"]
    stats = json.loads(run_cli("stats", "--json", "--state", str(tmp_path / "state")).stdout)
    assert stats["documents"] == 3  # the rejected were never decided: the index has no kept document it lacks


def test_a_dead_letter_is_cut_to_fit_its_topic_key_and_headers_included(kafka, tmp_path):
    topics = Topics.fresh(kafka)
    topics.dead_letter = f"dead-small-{uuid.uuid4().hex[:10]}"
    create_topics(kafka, [topics.dead_letter], 1, max_message_bytes=100_000)
    records = [(b"k" * 50_000, b"{not json" + b"x" * 200_000, []),  # the value is cut to what the key leaves
               (b"k" * 200_000, b"{not json either", []),  # the key alone is too large: key and headers go
               good(0)]
    produce_raw(kafka, topics.raw, records)
    result = run_worker(tmp_path / "state", topics, kafka, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    found = one_outcome_each(kafka, topics, len(records))
    kind, cut = found[0]
    assert kind == "dead_letter" and cut.key == records[0][0]
    assert records[0][1].startswith(cut.value) and 40_000 < len(cut.value) < 50_000
    assert int(header(cut, "streamdedup.original-bytes")) == len(records[0][1])
    kind, bare = found[1]
    assert kind == "dead_letter" and (bare.key, bare.value) == (None, b"")
    assert header(bare, "streamdedup.dropped") == b"key,headers"
    assert header(bare, "streamdedup.reason") == b"invalid_json"
    assert found[2][0] == "clean"


@pytest.mark.system
def test_with_until_caught_up_an_unreachable_broker_stops_the_worker_after_the_timeout(tmp_path):
    topics = Topics("raw", "clean", "dups", "dead")
    began = time.monotonic()
    result = subprocess.run(
        [*_command(tmp_path, topics, "127.0.0.1:9"), "--set", "worker.unreachable_timeout_s=5", "--until-caught-up"],
        capture_output=True, timeout=120)
    assert result.returncode == 1, result.stderr.decode()
    assert time.monotonic() - began < 60
    assert b"broker_lost" in result.stderr
    assert b"no broker answered" in result.stderr and b"worker.unreachable_timeout_s" in result.stderr


def test_an_open_transaction_holding_the_groups_offsets_is_waited_out_with_backoff(kafka, tmp_path):
    """Another producer's transaction holds offsets of the worker's group: the broker answers UNSTABLE_OFFSET_COMMIT.

    The worker's start-up read of the committed offsets gives up after
    ``worker.kafka_timeout_s`` and the session starts again with backoff,
    logging what it waits for (it once retried forever, ten times a second,
    silently); once that transaction ends, the worker decides everything.
    """
    from kafka import KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topics = Topics.fresh(kafka)
    produce_raw(kafka, topics.raw, [good(n) for n in range(20)])
    foreign = KafkaProducer(bootstrap_servers=kafka, transactional_id=f"foreign-{uuid.uuid4().hex[:8]}")
    worker = None
    try:
        foreign.init_transactions()
        foreign.begin_transaction()
        foreign.send_offsets_to_transaction({TopicPartition(topics.raw, 0): OffsetAndMetadata(5, "", -1)},
                                            f"group-{topics.raw}")
        worker = subprocess.Popen([*_command(tmp_path, topics, kafka), "--set", "worker.kafka_timeout_s=2",
                                   "--set", "worker.unreachable_timeout_s=0", "--until-caught-up"],
                                  stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        lost = wait_for_line(worker, b"broker_lost", timeout=60)
        assert b"KafkaTimeoutError" in lost, lost
        assert worker.poll() is None
        foreign.abort_transaction()
        _, errors = worker.communicate(timeout=180)
        assert worker.returncode == 0, errors.decode()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        foreign.close()
    assert [kind for _, (kind, _) in sorted(one_outcome_each(kafka, topics, 20).items())] == ["clean"] * 20


def _command(tmp_path, topics: Topics, bootstrap: str) -> list[str]:
    from kafka_helpers import worker_command

    return worker_command(tmp_path / "state", topics, bootstrap)
