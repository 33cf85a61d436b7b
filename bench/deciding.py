"""The deciding side alone: CPU time a document of the ``dedup`` loop, its batches prepared beforehand.

The input (the synthetic crawl, as ``bench/offline.py`` makes it) is read,
decoded and prepared first; then the loop the ``dedup`` command runs in its
deciding process (``checkpoint.FileRun.commit``: evidence, decision, index
writes, the decisions file, the durable commit) is timed over every batch,
in CPU time of this process (``time.process_time``), which a busy machine
disturbs far less than wall-clock time. Each run is a fresh process.

Run: ``python -m bench.deciding [--docs 30000] [--runs 5] [--code DIR]``; ``--code``: the top folder of
another checkout whose ``streamdedup`` (its kernel built) is measured instead of this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(path: str) -> dict:
    """CPU and wall microseconds a document of the deciding loop over the file's lines."""
    from streamdedup import config as config_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine.engine import Engine
    from streamdedup.ops.summary import Summary
    from streamdedup.runtime.checkpoint import FileRun
    from streamdedup.runtime.feed import open_feed
    from streamdedup.runtime.sink import FileOutputs
    from streamdedup.runtime.source import FilePosition

    cfg = config_module.load(None, environ={})
    work = tempfile.mkdtemp(prefix="bench-deciding-")
    try:
        with Engine(cfg, os.path.join(work, "state")) as engine:
            feed = open_feed([path], InputSpec(), engine.signing, cfg.worker.batch_size, 0, FilePosition(), None)
            batches = list(feed.batches())
            feed.close()
            decisions = os.path.join(work, "decisions.jsonl")
            run = FileRun([path], None, decisions)
            start = run.resume_point(engine.index, False)
            outputs = FileOutputs(None, decisions, start.sizes, durable=engine.index.settings.sync)
            summary = Summary(resumed=False)
            documents = sum(len(batch.records) for batch in batches)
            cpu, wall = time.process_time(), time.perf_counter()
            for batch in batches:
                engine.between_batches()
                summary.add(run.commit(engine, outputs, batch.records, batch.position, batch.prepared))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            run.finish(engine.index, outputs.sizes())
            outputs.close()
        import streamdedup

        return {"cpu_us": 1e6 * cpu / documents, "wall_us": 1e6 * wall / documents, "docs": documents,
                "module": streamdedup.__file__}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--code", default=str(ROOT), help="top folder of the streamdedup code measured")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(args.child)))
        return 0
    from streamdedup.core import corpus

    print(f"code measured: {os.path.abspath(args.code)}")
    docs = corpus.generate(max(1, round(args.docs / 1.84)), seed=42)[: args.docs]
    scratch = tempfile.mkdtemp(prefix="bench-deciding-input-")
    try:
        path = os.path.join(scratch, "crawl.jsonl")
        with open(path, "w") as handle:
            handle.writelines(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in docs)
        runs = []
        for number in range(args.runs):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(args.code))  # its streamdedup, and nothing else's
            child = f"import runpy, sys; sys.argv = ['deciding', '--child', {path!r}]; runpy.run_path({__file__!r}, " \
                    "run_name='__main__')"
            done = subprocess.run([sys.executable, "-P", "-c", child], capture_output=True, text=True, check=True,
                                  env=env, cwd=scratch)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            if not runs[-1]["module"].startswith(os.path.abspath(args.code)):
                raise SystemExit(f"measured {runs[-1]['module']}, not the code asked for")
            print(f"  run {number + 1}: {runs[-1]['cpu_us']:.1f} us CPU, {runs[-1]['wall_us']:.1f} us wall a document")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cpu = [run["cpu_us"] for run in runs]
    print(f"deciding, {len(docs):,} documents: CPU {statistics.median(cpu):.1f} us a document (median of {len(runs)} "
          f"runs, min {min(cpu):.1f}); load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
