"""Growth benchmark: does the per-document cost stay flat as the index grows?

Feeds the synthetic crawl into one on-disk index (default configuration,
durable commits, preparation in a second process) and, when the index holds
10k, 100k and 1M documents, measures the next window of documents: docs/s,
median and p99 batch latency, the process's resident memory, and the index's
bytes per document with the tables that take the most space.

Run: ``python bench/growth.py`` (``--sizes 10000,100000,1000000 --window 40000``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from streamdedup import config as config_module
from streamdedup import corpus
from streamdedup.decode import InputSpec
from streamdedup.engine import Engine, Preparer
from streamdedup.records import Source
from streamdedup.source import RawRecord


def rss_bytes() -> int:
    """Resident memory of this process now (not the peak)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def records_of(docs, start: int) -> list[RawRecord]:
    import json

    return [RawRecord(json.dumps({"id": d.id, "text": d.text}).encode(), Source("growth", -1, start + i))
            for i, d in enumerate(docs)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--window", type=int, default=40000, help="documents measured at each size")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    total = max(sizes) + args.window
    began = time.monotonic()
    docs = corpus.generate(int(total / 1.83) + 1, seed=7)[:total]
    print(f"generated {len(docs):,} documents in {time.monotonic() - began:.0f} s", flush=True)
    cfg = config_module.load(None, environ={})
    batch = cfg.worker.batch_size
    work = tempfile.mkdtemp(prefix="bench-growth-")
    rows = []
    try:
        with Engine(cfg, os.path.join(work, "state")) as engine:
            preparer = Preparer(engine.signing, InputSpec(), cfg.worker.prepare_processes)
            try:
                position = 0
                for size in sizes:
                    position = feed(engine, preparer, docs, position, size, batch, None)
                    latencies: list[float] = []
                    window_began = time.monotonic()
                    position = feed(engine, preparer, docs, position, size + args.window, batch, latencies)
                    seconds = time.monotonic() - window_began
                    rows.append(measure_row(engine, size, args.window, seconds, latencies))
                    print_row(rows[-1], flush=True)
            finally:
                preparer.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    return 0


def feed(engine: Engine, preparer: Preparer, docs, position: int, until: int, batch: int, latencies) -> int:
    """Decide documents until the index holds ``until``; with ``latencies``, time each batch."""
    ahead = None
    while position < until or ahead is not None:
        current, ahead = ahead, None
        if position < until:
            chunk = docs[position:min(position + batch, until)]
            records = records_of(chunk, position)
            ahead = (records, preparer.submit(records))
            position += len(chunk)
        if current is not None:
            began = time.monotonic()
            engine.decide_batch(current[1].result())
            if latencies is not None:
                latencies.append(time.monotonic() - began)
    return position


def measure_row(engine: Engine, size: int, window: int, seconds: float, latencies: list[float]) -> dict:
    with engine.index.read() as txn:
        documents = txn.counters["documents"]
    tables = engine.index.database_bytes()
    file_bytes = os.path.getsize(os.path.join(engine.index.path, "data.mdb"))
    ordered = sorted(latencies)
    return {
        "size": size,
        "docs_per_s": window / seconds,
        "median_batch_s": statistics.median(ordered),
        "p99_batch_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "rss_mb": rss_bytes() / 1e6,
        "bytes_per_doc": file_bytes / documents,
        "top_tables": sorted(tables.items(), key=lambda item: -item[1])[:3],
        "documents": documents,
    }


def print_row(row: dict, flush: bool = False) -> None:
    tables = ", ".join(f"{name} {bytes_ / row['documents']:.0f}" for name, bytes_ in row["top_tables"])
    print(f"index {row['size']:>9,}: {row['docs_per_s']:>8,.0f} docs/s  batch median {row['median_batch_s']:.3f} s "
          f"p99 {row['p99_batch_s']:.3f} s  RSS {row['rss_mb']:,.0f} MB  {row['bytes_per_doc']:,.0f} B/doc "
          f"(per doc: {tables})", flush=flush)


def print_table(rows: list[dict]) -> None:
    first = rows[0]["docs_per_s"]
    print("\nindex size   docs/s   vs first   p99 batch   RSS MB   bytes/doc")
    for row in rows:
        print(f"{row['size']:>10,} {row['docs_per_s']:>8,.0f} {row['docs_per_s'] / first:>9.2f}x "
              f"{row['p99_batch_s']:>9.3f} s {row['rss_mb']:>8,.0f} {row['bytes_per_doc']:>10,.0f}")


if __name__ == "__main__":
    sys.exit(main())
