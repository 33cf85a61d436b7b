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

Run: ``python -m bench.traps --docs 50000`` (``--docs 500000 --rounds 1`` for the full size; ``--only
"template trap,exact copies"`` for some streams, always with the plain crawl; ``--set KEY=VALUE`` for every run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from collections import Counter

from bench import harness
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
        peaks: dict[str, list[float]] = {name: [] for name in streams}
        sizes, outcomes = {}, {}

        def measure(name: str, number: int) -> float:
            state = os.path.join(work, f"state-{number}-{name.replace(' ', '-')}")
            # GNU time forks the command from its own small process: a child forked from this one would inherit
            # this process's peak (Linux keeps it across exec), and the figure would be the bench's.
            run = harness.dedup(paths[name], state, args.set, documents=args.docs, peak_rss=True)
            peaks[name].append(run.peak_rss_mib)
            if name not in sizes:
                sizes[name] = run.table_bytes()
                outcomes[name] = decisions(state)
            shutil.rmtree(state)
            return run.rate

        rates = harness.interleaved(list(streams), args.rounds, measure)
        settings = f"; settings: {', '.join(args.set)}" if args.set else ""
        print(f"\n{args.docs:,} documents a stream; {args.rounds} rounds, each run a fresh process{settings}\n")
        columns = {"peak RSS MiB": {n: f"{max(peaks[n]):,.0f}" for n in streams},
                   "bytes/doc": {n: f"{sum(sizes[n].values()) / args.docs:,.0f}" for n in streams},
                   "kept": {n: f"{outcomes[n][0]['kept']:,}" for n in streams},
                   "duplicate": {n: f"{outcomes[n][0]['duplicate']:,}" for n in streams},
                   "largest cluster": {n: f"{outcomes[n][1]:,}" for n in streams}}
        print(harness.table(rates, "plain crawl", name="stream", ratio="vs plain (paired)", columns=columns))
        tables = sorted({t for s in sizes.values() for t in s if s[t] >= args.docs})  # >= 1 byte a document
        print(f"\n  bytes per document by table (1 or more)\n  {'table':<16}" + "".join(f"{n:>16}" for n in streams))
        for table in tables:
            print(f"  {table:<16}" + "".join(f"{sizes[n].get(table, 0) / args.docs:>16,.1f}" for n in streams))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
