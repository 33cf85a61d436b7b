"""The Python API against the ``dedup`` command, on the same documents in the same run.

Each contender runs in a fresh process of its own, on a fresh index, over
the same JSONL file (the synthetic crawl), rounds interleaved:

- ``dedup``: ``streamdedup dedup FILE --state DIR`` (the command as users run
  it: reading and signing in a second process, ``worker.prepare_processes``);
  its own summary's docs/s (clock from the index open to the last commit);
- ``dedup, one process``: the same with ``worker.prepare_processes = 0``
  (reading and signing in the deciding process, as the API does);
- ``api, JSON lines``: ``index.add_many(lines)`` with the file's lines as
  bytes, decoded as the command decodes them;
- ``api, (id, text)``: ``index.add_many(pairs)``, the file parsed into pairs
  before the clock starts (what a Python pipeline hands over).

The API's clock runs around ``add_many`` alone (the index opened, the
records in memory). Printed: the median docs/s, min-max, and each API
variant's ratio to ``dedup`` (of the medians, and the median of the
same-round ratios).

Run: ``python -m bench.api --docs 20000 --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from bench import harness

CONTENDERS = ("dedup", "dedup, one process", "api, JSON lines", "api, (id, text)")


def one_api_run(kind: str, path: str, state: str) -> dict:
    """In the child process: time ``add_many`` on the file's records."""
    import orjson

    import streamdedup

    with open(path, "rb") as handle:
        lines = [line.rstrip(b"\n") for line in handle]
    records = lines if kind == "lines" else [(o["id"], o["text"]) for o in map(orjson.loads, lines)]
    with streamdedup.open(state) as index:
        began = time.perf_counter()
        decisions = index.add_many(records)
        seconds = time.perf_counter() - began
    return {"docs": len(decisions), "seconds": seconds}


def rate(name: str, path: str, state: str) -> float:
    """docs/s of one contender: ``dedup``'s own summary, or the API's clock around ``add_many``."""
    if name.startswith("dedup"):
        processes = 0 if "one process" in name else 1
        run = harness.dedup(path, state, ["--no-progress", f"worker.prepare_processes={processes}"], decisions=False)
        return harness.summary_rate(run.stdout)
    measured = harness.child("bench.api", "lines" if "lines" in name else "pairs", "--input", path, "--state", state)
    return measured["docs"] / measured["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000, help="about this many documents (default 20,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=("lines", "pairs"), help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_api_run(args.child, args.input, args.state)))
        return

    from streamdedup.core import corpus

    with tempfile.TemporaryDirectory(prefix="bench-api-") as work:
        path = os.path.join(work, "crawl.jsonl")
        documents = corpus.generate(max(1, round(args.docs / 1.86)), seed=42)
        with open(path, "w", encoding="utf-8") as handle:
            corpus.write_jsonl(documents, handle)
        print(f"{len(documents):,} documents, {args.rounds} rounds, each contender a fresh process and index")
        rates = harness.interleaved(CONTENDERS, args.rounds, lambda name, number: rate(
            name, path, os.path.join(work, f"state-{number}-{CONTENDERS.index(name)}")))
    print("\n" + harness.table(rates, "dedup"))


if __name__ == "__main__":
    main()
