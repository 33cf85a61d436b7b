"""Soak bench: the live worker fed at a steady rate for a long time, through restarts, a broker restart and
map growth; reports throughput and memory over time, the index check and exactly-once counts at the end.

What happens (``--minutes`` M, default 30):

- a local Apache Kafka broker (deploy/kafka, its own port and data folder) and fresh topics: input with
  3 partitions, clean / duplicates / dead-letter;
- a feeder produces synthetic crawl documents (``core/corpus.py``, new families all the time, about 46%
  of them copies) at ``--rate`` documents a second, without pause, the whole run;
- ``streamdedup run`` with ``index.map_size_mb`` small (``--map-mb``, 8 MiB) so the LMDB map must grow
  again and again while it runs;
- at 20% and 70% of the run the worker gets SIGTERM and is started again; at 45% the broker is stopped
  (SIGTERM) and started again 20 s later, the worker and the feeder running on;
- every ``--sample-s`` seconds: the group's committed offsets (records decided and committed), the
  worker's resident memory (``/proc``: its own, anonymous, and the index pages LMDB maps in, file), and
  every minute the index's size and map (``streamdedup stats``);
- at the end the feeder stops, the worker catches up and stops (SIGTERM), ``streamdedup check`` runs,
  and the output topics are read (read_committed): every input record (topic, partition, offset) must
  have exactly one outcome among clean, duplicates and dead-letter.

Run: ``python -m bench.soak --minutes 30`` (``--minutes 5`` for a try). Exit status 1 if the check
fails or an input record has no or two outcomes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Optional

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streamdedup.core import corpus

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 3
PAGE = 4096  # LMDB page size on x86-64 Linux


class Feeder(threading.Thread):
    """Produces crawl documents at a steady rate until stopped; counts what the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: float):
        super().__init__(daemon=True)
        self.topic, self.rate = topic, rate
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, retries=1 << 30,
                                      enable_idempotence=True, max_block_ms=120_000, request_timeout_ms=30_000)
        self.sent = self.acked = self.failed = 0
        self.stop = threading.Event()

    def documents(self):
        """Endless crawl documents: a new corpus (its own seed, its own id prefix) every 5,000 articles."""
        seed = 0
        while True:
            for doc in corpus.generate(5000, seed=1000 + seed):
                yield f"s{seed}-{doc.id}", doc.text
            seed += 1

    def _ok(self, _):
        self.acked += 1

    def _failed(self, _):
        self.failed += 1

    def run(self) -> None:
        docs = self.documents()
        began = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - began) * self.rate)
            while self.sent < due:
                doc_id, text = next(docs)
                future = self.producer.send(self.topic, key=doc_id.encode(),
                                            value=json.dumps({"id": doc_id, "text": text}).encode())
                future.add_callback(self._ok)
                future.add_errback(self._failed)
                self.sent += 1
            time.sleep(0.05)
        self.producer.flush(timeout=300)
        self.producer.close()


class Broker:
    def __init__(self, port: int):
        self.env = dict(os.environ, KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(port + 1),
                        KAFKA_DATA_DIR=tempfile.mkdtemp(prefix="soak-kafka-"))

    def start(self) -> str:
        done = subprocess.run([str(ROOT / "deploy/kafka/start.sh")], env=self.env, capture_output=True, text=True,
                              check=True)
        return done.stdout.strip().splitlines()[-1]

    def stop(self, wipe: bool = False) -> None:
        subprocess.run([str(ROOT / "deploy/kafka/stop.sh"), *(["--wipe"] if wipe else [])], env=self.env,
                       capture_output=True, check=True)


