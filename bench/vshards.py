"""Band tables split by key (``engine.vshards``): what each process pays per document, fitted and projected.

For each vshard count S (default 1, 4, 16, 64; one vshard per process),
in a fresh process: the synthetic crawl (templates off, ``lsh.cap =
"probes"``) cut into epochs of ``--epoch`` documents per vshard (ticks grow
with the deployment, as they must to keep the messages per document flat),
decided by the in-process simulator (``vshards.simulator``: every message
packed, delivered in a seeded order). Measured:

- the CPU each process spends per document of the stream (the mean and the
  busiest), fitted as a + b/S: a is what every process pays on every
  document whatever S (the replicated part), b/S its share of the rest;
- the CPU of every stage summed over processes (the total work), against
  the single worker (``Engine`` on an LMDB index, the same order and
  settings, batches of ``--epoch``) in a fresh process of its own;
- the bytes of every kind of message per document (what the exchange
  topics would carry), and the documents linked within their epoch.

Then the throughput those costs give machines of 16 cores (one process a
core): 1 / (a + b / cores), and what caps it. The vshards' state is in
memory (``--store memory``, the default) or in LMDB (``--store lmdb``: one
environment a vshard in a temporary folder, each epoch committed with a
sync of its data, as a deployment runs them; then the bytes a document the
states take on disk are printed too), and Kafka's own costs (client, broker)
are not in these figures: the projection is the engine's ceiling, to be
checked end to end by ``bench/sharded.py``.

    .venv/bin/python -m bench.vshards [--docs 100000] [--shards 1,4,16,64] [--epoch 250] [--rounds 3]
        [--corpus crawl|hot-key|copies|big-site] [--store memory|lmdb] [--recent-places N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from bench import harness


def _items(docs: int):
    from streamdedup.core import corpus
    from streamdedup.core.records import Document, Source

    articles = int(docs / 1.86) + 1
    made = corpus.generate(articles, seed=7)[:docs]
    return [Document(doc.id, doc.text, Source("in", 0, i)) for i, doc in enumerate(made)]


def _hot_band(items, share: float = 0.5, seed: int = 11):
    """``items`` with one band key put in ``share`` of them: four three-word phrases, each the smallest of
    100,000 under one of band 0's rows, appended (so band 0 of those documents is the phrases')."""
    import random

    from streamdedup.core.prepare import prepare
    from streamdedup.core.records import Document, Source
    from streamdedup.core.signing import SigningConfig

    draw = random.Random(seed)
    signing = SigningConfig(cap="probes")
    phrases = [f"zq{draw.randrange(10**9)} zr{draw.randrange(10**9)} zs{draw.randrange(10**9)}" for _ in range(100000)]
    batch = prepare([Document(str(i), p, Source("hot", 0, i)) for i, p in enumerate(phrases)], signing)
    from streamdedup.core.signing import sign_batch

    signatures = sign_batch(batch.shingles, signing.num_perm, signing.seed)
    block = " . ".join(phrases[int(signatures[:, row].argmin())] for row in range(signing.rows))
    return [Document(item.id, item.text + " . " + block, item.source) if draw.random() < share else item
            for item in items]


def _copies(items, copies: int, seed: int = 13):
    """``items`` with ``copies`` exact copies of one page (new ids) spread among them."""
    import random

    from streamdedup.core.records import Document, Source

    draw = random.Random(seed)
    total = len(items) + copies
    at_copy = set(draw.sample(range(1, total), copies))
    originals, made = iter(items), 0
    out = []
    for place in range(total):
        if place in at_copy:
            out.append(Document(f"copy-{made}", items[0].text, Source("in", 0, place)))
            made += 1
        else:
            item = next(originals)
            out.append(Document(item.id, item.text, Source("in", 0, place)))
    return out


def _big_site(items, share: float = 0.3, seed: int = 17):
    """``items`` with ``share`` of them pages of one site: its navigation (a header of 40 words, a footer of 30,
    the same on every page) around the article."""
    import random

    from streamdedup.core.records import Document

    draw = random.Random(seed)
    words = [f"nav{n}" for n in range(70)]
    header, footer = " ".join(words[:40]), " ".join(words[40:])
    return [Document(item.id, f"{header} . {item.text} . {footer}", item.source) if draw.random() < share else item
            for item in items]


def _corpus(name: str, docs: int):
    items = _items(docs)
    if name == "big-site":
        return _big_site(items)
    if name == "hot-key":
        return _hot_band(items)
    if name == "copies":
        return _copies(items[: docs // 2], docs - docs // 2)
    return items


def _config(path: str):
    from streamdedup import config

    return config.load(None, ('lsh.cap="probes"', "templates.enabled=false", f'index.path="{path}"'), environ={})


def _memory_faulted_in(mib: int = 768) -> None:
    """Fault in heap memory before anything is timed, and keep it once freed (``memory.keep_freed_memory``).

    In the simulator every vshard shares one heap, so whichever call extends it pays the page faults for all
    (on this VM 30-50 µs a page): calls of 60-120 ms fell on one vshard or another. Each process of a
    deployment grows its own heap as its share grows. Done for the single worker too, so both are measured
    without the faults of a growing heap."""
    from streamdedup.core.memory import keep_freed_memory

    keep_freed_memory()
    blocks = [bytearray(1 << 20) for _ in range(mib)]  # 1 MiB each: below the mmap threshold, from the heap
    del blocks


def _warm_up(config) -> None:
    """Imports, caches and the first numpy calls, paid before anything is timed."""
    _memory_faulted_in()
    from streamdedup.engine.vshards.simulator import Simulator, cut_epochs

    Simulator(config, 2).decide(cut_epochs([_items(200)], seed=1, largest=100))


def child_vshards(docs: int, shards: int, epoch: int, corpus: str, store: str, recent_places: int) -> dict:
    from streamdedup.engine.vshards.simulator import Simulator, cut_epochs
    from streamdedup.store import vshardstate

    if recent_places:
        vshardstate.RECENT_PLACES = recent_places

    with tempfile.TemporaryDirectory() as folder:
        config = _config(folder + "/unused")
        _warm_up(config)
        items = _corpus(corpus, docs)
        epochs = cut_epochs([items], seed=3, largest=2 * epoch * shards)
        with Simulator(config, shards, shards, seed=5, state=folder + "/vshards" if store == "lmdb" else None) \
                as simulator:
            begin = time.perf_counter()
            run = simulator.decide(epochs)
            wall = time.perf_counter() - begin
            tables = _table_bytes(simulator) if store == "lmdb" else {}
        disk = _folder_bytes(folder + "/vshards")
    linked = sum(v.linked_rows for v in simulator.vshards)
    return {"docs": len(run.order), "cpu": run.cpu, "stage_cpu": dict(run.stage_cpu), "bytes": dict(run.bytes),
            "messages": dict(run.messages), "wall": wall, "linked": linked, "disk": disk, "tables": tables,
            "duplicates": sum(d.status == "duplicate" for d in run.decisions)}


def _table_bytes(simulator) -> dict:
    """The pages each table of the vshards' states uses, in bytes, summed over the vshards."""
    tables: dict[str, int] = {}
    for vshard in simulator.vshards:
        for name, used in vshard.state.index.database_bytes().items():
            tables[name] = tables.get(name, 0) + used
    return tables


