"""Talking to the test broker: topics, producing inputs, reading outputs, running the worker."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streamdedup.core import corpus

from deploy.demo import read_topic, stop_processes  # noqa: F401 (the tests import stop_processes from here)

ROOT = Path(__file__).resolve().parent.parent
BIG = 16 << 20  # 16 MiB: room for the 10 MB test record


@dataclass
class Topics:
    """The topic names of one test, unique so tests never see each other's records."""

    raw: str
    clean: str
    duplicates: str
    dead_letter: str

    @classmethod
    def fresh(cls, bootstrap: str, partitions: int = 1, output_partitions: int = 1,
              client: dict | None = None) -> "Topics":
        """``client``: kafka-python settings for a broker that wants more than an address (TLS, SASL)."""
        tag = uuid.uuid4().hex[:10]
        topics = cls(f"raw-{tag}", f"clean-{tag}", f"dups-{tag}", f"dead-{tag}")
        create_topics(bootstrap, [topics.raw], partitions, client=client)
        create_topics(bootstrap, [topics.clean, topics.duplicates, topics.dead_letter], output_partitions,
                      client=client)
        return topics

    @property
    def outputs(self) -> list[str]:
        return [self.clean, self.duplicates, self.dead_letter]

    def settings(self, bootstrap: str) -> list[str]:
        """--set flags pointing the worker at these topics and this broker."""
        return [
            "--set", f"kafka.bootstrap_servers={bootstrap}",
            "--set", f"input.topics={self.raw}",
            "--set", f"output.clean_topic={self.clean}",
            "--set", f"output.duplicates_topic={self.duplicates}",
            "--set", f"output.dead_letter_topic={self.dead_letter}",
            "--set", f"kafka.group_id=group-{self.raw}",
            "--set", "metrics.address=127.0.0.1:0",
        ]


def create_topics(bootstrap: str, names: list[str], partitions: int, max_message_bytes: int = BIG,
                  client: dict | None = None) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
    try:
        admin.create_topics([NewTopic(n, partitions, 1, topic_configs={"max.message.bytes": str(max_message_bytes)})
                             for n in names])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, records: list[tuple], partition_of=None, client: dict | None = None) -> None:
    """Send (key, value[, headers]) records in order and wait for all of them."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=BIG, linger_ms=20,
                             batch_size=1 << 20, acks="all", **(client or {}))
    try:
        for n, record in enumerate(records):
            key, value = record[0], record[1]
            headers = record[2] if len(record) > 2 else None
            partition = partition_of(n) if partition_of else None
            producer.send(topic, key=key, value=value, headers=headers, partition=partition)
        producer.flush()
    finally:
        producer.close()


def read_all(bootstrap: str, topic: str, committed_only: bool = True, client: dict | None = None) -> list:
    """Every record of a topic, partition by partition, in offset order."""
    return read_topic(bootstrap, topic, client, committed_only)


def worker_command(state: Path, topics: Topics, bootstrap: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "streamdedup", "run", "--state", str(state), *topics.settings(bootstrap),
            "--set", "log.summary_interval_s=0", *extra]


def run_worker(state: Path, topics: Topics, bootstrap: str, *extra: str, env: dict | None = None,
               until_caught_up: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    args = worker_command(state, topics, bootstrap, *extra)
    if until_caught_up:
        args.append("--until-caught-up")
    return subprocess.run(args, capture_output=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def header(message, name: str):
    for key, value in message.headers or ():
        if key == name:
            return value
    return None


def outcomes(bootstrap: str, topics: Topics, client: dict | None = None) -> dict:
    """Every input (partition, offset) -> list of (topic kind, output record) that names it."""
    found: dict = {}
    for kind, topic in (("clean", topics.clean), ("duplicates", topics.duplicates),
                        ("dead_letter", topics.dead_letter)):
        for message in read_all(bootstrap, topic, client=client):
            source = header(message, "streamdedup.source").decode()
            name, partition, offset = source.rsplit("/", 2)
            assert name == topics.raw
            found.setdefault((int(partition), int(offset)), []).append((kind, message))
    return found


def outcomes_out(bootstrap: str, topics: Topics) -> int:
    """How many outcomes (committed) the output topics hold."""
    return sum(len(outs) for outs in outcomes(bootstrap, topics).values())


class RawHeaderKey(str):
    """A header key written as the given bytes, UTF-8 or not (kafka-python's producer encodes str keys)."""

    def __new__(cls, raw: bytes):
        made = super().__new__(cls, raw.decode("latin-1"))
        made.raw = raw
        return made

    def encode(self, *args, **kwargs) -> bytes:
        return self.raw


class _WireHeaders(list):
    """Headers for the accumulator: false, so ``ProducerBatch.try_append`` skips its size hint (it cannot count None)."""

    def __bool__(self) -> bool:
        return False


def produce_raw(bootstrap: str, topic: str, records: list[tuple], partition: int = 0) -> None:
    """Send (key, value, headers) records as other clients may: null header values, header keys not UTF-8.

    ``KafkaProducer.send`` accepts only (str, bytes) headers, but its record
    batch builder writes a null header value (and any bytes of a
    ``RawHeaderKey``) as the wire format allows; this hands the records to
    the producer's accumulator directly, behind ``send``'s check.
    """
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=BIG, acks="all")
    try:
        producer.partitions_for(topic)
        for key, value, headers in records:
            producer._accumulator.append(TopicPartition(topic, partition), None, key, value, _WireHeaders(headers))
        producer.flush()
    finally:
        producer.close()


