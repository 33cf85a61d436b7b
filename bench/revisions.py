"""This tree against an earlier revision: offline docs/s and index bytes per document, in the same run.

Each round runs ``streamdedup dedup`` on the same JSONL input once with this
tree's code and once with the code of ``--against`` (checked out with ``git
worktree`` into a temporary folder, run with ``PYTHONPATH`` pointing at it),
each as a fresh process, in alternating order; printed: median docs/s, the
ratio, and bytes per document of each index after its run.

Run: ``python -m bench.revisions --against 2fd47f6 [--docs 100000] [--rounds 3] [--set lsh.bands=20 ...]``
(``--set`` applies to this tree's runs only: the earlier revision runs its defaults).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from bench import harness

HERE = str(harness.ROOT)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="a git revision of this repository")
    parser.add_argument("--docs", type=int, default=100000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-revisions-")
    old = os.path.join(work, "tree")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", old, args.against], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _build_kernel(old)
    harness.compile_package(old)
    try:
        from streamdedup.core import corpus

        path = os.path.join(work, "crawl.jsonl")
        docs = corpus.generate(int(args.docs / 1.83) + 60)[: args.docs]
        with open(path, "w", encoding="utf-8") as handle:
            corpus.write_jsonl(docs, handle)
        trees = {"this tree": (HERE, args.set), args.against: (old, [])}
        sizes: dict[str, float] = {}

        def measure(name: str, number: int) -> float:
            tree, settings = trees[name]
            state = os.path.join(work, "state")
            run = harness.dedup(path, state, settings, env=dict(os.environ, PYTHONPATH=tree), cwd=tree)
            sizes[name] = run.index_bytes() / len(docs)
            shutil.rmtree(state)
            return run.rate

        rates = harness.interleaved(list(trees), args.rounds, measure, alternate=True)
        print(f"\n{len(docs):,} documents of the synthetic crawl; {args.rounds} rounds, each run a fresh process\n")
        print(harness.table(rates, args.against, name="tree",
                            columns={"B/doc (file)": {name: f"{size:,.0f}" for name, size in sizes.items()}}))
    finally:
        subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", old], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _build_kernel(tree: str) -> None:
    """Build a revision's compiled kernel in place, as ``pip install`` would have (a revision without one
    or a machine without a compiler runs its numpy path, as it would for its users)."""
    if os.path.exists(os.path.join(tree, "setup.py")):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
