"""Growth benchmark: does the per-document cost stay flat as the index grows?

Feeds the synthetic crawl into one on-disk index (default configuration,
durable commits, preparation in a second process) and, when the index holds
10k, 100k and 1M documents, measures a window of new documents: docs/s,
median and p99 batch latency, the process's resident memory (its own, and the index pages LMDB maps in), and the index's
bytes per document with every table of 2 bytes a document or more.

The window is ``index.merge_every`` documents (100,000), so each holds
exactly one merge of the recent lookup keys into the tables: the figures
are amortized, and the p99 batch includes the batch that merges. A window
starts where the index stands: after the first window the index holds
110,000 documents, so that is the second row (earlier versions fed documents
100,000-110,000 twice there, which made it look faster).

Run: ``python -m bench.growth`` (``--sizes 10000,100000,1000000 --window 100000 [--set lsh.bands=20 ...]``).
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
from streamdedup.core import corpus
from streamdedup.core.decode import InputSpec
from streamdedup.engine.engine import Engine
from streamdedup.runtime.feed import open_feed
from streamdedup.runtime.source import FilePosition


def memory() -> dict:
    """Resident memory now: anonymous (the process's own) and file-backed (index pages mapped by LMDB)."""
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("RssAnon:", "RssFile:")):
                found[line.split(":")[0]] = int(line.split()[1]) * 1024
    return found


class Crawl:
    """The synthetic crawl, generated a slice at a time and written to a file, so it is never all in memory."""

    SLICE = 10000  # documents per slice; each slice is a crawl of its own (own seed, own id prefix)

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def write(self, start: int, end: int) -> str:
        """The documents [start, end) as a JSONL file (made before the clock starts)."""
        import json

        path = os.path.join(self.folder, f"crawl-{start}-{end}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            for number in range(start // self.SLICE, (end - 1) // self.SLICE + 1):
                docs = corpus.generate(int(self.SLICE / 1.83) + 60, seed=number)[: self.SLICE]
                for offset, d in enumerate(docs):
                    if start <= number * self.SLICE + offset < end:
                        handle.write(json.dumps({"id": f"s{number}-{d.id}", "text": d.text}) + "\n")
        return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--window", type=int, default=100000, help="documents measured at each size")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting other than the default (repeatable), e.g. lsh.bands=20")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cfg = config_module.load(None, args.set, environ={})
    batch = cfg.worker.batch_size
    work = tempfile.mkdtemp(prefix="bench-growth-")
    docs = Crawl(work)
    rows = []
    try:
        with Engine(cfg, os.path.join(work, "state")) as engine:
            processes = cfg.worker.prepare_processes
            position = 0
            for size in sizes:
                for begin in range(position, size, 100000):  # fill in steps, so no file is large
                    filled = docs.write(begin, min(begin + 100000, size))
                    feed(engine, filled, batch, processes, None)
                    os.remove(filled)
                held = max(size, position)  # an earlier window can take the index past ``size``
                window = docs.write(held, held + args.window)  # new documents; generating text is not timed
                latencies: list[float] = []
                window_began = time.monotonic()
                feed(engine, window, batch, processes, latencies)
                seconds = time.monotonic() - window_began
                os.remove(window)
                position = held + args.window
                rows.append(measure_row(engine, held, args.window, seconds, latencies))
                print_row(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    return 0


def feed(engine: Engine, path: str, batch: int, processes: int, latencies) -> None:
    """Decide every batch of ``path`` as the ``dedup`` command reads it (the feed prepares the next one meanwhile);
    with ``latencies``, time each decision."""
    source = open_feed([path], InputSpec(), engine.signing, batch, processes, FilePosition())
    try:
        for fed in source.batches():
            began = time.monotonic()
            engine.decide_batch(fed.prepared)
            if latencies is not None:
                latencies.append(time.monotonic() - began)
    finally:
        source.close()


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
        "anon_mb": memory().get("RssAnon", 0) / 1e6,
        "file_mb": memory().get("RssFile", 0) / 1e6,
        "bytes_per_doc": file_bytes / documents,
        "top_tables": [(name, used) for name, used in sorted(tables.items(), key=lambda item: -item[1])
                       if used >= 2 * documents],  # every table of 2 bytes a document or more
        "documents": documents,
    }


def print_row(row: dict, flush: bool = False) -> None:
    tables = ", ".join(f"{name} {bytes_ / row['documents']:.0f}" for name, bytes_ in row["top_tables"])
    print(f"index {row['size']:>9,}: {row['docs_per_s']:>8,.0f} docs/s  batch median {row['median_batch_s']:.3f} s "
          f"p99 {row['p99_batch_s']:.3f} s  RSS anon {row['anon_mb']:,.0f} MB, mapped index {row['file_mb']:,.0f} MB  "
          f"{row['bytes_per_doc']:,.0f} B/doc "
          f"(per doc: {tables})", flush=flush)


def print_table(rows: list[dict]) -> None:
    first = rows[0]["docs_per_s"]
    print("\nindex size   docs/s   vs first   median batch   p99 batch   RSS anon MB   bytes/doc")
    for row in rows:
        print(f"{row['size']:>10,} {row['docs_per_s']:>8,.0f} {row['docs_per_s'] / first:>9.2f}x "
              f"{row['median_batch_s']:>11.3f} s {row['p99_batch_s']:>9.3f} s {row['anon_mb']:>11,.0f} "
              f"{row['bytes_per_doc']:>10,.0f}")


if __name__ == "__main__":
    sys.exit(main())
