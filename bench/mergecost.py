"""What a merge into the band table costs as its epoch fills, apart from everything else.

A scratch LMDB holds a band table as the index's (dupsort, dupfixed, 4-byte buckets, 6-byte values:
``bands.BandRows``) with one epoch of E documents' random entries (22.7 a document, 32 bands); then two
merges of 100,000 documents' entries each are written in ``merge.merge_slices`` slices, each slice a durable
transaction, and their CPU is printed: building the rows as bytes, then LMDB's inserts and commits (user and
kernel time). Each merge copies and writes every leaf page of the epoch, which is what grows.

Run: ``python -m bench.mergecost 100000,1000000,3000000`` (a 3M epoch takes a few minutes to fill).
"""
import resource
import shutil
import sys
import tempfile
import time
import numpy as np, lmdb

from streamdedup.store.bands import _INDEX_ROWS
from streamdedup.store.merge import merge_slices

BANDS = 32
def entries(first, docs, rng):
    n = int(docs * 22.7)
    bands = rng.integers(0, BANDS, n).astype(np.uint64)
    keys = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    serials = rng.integers(first, first + docs, n).astype(np.uint64)
    order = np.lexsort((serials, keys, bands))
    return bands[order], keys[order], serials[order]

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime, r.ru_stime

def run(existing, merges=2):
    path = tempfile.mkdtemp(prefix='bench-mergecost-')
    env = lmdb.open(path, map_size=1 << 36, max_dbs=4, readahead=False)
    db = env.open_db(b'bands', dupsort=True, dupfixed=True)
    rng = np.random.default_rng(1)
    first = 0
    step = 500000
    while first < existing:  # fill, not durable
        docs = min(step, existing - first)
        b, k, s = entries(first, docs, rng)
        tk, tv = _INDEX_ROWS.entries(b, k, s)
        with env.begin(write=True, db=db) as txn:
            txn.cursor().putmulti(list(zip(tk, tv)), dupdata=True)
        first += docs
    env.sync(True)
    for m in range(merges):
        b, k, s = entries(first, 100000, rng)
        size = env.info()['last_pgno'] * 4096
        slices = merge_slices(int(size * 0.9), BANDS)
        u0, s0 = cpu()
        per = np.array_split(np.arange(len(b)), slices)
        tk, tv = _INDEX_ROWS.entries(b, k, s)
        t1, (u1, s1) = time.monotonic(), cpu()
        rows = list(zip(tk, tv))
        for idx in per:
            with env.begin(write=True, db=db) as txn:
                txn.cursor().putmulti(rows[idx[0]:idx[-1] + 1], dupdata=True)
        t2, (u2, s2) = time.monotonic(), cpu()
        print(f'existing {existing:>9,} docs merge {m}: slices {slices} rows {(u1-u0)+(s1-s0):.2f} s CPU; '
              f'puts+commits user {u2-u1:.2f} sys {s2-s1:.2f} wall {t2-t1:.2f}; file {size/1e6:,.0f} MB', flush=True)
        first += 100000
    env.close()
    shutil.rmtree(path, ignore_errors=True)

if __name__ == '__main__':
    for e in [int(x) for x in sys.argv[1].split(',')]:
        run(e)
