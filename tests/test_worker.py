"""The Kafka worker against a real Apache Kafka broker: outputs, bad input, backfill, one writer, stop."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import msgpack
import pytest
from conftest import read_jsonl, run_cli, spawned
from kafka_helpers import (
    Topics,
    header,
    outcomes,
    produce,
    read_all,
    run_worker,
    wait_for_line,
    worker_command,
)

from streamdedup.core import corpus


def crawl_records(docs):
    return [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode(), [("origin", b"crawler")])
            for d in docs]


def test_clean_duplicates_and_headers_on_a_three_partition_topic(kafka, tmp_path):
    from kafka.partitioner.default import murmur2

    docs = corpus.generate(200, seed=8)
    topics = Topics.fresh(kafka, partitions=3, output_partitions=3)
    records = crawl_records(docs)
    produce(kafka, topics.raw, records, partition_of=lambda n: n % 3)
    result = run_worker(tmp_path / "state", topics, kafka)
    assert result.returncode == 0, result.stderr.decode()
    found = outcomes(kafka, topics)
    assert sorted(found) == sorted((n % 3, n // 3) for n in range(len(docs)))
    assert all(len(v) == 1 for v in found.values())
    by_value = {r[1]: r for r in records}
    kinds = {kind for v in found.values() for kind, _ in v}
    assert kinds == {"clean", "duplicates"}
    for (partition, offset), [(kind, message)] in found.items():
        assert message.partition == (murmur2(message.key) & 0x7FFFFFFF) % 3  # Kafka's default partitioner
        if kind == "clean":
            original = by_value[message.value]
            assert message.key == original[0]
            assert header(message, "origin") == b"crawler"
            assert header(message, "streamdedup.id") == original[0]
            assert header(message, "streamdedup.cluster") == original[0]
        else:
            body = json.loads(message.value)
            assert set(body) == {"id", "cluster", "matched", "similarity", "exact", "source", "relation", "containment"}
            assert body["similarity"] >= 0.7
            assert body["source"] == {"topic": topics.raw, "partition": partition, "offset": offset}
    assert run_cli("check", "--state", str(tmp_path / "state")).returncode == 0


@pytest.mark.parametrize("prepare_processes", [1, 0])  # the feed in a second process, or in the worker's thread
def test_offline_and_live_keep_the_same_documents(kafka, tmp_path, crawl, crawl_file, prepare_processes):
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crawl_records(crawl))
    result = run_worker(tmp_path / "live", topics, kafka, "--set", f"worker.prepare_processes={prepare_processes}")
    assert result.returncode == 0, result.stderr.decode()
    run_cli("dedup", str(crawl_file), "--state", str(tmp_path / "offline"), "--decisions",
            str(tmp_path / "decisions.jsonl"))
    offline_kept = [d["id"] for d in read_jsonl(tmp_path / "decisions.jsonl") if d["status"] == "kept"]
    live_kept = [json.loads(m.value)["id"] for m in read_all(kafka, topics.clean)]
    assert live_kept == offline_kept
    assert len(live_kept) > 800


def test_bad_records_on_the_wire_each_land_once_in_the_dead_letter_topic(kafka, tmp_path):
    good = lambda n: json.dumps({"id": f"good-{n}", "text": f"good document number {n} " + "words " * 30 + str(n)})
    bad = [
        (b"k1", b"{not json", "invalid_json"),
        (b"k2", b"[1, 2, 3]", "not_an_object"),
        (b"k3", b'{"id": "m"}', "missing_text"),
        (b"k4", b'{"id": "n", "text": 12}', "text_not_string"),
        (b"k5", b'{"id": "e", "text": "  "}', "empty_text"),
        (b"k6", b"\xff\xfe\x00 not utf-8", "invalid_utf8"),
        (b"k7", None, "tombstone"),
        (b"k8", json.dumps({"id": "huge", "text": "x" * (10 << 20)}).encode(), "too_large"),
        (b"\xff\xfe binary key", good("key").encode(), "invalid_key"),
        (b"k10", msgpack.packb({"id": "mp", "text": "msgpack where json is expected"}), "invalid_utf8"),
    ]
    records = []
    for n, (key, value, _) in enumerate(bad):
        records.append((f"g{n}".encode(), good(n).encode()))
        records.append((key, value))
    records.append((b"last", good("last").encode()))
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    result = run_worker(tmp_path / "state", topics, kafka)
    assert result.returncode == 0, result.stderr.decode()
    found = outcomes(kafka, topics)
    assert sorted(found) == [(0, n) for n in range(len(records))]
    assert all(len(v) == 1 for v in found.values())
    for n, (key, value, reason) in enumerate(bad):
        offset = 2 * n + 1
        [(kind, message)] = found[(0, offset)]
        assert kind == "dead_letter"
        assert header(message, "streamdedup.reason").decode() == reason
        assert message.key == key
        if reason == "too_large":
            assert int(header(message, "streamdedup.original-bytes")) == len(value)
            assert value.startswith(message.value) and len(message.value) == 1000000
        else:
            assert message.value == value
        [(good_kind, _)] = found[(0, offset - 1)]
        assert good_kind == "clean"
    assert found[(0, len(records) - 1)][0][0] == "clean"


def test_a_second_worker_on_the_same_index_is_refused_at_once(kafka, tmp_path):
    topics = Topics.fresh(kafka)
    with spawned(worker_command(tmp_path / "state", topics, kafka), stderr=subprocess.PIPE) as first:
        try:
            wait_for_line(first, b"assigned")
            began = time.monotonic()
            second = run_worker(tmp_path / "state", topics, kafka, until_caught_up=False, timeout=30)
            assert time.monotonic() - began < 10
            assert second.returncode == 1
            assert b"already open for writing" in second.stderr
        finally:
            first.send_signal(signal.SIGTERM)
            first.wait(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_stop_commits_and_exits_zero_quickly(kafka, tmp_path, sig):
    docs = corpus.generate(3000, seed=21)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crawl_records(docs))
    state = tmp_path / "state"
    command = worker_command(state, topics, kafka, "--set", "worker.batch_size=200")
    with spawned(command, stderr=subprocess.PIPE) as process:
        wait_for_line(process, b"info batch")
        process.send_signal(sig)
        began = time.monotonic()
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - began < 5
    stopped_early = sum(len(v) for v in outcomes(kafka, topics).values())
    assert 0 < stopped_early < len(docs)
    assert run_worker(state, topics, kafka).returncode == 0
    found = outcomes(kafka, topics)
    assert sorted(found) == [(0, n) for n in range(len(docs))]
    assert all(len(v) == 1 for v in found.values())


def test_backfill_twice_emits_nothing_new_and_index_only_emits_nothing(kafka, tmp_path):
    docs = corpus.generate(300, seed=4)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crawl_records(docs))
    state = str(tmp_path / "state")
    args = ["backfill", "--topic", topics.raw, "--from-beginning", "--state", state, *topics.settings(kafka)]
    first = run_cli(*args)
    emitted = sum(len(v) for v in outcomes(kafka, topics).values())
    assert emitted == len(docs)
    assert b"documents" in first.stdout
    second = run_cli(*args)
    assert sum(len(v) for v in outcomes(kafka, topics).values()) == emitted
    assert f"replayed   {len(docs):>10,}".encode() in second.stdout

    seeded = tmp_path / "seeded"
    quiet = Topics.fresh(kafka)
    produce(kafka, quiet.raw, crawl_records(docs))
    run_cli("backfill", "--topic", quiet.raw, "--from-beginning", "--index-only", "--state", str(seeded),
            *quiet.settings(kafka))
    assert outcomes(kafka, quiet) == {}
    stats = json.loads(run_cli("stats", "--json", "--state", str(seeded)).stdout)
    assert stats["documents"] == len(docs)
    # the live worker then recognizes every document as already decided: nothing is emitted twice
    assert run_worker(seeded, quiet, kafka).returncode == 0
    assert outcomes(kafka, quiet) == {}


def test_backfill_from_a_timestamp_starts_there(kafka, tmp_path):
    docs = corpus.generate(100, seed=9)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crawl_records(docs[:50]))
    time.sleep(1.5)
    cut = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 0.5))
    produce(kafka, topics.raw, crawl_records(docs[50:]))
    result = run_cli("backfill", "--topic", topics.raw, "--from-timestamp", cut, "--index-only",
                     "--state", str(tmp_path / "s"), *topics.settings(kafka))
    assert f"documents  {len(docs) - 50:>10,}".encode() in result.stdout


def test_kafka_python_uses_the_native_crc32c_checksum():
    from kafka.record import util

    assert util.crc32c_c is not None, "the crc32c package is missing: kafka-python would be several times slower"
    assert util._crc32c is util.crc32c_c


@pytest.mark.parametrize("fmt", ["msgpack", "text"])
def test_msgpack_and_plain_text_inputs(kafka, tmp_path, fmt):
    docs = corpus.generate(40, seed=6)
    if fmt == "msgpack":
        records = [(None, msgpack.packb({"doc": {"url": d.id}, "body": d.text})) for d in docs]
        extra = ["--set", "input.format=msgpack", "--set", "input.id_field=doc.url", "--set", "input.text_field=body"]
    else:
        records = [(d.id.encode(), d.text.encode()) for d in docs]
        extra = ["--set", "input.format=text"]
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, records)
    assert run_worker(tmp_path / "state", topics, kafka, *extra).returncode == 0
    clean = read_all(kafka, topics.clean)
    assert {header(m, "streamdedup.id").decode() for m in clean} <= {d.id for d in docs}
    assert len(clean) + len(read_all(kafka, topics.duplicates)) == len(docs)
    assert read_all(kafka, topics.dead_letter) == []


def test_metrics_and_health_of_a_running_worker(kafka, tmp_path):
    import re
    import urllib.request

    from test_metrics import parse_exposition

    from streamdedup.ops.telemetry import METRIC_NAMES

    docs = corpus.generate(150, seed=31)
    topics = Topics.fresh(kafka, partitions=2)
    records = crawl_records(docs) + [(b"bad", b"{nope"), (b"tomb", None)]
    produce(kafka, topics.raw, records, partition_of=lambda n: n % 2)
    with spawned(worker_command(tmp_path / "state", topics, kafka), stderr=subprocess.PIPE) as worker:
        try:
            started = wait_for_line(worker, b"started")
            url = re.search(rb'metrics="(http://[^"]+)"', started).group(1).decode()
            deadline = time.monotonic() + 60
            while True:
                families = parse_exposition(urllib.request.urlopen(url, timeout=5).read().decode())
                documents = _by_label(families, "streamdedup_documents_total", "outcome")
                lag = _by_label(families, "streamdedup_consumer_lag_records", "partition")
                if (sum(documents.values()) >= len(records) and _value(families, "streamdedup_ready") == 1
                        and lag == {"0": 0, "1": 0}):  # the lag is asked of the broker after a batch is counted
                    break
                assert time.monotonic() < deadline, (documents, lag)
                time.sleep(0.3)
            assert set(METRIC_NAMES) <= set(families)
            assert sum(documents.values()) == len(records)
            assert documents["rejected"] == 2 and documents["kept"] > 100
            assert _by_label(families, "streamdedup_rejected_total", "reason") == {"invalid_json": 1, "tombstone": 1}
            assert _value(families, "streamdedup_index_documents") == len(docs)
            assert _value(families, "streamdedup_index_bytes") > 0
            counts = {name: value for name, labels, value in families["streamdedup_batch_duration_seconds"]["samples"]}
            assert counts["streamdedup_batch_duration_seconds_count"] >= 1
            base = url.rsplit("/", 1)[0]
            assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
            assert urllib.request.urlopen(base + "/readyz", timeout=5).status == 200
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)


def _by_label(families, name, label):
    return {labels[label]: value for _, labels, value in families[name]["samples"]}


def _value(families, name):
    [(_, _, value)] = families[name]["samples"]
    return value


def test_json_logs_and_secrets_stay_out_of_logs_and_stats(kafka, tmp_path):
    docs = corpus.generate(30, seed=2)
    topics = Topics.fresh(kafka)
    produce(kafka, topics.raw, crawl_records(docs))
    result = run_worker(tmp_path / "state", topics, kafka, "--set", "log.format=json",
                        env={"STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD": "hunter2-secret"})
    assert result.returncode == 0, result.stderr.decode()
    events = [json.loads(line) for line in result.stderr.decode().splitlines()]
    ours = [e["event"] for e in events if e["event"] != "kafka_client"]  # the client's own warnings come any time
    assert ours[:2] == ["started", "assigned"]
    assert {"batch", "caught_up", "stopped"} <= {e["event"] for e in events}
    assert all({"time", "level", "event"} <= set(e) for e in events)
    assert b"hunter2" not in result.stderr
    stats = run_cli("stats", "--json", "--state", str(tmp_path / "state"),
                    env={"STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD": "hunter2-secret"})
    assert b"hunter2" not in stats.stdout
