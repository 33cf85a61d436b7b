"""A sharded deployment on the real broker: signing processes and shards decide as one worker does, once each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from kafka_helpers import (
    Topics,
    create_topics,
    header,
    outcome_summary,
    outcomes,
    produce,
    role_command,
    run_worker,
    sharded_records,
    sharded_topics,
    single_worker_summary,
    stop_processes,
    wait_for_outcomes,
)

from streamdedup.core import corpus
from streamdedup.errors import BrokerUnavailableError, IndexUnusableError
from streamdedup.runtime.shards.shard import ValuesBoard
from streamdedup.runtime.source import KafkaSource
from streamdedup.runtime.worker import Stopper

pytestmark = pytest.mark.kafka

OFF = ["--set", "templates.enabled=false"]


@pytest.mark.parametrize("settings", [[], ["--set", "excerpts.enabled=true"]], ids=["defaults", "excerpts"])
def test_three_shards_and_two_signers_decide_as_one_worker(kafka, tmp_path, settings):
    """Pages of sites with templates (the sample crawl without templates is ``make demo-sharded``, below)."""
    records = sharded_records(web=True)
    expected = single_worker_summary(records, settings)
    assert len(expected) == len(records) - 30  # a replayed record emits nothing

    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    produce(kafka, topics.raw, records)
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
    places = {where: tuple(map(int, header(outs[0][1], "streamdedup.order").split(b"/")))
              for where, outs in found.items()}
    assert len(set(places.values())) == len(places)  # each outcome's own place in the decision order
    in_order = sorted(places, key=places.get)
    assert in_order == sorted(places)  # one input partition: the decision order is the input's


def test_a_shard_refuses_the_wrong_shard_number_with_what_to_do(kafka, tmp_path):
    topics = sharded_topics(kafka, Topics.fresh(kafka).raw)
    command = role_command(topics, kafka, 3, "refuse", "--role", "shard", "--shard", "3",
                            "--state", str(tmp_path / "s"), "--until-caught-up")
    result = subprocess.run(command, capture_output=True, timeout=120, env=dict(os.environ))
    assert result.returncode != 0
    assert b"--shard N, 0 to 2" in result.stderr


def test_forgetting_in_the_middle_of_the_stream_decides_as_one_worker(kafka, tmp_path):
    """The forget order goes through the signed topic; later copies of forgotten texts are decided alike."""
    records = sharded_records(web=False, articles=150, seed=3)
    half = len(records) // 2
    ids = sorted({json.loads(v)["id"] for _, v in records[:half] if v.startswith(b"{")})[:25] + ["nobody"]
    single = Topics.fresh(kafka)
    produce(kafka, single.raw, records[:half])
    assert run_worker(tmp_path / "single", single, kafka).returncode == 0
    subprocess.run([sys.executable, "-m", "streamdedup", "forget", *ids, "--state", str(tmp_path / "single")],
                   check=True, capture_output=True)
    produce(kafka, single.raw, records[half:])
    assert run_worker(tmp_path / "single", single, kafka).returncode == 0
    expected = outcome_summary(outcomes(kafka, single))

    sharded = sharded_topics(kafka, Topics.fresh(kafka).raw)
    tag = uuid.uuid4().hex[:8]
    shards = [subprocess.Popen(role_command(sharded, kafka, 3, tag, "--role", "shard", "--shard", str(n),
                                             "--state", str(tmp_path / f"shard-{n}")),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for n in range(3)]
    signer = [role_command(sharded, kafka, 3, tag, "--role", "sign", "--until-idle", "4")]
    try:
        produce(kafka, sharded.raw, records[:half])
        signing = subprocess.Popen(signer[0], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        first = wait_for_outcomes(kafka, sharded, sum(1 for where in expected if where[1] < half), shards + [signing])
        assert signing.wait(timeout=60) == 0
        signing.stderr.close()
        queued = subprocess.run(role_command(sharded, kafka, 3, tag, *ids, command="forget"), capture_output=True,
                                timeout=60)
        assert queued.returncode == 0 and b"queued" in queued.stdout, queued.stderr.decode()
        produce(kafka, sharded.raw, records[half:])
        signing = subprocess.Popen(signer[0], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_outcomes(kafka, sharded, len(expected), shards + [signing])
        signing.wait(timeout=60)
        signing.stderr.close()
        time.sleep(2)
        got = outcome_summary(outcomes(kafka, sharded))
    finally:
        stop_processes(shards)
    assert len(first) > 0
    assert got == expected


def _agreement(texts_in_order: list[str], statuses: list[str]) -> float:
    """The share of documents whose status is the exact greedy reference's, taken in this order."""
    from test_accuracy import exact_reference

    reference = exact_reference(texts_in_order)
    return sum(r[0] == s for r, s in zip(reference, statuses)) / len(statuses)


