"""Crawler traps and hot buckets: docs/s, peak memory and index growth on streams of near-identical pages,
against the plain synthetic crawl of the same size, in the same run.

Streams (each ``--docs`` documents, written to JSONL before any clock starts):

- ``plain crawl``: the synthetic crawl (``core/corpus.py``, a new corpus every 5,000 articles);
- ``template trap``: pages of one site (one URL host) built from one 200-word template in which three
  words change from page to page (a calendar or session-id trap): under the content share, so compared
  whole; nearly all of them are near duplicates of the first;
- ``threshold trap``: pages without a URL, one 60-word template in which eight words change: pairs sit
  around Jaccard 0.4-0.7, so most pages are *kept* while sharing most band keys with every other page:
  the hot buckets, where band postings and candidate lists grow with the trap;
- ``exact copies``: the plain crawl with ``--copies`` of its documents (default a fifth) replaced by exact
  copies of one page, in random places (each copy its own id).

Each stream runs through ``streamdedup dedup`` as its own program (a fresh process, as a user starts it),
``--rounds`` times, rounds interleaved. Printed: median docs/s and its ratio to the plain crawl, the
command's peak RSS (GNU ``time``: its largest process, the preparing one included), the decisions, and
the index's bytes per document by table (LMDB pages in use, after the run).

Run: ``python bench/traps.py --docs 50000`` (``--docs 500000 --rounds 1`` for the full size; ``--only
"template trap,exact copies"`` for some streams, always with the plain crawl; ``--set KEY=VALUE`` for every run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

from streamdedup.core import corpus


def plain(n: int):
    """(id, text, url) of ``n`` synthetic crawl documents."""
    made, seed = 0, 0
    while made < n:
        for doc in corpus.generate(5000, seed=7000 + seed):
            if made == n:
                return
            yield f"c{seed}-{doc.id}", doc.text, None
            made += 1
        seed += 1


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choice(letters) for _ in range(rng.randint(4, 9))) for _ in range(size)})


def templated(n: int, words: int, changing: int, url: bool, seed: int):
    """``n`` pages of one template of ``words`` words, ``changing`` of them (fixed slots) drawn per page."""
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng, 20000)
    template = [rng.choice(vocabulary[:2000]) for _ in range(words)]
    slots = sorted(rng.sample(range(words), changing))
    for number in range(n):
        page = list(template)
        for slot in slots:
            page[slot] = rng.choice(vocabulary)
        yield f"trap-{number:07d}", " ".join(page), (f"https://calendar.example/day?d={number}" if url else None)


def with_copies(n: int, copies: int, seed: int):
    """The plain crawl with ``copies`` of its places taken by exact copies of one page."""
    rng = random.Random(seed)
    places = set(rng.sample(range(n), copies))
    copied = None
    for number, (doc_id, text, _) in enumerate(plain(n)):
        if copied is None:
            copied = text
        if number in places:
            yield f"copy-{number:07d}", copied, None
        else:
            yield doc_id, text, None


def write(path: str, documents) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for doc_id, text, url in documents:
            line = {"id": doc_id, "text": text}
            if url:
                line["url"] = url
            out.write(json.dumps(line) + "\n")
            count += 1
    return count


def run(path: str, state: str, settings: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of ``streamdedup dedup`` on ``path`` into a new index at ``state``."""
    command = [sys.executable, "-m", "streamdedup", "dedup", path, "--state", state,
               "--decisions", os.path.join(state, "decisions.jsonl")]
    for setting in settings:
        command += ["--set", setting]
    peak = os.path.join(os.path.dirname(path), "peak-rss-kb")
    # GNU time forks the command from its own small process: a child forked from this one would inherit this
    # process's peak (Linux keeps it across exec), and the figure would be the bench's, not the command's.
    began = time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak, *command], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"dedup of {path} exited {done.returncode}")
    with open(peak) as handle:
        return seconds, int(handle.read().split()[-1]) / 1024


def table_bytes(state: str) -> dict[str, int]:
    from streamdedup.config import load
    from streamdedup.engine.engine import Engine

    with Engine(load(None, environ={}), state, readonly=True) as engine:
        return engine.index.database_bytes()


def decisions(state: str) -> tuple[Counter, int]:
    """(how many of each status, the largest cluster's duplicates)."""
    statuses, clusters = Counter(), Counter()
    with open(os.path.join(state, "decisions.jsonl"), encoding="utf-8") as lines:
        for line in lines:
            d = json.loads(line)
            statuses[d["status"]] += 1
            if d["status"] == "duplicate":
                clusters[d["cluster"]] += 1
    return statuses, max(clusters.values(), default=0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=50000)
    parser.add_argument("--copies", type=int, help="exact copies in the copies stream (default: docs / 5)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated stream names (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every run, e.g. lsh.max_candidates=10 (repeatable)")
    args = parser.parse_args(argv)
    copies = args.copies if args.copies is not None else args.docs // 5
    streams = {
        "plain crawl": lambda: plain(args.docs),
        "template trap": lambda: templated(args.docs, 200, 3, True, 11),
        "threshold trap": lambda: templated(args.docs, 60, 8, False, 12),
        "exact copies": lambda: with_copies(args.docs, copies, 13),
    }
    if args.only:
        wanted = ["plain crawl", *args.only.split(",")]
        streams = {name: make for name, make in streams.items() if name in wanted}
    work = tempfile.mkdtemp(prefix="bench-traps-")
    try:
        paths = {}
        for name, make in streams.items():
            paths[name] = os.path.join(work, name.replace(" ", "-") + ".jsonl")
            write(paths[name], make())
        rates = {name: [] for name in streams}
        peaks = {name: [] for name in streams}
        sizes, outcomes = {}, {}
        for number in range(args.rounds):
            for name, path in paths.items():
                state = os.path.join(work, f"state-{number}-{name.replace(' ', '-')}")
                seconds, peak = run(path, state, args.set)
                rates[name].append(args.docs / seconds)
                peaks[name].append(peak)
                if name not in sizes:
                    sizes[name] = table_bytes(state)
                    outcomes[name] = decisions(state)
                shutil.rmtree(state)
                print(f"  round {number + 1} {name}: {args.docs / seconds:,.0f} docs/s, peak RSS {peak:,.0f} MiB",
                      flush=True)
        base = statistics.median(rates["plain crawl"])
        settings = f"; settings: {', '.join(args.set)}" if args.set else ""
        print(f"\n{args.docs:,} documents a stream; {args.rounds} rounds, each run a fresh process{settings}\n")
        print(f"  {'stream':<16} {'median docs/s':>14} {'vs plain':>9} {'peak RSS MiB':>13} {'bytes/doc':>10}"
              f" {'kept':>9} {'duplicate':>10} {'largest cluster':>16}")
        for name in streams:
            statuses, largest = outcomes[name]
            print(f"  {name:<16} {statistics.median(rates[name]):>14,.0f} "
                  f"{statistics.median(rates[name]) / base:>8.2f}x {max(peaks[name]):>13,.0f} "
                  f"{sum(sizes[name].values()) / args.docs:>10,.0f} {statuses['kept']:>9,} "
                  f"{statuses['duplicate']:>10,} {largest:>16,}")
        tables = sorted({t for s in sizes.values() for t in s if s[t] >= args.docs})  # >= 1 byte a document
        print(f"\n  bytes per document by table (1 or more)\n  {'table':<16}" + "".join(f"{n:>16}" for n in streams))
        for table in tables:
            print(f"  {table:<16}" + "".join(f"{sizes[n].get(table, 0) / args.docs:>16,.1f}" for n in streams))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
