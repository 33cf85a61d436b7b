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
