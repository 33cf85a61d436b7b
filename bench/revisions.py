"""This tree against an earlier revision: offline docs/s and index bytes per document, in the same run.

Each round runs ``streamdedup dedup`` on the same JSONL input once with this
tree's code and once with the code of ``--against`` (checked out with ``git
worktree`` into a temporary folder, run with ``PYTHONPATH`` pointing at it),
each as a fresh process, in alternating order; printed: median docs/s, the
ratio, and bytes per document of each index after its run.

Run: ``python bench/revisions.py --against 2fd47f6 [--docs 100000] [--rounds 3] [--set lsh.bands=20 ...]``
(``--set`` applies to this tree's runs only: the earlier revision runs its defaults).
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

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tree: str, path: str, state: str, settings: list[str]) -> float:
    """Seconds ``dedup`` of ``tree``'s code takes on ``path`` into a new index at ``state``."""
    command = [sys.executable, "-m", "streamdedup", "dedup", path, "--state", state, "--decisions",
               os.path.join(state, "decisions.jsonl")]
    for setting in settings:
        command += ["--set", setting]
    env = dict(os.environ, PYTHONPATH=tree)
    began = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree)
    return time.monotonic() - began


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
    try:
        from streamdedup.core import corpus

        path = os.path.join(work, "crawl.jsonl")
        docs = corpus.generate(int(args.docs / 1.83) + 60)[: args.docs]
        with open(path, "w", encoding="utf-8") as handle:
            corpus.write_jsonl(docs, handle)
        trees = {"this tree": (HERE, args.set), args.against: (old, [])}
        rates: dict[str, list[float]] = {name: [] for name in trees}
        sizes: dict[str, float] = {}
        for number in range(args.rounds):
            for name in (list(trees) if number % 2 == 0 else list(reversed(trees))):
                tree, settings = trees[name]
                state = os.path.join(work, "state")
                rates[name].append(len(docs) / run(tree, path, state, settings))
                sizes[name] = os.path.getsize(os.path.join(state, "data.mdb")) / len(docs)
                shutil.rmtree(state)
        print(f"{len(docs):,} documents of the synthetic crawl; {args.rounds} rounds, each run a fresh process\n")
        base = statistics.median(rates[args.against])
        for name, values in rates.items():
            median = statistics.median(values)
            print(f"  {name:<12} {median:>9,.0f} docs/s  ({min(values):,.0f}-{max(values):,.0f})  "
                  f"{median / base:.2f}x  {sizes[name]:,.0f} B/doc (file)")
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
