"""The main job on the embedded default: the sample crawl through the live worker on a local broker.

1. start a local Apache Kafka broker (deploy/kafka/start.sh), unless
   KAFKA_BOOTSTRAP names one already running;
2. create the input topic (names unique to this run); the worker creates its output
   topics (``output.create_topics``, one replica on the one local broker);
3. feed the generated sample crawl into the input topic;
4. run the worker (``streamdedup run --until-caught-up``) against a fresh index;
5. print a summary, read back from the output topics;
6. stop the broker it started.

Run: ``make demo`` (or ``python deploy/demo.py`` inside the virtualenv).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streamdedup.core import corpus

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "demo"
PARTITIONS = 3


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    broker_env = dict(os.environ, KAFKA_DATA_DIR=str(WORK / "kafka"))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    started_here = bootstrap is None
    if started_here:
        print("starting a local Apache Kafka broker (deploy/kafka/start.sh) ...", flush=True)
        started = subprocess.run([str(ROOT / "deploy/kafka/start.sh")], env=broker_env, capture_output=True,
                                 text=True)
        if started.returncode != 0:
            print(started.stdout + started.stderr, file=sys.stderr)
            return 1
        bootstrap = started.stdout.strip().splitlines()[-1]
    try:
        return demo(bootstrap)
    finally:
        if started_here:
            subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), "--wipe"], env=broker_env, capture_output=True)
            print("broker stopped")


def demo(bootstrap: str) -> int:
    tag = uuid.uuid4().hex[:8]
    topics = {"raw": f"raw-{tag}", "clean": f"clean-{tag}", "duplicates": f"duplicates-{tag}",
              "dead_letter": f"dead-letter-{tag}"}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topics["raw"], PARTITIONS, 1)])  # the worker creates its output topics
    admin.close()

    documents = corpus.generate(650, seed=42)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    for doc in documents:
        producer.send(topics["raw"], key=doc.id.encode(), value=json.dumps({"id": doc.id, "text": doc.text}).encode())
    producer.send(topics["raw"], key=b"broken", value=b"{this is not json")  # one bad record, to show the dead letters
    producer.flush()
    producer.close()
    print(f"fed {len(documents) + 1:,} records (the sample crawl and one malformed record) into {topics['raw']} "
          f"({PARTITIONS} partitions) on {bootstrap}", flush=True)

    command = [sys.executable, "-m", "streamdedup", "run", "--until-caught-up", "--config", str(ROOT / "config.toml"),
               "--state", str(WORK / "state"), "--set", f"kafka.bootstrap_servers={bootstrap}",
               "--set", f"input.topics={topics['raw']}", "--set", f"output.clean_topic={topics['clean']}",
               "--set", f"output.duplicates_topic={topics['duplicates']}",
               "--set", f"output.dead_letter_topic={topics['dead_letter']}", "--set", f"kafka.group_id=demo-{tag}",
               "--set", "output.create_topics=true", "--set", "output.replication_factor=1"]
    began = time.monotonic()
    worker = subprocess.run(command)
    seconds = time.monotonic() - began
    if worker.returncode != 0:
        return worker.returncode
    counts = {k: count_records(bootstrap, topics[k]) for k in ("clean", "duplicates", "dead_letter")}
    total = sum(counts.values())
    print()
    print(f"summary (read back from the output topics, read_committed)")
    print(f"  records     {total:>7,}   ({total / seconds:,.0f} records/s, worker start to caught up: {seconds:.1f} s)")
    print(f"  kept        {counts['clean']:>7,}   -> {topics['clean']}")
    print(f"  duplicates  {counts['duplicates']:>7,}   -> {topics['duplicates']}")
    print(f"  rejected    {counts['dead_letter']:>7,}   -> {topics['dead_letter']}")
    print(f"  index       {WORK / 'state'}  (try: .venv/bin/streamdedup stats --state {WORK / 'state'})")
    return 0


def count_records(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        count = 0
        while any(consumer.position(p) < ends[p] for p in partitions):
            count += sum(len(v) for v in consumer.poll(timeout_ms=500).values())
        return count
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main())
