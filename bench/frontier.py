"""The engine's frontier in one run: recall, bytes and speed of each configuration tried, side by side.

For every configuration (bands x rows and shared bands, and the default
signed on the numpy path, as an install without a C compiler runs it), each
figure is measured in this one run, every ``streamdedup`` run a fresh process:

- **recall** against the exact greedy reference on the real-text and the
  synthetic corpora of ``realtext.py`` (same status, duplicates found,
  mixed clusters);
- **bytes per document at 1M**: ``streamdedup dedup`` of the synthetic crawl
  (``growth.Crawl``, ``--big`` documents) into a new index, with the split
  per table, and that whole run's docs/s (**offline**);
- **live** docs/s: ``streamdedup run --until-caught-up`` on ``--live``
  documents pre-loaded in a 3-partition topic of a local Apache Kafka
  broker (``deploy/kafka``, port 29492, or ``KAFKA_BOOTSTRAP``), against
  the kafka-python pass-through of ``live.py`` timed in the same run.

Run: ``python -m bench.frontier`` (about 20 minutes on 2 cores;
``--big 100000 --live 20000`` for a quick look).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from bench import harness, live, realtext
from bench.growth import Crawl

NUMPY_PATH = "default, numpy path (no kernel)"
CONFIGS = {**realtext.COMPARED, NUMPY_PATH: []}
WITHOUT_KERNEL = ("-c", "import sys; from streamdedup.core import eliasfano, shingle, signing, verify; "
                  "shingle._kernel = signing._kernel = verify._kernel = eliasfano._kernel = None; "
                  "from streamdedup.cli import main; sys.exit(main(sys.argv[1:]))")  # then the command's arguments
ONE_PROCESS = ["worker.prepare_processes=0"]  # the kernel stays unloaded only in this process


def _dedup(path: str, state: str, settings: list[str], numpy_path: bool, **kw) -> harness.DedupRun:
    """``streamdedup dedup`` as its own program; on the numpy path the kernel is unloaded first (one process)."""
    if not numpy_path:
        return harness.dedup(path, state, settings, **kw)
    return harness.dedup(path, state, [*settings, *ONE_PROCESS], python=WITHOUT_KERNEL, **kw)


def recall(corpora: list, settings: list[str], numpy_path: bool) -> list[dict]:
    """Scores of one configuration on each corpus (``realtext.score``)."""
    scores = []
    for path, records, (pairs, reference, parts) in corpora:
        with tempfile.TemporaryDirectory(prefix="frontier-recall-") as state:
            decisions = _dedup(path, state, settings, numpy_path).decisions()
        scores.append(realtext.score(records, decisions, pairs, reference, parts))
    return scores


def big_run(path: str, docs: int, settings: list[str], numpy_path: bool) -> dict:
    """docs/s of a whole ``dedup`` run of ``docs`` documents, and the index's bytes per document, per table."""
    with tempfile.TemporaryDirectory(prefix="frontier-big-") as state:
        run = _dedup(path, state, settings, numpy_path, decisions=False, documents=docs)
        tables, size = run.table_bytes(), run.index_bytes()
    return {"docs_s": run.rate, "bytes": size / docs,
            "tables": {name: used / docs for name, used in sorted(tables.items(), key=lambda t: -t[1])
                       if used >= 2 * docs}}


def live_rates(docs: int, rounds: int) -> dict[str, float]:
    """Median docs/s of each configuration's worker and of the pass-through, rounds interleaved."""
    from streamdedup.core import corpus

    with live.local_broker("29492") as bootstrap:
        topic = live.preload(bootstrap, corpus.generate(int(docs / 1.83) + 1, seed=42)[:docs])
        live.timed_round("pass-through (a)", bootstrap, topic)  # warm-up: the broker's JIT and page cache
        rates: dict[str, list[float]] = {name: [] for name in [*CONFIGS, "pass-through"]}
        for _ in range(rounds):
            rates["pass-through"].append(docs / live.timed_round("pass-through (a)", bootstrap, topic))
            for name, settings in CONFIGS.items():
                rates[name].append(docs / _timed_worker(bootstrap, topic, settings, name == NUMPY_PATH))
    return {name: statistics.median(values) for name, values in rates.items()}


def _timed_worker(bootstrap: str, topic: str, settings: list[str], numpy_path: bool) -> float:
    def command(outs: list[str], state: str) -> list[str]:
        made = live.streamdedup_command(bootstrap, topic, outs, state) + [f for s in settings for f in ("--set", s)]
        if numpy_path:
            made[1:3] = WITHOUT_KERNEL
            made += ["--set", *ONE_PROCESS]
        return made

    return live.timed_program(bootstrap, command)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000, help="documents of each recall corpus")
    parser.add_argument("--big", type=int, default=1000000, help="documents of the bytes and offline run")
    parser.add_argument("--live", type=int, default=50000, help="documents of the live run")
    parser.add_argument("--rounds", type=int, default=3, help="live rounds")
    parser.add_argument("--out", default=os.path.expanduser("~/.cache/streamdedup/realtext"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    corpora = []
    for name, records in (("real-text", realtext.build(args.docs)), ("synthetic", realtext.synthetic(args.docs))):
        path = os.path.join(args.out, f"{name}-{args.docs}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in records)
        corpora.append((path, records, realtext.truth(records)))
    folder = tempfile.mkdtemp(prefix="frontier-crawl-")
    try:
        big = Crawl(folder).write(0, args.big)
        results = {}
        for name, settings in CONFIGS.items():
            numpy_path = name == NUMPY_PATH
            results[name] = {"recall": recall(corpora, settings, numpy_path),
                             "big": big_run(big, args.big, settings, numpy_path)}
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rates = live_rates(args.live, args.rounds)
    print(f"\n| configuration | real text: same status / found | synthetic: same status / found | "
          f"mixed clusters | bytes/doc at {args.big:,} | offline docs/s | live docs/s (vs pass-through) |")
    print("|---|---|---|---|---|---|---|")
    for name, result in results.items():
        real, synthetic = result["recall"]
        print(f"| {name} | {real['status']:.3%} / {real['found']:.3%} | {synthetic['status']:.3%} / "
              f"{synthetic['found']:.3%} | {real['mixed'] + synthetic['mixed']} | {result['big']['bytes']:,.0f} | "
              f"{result['big']['docs_s']:,.0f} | {rates[name]:,.0f} ({rates[name] / rates['pass-through']:.2f}x) |")
    print(f"\npass-through: {rates['pass-through']:,.0f} docs/s")
    for name, result in results.items():
        print(f"{name}: " + ", ".join(f"{t} {b:.0f}" for t, b in result["big"]["tables"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
