"""Growth benchmark: does the per-document cost stay flat as the index grows?

Feeds the synthetic crawl (slices of 10,000 documents, each its own
articles, all in one invented language) into one on-disk index (default configuration,
durable commits, preparation in a second process) and, when the index holds
10k, 100k and 1M documents, measures a window of new documents: docs/s,
median and p99 batch latency, the process's resident memory (its own, and the index pages LMDB maps in), and the index's
bytes per document with every table of 2 bytes a document or more.

The window is ``index.merge_every`` documents (100,000), so each holds
one merge's worth of work moving the recent lookup keys into the tables
(spread over the batches: a slice after each): the figures are amortized.
Beside docs/s (wall clock, which a shared machine moves), each row gives the
deciding process's CPU time a document, and what grows with the index: the
band filter's fill and false-positive rate (random keys it says it may hold),
the id and content tables' hash filter's false-positive rate (random ids)
and size, the cursor positionings a batch's lookups make (keys past the
filter, once per run of serials its filter layers cover), the band table's B-tree depth and entries a bucket,
the page faults a document (index pages touched for the first time), the
bytes written a document (handed to write calls; beside them the page cache
dirtied, which the kernel counts by the folio: ``written_bytes``), and the
time of the merge steps. A window
starts where the index stands: after the first window the index holds
110,000 documents, so that is the second row (earlier versions fed documents
100,000-110,000 twice there, which made it look faster).

Run: ``python -m bench.growth`` (``--sizes 10000,100000,1000000 --window 100000 [--set lsh.bands=20 ...]``);
``--timeline FILE`` writes every measured batch (its time, CPU, deciding CPU, filter layers and merge steps)
and each window prints its five slowest batches and where its CPU went (deciding, committing, merge steps);
``--perf DIR`` and ``--profile DIR`` record each window with ``perf record`` or cProfile.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy

from streamdedup import config as config_module
from streamdedup.core import corpus
from streamdedup.core.decode import InputSpec
from streamdedup.engine.engine import Engine
from streamdedup.core import lsh
from streamdedup.store import bandfilter, bands as bands_module, hashed
from streamdedup.runtime.feed import open_feed
from streamdedup.runtime.source import FilePosition


def memory() -> dict:
    """Resident memory now: anonymous (the process's own) and file-backed (index pages mapped by LMDB), and the
    peak of both together (VmHWM)."""
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("RssAnon:", "RssFile:", "VmHWM:")):
                found[line.split(":")[0]] = int(line.split()[1]) * 1024
    return found


def written_bytes(field: str = "wchar") -> int:
    """Bytes this process wrote so far (``/proc/self/io``; 0 where not readable): handed to write calls
    (``wchar``: LMDB's pages and the filters' files, which is what reaches the disk), or with ``write_bytes``
    the page cache it dirtied, which the kernel counts a whole folio at a time: a 4 KiB page written into a
    2 MiB folio counts 2 MiB (ext4's large folios, Linux 6.16 on; LMDB writes runs of pages with ``writev``,
    which makes large folios), so that figure grows with the index where the disk's writes do not."""
    try:
        with open("/proc/self/io") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0


class Counted:
    """What the window's lookups and merge steps did: band keys asked, asked past the filter, cursor
    positionings in the table (past the filter, once per run its filter layers cover), and the merge steps' count
    and seconds."""

    def __init__(self) -> None:
        self.asked = self.wanted = self.positionings = self.steps = 0
        self.merge_s = 0.0
        self.merge_max_s = 0.0
        self.log: list[tuple[int, float, float]] = getattr(self, "log", [])  # every step: (merge's upto, s, CPU s)
        self.kinds: list[str] = getattr(self, "kinds", [])  # every step: what it did (slice n/m, seal, finish n)
        self.decide_cpu = getattr(self, "decide_cpu", 0.0)  # CPU seconds deciding (before the commit), in all

    def install(self, engine: Engine) -> None:
        counted, original_rows, original_step = self, bands_module.BandRows.stored_rows, engine._merge_step

        def stored_rows(rows, txn, bands, keys, last_serial, asked=None, bases=None):
            counted.wanted += len(keys)
            runs = len(bases) if bases is not None else (last_serial >> bands_module._EPOCH_BITS) + 1
            counted.positionings += int(asked.sum()) if asked is not None else len(keys) * runs
            return original_rows(rows, txn, bands, keys, last_serial, asked, bases)

        original_lookup = engine.bands.lookup

        def lookup(txn, mirror, slots):
            counted.asked += len(slots)
            return original_lookup(txn, mirror, slots)

        def merge_step():
            merge = engine._merge
            upto, began, cpu = merge.upto, time.monotonic(), time.process_time()
            kind = f"slice {merge.done + 1}/{merge.slices}" if merge.done < merge.slices else \
                ("seal" if not merge.sealed else f"finish {merge.finished + 1}")
            original_step()
            took = time.monotonic() - began
            counted.log.append((upto, took, time.process_time() - cpu))
            counted.kinds.append(kind)
            counted.steps += 1
            counted.merge_s += took
            counted.merge_max_s = max(counted.merge_max_s, took)

        original_decide = engine.decide

        def decide(batch, bookkeeping=None):
            cpu = time.process_time()
            decided = original_decide(batch, bookkeeping)
            counted.decide_cpu += time.process_time() - cpu
            return decided

        bands_module.BandRows.stored_rows = stored_rows
        engine.bands.lookup = lookup
        engine.decide = decide
        engine._merge_step = merge_step

    def reset(self) -> None:
        self.__init__()  # keeps the log


def charged(row: dict, log: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(seconds, CPU seconds) of a window charged with the merges that began in it, and not with the steps of
    merges begun before it: a merge's steps follow it over the next documents, into the next window or past
    it, so each window is charged one merge's worth (``index.merge_every`` documents) whatever the phase."""
    first, last = row["serials"]
    begun = lambda upto: first < upto <= last  # noqa: E731
    inside = range(*row["steps"])
    seconds, cpu = row["seconds"], row["cpu_s"]
    for number, (upto, took, took_cpu) in enumerate(log):
        if (number in inside) != begun(upto):
            sign = 1 if begun(upto) else -1
            seconds, cpu = seconds + sign * took, cpu + sign * took_cpu
    return seconds, cpu


def filter_figures(engine: Engine) -> tuple[float, float, float]:
    """(fill ratio, false-positive rate, MB) of the writer's band filter: the share of a million random band
    slots (a band of the index's, a random 32-bit key) it says it may hold (nearly all of them are not stored)."""
    band_filter = engine.bands.loaded_filter()
    if band_filter is None:
        return 0.0, 1.0, 0.0
    rng = numpy.random.default_rng(7)
    slots = lsh.band_slots(rng.integers(0, engine.signing.bands, 1 << 20), rng.integers(0, 1 << 32, 1 << 20))
    held = band_filter.may_hold(bandfilter.slot_keys(slots))
    return band_filter.fill_ratio(), float(held.mean()), band_filter.size_bytes / 1e6


def band_tree(engine: Engine) -> tuple[int, float]:
    """(depth of the band table's B-tree of buckets, band entries a bucket)."""
    with engine.index.read() as txn:
        stat = txn.txn.stat(txn.dbs["bands"])
        buckets = sum(1 for _ in txn.txn.cursor(db=txn.dbs["bands"]).iternext_nodup(keys=True, values=False))
    return stat["depth"], stat["entries"] / max(1, buckets)


class Crawl:
    """The synthetic crawl, generated a slice at a time and written to a file, so it is never all in memory."""

    SLICE = 10000  # documents per slice; each slice is a crawl of its own (own seed, own id prefix)...
    VOCABULARY_SEED = 0  # ...in one language: a slice of its own words would share almost no shingle with others

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def write(self, start: int, end: int) -> str:
        """The documents [start, end) as a JSONL file (made before the clock starts)."""
        import json

        path = os.path.join(self.folder, f"crawl-{start}-{end}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            for number in range(start // self.SLICE, (end - 1) // self.SLICE + 1):
                docs = corpus.generate(int(self.SLICE / 1.83) + 60, seed=number,
                                       vocabulary_seed=self.VOCABULARY_SEED)[: self.SLICE]
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
    parser.add_argument("--timeline", metavar="FILE",
                        help="write every measured batch here: size, batch, seconds, CPU seconds, filter layers, "
                             "merge steps (what:seconds)")
    parser.add_argument("--perf", metavar="DIR",
                        help="record each window with `perf record -g` (this process) into DIR/window-SIZE.data")
    parser.add_argument("--profile", metavar="DIR",
                        help="profile each window with cProfile (slower) into DIR/window-SIZE.prof")
    args = parser.parse_args(argv)
    timeline_out = open(args.timeline, "w") if args.timeline else None
    sizes = [int(s) for s in args.sizes.split(",")]
    cfg = config_module.load(None, args.set, environ={})
    batch = cfg.worker.batch_size
    work = tempfile.mkdtemp(prefix="bench-growth-")
    docs = Crawl(work)
    rows = []
    counted = Counted()
    try:
        with Engine(cfg, os.path.join(work, "state")) as engine:
            counted.install(engine)
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
                counted.reset()
                with engine.index.read() as txn:
                    first_serial = txn.counters["next_serial"]
                first_step = len(counted.log)
                recorder = perf_record(args.perf, held) if args.perf else None
                usage, wrote = resource.getrusage(resource.RUSAGE_SELF), written_bytes()
                dirtied = written_bytes("write_bytes")
                window_began = time.monotonic()
                timeline: list = []
                profiler = __import__("cProfile").Profile() if args.profile else None
                if profiler is not None:
                    profiler.enable()
                feed(engine, window, batch, processes, latencies, timeline, counted)
                if profiler is not None:
                    profiler.disable()
                    os.makedirs(args.profile, exist_ok=True)
                    profiler.dump_stats(os.path.join(args.profile, f"window-{held}.prof"))
                seconds = time.monotonic() - window_began
                after = resource.getrusage(resource.RUSAGE_SELF)
                window_use = {"cpu_s": after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime,
                              "faults": after.ru_minflt + after.ru_majflt - usage.ru_minflt - usage.ru_majflt,
                              "written": written_bytes() - wrote, "dirtied": written_bytes("write_bytes") - dirtied,
                              "counted": vars(counted).copy()}
                if recorder is not None:
                    recorder.send_signal(__import__("signal").SIGINT)
                    recorder.wait()
                os.remove(window)
                position = held + args.window
                rows.append(measure_row(engine, held, args.window, seconds, latencies, window_use))
                rows[-1]["serials"] = (first_serial, first_serial + args.window)
                rows[-1]["steps"] = (first_step, len(counted.log))
                print_row(rows[-1], flush=True)
                show_timeline(held, timeline, timeline_out)
            engine.merge_recent()  # the last merge's steps left: charged to the window it began in
            for row in rows:
                row["charged_s"], row["charged_cpu_s"] = charged(row, counted.log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    return 0


def perf_record(folder: str, size: int):
    """``perf record`` of this process (every thread, call graphs) until it is sent SIGINT."""
    import subprocess

    os.makedirs(folder, exist_ok=True)
    recorder = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-p", str(os.getpid()), "-o",
                                 os.path.join(folder, f"window-{size}.data")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached before the window starts
    return recorder


def feed(engine: Engine, path: str, batch: int, processes: int, latencies, timeline=None, counted=None) -> None:
    """Decide every batch of ``path`` as the ``dedup`` command reads it (the feed prepares the next one meanwhile);
    with ``latencies``, time each decision; with ``timeline``, note each batch: (seconds, CPU seconds, the merge
    steps it did as (what, seconds), the filter's layers after it)."""
    source = open_feed([path], InputSpec(), engine.signing, batch, processes, FilePosition())
    try:
        for fed in source.batches():
            began, cpu, steps = time.monotonic(), time.process_time(), len(counted.log) if counted else 0
            deciding = counted.decide_cpu if counted else 0.0
            engine.decide_batch(fed.prepared)
            if latencies is not None:
                latencies.append(time.monotonic() - began)
            if timeline is not None:
                band_filter = engine.bands.loaded_filter()
                timeline.append((latencies[-1], time.process_time() - cpu,
                                 [(kind, took, step_cpu) for kind, (_, took, step_cpu) in
                                  zip(counted.kinds[steps:], counted.log[steps:])],
                                 len(band_filter.layers) if band_filter is not None else 0,
                                 counted.decide_cpu - deciding))
    finally:
        source.close()


def show_timeline(size: int, timeline: list, out) -> None:
    """The window's batches one a line in ``out`` (if given), and its five slowest on stdout; where the deciding
    process's CPU went: deciding, committing, the merge steps."""
    if out is not None:
        for number, (took, cpu, steps, layers, deciding) in enumerate(timeline):
            out.write(f"{size}\t{number}\t{took:.4f}\t{cpu:.4f}\t{layers}\t{deciding:.4f}\t"
                      + ",".join(f"{kind}:{seconds:.3f}:{step_cpu:.3f}" for kind, seconds, step_cpu in steps) + "\n")
        out.flush()
    slowest = sorted(range(len(timeline)), key=lambda n: -timeline[n][0])[:5]
    print("    slowest batches: " + "; ".join(
        f"#{n} {timeline[n][0]:.3f} s (CPU {timeline[n][1]:.3f}, layers {timeline[n][3]}, steps "
        + (",".join(f"{kind} {seconds:.3f}" for kind, seconds, _ in timeline[n][2]) or "none") + ")"
        for n in slowest))
    deciding = sum(entry[4] for entry in timeline)
    merging = sum(step_cpu for entry in timeline for _, _, step_cpu in entry[2])
    batches = sum(entry[1] for entry in timeline)
    print(f"    CPU of the window's batches: deciding {deciding:.2f} s, committing {batches - deciding - merging:.2f} s, "
          f"merge steps {merging:.2f} s", flush=True)


def hash_filter_figures(engine: Engine) -> tuple[float, float]:
    """(false-positive rate, MB) of the writer's filter of the id and content tables' hashes (``hashed``): the
    share of a million random ids' hashes it says the id table may hold; (1, 0) without one."""
    engine.bands.loaded_filter()
    hash_filter = engine.bands.hash_filter
    if hash_filter is None:
        return 1.0, 0.0
    words = numpy.random.default_rng(8).integers(0, 1 << 63, 1 << 20, dtype=numpy.uint64)
    return float(hash_filter.may_hold(hashed.salted("ids", words)).mean()), hash_filter.size_bytes / 1e6


def measure_row(engine: Engine, size: int, window: int, seconds: float, latencies: list[float],
                use: dict) -> dict:
    with engine.index.read() as txn:
        documents = txn.counters["documents"]
    tables = engine.index.database_bytes()
    file_bytes = os.path.getsize(os.path.join(engine.index.path, "data.mdb"))
    ordered = sorted(latencies)
    counted, batches = use["counted"], max(1, len(latencies))
    fill, false_positives, filter_mb = filter_figures(engine)
    depth, per_bucket = band_tree(engine)
    hash_fp, hash_mb = hash_filter_figures(engine)
    return {
        "size": size,
        "docs_per_s": window / seconds,
        "cpu_us_per_doc": 1e6 * use["cpu_s"] / window,
        "seconds": seconds,
        "cpu_s": use["cpu_s"],
        "median_batch_s": statistics.median(ordered),
        "p99_batch_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_batch_s": ordered[-1],
        "anon_mb": memory().get("RssAnon", 0) / 1e6,
        "file_mb": memory().get("RssFile", 0) / 1e6,
        "peak_rss_mb": memory().get("VmHWM", 0) / 1e6,
        "filter_fill": fill,
        "filter_fp": false_positives,
        "filter_mb": filter_mb,
        "hash_filter_fp": hash_fp,
        "hash_filter_mb": hash_mb,
        "asked_per_batch": counted["asked"] / batches,
        "past_filter_per_batch": counted["wanted"] / batches,
        "positionings_per_batch": counted["positionings"] / batches,
        "band_depth": depth,
        "entries_per_bucket": per_bucket,
        "faults_per_doc": use["faults"] / window,
        "written_per_doc": use["written"] / window,
        "dirtied_per_doc": use["dirtied"] / window,
        "merge_steps": counted["steps"],
        "merge_s": counted["merge_s"],
        "merge_max_s": counted["merge_max_s"],
        "bytes_per_doc": file_bytes / documents,
        "top_tables": [(name, used) for name, used in sorted(tables.items(), key=lambda item: -item[1])
                       if used >= 2 * documents],  # every table of 2 bytes a document or more
        "documents": documents,
    }


def print_row(row: dict, flush: bool = False) -> None:
    tables = ", ".join(f"{name} {bytes_ / row['documents']:.0f}" for name, bytes_ in row["top_tables"])
    print(f"index {row['size']:>9,}: {row['docs_per_s']:>8,.0f} docs/s ({row['cpu_us_per_doc']:.0f} us CPU a doc)  "
          f"batch median {row['median_batch_s']:.3f} s p99 {row['p99_batch_s']:.3f} s max {row['max_batch_s']:.3f} s  "
          f"RSS anon {row['anon_mb']:,.0f} MB, mapped index {row['file_mb']:,.0f} MB, peak {row['peak_rss_mb']:,.0f} MB  "
          f"{row['bytes_per_doc']:,.0f} B/doc "
          f"(per doc: {tables})\n"
          f"    grows: filter fill {row['filter_fill']:.3f} false positives {row['filter_fp']:.4f} "
          f"({row['filter_mb']:,.0f} MB); id and content hash filter false positives "
          f"{row['hash_filter_fp']:.4f} ({row['hash_filter_mb']:,.1f} MB); a batch asks "
          f"{row['asked_per_batch']:,.0f} keys, {row['past_filter_per_batch']:,.0f} past the filter, "
          f"{row['positionings_per_batch']:,.0f} cursor positionings; band tree depth {row['band_depth']}, "
          f"{row['entries_per_bucket']:,.0f} entries a bucket; {row['faults_per_doc']:.1f} page faults and "
          f"{row['written_per_doc']:,.0f} bytes written a doc ({row['dirtied_per_doc']:,.0f} of page cache dirtied, "
          f"counted by the folio); merge {row['merge_steps']} steps, "
          f"{row['merge_s']:.1f} s (longest {row['merge_max_s']:.2f} s)", flush=flush)


def print_table(rows: list[dict]) -> None:
    window = rows[0]["serials"][1] - rows[0]["serials"][0]
    rate = [window / row["charged_s"] for row in rows]
    cpu = [1e6 * row["charged_cpu_s"] / window for row in rows]
    print("\n(each window charged with the merge that began in it: docs/s and CPU us a document)")
    print("index size   docs/s   vs first   CPU us/doc   vs first   median batch   p99 batch   p99/median   "
          "RSS anon MB   peak RSS MB   bytes/doc")
    for number, row in enumerate(rows):
        print(f"{row['size']:>10,} {rate[number]:>8,.0f} {rate[number] / rate[0]:>9.2f}x "
              f"{cpu[number]:>11.0f} {cpu[0] / cpu[number]:>9.2f}x "
              f"{row['median_batch_s']:>11.3f} s {row['p99_batch_s']:>9.3f} s {row['p99_batch_s'] / row['median_batch_s']:>11.1f}x "
              f"{row['anon_mb']:>12,.0f} {row['peak_rss_mb']:>13,.0f} {row['bytes_per_doc']:>10,.0f}")


if __name__ == "__main__":
    sys.exit(main())
