"""What site templates and excerpts cost offline: docs/s and index bytes per document, on against off.

("learn first": ``dedup --learn-first``, templates learned in a first read of the input.)

Each variant runs ``streamdedup dedup`` as its own program (a fresh process,
as a user starts it) on the same JSONL input, rounds interleaved; printed:
the median docs/s, its ratio to the variant with both off, and the index's
bytes per document split by table (after the run, LMDB pages in use).

Run: ``python -m bench.pages --docs 30000`` (the synthetic crawl), or with
``--input FILE.jsonl`` (e.g. ``streamdedup sample --kind web``), or ``--web
20000 [--navigation sections]`` (the web crawl of ``core.webcrawl``: pages of
200 sites, standard-library prose). ``--cpu`` measures documents per CPU
second of the ``dedup`` process (user and system time) instead of wall time:
steadier on a machine others share. Variant "blocks": repeated blocks on
(``templates.window = 16``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile

from bench import harness

VARIANTS = {
    "both off": ["templates.enabled=false", "excerpts.enabled=false"],
    "templates (default)": [],
    "excerpts": ["templates.enabled=false", "excerpts.enabled=true"],
    "both on": ["excerpts.enabled=true"],
    "learn first": ["--learn-first"],
    "blocks": ["templates.window=16"],
    "repeats": ["templates.repeats=true"],
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000)
    parser.add_argument("--input", help="a JSONL file instead of the synthetic crawl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--web", type=int, default=0, help="this many pages of the web crawl (200 sites)")
    parser.add_argument("--navigation", choices=("constant", "sections"), default="constant")
    parser.add_argument("--cpu", action="store_true", help="documents per CPU second, not per second")
    parser.add_argument("--variants", default="", help="these of the variants only (comma-separated names)")
    args = parser.parse_args(argv)
    variants = {name: VARIANTS[name] for name in args.variants.split(",")} if args.variants else VARIANTS
    with tempfile.TemporaryDirectory(prefix="bench-pages-") as work:
        path = args.input
        if path is None and args.web:
            from streamdedup.core.webcrawl import generate_web, write_web_jsonl

            path = os.path.join(work, "web.jsonl")
            with open(path, "w", encoding="utf-8") as handle:
                write_web_jsonl(generate_web(args.web, 200, 42, "stdlib", args.navigation), handle)
        elif path is None:
            from streamdedup.core import corpus

            path = os.path.join(work, "crawl.jsonl")
            with open(path, "w", encoding="utf-8") as handle:
                corpus.write_jsonl(corpus.generate(int(args.docs / 1.83) + 1, seed=42)[: args.docs], handle)
        sizes: dict[str, dict[str, int]] = {}

        def measure(name: str, number: int) -> float:
            state = os.path.join(work, f"state-{number}-{list(variants).index(name)}")
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            run = harness.dedup(path, state, variants[name])
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            sizes.setdefault(name, run.table_bytes())
            shutil.rmtree(state)
            if args.cpu:
                return run.documents / (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            return run.rate

        rates = harness.interleaved(list(variants), args.rounds, measure,
                                    unit="docs/CPU-s" if args.cpu else "docs/s")
        with open(path, "rb") as handle:
            docs = sum(1 for _ in handle)
    source = args.input or (f"the web crawl ({args.navigation})" if args.web else "the synthetic crawl")
    print(f"\n{docs:,} documents from {source}; {args.rounds} rounds, each variant a fresh process"
          f"{', documents per CPU second' if args.cpu else ''}\n")
    per_doc = {name: f"{sum(sizes[name].values()) / docs:,.0f}" for name in variants}
    print(harness.table(rates, "both off", name="variant", columns={"bytes/doc": per_doc}))
    tables = sorted({t for s in sizes.values() for t in s})
    print(f"\n  bytes per document by table\n  {'table':<16}" + "".join(f"{n:>20}" for n in variants))
    for table in tables:
        print(f"  {table:<16}" + "".join(f"{sizes[n].get(table, 0) / docs:>20,.0f}" for n in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
