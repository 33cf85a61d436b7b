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

Run: ``python bench/api.py --docs 20000 --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

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


def dedup_rate(path: str, state: str, processes: int) -> float:
    result = subprocess.run([sys.executable, "-m", "streamdedup", "dedup", path, "--state", state, "--no-progress",
                             "--set", f"worker.prepare_processes={processes}"],
                            capture_output=True, text=True, check=True, timeout=3600)
    found = re.search(r"\(([\d,]+) docs/s", result.stdout)
    if found is None:
        raise RuntimeError(f"no docs/s in the dedup summary:\n{result.stdout}\n{result.stderr}")
    return float(found.group(1).replace(",", ""))


def api_rate(kind: str, path: str, state: str) -> float:
    result = subprocess.run([sys.executable, __file__, "--child", kind, "--input", path, "--state", state],
                            capture_output=True, text=True, check=True, timeout=3600)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
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
        rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        for round_number in range(args.rounds):
            for name in CONTENDERS:
                state = os.path.join(work, f"state-{round_number}-{CONTENDERS.index(name)}")
                if name.startswith("dedup"):
                    rate = dedup_rate(path, state, 0 if "one process" in name else 1)
                else:
                    rate = api_rate("lines" if "lines" in name else "pairs", path, state)
                rates[name].append(rate)
                print(f"  round {round_number + 1}: {name:<18} {rate:>9,.0f} docs/s", flush=True)
    base = statistics.median(rates["dedup"])
    print(f"\n| contender | median docs/s | min-max | vs dedup (paired) |\n|---|---|---|---|")
    for name in CONTENDERS:
        values = rates[name]
        median = statistics.median(values)
        paired = statistics.median(v / d for v, d in zip(values, rates["dedup"]))
        ratio = "" if name == "dedup" else f"{median / base:.2f}x ({paired:.2f}x)"
        print(f"| {name} | {median:,.0f} | {min(values):,.0f}-{max(values):,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
