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

``--secure``: the same on a broker that demands TLS and SASL and grants nothing
without an ACL (``deploy/kafka/start.sh --secure``, on ``KAFKA_PORT`` or 19192;
or the one at KAFKA_SECURE_BOOTSTRAP, with its secrets folder in
KAFKA_SECURE_DIR). The admin creates the topics and grants the worker's user
exactly the ACLs deploy/README.md lists; the worker logs in as that user with
SASL/SCRAM-SHA-512 over TLS, its password read from a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streamdedup.core import corpus

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("DEMO_DIR", ROOT / "build" / "demo"))  # emptied at start
PARTITIONS = 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the sample crawl through the live worker on a local broker")
    parser.add_argument("--secure", action="store_true",
                        help="a broker with TLS, SASL/SCRAM-SHA-512 and ACLs (deploy/kafka/start.sh --secure)")
    secure = parser.parse_args(argv).secure
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    broker_env = dict(os.environ, KAFKA_DATA_DIR=str(WORK / "kafka"))
    if secure:
        broker_env.update(KAFKA_SECURE="1", KAFKA_PORT=os.environ.get("KAFKA_PORT", "19192"))
    bootstrap = os.environ.get("KAFKA_SECURE_BOOTSTRAP" if secure else "KAFKA_BOOTSTRAP")
    secrets = Path(os.environ["KAFKA_SECURE_DIR"]) if secure and bootstrap else WORK / "kafka" / "secure"
    started_here = bootstrap is None
    if started_here:
        bootstrap = start_local_broker(broker_env, secure)
        if bootstrap is None:
            return 1
    try:
        return demo(bootstrap, SecureLogin(secrets) if secure else None)
    finally:
        if started_here:
            stop_local_broker(broker_env)


def start_local_broker(broker_env: dict, secure: bool = False):
    """Start a broker with deploy/kafka/start.sh in ``broker_env``; its bootstrap address, or None (told why)."""
    print(f"starting a local Apache Kafka broker (deploy/kafka/start.sh{' --secure' if secure else ''}) ...",
          flush=True)
    started = subprocess.run([str(ROOT / "deploy/kafka/start.sh")], env=broker_env, capture_output=True, text=True)
    if started.returncode != 0:
        print(started.stdout + started.stderr, file=sys.stderr)
        return None
    return started.stdout.strip().splitlines()[-1]


def stop_local_broker(broker_env: dict) -> None:
    """Stop the broker start_local_broker started, and wipe its data."""
    subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), "--wipe"], env=broker_env, capture_output=True)
    print("broker stopped")


class SecureLogin:
    """The users of a broker started by deploy/kafka/start.sh --secure: "admin" (super user) and "streamdedup"."""

    USER = "streamdedup"

    def __init__(self, secrets: Path):
        self.secrets = secrets

    def admin(self) -> dict:
        """kafka-python settings of the admin."""
        return {"security_protocol": "SASL_SSL", "ssl_cafile": str(self.secrets / "ca.pem"),
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "admin",
                "sasl_plain_password": (self.secrets / "admin.password").read_text().strip()}

    def worker_flags(self) -> list[str]:
        """The worker's --set flags: the user, its password file, the CA to trust."""
        return ["--set", "kafka.security_protocol=SASL_SSL", "--set", "kafka.sasl_mechanism=SCRAM-SHA-512",
                "--set", f"kafka.sasl_plain_username={self.USER}",
                "--set", f"kafka.sasl_plain_password_file={self.secrets / (self.USER + '.password')}",
                "--set", f"kafka.ssl_cafile={self.secrets / 'ca.pem'}"]

    def grant_worker(self, bootstrap: str, topics: dict, group: str, transactional_id: str) -> None:
        """The ACLs deploy/README.md lists for the worker, and no others."""
        from kafka.admin import ACL, ACLOperation, ACLPermissionType, ResourcePattern, ResourceType

        def allow(operation, kind, name):
            return ACL(f"User:{self.USER}", "*", operation, ACLPermissionType.ALLOW, ResourcePattern(kind, name))

        acls = [allow(ACLOperation.READ, ResourceType.TOPIC, topics["raw"]),
                allow(ACLOperation.READ, ResourceType.GROUP, group),
                allow(ACLOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)]
        acls += [allow(operation, ResourceType.TOPIC, topics[k]) for k in ("clean", "duplicates", "dead_letter")
                 for operation in (ACLOperation.WRITE, ACLOperation.DESCRIBE_CONFIGS)]
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **self.admin())
        try:
            failed = admin.create_acls(acls)["failed"]
            if failed:
                raise RuntimeError(f"granting the worker's ACLs failed: {failed}")
        finally:
            admin.close()