class Worker:
    """``streamdedup run`` as its own process; its stderr (JSON log lines) appended to one file."""

    def __init__(self, command: list[str], log_path: str):
        self.command, self.log_path = command, log_path
        self.process = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=log)
        self.starts += 1

    def stop(self, timeout: float = 120) -> float:
        """SIGTERM and wait; returns the seconds it took to exit (it must exit 0)."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        if code != 0:
            raise SystemExit(f"the worker exited {code} after SIGTERM; see {self.log_path}")
        return time.monotonic() - began

    def rss_mb(self) -> tuple[float, float] | None:
        """(anonymous, file-backed) resident MiB: the worker's own memory, and the index pages LMDB maps in
        (which the kernel reclaims under pressure); None between processes."""
        found = {}
        try:
            with open(f"/proc/{self.process.pid}/status") as status:
                for line in status:
                    if line.startswith(("RssAnon:", "RssFile:")):
                        found[line.split(":")[0]] = int(line.split()[1]) / 1024
        except (FileNotFoundError, ProcessLookupError):
            return None
        return (found["RssAnon"], found["RssFile"]) if len(found) == 2 else None


def committed_total(bootstrap: str, group: str, partitions: list) -> int | None:
    """Records the worker has decided and committed (the group's offsets), or None when the broker is away."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            offsets = admin.list_group_offsets(group).get(group, {})
        finally:
            admin.close()
    except Exception:  # the broker is restarting: no sample
        return None
    return sum(offsets[p].offset for p in partitions if p in offsets and offsets[p].offset >= 0)


def writer_map_size(state: str) -> int:
    """The map size the writer last committed with, from the newer of LMDB's two meta pages.

    A reader's own map (``stats``) may be larger than the writer's, so it cannot tell whether the writer grew.
    Layout (64-bit): a 16-byte page header, then magic, version (4 bytes each), address, map size (8 each),
    two 48-byte database records, the last page number and the transaction id (8 each).
    """
    with open(os.path.join(state, "data.mdb"), "rb") as data:
        metas = []
        for number in range(2):
            data.seek(number * PAGE)
            raw = data.read(160)
            metas.append((int.from_bytes(raw[144:152], "little"), int.from_bytes(raw[32:40], "little")))
    return max(metas)[1]


def index_stats(state: str) -> dict | None:
    done = subprocess.run([sys.executable, "-m", "streamdedup", "stats", "--json", "--state", state],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None
    stats = json.loads(done.stdout)
    stats["map_size_bytes"] = writer_map_size(state)
    return stats


def outcomes(bootstrap: str, topics: dict) -> Counter:
    """How many outcomes each input record (topic/partition/offset) has on the output topics (read_committed)."""
    seen: Counter = Counter()
    for kind, topic in topics.items():
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                 enable_auto_commit=False, group_id=None, max_poll_records=5000)
        part = TopicPartition(topic, 0)
        consumer.assign([part])
        consumer.seek_to_beginning(part)
        end = consumer.end_offsets([part])[part]
        idle = 0
        while consumer.position(part) < end and idle < 20:
            polled = consumer.poll(timeout_ms=1000)
            idle = 0 if polled else idle + 1
            for messages in polled.values():
                for m in messages:
                    if kind == "duplicates":
                        source = json.loads(m.value)["source"]
                        seen[f"{source['topic']}/{source['partition']}/{source['offset']}"] += 1
                    else:
                        seen[dict(m.headers)["streamdedup.source"].decode()] += 1
        consumer.close()
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=150, help="documents a second fed (default 150)")
    parser.add_argument("--port", type=int, default=30592, help="the bench broker's port (default 30592)")
    parser.add_argument("--map-mb", type=int, default=8, help="the index's initial map size, MiB (default 8)")
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the index folder and the worker's log")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: stopped by SIGTERM"))  # clean up in ``finally``

    work = tempfile.mkdtemp(prefix="soak-")
    state, log_path = os.path.join(work, "index"), os.path.join(work, "worker.log")
    broker = Broker(args.port)
    bootstrap = broker.start()
    tag = uuid.uuid4().hex[:8]
    names = {"input": f"soak-raw-{tag}", "clean": f"soak-clean-{tag}", "duplicates": f"soak-dups-{tag}",
             "dead": f"soak-dead-{tag}"}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(names["input"], PARTITIONS, 1)]
                        + [NewTopic(n, 1, 1) for k, n in names.items() if k != "input"])
    admin.close()
    group = f"soak-{tag}"
    partitions = [TopicPartition(names["input"], p) for p in range(PARTITIONS)]
    command = [sys.executable, "-m", "streamdedup", "run", "--state", state,
               "--set", f"kafka.bootstrap_servers={bootstrap}", "--set", f"input.topics={names['input']}",
               "--set", f"output.clean_topic={names['clean']}",
               "--set", f"output.duplicates_topic={names['duplicates']}",
               "--set", f"output.dead_letter_topic={names['dead']}", "--set", f"kafka.group_id={group}",
               "--set", f"index.map_size_mb={args.map_mb}", "--set", "metrics.enabled=false",
               "--set", "log.format=json"]
    worker = Worker(command, log_path)
    total_s = args.minutes * 60
    events = sorted([(0.20 * total_s, "worker SIGTERM + restart"), (0.45 * total_s, "broker stop + start"),
                     (0.70 * total_s, "worker SIGTERM + restart")])
    samples: list[dict] = []  # t, committed, rss
    minutes: list[dict] = []  # t, stats
    happened: list[tuple[float, str]] = []
    print(f"soak: {args.minutes:g} min at {args.rate:g} docs/s, broker {bootstrap}, index {state}, "
          f"initial map {args.map_mb} MiB", flush=True)
    ok, feeder = True, None
    try:
        feeder = Feeder(bootstrap, names["input"], args.rate)
        worker.start()
        feeder.start()
        began = time.monotonic()
        next_sample, next_minute = 0.0, 60.0
        while (now := time.monotonic() - began) < total_s:
            if events and now >= events[0][0]:
                _, what = events.pop(0)
                if what.startswith("worker"):
                    took = worker.stop()
                    worker.start()
                    what += f" (stopped in {took:.1f} s)"
                else:
                    broker.stop()
                    time.sleep(20)
                    broker.start()
                happened.append((now, what))
                print(f"  {now / 60:5.1f} min  {what}", flush=True)
            if now >= next_sample:
                samples.append({"t": now, "committed": committed_total(bootstrap, group, partitions),
                                "rss": worker.rss_mb(), "sent": feeder.sent})
                next_sample += args.sample_s
            if now >= next_minute:
                stats = index_stats(state)
                minutes.append({"t": now, "stats": stats, **samples[-1]})
                s = samples[-1]
                anon, mapped = s["rss"] or (0, 0)
                print(f"  {now / 60:5.1f} min  fed {s['sent']:,}  committed {s['committed']}  "
                      f"RSS {anon:.0f} anon + {mapped:.0f} file MiB  "
                      f"index {stats and stats['index_bytes'] / 2**20:.0f} MiB "
                      f"map {stats and stats['map_size_bytes'] / 2**20:.0f} MiB", flush=True)
                next_minute += 60
            time.sleep(0.5)
        feeder.stop.set()
        feeder.join()
        fed_s = time.monotonic() - began
        ends = None
        consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        ends = consumer.end_offsets(partitions)
        consumer.close()
        records = sum(ends.values())
        deadline = time.monotonic() + 600
        while (committed_total(bootstrap, group, partitions) or 0) < records and time.monotonic() < deadline:
            time.sleep(2)
        caught_up_s = time.monotonic() - began - fed_s
        worker.stop()
        final = index_stats(state)
        check = subprocess.run([sys.executable, "-m", "streamdedup", "check", "--state", state],
                               capture_output=True, text=True)
        seen = outcomes(bootstrap, {k: n for k, n in names.items() if k != "input"})
        inputs = {f"{p.topic}/{p.partition}/{o}" for p in partitions for o in range(ends[p])}
        missing = len(inputs - set(seen))
        twice = sum(1 for k, n in seen.items() if n > 1)
        stray = len(set(seen) - inputs)
        ok = check.returncode == 0 and missing == 0 and twice == 0 and stray == 0
        report(args, samples, minutes, happened, feeder, records, final, check, seen, missing, twice, stray,
               caught_up_s, worker.starts)
    finally:
        if feeder is not None:
            feeder.stop.set()
        if worker.process and worker.process.poll() is None:
            worker.process.kill()
        broker.stop(wipe=True)
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def per_minute_rates(minutes: list[dict]) -> list[tuple[dict, Optional[float]]]:
    """Each minute's row with the committed docs/s since the row before (None when the broker did not answer)."""
    rates, last = [], None
    for row in minutes:
        rate = None
        if row["committed"] is not None and last is not None and last["committed"] is not None:
            rate = (row["committed"] - last["committed"]) / (row["t"] - last["t"])
        rates.append((row, rate))
        last = row if row["committed"] is not None else last
    return rates


