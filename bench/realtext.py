"""Recall on real text against the exact greedy reference: a corpus with exact truth, and its scorer.

The corpus is real text that a Debian machine ships (built from what this
machine has, in a fixed order, so the same machine gives the same corpus):

- the copyright files of ``/usr/share/doc/*/copyright`` and the licenses of
  ``/usr/share/common-licenses``: families of license boilerplate, many
  pairs just above and below 0.7;
- the entries of the packages' ``changelog.Debian.gz`` of at least 30 words
  (templated: "New upstream release", the same fix in many packages);
- passages of Python's standard library docstrings and its language
  reference (``streamdedup.core.webcrawl.stdlib_paragraphs``): windows of 3 to
  8 consecutive paragraphs with random starts, so overlapping windows give a
  continuum of Jaccard from 0 to 1.

Truth: every pair with Jaccard >= 0.5 over the engine's own shingles (its
normalization, word 3-grams, the 32-bit shingles it stores), by brute force
(a sparse documents x shingles product, in row blocks), and the exact greedy
reference (each document in order against every earlier kept one; the most
similar at or above 0.7, ties to the earliest, makes it a duplicate).

Scores of a ``streamdedup dedup`` run (its own process): documents whose
status equals the reference's; the reference's duplicates found; clusters
that join documents the exact >= 0.7 graph keeps apart (different connected
components); the largest difference between a reported similarity and the
exact Jaccard; docs/s and index bytes per document.

Run: ``python -m bench.realtext [--docs 30000] [--out DIR] [--set lsh.bands=20 --set lsh.rows=6 ...]``;
``--compare`` scores the default and the bands of earlier versions, ``--caps 100,10,3`` each of these
per-key and per-document limits (``lsh.max_candidates``).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import re
import sys
import tempfile
import time
from typing import Iterator

import numpy as np

from bench import harness

THRESHOLD = 0.7
LOW = 0.5
COMPARED = {
    "default (32 x 4, 2 shared)": [],
    "20 x 6, 1 shared (before)": ["lsh.bands=20", "lsh.rows=6", "lsh.min_shared_bands=1"],
    "25 x 5, 1 shared": ["lsh.bands=25", "lsh.rows=5", "lsh.min_shared_bands=1"],
    "32 x 4, 1 shared": ["lsh.bands=32", "lsh.rows=4", "lsh.min_shared_bands=1"],
}


# -- the corpus ------------------------------------------------------------------------------------


def license_texts() -> list[tuple[str, str]]:
    paths = sorted(glob.glob("/usr/share/doc/*/copyright")) + sorted(glob.glob("/usr/share/common-licenses/*"))
    found = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError):
            continue
        if 50 <= len(text.split()) <= 5000:
            found.append((path, text))
    return found


_ENTRY_END = re.compile(r"^ -- .*$", re.M)


def changelog_entries(min_words: int = 30) -> list[tuple[str, str]]:
    found = []
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
        try:
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        for number, entry in enumerate(_ENTRY_END.split(text)):
            body = "\n".join(line for line in entry.strip().splitlines()[1:])  # without the version line
            if len(body.split()) >= min_words:
                found.append((f"{path}#{number}", body))
    return found


def prose_windows(count: int, rng: random.Random, paragraphs_used: int = 0) -> list[tuple[str, str]]:
    """``count`` windows of 3 to 8 consecutive paragraphs (of the first ``paragraphs_used``, when given)."""
    from streamdedup.core.webcrawl import stdlib_paragraphs

    paragraphs = stdlib_paragraphs()[: paragraphs_used or None]
    found = []
    for number in range(count):
        start = rng.randrange(len(paragraphs) - 8)
        length = rng.randint(3, 8)
        found.append((f"stdlib[{start}:{start + length}]#{number}", " ".join(paragraphs[start:start + length])))
    return found


def build(docs: int, seed: int = 7) -> list[dict]:
    """The corpus: licenses, changelog entries, then prose windows to ``docs`` documents, shuffled by ``seed``."""
    rng = random.Random(seed)
    texts = license_texts() + changelog_entries()
    texts = texts[: docs * 2 // 3]
    texts += prose_windows(max(0, docs - len(texts)), rng)
    rng.shuffle(texts)
    return [{"id": f"r{i}", "text": text, "from": origin} for i, (origin, text) in enumerate(texts)]


# -- the truth -------------------------------------------------------------------------------------


def shingle_sets(texts: list[str]) -> list[np.ndarray]:
    """Each text's shingles as the engine stores them (sorted unique uint32)."""
    from streamdedup.core.shingle import narrow, normalize_batch, shingle_batch

    result = []
    for start in range(0, len(texts), 2000):
        batch = narrow(shingle_batch(normalize_batch(texts[start:start + 2000])))
        result += [batch.of(i) for i in range(len(batch))]
    return result


def shared_counts(sets: list[np.ndarray], block: int = 2000) -> Iterator[tuple[np.ndarray, ...]]:
    """Every pair (i < j) of documents sharing a shingle, ``block`` rows of a sparse documents x shingles product
    at a time: arrays (i, j, shingles shared, shingles of i, shingles of j)."""
    from scipy import sparse

    lengths = np.array([len(s) for s in sets], dtype=np.int64)
    columns = np.concatenate(sets).astype(np.int64) if sets else np.zeros(0, dtype=np.int64)
    _, columns = np.unique(columns, return_inverse=True)
    indptr = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    matrix = sparse.csr_matrix((np.ones(len(columns), dtype=np.int32), columns, indptr),
                               shape=(len(sets), int(columns.max(initial=0)) + 1))
    transposed = matrix.T.tocsr()
    for start in range(0, len(sets), block):
        shared = (matrix[start:start + block] @ transposed).tocoo()
        i, j, both = shared.row + start, shared.col, shared.data
        keep = i < j
        i, j, both = i[keep], j[keep], both[keep]
        yield i, j, both, lengths[i], lengths[j]


