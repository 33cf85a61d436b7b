"""Offline engine benchmark: streamdedup against the in-memory peers a user would pick instead.

For the same documents (the synthetic crawl, about 175 words each) in the
same run, each engine is timed over several rounds, and the median, min-max
and ratios are printed (rounds are interleaved; "paired" is the median of
the same-round ratios). Every measurement runs in a fresh process of its own
(libraries imported and documents read before the clock starts): a process
that has just run another engine holds its objects, and every collector pass
pays for them.

- signing: text -> MinHash signature (128 permutations, word 3-shingles);
  streamdedup with its compiled kernel and with the numpy path (what runs
  when the kernel was not built);
- signing stages: where streamdedup's preparing time goes, in microseconds a
  document (decode, normalize, shingle, sign, band keys, the rest);
- end to end: a JSONL line -> decision against everything seen before;
  every engine's index outlives the clock (``after_clock``): a user keeps
  ours, on disk, for the next run, so deleting its folder (7-80 ms at 30,000
  documents, as busy as the disk is) is no part of deduplicating; the peers'
  in-memory indexes are freed after the clock too, as they would die with
  their process.
  streamdedup: the offline command's loop (decisions file written), on-disk
               LMDB index, durable commits, exact verification; signing in a
               second process (spawned before the index is opened, as the
               command does), and (to show its gain) in the same process;
  datasketch:  MinHash.update_batch + MinHashLSH query-then-insert, in memory;
  rensa:       RMinHash + RMinHashLSH query-then-insert, in memory (if installed).

The last table puts the preparing process's time (the stages) beside the
one-process loop's: the difference is the deciding side (index lookups,
verification, writes), less what of preparing the one process overlaps: the
kernel's part of it (most of it) runs on a thread, a batch ahead
(``feed.ThreadFeed``), so the difference is the deciding thread's wall clock
less that part, not the deciding work alone. The deciding work itself is the
table's "its batches" lines: the deciding thread's own CPU and wall clock in
the offline protocol's batches (``BatchClocks``), in the one process and in the
deciding process of two.

Run: ``make bench`` or ``python -m bench.offline --docs 30000 --rounds 3``.
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

from bench import harness

# streamdedup is imported inside the functions: the preparing process re-imports this module (as it does
# the command line's), and with the engine imported at the top it would boot as slowly as a worker.

BATCH = 1000
AFTER_CLOCK: list = []  # what a task leaves to be dropped, or called, once its clock stopped (``after_clock``)
NUM_PERM = 128
THRESHOLD = 0.7


def after_clock(leftover) -> None:
    """Keep ``leftover`` (an engine's index) until the task's clock stopped; a callable is then called (a folder
    deleted), anything else dropped (freed)."""
    AFTER_CLOCK.append(leftover)


def _clear_after_clock() -> None:
    while AFTER_CLOCK:
        leftover = AFTER_CLOCK.pop()
        if callable(leftover):
            leftover()


def python_shingles(text: str) -> list[bytes]:
    """Word 3-shingles as a user of the peer libraries builds them."""
    from streamdedup.core.shingle import normalize

    words = normalize(text).split()
    if len(words) < 3:
        return [" ".join(words).encode()]
    return [" ".join(words[i:i + 3]).encode() for i in range(len(words) - 2)]


# -- streamdedup -------------------------------------------------------------

def ours_sign(texts: list[str]) -> None:
    """What ``prepare`` does from texts to signatures, a batch at a time."""
    from streamdedup.core.shingle import normalize_texts, shingle_batch
    from streamdedup.core.signing import sign_batch

    for start in range(0, len(texts), BATCH):
        batch = shingle_batch(normalize_texts(texts[start:start + BATCH]))
        sign_batch(batch, NUM_PERM, 1)


def ours_sign_numpy(texts: list[str]) -> None:
    _without_kernel()
    ours_sign(texts)


def _without_kernel() -> None:
    """Sign on the numpy path, as an install without a C compiler does."""
    from streamdedup.core import prepare, shingle, signing

    shingle._kernel = signing._kernel = prepare._kernel = None


def ours_stages(lines: list[bytes]) -> dict:
    """Seconds in each step of ``prepare`` over the lines, batch by batch."""
    from streamdedup.core.decode import InputSpec, decode_many
    from streamdedup.core.lsh import band_keys
    from streamdedup.core.prepare import prepare
    from streamdedup.core.records import Source
    from streamdedup.core.shingle import normalize_texts, shingle_batch
    from streamdedup.core.signing import SigningConfig, sign_batch

    signing = SigningConfig()
    spent = dict.fromkeys(("decode", "normalize", "shingle", "sign", "band keys", "prepare"), 0.0)
    for start in range(0, len(lines), BATCH):
        clock = time.perf_counter()
        block = lines[start:start + BATCH]
        items = decode_many(block, [Source("bench", -1, start + i) for i in range(len(block))], InputSpec())
        spent["decode"] += time.perf_counter() - clock
        texts = [item.text for item in items]
        steps = (("normalize", normalize_texts), ("shingle", lambda n: shingle_batch(n, signing.shingle, signing.k)),
                 ("sign", lambda s: sign_batch(s, signing.num_perm, signing.seed)),
                 ("band keys", lambda sig: band_keys(sig, signing.bands, signing.rows)))
        value = texts
        for name, step in steps:
            clock = time.perf_counter()
            value = step(value)
            spent[name] += time.perf_counter() - clock
        clock = time.perf_counter()
        prepare(items, signing)
        spent["prepare"] += time.perf_counter() - clock
    return spent


def ours_stages_numpy(lines: list[bytes]) -> dict:
    _without_kernel()
    return ours_stages(lines)


class JsonlFile(list):
    """The bench's lines, also written once to a JSONL file (before any clock starts) for the offline command."""

    def __init__(self, lines: list[bytes], path: str):
        super().__init__(lines)
        self.path = path
        with open(path, "wb") as handle:
            handle.writelines(lines)

    @classmethod
    def existing(cls, lines: list[bytes], path: str) -> "JsonlFile":
        """The lines of a file written already."""
        made = cls.__new__(cls)
        list.__init__(made, lines)
        made.path = path
        return made


class BatchClocks:
    """The deciding thread's own time in the offline protocol's batches (``FileRun.commit``: evidence, decision,
    index writes, the outputs' append waited for, the durable commit), wall clock and CPU (``time.thread_time``:
    this thread's alone, not the thread that signs the next batch nor the outputs' thread)."""

    def __init__(self):
        self.cpu = self.wall = 0.0

    def __enter__(self) -> "BatchClocks":
        from streamdedup.runtime.checkpoint import FileRun

        self._commit = commit = FileRun.commit
        clocks = self

        def timed(run, *args, **kwargs):
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return commit(run, *args, **kwargs)
            finally:
                clocks.cpu += time.thread_time() - cpu
                clocks.wall += time.perf_counter() - wall

        FileRun.commit = timed
        return self

    def __exit__(self, *exc) -> None:
        from streamdedup.runtime.checkpoint import FileRun

        FileRun.commit = self._commit


def ours_end_to_end(lines: JsonlFile, processes: int = 1) -> dict:
    """The offline command's loop: JSONL file in, decisions file out, durable LMDB index on disk; with the
    seconds of the deciding thread's batches (``BatchClocks``) and of the whole run: the process's CPU and the
    deciding thread's."""
    from streamdedup import config as config_module
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine.engine import Engine
    from streamdedup.runtime.offline import dedup_files

    from streamdedup.runtime.feed import spawn_file_feed

    work = tempfile.mkdtemp(prefix="bench-index-")
    spawned = None
    try:
        source = lines.path
        cfg = config_module.load(None, environ={})
        process_cpu, thread_cpu = time.process_time(), time.thread_time()
        if processes:  # first thing, before the index is opened, as the command does
            spawned = spawn_file_feed(cfg, [source])
        with BatchClocks() as batches, Engine(cfg, os.path.join(work, "state")) as engine:
            summary = dedup_files(engine, [source], InputSpec(), None, os.path.join(work, "decisions.jsonl"),
                                  cfg.worker.batch_size, prepare_processes=processes, spawned=spawned)
        return {"kept": summary.outcomes["kept"], "batches_cpu": batches.cpu, "batches_wall": batches.wall,
                "process_cpu": time.process_time() - process_cpu, "thread_cpu": time.thread_time() - thread_cpu}
    finally:
        if spawned is not None:
            spawned.close()
        after_clock(lambda: shutil.rmtree(work, ignore_errors=True))  # the index a user keeps


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
    after_clock(lsh)
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
    after_clock(lsh)
    return {"kept": kept}


# -- measuring -----------------------------------------------------------------

TASKS: dict[str, Callable] = {
    "sign:streamdedup": ours_sign, "sign:streamdedup, numpy path": ours_sign_numpy,
    "sign:datasketch": datasketch_sign, "sign:rensa": rensa_sign,
    "stages:streamdedup": ours_stages, "stages:streamdedup, numpy path": ours_stages_numpy,
    "e2e:streamdedup": ours_end_to_end, "e2e:streamdedup, one process": ours_one_process,
    "e2e:datasketch": datasketch_end_to_end, "e2e:rensa": rensa_end_to_end,
}
PRELOAD = {"streamdedup": ("streamdedup.runtime.offline", "streamdedup.engine.engine"),
           "datasketch": ("datasketch",), "rensa": ("rensa",)}


def run_child(task: str, path: str) -> dict:
    """In this (fresh) process: read the input, import the engine, then time the task alone."""
    import importlib

    kind, name = task.split(":", 1)
    for module in PRELOAD[name.split(",")[0]]:
        importlib.import_module(module)
    if kind == "e2e":
        with open(path, "rb") as handle:
            data = JsonlFile.existing(handle.readlines(), path)
    elif kind == "stages":
        with open(path, "rb") as handle:
            data = handle.readlines()
    else:
        with open(path, "rb") as handle:
            data = [json.loads(line)["text"] for line in handle]
    began = time.perf_counter()
    result = TASKS[task](data)
    seconds = time.perf_counter() - began
    _clear_after_clock()
    return {"rate": len(data) / seconds, "docs": len(data), "result": result if isinstance(result, dict) else None}


def measure(tasks: list[str], path: str, rounds: int) -> tuple[dict, dict]:
    """docs/s of each task in each round, each in a fresh process, and each one's last result.

    Rounds are interleaved (every task once per round) so a slow spell
    of this shared machine weighs on all of them alike.
    """
    results: dict[str, list] = {}

    def one(task: str, _) -> float:
        answer = harness.child("bench.offline", task, "--input", path)
        results.setdefault(task.split(":", 1)[1], []).append(answer)
        return answer["rate"]

    rates = harness.interleaved(tasks, rounds, one, log=None)
    return {task.split(":", 1)[1]: values for task, values in rates.items()}, results


def show(title: str, rates: dict[str, list[float]], notes: dict[str, str]) -> None:
    """Medians, min-max, and ours over each peer: of the medians, and the median of the same-round ratios."""
    print(f"\n{title}\n")
    print(harness.table(rates, next(iter(rates)), name="engine", ratio="ours / it (paired)", higher_is_better=False,
                        columns={"notes": notes}))


def show_stages(stages: dict[str, list]) -> None:
    """Median microseconds a document in each step of preparing, for each path."""
    names = list(next(iter(stages.values()))[0]["result"])
    print("\nSigning stages (microseconds a document, median of the rounds; 'prepare' is all of it at once)")
    print(f"  {'path':<28}" + "".join(f"{n:>11}" for n in names))
    for path, answers in stages.items():
        medians = [statistics.median(a["result"][n] / a["docs"] * 1e6 for a in answers) for n in names]
        print(f"  {path:<28}" + "".join(f"{m:>11.1f}" for m in medians))


def show_split(stages: dict[str, list], end_to_end: dict[str, list[float]], results: dict[str, list]) -> None:
    """Where the end-to-end time goes: preparing (decode to band keys) and the rest, in the deciding process; and
    the deciding thread's own time in its batches (``BatchClocks``), which is the deciding work itself."""
    prepare = statistics.median((a["result"]["decode"] + a["result"]["prepare"]) / a["docs"] * 1e6
                                for a in stages["streamdedup"])
    whole = 1e6 / statistics.median(end_to_end["streamdedup, one process"])
    two = 1e6 / statistics.median(end_to_end["streamdedup"])

    def per_document(name: str, field: str, less: str = "") -> float:
        return statistics.median((a["result"][field] - (a["result"][less] if less else 0)) / a["docs"] * 1e6
                                 for a in results[name])

    one = "streamdedup, one process"
    print("\nWhere the time goes (microseconds a document, medians)")
    print(f"  one process, end to end      {whole:8.1f}")
    print(f"    preparing (decode, prepare){prepare:8.1f}   (the second process's work with two)")
    print(f"    deciding (the rest)        {whole - prepare:8.1f}   (wall clock less preparing, of which the kernel's "
          "part runs on a thread of the one process: not the deciding work alone)")
    print(f"    its batches, CPU           {per_document(one, 'batches_cpu'):8.1f}   (the deciding thread's own, in "
          "FileRun.commit: evidence, decision, index writes, commit)")
    print(f"    its batches, wall clock    {per_document(one, 'batches_wall'):8.1f}   (the same, with the disk's and "
          "the outputs' waits)")
    print(f"    the deciding thread, CPU   {per_document(one, 'thread_cpu'):8.1f}   (its batches, reading and "
          "decoding the input, opening the index)")
    print(f"    the other threads, CPU     {per_document(one, 'process_cpu', 'thread_cpu'):8.1f}   (the kernel's "
          "preparing, the outputs' append)")
    print(f"  two processes, end to end    {two:8.1f}")
    print(f"    its batches, CPU           {per_document('streamdedup', 'batches_cpu'):8.1f}   (the deciding "
          "process's main thread, as above)")
    print(f"    its batches, wall clock    {per_document('streamdedup', 'batches_wall'):8.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=30000, help="documents (default 30000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="datasketch,rensa", help="the peers measured, of datasketch and rensa "
                        "(rensa only if installed; datasketch takes about 18 minutes a round at 1M documents)")
    parser.add_argument("--parts", default="signing,stages,e2e", help="what is measured, of signing, stages "
                        "(preparing's steps) and e2e (end to end); the split of e2e's time needs stages")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args.input)))
        return 0
    from streamdedup.core import corpus

    docs = corpus.generate(max(1, round(args.docs / 1.84)), seed=42)[: args.docs]
    texts = [d.text for d in docs]
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"{len(texts):,} documents, {words:.0f} words each on average; {args.rounds} rounds; "
          f"{os.cpu_count()} cores; Python {sys.version.split()[0]}; every measurement in a fresh process")

    scratch = tempfile.mkdtemp(prefix="bench-input-")
    lines = JsonlFile([(json.dumps({"id": d.id, "text": d.text}) + "\n").encode() for d in docs],
                      os.path.join(scratch, "crawl.jsonl"))
    asked, parts = args.peers.split(","), args.parts.split(",")
    peers = [p for p in ("datasketch", "rensa") if p in asked and (p != "rensa" or rensa_available())]
    notes = {"streamdedup": "2 processes; LMDB on disk, fsync per batch, verified",
             "streamdedup, one process": "signing in the deciding process",
             "datasketch": "in memory, no verification", "rensa": "in memory, no verification"}
    try:
        if "signing" in parts:
            signing, _ = measure([f"sign:{n}" for n in ["streamdedup", "streamdedup, numpy path"] + peers],
                                 lines.path, args.rounds)
            show("Signing (text -> signature)", signing, {"streamdedup, numpy path": "without the compiled kernel"})
        if "stages" in parts:
            _, stages = measure(["stages:streamdedup", "stages:streamdedup, numpy path"], lines.path, args.rounds)
            show_stages(stages)
        if "e2e" in parts:
            end_to_end, results = measure([f"e2e:{n}" for n in ["streamdedup", "streamdedup, one process"] + peers],
                                          lines.path, args.rounds)
            show("End to end (JSONL line -> decision)", end_to_end,
                 {name: f"{note}; kept {results[name][-1]['result']['kept']:,}" for name, note in notes.items()
                  if name in results})
            if "stages" in parts:
                show_split(stages, end_to_end, results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