def report(args, samples, minutes, happened, feeder, records, final, check, seen, missing, twice, stray,
           caught_up_s, starts) -> None:
    rates = per_minute_rates(minutes)
    print(f"\nfed {feeder.sent:,} documents ({feeder.acked:,} acknowledged, {feeder.failed:,} failed); "
          f"{records:,} in the input topic; caught up {caught_up_s:.0f} s after the feed stopped; "
          f"{starts} worker starts")
    print(f"\n  {'minute':>6} {'docs/s':>8} {'anon MiB':>9} {'file MiB':>9} {'index MiB':>10} {'map MiB':>8} "
          f"{'B/doc':>7}  event")
    events_at: dict[int, list[str]] = {}  # each event under the first minute row at or after it
    for at, what in happened:
        first = next((n for n, (row, _) in enumerate(rates) if row["t"] >= at), len(rates) - 1)
        events_at.setdefault(first, []).append(what)
    for number, (row, rate) in enumerate(rates):
        t, stats = row["t"], row["stats"]
        window = [s["rss"] for s in samples if t - 60 < s["t"] <= t and s["rss"]]
        anon, mapped = max((a for a, _ in window), default=0), max((f for _, f in window), default=0)
        size = f"{stats['index_bytes'] / 2**20:10.0f} {stats['map_size_bytes'] / 2**20:8.0f}" if stats else " " * 19
        per_doc = f"{stats['map_used_bytes'] / stats['documents']:7.0f}" if stats and stats["documents"] else " " * 7
        what = "; ".join(events_at.get(number, ()))
        shown = f"{rate:8.0f}" if rate is not None else f"{'-':>8}"
        print(f"  {round(t / 60):>6} {shown} {anon:>9.0f} {mapped:>9.0f} {size} {per_doc}  {what}")
    steady = [r for _, r in rates if r is not None]
    if steady:
        third = max(len(steady) // 3, 1)
        print(f"\n  docs/s: median {statistics.median(steady):.0f} (fed {args.rate:g}); first third "
              f"{statistics.median(steady[:third]):.0f}, last third {statistics.median(steady[-third:]):.0f}")
    rss = [s["rss"][0] for s in samples if s["rss"]]
    if rss:
        third = max(len(rss) // 3, 1)
        print(f"  anonymous RSS (the worker's own memory): median of the first third "
              f"{statistics.median(rss[:third]):.0f} MiB, of the last third "
              f"{statistics.median(rss[-third:]):.0f} MiB, peak {max(rss):.0f} MiB")
    if final:
        print(f"  index: {final['documents']:,} documents, {final['index_bytes']:,} bytes on disk, map "
              f"{final['map_size_bytes'] / 2**20:.0f} MiB (started at {args.map_mb} MiB), "
              f"{final['map_used_bytes'] / max(final['documents'], 1):,.0f} bytes a document in use")
    said = check.stdout.strip().splitlines()[-1] if check.stdout.strip() else check.stderr.strip()[-300:]
    print(f"  streamdedup check: exit {check.returncode}: {said}")
    print(f"  outcomes: {sum(seen.values()):,} for {records:,} input records; missing {missing}, "
          f"more than one {twice}, not an input record {stray}")


if __name__ == "__main__":
    sys.exit(main())
