"""Offline engine benchmark: streamdedup against the in-memory peers a user would pick instead.

For the same documents (the synthetic crawl, about 175 words each) in the
same run, each engine is timed over several rounds, and the median, min-max
and ratios are printed (rounds are interleaved; "paired" is the median of
the same-round ratios):

- signing: text -> MinHash signature (128 permutations, word 3-shingles);
- end to end: a JSONL line -> decision against everything seen before.
  streamdedup: the offline command's loop (decisions file written), on-disk
               LMDB index, durable commits, exact verification; signing in a
               second process, and (to show its gain) in the same process;
  datasketch:  MinHash.update_batch + MinHashLSH query-then-insert, in memory;
  rensa:       RMinHash + RMinHashLSH query-then-insert, in memory (if installed).

Run: ``make bench`` or ``python bench/offline.py --docs 30000 --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable

# streamdedup is imported inside the functions: the preparing process re-imports this module (as it does
# the command line's), and with the engine imported at the top it would boot as slowly as a worker.

BATCH = 1000
NUM_PERM = 128
THRESHOLD = 0.7


def python_shingles(text: str) -> list[bytes]:
    """Word 3-shingles as a user of the peer libraries builds them."""
    from streamdedup.core.shingle import normalize

    words = normalize(text).split()
    if len(words) < 3:
        return [" ".join(words).encode()]
    return [" ".join(words[i:i + 3]).encode() for i in range(len(words) - 2)]


# -- streamdedup -------------------------------------------------------------

def ours_sign(texts: list[str]) -> None:
    from streamdedup.core.shingle import normalize_batch, shingle_batch
    from streamdedup.core.signing import sign_batch

    for start in range(0, len(texts), BATCH):
        batch = shingle_batch(normalize_batch(texts[start:start + BATCH]))
        sign_batch(batch, NUM_PERM, 1)


class JsonlFile(list):
    """The bench's lines, also written once to a JSONL file (before any clock starts) for the offline command."""

    def __init__(self, lines: list[bytes], path: str):
        super().__init__(lines)
        self.path = path
        with open(path, "wb") as handle:
            handle.writelines(lines)


