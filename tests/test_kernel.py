"""The compiled signing kernel against the numpy path and the one-by-one Python references."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from test_shingle import MIXED

from streamdedup.core import shingle, signing
from streamdedup.core.shingle import (
    NormalizedBatch,
    ShingleBatch,
    narrow,
    normalize_texts,
    shingle_batch,
    shingle_hashes_exact,
)
from streamdedup.core.signing import permutations, sign_batch

MORE_SCRIPTS = [
    "Москва — столица России, Москва — крупнейший город",
    "اللغة العربية جميلة جدا والعربية لغة قديمة",
    "中文文本没有空格但是有很多字符中文文本",
    "Ελληνικά και Ελληνικά γράμματα",
    "mix Latin кириллица 日本語 العربية 🎉 e\u0301\u0302 end",
    "repeat " * 300,
    "!!! ??? ...",  # nothing left after normalization
]
TEXTS = MIXED + MORE_SCRIPTS


def test_kernel_is_built():
    """``pip install`` builds it with the C compiler this machine has; without it signing is about 2x slower."""
    assert shingle._kernel is not None, "reinstall with a C compiler: pip install -e ."


def _numpy_path(monkeypatch) -> None:
    monkeypatch.setattr(shingle, "_kernel", None)
    monkeypatch.setattr(signing, "_kernel", None)


@pytest.mark.parametrize("kind, k", [("word", 1), ("word", 3), ("word", 5), ("char", 1), ("char", 3), ("char", 9)])
def test_kernel_shingles_equal_numpy_and_one_by_one(monkeypatch, kind, k):
    normalized = normalize_texts(TEXTS)
    compiled = shingle_batch(normalized, kind, k)
    _numpy_path(monkeypatch)
    vectorized = shingle_batch(normalized, kind, k)
    assert np.array_equal(compiled.offsets, vectorized.offsets)
    assert np.array_equal(compiled.hashes, vectorized.hashes)
    for i, text in enumerate(TEXTS):
        assert compiled.of(i).tolist() == shingle_hashes_exact(text, kind, k), text


def test_kernel_sorts_long_documents_and_many_repeats(monkeypatch):
    """Past 65,536 shingles buckets hold several hashes; one repeated character fills one bucket."""
    rng = np.random.default_rng(7)
    words = [" ".join(f"w{int(x)}" for x in rng.integers(0, 50_000, size=150_000)), "x" * 5000, "ab " * 3000]
    normalized = NormalizedBatch.of_normalized(words)
    compiled = [shingle_batch(normalized, kind, k) for kind, k in (("word", 3), ("char", 1), ("char", 2))]
    _numpy_path(monkeypatch)
    for batch, (kind, k) in zip(compiled, (("word", 3), ("char", 1), ("char", 2))):
        expected = shingle_batch(normalized, kind, k)
        assert np.array_equal(batch.hashes, expected.hashes) and np.array_equal(batch.offsets, expected.offsets)
        assert all(np.all(np.diff(batch.of(i).astype(np.float64)) >= 0) for i in range(len(words)))


def _reference_signature(hashes: list[int], num_perm: int, seed: int) -> list[int]:
    """The definition in plain Python: min over shingles of (a_p * top32(hash) + b_p) mod 2**32."""
    a, b = permutations(num_perm, seed)
    return [min((int(a[p, 0]) * (h >> 32) + int(b[p, 0])) & 0xFFFFFFFF for h in hashes) for p in range(num_perm)]


@pytest.mark.parametrize("num_perm, seed", [(128, 1), (64, 9), (7, 3), (100, 5)])  # 100: blocks of 32 and a tail
def test_kernel_signatures_equal_numpy_and_plain_python_on_mixed_scripts(monkeypatch, num_perm, seed):
    texts = [t for t in TEXTS if normalize_texts([t]).lengths[0]]
    shingles = shingle_batch(normalize_texts(texts))
    compiled = sign_batch(shingles, num_perm, seed)
    for i, text in enumerate(texts):
        assert compiled[i].tolist() == _reference_signature(shingle_hashes_exact(text), num_perm, seed), text
    _numpy_path(monkeypatch)
    assert np.array_equal(compiled, sign_batch(shingles, num_perm, seed))


def test_kernel_signs_any_shingle_batch_and_checks_its_shapes():
    """The engine signs filtered shingle sets too: any offsets into any hashes, not only shingle_batch's."""
    hashes = np.array([5 << 32, 3 << 32, 9 << 32, 1 << 32], dtype=np.uint64)
    batch = ShingleBatch(hashes, np.array([0, 3, 4], dtype=np.int64))
    signatures = sign_batch(batch, 16, 1)
    assert signatures[0].tolist() == _reference_signature([5 << 32, 3 << 32, 9 << 32], 16, 1)
    assert signatures[1].tolist() == _reference_signature([1 << 32], 16, 1)
    with pytest.raises(ValueError, match="offsets must rise"):
        sign_batch(ShingleBatch(hashes, np.array([0, 5], dtype=np.int64)), 16, 1)


def test_kernel_ascii_normalization_equals_numpy_and_exact(monkeypatch):
    """Runs of spaces and punctuation at every place (starts, ends, empty texts, NULs), every ASCII byte."""
    import random

    from streamdedup.core.shingle import content_hash, normalize_exact

    rng = random.Random(11)
    alphabet = "aZ9 .,\t\n\x00-!  " + "".join(map(chr, range(128)))
    pool = ["", " ", "  a  ", "a", "!!", " .a. b ", "\x00a\x00", "".join(map(chr, range(128)))]
    pool += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(30))) for _ in range(2000)]
    batches = [rng.sample(pool, rng.randrange(1, 40)) for _ in range(100)]
    compiled = [normalize_texts(batch) for batch in batches]
    _numpy_path(monkeypatch)
    for batch, ours in zip(batches, compiled):
        theirs = normalize_texts(batch)
        assert np.array_equal(ours.points, theirs.points) and ours.points.dtype == np.uint32
        assert np.array_equal(ours.starts, theirs.starts) and np.array_equal(ours.lengths, theirs.lengths)
        assert ours.contents == theirs.contents == [content_hash(normalize_exact(t)) for t in batch]


def test_kernel_signs_narrowed_shingles_like_the_whole_hashes(monkeypatch):
    """``shingle.narrow``'s uint32 top bits sign as they are: the same signatures as the 64-bit hashes."""
    texts = [t for t in TEXTS if normalize_texts([t]).lengths[0]]
    shingles = shingle_batch(normalize_texts(texts))
    narrowed = narrow(shingles)
    assert narrowed.hashes.dtype == np.uint32
    compiled = sign_batch(narrowed, 128, 1)
    assert np.array_equal(compiled, sign_batch(shingles, 128, 1))
    _numpy_path(monkeypatch)
    assert np.array_equal(compiled, sign_batch(narrowed, 128, 1))


