"""The deployment whose band tables are split by key, end to end on this machine, against the single worker in the
same run.

Every round, on the same pre-loaded input (the synthetic crawl, one partition, so the deployment's order is the
input's and its outcomes can be compared with the single worker's), each contender is started fresh (new
processes, states, topics and groups). Each round has an input topic of its own holding the corpus alone, so that
every round measures the same thing: in one topic for every round, the paced documents of the rounds before stayed
after the corpus, and the deployment's signing process signed them ahead while its hosts were still deciding the
corpus (about 0.13 s more of its CPU a round, on two cores), where the single worker stopped at the corpus's end:

- the single worker (``run --until-caught-up``), timed from its start until every record has its outcome in the
  output topics (read_committed), its CPU from ``getrusage(RUSAGE_CHILDREN)``;
- the deployment: ``--signers`` signing processes and ``--hosts`` processes hosting ``--vshards`` virtual shards
  (a consumer group gives each its share), timed from their start until every record has its outcome in the
  output topics (read_committed); each process's CPU read from /proc/PID/stat then.

Each is also started on an input of one record, timed to its outcome: its start-up (a deployment starts more
processes, which join a group and open their vshards; a long stream pays that once), which the figures "less
start-up" take off the whole run's, its CPU too. Then, per document: the CPU of each role, the bytes of each internal topic (order, records, exchange), the outcomes
compared record by record with the single worker's, and where the deployment's time goes (why it is slower or
faster), and the peak resident memory of each process (``VmHWM``: the single worker's deciding process; each
deployment process's at the end of its round, paced phase included). With ``--paced-rate``, the latency from a
record in to its outcome out (median, p99): documents fed at a steady rate well below capacity, each latency from
its input record's timestamp to its outcome's.

Every process starts from the package's bytecode, as an installed package does (``harness.compile_package``): with
an editable install and ``PYTHONDONTWRITEBYTECODE`` set every process would compile its modules from source, about
0.2 s of CPU each, which a deployment of three processes pays three times at its start.

Run: ``python -m bench.sharded`` (starts a broker with deploy/kafka on ``--port`` unless KAFKA_BOOTSTRAP is set).
Medians over ``--rounds``; the machine is shared and noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from bench import harness
from bench.live import local_broker
from deploy.demo import stop_processes
from streamdedup.core import corpus

TICKS = os.sysconf("SC_CLK_TCK")
KEYS = ["--set", "templates.enabled=false", "--set", "excerpts.enabled=false", "--set", 'lsh.cap="probes"']
KINDS = ("clean", "duplicates", "dead_letter")


def create(bootstrap: str, names: list[str], partitions: int = 1) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    admin.close()


def feed(bootstrap: str, topic: str, docs, rate: float = 0.0) -> None:
    """Send ``docs`` as JSON records, at ``rate`` documents a second (in tenths of a second) if given."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20, acks="all")
    chunk = max(int(rate / 10), 1) if rate else len(docs)
    began = time.monotonic()
    for start in range(0, len(docs), chunk):
        for d in docs[start:start + chunk]:
            producer.send(topic, key=d.id.encode(), value=json.dumps({"id": d.id, "text": d.text}).encode())
        producer.flush()
        if rate:
            time.sleep(max(0.0, began + (start + chunk) / rate - time.monotonic()))
    producer.close()


