"""A transaction's records handed to kafka-python, three ways, each contender in a fresh process, alternated.

- ``send``: ``KafkaProducer.send`` a record;
- ``accumulator``: ``RecordAppender``, a record straight into the client's
  record accumulator (its pure-Python record batch builder);
- ``built``: ``BatchAppender``, a partition's records laid out in record
  batches by the C kernel at the end of the batch.

Each process makes a transactional producer as the worker's sink does
(``linger_ms`` 100, 1 MiB record batches), runs one transaction to warm up,
then ``--transactions`` transactions of ``--records`` records (1 KB values,
a 16-byte key, the three headers of a kept record) into a 3-partition topic,
and reports per record the median over its transactions of: the producing
thread's wall time to hand the records over (appends and ``done``), and the
process's CPU time for the whole transaction (the sender thread's encoding,
closing and sending of the batches and the commit included).

Run: ``python -m bench.appender --rounds 5`` (needs KAFKA_BOOTSTRAP, a broker of your own).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

from bench import harness

CONTENDERS = ("send", "accumulator", "built")


def records(n: int) -> list[tuple]:
    return [(i % 3, f"{i:016d}".encode(), bytes([97 + i % 26]) * 1000,
             [("streamdedup.cluster", f"{i}".encode()), ("streamdedup.id", f"doc-{i}".encode()),
              ("streamdedup.source", f"raw/0/{i}".encode())]) for i in range(n)]


def measure(bootstrap: str, contender: str, n: int, transactions: int) -> dict:
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    from streamdedup.runtime.sink.appender import BatchAppender, RecordAppender

    topic = f"bench-appender-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"bench-{topic}", linger_ms=100,
                             batch_size=1 << 20, max_request_size=2 << 20)
    producer.init_transactions()
    producer.partitions_for(topic)
    appender = {"send": None, "accumulator": RecordAppender(producer), "built": BatchAppender(producer)}[contender]
    rows = records(n)
    handing, cpu = [], []
    try:
        for number in range(transactions + 1):
            began_cpu = time.process_time()
            producer.begin_transaction()
            began = time.perf_counter()
            if appender is None:
                for partition, key, value, headers in rows:
                    producer.send(topic, key=key, value=value, headers=headers, partition=partition)
            else:
                for partition, key, value, headers in rows:
                    appender.append(topic, partition, key, value, headers)
                appender.done()
            handed = time.perf_counter() - began
            producer.commit_transaction()
            if number:  # the first warms up
                handing.append(handed / n * 1e9)
                cpu.append((time.process_time() - began_cpu) / n * 1e9)
    finally:
        producer.close()
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.delete_topics([topic])
        admin.close()
    return {"handing_ns": statistics.median(handing), "cpu_ns": statistics.median(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--transactions", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        parser.error("set KAFKA_BOOTSTRAP to a broker of your own")
    if args.child:
        import json

        print(json.dumps(measure(bootstrap, args.contender, args.records, args.transactions)))
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    cpu: dict[str, list[float]] = {}

    def run(name: str, number: int) -> float:
        found = harness.child("bench.appender", "--contender", name, "--records", str(args.records),
                              "--transactions", str(args.transactions))
        cpu.setdefault(name, []).append(found["cpu_ns"])
        return found["handing_ns"]

    handing = harness.interleaved(CONTENDERS, args.rounds, run, alternate=True, unit="ns a record (handing over)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("\nproducing thread, handing a record over:")
    print(harness.table(handing, "accumulator", unit="ns a record", higher_is_better=False))
    print("\nprocess CPU a record, the whole transaction:")
    print(harness.table(cpu, "accumulator", unit="ns a record", higher_is_better=False))


if __name__ == "__main__":
    main()
