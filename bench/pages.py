"""What site templates and excerpts cost offline: docs/s and index bytes per document, on against off.

("learn first": ``dedup --learn-first``, templates learned in a first read of the input.)

Each variant runs ``streamdedup dedup`` as its own program (a fresh process,
as a user starts it) on the same JSONL input, rounds interleaved; printed:
the median docs/s, its ratio to the variant with both off, and the index's
bytes per document split by table (after the run, LMDB pages in use).

Run: ``python bench/pages.py --docs 30000`` (the synthetic crawl), or with
``--input FILE.jsonl`` (e.g. ``streamdedup sample --kind web``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "both off": ["templates.enabled=false", "excerpts.enabled=false"],
    "templates (default)": [],
    "excerpts": ["templates.enabled=false", "excerpts.enabled=true"],
    "both on": ["excerpts.enabled=true"],
    "learn first": ["--learn-first"],
}


def run(path: str, settings: list[str], state: str) -> float:
    """Seconds ``streamdedup dedup`` takes on ``path`` into a new index at ``state``."""
    command = [sys.executable, "-m", "streamdedup", "dedup", path, "--state", state, "--decisions",
               os.path.join(state, "decisions.jsonl")]
    for setting in settings:
        command += [setting] if setting.startswith("--") else ["--set", setting]
    began = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - began


def table_bytes(state: str) -> dict[str, int]:
    from streamdedup.config import load
    from streamdedup.engine.engine import Engine

    with Engine(load(None, environ={}), state, readonly=True) as engine:
        return engine.index.database_bytes()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000)
    parser.add_argument("--input", help="a JSONL file instead of the synthetic crawl")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-pages-")
    try:
        path = args.input
        if path is None:
            from streamdedup.core import corpus

            path = os.path.join(work, "crawl.jsonl")
            with open(path, "w", encoding="utf-8") as handle:
                corpus.write_jsonl(corpus.generate(int(args.docs / 1.83) + 1, seed=42)[: args.docs], handle)
        with open(path, "rb") as handle:
            docs = sum(1 for _ in handle)
        rates = {name: [] for name in VARIANTS}
        sizes = {}
        for number in range(args.rounds):
            for name, settings in VARIANTS.items():
                state = os.path.join(work, f"state-{number}-{len(sizes)}-{name.split()[0]}")
                rates[name].append(docs / run(path, settings, state))
                if name not in sizes:
                    sizes[name] = table_bytes(state)
                shutil.rmtree(state)
        base = statistics.median(rates["both off"])
        print(f"{docs:,} documents from {path}; {args.rounds} rounds, each variant a fresh process\n")
        print(f"  {'variant':<20} {'median docs/s':>14} {'min-max':>19} {'vs both off':>12} {'bytes/doc':>10}")
        for name, values in rates.items():
            total = sum(sizes[name].values())
            print(f"  {name:<20} {statistics.median(values):>14,.0f} {min(values):>9,.0f}-{max(values):<9,.0f}"
                  f" {statistics.median(values) / base:>11.2f}x {total / docs:>10,.0f}")
        tables = sorted({t for s in sizes.values() for t in s})
        print(f"\n  bytes per document by table\n  {'table':<16}" + "".join(f"{n:>20}" for n in VARIANTS))
        for table in tables:
            print(f"  {table:<16}" + "".join(f"{sizes[n].get(table, 0) / docs:>20,.0f}" for n in VARIANTS))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