class Run:
    """One contender's topics, group and state folder, and the command of each of its roles."""

    def __init__(self, bootstrap: str, raw: str, work: Path, vshards: int, settings: tuple = ()):
        self.tag = uuid.uuid4().hex[:8]
        self.bootstrap, self.raw, self.work = bootstrap, raw, work
        self.outs = {kind: f"bench-{kind.replace('_', '-')}-{self.tag}" for kind in KINDS}
        create(bootstrap, list(self.outs.values()))
        self.shards = ["--set", f"shards.count={vshards}",
                       "--set", f"shards.signed_topic=order-{self.tag}",
                       "--set", f"shards.evidence_topic=exchange-{self.tag}",
                       *(arg for setting in settings for arg in ("--set", setting))]

    def command(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "streamdedup", "run", "--set", f"kafka.bootstrap_servers={self.bootstrap}",
                "--set", f"input.topics={self.raw}", "--set", f"output.clean_topic={self.outs['clean']}",
                "--set", f"output.duplicates_topic={self.outs['duplicates']}",
                "--set", f"output.dead_letter_topic={self.outs['dead_letter']}",
                "--set", f"kafka.group_id=bench-{self.tag}", "--set", f"worker.transactional_id=bench-{self.tag}",
                "--set", "metrics.enabled=false", "--set", "log.summary_interval_s=60", *KEYS, *extra]

    def role(self, role: str) -> list[str]:
        if role == "worker":
            return self.command("--state", str(self.work / f"single-{self.tag}"), "--until-caught-up")
        if role == "sign":
            return self.command("--role", "sign", *self.shards)
        return self.command("--role", "vshards", "--state", str(self.work / f"vshards-{self.tag}"), *self.shards)

    def outcomes(self) -> dict:
        """Input offset -> (kind, cluster, matched) of each outcome, and its timestamp (ms)."""
        found: dict = {}
        for kind, topic in self.outs.items():
            consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed",
                                     auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=3000)
            consumer.assign([TopicPartition(topic, 0)])
            for message in consumer:
                headers = dict(message.headers or ())
                offset = int(headers["streamdedup.source"].decode().rsplit("/", 1)[1])
                cluster = headers.get("streamdedup.cluster", b"").decode()
                found.setdefault(offset, []).append(((kind, cluster), message.timestamp))
            consumer.close()
        return found

    def counter(self) -> "OutcomeCounter":
        return OutcomeCounter(self.bootstrap, list(self.outs.values()))


