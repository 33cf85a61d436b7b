"""Choosing bands x rows, the S-curve, band keys."""

from __future__ import annotations

import numpy as np
import pytest

from streamdedup.core.lsh import approx_threshold, band_keys, optimal_params, s_curve


@pytest.mark.parametrize(
    "threshold,weights,expected",
    [(0.5, (0.5, 0.5), (25, 5)), (0.7, (0.5, 0.5), (14, 9)), (0.9, (0.5, 0.5), (5, 25)), (0.7, (0.2, 0.8), (18, 7))],
)
def test_known_choices_at_128_permutations(threshold, weights, expected):
    assert optimal_params(threshold, 128, *weights) == expected


def test_same_choice_as_datasketch_on_a_grid():
    from datasketch.lsh import _optimal_param

    thresholds = [round(0.1 + 0.05 * i, 2) for i in range(18)]  # 0.1 .. 0.95
    differences = []
    for num_perm in (64, 128, 256):
        for threshold in thresholds:
            weight_sets = [(0.5, 0.5)] + ([(0.1, 0.9), (0.8, 0.2)] if num_perm == 128 else [])
            for weights in weight_sets:
                ours = optimal_params(threshold, num_perm, *weights)
                theirs = _optimal_param(threshold, num_perm, *weights)
                if ours != tuple(theirs):
                    differences.append((threshold, num_perm, weights, ours, theirs))
    assert differences == []


def test_s_curve_matches_the_textbook_table():
    book = {0.2: 0.006, 0.3: 0.047, 0.4: 0.186, 0.5: 0.470, 0.6: 0.802, 0.7: 0.975, 0.8: 0.9996}
    for s, printed in book.items():
        digits = len(str(printed)) - 2
        assert float(s_curve(s, 20, 5)) == pytest.approx(printed, abs=10 ** -digits)
    assert approx_threshold(16, 4) == pytest.approx(0.5)


def test_out_of_range_arguments_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        optimal_params(1.2, 128)
    with pytest.raises(ValueError, match="num_perm"):
        optimal_params(0.5, 1)


def test_band_keys_depend_on_band_number_and_all_rows():
    signatures = np.array([[1, 2, 3, 4], [3, 4, 1, 2], [1, 2, 3, 5]], dtype=np.uint32)
    keys = band_keys(signatures, 2, 2)
    assert keys.shape == (3, 2)
    assert keys[0, 0] != keys[1, 1]  # same values (1, 2) in another band: another key
    assert keys[0, 0] == keys[2, 0] and keys[0, 1] != keys[2, 1]
    assert len(set(keys.ravel().tolist())) == 5


def test_s_curve_with_shared_bands_is_the_binomial_tail():
    from math import comb

    for s in (0.3, 0.5, 0.7, 0.9):
        one = s**4
        for shared in (1, 2, 3):
            tail = 1 - sum(comb(32, k) * one**k * (1 - one) ** (32 - k) for k in range(shared))
            assert s_curve(s, 32, 4, shared) == pytest.approx(tail)
    assert s_curve(0.7, 20, 6, 1) == pytest.approx(1 - (1 - 0.7**6) ** 20)


def test_recall_params_reach_the_recall_with_as_many_rows_as_can():
    from streamdedup.core.lsh import recall_params

    assert recall_params(0.7, 128, 0.998) == (32, 4, 2)
    for threshold in (0.5, 0.7, 0.8, 0.9):
        for recall in (0.99, 0.995, 0.998):
            bands, rows, shared = recall_params(threshold, 128, recall)
            assert bands * rows <= 128 and 1 <= shared <= 3
            assert s_curve(threshold, bands, rows, shared) >= recall
            more_rows = [(b, m) for b in range(1, 128 // (rows + 1) + 1) for m in (1, 2, 3)
                         if m <= b and s_curve(threshold, b, rows + 1, m) >= recall]
            assert more_rows == []
    with pytest.raises(ValueError):
        recall_params(0.7, 128, 1.0)


def test_the_gauss_legendre_table_is_numpys_rule_bit_for_bit_and_chooses_the_same_parameters(monkeypatch):
    """The table of nodes and weights (no ``numpy.polynomial`` import, no eigenvalue solve at start) is what
    ``leggauss`` gives, to the bit; and the parameters chosen with either are the same over a grid."""
    from streamdedup.core import lsh

    nodes, weights = lsh.gauss_legendre()
    expected_nodes, expected_weights = np.polynomial.legendre.leggauss(lsh._NODES)
    assert nodes.tobytes() == expected_nodes.tobytes() and weights.tobytes() == expected_weights.tobytes()

    def chosen() -> list:
        lsh.recall_params.cache_clear()
        lsh.optimal_params.cache_clear()
        grid = [(t, p) for t in (0.5, 0.7, 0.75, 0.8, 0.9) for p in (64, 128, 256)]
        return [(lsh.recall_params(t, p, r), lsh.optimal_params(t, p, fp, 1 - fp))
                for t, p in grid for r in (0.95, 0.998) for fp in (0.3, 0.5)]

    with_table = chosen()
    monkeypatch.setattr(lsh, "gauss_legendre", lambda: np.polynomial.legendre.leggauss(lsh._NODES))
    assert chosen() == with_table
    lsh.recall_params.cache_clear()
    lsh.optimal_params.cache_clear()


def test_pairs_at_the_threshold_share_two_bands_as_often_as_the_curve_says():
    """Real signatures of shingle sets at Jaccard 0.7: the share with >= 2 of 32 x 4 bands in common."""
    rng = np.random.default_rng(5)
    pairs, size = 3000, 200
    shared = int(round(2 * 0.7 * size / 1.7))  # |A & B| / |A | B| = 0.7 for two sets of ``size``
    sets = []
    for _ in range(pairs):
        common = rng.integers(0, 2**63, size=shared, dtype=np.uint64)
        for _side in range(2):
            own = rng.integers(0, 2**63, size=size - shared, dtype=np.uint64)
            sets.append(np.unique(np.concatenate((common, own))))
    in_common = _bands_in_common(sets, 32, 4)
    expected = s_curve(shared / (2 * size - shared), 32, 4, 2)
    found = float(np.mean(in_common >= 2))
    assert found == pytest.approx(expected, abs=0.004)
    assert found > float(np.mean(_bands_in_common(sets, 20, 6) >= 1))  # the old bands miss many more


def _bands_in_common(sets, bands, rows):
    """For each pair of consecutive sets (0 and 1, 2 and 3, ...): how many band keys their signatures share."""
    from streamdedup.core.shingle import ShingleBatch
    from streamdedup.core.signing import sign_batch

    offsets = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in sets], out=offsets[1:])
    keys = band_keys(sign_batch(ShingleBatch(np.concatenate(sets), offsets), 128, 1), bands, rows)
    return (keys[0::2] == keys[1::2]).sum(axis=1)
