"""The coding of stored shingles: exact, compact, the kernel equal to numpy, damage refused."""

import numpy as np
import pytest

from streamdedup.core import eliasfano

kernel_only = pytest.mark.skipif(eliasfano._kernel is None, reason="the compiled kernel is not built")


def _sorted_unique(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = np.unique(rng.integers(0, 1 << 32, n, dtype=np.uint64)).astype(np.uint32)
    while len(values) < n:
        values = np.unique(np.concatenate((values, rng.integers(0, 1 << 32, n - len(values), dtype=np.uint64)
                                           .astype(np.uint32))))
    return values


EDGES = [np.zeros(0, np.uint32), np.array([0], np.uint32), np.array([0xFFFFFFFF], np.uint32),
         np.array([0, 1, 0xFFFFFFFF], np.uint32), np.arange(1000, dtype=np.uint32),
         np.arange(0xFFFFFFFF - 500, 0xFFFFFFFF + 1, dtype=np.uint64).astype(np.uint32)]


@pytest.mark.parametrize("values", EDGES + [_sorted_unique(n, n) for n in (2, 7, 30, 175, 1000, 65536)])
def test_round_trip_is_exact_in_both_implementations(values):
    coded = eliasfano.encode_numpy(values)
    assert np.array_equal(eliasfano.decode_numpy(coded), values)
    assert np.array_equal(eliasfano.decode(eliasfano.encode(values)), values)


@kernel_only
@pytest.mark.parametrize("n", [0, 1, 2, 3, 9, 100, 175, 333, 4097])
def test_kernel_codes_exactly_as_numpy(n):
    for seed in range(5):
        values = _sorted_unique(n, 100 * n + seed)
        coded = eliasfano._kernel.ef_encode(values)
        assert coded == eliasfano.encode_numpy(values)
        assert np.array_equal(np.frombuffer(eliasfano._kernel.ef_decode(coded), "<u4"), values)


def test_a_page_of_shingles_takes_well_under_four_bytes_each():
    for n in (150, 175, 220, 1000):
        assert len(eliasfano.encode(_sorted_unique(n, n))) / n < 3.4


@pytest.mark.parametrize("values", [np.array([5, 3], np.uint32), np.array([7, 7], np.uint32)])
def test_unsorted_or_repeated_values_are_refused(values):
    with pytest.raises(ValueError):
        eliasfano.encode(values)
    with pytest.raises(ValueError):
        eliasfano.encode_numpy(values)


def _damaged(coded: bytes) -> list[bytes]:
    return [b"", b"\x21\x01", coded[:1], coded[:-5], bytes([coded[0] + 1]) + coded[1:],
            coded[:1] + b"\xff\xff\xff\xff\xff\xff" + coded[2:], coded[:2] + b"\xff" * (len(coded) - 2)]


@pytest.mark.parametrize("decode", [eliasfano.decode, eliasfano.decode_numpy])
def test_damaged_codings_raise_instead_of_returning_wrong_values(decode):
    coded = eliasfano.encode(_sorted_unique(175, 1))
    for bad in _damaged(coded):
        with pytest.raises(ValueError):
            decode(bad)


def test_many_documents_coded_in_one_call_equal_one_by_one():
    documents = [_sorted_unique(n, n + 7) for n in (0, 1, 175, 3, 0, 1000)]
    offsets = np.cumsum([0] + [len(d) for d in documents]).astype(np.int64)
    values = np.concatenate(documents)
    one_by_one = [eliasfano.encode_numpy(d) for d in documents]
    assert eliasfano.encode_many(values, offsets) == one_by_one
    if eliasfano._kernel is not None:
        with pytest.raises(ValueError):
            eliasfano._kernel.ef_encode_many(values, np.array([0, 5, 2], dtype=np.int64))
        with pytest.raises(ValueError):
            eliasfano._kernel.ef_encode_many(values, np.array([0, len(values) + 1], dtype=np.int64))