def demo(bootstrap: str, login: SecureLogin | None = None) -> int:
    tag = uuid.uuid4().hex[:8]
    topics = {"raw": f"raw-{tag}", "clean": f"clean-{tag}", "duplicates": f"duplicates-{tag}",
              "dead_letter": f"dead-letter-{tag}"}
    client = login.admin() if login else {}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **client)
    made = [NewTopic(topics["raw"], PARTITIONS, 1)]
    if login:  # least privilege: the worker's user may not create topics, the admin makes its outputs
        made += [NewTopic(topics[k], 1, 1) for k in ("clean", "duplicates", "dead_letter")]
    admin.create_topics(made)  # else the worker creates its output topics
    admin.close()
    group, transactional_id = f"demo-{tag}", f"demo-{tag}"
    if login:
        login.grant_worker(bootstrap, topics, group, transactional_id)
        print(f"granted the worker's user {login.USER!r} the ACLs of deploy/README.md (and nothing else)")

    fed = feed_sample(bootstrap, topics["raw"], client)
    print(f"fed {fed:,} records (the sample crawl and one malformed record) into {topics['raw']} "
          f"({PARTITIONS} partitions) on {bootstrap}", flush=True)

    command = [sys.executable, "-m", "streamdedup", "run", "--until-caught-up", "--config", str(ROOT / "config.toml"),
               "--state", str(WORK / "state"), "--set", f"kafka.bootstrap_servers={bootstrap}",
               "--set", f"input.topics={topics['raw']}", "--set", f"output.clean_topic={topics['clean']}",
               "--set", f"output.duplicates_topic={topics['duplicates']}",
               "--set", f"output.dead_letter_topic={topics['dead_letter']}", "--set", f"kafka.group_id={group}",
               "--set", f"worker.transactional_id={transactional_id}",
               *(login.worker_flags() if login else
                 ["--set", "output.create_topics=true", "--set", "output.replication_factor=1"])]
    began = time.monotonic()
    worker = subprocess.run(command)
    seconds = time.monotonic() - began
    if worker.returncode != 0:
        return worker.returncode
    counts = {k: len(read_topic(bootstrap, topics[k], client)) for k in ("clean", "duplicates", "dead_letter")}
    total = sum(counts.values())
    print()
    print(f"summary (read back from the output topics, read_committed"
          f"{'; the worker logged in as ' + repr(login.USER) + ' with SCRAM-SHA-512 over TLS' if login else ''})")
    print(f"  records     {total:>7,}   ({total / seconds:,.0f} records/s, worker start to caught up: {seconds:.1f} s)")
    print(f"  kept        {counts['clean']:>7,}   -> {topics['clean']}")
    print(f"  duplicates  {counts['duplicates']:>7,}   -> {topics['duplicates']}")
    print(f"  rejected    {counts['dead_letter']:>7,}   -> {topics['dead_letter']}")
    print(f"  index       {WORK / 'state'}  (try: .venv/bin/streamdedup stats --state {WORK / 'state'})")
    return 0


def feed_sample(bootstrap: str, topic: str, client: dict) -> int:
    """Send the sample crawl (``corpus.generate(650, seed=42)``) and one malformed record; returns how many."""
    documents = corpus.generate(650, seed=42)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all", **client)
    for doc in documents:
        producer.send(topic, key=doc.id.encode(), value=json.dumps({"id": doc.id, "text": doc.text}).encode())
    producer.send(topic, key=b"broken", value=b"{this is not json")  # one bad record, to show the dead letters
    producer.flush()
    producer.close()
    return len(documents) + 1


def read_topic(bootstrap: str, topic: str, client: dict | None = None, committed_only: bool = True,
               timeout: float = 120) -> list:
    """Every record of a topic (committed ones only, unless not ``committed_only``), partition by partition,
    in offset order; the demos, the benchmarks and the tests read their topics back with it."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level="read_committed" if committed_only else "read_uncommitted",
                             max_partition_fetch_bytes=64 << 20, fetch_max_bytes=128 << 20, **(client or {}))
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(p) < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read {topic} to its end in {timeout:.0f} s")
            for messages in consumer.poll(timeout_ms=500).values():
                records += messages
        records.sort(key=lambda m: (m.partition, m.offset))
        return records
    finally:
        consumer.close()


def stop_processes(processes) -> None:
    """SIGTERM each process still running, wait for all (SIGKILL after a minute), close their stderr pipes."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


if __name__ == "__main__":
    sys.exit(main())
