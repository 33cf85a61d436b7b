"""Live worker benchmark on a local Apache Kafka broker, against two peers measured in the same run.

With >= 50,000 crawl documents pre-loaded in an input topic, each contender
runs as its own program (a fresh Python process, as a user would start it)
from start to caught up; its output topics, group and index are fresh each
round and made before the clock starts:

- pass-through: a kafka-python consumer that decodes each JSON record and
  produces it unchanged to an output topic: the client's ceiling;
- naive worker: kafka-python + datasketch MinHash + MinHashLSH in memory,
  producing the documents it keeps (what a user would write first);
- streamdedup: ``streamdedup run --until-caught-up``, durable index on disk,
  one Kafka transaction per batch (exactly one outcome per record); and the
  same with site templates and excerpts off ("pages off"), to show their cost.

The crawl documents have no URL, so no site template is learned there.
``--crawl web`` measures what learning costs: the web crawl (pages with
URLs, sites whose navigation changes by section) read with
``input.url_field = "url"``, streamdedup with site templates as by default
(what each site repeats counted, ``templates.repeats``, on since 2026-12-06),
with repeated blocks too (``templates.window = 16``), without what each site
repeats (``templates.repeats = false``: the default before), and with templates
off, the last the base of the ratios (issue 31 asks learning to keep at
least 90% of the rate without it). Beside the rates it prints each
contender's CPU a document (the worker with its feed process, and the
broker's when it knows its process: its own, or ``$BENCH_KAFKA_DATA_DIR``,
the data folder of a deploy/kafka broker named by ``KAFKA_BOOTSTRAP``) and
the cores they kept busy: on a machine of two cores, work moved from the
deciding process to the feed keeps its CPU.

Run: ``python -m bench.live [--crawl web [--variants "NAME;..."]] [--port N]`` (starts a broker with deploy/kafka on ``--port``
unless KAFKA_BOOTSTRAP is set).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import uuid
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from bench import harness
from streamdedup.core import corpus

ROOT = harness.ROOT
PARTITIONS = 3


def create(bootstrap: str, name: str, partitions: int = 1) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, partitions, 1)])
    admin.close()
    return name


def preload(bootstrap: str, docs) -> str:
    """A new topic holding ``docs`` as JSON records (with their ``url`` when they have one)."""
    topic = create(bootstrap, f"bench-raw-{uuid.uuid4().hex[:8]}", PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, acks="all")
    for d in docs:
        record = {"id": d.id, "text": d.text, **({"url": d.url} if getattr(d, "url", None) else {})}
        producer.send(topic, key=d.id.encode(), value=json.dumps(record).encode())
    producer.flush()
    producer.close()
    return topic


def consume_all(bootstrap: str, topic: str, handle) -> int:
    """Read a topic from the start to its end, calling ``handle(message)``; returns records read."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=f"bench-{uuid.uuid4().hex[:8]}",
                             enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=2000)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    ends = consumer.end_offsets(partitions)
    count = 0
    while any(consumer.position(p) < ends[p] for p in partitions):
        for messages in consumer.poll(timeout_ms=500).values():
            for m in messages:
                handle(m)
                count += 1
    consumer.close()
    return count