def _folder_bytes(folder: str) -> int:
    """The bytes of the files under ``folder`` (0 if there is none): the states' size on disk."""
    import os

    return sum(os.path.getsize(os.path.join(at, name)) for at, _, names in os.walk(folder) for name in names)


def child_single(docs: int, epoch: int, corpus: str) -> dict:
    from streamdedup.engine.engine import Engine

    with tempfile.TemporaryDirectory() as folder:
        config = _config(folder + "/index")
        _warm_up(config)
        items = _corpus(corpus, docs)
        with Engine(config) as engine:
            begin = time.process_time()
            for at in range(0, len(items), epoch):  # a batch is a vshard's share of an epoch: the rate of one
                engine.decide_batch(engine.prepare(items[at:at + epoch]))
            cpu = time.process_time() - begin
    return {"docs": len(items), "cpu": cpu}


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """a and b of a process's CPU a document, a + b / S, fitted over (S, per-process CPU) as the CPU of all
    processes, S * a + b, by least squares: each point weighs by the processes it averages, so the one-process
    point (a single measurement on a noisy machine) does not set a alone."""
    xs = [s for s, _ in points]
    ys = [s * y for s, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    a = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return a, mean_y - a * mean_x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100000)
    parser.add_argument("--shards", default="1,4,16,64")
    parser.add_argument("--epoch", type=int, default=250, help="documents per vshard per epoch (on average)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", default="crawl", choices=("crawl", "hot-key", "copies", "big-site"),
                        help="the synthetic crawl; with one band key in half the documents; half of it exact "
                             "copies of one page")
    parser.add_argument("--store", default="memory", choices=("memory", "lmdb"),
                        help="where each vshard keeps its state: in memory, or in LMDB committed every epoch")
    parser.add_argument("--recent-places", type=int, default=0,
                        help="with --store lmdb: a vshard's recent places merged into its settled table past this "
                             "many (default: the state's, RECENT_PLACES); lower, to measure merges on a short corpus")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        kind, *rest = args.child
        if kind == "single":
            result = child_single(args.docs, args.epoch, args.corpus)
        else:
            result = child_vshards(args.docs, int(rest[0]), args.epoch, args.corpus, args.store, args.recent_places)
        print(json.dumps(result))
        return
    counts = [int(s) for s in args.shards.split(",")]
    if len(set(counts)) < 2:
        parser.error("--shards needs two counts at least, to fit a + b/S")
    runs: dict[int, list[dict]] = {s: [] for s in counts}
    single: list[dict] = []
    for _ in range(args.rounds):
        common = ("--docs", str(args.docs), "--epoch", str(args.epoch), "--corpus", args.corpus)
        single.append(harness.child("bench.vshards", "single", *common))
        for s in counts:
            runs[s].append(harness.child("bench.vshards", "vshards", str(s), *common, "--store", args.store,
                                         "--recent-places", str(args.recent_places)))
    report(runs, single, args)