def similar_pairs(sets: list[np.ndarray], low: float = LOW, block: int = 2000) -> dict[tuple[int, int], float]:
    """Every pair (i < j) with Jaccard >= ``low``, exactly."""
    pairs = {}
    for i, j, both, first, second in shared_counts(sets, block):
        similarity = both / (first + second - both)
        good = similarity >= low
        pairs.update(zip(zip(i[good].tolist(), j[good].tolist()), similarity[good].tolist()))
    return pairs


def greedy_reference(n: int, pairs: dict) -> list[tuple[str, int]]:
    """(status, matched document or -1) of each document, by the exact greedy rule at ``THRESHOLD``."""
    earlier: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for (i, j), similarity in pairs.items():
        if similarity >= THRESHOLD:
            earlier[j].append((i, similarity))
    kept = np.zeros(n, dtype=bool)
    result = []
    for j in range(n):
        matches = [(s, -i) for i, s in earlier[j] if kept[i]]
        if matches:
            result.append(("duplicate", -max(matches)[1]))
        else:
            kept[j] = True
            result.append(("kept", -1))
    return result


def components(n: int, pairs: dict) -> np.ndarray:
    """The connected component of each document in the graph of pairs at or above the threshold."""
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (i, j), similarity in pairs.items():
        if similarity >= THRESHOLD:
            parent[root(i)] = root(j)
    return np.array([root(x) for x in range(n)])


# -- the score -------------------------------------------------------------------------------------


def score(records: list[dict], decisions: list[dict], pairs: dict, reference: list, parts: np.ndarray) -> dict:
    where = {r["id"]: i for i, r in enumerate(records)}
    decided = [None] * len(records)
    for d in decisions:
        decided[where[d["id"]]] = d
    same = found = of = 0
    error = 0.0
    clusters: dict[str, set] = {}
    for i, ((status, _), d) in enumerate(zip(reference, decided)):
        same += d["status"] == status
        if status == "duplicate":
            of += 1
            found += d["status"] == "duplicate"
        if d["status"] == "duplicate" and d["relation"] == "near":
            j = where[d["matched"]]
            exact = pairs.get((min(i, j), max(i, j)), 0.0)
            error = max(error, abs(exact - d["similarity"]))
        if d["cluster"] is not None:
            clusters.setdefault(d["cluster"], set()).add(int(parts[i]))
    return {"status": same / len(records), "found": found / of if of else 1.0, "duplicates": of,
            "mixed": sum(len(p) > 1 for p in clusters.values()), "error": error}


def run_dedup(path: str, settings: list[str]) -> tuple[list[dict], float, float]:
    """Decisions, docs/s and index bytes per document of ``streamdedup dedup`` run as its own program."""
    with tempfile.TemporaryDirectory(prefix="realtext-state-") as state:
        run = harness.dedup(path, state, settings)
        return run.decisions(), run.rate, run.index_bytes() / run.documents


def truth(records: list[dict]) -> tuple[dict, list, np.ndarray]:
    sets = shingle_sets([r["text"] for r in records])
    pairs = similar_pairs(sets)
    return pairs, greedy_reference(len(records), pairs), components(len(records), pairs)


def synthetic(docs: int) -> list[dict]:
    from streamdedup.core import corpus

    return [{"id": d.id, "text": d.text} for d in corpus.generate(int(docs / 1.83) + 60, seed=42)[:docs]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000)
    parser.add_argument("--out", default=os.path.expanduser("~/.cache/streamdedup/realtext"))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--compare", action="store_true", help="score the default and earlier bands")
    parser.add_argument("--caps", default="", metavar="N,N,...",
                        help="score the given settings with each lsh.max_candidates (where a hot key's cap bites)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    runs = COMPARED if args.compare else {"given" if args.set else "default": args.set}
    if args.caps:
        runs = {f"{run}, max_candidates {cap}": [*settings, f"lsh.max_candidates={cap}"]
                for run, settings in runs.items() for cap in args.caps.split(",")}
    print(f"{'corpus':<10} {'run':<28} {'same status':>12} {'dups found':>11} {'mixed':>6} {'sim error':>10} "
          f"{'docs/s':>8} {'B/doc':>7}")
    for name, records in (("real text", build(args.docs)), ("synthetic", synthetic(args.docs))):
        path = os.path.join(args.out, f"{name.replace(' ', '-')}-{args.docs}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in records)
        began = time.monotonic()
        pairs, reference, parts = truth(records)
        duplicates = sum(s == "duplicate" for s, _ in reference)
        print(f"{name}: {len(records):,} documents, {len(pairs):,} pairs >= {LOW}, "
              f"{sum(s >= THRESHOLD for s in pairs.values()):,} >= {THRESHOLD}, {duplicates:,} greedy duplicates "
              f"(truth in {time.monotonic() - began:.0f} s)")
        for run, settings in runs.items():
            decisions, rate, size = run_dedup(path, settings)
            r = score(records, decisions, pairs, reference, parts)
            print(f"{name:<10} {run:<28} {r['status']:>11.3%} {r['found']:>10.3%} {r['mixed']:>6} "
                  f"{r['error']:>10.2g} {rate:>8,.0f} {size:>7,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