class OutcomeCounter:
    """Outcomes committed so far in the output topics, read as they come (read_committed)."""

    def __init__(self, bootstrap: str, topics: list[str]):
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                      auto_offset_reset="earliest", enable_auto_commit=False)
        self.consumer.assign([TopicPartition(t, 0) for t in topics])
        self.count = 0

    def read(self) -> int:
        for messages in self.consumer.poll(timeout_ms=200, max_records=100000).values():
            self.count += len(messages)
        return self.count

    def close(self) -> None:
        self.consumer.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICKS


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (``VmHWM``), in MiB (0 once it has ended)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def listening_pid(port: int) -> int | None:
    """The process that listens on TCP ``port`` of this machine (the broker), if this user can see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
            except OSError:
                continue
    return None


class MachineCpu:
    """Where the machine's cores went between its start and ``spent()``: the broker's CPU, and the cores no process
    used (``/proc/stat``'s idle and iowait), both in cores over the wall time; the contender's own processes are
    counted by the caller."""

    def __init__(self, broker_pid: int | None):
        self.broker_pid = broker_pid
        self.began, self.idle, self.broker = time.monotonic(), self._idle_seconds(), self._broker_seconds()

    def spent(self) -> dict:
        seconds = time.monotonic() - self.began
        return {"broker": (self._broker_seconds() - self.broker) / seconds,
                "idle": (self._idle_seconds() - self.idle) / seconds}

    @staticmethod
    def _idle_seconds() -> float:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return (int(fields[4]) + int(fields[5])) / TICKS

    def _broker_seconds(self) -> float:
        try:
            return cpu_seconds(self.broker_pid) if self.broker_pid else 0.0
        except OSError:
            return 0.0


def single_round(bootstrap: str, raw: str, work: Path, expected: int, timeout: float,
                 broker_pid: int | None = None) -> dict:
    run = Run(bootstrap, raw, work, 1)
    cpu, began, machine = children_cpu(), time.monotonic(), MachineCpu(broker_pid)
    process = subprocess.Popen(run.role("worker"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seconds = watch(run, [process], began, expected, timeout, work)
        spent, rss = machine.spent(), peak_rss_mib(process.pid)
    finally:
        stop_processes([process])
    return {"seconds": seconds, "cpu": children_cpu() - cpu, "outcomes": run.outcomes(), "machine": spent,
            "rss": rss}


def watch(run: Run, processes: list, began: float, expected: int, timeout: float, work: Path) -> float:
    """Seconds from ``began`` until ``expected`` outcomes are committed."""
    counter = run.counter()
    try:
        while True:
            count = counter.read()
            now = time.monotonic() - began
            if count >= expected:
                return now
            if any(p.poll() not in (None, 0) for p in processes):
                raise RuntimeError(f"a process stopped: see {work}")
            if now > timeout:
                raise RuntimeError(f"not done after {timeout} s: see {work}")
    finally:
        counter.close()


class Deployment:
    """A deployment's processes, started: ``--hosts`` vshards hosts and ``--signers`` signing processes."""

    def __init__(self, run: Run, work: Path, args):
        self.run, self.work, self.args = run, work, args
        self.machine = MachineCpu(args.broker_pid)
        self.roles = ["vshards"] * args.hosts + ["sign"] * args.signers
        self.logs = [open(work / f"{role}-{n}-{run.tag}.log", "wb") for n, role in enumerate(self.roles)]
        self.began = time.monotonic()
        self.processes = [subprocess.Popen(run.role(role), stdout=subprocess.DEVNULL, stderr=log)
                          for role, log in zip(self.roles, self.logs)]

    def seconds_to(self, expected: int) -> float:
        return watch(self.run, self.processes, self.began, expected, self.args.timeout, self.work)

    def cpu(self) -> dict:
        """Each process's CPU seconds so far, by role and place ("vshards-0", ..., "sign-2")."""
        return {f"{role}-{n}": cpu_seconds(p.pid) for n, (role, p) in enumerate(zip(self.roles, self.processes))}

    def peak_rss(self) -> dict:
        """Each process's peak resident memory so far in MiB, by role and place."""
        return {f"{role}-{n}": peak_rss_mib(p.pid) for n, (role, p) in enumerate(zip(self.roles, self.processes))}

    def stop(self) -> None:
        stop_processes(self.processes)
        for log in self.logs:
            log.close()


def deployment_round(bootstrap: str, raw: str, work: Path, args, expected: int, number: int = 0) -> dict:
    run = Run(bootstrap, raw, work, args.vshards, args.deployment_set)
    deployment = Deployment(run, work, args)
    try:
        seconds = deployment.seconds_to(expected)
        cpu, spent = deployment.cpu(), deployment.machine.spent()
        paced = paced_latencies(run, bootstrap, raw, args, number) if args.paced_rate else []
        rss = deployment.peak_rss()
    finally:
        deployment.stop()
    return {"seconds": seconds, "cpu": cpu, "outcomes": run.outcomes(), "bytes": internal_bytes(run),
            "records": input_records(bootstrap, raw), "latency": paced, "machine": spent, "rss": rss}


def start_up_round(bootstrap: str, work: Path, args) -> dict:
    """Each contender on a fresh input of one record: the seconds from its start to that record's outcome, and
    the CPU it spent (the single worker's until it stopped; each process of the deployment's then)."""
    raw = f"bench-one-{uuid.uuid4().hex[:8]}"
    create(bootstrap, [raw])
    feed(bootstrap, raw, corpus.generate(1, seed=7)[:1])
    single = single_round(bootstrap, raw, work, 1, args.timeout)
    deployment = Deployment(Run(bootstrap, raw, work, args.vshards, args.deployment_set), work, args)
    try:
        return {"single": single["seconds"], "deployment": deployment.seconds_to(1),
                "cpu": {"worker": single["cpu"], **deployment.cpu()}}
    finally:
        deployment.stop()


@dataclass
class Paced:
    id: str
    text: str


def paced_latencies(run: Run, bootstrap: str, raw: str, args, number: int = 0) -> list[float]:
    """Seconds from each paced record's input timestamp to its outcome's. Each round's paced documents are its
    own (round ``number``), under ids of their own: the corpus's ids would make them new versions of its
    documents."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    tp = TopicPartition(raw, 0)
    first = consumer.end_offsets([tp])[tp]
    consumer.close()
    docs = [Paced(f"paced{number}-{d.id}", d.text)
            for d in corpus.generate(int(args.paced_rate * args.paced_seconds / 2), seed=99 + number)]
    feed(bootstrap, raw, docs, args.paced_rate)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = run.outcomes()
        if sum(1 for offset in found if offset >= first) >= len(docs):
            break
        time.sleep(0.5)
    stamps = input_timestamps(bootstrap, raw, first)
    return [(outs[0][1] - stamps[offset]) / 1000 for offset, outs in found.items() if offset >= first]


def input_timestamps(bootstrap: str, topic: str, first: int) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, first)
    stamps = {m.offset: m.timestamp for m in consumer}
    consumer.close()
    return stamps


def input_records(bootstrap: str, topic: str) -> int:
    """Records in the input topic: what the deployment's internal topics carry by the end of a round (the corpus,
    and this round's paced documents)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    tp = TopicPartition(topic, 0)
    count = consumer.end_offsets([tp])[tp]
    consumer.close()
    return count


def internal_bytes(run: Run) -> dict:
    """Key and value bytes written to each internal topic, every partition."""
    totals = {}
    for name, topic in (("order", f"order-{run.tag}"), ("records", f"order-{run.tag}-values"),
                        ("exchange", f"exchange-{run.tag}")):
        consumer = KafkaConsumer(bootstrap_servers=run.bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000,
                                 auto_offset_reset="earliest", fetch_max_bytes=64 << 20,
                                 max_partition_fetch_bytes=64 << 20)
        consumer.topics()  # the cluster's metadata, so that the topic's partitions are known
        partitions = consumer.partitions_for_topic(topic) or set()
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        totals[name] = sum(len(m.value or b"") + len(m.key or b"") for m in consumer)
        consumer.close()
    return totals


def agreement(single: dict, deployed: dict) -> tuple[int, int]:
    """(records whose one outcome is the single worker's, records)."""
    same = sum(1 for offset, outs in single.items()
               if len(deployed.get(offset, ())) == 1 and deployed[offset][0][0] == outs[0][0])
    return same, len(single)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=60000, help="documents of the synthetic crawl (about)")
    parser.add_argument("--vshards", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=2, help="processes hosting the vshards")
    parser.add_argument("--signers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paced-rate", type=float, default=1000.0, help="documents a second for the latency "
                        "phase (0: none)")
    parser.add_argument("--paced-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--port", default="30792")
    parser.add_argument("--deployment-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the deployment's processes alone (repeatable), e.g. shards.epoch_records=40000")
    parser.add_argument("--keep-logs", metavar="DIR", help="run every process at log level debug and move each "
                        "round's logs into DIR/round-N (the work folder goes at the end)")
    args = parser.parse_args(argv)
    harness.compile_package()
    if args.keep_logs:
        KEYS.extend(["--set", 'log.level="debug"'])
    with local_broker(args.port) as bootstrap, tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
        work = Path(tmp)
        args.broker_pid = listening_pid(int(bootstrap.rsplit(":", 1)[1]))
        docs = corpus.generate(args.docs // 2, seed=5)
        inputs = [round_input(bootstrap, docs) for _ in range(args.rounds)]
        print(f"{len(docs):,} documents of the synthetic crawl in an input topic of each round (1 partition); "
              f"deployment: {args.vshards} vshards in {args.hosts} processes, {args.signers} signing process(es); "
              f"{os.cpu_count()} cores", flush=True)
        singles, deployed, starts = [], [], []
        for n, raw in enumerate(inputs):
            singles.append(single_round(bootstrap, raw, work, len(docs), args.timeout, args.broker_pid))
            deployed.append(deployment_round(bootstrap, raw, work, args, len(docs), n))
            starts.append(start_up_round(bootstrap, work, args))
            print(f"round {n + 1}: single worker {singles[-1]['seconds']:.1f} s, deployment "
                  f"{deployed[-1]['seconds']:.1f} s (start-up {starts[-1]['single']:.1f} s and "
                  f"{starts[-1]['deployment']:.1f} s){round_latency(deployed[-1]['latency'])}", flush=True)
            if args.keep_logs:
                keep_logs(work, Path(args.keep_logs) / f"round-{n + 1}")
        report(args, len(docs), singles, deployed, starts)
    return 0


def round_input(bootstrap: str, docs) -> str:
    """A new input topic (one partition) holding ``docs`` alone: a round's, so that every round reads the same
    input, whatever earlier rounds' paced phases added to theirs. Every round's is fed before the first round, so
    that no round begins while the broker is still busy with a feed just before it."""
    raw = f"bench-raw-{uuid.uuid4().hex[:8]}"
    create(bootstrap, [raw])
    feed(bootstrap, raw, docs)
    return raw


def own_cpu(result: dict) -> float:
    """A contender's CPU seconds in a round: the single worker's, or the sum of the deployment's processes'."""
    cpu = result["cpu"]
    return sum(cpu.values()) if isinstance(cpu, dict) else cpu


def median_p99_ms(latencies: list[float]) -> tuple[float, float]:
    """The median and p99 of latencies in seconds, in milliseconds."""
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def round_latency(latencies: list[float]) -> str:
    """A round's paced latency, median and p99 (a stall shows in the round it happened in)."""
    if not latencies:
        return ""
    median, p99 = median_p99_ms(latencies)
    return f", latency median {median:.0f} ms p99 {p99:.0f} ms"


def keep_logs(work: Path, into: Path) -> None:
    """The processes' logs of the work folder so far, moved into ``into`` (so the next round's are its own)."""
    into.mkdir(parents=True, exist_ok=True)
    for log in work.glob("*.log"):
        shutil.move(str(log), into / log.name)


def report(args, docs: int, singles: list[dict], deployed: list[dict], starts: list[dict]) -> None:
    med = statistics.median
    single_rate = med(docs / s["seconds"] for s in singles)
    rate = med(docs / d["seconds"] for d in deployed)
    ratios = [s["seconds"] / d["seconds"] for s, d in zip(singles, deployed)]
    print(f"\nthroughput (median of {args.rounds}): single worker {single_rate:,.0f} docs/s, deployment "
          f"{rate:,.0f} docs/s: {med(ratios):.2f}x (paired rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    running = [(s["seconds"] - t["single"]) / (d["seconds"] - t["deployment"])
               for s, d, t in zip(singles, deployed, starts)]
    print(f"  less start-up: single worker {med(docs / (s['seconds'] - t['single']) for s, t in zip(singles, starts)):,.0f}"
          f" docs/s, deployment {med(docs / (d['seconds'] - t['deployment']) for d, t in zip(deployed, starts)):,.0f} "
          f"docs/s: {med(running):.2f}x (paired {', '.join(f'{r:.2f}' for r in running)}); start-up (to the outcome "
          f"of a first record) {med(t['single'] for t in starts):.1f} s and {med(t['deployment'] for t in starts):.1f} s")
    single_cpu = med(s["cpu"] - t["cpu"]["worker"] for s, t in zip(singles, starts)) / docs * 1e6
    roles = sorted(deployed[0]["cpu"])
    per_role = {role: med(d["cpu"][role] - t["cpu"][role] for d, t in zip(deployed, starts)) / docs * 1e6
                for role in roles}
    total = sum(per_role.values())
    print(f"CPU per document, less each process's CPU to the first record's outcome: single worker {single_cpu:.1f} "
          f"µs (its two processes); deployment {total:.1f} µs ({total / single_cpu:.2f}x), per process:")
    for role in roles:
        print(f"  {role:<12} {per_role[role]:7.1f} µs")
    print(f"cores of the {os.cpu_count()} while running (median): "
          + "; ".join(f"{name} {med(own_cpu(r) / r['seconds'] for r in runs):.2f} in its processes, broker "
                      f"{med(r['machine']['broker'] for r in runs):.2f}, idle {med(r['machine']['idle'] for r in runs):.2f}"
                      for name, runs in (("single worker", singles), ("deployment", deployed)))
          + ("" if args.broker_pid else " (the broker's process is not visible here: its share counts as 0)"))
    print("peak resident memory (median, MiB; the deployment's at the end of its round, paced phase included): "
          f"single worker {med(s['rss'] for s in singles):.0f}; "
          + ", ".join(f"{role} {med(d['rss'][role] for d in deployed):.0f}" for role in roles))
    sizes, records = deployed[-1]["bytes"], deployed[-1]["records"]
    print(f"internal topic bytes per document (of the {records:,} input records the last round's deployment read): "
          + ", ".join(f"{name} {size / records:.0f}" for name, size in sizes.items()))
    same, total_records = agreement(singles[-1]["outcomes"], deployed[-1]["outcomes"])
    print(f"outcomes: {same:,} of {total_records:,} records have one outcome, the single worker's")
    latencies = [x for d in deployed for x in d["latency"]]
    if latencies:
        median, p99 = median_p99_ms(latencies)
        print(f"latency at {args.paced_rate:,.0f} docs/s, record in to outcome out: median {median:.0f} ms, p99 "
              f"{p99:.0f} ms ({len(latencies):,} records)")


if __name__ == "__main__":
    sys.exit(main())