def relay(bootstrap: str, topic: str, out: str, keep) -> int:
    """Consume ``topic`` to its end, producing each record for which ``keep(message)`` is true."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 << 10)

    def forward(message) -> None:
        if keep(message):
            producer.send(out, key=message.key, value=message.value)

    count = consume_all(bootstrap, topic, forward)
    producer.flush()
    producer.close()
    return count


def pass_through(bootstrap: str, topic: str, outs: list[str]) -> None:
    relay(bootstrap, topic, outs[0], lambda message: json.loads(message.value) is not None)


def naive_worker(bootstrap: str, topic: str, outs: list[str]) -> None:
    from datasketch import MinHash, MinHashLSH

    from streamdedup.core.shingle import normalize

    lsh = MinHashLSH(threshold=0.7, num_perm=128)

    def new(message) -> bool:
        doc = json.loads(message.value)
        words = normalize(doc["text"]).split()
        minhash = MinHash(num_perm=128)
        minhash.update_batch([" ".join(words[i:i + 3]).encode() for i in range(max(len(words) - 2, 1))])
        if lsh.query(minhash):
            return False
        lsh.insert(doc["id"], minhash)
        return True

    relay(bootstrap, topic, outs[0], new)


def streamdedup_command(bootstrap: str, topic: str, outs: list[str], state: str) -> list[str]:
    return [sys.executable, "-m", "streamdedup", "run", "--until-caught-up", "--state", state,
            "--set", f"kafka.bootstrap_servers={bootstrap}", "--set", f"input.topics={topic}",
            "--set", f"output.clean_topic={outs[0]}", "--set", f"output.duplicates_topic={outs[1]}",
            "--set", f"output.dead_letter_topic={outs[2]}", "--set", f"kafka.group_id=bench-{outs[0]}",
            "--set", "metrics.enabled=false", "--set", "log.summary_interval_s=60"]


PEERS = {"pass-through (a)": pass_through, "naive worker (b)": naive_worker}
OFF = ["--set", "templates.enabled=false", "--set", "excerpts.enabled=false"]
VARIANTS = {"streamdedup": [], "streamdedup, pages off": OFF}  # the defaults; no templates, no excerpts
CONTENDERS = [*VARIANTS, *PEERS]
URLS = ["--set", 'input.url_field="url"']
WEB_VARIANTS = {"templates (default)": URLS, "templates, blocks on": [*URLS, "--set", "templates.window=16"],
                "templates, repeats off": [*URLS, "--set", "templates.repeats=false"],
                "templates off": [*URLS, "--set", "templates.enabled=false"]}  # the web crawl's contenders


BROKER_PID_FILE = "broker.pid"  # in deploy/kafka's data folder


@contextmanager
def local_broker(port: str) -> Iterator[str]:
    """The address of ``$KAFKA_BOOTSTRAP``, or of a broker started on ``port`` by deploy/kafka and wiped after
    (its data folder in ``$BENCH_KAFKA_DATA_DIR`` either way, so ``broker_cpu`` can read its process's CPU)."""
    if "KAFKA_BOOTSTRAP" in os.environ:
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    data = tempfile.mkdtemp(prefix="bench-kafka-")
    env = dict(os.environ, KAFKA_PORT=port, KAFKA_DATA_DIR=data)
    started = subprocess.run([str(ROOT / "deploy/kafka/start.sh")], env=env, capture_output=True, text=True,
                             check=True)
    os.environ["BENCH_KAFKA_DATA_DIR"] = data
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        os.environ.pop("BENCH_KAFKA_DATA_DIR", None)
        subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), "--wipe"], env=env, capture_output=True)


def broker_cpu() -> Optional[float]:
    """CPU seconds (user + system) the broker's process used so far, when its data folder is known
    (``$BENCH_KAFKA_DATA_DIR``: the bench's own broker, or one started by deploy/kafka with that folder)."""
    data = os.environ.get("BENCH_KAFKA_DATA_DIR")
    try:
        with open(os.path.join(data, BROKER_PID_FILE)) as file:
            pid = int(file.read().strip())
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except (TypeError, OSError, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds (user + system) of the programs this one ran and waited for, with theirs (a worker's feed
    process too)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed_round(name: str, bootstrap: str, topic: str) -> float:
    """Seconds one contender takes, as its own program, from start to caught up (output topics made before)."""
    variants = {**VARIANTS, **WEB_VARIANTS}
    if name in variants:
        return timed_program(bootstrap, lambda outs, state: streamdedup_command(bootstrap, topic, outs, state)
                             + variants[name])
    return timed_program(bootstrap, lambda outs, state: [sys.executable, "-m", "bench.live", "--peer", name,
                                                         "--bootstrap", bootstrap, "--topic", topic, "--outs",
                                                         ",".join(outs)])


def timed_program(bootstrap: str, command_for) -> float:
    """Seconds ``command_for(output topics, state folder)`` runs; both are made fresh before the clock starts."""
    tag = uuid.uuid4().hex[:8]
    outs = [create(bootstrap, f"bench-{kind}-{tag}") for kind in ("out", "dups", "dead")]
    state = tempfile.mkdtemp(prefix="bench-live-")
    try:
        return harness.timed(command_for(outs, state), cwd=harness.ROOT)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--crawl", choices=("crawl", "web"), default="crawl",
                        help="web: pages with URLs, site templates learned (their cost)")
    parser.add_argument("--peer", choices=sorted(PEERS), help=argparse.SUPPRESS)  # one timed peer program
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--outs", help=argparse.SUPPRESS)
    parser.add_argument("--port", default="29292", help="of the broker the bench starts (unless KAFKA_BOOTSTRAP)")
    parser.add_argument("--variants", default="", help="with --crawl web: these contenders only (separated by \";\": "
                        f"names of {', '.join(WEB_VARIANTS)}; \"templates off\" is always in, the base)")
    args = parser.parse_args(argv)
    if args.peer:
        PEERS[args.peer](args.bootstrap, args.topic, args.outs.split(","))
        return 0
    with local_broker(args.port) as bootstrap:
        if args.crawl == "web":
            return web_rates(bootstrap, args.docs, args.rounds, web_contenders(args.variants))
        docs = corpus.generate(int(args.docs / 1.83) + 1, seed=42)[: args.docs]
        topic = preload(bootstrap, docs)
        print(f"{len(docs):,} documents in {topic} ({PARTITIONS} partitions) on {bootstrap}; {args.rounds} rounds")
        timed_round("pass-through (a)", bootstrap, topic)  # warm-up: the broker's JIT and page cache
        rates = harness.interleaved(CONTENDERS, args.rounds,
                                    lambda name, _: len(docs) / timed_round(name, bootstrap, topic))
        print("\n" + harness.table(rates, "streamdedup", ratio="streamdedup / it (paired)", higher_is_better=False))
        print("\n(streamdedup / \"streamdedup, pages off\": the cost of templates and excerpts)")
        ours = harness.median(rates["streamdedup"])
        print(f"\n  streamdedup reaches {ours / harness.median(rates['pass-through (a)']):.0%} of the pass-through")
    return 0