def test_three_input_partitions_decisions_record_their_order_and_agree_with_the_exact_greedy(kafka, tmp_path):
    """Several partitions: the order is the signed topic's; decisions match the exact greedy reference in it
    at least as well as the single worker's match it in the worker's own order."""
    from streamdedup.engine.engine import Engine
    from streamdedup import config as config_module

    docs = corpus.generate(300, seed=21)
    text_of = {(n % 3, n // 3): d.text for n, d in enumerate(docs)}
    records = [(d.id.encode(), json.dumps({"id": d.id, "text": d.text}).encode()) for d in docs]
    single = Topics.fresh(kafka, partitions=3)
    produce(kafka, single.raw, records, partition_of=lambda n: n % 3)
    assert run_worker(tmp_path / "single", single, kafka, *OFF).returncode == 0
    cfg = config_module.load(None, ("templates.enabled=false",), environ={})
    with Engine(cfg, str(tmp_path / "single"), readonly=True) as engine, engine.index.read() as txn:
        decided = sorted(txn.records(), key=lambda r: r.serial)
    single_order = [(r.source[1], r.source[2]) for r in decided]
    single_status = ["kept" if r.kept else "duplicate" for r in decided]

    topics = sharded_topics(kafka, single.raw)
    tag = uuid.uuid4().hex[:8]
    processes = [subprocess.Popen(role_command(topics, kafka, 3, tag, "--role", "shard", "--shard", str(n),
                                                "--state", str(tmp_path / f"shard-{n}"), *OFF),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for n in range(3)]
    processes += [subprocess.Popen(role_command(topics, kafka, 3, tag, "--role", "sign", "--until-idle", "6",
                                                 "--set", "worker.batch_size=50", *OFF),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        found = wait_for_outcomes(kafka, topics, len(records), processes)
    finally:
        stop_processes(processes)
    place = {where: tuple(map(int, header(outs[0][1], "streamdedup.order").split(b"/")))
             for where, outs in found.items()}
    order = sorted(place, key=place.get)
    status = ["kept" if found[where][0][0] == "clean" else "duplicate" for where in order]
    sharded = _agreement([text_of[w] for w in order], status)
    alone = _agreement([text_of[w] for w in single_order], single_status)
    assert len(order) == len(records) and len(set(place.values())) == len(records)
    assert sharded >= alone - 1 / len(records) and sharded > 0.99, (sharded, alone)


def test_the_values_board_reads_a_named_message_in_any_order_and_refuses_one_the_topic_lost(kafka):
    """Signed batches name their values messages in any order (two signing processes): the board reads ahead,
    goes back, says what to do when retention deleted a message a batch still names, and gives up (the session
    starts again) on one that does not come."""
    from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

    topic = f"values-{uuid.uuid4().hex[:8]}"
    create_topics(kafka, [topic], 2)
    producer = KafkaProducer(bootstrap_servers=kafka, acks="all")
    for n in range(ValuesBoard.HELD + 10):
        producer.send(topic, partition=1, value=f"v{n}".encode())
    producer.flush()
    producer.close()

    def board() -> ValuesBoard:
        return ValuesBoard(KafkaSource([topic], {"bootstrap_servers": kafka}, None, 100), topic, 1,
                           lambda phase: None, Stopper(), timeout_s=2.0)

    values = board()
    try:
        for offset in [3, 1, 5, 0, ValuesBoard.HELD + 9, 2, 4]:  # ahead, back, ahead, back past what is held
            assert values.at(offset) == f"v{offset}".encode()
    finally:
        values.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka)
    try:
        admin.delete_records({TopicPartition(topic, 1): 2})
    finally:
        admin.close()
    values = board()
    try:
        assert values.at(2) == b"v2"
        with pytest.raises(IndexUnusableError, match="no longer holds.*retention must be at least the signed topic"):
            values.at(1)
        with pytest.raises(BrokerUnavailableError, match="named by a signed batch, did not come in 2 s"):
            values.at(ValuesBoard.HELD + 10)  # the next one, never sent
    finally:
        values.close()