def ours_end_to_end(lines: JsonlFile, processes: int = 1) -> dict:
    """The offline command's loop: JSONL file in, decisions file out, durable LMDB index on disk."""
    from streamdedup import config as config_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine.engine import Engine
    from streamdedup.runtime.offline import dedup_files

    work = tempfile.mkdtemp(prefix="bench-index-")
    try:
        source = lines.path
        cfg = config_module.load(None, environ={})
        with Engine(cfg, os.path.join(work, "state")) as engine:
            summary = dedup_files(engine, [source], InputSpec(), None, os.path.join(work, "decisions.jsonl"),
                                  cfg.worker.batch_size, prepare_processes=processes)
        return {"kept": summary.outcomes["kept"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ours_one_process(lines: list[bytes]) -> dict:
    return ours_end_to_end(lines, processes=0)


# -- datasketch ----------------------------------------------------------------

def datasketch_sign(texts: list[str]) -> list:
    from datasketch import MinHash

    signatures = []
    for text in texts:
        minhash = MinHash(num_perm=NUM_PERM)
        minhash.update_batch(python_shingles(text))
        signatures.append(minhash)
    return signatures


def datasketch_end_to_end(lines: list[bytes]) -> dict:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    kept = 0
    for i, line in enumerate(lines):
        text = json.loads(line)["text"]
        minhash = MinHash(num_perm=NUM_PERM)
        minhash.update_batch(python_shingles(text))
        if not lsh.query(minhash):
            lsh.insert(f"d{i}", minhash)
            kept += 1
    return {"kept": kept}


# -- rensa ---------------------------------------------------------------------

def rensa_available() -> bool:
    try:
        import rensa  # noqa: F401
    except ImportError:
        return False
    return True


def rensa_sign(texts: list[str]) -> None:
    from rensa import RMinHash

    for text in texts:
        minhash = RMinHash(num_perm=NUM_PERM, seed=1)
        minhash.update([s.decode() for s in python_shingles(text)])
        minhash.digest()


def rensa_end_to_end(lines: list[bytes]) -> dict:
    from rensa import RMinHash, RMinHashLSH

    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=16)
    kept = 0
    for i, line in enumerate(lines):
        text = json.loads(line)["text"]
        minhash = RMinHash(num_perm=NUM_PERM, seed=1)
        minhash.update([s.decode() for s in python_shingles(text)])
        if not lsh.query(minhash):
            lsh.insert(i, minhash)
            kept += 1
    return {"kept": kept}


# -- measuring -----------------------------------------------------------------

def measure(contenders: list[tuple[str, Callable]], data: list, rounds: int) -> tuple[dict, dict]:
    """docs/s of each contender in each round, and each one's last result.

    Rounds are interleaved (every contender once per round) so a slow spell
    of this shared machine weighs on all of them alike.
    """
    rates: dict[str, list[float]] = {name: [] for name, _ in contenders}
    results: dict[str, object] = {}
    for _ in range(rounds):
        for name, fn in contenders:
            began = time.perf_counter()
            results[name] = fn(data)
            rates[name].append(len(data) / (time.perf_counter() - began))
    return rates, results


def show(title: str, rates: dict[str, list[float]], notes: dict[str, str]) -> None:
    """Medians, min-max, and ours over each peer: of the medians, and the median of the same-round ratios."""
    print(f"\n{title}")
    print(f"  {'engine':<28} {'median docs/s':>14} {'min-max':>21} {'ours / it':>10} {'paired':>7}  notes")
    ours_name = next(iter(rates))
    ours = rates[ours_name]
    for name, values in rates.items():
        median = statistics.median(values)
        ratio = paired = ""
        if name != ours_name:
            ratio = f"{statistics.median(ours) / median:.2f}x"
            paired = f"{statistics.median(o / v for o, v in zip(ours, values)):.2f}x"
        print(f"  {name:<28} {median:>14,.0f} {min(values):>10,.0f}-{max(values):<10,.0f} {ratio:>10} {paired:>7}"
              f"  {notes.get(name, '')}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000, help="documents (default 30000)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from streamdedup.core import corpus

    docs = corpus.generate(max(1, round(args.docs / 1.84)), seed=42)[: args.docs]
    texts = [d.text for d in docs]
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"{len(texts):,} documents, {words:.0f} words each on average; {args.rounds} rounds; "
          f"{os.cpu_count()} cores; Python {sys.version.split()[0]}")

    scratch = tempfile.mkdtemp(prefix="bench-input-")
    lines = JsonlFile([(json.dumps({"id": d.id, "text": d.text}) + "\n").encode() for d in docs],
                      os.path.join(scratch, "crawl.jsonl"))
    peers = [("streamdedup", ours_sign, ours_end_to_end, "2 processes; LMDB on disk, fsync per batch, verified")]
    peers.append(("streamdedup, one process", None, ours_one_process, "signing in the deciding process"))
    peers.append(("datasketch", datasketch_sign, datasketch_end_to_end, "in memory, no verification"))
    if rensa_available():
        peers.append(("rensa", rensa_sign, rensa_end_to_end, "in memory, no verification"))
    signing, _ = measure([(name, sign) for name, sign, _, _ in peers if sign is not None], texts, args.rounds)
    end_to_end, results = measure([(name, e2e) for name, _, e2e, _ in peers], lines, args.rounds)
    shutil.rmtree(scratch, ignore_errors=True)
    show("Signing (text -> signature)", signing, {})
    show("End to end (JSONL line -> decision)", end_to_end,
         {name: f"{note}; kept {results[name]['kept']:,}" for name, _, _, note in peers})
    return 0


if __name__ == "__main__":
    sys.exit(main())
