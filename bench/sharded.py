"""The sharded deployment measured on this machine, against the single worker in the same run, and projected.

For each shard count (default 1, 2 and 4; 2 signing processes each), every
round, on the same pre-loaded input (the synthetic crawl, templates off, a
2-partition topic so both signing processes sign):

- throughput: the signing processes and shards are started (fresh processes,
  indexes, topics and groups) and timed from start until every shard's group
  has committed the last signed batch and the signers' group the last input
  record; then each process's CPU seconds are read from /proc/PID/stat
  (minus its role's start-up CPU, measured by an idle process of that role);
  the single worker (``run --until-caught-up``) on the same input, timed from
  start to its exit, its CPU from ``getrusage(RUSAGE_CHILDREN)``;
- batch latency: with the deployment still running, more documents are fed
  at a steady rate well below its capacity (``--paced-rate``), and each
  signed batch's latency is taken from its message's timestamp (when the
  signer produced it) to the last outcome of it (its place is in the
  ``streamdedup.order`` header; the outcome's timestamp is when a shard
  produced it in its transaction, which commits right after); the same is
  shown for the throughput phase, where batches queue behind each other;
- bytes through Kafka: the key and value bytes of the signed and evidence
  topics per document, written once and read by every shard, and of the
  values messages the signed batches name, written once and read by one;
- the serial step: ``decide_together`` (the deterministic decision every
  shard makes on every batch), timed in a fresh process of its own that runs
  the shards' engines in-process on the same batches (``--serial N``), with
  the per-shard evidence and the whole shard's work per document beside it;
  for the shard counts deployed and 16 more, to fit its cost per document
  as a + b/S: a, paid by every shard on every document whatever the number
  of shards (the serial step), b/S on the shard's own documents.

Then a projection of what N machines of M cores reach from those costs.
Run: ``python -m bench.sharded`` (starts a broker with deploy/kafka on
``--port``, default 30792, unless KAFKA_BOOTSTRAP is set). Medians over
``--rounds``; the machine is shared and noisy: compare ratios.
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
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from bench import harness
from bench.live import local_broker
from deploy.demo import read_topic, stop_processes
from streamdedup.core import corpus
from streamdedup.core.signed import unpack_signed

ROOT = harness.ROOT
PARTITIONS = 2
TICKS = os.sysconf("SC_CLK_TCK")
OFF = ["--set", "templates.enabled=false", "--set", "excerpts.enabled=false"]
EXTRA: list[str] = []  # --set flags given to every program (--set on the command line)
BATCH = 2000  # worker.batch_size, the default: records a signer reads per poll and the in-process batch
SERIAL_FIT_COUNT = 16  # shards run in-process besides those deployed, to part the serial step from each shard's share


# ---------------------------------------------------------------------------
# Topics and processes
# ---------------------------------------------------------------------------

def create(bootstrap: str, names: list[str], partitions: int = 1) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    admin.close()


def feed(bootstrap: str, topic: str, docs, rate: float = 0.0) -> None:
    """Send ``docs`` as JSON records; at ``rate`` documents a second in chunks of half a second, if given (a
    signer makes a batch of what it finds at each poll: fewer, larger batches than a steady trickle)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20, acks="all")
    chunk = max(int(rate / 2), 1) if rate else len(docs)
    began = time.monotonic()
    for start in range(0, len(docs), chunk):
        for d in docs[start:start + chunk]:
            producer.send(topic, key=d.id.encode(), value=json.dumps({"id": d.id, "text": d.text}).encode())
        producer.flush()
        if rate:
            time.sleep(max(0.0, began + (start + chunk) / rate - time.monotonic()))
    producer.close()


def base_command(bootstrap: str, raw: str, outs: list[str], group: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "streamdedup", "run", "--set", f"kafka.bootstrap_servers={bootstrap}",
            "--set", f"input.topics={raw}", "--set", f"output.clean_topic={outs[0]}",
            "--set", f"output.duplicates_topic={outs[1]}", "--set", f"output.dead_letter_topic={outs[2]}",
            "--set", f"kafka.group_id={group}", "--set", f"worker.transactional_id={group}",
            "--set", "metrics.enabled=false", "--set", "log.summary_interval_s=60", *OFF, *EXTRA, *extra]


def shard_settings(count: int, tag: str) -> list[str]:
    return ["--set", f"shards.count={count}", "--set", f"shards.signed_topic=signed-{tag}",
            "--set", f"shards.evidence_topic=evidence-{tag}"]