def wait_for_line(process: subprocess.Popen, needle: bytes, timeout: float = 60) -> bytes:
    """The first line of the process's stderr holding ``needle`` (it logs one event a line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if needle in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"the worker never logged {needle!r}")


def sharded_records(articles=220, seed=11, replays=30):
    """The synthetic crawl, with replays of ``replays`` records, as many exact copies under new ids and a rejected
    record."""
    rng = random.Random(seed)
    docs = [(d.id, d.text) for d in corpus.generate(articles, seed=seed)]
    extra = []
    for doc_id, text in rng.sample(docs, replays):
        extra += [(doc_id, text), (doc_id + "-copy", text)]
    stream = docs + extra
    rng.shuffle(stream)
    records = [(doc_id.encode(), json.dumps({"id": doc_id, "text": text, "url": None}).encode())
               for doc_id, text in stream]
    return records + [(b"bad", b"{not json")]


def sharded_topics(kafka, raw: str) -> Topics:
    """Fresh output topics for a sharded deployment reading the input topic ``raw``."""
    tag = uuid.uuid4().hex[:10]
    topics = Topics(raw, f"clean-{tag}", f"dups-{tag}", f"dead-{tag}")
    create_topics(kafka, topics.outputs, 1)
    return topics


def role_command(topics: Topics, kafka: str, count: int, tag: str, *extra: str, command: str = "run") -> list[str]:
    """``streamdedup run`` (or ``command``) of a sharded deployment named ``tag`` (its group and internal topics),
    ``count`` vshards."""
    return [sys.executable, "-m", "streamdedup", command, *topics.settings(kafka),
            "--set", f"kafka.group_id=sharded-{tag}", "--set", f"shards.count={count}",
            "--set", f"shards.signed_topic=signed-{tag}", "--set", f"shards.evidence_topic=evidence-{tag}",
            "--set", "log.summary_interval_s=0", *extra]


def outcome_summary(found: dict) -> dict:
    """Input (partition, offset) -> what came out for it: kind, cluster, matched, similarity, exact."""
    summary = {}
    for where, outs in found.items():
        assert len(outs) == 1, f"{where}: {len(outs)} outcomes"
        kind, message = outs[0]
        if kind == "clean":
            summary[where] = (kind, header(message, "streamdedup.cluster").decode())
        elif kind == "duplicates":
            body = json.loads(message.value)
            summary[where] = (kind, body["cluster"], body["matched"], body["similarity"], body["exact"])
        else:
            summary[where] = (kind,)
    return summary


def single_worker_summary(records: list[tuple], settings=()) -> dict:
    """What the single worker makes of ``records`` produced in order to one partition (``outcome_summary``),
    decided here in process: a decision is a function of the input order and the settings alone, so the
    sharded tests share this one baseline instead of running a worker through the broker for it. A replay
    emits nothing. ``settings``: the ``--set`` flags the deployment runs with."""
    return single_worker_run(records, settings)[0]


def single_worker_run(records: list[tuple], settings=()) -> tuple[dict, dict]:
    """``single_worker_summary`` and what its index holds at the end (``held_decisions``)."""
    import tempfile

    from streamdedup import config as config_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.core.prepare import prepare_raw, raw_payload
    from streamdedup.core.records import RawRecord, Source
    from streamdedup.engine.engine import Engine

    cfg = config_module.load(None, [s for s in settings if s != "--set"], environ={})
    spec = InputSpec.from_section(cfg.input)
    raw = [RawRecord(record[1], Source("raw", 0, n), record[0]) for n, record in enumerate(records)]
    summary = {}
    with tempfile.TemporaryDirectory(prefix="single-worker-") as state, Engine(cfg, state) as engine:
        for start in range(0, len(raw), cfg.worker.batch_size):
            batch = raw[start:start + cfg.worker.batch_size]
            for record, d in zip(batch, engine.decide_batch(prepare_raw(raw_payload(batch), spec, engine.signing))):
                where = (0, record.source.offset)
                if d.replayed:
                    continue
                if d.status == "kept":
                    summary[where] = ("clean", d.cluster)
                elif d.status == "duplicate":
                    similarity = None if d.similarity is None else round(d.similarity, 6)
                    summary[where] = ("duplicates", d.cluster, d.matched, similarity, d.exact)
                else:
                    summary[where] = ("dead_letter",)
        with engine.index.read() as txn:
            held = held_decisions(txn.records())
    return summary, held


def held_decisions(records) -> dict:
    """Input (partition, offset) -> what an index or the vshards' states hold of the document read there: id,
    kept, its cluster and the document it matched (each as where it was read, so stores that numbered the
    order differently compare), similarity, exact, content."""
    records = list(records)
    read_at = {r.serial: tuple(r.source[1:]) for r in records}
    return {tuple(r.source[1:]): (r.id, r.kept, read_at.get(r.cluster), r.cluster_id,
                                  None if r.matched is None else read_at.get(r.matched), r.matched_id,
                                  None if r.similarity is None else round(r.similarity, 6), r.exact, r.content)
            for r in records}


def vshard_decisions(folder: Path, count: int, settings=()) -> dict:
    """``held_decisions`` of the states of vshards 0 .. ``count`` - 1 in ``folder`` (``vshard-N``), read after
    their processes ended; ``settings``: the ``--set`` flags the deployment ran with."""
    from streamdedup import config as config_module
    from streamdedup.core.signing import signing_config
    from streamdedup.engine.settings import DedupSettings
    from streamdedup.engine.vshards import VShard

    cfg = config_module.load(None, [s for s in settings if s != "--set"], environ={})
    dedup = DedupSettings.of(cfg, signing_config(cfg))
    records = []
    for number in range(count):
        vshard = VShard(number, count, dedup, path=str(folder / f"vshard-{number}"))
        try:
            records += vshard.state.records()
        finally:
            vshard.close()
    return held_decisions(records)


def wait_for_outcomes(kafka, topics, expected: int, processes, timeout=240, check=None) -> dict:
    """Every outcome once at least ``expected`` are out; fails if a process ended badly or time ran out.
    ``check``: called while waiting instead of looking at ``processes`` (``Deployment.check_running``)."""
    deadline = time.monotonic() + timeout
    while True:
        found = outcomes(kafka, topics)
        if sum(len(v) for v in found.values()) >= expected:
            return found
        if check is not None:
            check()
        for process in processes:
            if process.poll() not in (None, 0):
                raise AssertionError(process.stderr.read().decode()[-3000:] if process.stderr else
                                     f"{process.args[-8:]} exited {process.returncode} (its log is a file)")
        if time.monotonic() > deadline:
            raise AssertionError(f"{sum(len(v) for v in found.values())} of {expected} outcomes after {timeout} s")
        time.sleep(1)


class Deployment:
    """The processes of a deployment under chaos, by name, each restartable, logging to its own file in
    ``folder`` (appended); what happens to them is said in ``chaos_log`` (with the time) so a run can be read
    and replayed. A process started with a crash switch (``crash_at``) ends by itself at that step with 137:
    ``check_running`` starts it again, without the switch, and counts the step in ``crashed_at``."""

    def __init__(self, commands: dict[str, list[str]], folder: Path, chaos_log):
        self.commands = commands
        self.folder = folder
        self.chaos_log = chaos_log
        self.processes: dict[str, subprocess.Popen] = {}
        self.armed: dict[str, str] = {}  # name -> the step its crash switch names
        self.crashed_at: list[str] = []  # steps processes died at by their switches
        self.began = time.monotonic()

    def say(self, what: str) -> None:
        line = f"{time.monotonic() - self.began:7.2f}s {what}"
        print(line)
        self.chaos_log.write(line + "\n")
        self.chaos_log.flush()

    def log_of(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def start(self, name: str, crash_at: str = "", env: dict | None = None) -> None:
        """Start ``name``; ``crash_at``: a ``STREAMDEDUP_TEST_CRASH_AT`` switch; ``env``: more variables."""
        extra = dict(env or {}, **({"STREAMDEDUP_TEST_CRASH_AT": crash_at} if crash_at else {}))
        with open(self.folder / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(self.commands[name], stdout=subprocess.DEVNULL, stderr=log,
                                                    env=dict(os.environ, **extra))
        self.armed.pop(name, None)
        if crash_at:
            self.armed[name] = crash_at
        self.say(f"started {name} (pid {self.processes[name].pid})" + (f", to crash at {crash_at}" if crash_at else "")
                 + (f", with {env}" if env else ""))

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` (one that has just crashed at its step is left as it is)."""
        process = self.processes[name]
        if self._crashed_by_switch(name):
            return
        ended = process.poll()
        assert ended is None, f"{name} ended by itself with {ended}: see {self.folder / (name + '.log')}"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        self.armed.pop(name, None)
        self.say(f"killed {name} (pid {process.pid})")

    def _crashed_by_switch(self, name: str) -> bool:
        """Whether ``name`` ended at the step its crash switch names (then counted in ``crashed_at``)."""
        if self.processes[name].poll() != 137 or name not in self.armed:
            return False
        step = self.armed.pop(name)
        self.crashed_at.append(step)
        self.say(f"{name} crashed at {step}")
        return True

    def send_signal(self, name: str, sig: int) -> None:
        os.kill(self.processes[name].pid, sig)
        self.say(f"sent {signal.Signals(sig).name} to {name} (pid {self.processes[name].pid})")

    def remove(self, name: str) -> None:
        """Stop ``name`` as an operator does (SIGTERM; it must end cleanly) and keep it stopped."""
        process = self.processes.pop(name)
        process.terminate()
        assert process.wait(timeout=60) == 0, f"{name} ended with {process.returncode}:\n{self.log_of(name)[-3000:]}"
        self.say(f"removed {name} (pid {process.pid})")

    def running(self) -> list[str]:
        return sorted(name for name, process in self.processes.items() if process.poll() is None)

    def check_running(self) -> None:
        """Fail if a process ended other than by its crash switch; start those that did again."""
        for name, process in sorted(self.processes.items()):
            if self._crashed_by_switch(name):
                self.start(name)
            else:
                assert process.poll() is None, f"{name} ended with {process.returncode}:\n{self.log_of(name)[-3000:]}"

    def settled_outcomes(self, bootstrap: str, topics: Topics, expected: int, timeout: float = 300) -> dict:
        """Every outcome, read again a few seconds after at least ``expected`` are out (a second outcome of a
        record would show by then), the processes kept running (``check_running``) meanwhile."""
        wait_for_outcomes(bootstrap, topics, expected, [], timeout=timeout, check=self.check_running)
        self.say("every outcome out")
        time.sleep(3)
        return outcomes(bootstrap, topics)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)  # a paused one must hear the stop
        stop_processes(list(self.processes.values()))