def web_contenders(asked: str) -> list[str]:
    """The web crawl's contenders named in ``asked`` (separated by ";", as the names hold commas; all of ``WEB_VARIANTS`` when empty), with
    "templates off" (the base of the ratios) always among them."""
    names = [name.strip() for name in asked.split(";") if name.strip()] or list(WEB_VARIANTS)
    unknown = [name for name in names if name not in WEB_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(map(repr, unknown))}: choose among {', '.join(WEB_VARIANTS)}")
    return names if "templates off" in names else [*names, "templates off"]


def web_rates(bootstrap: str, documents: int, rounds: int, contenders: Sequence[str] = tuple(WEB_VARIANTS)) -> int:
    """The web crawl's ``contenders`` (of ``WEB_VARIANTS``), interleaved (alternated), against streamdedup
    without templates."""
    from streamdedup.core.webcrawl import generate_web

    docs = generate_web(documents, sites=max(4, documents // 250), seed=42, navigation="sections")
    topic = preload(bootstrap, docs)
    print(f"{len(docs):,} web pages of {len({d.site for d in docs})} sites in {topic} on {bootstrap}; {rounds} rounds")
    timed_round("templates off", bootstrap, topic)  # warm-up
    cpu: dict[str, list[tuple[float, Optional[float], float]]] = {name: [] for name in contenders}

    def rate(name: str) -> float:
        worker, broker = children_cpu(), broker_cpu()
        seconds = timed_round(name, bootstrap, topic)
        broker_after = broker_cpu()
        cpu[name].append((children_cpu() - worker, None if broker is None or broker_after is None
                          else broker_after - broker, seconds))
        return len(docs) / seconds

    rates = harness.interleaved(list(contenders), rounds, lambda name, _: rate(name), alternate=True)
    print("\n" + harness.table(rates, "templates off", columns=cpu_columns(cpu, len(docs))))
    print("\n(CPU: user + system a document, medians over the rounds; worker: the program with its feed process;\n"
          " cores: the worker's and the broker's CPU over the run's wall time. Learning that moves between the\n"
          " worker's processes keeps its CPU: on two cores, a rate is at most 2 / (their CPU a document).)")
    return 0


def cpu_columns(cpu: dict, documents: int) -> dict[str, dict[str, str]]:
    """The table's CPU columns: each contender's worker and broker CPU a document (µs) and the cores they kept
    busy, medians over its rounds (the broker's only when ``broker_cpu`` knows it)."""
    worker, broker, cores = {}, {}, {}
    for name, runs in cpu.items():
        worker[name] = f"{harness.median(w for w, _, _ in runs) * 1e6 / documents:,.0f}"
        known = [(w, b, s) for w, b, s in runs if b is not None]
        broker[name] = f"{harness.median(b for _, b, _ in known) * 1e6 / documents:,.0f}" if known else "-"
        cores[name] = f"{harness.median((w + (b or 0)) / s for w, b, s in runs):.2f}"
    return {"worker CPU µs a doc": worker, "broker CPU µs a doc": broker, "cores busy": cores}


if __name__ == "__main__":
    sys.exit(main())