def test_kernel_counts_shared_shingles_as_numpy_and_python_do():
    from streamdedup.core import verify

    rng = np.random.default_rng(3)
    cases = [(np.zeros(0, np.uint32), np.arange(5, dtype=np.uint32)),
             (np.array([0, 0xFFFFFFFF], np.uint32), np.array([0xFFFFFFFF], np.uint32)),
             (np.arange(0, 100, 2, dtype=np.uint32), np.arange(0, 100, 3, dtype=np.uint32))]
    for n, m in [(175, 180), (3, 900), (1000, 10)]:
        a = np.unique(rng.integers(0, 1 << 32, n, dtype=np.uint64)).astype(np.uint32)
        b = np.unique(np.concatenate((a[: n // 2], rng.integers(0, 1 << 32, m, dtype=np.uint64).astype(np.uint32))))
        cases.append((a, b))
    for a, b in cases:
        expected = len(set(a.tolist()) & set(b.tolist()))
        assert verify._kernel.shared_count(a, b) == verify.shared_count_numpy(a, b) == expected
        union = len(set(a.tolist()) | set(b.tolist()))
        assert verify.jaccard(a, b) == (expected / union if union else 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_mirror_merges_runs_in_place_as_numpy_does(monkeypatch, seed):
    """The recent mirror's sorted entries take runs in (``_kernel.merge_into``, in place from the end, growing
    their room) exactly as the numpy path does: sorted by slot, a run's entries after equal slots there."""
    from streamdedup.store import mirror

    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(6):
        keys = np.sort(rng.integers(0, 50, int(rng.integers(0, 400))).astype(np.uint64))
        runs.append((keys, rng.integers(0, 1 << 40, len(keys)).astype(np.int64)))
    merged = []
    for kernel in (mirror._kernel, None):
        monkeypatch.setattr(mirror, "_kernel", kernel)
        entries = mirror.SortedEntries()
        for run in runs:
            entries.merge(run)
        merged.append(tuple(part.copy() for part in entries.entries()))
    keys = np.concatenate([run[0] for run in runs])
    order = np.argsort(keys, kind="stable")
    expected = keys[order], np.concatenate([run[1] for run in runs])[order]
    for keys_found, serials_found in merged:
        assert np.array_equal(keys_found, expected[0]) and np.array_equal(serials_found, expected[1])


def test_kernel_blake2b_equals_hashlib():
    """The content hash made in the kernel (``prepare_ascii``) is hashlib's BLAKE2b, at every block boundary."""
    import hashlib

    from streamdedup.core import _kernel

    rng = np.random.default_rng(3)
    for n in [*range(0, 300), 1000, 4096, 10_000]:
        data = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
        for size in (8, 16, 32, 64):
            assert _kernel.blake2b(data, size) == hashlib.blake2b(data, digest_size=size).digest(), (n, size)


def test_a_batchs_content_hashes_made_four_at_a_time_are_hashlibs():
    """``prepare_ascii`` hashes a batch's normalized texts four at a time where the CPU has AVX2, those of as many
    128-byte blocks side by side: each is hashlib's BLAKE2b-128 of its normalized bytes, for every length around
    the blocks' edges, in batches of one to nine texts (a group of four and the rest alone) of mixed lengths."""
    import hashlib
    import random

    from streamdedup.core import prepare as prepare_module
    from streamdedup.core.shingle import normalize_exact

    rng = random.Random(4)
    lengths = [*range(1, 400), *range(1000, 1100), 5000]
    texts = ["".join(rng.choice("ab ") for _ in range(n)).strip() or "a" for n in lengths]
    rng.shuffle(texts)
    at = 0
    while at < len(texts):
        batch = texts[at:at + rng.randrange(1, 10)]
        at += len(batch)
        contents, _, _ = prepare_module._prepared_ascii(batch, signing.SigningConfig())
        assert contents == [hashlib.blake2b(normalize_exact(t).encode(), digest_size=16).digest() for t in batch]


def test_a_batchs_id_keys_made_in_the_kernel_are_id_key_of_each(monkeypatch):
    """``prepare.id_keys_of``: the kernel's keys of every id are ``records.id_key``'s, non-ASCII ids and every
    length around BLAKE2b's 128-byte block included; without the kernel the same; a non-str id is refused."""
    from streamdedup.core import prepare
    from streamdedup.core.records import id_key

    ids = [*TEXTS, "", "https://example.com/page?id=7", *("é" * n for n in range(60, 70)),
           *("x" * n for n in range(120, 260))]
    expected = [id_key(doc_id) for doc_id in ids]
    assert prepare._kernel.id_keys(ids) == expected
    assert prepare.id_keys_of(ids) == expected
    with pytest.raises(TypeError):
        prepare._kernel.id_keys(["a", 3])
    monkeypatch.setattr(prepare, "_kernel", None)
    assert prepare.id_keys_of(ids) == expected


@pytest.mark.parametrize("kind, k, bands, rows", [("word", 3, 32, 4), ("word", 1, 20, 6), ("char", 5, 16, 8)])
def test_kernel_prepares_ascii_batches_as_the_steps_do(monkeypatch, kind, k, bands, rows):
    """``prepare`` in one kernel call (every text ASCII) gives the contents, shingles and band keys of the
    steps one by one; a batch with a text that is not ASCII, or left empty, takes the steps."""
    import dataclasses

    from streamdedup.core import corpus, prepare as prepare_module
    from streamdedup.core.records import Document, Source

    signing_config = dataclasses.replace(signing.SigningConfig(), shingle=kind, k=k, bands=bands, rows=rows)
    texts = [d.text for d in corpus.generate(300, seed=5)] + ["a", "a b", "A, b; C!", "x" * 300, "one two three"]
    batches = [texts, texts[:50] + ["é n'est pas ASCII"], texts[:20] + ["!!! ???"]]
    for batch_texts in batches:
        items = [Document(str(i), text, Source("t", -1, i)) for i, text in enumerate(batch_texts)]
        fused = prepare_module.prepare(items, signing_config)
        monkeypatch.setattr(prepare_module, "_kernel", None)
        steps = prepare_module.prepare(items, signing_config)
        monkeypatch.undo()
        assert fused.row == steps.row and fused.contents == steps.contents
        assert [type(i) for i in fused.items] == [type(i) for i in steps.items]
        assert fused.keys.dtype == steps.keys.dtype and np.array_equal(fused.keys, steps.keys)
        assert fused.shingles.hashes.dtype == steps.shingles.hashes.dtype
        assert np.array_equal(fused.shingles.hashes, steps.shingles.hashes)
        assert np.array_equal(fused.shingles.offsets, steps.shingles.offsets)
    assert prepare_module._prepared_ascii(texts, signing_config) is not None


def _prose_like(rng, length: int) -> str:
    """Words of letters and digits in both cases, mostly one space apart, now and then two non-word bytes in a row
    (". ", ", ", "  ", "\n-"): every way a 16-byte block of prose can start, end and hold its non-word bytes."""
    pieces = []
    while sum(map(len, pieces)) < length:
        pieces.append("".join(rng.choice("abcXYZ019") for _ in range(rng.randrange(1, 12))))
        pieces.append(rng.choice([" "] * 12 + [". ", ", ", "  ", "\n-", "!", "\t", "'"]))
    text = "".join(pieces)[:length]
    return rng.choice(["", " ", ". ", "A"]) + text


@pytest.mark.parametrize("kind, k", [("word", 3), ("word", 1), ("word", 5), ("char", 4)])
def test_kernel_prepares_prose_16_bytes_at_a_time_as_the_steps_do(monkeypatch, kind, k):
    """Prose is normalized 16 bytes at a time where a block is its own normalization, and a word's shingles come
    from where its spaces are: the normalized points, contents, shingles and band keys of the steps one by one,
    for texts of every length around the blocks' and the words' edges."""
    import dataclasses
    import random

    from streamdedup.core import prepare as prepare_module
    from streamdedup.core.records import Document, Source

    rng = random.Random(45)
    texts = [_prose_like(rng, length) for length in list(range(0, 70)) + [rng.randrange(70, 3000) for _ in range(400)]]
    texts = [t for t in texts if t.strip(" .,!-'\t\n")]  # a text left empty rejects the whole kernel call
    signing_config = dataclasses.replace(signing.SigningConfig(), shingle=kind, k=k)
    batches = [texts[i:i + rng.randrange(1, 60)] for i in range(0, len(texts), 37)]
    made = [(normalize_texts(b), prepare_module._prepared_ascii(b, signing_config)) for b in batches]
    assert all(fused is not None for _, fused in made)
    _numpy_path(monkeypatch)
    monkeypatch.setattr(prepare_module, "_kernel", None)
    for batch, (normalized, fused) in zip(batches, made):
        theirs = normalize_texts(batch)
        assert np.array_equal(normalized.points, theirs.points)
        assert np.array_equal(normalized.lengths, theirs.lengths)
        items = [Document(str(i), text, Source("t", -1, i)) for i, text in enumerate(batch)]
        steps = prepare_module.prepare(items, signing_config)
        contents, shingles, keys = fused
        assert contents == steps.contents
        assert np.array_equal(shingles.hashes, steps.shingles.hashes)
        assert np.array_equal(shingles.offsets, steps.shingles.offsets)
        assert np.array_equal(keys, steps.keys)


@pytest.mark.parametrize("overrides", [(), ("excerpts.enabled=true",), ("lsh.cap=\"probes\"",)])
def test_decisions_without_the_kernel_are_the_decisions_with_it(tmp_path, monkeypatch, overrides):
    """An install without a C compiler decides every document as one with the kernel: the whole offline loop
    (prepared in this process), on articles and copies, a web crawl with templates, excerpts and non-ASCII pages."""
    import io
    import json
    import random

    from streamdedup import config as config_module
    from streamdedup.core import corpus, eliasfano, lsh, prepare as prepare_module, templates, verify, webcrawl
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine import decide
    from streamdedup.engine.engine import Engine
    from streamdedup.runtime.offline import dedup_files
    from streamdedup.runtime.sink import files
    from streamdedup.store import view
    from streamdedup.store import bandfilter, candidates, index, mirror

    web = io.StringIO()
    webcrawl.write_web_jsonl(webcrawl.generate_web(600, 12, seed=3), web)
    lines = [json.dumps({"id": d.id, "text": d.text}) for d in corpus.generate(300, seed=9)]
    lines += web.getvalue().splitlines()
    lines += [json.dumps({"id": f"x{i}", "text": text + " é"}) for i, text in enumerate(TEXTS)]
    random.Random(4).shuffle(lines)
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    cfg = config_module.load(None, overrides, environ={})

    def decisions(name: str) -> bytes:
        with Engine(cfg, str(tmp_path / name)) as engine:
            dedup_files(engine, [str(source)], InputSpec(), None, str(tmp_path / f"{name}.jsonl"), 300)
        return (tmp_path / f"{name}.jsonl").read_bytes()

    compiled = decisions("kernel")
    for module in (shingle, signing, prepare_module, verify, eliasfano, mirror, index, bandfilter, candidates, lsh,
                   files, view, decide):
        monkeypatch.setattr(module, "_kernel", None)
    monkeypatch.setattr(templates, "_sorted_member", None)
    monkeypatch.setattr(templates, "_sorted_without", None)
    monkeypatch.setattr(templates, "_sorted_union", None)
    monkeypatch.setattr(templates, "_growing_member", None)
    monkeypatch.setattr(templates, "_new_and_again", None)
    monkeypatch.setattr(templates, "_sorted_without_each", None)
    assert decisions("numpy") == compiled
    assert compiled.count(b'"duplicate"') > 200


def _decided_in_batches(cfg, source, documents: int, state, recent: bool = False) -> tuple:
    """``dedup`` of ``source`` in batches of 250 into a new index at ``state``: the decisions file's bytes, the
    ``recent`` table's entries (with ``recent``) and each record's fields."""
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine.engine import Engine
    from streamdedup.runtime.offline import dedup_files

    with Engine(cfg, str(state)) as engine:
        dedup_files(engine, [str(source)], InputSpec(), None, f"{state}.jsonl", 250)
        with engine.index.read() as txn:
            records = [txn.record(serial) for serial in range(1, documents + 1)]
            entries = list(txn.txn.cursor(db=txn.dbs["recent"])) if recent else []
    return Path(f"{state}.jsonl").read_bytes(), entries, [
        (r.id, r.kept, r.cluster, r.cluster_id, r.matched, r.matched_id, r.similarity, r.exact, r.content)
        for r in records]


@pytest.mark.parametrize("kernel", [True, False])
def test_rows_decided_by_their_stored_candidates_on_the_quick_path_as_one_by_one(tmp_path, monkeypatch, kernel):
    """Rows whose only candidates are stored documents (``decide._State.quick_rows``), decided on the quick path
    (by ``_kernel.kept_alone``, or ``decided_quick`` without the kernel), are decided as ``decide`` decides them
    one by one: the same decisions file, with near duplicates and rows kept after a look among them, and the
    same records in the index."""
    import json

    from streamdedup import config as config_module
    from streamdedup.core import corpus
    from streamdedup.engine import decide

    lines = [json.dumps({"id": d.id, "text": d.text}) for d in corpus.generate(700, seed=11)]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    cfg = config_module.load(None, environ={})
    if not kernel:
        monkeypatch.setattr(decide, "_kernel", None)
    quick_rows, outcomes = decide._State.quick_rows, []

    def noted(state, alone):
        rows = quick_rows(state, alone)
        outcomes.extend((count, match) for count, match in zip(state.quick_counts, state.quick_matches) if count)
        return rows

    monkeypatch.setattr(decide._State, "quick_rows", noted)
    quick = _decided_in_batches(cfg, source, len(lines), tmp_path / "quick")
    monkeypatch.setattr(decide._State, "quick_rows", lambda state, alone: alone)
    assert _decided_in_batches(cfg, source, len(lines), tmp_path / "one_by_one") == quick
    assert sum(match is not None for _, match in outcomes) > 100
    assert sum(match is None for _, match in outcomes) > 0


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("cap", ["kept", "probes"])
def test_exact_copies_and_rows_leading_shared_slots_on_the_quick_path_as_one_by_one(tmp_path, monkeypatch, kernel,
                                                                                   cap):
    """Rows whose only link is a stored twin (``decide._State._rows_twinned``), made exact copies of it, and rows
    sharing band slots with later rows only (``_rows_leading``), decided by their stored candidates and then
    filing those slots, on the quick path (by ``_kernel.kept_alone`` and ``_file_leading``, or ``decided_quick``
    without the kernel), are decided as ``decide`` decides them one by one: the same decisions file, the same
    records and ``recent`` entries (with ``lsh.cap = "probes"``, the places taken: none by an exact copy)."""
    import json

    from streamdedup import config as config_module
    from streamdedup.core import corpus
    from streamdedup.engine import decide

    documents = corpus.generate(700, seed=11)
    lines = [json.dumps({"id": d.id, "text": d.text}) for d in documents]
    lines += [json.dumps({"id": f"copy-{n}", "text": d.text}) for n, d in enumerate(documents[::7])]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    cfg = config_module.load(None, environ={}, overrides=[f'lsh.cap="{cap}"'])
    if not kernel:
        monkeypatch.setattr(decide, "_kernel", None)
    quick_rows, twins, leading = decide._State.quick_rows, [], []

    def noted(state, alone):
        rows = quick_rows(state, alone)
        twins.extend(twin for twin in state.quick_twins if twin is not None)
        leading.append(int(state._leading.sum()))
        return rows

    monkeypatch.setattr(decide._State, "quick_rows", noted)
    quick = _decided_in_batches(cfg, source, len(lines), tmp_path / "quick", recent=True)
    monkeypatch.setattr(decide._State, "quick_rows", lambda state, alone: alone)
    assert _decided_in_batches(cfg, source, len(lines), tmp_path / "one_by_one", recent=True) == quick
    assert len(twins) > 50 and sum(leading) > 20


@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_finds_values_in_a_sorted_table_as_searchsorted_does(monkeypatch, seed):
    """``templates.in_sorted``: values ascending (a page's shingles) or not, repeated, past the table's ends."""
    from streamdedup.core import templates

    rng = np.random.default_rng(seed)
    cases = [(np.array([], dtype=np.uint32), np.array([3], dtype=np.uint32)),
             (np.array([0, 2**32 - 1, 5], dtype=np.uint32), np.array([0, 5, 2**32 - 1], dtype=np.uint32))]
    for _ in range(300):
        table = np.unique(rng.integers(0, 3000, int(rng.integers(1, 900))).astype(np.uint32))
        values = rng.integers(0, 3200, int(rng.integers(0, 700))).astype(np.uint32)
        cases.append((np.unique(values) if rng.random() < 0.5 else values, table))
    compiled = [templates.in_sorted(values, table) for values, table in cases]
    monkeypatch.setattr(templates, "_sorted_member", None)
    for (values, table), found in zip(cases, compiled):
        assert found.dtype == bool and np.array_equal(found, templates.in_sorted(values, table))
    assert sum(int(found.sum()) for found in compiled) > 1000


@pytest.mark.parametrize("seed", range(3))
def test_values_and_a_table_of_close_sizes_are_merged_as_searchsorted_finds(monkeypatch, seed):
    """The kernel's merge of values that never descend through a table an eighth to four times as many (a page
    against its site's template or the shared one): values repeated, a table with repeated values, both ends of
    uint32, either array ending first; found, kept and kept of each as numpy does."""
    from streamdedup.core import templates

    rng = np.random.default_rng(seed)
    ends = np.array([0, 2**32 - 1], dtype=np.uint32)
    cases = []
    for _ in range(300):
        size = int(rng.integers(16, 700))
        span = int(rng.choice([2 * size, 50 * size, 2**32 - 1]))
        values = np.sort(np.concatenate([rng.integers(0, span, size, dtype=np.uint64).astype(np.uint32),
                                         ends[:int(rng.integers(0, 3))]]))
        table = np.sort(rng.integers(0, span, int(size * rng.uniform(0.13, 3.9)), dtype=np.uint64).astype(np.uint32))
        shared = np.sort(np.concatenate([rng.choice(values, size // 3), rng.integers(0, span, size // 2,
                                                                                       dtype=np.uint64).astype(np.uint32)]))
        cases.append((values, table, shared))
    found = [templates.in_sorted(values, table) for values, table, _ in cases]
    kept = [templates._without(values, table, shared) for values, table, shared in cases]
    each = [templates._without_each(values, table, shared) for values, table, shared in cases]
    for name in ("_sorted_member", "_sorted_without", "_sorted_without_each"):
        monkeypatch.setattr(templates, name, None)
    for (values, table, shared), one, two, (rest, left) in zip(cases, found, kept, each):
        assert np.array_equal(one, np.isin(values, table))
        assert np.array_equal(two, values[~np.isin(values, table) & ~np.isin(values, shared)])
        assert np.array_equal(rest, values[~np.isin(values, table)]) and np.array_equal(left, two)
    assert sum(int(one.sum()) for one in found) > 1000 and sum(len(two) for two in kept) > 1000


@pytest.mark.parametrize("seed", range(3))
def test_a_growing_set_finds_values_through_its_buckets_as_searchsorted_does(monkeypatch, seed):
    """``GrowingSet.contains`` in the kernel (its main part through its buckets, a site's seen shingles): values
    ascending or not, repeated, at both ends of uint32, in either part."""
    from streamdedup.core import templates

    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(60):
        size = int(rng.choice([0, 7, 16, 50, 1023, 1024, 20000]))
        pool = np.unique(np.concatenate([rng.integers(0, 2**32, size + 600, dtype=np.uint64).astype(np.uint32),
                                         np.array([0, 2**32 - 1], dtype=np.uint32)]))
        chosen = rng.permutation(len(pool))
        grown = templates.GrowingSet(np.sort(pool[chosen[:size]]))
        grown = grown.with_values(np.sort(pool[chosen[size:size + int(rng.integers(0, 300))]]))
        values = np.concatenate([pool[rng.integers(0, len(pool), 400)],
                                 rng.integers(0, 2**32, 100, dtype=np.uint64).astype(np.uint32)])
        cases.append((grown, np.unique(values) if rng.random() < 0.5 else values))
    compiled = [grown.contains(values) for grown, values in cases]
    monkeypatch.setattr(templates, "_growing_member", None)
    for (grown, values), found in zip(cases, compiled):
        plain = templates.in_sorted(values, grown.main) | templates.in_sorted(values, grown.recent)
        assert found.dtype == bool and np.array_equal(found, plain)
        assert np.array_equal(found, grown.contains(values))
    assert sum(int(found.sum()) for found in compiled) > 5000


@pytest.mark.parametrize("seed", range(3))
def test_a_sites_repeats_are_counted_in_the_kernel_as_numpy_counts_them(monkeypatch, seed):
    """``SiteState.count_repeats`` page by page (``_kernel.new_and_again``, the merges by runs): the same ``seen``
    and ``repeated``, parts and all, on a site whose pages share much (its recent parts merge into the main ones)
    and past ``MAX_SEEN``."""
    from streamdedup.core import templates

    monkeypatch.setattr(templates, "MAX_SEEN", 30000)
    rng = np.random.default_rng(seed)
    common = rng.integers(0, 2**32, 8000, dtype=np.uint64).astype(np.uint32)
    pages = [np.unique(np.concatenate([rng.choice(common, int(rng.integers(0, 800))),
                                       rng.integers(0, 2**32, int(rng.integers(0, 500)), dtype=np.uint64)
                                       .astype(np.uint32)])).astype(np.uint32) for _ in range(150)]

    def counted() -> list:
        state, states = templates.SiteState(), []
        for page in pages:
            state.count_repeats(page)
            states.append((state.seen.main, state.seen.recent, state.repeated.main, state.repeated.recent,
                           np.array([len(chunk) for chunk in state.seen.chunks + state.repeated.chunks])))
        return states

    compiled = counted()
    for name in ("_new_and_again", "_growing_member", "_sorted_union"):
        monkeypatch.setattr(templates, name, None)
    for kernel, plain in zip(compiled, counted()):
        assert all(np.array_equal(one, other) and one.dtype == other.dtype for one, other in zip(kernel, plain))
    assert len(compiled[-1][0]) > 15000 and len(compiled[-1][2]) > 4000 and len(compiled[-1][3])
    assert len(compiled[-1][4]) > 3  # the recent parts in chunks


def _random_pages(rng, with_shared: float):
    """300 random (page, its site's template within it, the shared template: empty but for ``with_shared`` of
    them), sorted unique uint32 arrays, drawn one page at a time from ``rng``."""
    from streamdedup.core import templates

    for _ in range(300):
        page = np.unique(rng.integers(0, 4000, int(rng.integers(0, 600))).astype(np.uint32))
        template = np.unique(rng.choice(page, int(rng.integers(0, len(page) + 1))) if len(page) else page)
        shared = np.unique(rng.integers(0, 4000, int(rng.integers(0, 80))).astype(np.uint32))
        yield page, template.astype(np.uint32), shared if rng.random() < with_shared else templates.EMPTY


@pytest.mark.parametrize("seed", range(3))
def test_a_pages_content_is_made_in_the_kernel_as_numpy_makes_it(monkeypatch, seed):
    """``templates.content_of``: the same content, the page's own array where nothing (or too much) would go."""
    from streamdedup.core import templates

    rng = np.random.default_rng(seed)
    cases = [(page, template, shared, float(rng.choice([0.0, 0.2, 0.9])))
             for page, template, shared in _random_pages(rng, 0.5)]
    compiled = [templates.content_of(*case) for case in cases]
    monkeypatch.setattr(templates, "_sorted_without", None)
    monkeypatch.setattr(templates, "_sorted_member", None)
    for case, content in zip(cases, compiled):
        plain = templates.content_of(*case)
        assert content.dtype == np.uint32 and np.array_equal(content, plain)
        assert (content is case[0]) == (plain is case[0])
    assert sum(content is not case[0] for case, content in zip(cases, compiled)) > 50


@pytest.mark.parametrize("seed", range(3))
def test_a_new_pages_counted_part_and_content_come_out_of_one_walk_as_of_two(monkeypatch, seed):
    """``SiteState.counted_part_and_rest`` (``_kernel.sorted_without_each``): the page without its site's template,
    and that without the shared template too, as the two walks of ``templates._without`` give them."""
    from streamdedup.core import templates

    cases = list(_random_pages(np.random.default_rng(seed), 0.8))
    compiled = [templates.SiteState(template=template).counted_part_and_rest(page, shared)
                for page, template, shared in cases]
    monkeypatch.setattr(templates, "_sorted_without_each", None)
    monkeypatch.setattr(templates, "_sorted_without", None)
    monkeypatch.setattr(templates, "_sorted_member", None)
    for (page, template, shared), (counted, kept) in zip(cases, compiled):
        rest = templates._without(page, template, templates.EMPTY) if len(template) else page
        assert counted.dtype == kept.dtype == np.uint32
        assert np.array_equal(counted, rest) and np.array_equal(kept, templates._without(rest, templates.EMPTY, shared))
    assert sum(0 < len(kept) < len(counted) < len(page) for (page, _, _), (counted, kept) in zip(cases, compiled)) > 50


def test_ascending_values_a_few_places_apart_are_found_and_merged_as_numpy_does(monkeypatch):
    """The kernel's walk through a sorted table 4 to 64 times as long as the values counts the table's next 16
    values before it doubles its steps (``lower_bound_near32``), and only doubles elsewhere: values every 1 to 70
    places of the table (both walks; found within, at the edge of and past those 16), between its values and at
    its end, found, kept and merged as numpy does."""
    from streamdedup.core import templates

    table = np.arange(0, 20000, 2, dtype=np.uint32)
    cases = []
    for gap in range(1, 71):
        for shift in (0, 1):  # on the table's values, or between them
            values = (table[::gap] + shift).astype(np.uint32)
            cases.append((values, table))
            cases.append((values[: len(values) // 2], table[: 17 * gap // 2 + 3]))  # past the table's end
    found = [templates.in_sorted(values, table) for values, table in cases]
    kept = [templates._without(values, table, templates.EMPTY) for values, table in cases]
    merged = [templates._merged(table, values[np.isin(values, table, invert=True)]) for values, table in cases]
    for name in ("_sorted_member", "_sorted_without", "_sorted_union"):
        monkeypatch.setattr(templates, name, None)
    for (values, table), one, two, three in zip(cases, found, kept, merged):
        assert np.array_equal(one, templates.in_sorted(values, table))
        assert np.array_equal(two, templates._without(values, table, templates.EMPTY))
        assert np.array_equal(three, templates._merged(table, values[np.isin(values, table, invert=True)]))
    assert sum(int(one.sum()) for one in found) > 10000


@pytest.mark.parametrize("seed", range(3))
def test_sorted_sets_are_merged_in_the_kernel_as_numpy_merges_them(monkeypatch, seed):
    """``templates._merged`` (a site's growing sets): sorted unions, each value once; an array out of order falls
    back to numpy's sort."""
    from streamdedup.core import templates

    rng = np.random.default_rng(seed)
    cases = [(templates.EMPTY, templates.EMPTY), (np.array([5, 5, 7], dtype=np.uint32), templates.EMPTY),
             (np.array([9, 1], dtype=np.uint32), np.array([1, 2], dtype=np.uint32)),
             (np.array([0, 2**32 - 1], dtype=np.uint32), np.array([2**32 - 1], dtype=np.uint32))]
    for _ in range(200):
        one = np.unique(rng.integers(0, 5000, int(rng.integers(0, 3000))).astype(np.uint32))
        other = np.unique(rng.integers(0, 5000, int(rng.integers(0, 600))).astype(np.uint32))
        cases.append((one, other) if rng.random() < 0.5 else (other, one))
    compiled = [templates._merged(*case) for case in cases]
    monkeypatch.setattr(templates, "_sorted_union", None)
    for case, merged in zip(cases, compiled):
        assert merged.dtype == np.uint32 and np.array_equal(merged, templates._merged(*case))
    assert compiled[2].tolist() == [1, 2, 9]


def test_shingles_that_came_through_pickle_are_verified_by_the_kernel(monkeypatch):
    """Arrays from the feed process are unpickled, with a dtype instance of their own: still uint32 for the
    kernel (``verify.jaccard`` took them for another type and verified them in numpy, several times slower)."""
    import pickle

    from streamdedup.core import verify

    a = np.array([1, 5, 9, 12], dtype=np.uint32)
    b = pickle.loads(pickle.dumps(np.array([5, 9, 13], dtype=np.uint32), protocol=5))
    assert b.dtype is not np.dtype(np.uint32)

    def refuse(*_):
        raise AssertionError("the numpy path")

    monkeypatch.setattr(verify, "shared_count_numpy", refuse)
    assert verify.jaccard(a, b) == verify.jaccard(b, a) == 2 / 5


def _arranged(keys: np.ndarray, seed: int) -> np.ndarray:
    """Keys as they are (seed 1), sorted (2), or in four sorted runs (3)."""
    if seed == 1:
        return keys
    if seed == 2:
        return np.sort(keys)
    return np.concatenate([np.sort(part) for part in np.array_split(keys, 4)])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_kernel_pairs_hits_as_numpy_does(monkeypatch, seed):
    """``Hits.found`` by the kernel (``_kernel.hits``) against the numpy path: keys asked by several rows,
    entries of one key past the cap, serials found under several of a row's keys, rows with none; found
    keys in any order, sorted (as lookups give them: each search starts where the last ended), or in
    sorted runs."""
    from streamdedup.core.lsh import sorted_slots
    from streamdedup.store import candidates
    from streamdedup.store.candidates import Hits

    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 400, size=(300, 8), dtype=np.uint64)  # few values: rows share many keys
    asked, rows, _ = sorted_slots(keys)
    found_keys = rng.choice(asked, size=2000)
    found_keys = np.concatenate([found_keys, np.full(150, asked[7], dtype=np.uint64),
                                 np.array([asked[-1] + 1], dtype=np.uint64)])  # a hot key; one asked by no row
    found_keys = np.concatenate([np.zeros(1, dtype=np.uint64), found_keys])  # below every asked key
    found_keys = _arranged(found_keys, seed)
    found_serials = rng.integers(0, 5000, size=len(found_keys)).astype(np.int64)
    for per_key in (None, 100, 3):
        compiled = Hits.found(asked, rows, 300, found_keys, found_serials, per_key)
        with monkeypatch.context() as patch:
            patch.setattr(candidates, "_kernel", None)
            vectorized = Hits.found(asked, rows, 300, found_keys, found_serials, per_key)
        assert compiled.bounds == vectorized.bounds
        assert np.array_equal(compiled.serials, vectorized.serials) and compiled.serials.dtype == np.int64
        assert np.array_equal(compiled.shared, vectorized.shared)
        assert compiled.bounds[-1] > 1000
        assert all(compiled.listed(row) == tuple(part.tolist() for part in vectorized.of(row)) for row in range(300))


@pytest.mark.parametrize("seed", range(4))
def test_the_mirror_sorts_and_folds_runs_as_numpy_does(monkeypatch, seed):
    """A batch's mirror entries sorted (``_kernel.sort_entries``, a radix sort) and the fresh runs folded
    (``_kernel.merge_into`` one run after another) as numpy's stable sorts do: by slot, equal slots in the
    order given; keys of every width, repeats, one key alone, empty runs."""
    from streamdedup.store import mirror

    rng = np.random.default_rng(seed)
    runs = []
    for high in (1, 2, 50, 1 << 20, 1 << 37, 1 << 63, 1 << 64):
        size = int(rng.integers(0, 3000))
        keys = rng.integers(0, high, size, dtype=np.uint64) + np.uint64(int(rng.integers(0, 1 << 8)) * (high < 1 << 64))
        runs.append((keys, rng.integers(-(1 << 40), 1 << 40, size).astype(np.int64)))
    runs.append((np.full(7, 1 << 40, dtype=np.uint64), np.arange(7, dtype=np.int64)))
    for keys, serials in runs:
        order = np.argsort(keys, kind="stable")
        expected = keys[order], serials[order]
        for kernel in (mirror._kernel, None):
            monkeypatch.setattr(mirror, "_kernel", kernel)
            found = mirror._sorted_entries(keys.copy(), serials.copy())
            assert np.array_equal(found[0], expected[0]) and np.array_equal(found[1], expected[1])
    sorted_runs = [mirror._sorted_entries(*run) for run in runs]
    folded = []
    for kernel in (mirror._kernel, None):
        monkeypatch.setattr(mirror, "_kernel", kernel)
        folded.append(mirror._merged_runs(sorted_runs))
    assert np.array_equal(folded[0][0], folded[1][0]) and np.array_equal(folded[0][1], folded[1][1])


@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_sets_and_tests_the_mirrors_key_bits_as_numpy_does(monkeypatch, seed):
    """The mirror's presence map (``_KeyBits``) set and asked in the kernel (``key_bits_set``,
    ``key_bits_test``) bit for bit as the numpy path does, band slots (band in the high bits) included."""
    from streamdedup.store import mirror

    rng = np.random.default_rng(seed)
    added = [rng.integers(0, 1 << 40, int(rng.integers(0, 5000)), dtype=np.uint64) for _ in range(4)]
    asked = np.concatenate([rng.integers(0, 1 << 40, 20000, dtype=np.uint64), *added])
    maps, answers = [], []
    for kernel in (mirror._kernel, None):
        monkeypatch.setattr(mirror, "_kernel", kernel)
        bits = mirror._KeyBits()
        for keys in added:
            bits.add(keys)
        maps.append(bits._bits.copy())
        answers.append(bits.may_hold(asked))
    assert np.array_equal(maps[0], maps[1]) and np.array_equal(answers[0], answers[1])
    assert answers[0].dtype == bool and answers[0][20000:].all() and not answers[0][:20000].all()


def _random_record(rng, serial: int):
    """A DocRecord of every kind and width a field takes: kept, exact and near duplicates, excerpts, expired
    ones, ids of every msgpack string width and script, ints of every msgpack width (negative ones too)."""
    from streamdedup.store.index import DocRecord

    def text() -> str:
        size = rng.choice([0, 1, 31, 32, 255, 256, 70000, rng.randrange(1, 60)])
        if size > 100:
            return ("abcé€𝄞 -_/" * size)[rng.randrange(10):][:size]
        return "".join(rng.choice("abcé€𝄞 -_/") for _ in range(size))

    def number() -> int:
        return rng.choice([0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63,
                           (1 << 64) - 1, -1, -32, -33, -128, -129, -32768, -32769, -(1 << 31), -(1 << 31) - 1,
                           -(1 << 63), rng.randrange(-(1 << 40), 1 << 40)])

    ident = text()
    kept = rng.random() < 0.5
    cluster = serial if kept else rng.randrange(1, serial + 1)
    cluster_id = ident if kept or rng.random() < 0.1 else text()
    matched = rng.choice([None, cluster, rng.randrange(0, 1 << 33)])
    matched_id = rng.choice([None, cluster_id, text()])
    similarity = rng.choice([None, 1.0, 0.7, rng.random(), float("inf"), -0.0])
    content = rng.randbytes(rng.choice([0, 16, 300, 70000]))
    source = [text(), number(), number()]
    band_keys = rng.randbytes(rng.choice([0, 128, 256]))
    record = DocRecord(serial, ident, kept, cluster, cluster_id, matched, matched_id, similarity,
                       rng.random() < 0.3, content, source, band_keys, rng.choice([0.0, 1.7e9 + rng.random()]),
                       rng.choice([False, False, True]), rng.choice([0, 0, number()]),
                       rng.choice([None, None, 0.8, rng.random()]))
    return record


@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_packs_records_as_msgpack_does(seed):
    """``_kernel.pack_records`` gives every record ``DocRecord.pack``'s bytes (the index's docs table: its
    layout must not change), for fields of every kind and width, the defaults left out as msgpack's path does;
    a record of another type (a tuple source, a numpy int, an int too wide for msgpack) is left to msgpack."""
    import random

    from streamdedup.core import _kernel
    from streamdedup.store.index import DocRecord

    rng = random.Random(seed)
    records = [_random_record(rng, serial) for serial in range(1, 400)]
    numbers = [rng.choice([0, 1, 300, 1 << 20]) for _ in records]
    packed = _kernel.pack_records(records, numbers)
    assert packed == [record.pack(number) for record, number in zip(records, numbers)]
    odd = [DocRecord(5, "a", True, 5, "a", None, None, None, False, b"", ("s", 1, 2), b"", 1.0),
           DocRecord(5, "a", True, 5, "a", None, None, None, False, b"", ["s", np.int64(1), 2], b"", 1.0),
           DocRecord(5, "a", True, 5, "a", None, None, None, False, b"", ["s", 1 << 64, 2], b"", 1.0),
           DocRecord(5, "a\ud800", True, 5, "a", None, None, None, False, b"", ["s", 1, 2], b"", 1.0)]
    assert _kernel.pack_records(odd, [0] * len(odd)) == [None] * len(odd)


def _keys_and_serials_alike(monkeypatch, module, call) -> None:
    """``call()`` (keys, serials) with ``module``'s kernel and without it: the same arrays, of the same types."""
    found = []
    for kernel in (module._kernel, None):
        monkeypatch.setattr(module, "_kernel", kernel)
        found.append(call())
    assert np.array_equal(found[0][0], found[1][0]) and np.array_equal(found[0][1], found[1][1])
    assert found[0][0].dtype == np.uint64 and found[0][1].dtype == np.int64


@pytest.mark.parametrize("seed", range(4))
def test_the_kernel_finds_the_mirrors_entries_under_asked_keys_as_numpy_does(monkeypatch, seed):
    """``_kernel.sorted_matches`` (the mirror's entries under a batch's band slots) against the numpy path:
    keys with repeats, asked keys below, between and above them, none asked, none held."""
    from streamdedup.store import mirror

    rng = np.random.default_rng(seed)
    keys = np.sort(rng.integers(10, 5000, int(rng.integers(1, 20000)), dtype=np.uint64))
    serials = rng.integers(0, 1 << 40, len(keys)).astype(np.int64)
    for asked in (np.unique(rng.integers(0, 6000, 3000, dtype=np.uint64)), np.zeros(0, dtype=np.uint64),
                  np.array([0, 1, 5001, 9999], dtype=np.uint64), np.unique(keys)):
        _keys_and_serials_alike(monkeypatch, mirror, lambda: mirror._rows_with_keys(keys, serials, asked))


@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_asks_the_band_filter_as_numpy_does(monkeypatch, seed):
    """The band filter's layers asked in the kernel (``_kernel.bloom_may_hold``) give numpy's answer for every key:
    a filter grown to several layers, keys it took (all held) and keys it never saw (a few false positives)."""
    from streamdedup.store import bandfilter

    rng = np.random.default_rng(seed)
    band_filter = bandfilter.BandFilter(1 << 10, 1 << 14)
    taken = rng.integers(0, 1 << 32, 3000, dtype=np.uint64)
    band_filter.add(taken)
    assert len(band_filter.layers) > 1
    asked = np.concatenate([taken, rng.integers(0, 1 << 32, 20000, dtype=np.uint64)])
    answers = []
    for kernel in (bandfilter._kernel, None):
        monkeypatch.setattr(bandfilter, "_kernel", kernel)
        answers.append(band_filter.may_hold(asked))
    assert np.array_equal(answers[0], answers[1]) and answers[0].dtype == bool
    assert answers[0][:3000].all() and not answers[0][3000:].all()


def test_the_kernel_verifies_against_a_stored_coding_as_jaccard_does():
    """``verify.jaccard_coded`` (``_kernel.coded_shared``: a stored candidate's coding decoded and compared in
    one call) gives ``jaccard`` of the decoded values, the same float, empty sets and sets of every size
    included; a damaged coding raises ValueError as ``eliasfano.decode`` does."""
    from streamdedup.core import eliasfano, verify

    rng = np.random.default_rng(7)
    sets = [np.zeros(0, dtype=np.uint32), np.array([5], dtype=np.uint32)]
    base = np.unique(rng.integers(0, 1 << 32, 3000, dtype=np.uint64)).astype(np.uint32)
    for size in (1, 3, 50, 175, 400, 1500, 3000):
        sets.append(np.sort(rng.choice(base, size, replace=False)))
        sets.append(np.unique(rng.integers(0, 1 << 32, size, dtype=np.uint64)).astype(np.uint32))
    for a in sets:
        for b in sets:
            coded = eliasfano.encode(b)
            assert verify.jaccard_coded(a, coded) == verify.jaccard(a, eliasfano.decode(coded))
    assert verify.jaccard_coded(sets[3].astype(np.uint64), eliasfano.encode(sets[3])) is None
    damaged = bytearray(eliasfano.encode(sets[-1]))
    damaged[-1] = 0
    with pytest.raises(ValueError):
        eliasfano.decode(bytes(damaged))
    with pytest.raises(ValueError):
        verify.jaccard_coded(sets[-1], bytes(damaged))
    with pytest.raises(ValueError):
        verify.jaccard_coded(sets[-1], b"\x40\x01")


@pytest.mark.parametrize("seed", range(2))
def test_the_kernel_reads_a_packed_records_id_as_unpacking_does(seed):
    """``_kernel.record_id`` gives the id ``DocRecord.unpack`` gives, for ids of every msgpack string width and
    script; data laid out otherwise (not a record, a cut one, an id that is not valid UTF-8) gives None."""
    import random

    import msgpack

    from streamdedup.core import _kernel
    from streamdedup.store.index import DocRecord

    rng = random.Random(seed)
    for serial in range(1, 300):
        record = _random_record(rng, serial)
        packed = record.pack(3)
        assert _kernel.record_id(packed) == DocRecord.unpack(serial, packed, lambda n: "s").id == record.id
    packed = _random_record(rng, 1).pack(3)
    for odd in (b"", b"\x9c", msgpack.packb([1, 2]), msgpack.packb("id"), msgpack.packb([b"id", True]),
                b"\x9c\xa4ab", b"\x9c\xa2\xff\xfe" + packed[4:]):
        assert _kernel.record_id(odd) is None


def test_fetched_keys_and_values_made_in_the_kernel_are_pythons():
    """``_kernel.big_endian_keys`` is ``int.to_bytes(width, "big")`` of each serial (OverflowError where it
    raises it); ``by_serial`` and ``record_ids`` are getmulti's pairs by ``from_u64`` of their keys, their values
    or ``record_id`` of them (None where it gives None), in the pairs' order."""
    import msgpack

    from streamdedup.core import _kernel
    from streamdedup.store.index import from_u64

    serials = [0, 1, 255, 256, 65535, 2**24 + 7, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    for width in range(1, 9):
        fits = [serial for serial in serials if serial < 2 ** (8 * width)]
        assert _kernel.big_endian_keys(fits, width) == [serial.to_bytes(width, "big") for serial in fits]
        assert _kernel.big_endian_keys([np.int64(5)], width) == [(5).to_bytes(width, "big")]
        for wide in [-1, 2 ** (8 * width)]:
            with pytest.raises(OverflowError):
                wide.to_bytes(width, "big")
            with pytest.raises(OverflowError):
                _kernel.big_endian_keys([1, wide], width)
    with pytest.raises(ValueError):
        _kernel.big_endian_keys([1], 9)
    records = [msgpack.packb(["id-" + "é" * n, True, n]) for n in range(40)] + [b"", msgpack.packb([b"x"])]
    pairs = [(serial.to_bytes(width, "big"), value) for serial, width, value
             in zip(range(7, 7000, 160), itertools.cycle([4, 8]), records)]
    assert list(_kernel.by_serial(pairs).items()) == [(from_u64(key), value) for key, value in pairs]
    assert all(got is value for got, (_, value) in zip(_kernel.by_serial(pairs).values(), pairs))
    assert list(_kernel.record_ids(pairs).items()) == [(from_u64(key), _kernel.record_id(value))
                                                       for key, value in pairs]
    assert list(_kernel.record_ids(pairs).values())[-2:] == [None, None]
    assert _kernel.by_serial([]) == _kernel.record_ids([]) == {}
    for odd in ([(b"123456789", b"")], [(1, b"")], [(b"1",)]):
        with pytest.raises((TypeError, ValueError)):
            _kernel.by_serial(odd)


@pytest.mark.parametrize("seed", range(3))
def test_the_earliest_entries_of_each_key_sorted_in_the_kernel_as_lexsort_does(monkeypatch, seed):
    """``candidates.earliest_of_each_key`` by two stable radix sorts (``_kernel.sort_entries``) keeps the
    entries numpy's lexsort keeps, in its order: keys held by many serials, repeated pairs, every limit."""
    from streamdedup.store import candidates

    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 300, 5000, dtype=np.uint64) << np.uint64(rng.integers(0, 30))
    serials = rng.integers(0, 1 << int(rng.integers(1, 40)), 5000).astype(np.int64)
    for limit in (1, 3, 100, 10000):
        _keys_and_serials_alike(monkeypatch, candidates,
                                lambda: candidates.earliest_of_each_key(keys, serials, limit))


@pytest.mark.parametrize("seed", range(4))
def test_sorted_runs_merged_in_the_kernel_keep_each_keys_earliest_as_lexsort_does(monkeypatch, seed):
    """``candidates.earliest_of_runs``: runs sorted by key, then serial, merged by the kernel
    (``_kernel.earliest_runs``) keep what ``earliest_of_each_key`` keeps of them together, in its order;
    a run out of order (seed 3) is sorted instead, with the same answer; empty runs and no runs too."""
    from streamdedup.core import _kernel
    from streamdedup.store import candidates

    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(int(rng.integers(0, 6))):
        size = int(rng.integers(0, 400))
        keys = rng.integers(0, 60, size, dtype=np.uint64) << np.uint64(30)
        serials = rng.integers(0, 1 << 20, size).astype(np.int64)
        order = np.lexsort((serials, keys)) if seed < 3 else np.arange(size)
        runs.append((keys[order], serials[order]))
    together = (np.concatenate([k for k, _ in runs]) if runs else np.zeros(0, np.uint64),
                np.concatenate([s for _, s in runs]) if runs else np.zeros(0, np.int64))
    for limit in (1, 2, 5, 1000):
        expected = candidates.earliest_of_each_key(*together, limit) if len(together[0]) else together
        for kernel in (candidates._kernel, None):
            monkeypatch.setattr(candidates, "_kernel", kernel)
            found = candidates.earliest_of_runs(runs, limit)
            assert found[0].dtype == np.uint64 and found[1].dtype == np.int64
            assert np.array_equal(found[0], expected[0]) and np.array_equal(found[1], expected[1])
    if seed < 3 and runs:
        assert _kernel.earliest_runs([(np.ascontiguousarray(k), s) for k, s in runs], 2) is not None
    if seed == 3 and any(len(k) > 1 for k, _ in runs):
        assert _kernel.earliest_runs([(k, s) for k, s in runs], 2) is None


@pytest.mark.parametrize("seed", range(4))
def test_a_batchs_band_slots_sorted_in_the_kernel_as_numpy_sorts_them(monkeypatch, seed):
    """``lsh.sorted_slots`` by the kernel (``_kernel.band_slots_sorted``, band by band): the same sorted slots,
    rows and bands as numpy's stable argsort, a slot several rows hold listing them in row order; keys of
    more than 32 bits (seed 3) are left to numpy."""
    from streamdedup.core import lsh

    rng = np.random.default_rng(seed)
    high = (50, 1 << 32, 1 << 8, 1 << 40)[seed]
    keys = rng.integers(0, high, size=(int(rng.integers(1, 600)), int(rng.integers(1, 40))), dtype=np.uint64)
    compiled = lsh.sorted_slots(keys)
    monkeypatch.setattr(lsh, "_kernel", None)
    plain = lsh.sorted_slots(keys)
    for mine, theirs in zip(compiled, plain):
        assert np.array_equal(mine, theirs) and mine.dtype == theirs.dtype
    assert compiled[2].dtype == np.uint16
    if high <= 1 << 32:
        assert np.array_equal(keys[compiled[1], compiled[2]], compiled[0] & np.uint64(0xFFFFFFFF))
    same = compiled[0][1:] == compiled[0][:-1]
    assert (compiled[1][1:][same] > compiled[1][:-1][same]).all()


@pytest.mark.parametrize("kernel", [True, False])
def test_the_mirrors_levels_answer_as_one_sorted_array_would(monkeypatch, kernel):
    """The recent mirror's entries in three levels (a batch's runs, the middle level they are folded into, the
    large one it goes into at a quarter of its size) answer every lookup with the entries one array sorted
    by slot would hold, and fold into that array, equal slots in the order the batches came."""
    from streamdedup.store import mirror

    if not kernel:
        monkeypatch.setattr(mirror, "_kernel", None)
    monkeypatch.setattr(mirror, "FRESH_ENTRIES", 300)
    rng = np.random.default_rng(5)
    recent = mirror.RecentMirror()
    all_slots, all_serials = [], []
    serial = 0
    for batch in range(60):
        kept = int(rng.integers(0, 40))
        keys = rng.integers(0, 500, size=(kept, 4), dtype=np.uint64)
        serials = np.arange(serial + 1, serial + 1 + kept, dtype=np.int64)
        serial += kept
        recent.add([(int(s), int(s).to_bytes(8, "big"), int(s).to_bytes(16, "big")) for s in serials], serials, keys)
        all_slots.append(mirror.band_slots(np.tile(np.arange(4, dtype=np.uint16), kept), keys.ravel()))
        all_serials.append(np.repeat(serials, 4))
        asked = np.unique(rng.integers(0, 4 << 32 | 500, 200, dtype=np.uint64) & np.uint64(3 << 32 | 511))
        slots, owners = np.concatenate(all_slots), np.concatenate(all_serials)
        found = recent.band_rows(asked)
        expected = np.isin(slots, asked)
        assert sorted(zip(found[0].tolist(), found[1].tolist())) == sorted(zip(slots[expected].tolist(),
                                                                               owners[expected].tolist()))
        if kernel:  # every level searched slot by slot: sorted by slot, then serial
            assert list(zip(found[0].tolist(), found[1].tolist())) == sorted(zip(found[0].tolist(),
                                                                                 found[1].tolist()))
        if batch == 30:
            assert len(recent._middle) and len(recent._settled)
    order = np.argsort(np.concatenate(all_slots), kind="stable")
    assert np.array_equal(recent.slots, np.concatenate(all_slots)[order])
    assert np.array_equal(recent.serials, np.concatenate(all_serials)[order])


@pytest.mark.parametrize("seed", range(3))
def test_a_batchs_candidates_verified_in_one_kernel_call_as_one_by_one(seed):
    """``verify.jaccards_coded`` (``_kernel.coded_jaccards``): each pair's Jaccard exactly as ``jaccard`` of
    the decoded coding gives it, empty sides and codings of more than 1,024 values included; a damaged
    coding is named by its place, the pairs before it verified."""
    from test_eliasfano import _damaged

    from streamdedup.core import eliasfano, verify

    rng = np.random.default_rng(seed)

    def values(n):
        return np.unique(rng.integers(0, 1 << 12 if seed else 1 << 32, n, dtype=np.uint64)).astype(np.uint32)

    owns, others = [], []
    for _ in range(300):
        own = values(int(rng.choice([0, 1, 5, 175, 400, 3000])))
        other = np.union1d(own[rng.random(len(own)) < rng.random()], values(int(rng.integers(0, 2000))))
        owns.append(own)
        others.append(other.astype(np.uint32))
    codings = [eliasfano.encode(other) for other in others]
    similarities, bad = verify.jaccards_coded(owns, codings)
    assert bad == -1
    assert similarities.tolist() == [verify.jaccard(own, other) for own, other in zip(owns, others)]
    for broken in _damaged(eliasfano.encode(values(175))):
        similarities, bad = verify.jaccards_coded(owns[:9], codings[:4] + [broken] + codings[5:9])
        assert bad == 4 and similarities[:4].tolist() == [verify.jaccard(o, t) for o, t in zip(owns[:4], others[:4])]


@pytest.mark.parametrize("seed", range(3))
def test_chosen_documents_coded_in_one_kernel_call_as_numpy_codes_them(monkeypatch, seed):
    """``eliasfano.encode_many`` of the documents ``rows`` numbers (``_kernel.ef_encode_many`` with rows: the
    kept rows of a batch, coded from its shingles where they are): each as numpy codes it, in the rows'
    order, empty documents and repeats included; a row out of range is refused."""
    from streamdedup.core import _kernel, eliasfano

    rng = np.random.default_rng(seed)
    documents = [np.unique(rng.integers(0, 1 << 32, int(rng.choice([0, 1, 175, 2000])), dtype=np.uint64))
                 for _ in range(60)]
    offsets = np.cumsum([0] + [len(d) for d in documents]).astype(np.int64)
    values = np.concatenate(documents).astype(np.uint32)
    rows = rng.integers(0, len(documents), int(rng.integers(0, 80))).astype(np.int64)
    compiled = eliasfano.encode_many(values, offsets, rows)
    monkeypatch.setattr(eliasfano, "_kernel", None)
    assert compiled == eliasfano.encode_many(values, offsets, rows)
    assert compiled == [eliasfano.encode_numpy(documents[row].astype(np.uint32)) for row in rows.tolist()]
    for wrong in ([-1], [len(documents)]):
        with pytest.raises(ValueError):
            _kernel.ef_encode_many(values, offsets, np.array(wrong, dtype=np.int64))


def test_kernel_decision_lines_equal_each_line_written_in_python():
    """The decisions file's lines of a batch, written by the kernel, are ``decision_line``'s, byte for byte: ids
    with every control character, quotes, backslashes and non-ASCII text, every kind of decision, similarities
    seen before and new ones, and fields of other types (left to ``decision_line``)."""
    import random

    from streamdedup.core.records import DUPLICATE, KEPT, REJECTED, Decision
    from streamdedup.runtime.sink import files
    from streamdedup.store import view

    rng = random.Random(5)
    alphabet = [chr(c) for c in range(0, 0x80)] + ["é", "ß", "😀", "\u2028", "中"]
    decisions = []
    for _ in range(2000):
        ident = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        kind = rng.randrange(6)
        if kind < 3:
            decisions.append(Decision(ident, KEPT, ident))
        elif kind == 3:
            similarity = rng.choice((rng.random(), 0.75, 1.0, 5 / 7, 0.0, -0.0, 0.1234565, float("nan")))
            decisions.append(Decision(ident, DUPLICATE, "c" + ident, "m", similarity, exact=rng.random() < 0.5))
        elif kind == 4:
            decisions.append(Decision(ident, REJECTED, None, None, None, "empty: no text"))
        else:
            decisions.append(Decision(ident, KEPT, ident, None, None, None, False, True, 3, 2, None))
    decisions.append(Decision("k", KEPT, "other"))
    decisions.append(Decision("e", DUPLICATE, "s", "s", 0.8, containment=0.91))
    decisions.append(Decision("n", DUPLICATE, "s", "s", np.float64(0.8)))  # not a float: decision_line's
    decisions.append(Decision("i", KEPT, "i", reason=None, similarity=None, matched=None, containment=0.5))
    python = b"".join(files.decision_line(d) for d in decisions)
    assert files._kernel.decision_lines(decisions, files.decision_line) == python
    assert files.decision_lines(decisions) == python
    assert files._kernel.decision_lines([], files.decision_line) == b""
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate: what decision_line does with it
        files._kernel.decision_lines([Decision("a\ud800", KEPT, "a\ud800")], files.decision_line)


def test_kernel_index_rows_equal_the_python_ones():
    """What ``write_documents`` files of each record (docs key, ``recent`` entry, members, exact count, mirror
    entries), by the kernel and in Python: kept documents with and without band keys, near and exact
    duplicates with and without places, serials of every width up to 4 bytes."""
    import random

    from streamdedup.core.records import Document, Source
    from streamdedup.store import view
    from streamdedup.store.index import DocRecord

    rng = random.Random(8)
    records, idents, recent_keys, placed = [], [], {}, {}
    serial = 0
    for i in range(3000):
        serial += rng.choice((1, 1, 1, 7, 300, 70000, 2 ** 24))
        serial = min(serial, 2 ** 32 - 1 - (3000 - i))
        doc = Document(f"d{i}", "text", Source("in.jsonl", -1, i + 1))
        content = rng.randbytes(16)
        kind = rng.randrange(4)
        if kind == 0:
            record = DocRecord.new_cluster(serial, doc, content, b"", 1.5)
            if rng.random() < 0.7:
                recent_keys[serial] = rng.randbytes(4 * 32)
        elif kind == 1:
            twin = DocRecord.new_cluster(rng.randrange(1, serial + 1), doc, content, b"", 1.5)
            record = DocRecord.exact_copy_of(twin, serial, doc, content, 2.5)
        else:
            representative = DocRecord.new_cluster(rng.randrange(1, serial + 1), doc, content, b"", 1.5)
            record = DocRecord.near_duplicate_of(representative, 0.8, serial, doc, content, 2.5)
            if rng.random() < 0.5:
                recent_keys[serial] = rng.randbytes(4 * 32)
                placed[serial] = (i, rng.randrange(0, 2 ** 64))
        records.append(record)
        idents.append(rng.randbytes(8))
    compiled = view._kernel.index_rows(records, idents, recent_keys, placed)
    kernel, view._kernel = view._kernel, None
    try:
        python = view._rows_filed(records, idents, recent_keys, placed)
    finally:
        view._kernel = kernel
    assert compiled == python
    assert compiled[2] and 0 < compiled[3] < len(records)
    with pytest.raises(OverflowError):
        view._kernel.index_rows([DocRecord.new_cluster(2 ** 32, doc, content, b"", 1.5)], [b"i" * 8], {}, {})


def test_kernel_files_the_mirrors_hashes_as_python_does(monkeypatch):
    """The recent mirror's id and content hashes of committed documents (``RecentMirror.add``), filed by the
    kernel and in Python: the same first serials and later ones, over batches with repeated ids and contents."""
    import random

    from streamdedup.store import mirror

    rng = random.Random(3)
    batches = [[(serial, rng.choice((b"a", b"b", rng.randbytes(8))), rng.choice((b"c", rng.randbytes(16))))
                for serial in range(start, start + 500)] for start in range(1, 3001, 500)]
    mirrors = []
    for kernel in (mirror._kernel, None):
        monkeypatch.setattr(mirror, "_kernel", kernel)
        recent = mirror.RecentMirror()
        for entries in batches:
            recent.add(entries, np.zeros(0, dtype=np.int64), np.zeros((0, 32), dtype=np.uint64))
        mirrors.append(recent)
    compiled, python = mirrors
    assert compiled.id_firsts() == python.id_firsts() and compiled.content == python.content
    assert compiled.id_more() == python.id_more() and compiled.content_more() == python.content_more()
    assert len(python.id_more()[b"a"]) > 100 and compiled.serials_of_id(b"b") == python.serials_of_id(b"b")


def test_the_kernel_makes_records_and_decisions_as_their_classes_do():
    """``_kernel.slotted`` (records and decisions of rows surely kept, ``decide._State.keep_alone``) makes what
    the dataclass makes of the same values, and refuses values that do not fill every field."""
    from streamdedup.core.records import KEPT, Decision
    from streamdedup.engine import decide
    from streamdedup.store.index import DocRecord

    values = ("a\u00e9", KEPT, "a", None, 0.5, None, True, False, 3, 2, None)
    made = shingle._kernel.slotted(decide._DECISION_SETTERS, *values)
    assert type(made) is Decision and made == Decision(*values)
    fields = (7, "id", True, 7, "id", None, None, None, False, b"c" * 16, ["f", -1, 3], b"", 1.5, False, 9, None)
    assert shingle._kernel.slotted(decide._RECORD_SETTERS, *fields) == DocRecord(*fields)
    with pytest.raises(TypeError):
        shingle._kernel.slotted(decide._DECISION_SETTERS, *values[:-1])
    with pytest.raises(TypeError):
        shingle._kernel.slotted((DocRecord, *decide._DECISION_SETTERS[1:]), *values)


@pytest.mark.parametrize("seed", range(4))
def test_kept_entries_taken_from_the_batchs_sorted_slots_are_the_mirrors_sort(monkeypatch, seed):
    """``view._kept_entries`` (the kept rows' entries taken from the batch's sorted slots) gives what the mirror's
    own sort of them gives, equal slots included (few distinct keys), the slots sorted and the entries taken
    with the kernel (``_kernel.kept_entries``) and without it; entries the mirror may keep (no view of more)."""
    from streamdedup.core import _kernel, lsh
    from streamdedup.core.lsh import band_slots
    from streamdedup.store import mirror, view

    rng = np.random.default_rng(seed)
    rows, bands = 300, 8
    keys = rng.integers(0, 6, size=(rows, bands), dtype=np.uint64)
    kept_rows = np.flatnonzero(rng.random(rows) < 0.6)
    kept_serials = 1000 + np.cumsum(rng.integers(1, 3, size=len(kept_rows)))
    kept_keys = keys[kept_rows]
    expected = mirror._sorted_entries(band_slots(np.tile(np.arange(bands, dtype=np.uint16), len(kept_rows)),
                                                 kept_keys.ravel()), np.repeat(kept_serials, bands))
    for sorting, taking in itertools.product((lsh._kernel, None), (view._kernel, None)):
        monkeypatch.setattr(lsh, "_kernel", sorting)
        monkeypatch.setattr(view, "_kernel", taking)
        slots, slot_rows, _ = lsh.sorted_slots(keys)
        taken = view._kept_entries((slots, slot_rows), kept_rows, kept_serials, rows)
        assert np.array_equal(taken[0], expected[0]) and np.array_equal(taken[1], expected[1])
        assert taken[0].dtype == np.uint64 and taken[1].dtype == np.int64
        assert all(part.base is None or part.base.nbytes == part.nbytes for part in taken)
    out = np.empty(2, dtype=np.uint64), np.empty(2, dtype=np.int64)
    with pytest.raises(ValueError, match="out of range"):
        _kernel.kept_entries(np.zeros(2, np.uint64), np.array([0, 3], np.int64), np.zeros(3, np.int64), *out)


def test_a_batch_without_templates_has_its_whole_shingles_as_the_plan_gives(tmp_path, monkeypatch):
    """``SiteTemplates._whole_content`` (no site of the batch learns or has a template) decides as the row by row
    plan does, and is what pages without a URL take."""
    import json

    from streamdedup import config as config_module
    from streamdedup.core import corpus
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine.engine import Engine
    from streamdedup.engine.sitelearning import SiteTemplates
    from streamdedup.runtime.offline import dedup_files

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in corpus.generate(400, seed=5)))
    cfg = config_module.load(None, environ={})
    taken = []
    whole = SiteTemplates._whole_content

    def counted(self, *args):
        found = whole(self, *args)
        taken.append(found is not None)
        return found

    def decisions(name: str) -> bytes:
        with Engine(cfg, str(tmp_path / name)) as engine:
            dedup_files(engine, [str(source)], InputSpec(), None, str(tmp_path / f"{name}.jsonl"), 100)
        return (tmp_path / f"{name}.jsonl").read_bytes()

    monkeypatch.setattr(SiteTemplates, "_whole_content", counted)
    quick = decisions("quick")
    assert taken and all(taken)
    monkeypatch.setattr(SiteTemplates, "_whole_content", lambda self, *args: None)
    assert decisions("planned") == quick
    assert quick.count(b'"duplicate"') > 100


@pytest.mark.parametrize("overrides", [(), ("lsh.cap=\"probes\"",)])
def test_a_batchs_candidates_verified_at_once_as_row_by_row(tmp_path, monkeypatch, overrides):
    """The band evidence's candidates of every row compared with their stored codings in one call
    (``evidence._Matches.verify_listed``) give the decisions ``verify_row`` gives row by row, duplicates' places
    among the candidates (``lsh.cap = "probes"``) included, on articles and on a web crawl with templates."""
    import io
    import json

    from streamdedup import config as config_module
    from streamdedup.core import corpus, webcrawl
    from streamdedup.core.decode import InputSpec
    from streamdedup.engine import evidence
    from streamdedup.engine.engine import Engine
    from streamdedup.runtime.offline import dedup_files

    web = io.StringIO()
    webcrawl.write_web_jsonl(webcrawl.generate_web(400, 8, seed=5), web)
    lines = [json.dumps({"id": d.id, "text": d.text}) for d in corpus.generate(500, seed=13)]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines + web.getvalue().splitlines()) + "\n")
    cfg = config_module.load(None, overrides, environ={})
    listed, at_once = evidence._Matches.verify_listed, []

    def noted(matches, rows, serials, bounds):
        done = listed(matches, rows, serials, bounds)
        at_once.append(len(matches.found) if done else None)
        return done

    def decisions(name: str) -> bytes:
        with Engine(cfg, str(tmp_path / name)) as engine:
            dedup_files(engine, [str(source)], InputSpec(), None, str(tmp_path / f"{name}.jsonl"), 200)
        return (tmp_path / f"{name}.jsonl").read_bytes()

    monkeypatch.setattr(evidence._Matches, "verify_listed", noted)
    together = decisions("at_once")
    monkeypatch.setattr(evidence._Matches, "verify_listed", lambda matches, rows, serials, bounds: False)
    assert decisions("row_by_row") == together
    assert sum(found for found in at_once if found) > 100
    assert together.count(b'"duplicate"') > 100


def test_arrays_code_together_only_when_each_one_does(monkeypatch):
    """``verify.all_code_together`` is ``codes_together`` of every array (a dtype come through pickle is uint32
    too), and false without the kernel."""
    import pickle

    from streamdedup.core import verify

    plain = np.arange(5, dtype=np.uint32)
    pickled = pickle.loads(pickle.dumps(np.arange(3, dtype=np.uint32)))
    assert pickled.dtype is not plain.dtype and verify.all_code_together([plain, pickled, plain[:0]])
    assert verify.all_code_together([])
    for odd in (np.arange(3, dtype=np.int64), np.arange(3, dtype=">u4")):
        assert not verify.all_code_together([plain, odd])
        assert verify.all_code_together([plain, odd]) == all(verify.codes_together(a) for a in (plain, odd))
    monkeypatch.setattr(verify, "_kernel", None)
    assert not verify.all_code_together([plain]) and not verify.codes_together(plain)
    assert verify.all_code_together([])  # as ``all`` of none