_BIG_TABLES = ("shingles", "places", "recent_places", "docs", "firsts", "ids")


def report(runs: dict[int, list[dict]], single: list[dict], args) -> None:
    def per_doc(seconds: float, run: dict) -> float:
        return seconds / run["docs"] * 1e6

    single_us = harness.median(per_doc(r["cpu"], r) for r in single)
    merged = f" (recent places merged past {args.recent_places:,})" if args.recent_places else ""
    print(f"# Band tables split by key: {args.docs:,} documents ({args.corpus}), epochs of "
          f"{args.epoch:,} documents a vshard, state in {args.store}{merged}, median of {args.rounds} round(s)\n")
    print(f"single worker (Engine, LMDB, lsh.cap=probes): {single_us:.1f} µs CPU a document\n")
    print("| vshards = processes | µs/doc per process: mean | busiest | max/mean | all processes | vs single "
          "worker | linked rows/doc | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    means, busiest = [], []
    for s, measured in runs.items():
        mean = harness.median(per_doc(sum(r["cpu"]) / s, r) for r in measured)
        top = harness.median(per_doc(max(r["cpu"]), r) for r in measured)
        total = harness.median(per_doc(sum(r["cpu"]), r) for r in measured)
        linked = harness.median(r["linked"] / r["docs"] for r in measured)
        wall = harness.median(r["wall"] for r in measured)
        means.append((s, mean))
        busiest.append((s, top))
        print(f"| {s} | {mean:.2f} | {top:.2f} | {top / mean:.2f} | {total:.1f} | {total / single_us:.2f}x | "
              f"{linked:.3f} | {wall:.1f} |")
    if args.store == "lmdb":
        print("\nstate on disk, bytes a document (the vshards' files; pages of the largest tables):\n")
        print("| vshards | files | " + " | ".join(_BIG_TABLES) + " |")
        print("|---|---|" + "---|" * len(_BIG_TABLES))
        for s, measured in runs.items():
            disk = harness.median(r["disk"] / r["docs"] for r in measured)
            pages = [harness.median(r["tables"].get(name, 0) / r["docs"] for r in measured) for name in _BIG_TABLES]
            print(f"| {s} | {disk:,.0f} | " + " | ".join(f"{used:,.0f}" for used in pages) + " |")
    a, b = fit(means)
    a_top, b_top = fit(busiest)
    print(f"\nfit a + b/S, mean process: a = {a:.2f} µs, b = {b:.1f} µs; busiest process: a = {a_top:.2f} µs, "
          f"b = {b_top:.1f} µs" + (" (a fit below 0 is 0 within this run's noise)" if min(a, a_top) < 0 else "")
          + "\n")
    largest = max(runs)
    last = runs[largest][0]
    stages = sorted(last["stage_cpu"])
    print(f"CPU by stage, all processes, µs a document (at {largest} vshards; at 1):\n")
    print("| stage | at " + str(largest) + " | at " + str(min(runs)) + " | message bytes/doc at " + str(largest)
          + " | messages/doc |")
    print("|---|---|---|---|---|")
    first = runs[min(runs)][0]
    for stage in stages:
        print(f"| {stage} | {per_doc(last['stage_cpu'][stage], last):.1f} | "
              f"{per_doc(first['stage_cpu'].get(stage, 0.0), first):.1f} | "
              f"{last['bytes'].get(stage, 0) / last['docs']:.0f} | {last['messages'].get(stage, 0) / last['docs']:.3f} |")
    print(f"\ntotal message bytes a document at {largest} vshards: "
          f"{sum(last['bytes'].values()) / last['docs']:,.0f} (each written once and read once)\n")
    print("Projection, one process per core, machines of 16 cores (brokers elsewhere): the busiest process's "
          "a + b / cores (a taken as at least 0); and a bound from measurement alone: a process of more "
          "processes does no more than one of the most measured here (a + b/S falls with S), so the busiest "
          "process measured at the most vshards sets a rate the deployment reaches at least\n")
    print("| machines | cores | µs the busiest process spends per stream document | projected docs/s | at least "
          "(measured at " + str(largest) + ") |")
    print("|---|---|---|---|---|")
    measured_top = dict(busiest)
    for machines in (1, 4, 16, 64):
        cores = 16 * machines
        cost = max(a_top, 0.0) + b_top / cores
        floor = max(s for s in measured_top if s <= cores)
        print(f"| {machines} | {cores} | {cost:.2f} | {1e6 / cost:,.0f} | {1e6 / measured_top[floor]:,.0f} |")
    a_cap = max(a_top, 0.0)
    cap = f"at most {1e6 / a_cap:,.0f} docs/s whatever the number of machines" if a_cap > 0 else "under this run's noise"
    print(f"\nWhat caps it: a, the work every process repeats on every document (busiest fit {a_top:.2f} µs: "
          f"{cap}: the messages of every stage, one from each vshard, and the linked documents decided "
          f"everywhere they are waited for), then the exchange bytes the brokers carry "
          f"({sum(last['bytes'].values()) / last['docs']:,.0f} B a document written and read).")


if __name__ == "__main__":
    sys.exit(main())