def outputs(bootstrap: str, tag: str) -> list[str]:
    outs = [f"bench-{kind}-{tag}" for kind in ("out", "dups", "dead")]
    create(bootstrap, outs)
    return outs


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process and its waited-for children, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICKS  # utime stime cutime cstime


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(command: list[str], log: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) of a program run to its end, started fresh."""
    cpu = children_cpu()
    began = time.monotonic()
    with open(log, "wb") as out:
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT)
    return time.monotonic() - began, children_cpu() - cpu


# ---------------------------------------------------------------------------
# One round of one contender
# ---------------------------------------------------------------------------

def single_round(bootstrap: str, raw: str, docs: int, work: Path) -> dict:
    tag = uuid.uuid4().hex[:8]
    command = base_command(bootstrap, raw, outputs(bootstrap, tag), f"single-{tag}", "--until-caught-up",
                           "--state", str(work / f"single-{tag}"))
    seconds, cpu = run_timed(command, work / f"single-{tag}.log")
    return {"docs_s": docs / seconds, "cpu_us_doc": cpu / docs * 1e6}


def start_up_cpu(bootstrap: str, work: Path) -> dict:
    """CPU seconds a signer and a shard spend starting, connecting and stopping with nothing to do."""
    tag = uuid.uuid4().hex[:8]
    raw = f"bench-idle-{tag}"
    create(bootstrap, [raw])
    outs = outputs(bootstrap, tag)
    settings = shard_settings(1, tag)
    _, sign = run_timed(base_command(bootstrap, raw, outs, f"idle-{tag}", "--role", "sign", "--until-idle", "0.5",
                                     *settings), work / f"idle-sign-{tag}.log")
    _, shard = run_timed(base_command(bootstrap, raw, outs, f"idle-{tag}", "--role", "shard", "--shard", "0",
                                      "--until-caught-up", "--state", str(work / f"idle-{tag}"), *settings),
                         work / f"idle-shard-{tag}.log")
    return {"sign": sign, "shard": shard}


class Deployment:
    """``count`` shards and ``signers`` signing processes on ``raw``, with fresh topics, groups and indexes."""

    def __init__(self, bootstrap: str, raw: str, count: int, signers: int, work: Path):
        self.bootstrap, self.raw, self.count = bootstrap, raw, count
        self.tag = uuid.uuid4().hex[:8]
        self.group = f"sharded-{self.tag}"
        self.outs = outputs(bootstrap, self.tag)
        self.signed, self.evidence = f"signed-{self.tag}", f"evidence-{self.tag}"
        settings = shard_settings(count, self.tag)
        roles = [(f"shard-{n}", ["--role", "shard", "--shard", str(n), "--state", str(work / f"{self.tag}-{n}")])
                 for n in range(count)] + [(f"sign-{n}", ["--role", "sign"]) for n in range(signers)]
        self.names = [name for name, _ in roles]
        self.processes = []
        for name, role in roles:
            with open(work / f"{self.tag}-{name}.log", "wb") as log:
                self.processes.append(subprocess.Popen(
                    base_command(bootstrap, raw, self.outs, self.group, *role, *settings),
                    stdout=log, stderr=subprocess.STDOUT))
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        self.probe = KafkaConsumer(bootstrap_servers=bootstrap)

    def done(self) -> bool:
        """Whether every input record is signed and every shard has committed the last signed batch."""
        raw = [TopicPartition(self.raw, p) for p in range(PARTITIONS)]
        ends = self.probe.end_offsets(raw)
        groups = [f"{self.group}-sign"] + [f"{self.group}-shard-{n}" for n in range(self.count)]
        committed = self.admin.list_group_offsets(groups)
        signed = committed.get(groups[0]) or {}
        if any(signed.get(tp) is None or signed[tp].offset < ends[tp] for tp in raw):
            return False
        last = self.signed_end()
        for group in groups[1:]:
            at = (committed.get(group) or {}).get(TopicPartition(self.signed, 0))
            if at is None or at.offset < last:
                return False
        return True

    def wait(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while not self.done():
            failed = [name for name, p in zip(self.names, self.processes) if p.poll() is not None]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"the deployment {self.tag} did not finish ({failed or 'timeout'}): see its logs")
            time.sleep(0.2)

    def signed_end(self) -> int:
        return self.probe.end_offsets([TopicPartition(self.signed, 0)])[TopicPartition(self.signed, 0)]

    def cpu(self) -> dict:
        return {name: cpu_seconds(p.pid) for name, p in zip(self.names, self.processes)}

    def close(self) -> None:
        stop_processes(self.processes)
        self.admin.close()
        self.probe.close()


def latencies(bootstrap: str, deployment: Deployment, signed: list, first: int, last: int) -> list[float]:
    """Seconds from each signed batch in [first, last) produced to its last outcome produced."""
    produced = {m.offset: m.timestamp for m in signed if first <= m.offset < last}
    finished: dict[int, int] = {}
    for topic in deployment.outs:
        for m in read_topic(bootstrap, topic):
            order = dict(m.headers or ()).get("streamdedup.order")
            if order is not None:
                offset = int(order.split(b"/")[0])
                finished[offset] = max(finished.get(offset, 0), m.timestamp)
    return [(finished[o] - produced[o]) / 1000 for o in produced if o in finished]


def sharded_round(bootstrap: str, raw: str, docs: int, count: int, signers: int, work: Path, start_up: dict,
                  paced_docs, paced_rate: float) -> dict:
    began = time.monotonic()
    deployment = Deployment(bootstrap, raw, count, signers, work)
    try:
        deployment.wait()
        seconds = time.monotonic() - began
        cpu = deployment.cpu()
        loaded_end = deployment.signed_end()
        feed(bootstrap, raw, paced_docs, paced_rate)
        deployment.wait()
        paced_end = deployment.signed_end()
    finally:
        deployment.close()
    signed = read_topic(bootstrap, deployment.signed)
    evidence = read_topic(bootstrap, deployment.evidence)
    loaded = [m for m in signed if m.offset < loaded_end]
    named = {(shard, at) for m in loaded for shard, at in unpack_signed(m.value).values_at.items()}
    values = [m for m in read_topic(bootstrap, f"{deployment.signed}-values") if (m.partition, m.offset) in named]
    phase_one = {m.offset for m in loaded}
    evidence_one = [m for m in evidence if int(m.key.split(b"/")[0]) in phase_one]
    size = lambda ms: sum(len(m.key or b"") + len(m.value or b"") for m in ms)  # noqa: E731
    role = lambda name: "shard" if name.startswith("shard") else "sign"  # noqa: E731
    return {
        "docs_s": docs / seconds,
        "cpu_us_doc": {name: max(c - start_up[role(name)], 0.0) / docs * 1e6 for name, c in cpu.items()},
        "total_cpu_us_doc": sum(cpu.values()) / docs * 1e6,
        "signed_bytes_doc": size(loaded) / docs, "evidence_bytes_doc": size(evidence_one) / docs,
        "values_bytes_doc": size(values) / docs,
        "batches": len(loaded), "paced_batches": paced_end - loaded_end,
        "loaded_latency": latencies(bootstrap, deployment, signed, 0, loaded_end),
        "paced_latency": latencies(bootstrap, deployment, signed, loaded_end, paced_end),
    }


# ---------------------------------------------------------------------------
# The serial step, in-process
# ---------------------------------------------------------------------------

def serial_costs(count: int, docs: int, work: Path) -> dict:
    """µs of CPU per document of each part of a shard's work, ``count`` shards in this process, one after the
    other on each batch (templates off: one round of evidence); ``decide_together`` timed by itself."""
    import streamdedup.engine.shards.shard as shard_module
    from streamdedup import config as config_module
    from streamdedup.core.records import Document, Source
    from streamdedup.engine.evidence import Evidence, ShardPlace
    from streamdedup.engine.shards.shard import ShardEngine

    cfg = config_module.load(None, ("templates.enabled=false", "excerpts.enabled=false"), environ={})
    spent = {"prepare": 0.0, "evidence": 0.0, "unpack": 0.0, "decide_together": 0.0, "decide_and_write": 0.0}
    original = shard_module.decide_together

    def timed_decide_together(*args, **kwargs):
        began = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent["decide_together"] += time.process_time() - began

    shard_module.decide_together = timed_decide_together
    items = [Document(d.id, d.text, Source("raw", 0, n)) for n, d in enumerate(crawl(docs))]
    shards = [ShardEngine(cfg, ShardPlace(i, count), str(work / f"serial-{count}-{i}")) for i in range(count)]
    clock = time.process_time
    try:
        for start in range(0, len(items), BATCH):
            began = clock()
            prepared = shards[0].prepare(items[start:start + BATCH])
            spent["prepare"] += clock() - began
            began = clock()
            packed = []
            for shard in shards:
                prepared._slots = None  # each shard sorts the batch's keys once, in its own process
                packed.append(shard.evidence(prepared).pack())
            spent["evidence"] += clock() - began
            began = clock()
            evidences = [[Evidence.unpack(p) for p in packed] for _ in shards]
            spent["unpack"] += clock() - began
            now = time.time()
            began = clock()
            for shard, every in zip(shards, evidences):
                shard.commit(shard.decide_together(prepared, every, now))
            spent["decide_and_write"] += clock() - began
    finally:
        for shard in shards:
            shard.close()
    per_shard = {k: v / count / len(items) * 1e6 for k, v in spent.items() if k != "prepare"}
    per_shard["prepare (signer)"] = spent["prepare"] / len(items) * 1e6
    return per_shard


def crawl(docs: int):
    return corpus.generate(int(docs / 1.83) + 1, seed=42)[:docs]


def serial_in_fresh_process(count: int, docs: int, work: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.sharded", "--serial", str(count), "--docs", str(docs), "--work",
                          str(work)], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def med(values) -> float:
    return statistics.median(values) if values else float("nan")


def p99(values) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def report(args, single: list[dict], sharded: dict, serial: dict) -> None:
    single_rate = med([r["docs_s"] for r in single])
    print(f"\nend to end, {args.docs:,} documents pre-loaded ({PARTITIONS} partitions), start to last outcome "
          "committed; "
          f"medians of {args.rounds} rounds:")
    print(f"  {'contender':<34} {'docs/s':>8} {'min-max':>15} {'vs single':>9} {'CPU µs/doc (all)':>17}")
    print(f"  {'single worker':<34} {single_rate:>8,.0f} {min(r['docs_s'] for r in single):>7,.0f}-"
          f"{max(r['docs_s'] for r in single):<7,.0f} {'1.00x':>9} {med([r['cpu_us_doc'] for r in single]):>17,.0f}")
    for count, rounds in sharded.items():
        rate = med([r["docs_s"] for r in rounds])
        print(f"  {f'{count} shard(s), {args.signers} signers':<34} {rate:>8,.0f} "
              f"{min(r['docs_s'] for r in rounds):>7,.0f}-{max(r['docs_s'] for r in rounds):<7,.0f} "
              f"{rate / single_rate:>8.2f}x {med([r['total_cpu_us_doc'] for r in rounds]):>17,.0f}")

    print(f"\ninput: {args.input_bytes_doc:,.0f} B/doc (key + JSON value)")
    print("per role, CPU µs per document (start-up CPU of an idle process of the role subtracted); Kafka bytes per "
          "document (key + value):")
    print(f"  {'shards':>6} {'signers (sum)':>13} {'each shard':>10} {'decide_together':>15} {'signed B/doc':>12} "
          f"{'values B/doc':>12} {'evidence B/doc':>14} {'read+written B/doc':>18} {'batches':>7}")
    rows = {}
    for count, rounds in sharded.items():
        signers = med([sum(v for k, v in r["cpu_us_doc"].items() if k.startswith("sign")) for r in rounds])
        shard = med([med([v for k, v in r["cpu_us_doc"].items() if k.startswith("shard")]) for r in rounds])
        signed_b = med([r["signed_bytes_doc"] for r in rounds])
        evidence_b = med([r["evidence_bytes_doc"] for r in rounds])
        values_b = med([r.get("values_bytes_doc", 0.0) for r in rounds])
        moved = (signed_b + evidence_b) * (1 + count) + 2 * values_b  # written once, read by every shard (values: one)
        rows[count] = (signers, shard, signed_b, evidence_b)
        print(f"  {count:>6} {signers:>13,.0f} {shard:>10,.0f} {serial[count]['decide_together']:>15,.1f} "
              f"{signed_b:>12,.0f} {values_b:>12,.0f} {evidence_b:>14,.0f} {moved:>18,.0f} "
              f"{med([r['batches'] for r in rounds]):>7,.0f}")

    print("\nbatch latency, signed message produced -> its last outcome produced in the committing transaction (s):")
    print(f"  {'shards':>6} {'loaded: median':>14} {'p99':>6} {'paced: median':>14} {'p99':>6} {'paced batches':>13}")
    for count, rounds in sharded.items():
        loaded = [x for r in rounds for x in r["loaded_latency"]]
        paced = [x for r in rounds for x in r["paced_latency"]]
        print(f"  {count:>6} {med(loaded):>14.3f} {p99(loaded):>6.3f} {med(paced):>14.3f} {p99(paced):>6.3f} "
              f"{med([r['paced_batches'] for r in rounds]):>13,.0f}")

    print("\nin-process, one shard's CPU µs per document by part (all shards in one process, templates off):")
    parts = ["evidence", "unpack", "decide_together", "decide_and_write"]
    print(f"  {'shards':>6} " + " ".join(f"{p:>16}" for p in parts) + f" {'prepare (signer)':>16}")
    for count, costs in serial.items():
        print(f"  {count:>6} " + " ".join(f"{costs[p]:>16,.1f}" for p in parts)
              + f" {costs['prepare (signer)']:>16,.1f}")
    project(args, rows, serial, sharded)


def project(args, rows: dict, serial: dict, sharded: dict) -> None:
    """Throughput on N machines of M cores from the per-role costs: each shard pays a cost per document of the
    whole stream (it reads and looks up every batch) plus a share of the rest; signing spreads over any cores."""
    counts = sorted(rows)
    lo, hi = counts[0], counts[-1]
    shard_lo, shard_hi = rows[lo][1], rows[hi][1]
    share = max((shard_lo - shard_hi) / (1 / lo - 1 / hi), 0.0) if hi != lo else 0.0  # the part split among shards
    fixed = max(shard_hi - share / hi, 1e-9)  # the part every shard pays on every document
    sign = med([rows[c][0] for c in counts])
    decide, own = serial_step(serial)
    if min(sign, fixed + share, decide) <= 0:
        print("\nno projection: a role's CPU per document is not above its start-up's (too few documents)")
        return
    waits = {}  # shard count -> (median paced latency, docs a batch, the part of it not a shard's CPU)
    for count in counts:
        latency = med([x for r in sharded[count] for x in r["paced_latency"]])
        paced_batch = args.paced_docs / max(med([r["paced_batches"] for r in sharded[count]]), 1)
        waits[count] = (latency, paced_batch, max(latency - paced_batch * rows[count][1] / 1e6, 0.0))
    quiet = min(counts, key=lambda c: waits[c][0])  # the least contended: every process has a core of its own
    latency, paced_batch, wait = waits[quiet]
    print(f"\nprojection (per document: signing {sign:,.0f} µs of CPU in all; a shard of S pays {fixed:,.0f} µs on "
          f"every document plus {share:,.0f}/S µs; fitted from {lo} and {hi} shards):")
    print(f"  the serial step, decide_together on every document of the stream: {decide:,.1f} µs/doc in every "
          f"shard, whatever the number of shards, -> at most {1e6 / decide:,.0f} docs/s whatever the number of machines "
          f"({'above' if 1e6 / decide >= 200_000 else 'BELOW'} 200k docs/s); its documents' decisions {own:,.1f}/S "
          f"µs/doc more (fitted a + b/S to the in-process figures of S = {', '.join(map(str, sorted(serial)))})")
    print(f"  every shard reads and looks up every batch: at most {1e6 / fixed:,.0f} docs/s per shard core, "
          f"whatever the number of shards")
    print("  lockstep: a shard takes one batch at a time, and waits for every shard's evidence on it (its evidence "
          "published, every shard's read, one Kafka transaction a batch); paced latency, docs a batch, the part not "
          "a shard's CPU:")
    for count, (lat, size, part) in waits.items():
        print(f"    {count} shard(s): {lat:.3f} s, {size:,.0f} docs, {part:.3f} s"
              + ("   <- used below (the least contended here)" if count == quiet else ""))
    print(f"    -> {wait / BATCH * 1e6:,.1f} µs/doc more for batches of {BATCH} (at most "
          f"{BATCH / max(wait, 1e-9):,.0f} docs/s from the waits alone; more shards wait for the slowest of them)")
    print(f"  {'machines x cores':>16} {'shards':>6} {'signer cores':>12} {'docs/s':>9}  capped by")
    for machines, cores in ((1, 2), (2, 4), (4, 8), (8, 16), (16, 16)):
        layouts = []
        for shards in range(1, machines * cores):
            signer_cores = machines * cores - shards
            caps = {"signing": signer_cores * 1e6 / sign,
                    "shards (every batch, lockstep)": 1e6 / (fixed + share / shards + wait / BATCH * 1e6),
                    "serial step": 1e6 / decide}
            layouts.append((min(caps.values()), shards, signer_cores, min(caps, key=caps.get)))
        top = max(layout[0] for layout in layouts)
        best = next(layout for layout in layouts if layout[0] >= 0.98 * top)  # the fewest shards within 2%
        print(f"  {f'{machines} x {cores}':>16} {best[1]:>6} {best[2]:>12} {best[0]:>9,.0f}  {best[3]}")
    print("  (the fewest shards within 2% of the best; one shard per core, the other cores sign; the broker is not "
          "counted: it moves the 'read+written B/doc' above, times docs/s)")


def serial_step(serial: dict) -> tuple[float, float]:
    """decide_together's µs per document in a shard of S, a + b/S fitted (least squares) to the in-process
    figures: a, what every shard pays on every document of the stream (the serial step), and b, the part a
    shard pays on its own documents only. With one count measured, all of it counts as a."""
    counts = sorted(serial)
    if len(counts) < 2:
        return serial[counts[0]]["decide_together"], 0.0
    b, a = statistics.linear_regression([1 / c for c in counts], [serial[c]["decide_together"] for c in counts])
    return max(a, 1e-9), max(b, 0.0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=40000)
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--signers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paced-docs", type=int, default=8000)
    parser.add_argument("--paced-rate", type=float, default=1000.0, help="documents a second in the latency phase")
    parser.add_argument("--port", default="30792")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting for every program measured (the single worker's too)")
    parser.add_argument("--config", help="a configuration file for every program measured")
    parser.add_argument("--save", help="write the measurements to this JSON file")
    parser.add_argument("--report", help="print the report of measurements saved by --save, measuring nothing")
    parser.add_argument("--serial", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serial:
        print(json.dumps(serial_costs(args.serial, args.docs, Path(args.work))))
        return 0
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        vars(args).update(saved["args"])
        report(args, saved["single"], {int(k): v for k, v in saved["sharded"].items()},
               {int(k): v for k, v in saved["serial"].items()})
        return 0
    counts = [int(c) for c in args.shards.split(",")]
    EXTRA.extend(flag for setting in args.set for flag in ("--set", setting))
    EXTRA.extend(["--config", args.config] if args.config else [])
    work = Path(tempfile.mkdtemp(prefix="bench-sharded-"))
    try:
        with local_broker(args.port) as bootstrap:
            everything = crawl(args.docs + args.paced_docs)
            docs, paced = everything[:args.docs], everything[args.docs:]
            args.input_bytes_doc = statistics.mean(len(d.id) + len(json.dumps({"id": d.id, "text": d.text}))
                                                   for d in docs)
            print(f"{len(docs):,} documents of the synthetic crawl; shards {counts}, {args.signers} signing processes "
                  f"each; {args.rounds} rounds; templates and excerpts off; on {bootstrap}", flush=True)
            serial = {count: serial_in_fresh_process(count, args.docs, work)
                      for count in sorted(set(counts) | {SERIAL_FIT_COUNT})}
            single: list[dict] = []
            sharded: dict[int, list[dict]] = {count: [] for count in counts}
            for n in range(args.rounds):
                raw = f"bench-raw-{uuid.uuid4().hex[:8]}"
                create(bootstrap, [raw], PARTITIONS)
                feed(bootstrap, raw, docs)
                start_up = start_up_cpu(bootstrap, work)
                single.append(single_round(bootstrap, raw, len(docs), work))
                for count in counts:
                    sharded[count].append(sharded_round(bootstrap, raw, len(docs), count, args.signers, work, start_up,
                                                        paced[:args.paced_docs], args.paced_rate))
                    print(f"  round {n + 1}: {count} shard(s) {sharded[count][-1]['docs_s']:,.0f} docs/s "
                          f"(single worker {single[-1]['docs_s']:,.0f})", flush=True)
                    raw = f"bench-raw-{uuid.uuid4().hex[:8]}"  # the paced documents went into the last input
                    create(bootstrap, [raw], PARTITIONS)
                    feed(bootstrap, raw, docs)
            if args.save:
                kept = {k: vars(args)[k] for k in ("docs", "rounds", "signers", "paced_docs", "input_bytes_doc")}
                Path(args.save).write_text(json.dumps({"args": kept, "single": single, "sharded": sharded,
                                                       "serial": serial}))
            report(args, single, sharded, serial)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
